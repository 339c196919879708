"""The embeddings service: the embedder, the current embedding space, the signal that vectors are wanted, and
the one loop that gives every kind of searchable item its vector in the current space.

Three kinds of item have one vector per embedding space: memories (owned by the memory core, whose
text can change), chat-history chunks and document passages (their vectors are owned here). Each
kind is a `VectorKind`; `Embeddings.fill` embeds any kind's waiting items in batches, and the
background rebuild (`bot.upkeep`), a new document and `reembed_missing` all use it.

Whoever stores an item without its vector (the embedder was down) calls `want_vectors`; the
background task wakes on it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import asyncpg
import numpy as np

from bot.config import Settings
from bot.db import Row
from bot.embeddings import store
from bot.embeddings.providers import Embedder, EmbeddingError, EmbeddingSpace

log = logging.getLogger(__name__)

Vector = np.ndarray
AfterBatch = Callable[[int], Awaitable[None]]


class VectorKind(Protocol):
    """One kind of item with a vector per embedding space, as its owner stores them.

    `long_texts`: chunks and passages are several times longer than memories, so they go in smaller batches.
    """

    long_texts: bool

    async def waiting(self, space: int) -> int:
        """How many items have no vector in `space`."""

    async def next_batch(self, space: int, limit: int) -> list[tuple[int, str]]:
        """Up to `limit` items without a vector in `space`, oldest first: (id, text to embed)."""

    async def store(self, space: int, vectors: Sequence[tuple[int, str, Vector]]) -> list[int]:
        """Store (id, text embedded, vector); returns the ids not stored (deleted or changed meanwhile)."""

    async def drop_stale(self, keep_space: int) -> int:
        """Delete the vectors of other spaces of items that have one in `keep_space`."""


class ItemVectors:
    """The vectors of history chunks or document passages (of one document, with `group`)."""

    long_texts = True

    def __init__(self, pool: asyncpg.Pool, kind: str, group: int | None = None) -> None:
        store.tables(kind)
        self.pool = pool
        self.kind = kind
        self.group = group

    async def waiting(self, space: int) -> int:
        async with self.pool.acquire() as conn:
            return await store.count_items_waiting(conn, self.kind, space)

    async def next_batch(self, space: int, limit: int) -> list[tuple[int, str]]:
        async with self.pool.acquire() as conn:
            return await store.items_waiting_for_vector(conn, self.kind, space, limit, self.group)

    async def store(self, space: int, vectors: Sequence[tuple[int, str, Vector]]) -> list[int]:
        gone: list[int] = []
        async with self.pool.acquire() as conn:
            for item_id, _text, vector in vectors:
                if not await store.store_item_vector(conn, self.kind, item_id, space, vector):
                    gone.append(item_id)
        return gone

    async def drop_stale(self, keep_space: int) -> int:
        async with self.pool.acquire() as conn:
            return await store.delete_stale_item_vectors(conn, self.kind, keep_space)


def split_at_threshold(
    rows: Sequence[Row], threshold: float, limit: int
) -> tuple[list[Row], float | None]:
    """Search rows (best first) scoring at least `threshold`, at most `limit` of them, and the best score under it.

    Chat history and documents search the same way; the best score under the threshold is what a
    receipt shows when nothing was relevant enough.
    """
    kept = [row for row in rows if float(row["similarity"]) >= threshold][:limit]
    below = [float(row["similarity"]) for row in rows if float(row["similarity"]) < threshold]
    return kept, max(below) if below else None


class Embeddings:
    """The embedder and everything that depends on which model it is: one per process, shared by every service."""

    def __init__(self, pool: asyncpg.Pool, embedder: Embedder, settings: Settings) -> None:
        self.pool = pool
        self.embedder = embedder
        self.settings = settings
        self.wanted = asyncio.Event()  # set when something was stored without its vector
        self.chunks = ItemVectors(pool, "chunk")
        self.passages = ItemVectors(pool, "passage")
        self._space_id: int | None = None

    @property
    def space(self) -> EmbeddingSpace | None:
        """The current embedding space; None without an embedder (no search at all)."""
        return self.embedder.space

    async def space_id(self) -> int | None:
        if self.embedder.space is None:
            return None
        if self._space_id is None:
            async with self.pool.acquire() as conn:
                self._space_id = await store.space_id(conn, self.embedder.space)
        return self._space_id

    def want_vectors(self) -> None:
        """Something was stored without its vector, or new chat may be ready to chunk: wake the background task."""
        self.wanted.set()

    def passages_of(self, document_id: int) -> ItemVectors:
        return ItemVectors(self.pool, "passage", group=document_id)

    def batch_size(self, kind: VectorKind) -> int:
        """EMBEDDING_BATCH_SIZE; a quarter of it for long texts, so each call stays within its deadline."""
        size = self.settings.embedding_batch_size
        return max(1, size // 4) if kind.long_texts else size

    async def embed_one(self, text: str) -> tuple[Vector | None, str | None]:
        """The vector of one text, or None and why not (no embedder, the provider failed)."""
        if self.embedder.space is None:
            return None, "no embedding provider is configured"
        try:
            return (await self.embedder.embed([text]))[0], None
        except EmbeddingError as exc:
            log.warning("Embedding failed: %s", exc)
            return None, str(exc)

    async def embed_available(self, texts: Sequence[str], what: str) -> list[Vector | None]:
        """Vectors for what can be embedded now, in batches, stopping at the first failure (None for the rest)."""
        vectors: list[Vector | None] = [None] * len(texts)
        if self.embedder.space is None:
            return vectors
        size = self.settings.embedding_batch_size
        for start in range(0, len(texts), size):
            try:
                batch = await self.embedder.embed(list(texts[start : start + size]))
            except EmbeddingError as exc:
                log.warning("Embedding %s paused after %d of %d: %s", what, start, len(texts), exc)
                break
            vectors[start : start + len(batch)] = list(batch)
        return vectors

    async def fill(self, kind: VectorKind, space: int, after_batch: AfterBatch | None = None) -> int:
        """Embed, in batches, every item of `kind` without a vector in `space`; returns how many got one.

        Raises EmbeddingError when the provider fails (what was stored stays stored; the next fill
        resumes). `after_batch` gets how many items of each batch got their vector. An item deleted or
        changed meanwhile is skipped, and picked up (or gone) on the next fill.
        """
        skipped: set[int] = set()
        size = self.batch_size(kind)
        done = 0
        while True:
            batch = await kind.next_batch(space, size + len(skipped))
            batch = [(item_id, text) for item_id, text in batch if item_id not in skipped][:size]
            if not batch:
                return done
            vectors = await self.embedder.embed([text for _, text in batch])
            not_stored = await kind.store(space, [(i, text, v) for (i, text), v in zip(batch, vectors, strict=True)])
            skipped.update(not_stored)
            stored = len(batch) - len(not_stored)
            done += stored
            if after_batch is not None:
                await after_batch(stored)
