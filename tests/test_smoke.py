"""`python -m bot smoke` against the fake chat server: the report, the verdict line and the exit status.

The real runs (llama.cpp with small models) are in docs/models.md; here the fake answers the first turn with a
call written as text, the way those models do, so the verdict logic and the report are checked without one.
"""

from __future__ import annotations

import json
from pathlib import Path

import asyncpg
import pytest

from bot.__main__ import main
from bot.chat.reply_text import NOT_SAVED
from bot.config import Settings
from bot.db import Database
from bot.embeddings.providers import BuiltinEmbedder, DeadlineEmbedder
from bot.tools.smoke import EXIT_FAIL, EXIT_NO_MODEL, EXIT_PASS, JUNO_ID, NO_MODEL, has_tool_json, run_smoke
from bot.tools.smoke_checks import read_reply
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
        _settings(chat), lines.append, database=Database(db_url, pool), embedder=DeadlineEmbedder(builtin_embedder, 30.0),
        long=False,
    )
    out = "\n".join(lines)
    assert status == EXIT_PASS, out
    assert lines[-1].startswith("PASS: a personal memory of Juno mentions Mochi, no reply contained tool JSON")
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
    settings = _settings(chat, database_url=db_url, memory_notes="tools")  # the reply's tools alone: nothing saved
    status = await run_smoke(settings, lines.append, embedder=embedder, long=False)
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
        _settings(chat, memory_notes="tools"), lines.append, database=Database(db_url, pool),
        embedder=DeadlineEmbedder(builtin_embedder, 30.0),
        long=False,
    )
    out = "\n".join(lines)
    assert status == EXIT_FAIL
    assert "tool calls: native, 1 run (tool rounds 1, calls read from text 0)" in out
    assert '"list": "Personal memories"}) -> refused: list must be one of: personal, server' in out


async def test_a_request_the_reply_did_not_save_is_kept_by_the_day_end_notes(
    chat: FakeChatServer, pool: asyncpg.Pool, db_url: str, builtin_embedder: BuiltinEmbedder
) -> None:
    """Qwen2.5-Coder 0.5B made no call for Juno's cat and wrote no facts for the day: the notes keep it from her line,
    and the reply said nothing was saved instead of its "Sure!"."""
    chat.default_text = "Sure!"
    lines: list[str] = []
    status = await run_smoke(
        _settings(chat), lines.append, database=Database(db_url, pool), embedder=DeadlineEmbedder(builtin_embedder, 30.0),
        long=False,
    )
    out = "\n".join(lines)
    assert status == EXIT_PASS, out
    assert "Memories written by the day-end notes: 1" in out and "Juno's cat is called Mochi." in out
    assert "reply (" in out and f"): {NOT_SAVED}" in out


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


YESTERDAY = [  # what people read before the reply checks, from runs with Qwen2.5-Coder 1.5B and 0.5B
    ("please remember that Bau is a cheater", "Noted: Bau (user 7006): please remember that Bau is a cheater", "echo"),
    ("can you recommend a good sci-fi novel?", "Noted: There is no memory #2 in this conversation; use an id shown with "
     "a memory.", "tool wording"),  # a refusal's words, and a repeat of the earlier reply below
    ("when is game night?", f"Juno (user {JUNO_ID}): sorry, but I can't help you.", "label"),
    ("what do you know about me?", "```plaintext", "fence"),
    ("anything to forget?", "There are no forgotten to make room tasks.", "tool wording"),
    ("my birthday is May 3", "I've saved a memory about Rin's birthday.", "claim"),
    ("¿Cuándo es la noche de juegos?", "Game night is on Friday at 8pm.", "language"),
    # Qwen2.5-Coder 1.5B, after one real save, retold a tool result as every later reply (saved or not)
    ("Can you recommend a good sci-fi novel?", 'Juno, the 7003 user, has been assigned the memory "Yes, I recommend '
     '\"The Dune Chronicles\" by Frank Herbert" with an ID of 4.', "tool wording"),
]


