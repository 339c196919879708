"""Every change to memories: saves (forgetting to make room), edits, deletes, tags, scope moves, imports,
delete-my-data, and vectors for a new embedding space.

Each change is one transaction. The rules are in docs/memory-rules.md ("Saving and forgetting", "Protection").
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Sequence

import asyncpg

from bot.clock import Clock, utc_now
from bot.config import Settings
from bot.db import Connection
from bot.embeddings.service import Embeddings
from bot.errors import InvalidInput
from bot.memory import store, versions_store
from bot.memory.decay import Decay
from bot.memory.model_rules import model_save_refusal, model_text_refusal
from bot.memory.models import MODEL_SOURCES, Memory, MemoryList, NewMemory, Rejection, SaveResult, Source, VersionVia
from bot.memory.visibility import clean_text, normalize_tags
from bot.servers.models import Privacy
from bot.servers.service import Servers

log = logging.getLogger(__name__)

SaveCheck = Callable[[Connection], Awaitable[str | None]]
"""Run inside a save's (or an edit's) transaction, under the list's lock: a reason it returns refuses the change.

Day-end notes pass one that re-reads, on the same connection, what the note came from (its messages, its
speaker's privacy and block), so a withdrawal that commits while the model was writing wins."""

NUMBERS = re.compile(r"\d+")
VERSION_VIA = {Source.BOT: VersionVia.BOT, Source.COMMAND: VersionVia.COMMAND, Source.NOTES: VersionVia.NOTES}
DEFAULT_REASON = {
    Source.BOT: "updated by the model in a reply",
    Source.COMMAND: "edited with a command",
    Source.NOTES: "corrected by the day-end notes",
}


def _rejected(reason: Rejection, detail: str) -> SaveResult:
    return SaveResult(saved=None, forgotten=[], rejected=reason, detail=detail)


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
        now, today = utc_now(self.clock)
        dormant_after = self.settings.dormant_after_days
        async with self.pool.acquire() as conn, conn.transaction():
            if request.list == MemoryList.SERVER:
                assert request.guild_id is not None
                await store.lock_list(conn, f"server:{request.guild_id}")
                full = await store.count_server_list(conn, request.guild_id, persona) >= self.settings.server_memory_limit
                lists_to_free = [persona] if full else []
            else:
                assert request.owner_id is not None
                await store.lock_list(conn, f"personal:{request.owner_id}")
                personas = {persona}
                if request.is_global:  # a Global memory counts in every persona's personal list
                    personas.update(await store.personas_with_personal_memories(conn, request.owner_id))
                sizes = await store.personal_list_sizes(conn, request.owner_id, personas)
                lists_to_free = sorted(p for p, size in sizes.items() if size >= self.settings.personal_memory_limit)
            withdrawn = await check(conn) if check is not None else None
            if withdrawn is not None:
                return _rejected(Rejection.WITHDRAWN, withdrawn)

            closest = await store.closest_in_list(
                conn,
                memory_list=request.list,
                owner_id=request.owner_id,
                normalized=store.normalized_text(text),
                space=space,
                vector=vector,
                where=store.seen_in(request.conversation, request.guild_id, persona),
            )
            repeated = next((m for m, same, cos in closest if self._repeats(m, request, tags, same, cos)), None)
            if repeated is not None:
                used = await store.count_as_used(conn, repeated.id, now, today, dormant_after)
                detail = f"already remembered as #{used.id}"
                return SaveResult(saved=used, forgotten=[], rejected=None, detail=detail, repeated=True)
            similar = [memory for memory, _, similarity in closest[:2] if similarity is not None]

            forgotten: list[Memory] = []
            if lists_to_free:
                if not self.decay.active:
                    return _rejected(Rejection.LIST_FULL, "the list is full and memory decay is off, so nothing can be forgotten")
                if vector is None or not search_available:
                    return _rejected(
                        Rejection.SEARCH_UNAVAILABLE, "the list is full and the embedding model is unavailable right now"
                    )
                for list_persona in lists_to_free:
                    owner = request.guild_id if request.list == MemoryList.SERVER else request.owner_id
                    assert owner is not None
                    candidate = await store.forgettable_memory(
                        conn, request.list, owner, dormant_after, [m.id for m in forgotten],
                        store.seen_in(request.conversation, request.guild_id, list_persona),
                    )
                    if candidate is None:
                        seen = " this conversation can see" if request.conversation is not None else ""
                        return _rejected(
                            Rejection.LIST_FULL, f"the list is full and every memory in it{seen} is in use or protected"
                        )
                    forgotten.append(candidate)
                await store.delete_memories(conn, [m.id for m in forgotten])

            saved = await store.insert_memory(
                conn,
                memory_list=request.list,
                guild_id=request.guild_id if request.list == MemoryList.SERVER else None,
                owner_id=request.owner_id if request.list == MemoryList.PERSONAL else None,
                persona_id=None if request.is_global else persona,
                text=text,
                tags=tags,
                channel_ids=request.channel_ids,
                source=request.via,
                protected=request.via == Source.COMMAND or request.is_global,
                created_by=request.by,
                now=now,
                today=today,
            )
            if vector is not None and space is not None:
                await store.store_vector(conn, saved.id, space, vector, text)
            if request.source_messages:
                await store.set_memory_sources(conn, saved.id, request.source_messages)
        if vector is None and space is not None:
            self.embeddings.want_vectors()
        return SaveResult(saved=saved, forgotten=forgotten, rejected=None, detail="saved", similar=similar)

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
