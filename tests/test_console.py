"""The console chat driven through standard input: as a real `python -m bot console` process, and
in-process against the local fake chat model (so the bot actually answers and saves memories)."""

from __future__ import annotations

import asyncio
import io
import os
import sys
from pathlib import Path

from bot.config import Settings
from bot.console import local_id, run_console
from bot.embeddings.providers import BuiltinEmbedder
from tests.fakes import FakeChatServer

ROOT = Path(__file__).resolve().parents[1]


async def run_console_process(script: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bot",
        "console",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=cwd,
        env=env,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate("\n".join(script).encode() + b"\n"), 300)
    return process.returncode or 0, stdout.decode(), stderr.decode()


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without any chat or Discord settings (a developer's shell may have them)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CHAT_", "DISCORD_", "EMBEDDING_", "MEMORY_"))}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


async def test_console_process_without_a_chat_model_shows_desk_recall_and_decay(db_url: str, tmp_path: Path) -> None:
    script = [
        "/remember Rin's dog is called Pixel",
        "/as Rin",
        "who wants to play chess this evening?",
        "/day",
        "the new RPG patch broke my save file",
        "/memories",
        "/day",
        "do you remember the name of my dog?",
        "/memories",
        "/forget 99",
        "/nonsense",
        "/quit",
        "this line is never read",
    ]
    env = clean_env(DATABASE_URL=db_url, DATA_DIR=str(tmp_path / "data"), DORMANT_AFTER_DAYS="1", LOG_LEVEL="WARNING")
    status, out, err = await run_console_process(script, env, tmp_path)
    assert status == 0, err
    assert "No DISCORD_TOKEN is set" in out and "No chat model is configured" in out
    assert "saved server memory #1: Rin's dog is called Pixel" in out
    first, second, third = out.split("(no chat model):")[1:]
    assert "Desk: 1 active memory:" in first and "#1 [server, 0 days unused] Rin's dog is called Pixel" in first
    assert "Recalled: nothing" in first and "Tokens:" in first
    assert "#1 [drawer, 1 days unused" in second  # aged on the second chat day: dormant
    assert "Desk: 0 active memories." in third
    assert "Recalled from the drawer" in third and "#1 (score" in third and "back on the desk" in third
    assert "#1 [desk, 0 days unused" in third  # recalled, so active again
    assert "error: there is no memory #99 that you can change here" in out
    assert "unknown command /nonsense" in out
    assert "never read" not in out
    assert (tmp_path / "data" / "console.json").read_text() == '{"day_offset": 2}'
    assert "Traceback" not in err


async def test_console_with_a_chat_model_replies_saves_and_uses_memories(
    db_url: str, tmp_path: Path, builtin_embedder: BuiltinEmbedder
) -> None:
    async with FakeChatServer() as chat:
        chat.tool_calls(("save_memory", {"text": "Juno's cat is called Mochi", "list": "personal"})).text("Cute!")
        chat.text("Mochi is doing great, I hope!")
        settings = Settings(database_url=db_url, data_dir=tmp_path, chat_base_url=chat.base_url, chat_model="fake-model")
        script = "\n".join(
            [
                "/as Juno",
                "my cat is called Mochi",
                "/mine",
                "/settings notices hidden",
                "how is Mochi?",
                "/receipt",
                "/channel random",
                "/say nobody is talking to the bot here",
                "/settings auto-reply on",
                "/say but now it answers everything here",
            ]
        )
        out = io.StringIO()
        assert await run_console(settings, stdin=io.StringIO(script + "\n"), out=out, builtin=builtin_embedder) == 0
    text = out.getvalue()
    assert "Chat model: fake-model at http://127.0.0.1" in text
    assert "Deskmate: Cute!" in text
    assert "  📝 Saved a personal memory about Juno (#1): “Juno's cat is called Mochi”" in text  # with what was saved
    assert "  receipt: " not in text  # no receipt after every reply unless /receipts on; /receipt shows the last one
    assert "#1 [desk, 0 days unused, this persona, embedded] Juno's cat is called Mochi" in text
    assert "Deskmate: Mochi is doing great, I hope!" in text
    assert "desk: #1" in text and "tokens:" in text
    assert len(chat.requests) == 4  # tool round + answer, the second question, the auto-reply channel
    second_question = chat.messages(2)
    assert "Juno's cat is called Mochi" in second_question[0]["content"]
    assert {"role": "assistant", "content": "Cute!"} in second_question
    assert f"(user {local_id('user', 'Juno')}): how is Mochi?" in second_question[-1]["content"]
    assert "but now it answers everything here" in chat.messages()[-1]["content"]


async def test_the_console_shows_no_log_lines_and_refuses_unknown_options(db_url: str, tmp_path: Path) -> None:
    """Between turns a person sees the conversation only: HTTP and library logs go to DATA_DIR/console.log;
    a mistyped option is refused with the usage instead of doing something else."""
    async with FakeChatServer() as chat:
        chat.text("Hello Juno!")
        env = clean_env(DATABASE_URL=db_url, DATA_DIR=str(tmp_path), CHAT_BASE_URL=chat.base_url, CHAT_MODEL="fake-model",
                        LOG_LEVEL="INFO")
        status, stdout, stderr = await run_console_process(
            ["/as Juno", "hi there", "/stats everything", "/memories two", "/privacy maybe", "/who now"], env, tmp_path
        )
    assert status == 0, stderr
    assert "Deskmate: Hello Juno!" in stdout
    assert "usage: /stats [mine]" in stdout and "usage: /memories [PAGE]" in stdout and "usage: /who" in stdout
    assert "/privacy none|partial|full" in stdout
    for line in (stdout + stderr).splitlines():
        assert "HTTP Request" not in line and " INFO " not in line and "WARNING" not in line, line
    assert " INFO " in (tmp_path / "console.log").read_text()  # the log is kept, in its file
