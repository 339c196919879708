"""Embedders: the OpenAI-compatible provider through the real `openai` client against a local
server, deadlines, garbage answers, and the built-in model's behaviour that the rules rely on."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import date

import numpy as np
import pytest

from bot.config import Settings
from bot.embeddings.providers import (
    BuiltinEmbedder,
    DeadlineEmbedder,
    EmbeddingError,
    NoEmbedder,
    checked_vectors,
    create_embedder,
)
from bot.memory.models import Conversation, MemoryList, NewMemory
from tests.conftest import MakeCore
from tests.fakes import FakeEmbeddingsServer


@pytest.fixture
async def fake_server(builtin_embedder: BuiltinEmbedder) -> AsyncIterator[FakeEmbeddingsServer]:
    async with FakeEmbeddingsServer(builtin_embedder) as server:
        yield server


def openai_settings(url: str, timeout: float = 2.0) -> Settings:
    return Settings(
        embedding_provider="openai", embedding_base_url=url, embedding_api_key="sk-test-secret",
        embedding_model="fake-embed", embedding_timeout_s=timeout,
    )


async def test_openai_provider_returns_unit_vectors_in_input_order(fake_server: FakeEmbeddingsServer) -> None:
    embedder = create_embedder(openai_settings(fake_server.url))
    vectors = await embedder.embed(["Juno's cat is called Mochi", "how is my cat Mochi doing?", "Minecraft 1.20"])
    assert vectors.shape == (3, 512)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]  # order kept although the server answered reversed
    assert fake_server.requests[0]["body"]["model"] == "fake-embed"
    assert fake_server.requests[0]["auth"] == "Bearer sk-test-secret"
    assert embedder.space is not None and embedder.space.model == "fake-embed" and embedder.space.base_url == fake_server.url


@pytest.mark.parametrize("mode", ["error", "nan", "short", "missing"])
async def test_openai_provider_failures_and_garbage_are_embedding_errors(fake_server: FakeEmbeddingsServer, mode: str) -> None:
    embedder = create_embedder(openai_settings(fake_server.url))
    await embedder.embed(["first call fixes the dimension"])
    fake_server.mode = mode
    with pytest.raises(EmbeddingError):
        await embedder.embed(["one", "two"])


async def test_slow_provider_hits_the_deadline(fake_server: FakeEmbeddingsServer) -> None:
    fake_server.mode = "slow"
    embedder = create_embedder(openai_settings(fake_server.url, timeout=0.3))
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(EmbeddingError, match=r"0\.3 s"):
        await embedder.embed(["hello"])
    assert loop.time() - started < 3


async def test_unreachable_provider_is_a_failed_search_not_a_crash(make_core: MakeCore, clock) -> None:
    embedder = create_embedder(openai_settings("http://127.0.0.1:9/v1", timeout=1.0))
    core = await make_core(embedder=embedder)
    clock.set_date(date(2026, 1, 2))
    saved = await core.save(NewMemory(MemoryList.SERVER, "Juno's cat is called Mochi", by=1, guild_id=5, by_can_manage=True))
    assert saved.saved is not None  # not full: stored, waiting for its vector
    recall = await core.reply_search(Conversation(5, 6, 1, "how is Mochi?"))
    assert not recall.search_ok and "openai" in (recall.failure or "")
    assert [m.id for m in recall.desk] == [saved.saved.id]


async def test_openai_provider_end_to_end_through_the_core(make_core: MakeCore, clock, fake_server: FakeEmbeddingsServer) -> None:
    core = await make_core(embedder=create_embedder(openai_settings(fake_server.url)))
    clock.set_date(date(2026, 1, 2))
    saved = await core.save(NewMemory(MemoryList.SERVER, "Juno's cat is called Mochi", by=1, guild_id=5, by_can_manage=True))
    before = len(fake_server.requests)
    recall = await core.reply_search(Conversation(5, 6, 1, "how is my cat Mochi doing?"))
    assert len(fake_server.requests) == before + 1  # exactly one embedding request per reply
    assert saved.saved is not None and [s.memory.id for s in recall.used] == [saved.saved.id]


def test_checked_vectors_rejects_garbage() -> None:
    with pytest.raises(EmbeddingError):
        checked_vectors([[0.0, 0.0]], 1)
    with pytest.raises(EmbeddingError):
        checked_vectors([[1.0, float("inf")]], 1)
    with pytest.raises(EmbeddingError):
        checked_vectors("not vectors", 1)
    with pytest.raises(EmbeddingError):
        checked_vectors([[1.0, 2.0]], 1, dimensions=3)
    assert np.allclose(checked_vectors([[3.0, 4.0]], 1), [[0.6, 0.8]])


async def test_no_embedder_always_fails() -> None:
    embedder = DeadlineEmbedder(NoEmbedder(), 1.0)
    assert embedder.space is None
    with pytest.raises(EmbeddingError, match="EMBEDDING_PROVIDER=none"):
        await embedder.embed(["x"])


async def test_builtin_embedder_runs_off_the_event_loop(builtin_embedder: BuiltinEmbedder) -> None:
    """While a large batch is embedded, the event loop keeps serving other tasks."""
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.001)

    task = asyncio.create_task(ticker())
    vectors = await builtin_embedder.embed([f"sentence number {i} about cats and tea" for i in range(400)])
    task.cancel()
    assert vectors.shape == (400, 512)
    assert ticks > 5


def test_builtin_embedder_is_multilingual(builtin_embedder: BuiltinEmbedder) -> None:
    memory, spanish, unrelated = builtin_embedder.encode_now(
        ["Juno's cat is called Mochi", "¿cómo está Mochi, el gato de Juno?", "el tren llegó tarde otra vez"]
    )
    assert memory @ spanish > 0.5 > memory @ unrelated


async def test_batches_get_a_longer_deadline_than_a_single_message(fake_server) -> None:
    fake_server.mode = "slow"  # answers after 5 s
    embedder = create_embedder(openai_settings(fake_server.url, timeout=1.0))
    assert embedder.deadline(1) == 1.0 and embedder.deadline(64) == 8.0
    with pytest.raises(EmbeddingError, match=r"1 s"):
        await embedder.embed(["a reply's message"])
    vectors = await embedder.embed([f"memory {i}" for i in range(48)])  # 6 s deadline: the batch gets through
    assert vectors.shape == (48, 512)
