"""Channel summaries in the console: `/day` ends a chat day, the next message has it summarised in the
background, and `/summaries` lists, shows, regenerates, backfills and switches them, as on Discord."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from pathlib import Path

from bot.config import Settings
from bot.console import run_console
from bot.embeddings.providers import BuiltinEmbedder
from bot.summaries.writer import DAY_INSTRUCTIONS
from tests.fakes import FakeChatServer


async def run(settings: Settings, script: list[str], builtin: BuiltinEmbedder) -> str:
    out = io.StringIO()
    assert await run_console(settings, stdin=io.StringIO("\n".join(script) + "\n"), out=out, builtin=builtin) == 0
    return out.getvalue()


async def test_a_day_summary_appears_after_day_and_the_commands_work_on_it(
    db_url: str, tmp_path: Path, builtin_embedder: BuiltinEmbedder
) -> None:
    async with FakeChatServer() as chat:  # the summary model defaults to the chat model: answered aside
        settings = Settings(database_url=db_url, data_dir=tmp_path, chat_base_url=chat.base_url, chat_model="fake-model")
        started = datetime.now(UTC).date()
        text = await run(settings, [
            "/as Juno",
            "/say we planned a picnic for Saturday",
            "/summaries",
            "/day",
            "/say good morning",
            "/summaries",
            "/summaries show 1",
            "/summaries regenerate 1",
            "/summaries backfill 3",
            "/summaries off",
            "/summaries",
            "/summaries on",
            "/summaries everything",
            "/summaries show 99",
        ], builtin_embedder)
        days = [body for body in chat.summary_requests if body["messages"][0]["content"] == DAY_INSTRUCTIONS]
        assert len(days) == 2  # the rollover's, then the regeneration; the backfill had nothing to do
    # The console starts on today's date: begun on a Sunday, the /day also ends the week, whose fold is listed too.
    listed = 2 if started.weekday() == 6 else 1
    assert "summaries of this channel: none yet (a chat day is summarised after it ends; /day)" in text
    assert f"summaries of this channel: {listed}\n" in text and f"\n  #1 {started:%a %Y-%m-%d} [" in text
    assert "tokens] " in text
    assert "Juno: we planned a picnic for Saturday" in text.split("summary #1 ")[1]
    assert text.count("summary #1 ") == 2 and "[ready, 1 messages]" in text  # show, then regenerate
    assert "backfill done: days 0/0 · 0 written · weeks folded 0" in text and "running it again resumes" in text
    assert "summaries off in this channel: nothing here is summarised or shown" in text
    assert "error: summaries are off in this channel, so none are written or shown here; /summaries on turns them on" in text
    assert "summaries on in this channel" in text
    assert "usage: /summaries [show ID | regenerate ID | backfill [DAYS] | on|off]" in text
    assert "error: there is no summary #99 in this channel" in text


async def test_without_a_summary_model_the_console_says_so(
    db_url: str, tmp_path: Path, builtin_embedder: BuiltinEmbedder
) -> None:
    text = await run(Settings(database_url=db_url, data_dir=tmp_path), ["/summaries", "/summaries backfill"], builtin_embedder)
    assert text.count("error: no summary model is configured (SUMMARY_MODEL, or CHAT_MODEL with its endpoint)") == 2
