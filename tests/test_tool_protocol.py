"""The tool-call protocol end to end, as a person in the channel sees it: what real small models answer
(tests/data/llamacpp-qwen2.5-coder.jsonl, replayed), the native `tool_calls` shapes of OpenAI, Ollama and vLLM,
hostile arguments, floods of calls, repeated calls, the rights the model acts with, and a model that answers
with a call even when asked for the answer.

Everything goes through the real pipeline (`build_services(core).pipeline`), the real database and embedder,
and the real `openai` client talking HTTP to a server on 127.0.0.1.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiohttp import web

from bot.chat.messages import IncomingMessage
from bot.chat.model import MAX_CALLS_PER_ANSWER
from bot.chat.notices import ChangeKind
from bot.chat.receipts import ReplyStatus
from bot.chat.reply import ReplyOutcome, ReplyPipeline
from bot.chat.reply_text import HONEST, NOT_SAVED
from bot.clock import ManualClock
from bot.memory.models import MemoryList, NewMemory, Source
from bot.services import build_services
from tests.conftest import MakeCore
from tests.fakes import FakeChatServer, serve_locally
from tests.recall_helpers import BOT, CHANNEL, GUILD, JUNO, RIN, SAM, message

RECORDED = Path(__file__).parent / "data" / "llamacpp-qwen2.5-coder.jsonl"
SMALL_MODEL = "Qwen2.5-Coder-0.5B-Instruct Q4_K_M"
RECORDED_USER = 223525073110616  # the console user of the recording: its calls name this id as `about_user`
TURNS = [
    "Hi! I'm Juno. Please remember that my cat is called Mochi.",
    "I love playing chess on weekends, and I'm learning Spanish.",
    "What's the capital of France?",
    "Do you remember my cat's name?",  # the next day
]
TOOL_NAMES = ("save_memory", "update_memory", "forget_memory")
MOCHI = {"text": "Juno's cat is called Mochi", "list": "personal"}

_ids = itertools.count(7_000_000)


# --------------------------------------------------------------------------------------------------------
# Helpers


def assert_no_call_json(chunks: Sequence[str]) -> None:
    """What a person must never see in a reply: tool-call JSON, `<tool_call>` markup, a fenced call, a tool name."""
    for chunk in chunks:
        assert not ('"name"' in chunk and ('"arguments"' in chunk or '"parameters"' in chunk)), chunk
        assert not re.search(r"<\s*/?\s*tool_call", chunk, re.IGNORECASE), chunk
        assert "```" not in chunk, chunk
        assert not any(name in chunk for name in TOOL_NAMES), chunk


async def memories(pool: asyncpg.Pool) -> list[dict[str, Any]]:
    rows = await pool.fetch(
        "SELECT id, list, owner_id, text, persona_id IS NULL AS is_global, protected FROM memories ORDER BY id"
    )
    return [dict(row) for row in rows]


def completion(message: dict[str, Any], finish_reason: str, **choice_extra: Any) -> str:
    """A raw chat-completion body around one assistant message."""
    return json.dumps(
        {
            "id": "chatcmpl-7f3a9c",
            "object": "chat.completion",
            "created": 1_796_149_788,
            "model": "some-model",
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, **choice_extra}],
            "usage": {"prompt_tokens": 900, "completion_tokens": 40, "total_tokens": 940},
        }
    )


def text_call(name: str, arguments: dict[str, Any]) -> str:
    """A call written in the content as the recorded small models write it: a fenced JSON block."""
    return "```json\n" + json.dumps({"name": name, "arguments": arguments}, indent=2) + "\n```"


@pytest.fixture
async def pipeline(make_core: MakeCore, chat: FakeChatServer) -> AsyncIterator[ReplyPipeline]:
    core = await make_core(chat_base_url=chat.base_url, chat_model="fake-model", chat_timeout_s=20.0)
    built = build_services(core, bot_user_id=BOT).pipeline
    await built.servers.sync_default_persona()
    yield built
    await built.model.close()


def juno(text: str, clock: ManualClock, **changes: Any) -> IncomingMessage:
    return dataclasses.replace(message(JUNO, text, clock=clock), **changes)


async def assert_receipt_stored(pipeline: ReplyPipeline, outcome: ReplyOutcome) -> dict[str, Any]:
    stored = await pipeline.chat_log.receipt(message_id=outcome.receipt.message_id)
    assert stored is not None
    assert stored["status"] == outcome.status.value
    assert stored["changes"] == [change.as_dict() for change in outcome.changes]
    return stored


# --------------------------------------------------------------------------------------------------------
# 1. Replay of a real small model (llama.cpp + Qwen2.5-Coder 0.5B): calls written as fenced JSON in `content`


FOLLOW_UP_TEXTS = [
    "Nice to meet you, Juno! I'll remember Mochi.",
    "Chess and Spanish, nice!",
    "Paris.",
    "Yes: your cat is called Mochi.",
]


class ReplayServer:
    """POST /v1/chat/completions answered from the recording, one model's first conversation, in order.

    The mapping, explicit:
    - the k-th request that asks for the answer to a new message (its last message is the user's, not a
      tool result) gets the k-th recorded `response` (with its recorded HTTP `status`); the server checks that
      it answers the same user text as the recorded request did, so the replay cannot drift;
    - a request that carries tool results (the bot's follow-up after running the calls, with
      no tools) has no recorded counterpart: the bot of the recording ran no calls. It gets, per
      `follow_up`, either "repeat": the same recorded response again (this model writes its call whatever it
      is asked), or "text": the plain answer FOLLOW_UP_TEXTS[k].
    """

    def __init__(self, model: str, follow_up: str) -> None:
        lines = [json.loads(line) for line in RECORDED.read_text(encoding="utf-8").splitlines() if line.strip()]
        self.records = [line for line in lines if line["model"] == model]
        assert len(self.records) == len(TURNS)
        self.follow_up = follow_up
        self.requests: list[dict[str, Any]] = []
        self.turn = -1
        self.mismatches: list[tuple[str, str]] = []  # requests that did not answer the recorded turn's question
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> ReplayServer:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner, port = await serve_locally(app, shutdown_timeout=0.5)
        self.url = f"http://127.0.0.1:{port}/v1"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def tool_results(self, index: int) -> list[dict[str, Any]]:
        return [json.loads(m["content"]) for m in self.requests[index]["messages"] if m["role"] == "tool"]

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        last = body["messages"][-1]
        # after the tools ran, or asked once more because the answer had nothing to post
        follow_up = last["role"] == "tool" or str(last["content"]).startswith("[That had no answer")
        if not follow_up:
            self.turn += 1
            recorded_question = self.records[self.turn]["request"]["messages"][-1]["content"]
            asked = body["messages"][-1]["content"]
            if not (asked.endswith(TURNS[self.turn]) and recorded_question.endswith(TURNS[self.turn])):
                self.mismatches.append((asked, recorded_question))
        record = self.records[self.turn]
        if follow_up and self.follow_up == "text":
            return web.json_response(json.loads(completion({"role": "assistant", "content": FOLLOW_UP_TEXTS[self.turn]}, "stop")))
        return web.json_response(record["response"], status=record["status"])


@pytest.mark.parametrize("follow_up", ["repeat", "text"])
async def test_replayed_small_model_conversation_saves_mochi_and_posts_no_call_json(
    make_core: MakeCore, clock: ManualClock, pool: asyncpg.Pool, follow_up: str
) -> None:
    async with ReplayServer(SMALL_MODEL, follow_up) as replay:
        core = await make_core(chat_base_url=replay.url, chat_model="qwen-coder-0.5b", chat_timeout_s=20.0)
        pipeline = build_services(core, bot_user_id=BOT).pipeline
        await pipeline.servers.sync_default_persona()
        outcomes: list[ReplyOutcome] = []
        try:
            for number, text in enumerate(TURNS):
                clock.current += timedelta(days=1) if number == 3 else timedelta(minutes=1)
                asked = IncomingMessage(
                    next(_ids),
                    CHANNEL,
                    RECORDED_USER,
                    "Juno",
                    text,
                    clock.now(),
                    guild_id=GUILD,
                    where='#general in "local server"',
                )
                outcome = await pipeline.reply(asked)
                outcomes.append(outcome)
                await assert_receipt_stored(pipeline, outcome)
                # the bot's reply goes into the channel's log, as the console and the Discord cog record it
                clock.current += timedelta(seconds=5)
                said = IncomingMessage(
                    next(_ids), CHANNEL, BOT, "Deskmate", outcome.text, clock.now(), guild_id=GUILD, is_bot=True
                )
                await pipeline.chat_log.record(said)
        finally:
            await pipeline.model.close()

    assert replay.mismatches == []
    # every turn: the first request answered from the recording, then one follow-up after the tools ran, and (when
    # the model answered with its call again) one more request for the answer
    rounds = 3 if follow_up == "repeat" else 2
    assert len(replay.requests) == rounds * len(TURNS)
    assert ["tools" in r for r in replay.requests] == [True, *[False] * (rounds - 1)] * len(TURNS)  # answers: no tools
    # the prompts have the recorded shape (system, then user/assistant turns), so the replay is a fair one; but the
    # bot's own lines ("📝 Saved: ...", written when the model gave no answer) are never shown to it as its words
    for turn, record in enumerate(replay.records):
        recorded = [m["role"] for m in record["request"]["messages"]]
        if follow_up == "repeat":
            recorded = [role for role in recorded if role != "assistant"]
        assert [m["role"] for m in replay.requests[rounds * turn]["messages"]] == recorded

    for outcome in outcomes:
        assert_no_call_json(outcome.chunks)
        assert outcome.receipt.tool_calls_from_text >= 1  # each answer was a call written as text, and it was read

    stored = await memories(pool)
    mochi = [m for m in stored if m["list"] == "personal" and m["owner_id"] == RECORDED_USER and "Mochi" in m["text"]]
    assert len(mochi) == 1, stored  # saved on the first turn, recognised (not saved again) on the last
    # The model's update_memory of a memory that does not exist (#12) is refused, so the chess/Spanish turn saves nothing.
    assert "there is no memory #12" in replay.tool_results(rounds + 1)[0]["error"]
    # Current behaviour, documented in docs/models.md ("Duplicates"): the small model saves general knowledge as a
    # personal memory of the person who asked, and the bot stores it (nothing tells such a fact from a personal one).
    assert [m["text"] for m in stored if "France" in m["text"]] == ["The capital of France is Paris"]
    [paris] = [m for m in stored if "France" in m["text"]]
    assert (paris["list"], paris["owner_id"]) == ("personal", RECORDED_USER)
    assert len(stored) == 2
    # the last turn's save repeats Mochi: the model is told it is already remembered
    assert replay.tool_results(3 * rounds + 1)[0]["already_remembered_as"] == mochi[0]["id"]

    if follow_up == "text":
        assert [o.status for o in outcomes] == [ReplyStatus.REPLIED] * 4
        assert [o.text for o in outcomes] == FOLLOW_UP_TEXTS
    else:
        # The model answers its follow-ups with the same call again: it is not run (no tools were offered), and
        # the reply says what was done, or what the calls amounted to: never silence, never the call's JSON, never
        # the refusal meant for the model; each line marked as the bot's own, so the model is never shown it as its words.
        assert [o.text for o in outcomes] == [
            "📝 Saved: Mochi is called Juno's cat.",
            HONEST,  # nothing changed: the refusal was the model's to read, the notice says it to people
            "📝 Saved: The capital of France is Paris.",
            "📝 I already remember that: Mochi is called Juno's cat.",
        ]
        assert [o.status for o in outcomes] == [ReplyStatus.REPLIED] * 4


# --------------------------------------------------------------------------------------------------------
# 2. Native tool_calls as real servers send them


def openai_body() -> str:
    return completion(
        {
            "role": "assistant",
            "content": None,
            "refusal": None,
            "annotations": [],
            "tool_calls": [
                {
                    "id": "call_Xk3vB9qLmN2",
                    "type": "function",
                    "function": {"name": "save_memory", "arguments": json.dumps(MOCHI)},
                }
            ],
        },
        "tool_calls",
        logprobs=None,
    )


def vllm_body() -> str:
    return completion(
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": None,
            "tool_calls": [
                {
                    "id": "chatcmpl-tool-8d3f0c2a9b1e4f6a",
                    "type": "function",
                    "function": {"name": "save_memory", "arguments": json.dumps(MOCHI)},
                }
            ],
        },
        "tool_calls",
        logprobs=None,
        stop_reason=None,
    )


def ollama_body() -> str:
    """Arguments as a JSON object, not a string: not the OpenAI schema, but what Ollama's own API sends."""
    return completion(
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "call_1x2y3z", "index": 0, "type": "function", "function": {"name": "save_memory", "arguments": MOCHI}}
            ],
        },
        "tool_calls",
    )


