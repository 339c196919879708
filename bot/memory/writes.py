"""Every change to memories: saves (merging or forgetting to make room: `bot.memory.saves`), edits, deletes,
tags, scope moves, imports, delete-my-data, and vectors for a new embedding space.

Each change is one transaction. The rules are in docs/memory-rules.md ("Saving and forgetting", "Protection").
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import asyncpg

from bot.clock import Clock, utc_now
from bot.config import Settings
from bot.db import Connection
from bot.embeddings.service import Embeddings
from bot.errors import InvalidInput
from bot.memory import store, versions_store
from bot.memory.decay import Decay
from bot.memory.model_rules import model_text_refusal
from bot.memory.models import (
    MODEL_SOURCES,
    Memory,
    MemoryList,
    NewMemory,
    Rejection,
    SaveResult,
    Source,
    VersionVia,
)
from bot.memory.saves import MemorySaves, SaveCheck, _rejected
from bot.memory.visibility import clean_text
from bot.servers.models import Privacy
from bot.servers.service import Servers

log = logging.getLogger(__name__)

VERSION_VIA = {Source.BOT: VersionVia.BOT, Source.COMMAND: VersionVia.COMMAND, Source.NOTES: VersionVia.NOTES}
DEFAULT_REASON = {
    Source.BOT: "updated by the model in a reply",
    Source.COMMAND: "edited with a command",
    Source.NOTES: "corrected by the day-end notes",
}


class MemoryWrites:
    """Saves (forgetting to make room), edits and deletes, each one transaction."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        embeddings: Embeddings,
        settings: Settings,
        clock: Clock,
        servers: Servers,
        decay: Decay,
    ) -> None:
        self.pool = pool
        self.embeddings = embeddings
        self.settings = settings
        self.clock = clock
        self.servers = servers
        self.decay = decay
        self.saves = MemorySaves(pool, embeddings, settings, clock, servers, decay)

    async def save(self, request: NewMemory, *, search_available: bool = True, check: SaveCheck | None = None) -> SaveResult:
        """Save one memory; a full list merges, forgets or refuses (`bot.memory.saves`)."""
        return await self.saves.save(request, search_available=search_available, check=check)

    # --- edits and deletes ---------------------------------------------------------------------

    async def change_refusal(
        self, conn: Connection, memory: Memory, by: int, via: Source, by_can_manage: bool, *, deleting: bool
    ) -> SaveResult | None:
        """Who may change or delete what. The model (`via` bot or notes) acts for the person it answers (or whose
        words a day-end note comes from), `by`, never with more rights than that person has by command; it never
        changes or deletes a protected memory."""
        if via in MODEL_SOURCES and memory.protected:
            return _rejected(
                Rejection.NOT_ALLOWED, f"memory #{memory.id} is protected (added or edited with a command, or Global); "
                f"only a command can {'delete' if deleting else 'change'} it"
            )
        if memory.list == MemoryList.PERSONAL:
            assert memory.owner_id is not None
            if by != memory.owner_id:
                return _rejected(Rejection.NOT_ALLOWED, "only its owner can change a personal memory")
            if via in MODEL_SOURCES and not deleting and await self.servers.privacy(memory.owner_id, conn) != Privacy.NONE:
                return _rejected(
                    Rejection.PRIVACY, "this user's privacy setting does not let the bot change memories about them"
                )
            return None
        assert memory.guild_id is not None
        guild = await self.servers.guild_settings(memory.guild_id, conn)
        if via in MODEL_SOURCES and not guild.self_teaching:
            return _rejected(Rejection.NOT_ALLOWED, "self-teaching is switched off in this server")
        if by_can_manage or (guild.member_teaching and memory.created_by == by):
            return None
        if via in MODEL_SOURCES:
            return _rejected(
                Rejection.NOT_ALLOWED,
                "the person you answer could not change this server memory with /memories (it needs Manage Server, "
                "or member teaching for their own memories)",
            )
        return _rejected(Rejection.NOT_ALLOWED, "only members with Manage Server can change this server memory")

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
        check: SaveCheck | None = None,
        source_messages: Sequence[tuple[int, int, int]] = (),
    ) -> SaveResult:
        """Change a memory's text (and its tags, when given) in one transaction. A command edit protects it;
        the counter restarts at 0 either way. The text it replaces is kept as a version in the same transaction
        (`reason` says why; `by` is who changed it, or for whom the model did). A day-end correction names the
        messages its text came from (`source_messages`); any other change of the text forgets the old ones."""
        try:
            cleaned = clean_text(text, self.settings.memory_max_chars)
        except InvalidInput as exc:
            return _rejected(Rejection.INVALID_TEXT, str(exc))
        async with self.pool.acquire() as conn:
            memory = await store.get_memory(conn, memory_id)
            if memory is None:
                return _rejected(Rejection.NOT_ALLOWED, f"there is no memory #{memory_id}")
            refusal = await self.change_refusal(conn, memory, by, via, by_can_manage, deleting=False)
            if refusal is None and via in MODEL_SOURCES:
                refusal = await model_text_refusal(self.servers, conn, cleaned)
        if refusal is not None:
            return refusal
        vector, _ = await self.embeddings.embed_one(cleaned)
        space = await self.embeddings.space_id()
        now, today = utc_now(self.clock)
        async with self.pool.acquire() as conn, conn.transaction():
            current = await store.get_memory(conn, memory_id, for_update=True)
            if current is None:
                return _rejected(Rejection.NOT_ALLOWED, f"memory #{memory_id} was deleted meanwhile")
            withdrawn = await check(conn) if check is not None else None
            if withdrawn is not None:
                return _rejected(Rejection.WITHDRAWN, withdrawn)
            if cleaned != current.text:
                await versions_store.keep_version(
                    conn, current, replaced_by=by, via=VERSION_VIA[via], reason=reason or DEFAULT_REASON[via], at=now
                )
                await store.set_memory_sources(conn, memory_id, source_messages if via == Source.NOTES else ())
            updated = await store.update_memory_text(
                conn, memory_id, text=cleaned, source=via if via in (Source.COMMAND, Source.NOTES) else current.source,
                protected=current.protected or via == Source.COMMAND, now=now, today=today,
            )
            if tags is not None and tuple(tags) != updated.tags:
                await store.set_memory_tags(conn, memory_id, tags, now)
                updated = await store.get_memory(conn, memory_id) or updated
            if vector is not None and space is not None:
                await store.store_vector(conn, memory_id, space, vector, cleaned)
        if vector is None and space is not None:
            self.embeddings.want_vectors()
        return SaveResult(saved=updated, forgotten=[], rejected=None, detail="edited", replaced_text=current.text)

    async def delete(
        self, memory_id: int, *, by: int, via: Source = Source.COMMAND, by_can_manage: bool = False
    ) -> SaveResult:
        """Delete a memory (deleting is allowed to the model even under `partial` privacy)."""
        async with self.pool.acquire() as conn, conn.transaction():
            memory = await store.get_memory(conn, memory_id, for_update=True)
            if memory is None:
                return _rejected(Rejection.NOT_ALLOWED, f"there is no memory #{memory_id}")
            refusal = await self.change_refusal(conn, memory, by, via, by_can_manage, deleting=True)
            if refusal is not None:
                return refusal
            await store.delete_memories(conn, [memory_id])
        return SaveResult(saved=None, forgotten=[memory], rejected=None, detail="deleted")
