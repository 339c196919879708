"""Faults during a reply, end to end through the pipeline: a broken embedding provider and a misbehaving model.

Complements tests/test_pipeline.py (errors, timeouts and malformed tool calls of the chat model) and
tests/test_embedders.py (the embedder alone): here the provider answers garbage in the middle of a
reply that also saves memories, and the model loops on tools, answers nothing, or calls tools it was
not given. Every time the person gets a clear, short answer and no rule bends.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import asyncpg
import pytest

from bot.chat.messages import IncomingMessage
from bot.chat.notices import ChangeKind
from bot.chat.receipts import ReplyStatus
from bot.chat.reply import APOLOGY, EMPTY_ANSWER, ReplyPipeline
from bot.chat.reply_text import NOT_SAVED
from bot.clock import ManualClock
from bot.config import Settings
from bot.embeddings.providers import BuiltinEmbedder, create_embedder
from bot.memory import store
from bot.memory.models import MemoryList, NewMemory, Source
from bot.memory.service import MemoryCore
from bot.servers.models import Actor
from bot.services import build_services, memory_core
from tests.fakes import FakeChatServer, FakeEmbeddingsServer

GUILD, CHANNEL, JUNO = 500, 600, 101
_ids = itertools.count(5_000_000)


@pytest.fixture
async def fake_server(builtin_embedder: BuiltinEmbedder) -> AsyncIterator[FakeEmbeddingsServer]:
    async with FakeEmbeddingsServer(builtin_embedder) as server:
        yield server


def said(text: str, clock: ManualClock, *, guild: int | None = GUILD, channel: int = CHANNEL) -> IncomingMessage:
    return IncomingMessage(next(_ids), channel, JUNO, "Juno", text, clock.now(), guild_id=guild)


async def snapshot(core: MemoryCore) -> dict[int, tuple[object, ...]]:
    return {m.id: (m.text, m.days_unused, m.last_aged_on, m.last_used_at) for m in await core.all_memories()}


@pytest.mark.parametrize("mode", ["error", "nan", "short", "missing", "slow"])
async def test_embedder_garbage_mid_reply_changes_no_counter_and_forgets_nothing(
    pool: object, clock: ManualClock, chat: FakeChatServer, fake_server: FakeEmbeddingsServer, mode: str
) -> None:
    settings = Settings(
        embedding_provider="openai", embedding_base_url=fake_server.url, embedding_model="fake-embed",
        embedding_timeout_s=0.5, chat_base_url=chat.base_url, chat_model="fake-model", chat_timeout_s=10.0,
        server_memory_limit=3, dormant_after_days=1,
    )
    core = memory_core(pool, create_embedder(settings), settings, clock)  # type: ignore[arg-type]
    pipeline = build_services(core, bot_user_id=9000).pipeline
    await pipeline.servers.sync_default_persona()
    try:
        await core.servers.update_guild_settings(GUILD, Actor(1, can_manage=True), notice_verbosity="verbose")
        for text in ("The server was founded in 2019", "Movie night is on Fridays", "The mascot is a heron"):
            assert (await core.save(NewMemory(MemoryList.SERVER, text, by=JUNO, guild_id=GUILD))).saved
        clock.current += timedelta(days=1)
        await pipeline.reply(said("the train was late again", clock))  # every memory ages into the drawer
        clock.current += timedelta(days=1)
        before = await snapshot(core)
        assert {days for _, days, _, _ in before.values()} == {1}

        fake_server.mode = mode
        chat.tool_calls(
            ("save_memory", {"text": "The book club reads Dune", "list": "server"}),  # full list: must be refused
            ("save_memory", {"text": "Juno plays the cello", "list": "personal"}),  # room: saved, waiting for its vector
        ).text("Noted, thanks!")
        outcome = await pipeline.reply(said("how is the heron mascot? also I play cello and we read Dune", clock))

        assert outcome.status == ReplyStatus.REPLIED and outcome.chunks == ["Noted, thanks!"]  # the reply is still sent
        assert not outcome.receipt.search_ok and outcome.receipt.search_failure
        # the mascot memory, in the drawer, shares words with the message: shown by text, read-only
        assert [item.get("by_text") for item in outcome.receipt.recalled] == [True]
        assert outcome.prompt is not None and "The mascot is a heron" in outcome.prompt.messages[-1]["content"]
        after = await snapshot(core)
        assert {memory_id: after[memory_id] for memory_id in before} == before  # no counter moved, nothing forgotten
        [refused, saved] = outcome.changes
        assert refused.kind == ChangeKind.REJECTED and "embedding model is unavailable" in refused.reason
        assert saved.kind == ChangeKind.SAVED and saved.memory_list == MemoryList.PERSONAL
        assert outcome.notices is not None
        assert "Reason: the list is full" in outcome.notices.lines[0]
        assert "the embedding model is unavailable" in outcome.notices.lines[0]
        waiting = await pool.fetchval(  # type: ignore[attr-defined]
            "SELECT count(*) FROM memories m WHERE NOT EXISTS (SELECT 1 FROM memory_vectors v WHERE v.memory_id = m.id)"
        )
        assert waiting == 1

        fake_server.mode = "ok"  # the provider is back: the waiting memory gets its vector, replies age again
        assert await core.reembed_missing() == 1
        outcome = await pipeline.reply(said("what's new?", clock))
        assert outcome.receipt.search_ok
        assert {m.days_unused for m in await core.all_memories() if m.list == MemoryList.SERVER} == {2}
    finally:
        await pipeline.model.close()


@pytest.fixture
async def pipeline(make_core: object, chat: FakeChatServer, builtin_embedder: BuiltinEmbedder) -> AsyncIterator[ReplyPipeline]:
    core = await make_core(chat_base_url=chat.base_url, chat_model="fake-model", chat_timeout_s=10.0)  # type: ignore[operator]
    built = build_services(core, bot_user_id=9000).pipeline
    await built.servers.sync_default_persona()
    yield built
    await built.model.close()


async def test_a_model_that_never_stops_calling_tools_is_cut_off_with_an_answer(
    pipeline: ReplyPipeline, chat: FakeChatServer, clock: ManualClock
) -> None:
    for number in range(10):  # it calls even when asked for the answer with no tools offered
        chat.tool_calls(("save_memory", {"text": f"Loop fact number {number}", "list": "server"}))
    outcome = await pipeline.reply(said("remember everything forever", clock))
    # one round, then the answer, asked for twice: no tools in either
    assert len(chat.requests) == 3 and "tools" not in chat.requests[1] and "tools" not in chat.requests[2]
    assert [change.kind for change in outcome.changes] == [ChangeKind.SAVED]  # the answer's calls are not run
    assert sorted(m.text for m in await pipeline.core.all_memories()) == ["Loop fact number 0"]
    # never silence, never tool JSON: a short sentence of what was done
    assert outcome.status == ReplyStatus.REPLIED and outcome.chunks == ["📝 Saved: Loop fact number 0."]
    chat.script.clear()
    assert (await pipeline.reply(said("hello?", clock))).chunks == ["ok"]  # and the bot keeps serving


@pytest.mark.parametrize(
    "answer",
    [
        '{"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": []}',
        '{"id": "x", "object": "chat.completion", "created": 0, "model": "m",'
        ' "choices": [{"index": 0, "message": {"role": "assistant", "content": null}, "finish_reason": "stop"}]}',
        '{"id": "x", "object": "chat.completion", "created": 0, "model": "m",'
        ' "choices": [{"index": 0, "message": {"role": "assistant", "content": "  \\n "}, "finish_reason": "stop"}]}',
        '{"choices": "not a list"}',
        "",
    ],
)
async def test_empty_or_broken_answers_get_a_short_apology(
    pipeline: ReplyPipeline, chat: FakeChatServer, clock: ManualClock, answer: str
) -> None:
    chat.raw(answer).raw(answer)  # an empty answer is asked for once more
    outcome = await pipeline.reply(said("hello?", clock))
    assert outcome.status == ReplyStatus.MODEL_ERROR and outcome.chunks in ([APOLOGY], [EMPTY_ANSWER])
    chat.script.clear()
    assert all(0 < len(chunk) < 200 for chunk in outcome.chunks)
    assert (await pipeline.reply(said("still there?", clock))).chunks == ["ok"]


async def test_tools_the_bot_does_not_offer_here_change_nothing(
    pipeline: ReplyPipeline, chat: FakeChatServer, clock: ManualClock
) -> None:
    core = pipeline.core
    kept = await core.save(NewMemory(MemoryList.SERVER, "The server was founded in 2019", by=JUNO, via=Source.COMMAND,
                                     guild_id=GUILD, by_can_manage=True))
    assert kept.saved is not None
    await core.servers.update_guild_settings(GUILD, Actor(1, can_manage=True), self_teaching=False)
    chat.tool_calls(("save_memory", {"text": "Sneaky fact", "list": "server"}),
                    ("forget_memory", {"memory_id": kept.saved.id}), text="ok")
    outcome = await pipeline.reply(said("remember this", clock))
    assert "tools" not in chat.requests[0]  # none offered where the bot may not teach itself ...
    assert outcome.changes == []  # ... and calls to them are not run, so "ok" to "remember this" says so
    assert outcome.chunks == [NOT_SAVED]
    assert [m.text for m in await core.all_memories()] == ["The server was founded in 2019"]

    chat.tool_calls(("save_memory", {"text": "DM fact", "list": "server"}),
                    ("delete_everything", {})).text("ok")
    outcome = await pipeline.reply(said("remember this too", clock, guild=None, channel=777))
    errors = [result["error"] for result in chat.tool_results()]
    assert "list must be one of: personal" in errors[0] and "no tool named 'delete_everything'" in errors[1]
    assert outcome.changes == [] and len(await core.all_memories()) == 1


BACKENDS = "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"


class KillingChatServer(FakeChatServer):
    """Terminates every other connection to the database while the model is 'thinking' (once)."""

    def __init__(self, db_url: str) -> None:
        super().__init__()
        self.db_url = db_url
        self.armed = True

    async def _chat(self, request: Any) -> Any:
        if self.armed:
            self.armed = False
            killer = await asyncpg.connect(self.db_url)
            try:
                # with a timeout, pg_terminate_backend waits until each backend is gone and its socket closed, as
                # after a real restart (without, it only signals: the reply raced the backends' last words)
                await killer.execute("SELECT pg_terminate_backend(pid, 30000) FROM pg_stat_activity"
                                     " WHERE datname = current_database() AND pid <> pg_backend_pid()")
            finally:
                await killer.close()
        return await super()._chat(request)


async def test_connections_dropped_while_the_model_thinks_are_replaced_transparently(
    db_url: str, make_core: Any, clock: ManualClock
) -> None:
    """Every pooled connection is terminated (a database restart, a failover) while the model is answering:
    asyncpg notices the closed sockets and the pool opens new ones, so the reply and its save still complete,
    in full. (A connection killed in the middle of a statement is tests/test_faults.py's case: that reply fails.)"""
    async with KillingChatServer(db_url) as chat:
        core: MemoryCore = await make_core(chat_base_url=chat.base_url, chat_model="fake-model", chat_timeout_s=10.0)
        pipeline = build_services(core, bot_user_id=9000).pipeline
        await pipeline.servers.sync_default_persona()
        try:
            assert (await core.save(NewMemory(MemoryList.SERVER, "The mascot is a heron", by=JUNO, guild_id=GUILD))).saved
            pids = {row["pid"] for row in await core.pool.fetch(BACKENDS)}
            chat.tool_calls(("save_memory", {"text": "Movie night is on Fridays", "list": "server"})).text("Noted.")
            outcome = await pipeline.reply(said("movie night is on Fridays now", clock))
            assert not chat.armed  # the connections really were terminated mid-reply
            assert outcome.status == ReplyStatus.REPLIED and outcome.chunks == ["Noted."]
            assert sorted(m.text for m in await core.all_memories()) == ["Movie night is on Fridays", "The mascot is a heron"]
            now = {row["pid"] for row in await core.pool.fetch(BACKENDS)}
            assert not (pids & now)  # all new connections
            async with core.pool.acquire() as conn:
                assert {k: v for k, v in (await store.integrity_problems(conn, 100, 100)).items() if v} == {}
        finally:
            await pipeline.model.close()