@pytest.mark.parametrize(
    ("body", "call_id"),
    [
        pytest.param(openai_body(), "call_Xk3vB9qLmN2", id="openai"),
        pytest.param(vllm_body(), "chatcmpl-tool-8d3f0c2a9b1e4f6a", id="vllm"),
    ],
)
async def test_native_tool_calls_of_openai_and_vllm_save_and_reply(
    pipeline: ReplyPipeline, chat: FakeChatServer, clock: ManualClock, pool: asyncpg.Pool, body: str, call_id: str
) -> None:
    chat.raw(body).text("Got it, Mochi it is!")
    outcome = await pipeline.reply(juno("my cat is called Mochi", clock))

    assert outcome.status == ReplyStatus.REPLIED and outcome.chunks == ["Got it, Mochi it is!"]
    assert [(m["owner_id"], m["text"]) for m in await memories(pool)] == [(JUNO, "Juno's cat is called Mochi")]
    assert [change.kind for change in outcome.changes] == [ChangeKind.SAVED]
    assert outcome.receipt.tool_calls_from_text == 0
    # the follow-up answers the call by its own id, with the arguments as the string the schema wants
    follow_up = chat.messages(1)
    [assistant] = [m for m in follow_up if m.get("tool_calls")]
    [echoed] = assistant["tool_calls"]
    assert echoed["id"] == call_id and echoed["function"]["arguments"] == json.dumps(MOCHI)
    [tool] = [m for m in follow_up if m["role"] == "tool"]
    assert tool["tool_call_id"] == call_id and json.loads(tool["content"])["ok"] is True


