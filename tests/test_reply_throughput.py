"""The issue-5 throughput work in the bot's code: micro-batched embeddings, the lean chat call, token counts
cached by text, and the fewer statements per reply. Real parts throughout: the real built-in model (wrapped
only to count or fail its calls), the real database, the real `openai` client against a local server."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Sequence
from datetime import date
from typing import Any

import asyncpg
import numpy as np
import pytest
from aiohttp import web

from bot.chat import log_store
from bot.chat.receipts import ReplyStatus
from bot.clock import ManualClock
from bot.config import Settings
from bot.embeddings.providers import (
    BuiltinEmbedder,
    DeadlineEmbedder,
    EmbeddingError,
    EmbeddingSpace,
    MicroBatchingEmbedder,
    create_embedder,
)
from bot.memory.models import Conversation, MemoryList, NewMemory
from bot.servers import store as servers_store
from bot.servers.models import Actor
from bot.services import build_services
from bot.tokens import _count_long, _count_short, count_tokens, count_tokens_uncached
from tests.conftest import MakeCore
from tests.fakes import FakeChatServer
from tests.recall_helpers import BOT, CHANNEL, GUILD, JUNO, RIN, SAM, message


class CountingModel:
    """The real built-in model, counting its calls; `fail_if` makes a call fail when it holds that text,
    `delay` holds each call (in the executor, as a slow model would) so that later requests pile up."""

    def __init__(self, model: BuiltinEmbedder, *, fail_if: str | None = None, delay: float = 0.0) -> None:
        self.model = model
        self.fail_if = fail_if
        self.delay = delay
        self.batches: list[list[str]] = []
        self.started = asyncio.Event()

    @property
    def space(self) -> EmbeddingSpace:
        return self.model.space

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.batches.append(list(texts))
        self.started.set()
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail_if is not None and self.fail_if in texts:
            raise RuntimeError("the model ran out of memory (test)")
        return await self.model.embed(texts)


# --- micro-batched embeddings ---------------------------------------------------------------------------


def test_the_bot_batches_its_builtin_model_which_keeps_one_blas_thread_per_cpu(builtin_embedder: BuiltinEmbedder) -> None:
    embedder = create_embedder(Settings(), builtin=builtin_embedder)
    assert isinstance(embedder, DeadlineEmbedder) and isinstance(embedder.inner, MicroBatchingEmbedder)
    assert embedder.inner.inner is builtin_embedder and embedder.space == builtin_embedder.space
    assert builtin_embedder._model.threads == (os.cpu_count() or 1)  # the project's rule: not one thread


async def test_concurrent_requests_share_one_model_call_and_each_gets_its_own_rows(
    builtin_embedder: BuiltinEmbedder,
) -> None:
    model = CountingModel(builtin_embedder)
    batcher = MicroBatchingEmbedder(model)
    requests = [["how is Mochi?"], ["raid on Thursday", "bring snacks", "who has the key?"], ["¿dónde está el gato?"]]
    requests += [[f"message number {i} about the heron"] for i in range(6)]
    results = await asyncio.gather(*(DeadlineEmbedder(batcher, 30).embed(texts) for texts in requests))
    assert len(model.batches) == 1 and batcher.calls == 1 and batcher.texts == sum(map(len, requests))
    for texts, vectors in zip(requests, results, strict=True):
        assert vectors.shape == (len(texts), 512)
        np.testing.assert_allclose(vectors, builtin_embedder.encode_now(texts), atol=1e-5)


async def test_requests_arriving_while_a_batch_runs_go_together_in_the_next_call(builtin_embedder: BuiltinEmbedder) -> None:
    model = CountingModel(builtin_embedder, delay=0.2)
    batcher = MicroBatchingEmbedder(model, max_texts=4)
    first = asyncio.create_task(batcher.embed(["first"]))
    await model.started.wait()
    later = [asyncio.create_task(batcher.embed([f"later {i}"])) for i in range(6)]
    big = asyncio.create_task(batcher.embed([f"big {i}" for i in range(6)]))  # more than max_texts: alone, never split
    await asyncio.gather(first, *later, big)
    assert model.batches == [
        ["first"],
        ["later 0", "later 1", "later 2", "later 3"],
        ["later 4", "later 5"],
        [f"big {i}" for i in range(6)],
    ]
    np.testing.assert_allclose(later[5].result(), builtin_embedder.encode_now(["later 5"]), atol=1e-5)


async def test_a_text_the_model_cannot_embed_fails_only_its_own_caller(builtin_embedder: BuiltinEmbedder) -> None:
    model = CountingModel(builtin_embedder, fail_if="poison", delay=0.1)
    batcher = MicroBatchingEmbedder(model)
    embedder = DeadlineEmbedder(batcher, 30)
    shared = [asyncio.create_task(embedder.embed(texts)) for texts in (["poison"], ["innocent bystander"], ["poison", "x"])]
    await model.started.wait()
    fine = [asyncio.create_task(embedder.embed([text])) for text in ("next batch", "also next")]
    outcomes = await asyncio.gather(*shared, *fine, return_exceptions=True)
    # the shared call failed, then each of its requests went alone; the later ones shared a call
    assert model.batches[0] == ["poison", "innocent bystander", "poison", "x"]
    assert model.batches[1:4] == [["poison"], ["innocent bystander"], ["poison", "x"]]
    assert model.batches[4:] == [["next batch", "also next"]]
    errors = [outcomes[0], outcomes[2]]
    assert all(isinstance(error, EmbeddingError) and "RuntimeError: the model ran out" in str(error) for error in errors)
    assert errors[0] is not errors[1]  # one exception each: tracebacks of different tasks never pile up on one object
    np.testing.assert_allclose(outcomes[1], builtin_embedder.encode_now(["innocent bystander"]), atol=1e-5)
    np.testing.assert_allclose(outcomes[3], builtin_embedder.encode_now(["next batch"]), atol=1e-5)
    assert (await embedder.embed(["after the failure"])).shape == (1, 512)  # the batcher keeps working


async def test_deadlines_hold_and_a_caller_that_gave_up_is_left_out_of_the_next_batch(builtin_embedder: BuiltinEmbedder) -> None:
    model = CountingModel(builtin_embedder, delay=0.5)
    batcher = MicroBatchingEmbedder(model)
    slow_start = asyncio.create_task(batcher.embed(["slow"]))
    await model.started.wait()
    with pytest.raises(EmbeddingError, match=r"no answer within 0\.1 s"):
        await DeadlineEmbedder(batcher, 0.1).embed(["gave up"])
    waiting = asyncio.create_task(batcher.embed(["still wanted"]))
    await asyncio.gather(slow_start, waiting)
    assert model.batches == [["slow"], ["still wanted"]]  # "gave up" was never embedded


async def test_a_failed_batch_during_concurrent_replies_ages_and_resets_nothing(
    make_core: MakeCore, clock: ManualClock, builtin_embedder: BuiltinEmbedder, pool: asyncpg.Pool
) -> None:
    model = CountingModel(builtin_embedder, fail_if="how is Mochi?", delay=0.05)
    core = await make_core(embedder=DeadlineEmbedder(MicroBatchingEmbedder(model), 30))
    # looked up once: both searches then embed in the same tick
    await core.servers.persona_id(GUILD), await core.embeddings.space_id()
    clock.set_date(date(2026, 1, 1))
    for text in ("Juno's cat is called Mochi", "The raid is on Thursday"):
        assert (await core.save(NewMemory(MemoryList.SERVER, text, by=JUNO, guild_id=GUILD, by_can_manage=True))).saved
    clock.set_date(date(2026, 1, 3))
    before = [tuple(row) for row in await pool.fetch("SELECT id, days_unused, last_aged_on, last_used_at FROM memories")]
    calls = len(model.batches)  # saving embedded the memories
    await core.servers.persona_id(GUILD + 1)
    recalls = await asyncio.gather(  # "hi" in another server, whose search touches none of these memories
        core.reply_search(Conversation(GUILD, CHANNEL, JUNO, "how is Mochi?")),
        core.reply_search(Conversation(GUILD + 1, CHANNEL + 1, JUNO, "hi")),
    )
    # the shared call failed; each request went again alone: only the failing one's search failed
    assert model.batches[calls:] == [["how is Mochi?", "hi"], ["how is Mochi?"], ["hi"]]
    assert [recall.search_ok for recall in recalls] == [False, True]
    after = [tuple(row) for row in await pool.fetch("SELECT id, days_unused, last_aged_on, last_used_at FROM memories")]
    assert after == before
    recall = await core.reply_search(Conversation(GUILD, CHANNEL, JUNO, "is the raid still on Thursday?"))
    assert recall.search_ok and len(model.batches) == calls + 4


# --- token counts cached by text ------------------------------------------------------------------------


def test_cached_token_counts_are_exact_and_bounded() -> None:
    texts = ["hello", "<|endoftext|> is just text here", "日本語のテキスト", "x" * 5000, '{"id": 12, "text": "Mochi"}']
    for text in texts:
        assert count_tokens(text) == count_tokens(text) == count_tokens_uncached(text)
    hits = _count_short.cache_info().hits + _count_long.cache_info().hits
    count_tokens("x" * 5000)
    count_tokens("hello")
    assert _count_short.cache_info().hits + _count_long.cache_info().hits == hits + 2
    assert _count_short.cache_info().maxsize and _count_long.cache_info().maxsize  # bounded, not a leak
    # counts are never added up from pieces: a concatenation is its own text (BPE merges across the seam)
    assert count_tokens("ab") != count_tokens("a") + count_tokens("b")


# --- the pipeline: lean chat call, fewer statements -----------------------------------------------------


class HeaderRecordingChat(FakeChatServer):
    """The usual fake chat endpoint, also keeping the headers of each request."""

    def __init__(self) -> None:
        super().__init__()
        self.headers: list[dict[str, str]] = []

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.headers.append(dict(request.headers))
        return await super()._chat(request)


class CountingPool:
    """The real pool, counting acquisitions and the statements run on the connections it hands out."""

    STATEMENTS = ("execute", "executemany", "fetch", "fetchrow", "fetchval")

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.acquisitions = 0
        self.statements: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pool, name)

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[Any]:
        self.acquisitions += 1
        async with self.pool.acquire() as conn:
            yield _CountingConnection(conn, self.statements)


class _CountingConnection:
    def __init__(self, conn: Any, statements: list[str]) -> None:
        self._conn = conn
        self._statements = statements

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._conn, name)
        if name not in CountingPool.STATEMENTS:
            return attribute

        async def counted(query: str, *args: Any, **kwargs: Any) -> Any:
            self._statements.append(query)
            return await attribute(query, *args, **kwargs)

        return counted


@pytest.fixture
async def header_chat() -> AsyncIterator[HeaderRecordingChat]:
    async with HeaderRecordingChat() as server:
        yield server


async def test_the_chat_call_sends_the_request_as_built_with_the_api_key(
    make_core: MakeCore, header_chat: HeaderRecordingChat, clock: ManualClock
) -> None:
    core = await make_core(chat_base_url=header_chat.base_url, chat_model="fake-model", chat_api_key="sk-test-key-123")
    pipeline = build_services(core, bot_user_id=BOT).pipeline
    await pipeline.servers.sync_default_persona()
    try:
        header_chat.tool_calls(("save_memory", {"text": "Juno plays the cello", "list": "personal"})).text("Noted.")
        outcome = await pipeline.reply(message(JUNO, "I play the cello now", clock=clock))
        assert outcome.status == ReplyStatus.REPLIED and outcome.text == "Noted."
        assert [h["Authorization"] for h in header_chat.headers] == ["Bearer sk-test-key-123"] * 2
        first = header_chat.requests[0]
        assert set(first) == {"model", "temperature", "max_tokens", "messages", "tools"}
        assert outcome.prompt is not None and first["messages"] == outcome.prompt.messages
        assert header_chat.requests[1]["messages"][-1]["role"] == "tool"  # the tool round went through the same call
        header_chat.error(401, "Incorrect API key provided")
        failed = await pipeline.reply(message(JUNO, "still there?", clock=clock))
        assert failed.status == ReplyStatus.MODEL_ERROR and (failed.error or "").startswith("AuthenticationError")
    finally:
        await pipeline.model.close()


async def test_a_reply_runs_four_statements_of_its_own_and_reads_settings_fresh(
    make_core: MakeCore, chat: FakeChatServer, clock: ManualClock, pool: asyncpg.Pool
) -> None:
    counting = CountingPool(pool)
    core = await make_core(pool_=counting, chat_base_url=chat.base_url, chat_model="fake-model", context_messages=3)
    pipeline = build_services(core, bot_user_id=BOT).pipeline
    pipeline.sources = []  # the tail sources' own searches are measured elsewhere
    await pipeline.servers.sync_default_persona()
    await pipeline.servers.add_lore(GUILD, Actor(JUNO, can_manage=True), "The mascot is a heron.")
    assert (await core.save(NewMemory(MemoryList.PERSONAL, "Rin plays drums", by=RIN, guild_id=GUILD, owner_id=RIN))).saved
    for author, text in ((SAM, "one"), (SAM, "two"), (RIN, "three")):  # Rin takes part: her memories count
        await pipeline.chat_log.record(message(author, text, clock=clock))
    await pipeline.reply(message(JUNO, "warming up", clock=clock))  # persona and space ids are cached after this

    searched: list[tuple[int, int]] = []  # statements and acquisitions of the core's search (its own business)
    search = core.reply_search

    async def counted_search(conversation: Conversation) -> Any:
        before = len(counting.statements), counting.acquisitions
        try:
            return await search(conversation)
        finally:
            searched.append((len(counting.statements) - before[0], counting.acquisitions - before[1]))

    core.reply_search = counted_search  # type: ignore[method-assign]
    statements, acquisitions = len(counting.statements), counting.acquisitions
    renamed = message(JUNO, "hey <@103>, drums tonight?", clock=clock, mentions=(RIN,))
    renamed = renamed.__class__(**{**renamed.__dict__, "author_name": "Juno the Great"})
    outcome = await pipeline.reply(renamed)
    own_statements = len(counting.statements) - statements - searched[0][0]
    own_acquisitions = counting.acquisitions - acquisitions - searched[0][1]
    assert outcome.status == ReplyStatus.REPLIED
    # the chat log's two on one connection (the message and names; the window, names and previous head), the
    # servers' one and the channel's summaries at the same time (persona, lore, settings; summaries), then the receipt
    assert (own_statements, own_acquisitions) == (5, 4), counting.statements[statements:]
    # the window: the last context_messages up to the answered one, without it; the names as just given
    assert [m["content"] for m in chat.messages()[1:-1]] == ["Rin (user 103): three", "Juno (user 101): warming up"]
    assert "Juno the Great (user 101): hey" in chat.messages()[-1]["content"]
    head = chat.messages()[0]["content"]
    assert '"The mascot is a heron."' in head and "### About Rin (user 103)" in head
    assert await pool.fetchval("SELECT name FROM chat_users WHERE user_id = $1", JUNO) == "Juno the Great"
    assert "tools" in chat.requests[-1]

    # another bot process turns self-teaching off: the next reply offers no tools (nothing cached)
    async with pool.acquire() as conn:
        await servers_store.update_guild_settings(conn, GUILD, {"self_teaching": False})
    await pipeline.reply(message(JUNO, "and now?", clock=clock))
    assert "tools" not in chat.requests[-1]
    await pipeline.model.close()


async def test_receipts_are_trimmed_to_the_same_number_as_before(pool: asyncpg.Pool, clock: ManualClock) -> None:
    async with pool.acquire() as conn:
        for number in range(log_store.RECEIPTS_KEPT_PER_CHANNEL + 5):
            await log_store.save_reply_receipt(
                conn, guild_id=GUILD, channel_id=CHANNEL, message_id=number, head_hash=f"h{number}",
                receipt={"n": number}, created_at=clock.now(),
            )
        kept = await conn.fetch("SELECT message_id FROM reply_receipts WHERE channel_id = $1 ORDER BY id", CHANNEL)
        kept_per_channel = log_store.RECEIPTS_KEPT_PER_CHANNEL
        assert len(kept) == kept_per_channel and kept[-1]["message_id"] == kept_per_channel + 4
        assert await log_store.previous_head_hash(conn, CHANNEL) == f"h{log_store.RECEIPTS_KEPT_PER_CHANNEL + 4}"


def test_the_bot_runs_on_uvloop_when_it_is_installed() -> None:
    from bot.bot import run_event_loop

    async def loop_module() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert run_event_loop(loop_module()).startswith("uvloop")
