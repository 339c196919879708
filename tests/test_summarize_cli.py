"""`python -m bot summarize --backfill` as a real process: every channel with messages in the window, a progress bar
per channel, exit 1 when the summary model failed on some days (a second run resumes), 2 without a summary model."""

from __future__ import annotations

import asyncio
import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bot.clock import ManualClock
from tests.conftest import MakeCore
from tests.fakes import FakeChatServer
from tests.recall_helpers import CHANNEL, JUNO, OTHER_CHANNEL, SAM, build_world
from tests.test_summaries import summary_answer

ROOT = Path(__file__).resolve().parents[1]


async def run(tmp_path: Path, env: dict[str, str], *args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "summarize", *args, cwd=tmp_path, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 300)
    return process.returncode or 0, out.decode(), err.decode()


async def test_python_m_bot_summarize_backfill(db_url: str, tmp_path: Path, make_core: MakeCore, clock: ManualClock) -> None:
    world = await build_world(make_core, clock)
    now = datetime.now(UTC)  # the process runs on the real clock: the messages are of the last few real days
    for channel, ago in ((CHANNEL, 3), (CHANNEL, 2), (OTHER_CHANNEL, 2)):
        for author, text in ((JUNO, f"plans {ago} days ago"), (SAM, f"I promise to help {ago} days ago")):
            await world.pipeline.chat_log.record(world.message(author, text, channel=channel, at=now - timedelta(days=ago)))
    await world.pipeline.model.close()

    env = {k: v for k, v in os.environ.items() if not k.startswith(("CHAT_", "DISCORD_", "EMBEDDING_", "MEMORY_", "SUMMARY_"))}
    env.update(PYTHONPATH=str(ROOT), DATABASE_URL=db_url, DATA_DIR=str(tmp_path), LOG_LEVEL="ERROR")

    status, out, err = await run(tmp_path, env, "--backfill")
    assert status == 2 and "error: no summary model is configured (SUMMARY_MODEL" in err and "Traceback" not in err

    async with FakeChatServer(responder=summary_answer, summaries_aside=False) as summarizer:
        env.update(SUMMARY_BASE_URL=summarizer.base_url, SUMMARY_MODEL="fake-summary")
        summarizer.error(500)  # the first day fails
        status, out, err = await run(tmp_path, env, "--backfill", "--days", "7")
        assert status == 1, err
        assert "Backfilling the summaries of 2 channels (the last 7 chat days)" in out
        assert "Done: 2 channels, 2 day summaries written, " in out and " weeks folded, 1 days failed." in out  # weeks: weekday
        assert f"failed: channel {CHANNEL}: " in err and "the model is on fire" in err
        assert f"channel {OTHER_CHANNEL} [##############################] 100%" in err and "\r" in err
        assert "run it again later: it resumes where it stopped" in err

        status, out, err = await run(tmp_path, env, "--backfill", "--channel", str(CHANNEL))
        assert status == 0, err
        assert "Done: 1 channels, 1 day summaries written, " in out and " weeks folded, 0 days failed." in out
        days = [r for r in summarizer.requests if r["messages"][0]["content"].startswith("You summarise one day")]
        assert len(days) == 4  # three days, the failed one twice: nothing was summarised twice

        status, out, _ = await run(tmp_path, env, "--backfill", "--channel", "12345")
        assert status == 0 and "Channel 12345 has no messages in the last 14 chat days; nothing to summarise." in out