async def test_native_tool_call_with_arguments_as_an_object_works_or_is_clearly_refused(
    pipeline: ReplyPipeline, chat: FakeChatServer, clock: ManualClock, pool: asyncpg.Pool
) -> None:
    # The openai client does not validate a response (`construct`): `function.arguments` arrives as a dict.
    chat.raw(ollama_body()).text("Got it!")
    outcome = await pipeline.reply(juno("my cat is called Mochi", clock))

    assert outcome.status == ReplyStatus.REPLIED and outcome.chunks == ["Got it!"]
    [result] = chat.tool_results(1)
    if result["ok"]:
        assert [m["text"] for m in await memories(pool)] == ["Juno's cat is called Mochi"]
    else:  # a refusal the model can act on, not an internal failure
        assert "arguments" in result["error"] and "failed" not in result["error"], result
        assert await memories(pool) == []
    [assistant] = [m for m in chat.messages(1) if m.get("tool_calls")]
    assert isinstance(assistant["tool_calls"][0]["function"]["arguments"], str)  # what an OpenAI-schema server accepts back


# --------------------------------------------------------------------------------------------------------
# 3. Hostile arguments, each next to a valid save in the same answer

DEEP = "[" * 100_000 + "]" * 100_000

HOSTILE: list[Any] = [
    pytest.param(
        "update_memory", {"memory_id": "²", "text": "Juno likes tea"}, "memory_id must be the number", id="memory_id-superscript"
    ),
    pytest.param(
        "update_memory",
        '{"memory_id": ' + "7" * 5000 + ', "text": "Juno likes tea"}',
        "not a usable JSON object",
        id="memory_id-5000-digits",
    ),
    pytest.param(
        "update_memory", {"memory_id": -1, "text": "Juno likes tea"}, "memory_id must be the number", id="memory_id-negative"
    ),
    pytest.param("forget_memory", {"memory_id": 1e5}, "memory_id must be the number", id="memory_id-float"),
    pytest.param("forget_memory", {"memory_id": True}, "memory_id must be the number", id="memory_id-bool"),
    pytest.param("forget_memory", {"memory_id": [1]}, "memory_id must be the number", id="memory_id-list"),
    pytest.param(
        "save_memory",
        {"text": "Juno likes tea", "list": "personal", "about_user": "²"},
        "is not a person in this conversation",
        id="about_user-superscript",
    ),
    pytest.param(
        "save_memory",
        {"text": "Juno likes tea", "list": "personal", "about_user": "7" * 5000},
        "about_user must be the user ID",
        id="about_user-5000-digits",
    ),
    pytest.param(
        "save_memory",
        {"text": "Sam plays the bassoon", "list": "personal", "about_user": "Sam"},
        "can only be about the person you answer",  # what Juno says about Sam is not Sam's memory
        id="about_user-participant-name",
    ),
    pytest.param(
        "save_memory",
        {"text": "Rin plays the harp", "list": "personal", "about_user": "Rin"},
        "is not a person in this conversation",
        id="about_user-non-participant-name",
    ),
    pytest.param(
        "save_memory",
        {"text": "Rin plays the harp", "list": "personal", "about_user": str(RIN)},
        "is not in this conversation",
        id="about_user-non-participant-id",
    ),
    pytest.param(
        "save_memory",
        DEEP,
        "not a usable JSON object",
        id="arguments-100000-deep",
    ),
    pytest.param("save_memory", {"text": "Juno collects vinyl records", "list": ["personal"]}, None, id="list-as-a-list"),
    pytest.param(
        "save_memory",
        {"text": "Juno collects vinyl records", "list": "personal", "global": "true"},
        "only the person can make a Global memory",
        id="global-as-a-string",
    ),
    pytest.param("save_memory", {"list": "personal"}, "text is missing", id="text-missing"),
    # the 0.5B model's "list": ["server"] with a person named: a fact about that person would be their personal memory
    pytest.param(
        "save_memory", {"text": "Sam works nights", "list": ["server"], "about_user": "Sam"},
        "can only be about the person you answer", id="server-naming-a-person",
    ),
    pytest.param(
        "save_memory", {"text": "Juno likes tea", "list": "personal", "about_user": "Juno"}, None, id="about_user-the-author"
    ),
    # the 0.5B model in the smoke runs: the person's own words saved as a server memory, or both lists at once;
    # either is the person's own fact, never a note the whole server reads
    pytest.param("save_memory", {"text": "My dog is called Pixel", "list": ["server"]}, None, id="server-in-first-person"),
    pytest.param(
        "save_memory", {"text": "Juno collects vinyl records", "list": ["server", "personal"]}, None, id="both-lists"
    ),
    pytest.param("save_memory", {"text": "Juno plays the cello"}, None, id="no-list"),
    pytest.param("save_memory", {"text": "Pixel is Juno's dog", "list": ["server"]}, None, id="server-naming-the-author"),
]


