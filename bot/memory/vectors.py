"""Memories' vectors in the current embedding space, and the integrity check of the stored memories.

A memory saved while the embedder was down waits for its vector; these fill them in batches (the
background rebuild drives them) and drop vectors of other spaces once nothing waits.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from bot.embeddings.providers import EmbeddingError
from bot.memory import store
from bot.memory.base import MemoryBase, log


class MemoryVectors(MemoryBase):
    async def embed_waiting_memories(self, space: int, after_batch: Callable[[int], Awaitable[None]] | None = None) -> None:
        """Embed, in batches, every memory without a vector in `space`; raises EmbeddingError.

        The one loop behind the background rebuild (which reports why it paused) and
        `reembed_missing`. `after_batch` gets how many memories of the batch got their vector; a
        memory edited or deleted meanwhile is skipped and picked up (or gone) on the next pass.
        """
        skipped: set[int] = set()
        size = self.settings.embedding_batch_size
        while True:
            async with self.pool.acquire() as conn:
                batch = await store.memories_waiting_for_vector(conn, space, size + len(skipped))
            batch = [(memory_id, text) for memory_id, text in batch if memory_id not in skipped][:size]
            if not batch:
                return
            vectors = await self.embedder.embed([text for _, text in batch])
            stored = 0
            async with self.pool.acquire() as conn, conn.transaction():
                for (memory_id, text), vector in zip(batch, vectors, strict=True):
                    if await store.store_vector(conn, memory_id, space, vector, text):
                        stored += 1
                    else:
                        skipped.add(memory_id)
            if after_batch is not None:
                await after_batch(stored)

    async def reembed_missing(self) -> int:
        """Give every memory a vector in the current space, stopping quietly if the provider fails.

        Returns how many memories got a vector; once none is left waiting, vectors of other spaces
        go (they are never searched).
        """
        space = await self.space_id()
        if space is None:
            return 0
        done = 0

        async def count(stored: int) -> None:
            nonlocal done
            done += stored

        try:
            await self.embed_waiting_memories(space, count)
        except EmbeddingError as exc:
            log.warning("Re-embedding paused after %d memories: %s", done, exc)
        if done:
            async with self.pool.acquire() as conn:
                if await store.count_waiting_for_vector(conn, space) == 0:
                    await store.delete_stale_vectors(conn, space)
        return done


    async def waiting_for_vector(self, space: int) -> int:
        async with self.pool.acquire() as conn:
            return await store.count_waiting_for_vector(conn, space)

    async def drop_stale_vectors(self, keep_space: int) -> int:
        async with self.pool.acquire() as conn:
            return await store.delete_stale_vectors(conn, keep_space)

    async def integrity_problems(self) -> dict[str, list[str]]:
        """Every inconsistency the rules forbid, by kind (`python -m bot check`); empty lists mean the data is sound."""
        async with self.pool.acquire() as conn:
            return await store.integrity_problems(conn, self.settings.server_memory_limit, self.settings.personal_memory_limit)

    async def count_memories(self) -> int:
        async with self.pool.acquire() as conn:
            return await conn.fetchval("SELECT count(*) FROM memories")
