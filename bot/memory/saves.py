"""Saves: the checks of who may save what, the duplicate rule, and room in a full list (merge, else forget, else
refuse), in one transaction under the list's lock. The rules are in docs/memory-rules.md ("Saving and forgetting").
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import date, datetime

import asyncpg

from bot.clock import Clock, utc_now
from bot.config import Settings
from bot.db import Connection
from bot.embeddings.service import Embeddings
from bot.errors import InvalidInput
from bot.memory import store
from bot.memory.decay import Decay
from bot.memory.merges import ListRoom, MergePlan, Vector
from bot.memory.model_rules import model_save_refusal
from bot.memory.models import MODEL_SOURCES, Memory, MemoryList, Merge, NewMemory, Rejection, SaveResult, Source
from bot.memory.visibility import clean_text, normalize_tags
from bot.servers.models import Privacy
from bot.servers.service import Servers

SaveCheck = Callable[[Connection], Awaitable[str | None]]
"""Run inside a save's (or an edit's) transaction, under the list's lock: a reason it returns refuses the change.

Day-end notes pass one that re-reads, on the same connection, what the note came from (its messages, its
speaker's privacy and block), so a withdrawal that commits while the model was writing wins."""

NUMBERS = re.compile(r"\d+")


def _rejected(reason: Rejection, detail: str) -> SaveResult:
    return SaveResult(saved=None, forgotten=[], rejected=reason, detail=detail)


class _Refused(Exception):
    """A save refused inside its transaction: raised so that whatever it changed there (a merge) is rolled back."""

    def __init__(self, result: SaveResult) -> None:
        super().__init__(result.detail)
        self.result = result


@dataclass(frozen=True)
class _Save:
    """What a save knows before its transaction: the request, its cleaned text and tags, the persona, the vector in
    the current space (None when the model failed), a merge planned for a full list, and whether the reply could
    search (a full list does not forget without it)."""

    request: NewMemory
    text: str
    tags: tuple[str, ...]
    persona: int
    vector: Vector | None
    space: int | None
    planned: tuple[MergePlan, Vector | None] | None
    search_available: bool


@dataclass
class _Stored:
    """What the transaction did: the memory saved (or the one the save repeats, counted as used), the memories
    forgotten and merges made for room, and the closest memories of the list (the model is shown them)."""

    saved: Memory
    forgotten: list[Memory] = field(default_factory=list)
    merges: list[tuple[Merge, Vector | None]] = field(default_factory=list)
    similar: list[Memory] = field(default_factory=list)
    repeated: bool = False


class MemorySaves:
    """One memory saved, or refused with a reason; a full list makes room by a merge before it forgets."""

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
        self.room = ListRoom(settings)

    async def _save_refusal(self, conn: Connection, request: NewMemory) -> SaveResult | None:
        """Who may save what, or None when the save may go ahead."""
        if request.via in MODEL_SOURCES and (refusal := await model_save_refusal(self.servers, conn, request)):
            return refusal
        guild = await self.servers.guild_settings(request.guild_id, conn) if request.guild_id is not None else None
        if request.list == MemoryList.SERVER:
            if guild is None:
                return _rejected(Rejection.NOT_ALLOWED, "server memories can only be saved in a server")
            if request.via in MODEL_SOURCES:
                if not guild.self_teaching:
                    return _rejected(Rejection.NOT_ALLOWED, "self-teaching is switched off in this server")
                if await self.servers.is_blocked(guild.guild_id, request.by, conn):
                    return _rejected(Rejection.NOT_ALLOWED, "this user is blocked in this server")
            elif not (request.by_can_manage or (request.via == Source.COMMAND and guild.member_teaching)):
                return _rejected(Rejection.NOT_ALLOWED, "only members with Manage Server can add server memories here")
            return None
        if request.owner_id is None:
            return _rejected(Rejection.NOT_ALLOWED, "a personal memory needs the user it is about")
        if request.via not in MODEL_SOURCES:
            if request.by != request.owner_id:
                return _rejected(Rejection.NOT_ALLOWED, "only its owner can save a personal memory")
            return None
        if await self.servers.privacy(request.owner_id, conn) != Privacy.NONE:
            return _rejected(Rejection.PRIVACY, "this user's privacy setting does not let the bot save memories about them")
        if guild is not None:
            if not guild.self_teaching:
                return _rejected(Rejection.NOT_ALLOWED, "self-teaching is switched off in this server")
            if not guild.personal_memories:
                return _rejected(Rejection.NOT_ALLOWED, "personal memories are switched off in this server")
            if await self.servers.is_blocked(guild.guild_id, request.owner_id, conn):
                return _rejected(Rejection.NOT_ALLOWED, "this user is blocked in this server")
        return None

    async def save(self, request: NewMemory, *, search_available: bool = True, check: SaveCheck | None = None) -> SaveResult:
        """Save one memory; in a full list forget one dormant unprotected memory, or refuse.

        `search_available` is False when the reply this save belongs to could not search; a full
        list then refuses rather than forget something that could not have come back. `check` runs inside
        the save's transaction, under the list's lock: a reason it returns refuses the save (`withdrawn`), so
        what the save came from (day-end notes: messages, their authors' privacy) still holds when it commits.
        """
        try:
            text = clean_text(request.text, self.settings.memory_max_chars)
            tags = normalize_tags(request.tags)
        except InvalidInput as exc:
            return _rejected(Rejection.INVALID_TEXT, str(exc))
        if request.list == MemoryList.SERVER and request.is_global:
            return _rejected(Rejection.NOT_ALLOWED, "only personal memories can be Global")
        async with self.pool.acquire() as conn:
            refusal = await self._save_refusal(conn, request)
        if refusal is not None:
            return refusal

        persona = await self.servers.persona_id(request.guild_id)
        vector, _ = await self.embeddings.embed_one(text)
        space = await self.embeddings.space_id()
        planned = await self._planned_merge(request, persona, space)
        try:
            stored = await self._store(_Save(request, text, tags, persona, vector, space, planned, search_available), check)
        except _Refused as refused:
            return refused.result
        if stored.repeated:
            return SaveResult(saved=stored.saved, forgotten=[], rejected=None,
                              detail=f"already remembered as #{stored.saved.id}", repeated=True)
        if (vector is None or any(merged is None for _, merged in stored.merges)) and space is not None:
            self.embeddings.want_vectors()
        return SaveResult(saved=stored.saved, forgotten=stored.forgotten, rejected=None, detail="saved",
                          similar=stored.similar, merged=[merge for merge, _ in stored.merges])

    async def _planned_merge(
        self, request: NewMemory, persona: int, space: int | None
    ) -> tuple[MergePlan, Vector | None] | None:
        """When the list looks full: the merge it would make, with the merged text embedded now, before the save's
        transaction, so no list stays locked while a model embeds."""
        if space is None:
            return None
        owner = request.guild_id if request.list == MemoryList.SERVER else request.owner_id
        assert owner is not None
        async with self.pool.acquire() as conn:
            if request.list == MemoryList.SERVER:
                full = await store.count_server_list(conn, owner, persona) >= self.settings.server_memory_limit
            else:
                sizes = await store.personal_list_sizes(conn, owner, [persona])
                full = sizes.get(persona, 0) >= self.settings.personal_memory_limit
            if not full:
                return None
            where = store.seen_in(request.conversation, request.guild_id, persona)
            plan = await self.room.plan(conn, request.list, owner, space, where)
        if plan is None:
            return None
        vector, _ = await self.embeddings.embed_one(plan.text)
        return plan, vector

    async def _store(self, save: _Save, check: SaveCheck | None) -> _Stored:
        """The save's transaction: under the list's lock, the duplicate rule, room (merge, else forget, else raise
        `_Refused`, which rolls everything back) and the insert."""
        request = save.request
        now, today = utc_now(self.clock)
        async with self.pool.acquire() as conn, conn.transaction():
            owner, lists_to_free = await self._lock_list(conn, request, save.persona)
            withdrawn = await check(conn) if check is not None else None
            if withdrawn is not None:
                raise _Refused(_rejected(Rejection.WITHDRAWN, withdrawn))
            closest = await store.closest_in_list(
                conn,
                memory_list=request.list,
                owner_id=request.owner_id,
                normalized=store.normalized_text(save.text),
                space=save.space,
                vector=save.vector,
                where=store.seen_in(request.conversation, request.guild_id, save.persona),
            )
            repeated = next((m for m, same, cos in closest if self._repeats(m, request, save.tags, same, cos)), None)
            if repeated is not None:
                used = await store.count_as_used(conn, repeated.id, now, today, self.settings.dormant_after_days)
                return _Stored(used, repeated=True)
            similar = [memory for memory, _, similarity in closest[:2] if similarity is not None]
            forgotten, merges = await self._make_room(conn, save, owner, lists_to_free, now, today)
            similar = [m for m in similar if all(m.id != merge.absorbed.id for merge, _ in merges)]
            saved = await self._insert(conn, save, now, today)
        return _Stored(saved, forgotten, merges, similar)

    async def _lock_list(self, conn: Connection, request: NewMemory, persona: int) -> tuple[int, list[int]]:
        """Lock the list the save goes into; its owner, and the personas whose list of it is full."""
        if request.list == MemoryList.SERVER:
            assert request.guild_id is not None
            await store.lock_list(conn, f"server:{request.guild_id}")
            full = await store.count_server_list(conn, request.guild_id, persona) >= self.settings.server_memory_limit
            return request.guild_id, [persona] if full else []
        assert request.owner_id is not None
        await store.lock_list(conn, f"personal:{request.owner_id}")
        # delete-my-data locks the person exclusively: it sees this save's memory, or this save sees none
        await self.servers.lock_people(conn, [request.owner_id], shared=True)
        personas = {persona}
        if request.is_global:  # a Global memory counts in every persona's personal list
            personas.update(await store.personas_with_personal_memories(conn, request.owner_id))
        sizes = await store.personal_list_sizes(conn, request.owner_id, personas)
        return request.owner_id, sorted(p for p, size in sizes.items() if size >= self.settings.personal_memory_limit)

    async def _make_room(
        self, conn: Connection, save: _Save, owner: int, lists_to_free: list[int], now: datetime, today: date
    ) -> tuple[list[Memory], list[tuple[Merge, Vector | None]]]:
        """Room in each full list: a merge where two memories belong together, else one memory forgotten."""
        request = save.request
        forgotten: list[Memory] = []
        merges: list[tuple[Merge, Vector | None]] = []
        for list_persona in lists_to_free:
            where = store.seen_in(request.conversation, request.guild_id, list_persona)
            merge = await self.room.merge(
                conn, request.list, owner, save.space, where, planned=save.planned if list_persona == save.persona else None,
                by=request.by, now=now, today=today,
            )
            if merge is not None:
                merges.append(merge)
                continue
            forgotten.append(await self._forgettable(conn, request, owner, where, forgotten, save.vector, save.search_available))
        if forgotten:
            await store.delete_memories(conn, [m.id for m in forgotten])
        return forgotten, merges

    async def _insert(self, conn: Connection, save: _Save, now: datetime, today: date) -> Memory:
        request = save.request
        saved = await store.insert_memory(
            conn,
            memory_list=request.list,
            guild_id=request.guild_id if request.list == MemoryList.SERVER else None,
            owner_id=request.owner_id if request.list == MemoryList.PERSONAL else None,
            persona_id=None if request.is_global else save.persona,
            text=save.text,
            tags=save.tags,
            channel_ids=request.channel_ids,
            source=request.via,
            protected=request.via == Source.COMMAND or request.is_global,
            created_by=request.by,
            now=now,
            today=today,
        )
        if save.vector is not None and save.space is not None:
            await store.store_vector(conn, saved.id, save.space, save.vector, save.text)
        if request.source_messages:
            await store.set_memory_sources(conn, saved.id, request.source_messages)
        return saved

    async def _forgettable(
        self, conn: Connection, request: NewMemory, owner: int, where: list[object], already: list[Memory],
        vector: Vector | None, search_available: bool,
    ) -> Memory:
        """The memory a full list forgets when nothing could be merged, or `_Refused` with the reason."""
        nothing_merges = "no two memories in it belong together closely enough to be joined into one"
        if not self.decay.active:
            raise _Refused(_rejected(Rejection.LIST_FULL, f"the list is full, {nothing_merges}, and memory decay is "
                                     "off, so nothing can be forgotten"))
        if vector is None or not search_available:
            raise _Refused(_rejected(Rejection.SEARCH_UNAVAILABLE, f"the list is full, {nothing_merges}, and the "
                                     "embedding model is unavailable right now"))
        candidate = await store.forgettable_memory(
            conn, request.list, owner, self.settings.dormant_after_days, [m.id for m in already], where
        )
        if candidate is None:
            seen = " this conversation can see" if request.conversation is not None else ""
            raise _Refused(_rejected(
                Rejection.LIST_FULL, f"the list is full, {nothing_merges}, and every memory in it{seen} is in use or protected"
            ))
        return candidate

    def _repeats(
        self, memory: Memory, request: NewMemory, tags: tuple[str, ...], same_text: bool, similarity: float | None
    ) -> bool:
        """A save repeats a memory of its list with the same reach (Global or not, channels, tags) when the text is
        the same after normalisation (no embedding needed), or the cosine reaches DUPLICATE_SIMILARITY (calibrated
        on the built-in model: docs/models.md, "Duplicates")."""
        same_reach = (
            memory.is_global == request.is_global
            and tuple(memory.channel_ids) == tuple(request.channel_ids)
            and tuple(memory.tags) == tuple(tags)
        )
        if not same_reach:
            return False
        # a changed number is a changed fact ("note 1" and "note 2", 2019 and 2021), however close the wording
        close = similarity is not None and similarity >= self.settings.duplicate_similarity
        return same_text or (close and NUMBERS.findall(memory.text) == NUMBERS.findall(request.text))