@pytest.mark.parametrize(("name", "arguments", "refusal"), HOSTILE)
async def test_a_hostile_call_next_to_a_valid_save_still_gets_the_reply_the_notice_and_the_receipt(
    pipeline: ReplyPipeline,
    chat: FakeChatServer,
    clock: ManualClock,
    pool: asyncpg.Pool,
    name: str,
    arguments: dict[str, Any] | str,
    refusal: str | None,
) -> None:
    await pipeline.chat_log.record(message(SAM, "hi all, I'm back from band practice", clock=clock))  # Sam takes part
    await pipeline.chat_log.record(
        message(RIN, "hello from the other channel", clock=clock, channel=CHANNEL + 50)
    )  # Rin does not
    chat.tool_calls((name, arguments), ("save_memory", MOCHI)).text("Noted!")
    outcome = await pipeline.reply(juno("my cat is called Mochi, and other things", clock))

    assert outcome.status == ReplyStatus.REPLIED and outcome.chunks == ["Noted!"]
    stored = await memories(pool)
    [mochi] = [m for m in stored if m["text"] == MOCHI["text"]]
    assert (mochi["list"], mochi["owner_id"]) == ("personal", JUNO)
    assert outcome.notices is not None and f"📝 Saved a personal memory about Juno (#{mochi['id']})" in outcome.notices.lines
    receipt = await assert_receipt_stored(pipeline, outcome)
    assert any(c["kind"] == "saved" and c["memory_id"] == mochi["id"] for c in receipt["changes"])

    hostile, valid = chat.tool_results(1)
    assert valid["ok"] is True and valid["memory_id"] == mochi["id"]
    if refusal is not None:
        assert hostile["ok"] is False and refusal in hostile["error"], hostile
        assert len(hostile["error"]) < 300
        assert len(stored) == 1  # the hostile call changed nothing
        return
    assert hostile["ok"] is True, hostile
    assert isinstance(arguments, dict)
    [made] = [m for m in stored if m["id"] == hostile["memory_id"]]
    assert made["text"] == arguments["text"].replace("My dog", "Juno's dog") and made["list"] == "personal"
    assert made["owner_id"] == JUNO and made["is_global"] is False


