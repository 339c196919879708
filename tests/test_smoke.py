"""`python -m bot smoke` against the fake chat server: the report, the verdict line and the exit status.

The real runs (llama.cpp with small models) are in docs/models.md; here the fake answers the first turn with a
call written as text, the way those models do, so the verdict logic and the report are checked without one.
"""

from __future__ import annotations

import json

import asyncpg
import pytest

from bot.__main__ import main
from bot.config import Settings
from bot.db import Database
from bot.embeddings.providers import BuiltinEmbedder, DeadlineEmbedder
from bot.tools.smoke import EXIT_FAIL, EXIT_NO_MODEL, EXIT_PASS, NO_MODEL, has_tool_json, run_smoke
from tests.fakes import FakeChatServer

SAVE_AS_TEXT = "```json\n" + json.dumps(
    {"name": "save_memory", "arguments": {"text": "Juno's cat is called Mochi", "list": "personal"}}
) + "\n```"


def _settings(chat: FakeChatServer, **extra: object) -> Settings:
    return Settings(chat_base_url=chat.base_url, chat_model="fake-model", **extra)  # type: ignore[arg-type]


async def test_a_call_written_as_text_is_saved_and_the_verdict_is_pass(
    chat: FakeChatServer, pool: asyncpg.Pool, db_url: str, builtin_embedder: BuiltinEmbedder
) -> None:
    """The first turn is a text-written save (what Qwen2.5-Coder sends through llama.cpp): it must be read as a call."""
    chat.text(SAVE_AS_TEXT).text("Nice to meet you, Juno! I'll remember Mochi.")
    chat.text("Chess and Spanish, lovely!").text("Paris.").text("Your cat is called Mochi.")
    lines: list[str] = []
    status = await run_smoke(
        _settings(chat), lines.append, database=Database(db_url, pool), embedder=DeadlineEmbedder(builtin_embedder, 30.0)
    )
    out = "\n".join(lines)
    assert status == EXIT_PASS, out
    assert lines[-1].startswith("PASS: a personal memory of Juno mentions Mochi and no reply contained tool JSON")
    assert "tool calls: 1 written as text, 1 run (tool rounds 1, calls read from text 1)" in out
    assert "saved personal #1 \"Juno's cat is called Mochi\"" in out
    assert 'call save_memory({"text": "Juno\'s cat is called Mochi", "list": "personal"}) -> ok {"memory_id": 1' in out
    assert "reply (" in out and "Nice to meet you, Juno! I'll remember Mochi." in out
    assert out.count("tool JSON in the reply: no") == 4
    assert "the clock moves forward 1 day" in out and "the reply names Mochi: yes" in out
    assert "#1 [personal, about Juno] Juno's cat is called Mochi" in out
    assert '"arguments"' not in out
    assert len(chat.requests) == 5  # the tool round and its answer, then one request per turn
    # the last turn is a day later: its message rolled the day over, and the first day was summarised
    assert len(chat.summary_requests) == 1 and "Chat of Thu 2026-01-01" in chat.summary_requests[0]["messages"][1]["content"]
    assert "Day summary of Thu 2026-01-01 (" in out and "Juno: Hi! I'm Juno." in out
    assert "Day-end notes of 2026-01-01: 0 kept, 0 left out" in out  # the fake summary model notes no facts
    assert "Memories written by the day-end notes: 0" in out
    last = chat.messages()
    assert any(m["role"] == "assistant" and m["content"] == "Paris." for m in last)  # the bot's replies were recorded


async def test_nothing_saved_is_a_fail_on_a_throwaway_database(
    chat: FakeChatServer, db_url: str, builtin_embedder: BuiltinEmbedder
) -> None:
    """With DATABASE_URL, smoke makes its own database on that server and drops it: the given one stays empty."""
    chat.default_text = "Sure!"
    lines: list[str] = []
    embedder = DeadlineEmbedder(builtin_embedder, 30.0)
    status = await run_smoke(_settings(chat, database_url=db_url), lines.append, embedder=embedder)
    assert status == EXIT_FAIL
    assert lines[-1].startswith("FAIL: no personal memory of Juno mentions Mochi (0 memories")
    assert "Memories stored: 0" in lines
    connection = await asyncpg.connect(db_url)
    try:
        assert await connection.fetchval("SELECT count(*) FROM pg_database WHERE datname LIKE 'deskmate_smoke_%'") == 0
        assert await connection.fetchval("SELECT count(*) FROM memories") == 0
    finally:
        await connection.close()


async def test_a_refused_call_is_shown_with_the_reason(
    chat: FakeChatServer, pool: asyncpg.Pool, db_url: str, builtin_embedder: BuiltinEmbedder
) -> None:
    """Invalid arguments go back to the model only (no memory change): the report must still say why nothing was saved."""
    chat.tool_calls(("save_memory", {"text": "Juno's cat is called Mochi", "list": "Personal memories"})).text("Done!")
    lines: list[str] = []
    status = await run_smoke(
        _settings(chat), lines.append, database=Database(db_url, pool), embedder=DeadlineEmbedder(builtin_embedder, 30.0)
    )
    out = "\n".join(lines)
    assert status == EXIT_FAIL
    assert "tool calls: native, 1 run (tool rounds 1, calls read from text 0)" in out
    assert '"list": "Personal memories"}) -> refused: list must be one of: personal, server' in out


def test_without_a_chat_model_it_says_what_to_set_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("CHAT_BASE_URL", "CHAT_MODEL", "CHAT_API_KEY"):
        monkeypatch.setenv(name, "")
    assert main(["smoke"]) == EXIT_NO_MODEL
    assert capsys.readouterr().out.strip() == NO_MODEL


@pytest.mark.parametrize(
    ("text", "leaks"),
    [
        ('{"name": "save_memory", "arguments": {"text": "x"}}', True),
        ('{"arguments": {}, "name": "x"}', True),
        ("<tool_call>", True),
        ("My cat's name is Mochi; the arguments for chess are many.", False),
    ],
)
def test_tool_json_is_recognised(text: str, leaks: bool) -> None:
    assert has_tool_json(text) is leaks
