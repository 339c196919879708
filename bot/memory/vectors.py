"""Memories' vectors in the current embedding space: memories as one kind of item the embeddings service fills.

A memory saved while the embedder was down waits for its vector; the background rebuild fills them
in with the embeddings service's one loop, and vectors of other spaces go once nothing waits.
A vector is stored only if the memory still has the text it was computed from.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import asyncpg

from bot.embeddings.providers import EmbeddingError
from bot.embeddings.service import Embeddings, Vector
from bot.memory import store

log = logging.getLogger(__name__)


class MemoryVectors:
    """Memories as a `VectorKind`: what waits for a vector, storing vectors, dropping those of old spaces."""

    long_texts = False

    def __init__(self, pool: asyncpg.Pool, embeddings: Embeddings) -> None:
        self.pool = pool
        self.embeddings = embeddings

    async def waiting(self, space: int) -> int:
        async with self.pool.acquire() as conn:
            return await store.count_waiting_for_vector(conn, space)

    async def next_batch(self, space: int, limit: int) -> list[tuple[int, str]]:
        async with self.pool.acquire() as conn:
            return await store.memories_waiting_for_vector(conn, space, limit)

    async def store(self, space: int, vectors: Sequence[tuple[int, str, Vector]]) -> list[int]:
        """One transaction per batch; a memory edited or deleted meanwhile is not stored."""
        changed: list[int] = []
        async with self.pool.acquire() as conn, conn.transaction():
            for memory_id, text, vector in vectors:
                if not await store.store_vector(conn, memory_id, space, vector, text):
                    changed.append(memory_id)
        return changed

    async def drop_stale(self, keep_space: int) -> int:
        async with self.pool.acquire() as conn:
            return await store.delete_stale_vectors(conn, keep_space)

    async def reembed_missing(self) -> int:
        """Give every memory a vector in the current space, stopping quietly if the provider fails.

        Returns how many memories got a vector; once none is left waiting, vectors of other spaces
        go (they are never searched).
        """
        space = await self.embeddings.space_id()
        if space is None:
            return 0
        done = 0

        async def count(stored: int) -> None:
            nonlocal done
            done += stored

        try:
            await self.embeddings.fill(self, space, count)
        except EmbeddingError as exc:
            log.warning("Re-embedding paused after %d memories: %s", done, exc)
        if done and await self.waiting(space) == 0:
            await self.drop_stale(space)
        return done