# --------------------------------------------------------------------------------------------------------
# 4. A flood of calls in one answer

FACTS = [
    "Juno's cat is called Mochi",
    "The book club meets on Fridays",
    "Sam works night shifts at the hospital",
    "The server mascot is a grey heron",
    "Movie night is on Saturdays at nine",
    "Rin is learning to play the harp",
    "The Minecraft server restarts every Monday",
]


def flood(count: int) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("save_memory", {"text": FACTS[i] if i < len(FACTS) else f"Filler fact number {i}", "list": "server"})
        for i in range(count)
    ]


@pytest.mark.parametrize("written", ["native", "as-text"])
async def test_300_calls_in_one_answer_change_at_most_the_action_limit_and_the_reply_comes(
    pipeline: ReplyPipeline, chat: FakeChatServer, clock: ManualClock, pool: asyncpg.Pool, written: str
) -> None:
    calls = flood(300)
    if written == "native":
        chat.tool_calls(*calls)
    else:
        chat.text("```json\n" + json.dumps([{"name": n, "arguments": a} for n, a in calls]) + "\n```")
    chat.text("Done, I noted a few of those.")
    outcome = await pipeline.reply(juno("remember all of this", clock))

    limit = pipeline.settings.max_memory_actions_per_reply
    assert limit == 5
    assert outcome.status == ReplyStatus.REPLIED and outcome.chunks == ["Done, I noted a few of those."]
    stored = await memories(pool)
    assert len(stored) == limit and [m["text"] for m in stored] == FACTS[:limit]
    assert len(chat.requests) == 2
    results = chat.tool_results(1)
    assert len(results) == MAX_CALLS_PER_ANSWER  # the rest are dropped unanswered
    assert [r["ok"] for r in results] == [True] * limit + [False] * (MAX_CALLS_PER_ANSWER - limit)
    assert all(f"at most {limit} memory changes per reply" in r["error"] for r in results[limit:])
    assert outcome.notices is not None and len(outcome.notices.lines) == limit
    assert_no_call_json(outcome.chunks)


