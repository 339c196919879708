"""What every part of the memory service shares: its pool, embedder, settings, clock and desk cache."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import UTC, date, datetime

import asyncpg

from bot.config import Settings
from bot.db import SERVER_STARTS
from bot.memory import store
from bot.memory.clock import Clock, SystemClock
from bot.memory.desk_cache import DeskCache
from bot.memory.desk_ranks import DeskRanks
from bot.memory.embeddings import Embedder, EmbeddingError
from bot.memory.models import Conversation, Memory, MemoryList, Rejection, SaveResult, Source
from bot.servers.service import Servers

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NewMemory:
    """A save request. `guild_id` is where it happens (None = a DM); personal memories need `owner_id`.

    `by_can_manage` is the adapter's answer to "does the actor have Manage Server here". `conversation` is the
    reply a model's save belongs to: what the save shows the model or forgets follows its hiding rules.
    """

    list: MemoryList
    text: str
    by: int
    via: Source = Source.BOT
    guild_id: int | None = None
    owner_id: int | None = None
    is_global: bool = False
    tags: tuple[str, ...] = ()
    channel_ids: tuple[int, ...] = ()
    by_can_manage: bool = False
    conversation: Conversation | None = None


def _rejected(reason: Rejection, detail: str) -> SaveResult:
    return SaveResult(saved=None, forgotten=[], rejected=reason, detail=detail)


class MemoryBase:
    """What the search and the writes share: the pool, the embedder, the clock, persona and space ids, the desk cache.

    `servers` owns the personas and the settings the rules read; by default one is made on the same pool.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        embedder: Embedder,
        settings: Settings,
        clock: Clock | None = None,
        *,
        servers: Servers | None = None,
    ) -> None:
        self.pool = pool
        self.embedder = embedder
        self.settings = settings
        self.clock: Clock = clock or SystemClock()
        self.servers = servers or Servers(pool, settings)
        self._space_id: int | None = None
        self.vectors_wanted = asyncio.Event()  # set when a memory was stored without a vector
        self._server_starts = SERVER_STARTS.changes
        # desk memories already built, so each reply's search returns only what changed (exact:
        # checked against row versions by the statement; see bot/memory/desk_cache.py)
        self.desk_cache = DeskCache()
        # which desk memories the prompt keeps first when the desk outgrows its budget (frozen per chat day)
        self.desk_ranks = DeskRanks()

    # --- small helpers ---------------------------------------------------------------------

    @property
    def decay_active(self) -> bool:
        """Decay needs the switch on and an embedding model; otherwise all stays active."""
        return self.settings.memory_decay_enabled and self.embedder.space is not None

    @property
    def tail_reserve(self) -> float:
        """The share of MEMORY_TOKEN_BUDGET kept for this reply's matches (TAIL_RESERVE). With decay off nothing is
        matched or recalled, so none is kept and the desk may take the whole budget."""
        return self.settings.tail_reserve if self.decay_active else 0.0

    def is_dormant(self, memory: Memory) -> bool:
        return self.decay_active and memory.days_unused >= self.settings.dormant_after_days

    def _now(self) -> tuple[datetime, date]:
        now = self.clock.now().astimezone(UTC)
        return now, now.date()

    async def space_id(self) -> int | None:
        if self.embedder.space is None:
            return None
        if self._space_id is None:
            async with self.pool.acquire() as conn:
                self._space_id = await store.space_id(conn, self.embedder.space)
        return self._space_id

    async def persona_id(self, guild_id: int | None) -> int:
        return await self.servers.persona_id(guild_id)

    async def _embed_one(self, text: str) -> tuple[object | None, str | None]:
        if self.embedder.space is None:
            return None, "no embedding provider is configured"
        try:
            return (await self.embedder.embed([text]))[0], None
        except EmbeddingError as exc:
            log.warning("Embedding failed: %s", exc)
            return None, str(exc)

    # --- the search on every reply ----------------------------------------------------
