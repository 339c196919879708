"""Vectors in the current embedding space for everything searchable, and the background work that keeps them.

One pass (`Upkeep.rebuild`) does, in order:
1. chunks the chat history that left its context window (`HistoryIndex.chunk_pending`);
2. embeds, in batches, every memory, chunk and document passage that has no vector in the current
   embedding space ("waiting for vector");
3. deletes the vectors of other spaces of every item that now has one in the current space.

The pass works from "what has no vector in the current space", so it is naturally resumable: a
pass stopped by a crash, a restart or a failing provider continues where it stopped, and never
embeds twice what it already did. Searches only ever read the current space, so vectors of an
old model are never searched, whatever state a pass is in.

The same pass runs in the background (`run`: at start, when something was stored without a
vector, and every REEMBED_INTERVAL_S) and on demand with progress (`/settings embeddings
rebuild`, `python -m bot reembed`). A lock keeps one pass at a time per process; several
processes may overlap safely (a vector stored twice is simply overwritten).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import asyncpg

from bot.embeddings.providers import EmbeddingError
from bot.embeddings.service import Embeddings, VectorKind
from bot.history.service import HistoryIndex

log = logging.getLogger(__name__)

KINDS = ("memories", "chunks", "passages")



@dataclass
class Count:
    done: int = 0
    total: int = 0


@dataclass
class RebuildProgress:
    """Where a pass stands; handed to the progress callback after every batch."""

    space: str
    counts: dict[str, Count] = field(default_factory=lambda: {kind: Count() for kind in KINDS})
    chunks_made: int = 0
    stale_removed: int = 0
    finished: bool = False
    paused: str | None = None  # why the pass stopped early (the embedding provider failed); None when it did not

    @property
    def done(self) -> int:
        return sum(count.done for count in self.counts.values())

    @property
    def total(self) -> int:
        return sum(max(count.total, count.done) for count in self.counts.values())

    @property
    def fraction(self) -> float:
        return 1.0 if self.total == 0 else min(self.done / self.total, 1.0)

    def summary(self) -> str:
        """e.g. "memories 40/40 · chat chunks 3/10 · document passages 0/5"."""
        names = {"memories": "memories", "chunks": "chat chunks", "passages": "document passages"}
        return " · ".join(f"{names[kind]} {count.done}/{max(count.total, count.done)}" for kind, count in self.counts.items())


ProgressCallback = Callable[[RebuildProgress], Awaitable[None] | None]


class Upkeep:
    """The background pass over every kind of item: `memories` are the memory core's, chunks and passages the
    embeddings service's own; `history` chunks what left the context windows first."""

    def __init__(self, embeddings: Embeddings, memories: VectorKind, history: HistoryIndex) -> None:
        self.embeddings = embeddings
        self.history = history
        self.kinds: dict[str, VectorKind] = {
            "memories": memories, "chunks": embeddings.chunks, "passages": embeddings.passages,
        }
        self.last_error: str | None = None  # the last embedding failure of a pass, until a pass completes
        self._lock = asyncio.Lock()

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    def request_pass(self) -> None:
        """Ask the background task for a pass now rather than at the next interval."""
        self.embeddings.want_vectors()

    async def waiting(self) -> dict[str, int]:
        """Items without a vector in the current space, per kind (all zero without an embedder)."""
        space = await self.embeddings.space_id()
        if space is None:
            return dict.fromkeys(KINDS, 0)
        return {kind: await vectors.waiting(space) for kind, vectors in self.kinds.items()}

    async def rebuild(self, progress: ProgressCallback | None = None) -> RebuildProgress:
        """One pass (see the module docstring). Stops at the first embedding failure; the next pass resumes."""
        async with self._lock:
            return await self._pass(progress)

    async def _pass(self, progress: ProgressCallback | None) -> RebuildProgress:
        embedder_space = self.embeddings.space
        state = RebuildProgress(space=str(embedder_space) if embedder_space else "none")
        state.chunks_made = await self.history.chunk_pending()
        space = await self.embeddings.space_id()
        if space is None:
            state.paused = "no embedding provider is configured (EMBEDDING_PROVIDER=none)"
            state.finished = True
            await _call(progress, state)
            return state
        for kind, waiting in (await self.waiting()).items():
            state.counts[kind].total = waiting
        await _call(progress, state)
        try:
            for kind, vectors in self.kinds.items():
                await self._embed(kind, vectors, space, state, progress)
        except EmbeddingError as exc:
            state.paused = str(exc)
            self.last_error = str(exc)
            log.warning("Embedding paused (%s); the next pass resumes: %s", state.summary(), exc)
        else:
            self.last_error = None
        for vectors in self.kinds.values():
            state.stale_removed += await vectors.drop_stale(space)
        state.finished = True
        if state.done or state.stale_removed:
            log.info("Vectors in %s: %s; %d vectors of other models removed", state.space, state.summary(), state.stale_removed)
        await _call(progress, state)
        return state

    async def _embed(
        self, kind: str, vectors: VectorKind, space: int, state: RebuildProgress, progress: ProgressCallback | None
    ) -> None:
        """The embeddings service's loop; failures propagate so the pass can say why it paused."""

        async def after_batch(stored: int) -> None:
            state.counts[kind].done += stored
            await _call(progress, state)

        await self.embeddings.fill(vectors, space, after_batch)

    async def run(self, stop: asyncio.Event) -> None:
        """Background task: a pass at start, whenever something was stored without a vector, and periodically."""
        wanted = self.embeddings.wanted
        while not stop.is_set():
            try:
                await self.rebuild()
            except (OSError, asyncpg.PostgresError) as exc:
                log.warning("Background vector upkeep failed, will retry: %s", exc)
            wanted.clear()
            waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wanted.wait())]
            await asyncio.wait(waiters, timeout=self.embeddings.settings.reembed_interval_s, return_when=asyncio.FIRST_COMPLETED)
            for waiter in waiters:
                waiter.cancel()


async def _call(progress: ProgressCallback | None, state: RebuildProgress) -> None:
    if progress is None:
        return
    result = progress(state)
    if inspect.isawaitable(result):
        await result