# --------------------------------------------------------------------------------------------------------
# 5. The same save twice in one answer


@pytest.mark.parametrize(
    "second",
    [
        pytest.param(MOCHI, id="identical"),
        pytest.param('{ "list" : "personal",  "text": "Juno\'s cat is called Mochi" }', id="reordered"),
    ],
)
async def test_the_same_save_twice_in_one_answer_stores_one_memory(
    pipeline: ReplyPipeline, chat: FakeChatServer, clock: ManualClock, pool: asyncpg.Pool, second: dict[str, Any] | str
) -> None:
    chat.tool_calls(("save_memory", MOCHI), ("save_memory", second)).text("Noted!")
    outcome = await pipeline.reply(juno("my cat is called Mochi. MOCHI!", clock))

    assert outcome.chunks == ["Noted!"]
    assert [m["text"] for m in await memories(pool)] == ["Juno's cat is called Mochi"]
    first, again = chat.tool_results(1)
    assert first["ok"] is True and again == first  # the repeat gets the first call's result
    assert [change.kind for change in outcome.changes] == [ChangeKind.SAVED]
    assert outcome.notices is not None and len(outcome.notices.lines) == 1


async def test_a_saved_text_copied_from_the_transcript_keeps_no_label_or_id(
    pipeline: ReplyPipeline, chat: FakeChatServer, clock: ManualClock, pool: asyncpg.Pool
) -> None:
    copied = f"Juno's cat is called Mochi. Juno (user {JUNO}): Hi! I'm Juno. Please remember that my cat is called Mochi."
    chat.tool_calls(("save_memory", {"text": copied, "list": "personal"})).text("Nice name!")
    outcome = await pipeline.reply(juno("Please remember that my cat is called Mochi.", clock))

    assert [m["text"] for m in await memories(pool)] == ["Juno's cat is called Mochi."]
    assert outcome.notices is not None and str(JUNO) not in "\n".join(outcome.notices.lines)


@pytest.mark.parametrize(
    ("saved", "stored"),
    [
        ("My cat is called Mochi.", "Juno's cat is called Mochi."),  # what Qwen2.5-Coder 0.5B saves of Juno's message
        ("Remember that I host game night every Friday at 8pm.", "Juno hosts game night every Friday at 8pm."),
        ("My birthday is on May 3, please remember it.", "Juno's birthday is on May 3."),
        ("Juno's birthday is on May 3, please remember it.", "Juno's birthday is on May 3."),  # what 1.5B saved
        ("I'm Juno. My cat is called Mochi.", "I'm Juno. My cat is called Mochi."),  # two sentences: kept as said
        ("Mi gato se llama Mochi.", "Mi gato se llama Mochi."),  # Spanish: kept as said
    ],
)
async def test_the_authors_own_words_are_saved_as_a_fact_about_them(
    pipeline: ReplyPipeline, chat: FakeChatServer, clock: ManualClock, pool: asyncpg.Pool, saved: str, stored: str
) -> None:
    chat.tool_calls(("save_memory", {"text": saved, "list": ["server", "personal"]})).text("Nice!")
    await pipeline.reply(juno(f"Please remember: {saved}", clock))
    [memory] = await memories(pool)
    assert memory["text"] == stored and memory["owner_id"] == JUNO


