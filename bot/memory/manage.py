"""What the memory commands do, in plain values: no Discord types here.

The cogs, the console and tests call `MemoryManager`; it reads lists page by page, searches them
without touching any decay counter (a command is not a reply), and wraps `MemoryCore` for every
change so the permission and forgetting rules stay in one place. Import and export use the JSON
format documented in docs/export-format.md, versioned so old files keep importing.

Every refusal is a `Refusal` whose message is one sentence a person can act on.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from typing import Any

from bot.config import Settings
from bot.embeddings.providers import EmbeddingError
from bot.errors import InvalidInput, NotAllowed, NotFound
from bot.memory import command_rights as rights
from bot.memory import store
from bot.memory.history import MemoryHistory
from bot.memory.lists import (
    ImportMode,
    ImportPlan,
    ImportResult,
    ListRef,
    ListStats,
    MemoryView,
    Page,
    Scope,
    SearchResult,
    VectorStatus,
)
from bot.memory.models import Memory, MemoryList, NewMemory, SaveResult, Source, done_or_refused
from bot.memory.service import MemoryCore
from bot.memory.transfer import EXPORT_FORMAT, EXPORT_VERSION, parse_import
from bot.memory.visibility import normalize_tags
from bot.servers.models import Actor
from bot.tokens import count_tokens

log = logging.getLogger(__name__)

USER_DATA_FORMAT = "deskmate-user-data"
USER_DATA_VERSION = 1
DEFAULT_IMPORT_MAX_BYTES = 1_048_576


def _iso(value: datetime | None) -> str | None:
    return value.astimezone(UTC).isoformat() if value is not None else None




class MemoryManager:
    """The operations behind `/memories`, `/personal memories` and `/privacy`."""

    def __init__(self, core: MemoryCore, *, import_max_bytes: int = DEFAULT_IMPORT_MAX_BYTES) -> None:
        self.core = core
        self.import_max_bytes = import_max_bytes
        self.versions = MemoryHistory(core)  # each memory's earlier texts: history, restore, exports

    @property
    def settings(self) -> Settings:
        return self.core.settings

    # --- which list -------------------------------------------------------------------------

    async def server_list(self, guild_id: int) -> ListRef:
        return ListRef(MemoryList.SERVER, await self.core.servers.persona_id(guild_id), guild_id=guild_id)

    async def personal_list(self, owner_id: int, guild_id: int | None, scope: Scope = Scope.ALL) -> ListRef:
        """The owner's personal list as seen where the command runs (a DM sees the default persona)."""
        persona = await self.core.servers.persona_id(guild_id)
        return ListRef(MemoryList.PERSONAL, persona, guild_id=guild_id, owner_id=owner_id, scope=scope)

    def limit_of(self, ref: ListRef) -> int:
        return self.settings.server_memory_limit if ref.list == MemoryList.SERVER else self.settings.personal_memory_limit

    def _view(self, memory: Memory, has_vector: bool, space: int | None, similarity: float | None = None) -> MemoryView:
        status = VectorStatus.EMBEDDED if has_vector else VectorStatus.WAITING
        if space is None:
            status = VectorStatus.UNAVAILABLE
        return MemoryView(memory, self.core.is_dormant(memory), status, similarity)

    # --- reading ------------------------------------------------------------------------------

    async def page(self, ref: ListRef, number: int, size: int = 10) -> Page:
        """Page `number` (0-based, clamped to the last page) of a list, oldest memory first."""
        space = await self.core.embeddings.space_id()
        where, args = ref.filter()
        async with self.core.pool.acquire() as conn:
            total = await store.count_list(conn, where, args)
            pages = max(1, -(-total // size))
            number = min(max(number, 0), pages - 1)
            rows = await store.page_of_list(conn, where, args, space=space, offset=number * size, limit=size)
        return Page([self._view(m, has, space) for m, has in rows], number, size, total)

    async def memories_by_id(self, memory_ids: Collection[int]) -> dict[int, Memory]:
        """Memories by id, whatever list they are in (receipts name them; the caller decides what to show)."""
        async with self.core.pool.acquire() as conn:
            return {memory.id: memory for memory in await store.memories_by_id(conn, memory_ids)}

    async def get(self, ref: ListRef, memory_id: int) -> Memory:
        async with self.core.pool.acquire() as conn:
            memory = await store.get_memory(conn, memory_id)
        if memory is None or not ref.contains(memory):
            raise NotFound(f"there is no memory #{memory_id} in {ref.label}")
        return memory

    async def search(self, ref: ListRef, query: str, limit: int = 10) -> SearchResult:
        """Closest memories by meaning (one embedding, cosine in SQL), plus plain text matches.

        Text matches also find memories still waiting for a vector. When the embedder is down
        the search is text-only and says so. Searching never changes a decay counter.
        """
        query = query.strip()
        if not query:
            raise InvalidInput("type something to search for")
        space = await self.core.embeddings.space_id()
        where, args = ref.filter()
        note: str | None = None
        vector = None
        if space is None:
            note = "no embedding model is configured, so this is a plain text search"
        else:
            try:
                vector = (await self.core.embeddings.embedder.embed([query]))[0]
            except EmbeddingError as exc:
                log.warning("Search embedding failed: %s", exc)
                note = "the embedding model is unavailable right now, so this is a plain text search"
        items: list[MemoryView] = []
        async with self.core.pool.acquire() as conn:
            if vector is not None and space is not None:
                close = await store.semantic_search_list(conn, where, args, space=space, vector=vector, limit=limit)
                items.extend(self._view(memory, True, space, similarity) for memory, similarity in close)
            seen = {view.memory.id for view in items}
            for memory, has in await store.text_search_list(conn, where, args, text=query, limit=limit, space=space):
                if memory.id not in seen:
                    items.append(self._view(memory, has, space))
        return SearchResult(items[: limit * 2], semantic=vector is not None, note=note)

    async def suggest(self, ref: ListRef, current: str, *, created_by: int | None = None, limit: int = 25) -> list[Memory]:
        """Autocomplete: memories whose text contains what was typed (or whose #id it is), newest first.

        Text only, no embedding: autocomplete fires on every keystroke.
        """
        where, args = ref.filter()
        async with self.core.pool.acquire() as conn:
            rows = await store.text_search_list(conn, where, args, text=current, limit=limit, created_by=created_by)
        return [memory for memory, _ in rows]

    async def stats(self, ref: ListRef, *, embedding_problem: str | None = None) -> ListStats:
        """Counts for the memory viewer. `embedding_problem` is the background embedder's last failure, if any:
        memories without a vector then count as "embedding unavailable" rather than "waiting for vector"."""
        ref = ref.widened() if ref.list == MemoryList.PERSONAL else ref
        space = await self.core.embeddings.space_id()
        where, args = ref.filter()
        async with self.core.pool.acquire() as conn:
            rows = await store.list_state_rows(conn, where, args, space=space)
        dormant_after = self.settings.dormant_after_days
        decay = self.core.decay_active
        desk = [row for row in rows if not (decay and row["days_unused"] >= dormant_after)]
        space_text = str(self.core.embeddings.space) if self.core.embeddings.space else "none (EMBEDDING_PROVIDER=none)"
        without = sum(1 for row in rows if not row["has_vector"])
        unavailable_reason = "no embedding provider is configured" if space is None else embedding_problem
        return ListStats(
            total=len(rows),
            desk=len(desk),
            drawer=len(rows) - len(desk),
            waiting=0 if unavailable_reason else without,
            unavailable=without if unavailable_reason else 0,
            unavailable_reason=unavailable_reason if without else None,
            days=tuple(row["days_unused"] for row in rows),
            dormant_after=dormant_after,
            protected=sum(1 for row in rows if row["protected"]),
            limit=self.limit_of(ref),
            desk_tokens=sum(count_tokens(row["text"]) for row in desk),
            total_tokens=sum(count_tokens(row["text"]) for row in rows),
            embedding=space_text,
            decay=decay,
        )

    # --- who may change what (asked before a form opens; each change checks again) -----------------

    async def may_add(self, ref: ListRef, actor: Actor) -> None:
        await rights.may_add(self.core.servers, ref, actor)

    @staticmethod
    def check_whole_list(ref: ListRef, actor: Actor, what: str) -> None:
        """Before a file is read or an answer deferred: may `actor` `what` ("export", "import into") this list (asked
        again when it is done)."""
        rights.may_move_whole_list(ref, actor, what)

    async def changeable(self, ref: ListRef, memory_id: int, actor: Actor, what: str = "change") -> Memory:
        """The memory, if `actor` may change or delete it (`what` says which, for the refusal)."""
        memory = await self.get(ref, memory_id)
        await rights.may_change(self.core.servers, ref, memory, actor, what)
        return memory

    # --- changing one memory ------------------------------------------------------------------

    async def add(
        self,
        ref: ListRef,
        text: str,
        *,
        actor: Actor,
        tags: Sequence[str] = (),
        channel_ids: Sequence[int] = (),
        is_global: bool = False,
    ) -> SaveResult:
        """Save through the core (source `command`, so protected); a full list forgets like any save."""
        await self.may_add(ref, actor)
        result = await self.core.save(
            NewMemory(
                list=ref.list,
                text=text,
                by=actor.user_id,
                via=Source.COMMAND,
                guild_id=ref.guild_id,
                owner_id=ref.owner_id,
                is_global=is_global and ref.list == MemoryList.PERSONAL,
                tags=tuple(tags),
                channel_ids=tuple(channel_ids),
                by_can_manage=actor.can_manage,
            )
        )
        return done_or_refused(result, "not saved")

    async def edit(
        self, ref: ListRef, memory_id: int, text: str, *, actor: Actor, tags: Sequence[str] | None = None
    ) -> SaveResult:
        """Edit text (and optionally tags). A command edit protects the memory and restarts its counter."""
        await self.changeable(ref, memory_id, actor, "edit")
        wanted_tags = None if tags is None else normalize_tags(tags)
        result = await self.core.edit(
            memory_id, text, by=actor.user_id, via=Source.COMMAND, by_can_manage=actor.can_manage, tags=wanted_tags
        )
        return done_or_refused(result, "not changed")

    async def delete(self, ref: ListRef, memory_id: int, *, actor: Actor) -> SaveResult:
        await self.changeable(ref, memory_id, actor, "delete")
        result = await self.core.delete(memory_id, by=actor.user_id, via=Source.COMMAND, by_can_manage=actor.can_manage)
        return done_or_refused(result, "not deleted")

    async def move(self, ref: ListRef, memory_id: int, *, to_global: bool, actor: Actor) -> Memory:
        """Make one of the owner's personal memories Global, or tie it to this persona.

        A Global memory counts in every persona's personal list, so a move that would overfill
        one of them is refused (nothing is forgotten for a move).
        """
        if ref.list != MemoryList.PERSONAL or actor.user_id != ref.owner_id:
            raise NotAllowed("only its owner can move a personal memory")
        memory = await self.get(ref.widened(), memory_id)
        if memory.is_global == to_global:
            where = "Global" if to_global else "tied to this persona"
            raise InvalidInput(f"memory #{memory_id} is already {where}")
        return await self.core.move_scope(ref, memory_id, to_global=to_global)

    # --- export and import --------------------------------------------------------------------

    def _export_entry(self, memory: Memory, versions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "text": memory.text,
            "tags": list(memory.tags),
            "channel_ids": [str(channel) for channel in memory.channel_ids],
        }
        if memory.list == MemoryList.PERSONAL:
            entry["scope"] = "global" if memory.is_global else "persona"
        entry.update(
            {
                "source": memory.source.value,
                "protected": memory.protected,
                "state": "drawer" if self.core.is_dormant(memory) else "desk",
                "days_unused": memory.days_unused,
                "last_used_at": _iso(memory.last_used_at),
                "created_at": _iso(memory.created_at),
            }
        )
        if versions:
            entry["versions"] = versions
        return entry

    async def export(self, ref: ListRef, actor: Actor) -> dict[str, Any]:
        """The list as a versioned JSON document (docs/export-format.md): a server's needs Manage Server, a personal
        one its owner."""
        rights.may_move_whole_list(ref, actor, "export")
        where, args = ref.filter()
        async with self.core.pool.acquire() as conn:
            memories = await store.list_memories(conn, where, args)
        versions = await self.versions.for_export([m.id for m in memories])
        doc: dict[str, Any] = {
            "format": EXPORT_FORMAT,
            "version": EXPORT_VERSION,
            "list": ref.list.value,
            "exported_at": _iso(self.core.clock.now()),
        }
        if ref.list == MemoryList.SERVER:
            doc["server_id"] = str(ref.guild_id)
        else:
            doc["scope"] = ref.scope.value
        doc["memories"] = [self._export_entry(memory, versions.get(memory.id)) for memory in memories]
        return doc

    def parse_import(self, ref: ListRef, raw: bytes, *, known_channel_ids: Collection[int] | None = None) -> ImportPlan:
        """Validate a whole file before anything is written (`bot.memory.transfer`); the first problem is a Refusal."""
        return parse_import(
            ref,
            raw,
            max_chars=self.settings.memory_max_chars,
            limit=self.limit_of(ref),
            max_bytes=self.import_max_bytes,
            known_channel_ids=known_channel_ids,
        )

    async def import_memories(self, ref: ListRef, plan: ImportPlan, *, mode: ImportMode, actor: Actor) -> ImportResult:
        """Merge or replace in ONE transaction: either every memory of the file is in, or nothing changed.

        Merge skips texts the list already has. Replace first deletes the list (for personal lists:
        the Global memories and those tied to this persona). Imported memories start fresh: source
        `import`, counter 0, unprotected unless Global. A result over the list limit is refused, never trimmed.
        """
        if plan.list != ref.list:
            raise InvalidInput("the file was checked for another list; upload it again")
        rights.may_move_whole_list(ref, actor, "import into")
        ids, removed, skipped, embedded = await self.core.import_entries(
            ref,
            plan.entries,
            replace=mode == ImportMode.REPLACE,
            by=actor.user_id,
            limit=self.limit_of(ref),
        )
        return ImportResult(mode, len(ids), removed, plan.duplicates_in_file + skipped, embedded, plan.dropped_channel_limits)

    # --- privacy: one user's data everywhere ---------------------------------------------------

    def export_user_memories(self, rows: dict[str, Any]) -> dict[str, Any]:
        """A user's memories in the export-my-data format, from `MemoryCore.export_user`'s rows."""
        memories = []
        for row in rows["personal"]:
            entry = self._export_entry(Memory.from_row(row), rows["versions"].get(row["id"]))
            if row["persona_id"] is not None:
                guild = row["persona_guild_id"]
                entry["persona"] = {"server_id": str(guild) if guild is not None else None, "name": row["persona_name"]}
            memories.append(entry)
        return {
            "personal_memories": memories,
            "server_memories_added": [
                {"server_id": str(m.guild_id), "text": m.text, "created_at": _iso(m.created_at)} for m in rows["authored"]
            ],
        }
