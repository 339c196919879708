"""The memory service: what adapters and the other services call, with plain values.

`MemoryCore` is made of parts it owns, each with the dependencies it needs and nothing else:

- `search` (`bot.memory.recall.ReplySearch`): the search on every reply;
- `writes` (`bot.memory.writes.MemoryWrites`): saves, edits and deletes;
- `bulk` (`bot.memory.bulk.BulkWrites`): imports, scope moves, a user's memories for export or deletion;
- `vectors` (`bot.memory.vectors.MemoryVectors`): memories as a kind of item the embeddings service fills;
- `decay` (`bot.memory.decay.Decay`): whether memories decay here, and which are dormant;
- `updates` (`bot.memory.updates.ModelUpdates`): the model's updates (applied, or saved beside the memory they
  would have erased) and what the day-end notes read.

SQL lives in `store` and `search_store`, imported only by this package. The rules are in
docs/memory-rules.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg

from bot.clock import Clock, SystemClock
from bot.config import Settings
from bot.db import Connection
from bot.embeddings.service import Embeddings
from bot.memory import store
from bot.memory.bulk import BulkWrites
from bot.memory.decay import Decay
from bot.memory.lists import ImportEntry, ListRef
from bot.memory.models import Conversation, Memory, NewMemory, Recall, SaveResult, Source
from bot.memory.recall import ReplySearch
from bot.memory.saves import SaveCheck
from bot.memory.updates import ModelUpdates
from bot.memory.vectors import MemoryVectors
from bot.memory.writes import MemoryWrites
from bot.servers.service import Servers


class MemoryCore:
    """The memory service. `servers` owns the personas and the settings the rules read; by default one is made
    on the same pool."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        embeddings: Embeddings,
        settings: Settings,
        clock: Clock | None = None,
        *,
        servers: Servers | None = None,
    ) -> None:
        self.pool = pool
        self.embeddings = embeddings
        self.settings = settings
        self.clock: Clock = clock or SystemClock()
        self.servers = servers or Servers(pool, settings)
        self.decay = Decay(settings, embeddings)
        self.search = ReplySearch(pool, embeddings, settings, self.clock, self.servers, self.decay)
        self.writes = MemoryWrites(pool, embeddings, settings, self.clock, self.servers, self.decay)
        self.bulk = BulkWrites(pool, embeddings, settings, self.clock)
        self.vectors = MemoryVectors(pool, embeddings)
        self.updates = ModelUpdates(pool, embeddings, settings, self.servers, self.writes)

    # --- the rules of decay ---

    @property
    def decay_active(self) -> bool:
        return self.decay.active

    @property
    def tail_reserve(self) -> float:
        return self.decay.tail_reserve

    def is_dormant(self, memory: Memory) -> bool:
        return self.decay.is_dormant(memory)

    # --- the search on every reply ---

    async def reply_search(self, conversation: Conversation) -> Recall:
        return await self.search.reply_search(conversation)

    # --- changes ---

    async def save(self, request: NewMemory, *, search_available: bool = True, check: SaveCheck | None = None) -> SaveResult:
        return await self.writes.save(request, search_available=search_available, check=check)

    async def edit(
        self,
        memory_id: int,
        text: str,
        *,
        by: int,
        via: Source = Source.COMMAND,
        by_can_manage: bool = False,
        tags: Sequence[str] | None = None,
        reason: str = "",
    ) -> SaveResult:
        """A change of a memory's text (and tags); the text it replaces is kept as a version (`reason`: why)."""
        return await self.writes.edit(memory_id, text, by=by, via=via, by_can_manage=by_can_manage, tags=tags, reason=reason)

    async def update_by_model(
        self,
        memory_id: int,
        text: str,
        *,
        by: int,
        guild_id: int | None,
        via: Source = Source.BOT,
        by_can_manage: bool = False,
        reason: str = "",
        search_available: bool = True,
        check: SaveCheck | None = None,
        source_messages: tuple[tuple[int, int, int], ...] = (),
        declared_change: bool = False,
    ) -> SaveResult:
        """The model's update: applied when about the same subject, otherwise saved as a new memory beside it
        (`declared_change`: a day-end correction from a line that says it changes something, held to a lower bar)."""
        return await self.updates.update_by_model(
            memory_id, text, by=by, guild_id=guild_id, via=via, by_can_manage=by_can_manage, reason=reason,
            search_available=search_available, check=check, source_messages=source_messages,
            declared_change=declared_change,
        )

    async def memories_for_notes(
        self, guild_id: int | None, channel_id: int, people: Sequence[int], texts: Sequence[str]
    ) -> list[tuple[Memory, Any]]:
        return await self.updates.memories_for_notes(guild_id, channel_id, people, texts)

    async def current_texts(self, texts: Sequence[str], guild_id: int | None, owner_ids: Sequence[int]) -> dict[str, str]:
        return await self.updates.current_texts(texts, guild_id, owner_ids)

    async def delete(
        self, memory_id: int, *, by: int, via: Source = Source.COMMAND, by_can_manage: bool = False
    ) -> SaveResult:
        return await self.writes.delete(memory_id, by=by, via=via, by_can_manage=by_can_manage)

    async def forget_by_model(self, memory_id: int, asked: str, *, by: int, by_can_manage: bool = False) -> SaveResult:
        """The model's forget: refused when the message asking is about something else than the memory."""
        return await self.updates.forget_by_model(memory_id, asked, by=by, by_can_manage=by_can_manage)

    async def move_scope(self, ref: ListRef, memory_id: int, *, to_global: bool) -> Memory:
        return await self.bulk.move_scope(ref, memory_id, to_global=to_global)

    async def import_entries(
        self, ref: ListRef, entries: Sequence[ImportEntry], *, replace: bool, by: int, limit: int
    ) -> tuple[list[int], int, int, int]:
        return await self.bulk.import_entries(ref, entries, replace=replace, by=by, limit=limit)

    async def reembed_missing(self) -> int:
        return await self.vectors.reembed_missing()

    # --- a user's data, inside a transaction that spans every owner (`bot.services`) ---

    async def export_user(self, conn: Connection, user_id: int) -> dict[str, Any]:
        return await self.bulk.export_user(conn, user_id)

    async def forget_user(self, conn: Connection, user_id: int) -> dict[str, int]:
        return await self.bulk.forget_user(conn, user_id)

    # --- reading everything (tools, tests) ---

    async def all_memories(self) -> list[Memory]:
        async with self.pool.acquire() as conn:
            return await store.all_memories(conn)

    async def count_memories(self) -> int:
        async with self.pool.acquire() as conn:
            return await store.count_memories(conn)

    async def integrity_problems(self) -> dict[str, list[str]]:
        """Every inconsistency the rules forbid, by kind (`python -m bot check`); empty lists mean the data is sound."""
        async with self.pool.acquire() as conn:
            return await store.integrity_problems(conn, self.settings.server_memory_limit, self.settings.personal_memory_limit)