async def test_a_save_beside_refused_calls_is_not_reported_as_no_change(
    pipeline: ReplyPipeline, chat: FakeChatServer, clock: ManualClock, pool: asyncpg.Pool
) -> None:
    """Qwen2.5-Coder 0.5B's answer to "please remember that I host game night": the save, then an update and a forget
    of a user id taken for a memory id, then no text, twice. People read what was saved, and that the rest was not
    done, not "Saved: … I did not change my memory"."""
    wrong = {"memory_id": 401234567890107005}
    chat.tool_calls(
        ("save_memory", {"text": "Remember that I host game night every Friday at 8pm.", "list": ["server", "personal"]}),
        ("update_memory", {**wrong, "text": "I host game night every Friday at 8pm."}),
        ("forget_memory", wrong),
    ).text("").text("")
    outcome = await pipeline.reply(juno("Please remember that I host game night every Friday at 8pm.", clock))
    assert outcome.chunks == ["📝 Saved: Juno hosts game night every Friday at 8pm.\n⚠️ I did not make the other change."]
    assert [m["text"] for m in await memories(pool)] == ["Juno hosts game night every Friday at 8pm."]


async def test_a_personal_memory_naming_another_participant_and_not_the_author_is_refused(
    pipeline: ReplyPipeline, chat: FakeChatServer, clock: ManualClock, pool: asyncpg.Pool
) -> None:
    await pipeline.reply(message(RIN, "I'm Rin, my birthday is on May 3, remember it", clock=clock))
    clock.current += timedelta(minutes=1)
    copied = "I'm Rin, my birthday is on May 3"  # what Qwen2.5-Coder 0.5B saved as Juno's, in Juno's turn
    chat.tool_calls(("save_memory", {"text": copied, "list": "personal"})).text("Happy early birthday, Rin!")
    outcome = await pipeline.reply(juno("nice, Rin! I'll bring cake", clock))

    [result] = chat.tool_results(-1)
    assert result["ok"] is False and "about Rin, not about Juno" in result["error"]
    assert [m["text"] for m in await memories(pool)] == []
    assert outcome.chunks == ["Happy early birthday, Rin!"]


# --------------------------------------------------------------------------------------------------------
# 6. The model acts with the author's rights


async def test_the_model_cannot_forget_a_protected_memory(
    pipeline: ReplyPipeline, chat: FakeChatServer, clock: ManualClock, pool: asyncpg.Pool
) -> None:
    saved = await pipeline.core.save(
        NewMemory(MemoryList.PERSONAL, "Juno is allergic to peanuts", by=JUNO, via=Source.COMMAND, guild_id=GUILD, owner_id=JUNO)
    )
    assert saved.saved is not None and saved.saved.protected
    kept = saved.saved.id
    chat.tool_calls(("forget_memory", {"memory_id": kept})).text("Okay.")
    outcome = await pipeline.reply(juno("forget about my peanut allergy", clock))

    assert outcome.prompt is not None and kept in outcome.prompt.shown_memory_ids  # refused for protection, not as unknown
    [result] = chat.tool_results(1)
    assert result["ok"] is False and "protected" in result["error"] and len(result["error"]) < 300
    assert [(m["id"], m["text"]) for m in await memories(pool)] == [(kept, "Juno is allergic to peanuts")]
    assert [change.kind for change in outcome.changes] == [ChangeKind.REJECTED]
    assert outcome.status == ReplyStatus.REPLIED and outcome.chunks == [NOT_SAVED]  # not "Okay.": nothing ran