@pytest.mark.parametrize(("answered", "posted", "problem"), YESTERDAY)
def test_what_people_read_yesterday_fails_the_smoke_checks(answered: str, posted: str, problem: str) -> None:
    earlier = ["Noted: There is no memory #2 in this conversation; use an id shown with a memory."]
    reading = read_reply(posted, answered, {7003: "Juno", 7005: "Rin", 7006: "Bau"}, "Deskmate", earlier, set())
    assert problem in reading.problems


def test_the_bots_own_notice_is_not_read_as_an_echo() -> None:
    """With nothing usable from the model, the reply is the notice of what was saved: the bot's words, not an echo."""
    speakers = {JUNO_ID: "Juno"}
    answered = "Hey Deskmate, I'm Rin. My birthday is on May 3, please remember it."
    assert read_reply("📝 Saved: My birthday is on May 3, please remember it.", answered, speakers, "Deskmate", [],
                      {"saved"}).problems == []
    assert read_reply("Hey Deskmate, I'm Rin. My birthday is on May 3, please remember it.", answered, speakers,
                      "Deskmate", [], {"saved"}).problems == ["echo"]


def _answers(body: dict[str, object]) -> str:
    """A small model's habits: the speaker label and id in front, the message echoed, English to a Spanish question
    (until asked again, in Spanish), a claimed save. Each answer otherwise new, so none repeats another."""
    messages = body["messages"]  # type: ignore[index]
    last = str(messages[-1]["content"])  # type: ignore[index]
    asked = last.rsplit("): ", 1)[-1]
    if "Responde ahora" in last:  # the request to answer again, written in Spanish for a Spanish message
        question = str(messages[-3]["content"]).rsplit("): ", 1)[-1]  # type: ignore[index]
        return f"Claro que sí: {question[::-1]}"
    if "only repeated" in last:
        return f"Here is a fresh answer, number {len(messages)}."  # type: ignore[arg-type]
    if "¿" in asked:
        return f"Game night is on Friday, answer {len(messages)}."  # type: ignore[arg-type]
    if "sci-fi" in asked:
        return f"Noted: {asked}"
    if "birthday" in asked:
        return f"I've saved a memory about your birthday. Have a good one, number {len(messages)}!"  # type: ignore[arg-type]
    return f"Juno (user {JUNO_ID}): {asked[::-1]}"  # every answer new


async def test_the_long_conversation_passes_when_the_bot_fixes_what_small_models_write(
    pool: asyncpg.Pool, db_url: str, builtin_embedder: BuiltinEmbedder, tmp_path: Path
) -> None:
    async with FakeChatServer(responder=_answers) as chat:
        chat.text(SAVE_AS_TEXT).text("Nice to meet you, Juno!")
        record = tmp_path / "answers.jsonl"
        lines: list[str] = []
        status = await run_smoke(_settings(chat), lines.append, database=Database(db_url, pool),
                                 embedder=DeadlineEmbedder(builtin_embedder, 30.0), record=record)
    out = "\n".join(lines)
    assert status == EXIT_PASS, out
    assert out.count("Turn ") == 16 and "Turn 16 - Bau: When is game night now?" in out
    figures = next(line for line in lines if line.startswith("Figures: "))
    assert "16 replies; in what was posted: label 0, user id 0, fence 0, empty 0, tool wording 0, repeat 0, echo 0, " \
           "claim 0, language 0; Spanish questions answered in Spanish 2/2" in figures
    assert "label" in figures.split("took out: ")[1] and "claim" in figures and "echo" in figures
    # the first birthday answer claimed a save that never ran, and said so; the two after it said the same once the
    # claim was out (a repeat) and were asked for again: one second answer was usable, the other echoed the request,
    # so that one reply is the honest sentence
    assert "the honest sentence instead of the model's answer 1/16; " \
           "the line saying nothing was saved 1 (0 of them alone)" in figures, figures
    recorded = [json.loads(line) for line in record.read_text(encoding="utf-8").splitlines()]
    assert any(r["raw"].startswith(f"Juno (user {JUNO_ID}): ") and "label" in r["problems"] for r in recorded)