@pytest.mark.parametrize(
    ("text", "asked", "forgotten"),
    [
        ("Juno is learning Spanish", "Forget Bau's birthday, please.", False),  # what Qwen2.5-Coder 1.5B did with this id
        ("Juno is learning Spanish", "Please forget that I'm learning Spanish", True),
        ("Juno estudia español", "olvida que estudio español, por favor", True),
        ("Juno estudia español", "borra lo de mi cumpleaños", False),
        ("Juno is learning Spanish", "forget that, please", True),  # names nothing: what it points at is the model's to say
    ],
)
async def test_the_model_forgets_only_a_memory_the_message_is_about(
    pipeline: ReplyPipeline, chat: FakeChatServer, clock: ManualClock, pool: asyncpg.Pool, text: str, asked: str,
    forgotten: bool,
) -> None:
    saved = await pipeline.core.save(
        NewMemory(MemoryList.PERSONAL, text, by=JUNO, via=Source.BOT, guild_id=GUILD, owner_id=JUNO)
    )
    assert saved.saved is not None
    target = saved.saved.id
    chat.tool_calls(("forget_memory", {"memory_id": target})).text("Okay.")
    outcome = await pipeline.reply(juno(asked, clock))

    [result] = chat.tool_results(1)
    remaining = [m["text"] for m in await memories(pool)]
    if forgotten:
        assert result == {"ok": True, "forgotten": target} and remaining == []
    else:
        assert result["ok"] is False and "does not ask to forget" in result["error"] and text in result["error"]
        assert remaining == [text]
        assert outcome.changes == [] and outcome.notices is None  # the model's mistake, told to the model only


@pytest.mark.parametrize("can_manage", [False, True])
async def test_forgetting_a_server_memory_needs_manage_server(
    pipeline: ReplyPipeline, chat: FakeChatServer, clock: ManualClock, pool: asyncpg.Pool, can_manage: bool
) -> None:
    saved = await pipeline.core.save(
        NewMemory(MemoryList.SERVER, "Movie night is on Fridays", by=SAM, via=Source.BOT, guild_id=GUILD)
    )
    assert saved.saved is not None and not saved.saved.protected
    target = saved.saved.id
    chat.tool_calls(("forget_memory", {"memory_id": target})).text("Okay.")
    outcome = await pipeline.reply(juno("forget the movie night memory", clock, author_can_manage=can_manage))

    assert outcome.prompt is not None and target in outcome.prompt.shown_memory_ids
    [result] = chat.tool_results(1)
    remaining = [m["id"] for m in await memories(pool)]
    assert outcome.status == ReplyStatus.REPLIED and outcome.chunks == (["Okay."] if can_manage else [NOT_SAVED])
    if can_manage:
        assert result == {"ok": True, "forgotten": target} and remaining == []
        assert [change.kind for change in outcome.changes] == [ChangeKind.FORGOTTEN]
    else:
        assert result["ok"] is False and "Manage Server" in result["error"] and remaining == [target]
        assert [change.kind for change in outcome.changes] == [ChangeKind.REJECTED]


# --------------------------------------------------------------------------------------------------------
# 7. A call written as text, and the answer after it again only a call


@pytest.mark.parametrize(
    "final",
    [
        pytest.param(text_call("save_memory", MOCHI), id="fenced"),
        pytest.param("<tool_call>\n" + json.dumps({"name": "save_memory", "arguments": MOCHI}) + "\n</tool_call>", id="tag"),
        pytest.param(json.dumps({"name": "save_memory", "arguments": MOCHI}), id="bare"),
        pytest.param(
            json.dumps({"type": "function", "function": {"name": "save_memory", "arguments": json.dumps(MOCHI)}}), id="wire"
        ),
        pytest.param(json.dumps({"name": "forget_memory", "arguments": {"memory_id": 1}}), id="another-call"),
    ],
)
async def test_a_call_written_as_text_then_only_a_call_again_replies_with_what_was_done(
    pipeline: ReplyPipeline, chat: FakeChatServer, clock: ManualClock, pool: asyncpg.Pool, final: str
) -> None:
    chat.text(text_call("save_memory", MOCHI)).text(final).text(final)  # asked for the answer twice: only calls
    outcome = await pipeline.reply(juno("Please remember that my cat is called Mochi.", clock))

    assert len(chat.requests) == 3 and "tools" not in chat.requests[1] and "tools" not in chat.requests[2]
    assert outcome.status == ReplyStatus.REPLIED and outcome.chunks == ["📝 Saved: Juno's cat is called Mochi."]
    assert [m["text"] for m in await memories(pool)] == ["Juno's cat is called Mochi"]  # the final answer's call is not run
    assert outcome.receipt.tool_rounds == 1 and outcome.receipt.tool_calls_from_text >= 1
    assert_no_call_json(outcome.chunks)
