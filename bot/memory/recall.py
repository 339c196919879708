"""The decay rules of SPEC §2-§4 and §7: the per-reply search, saving with forgetting, edits, deletes.

This is the one module that decides what happens to memories. Adapters (Discord cogs, the
console, `simulate`) call `MemoryCore` with plain values; SQL lives in `store`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any, Protocol

import asyncpg

from bot.config import Settings
from bot.db import SERVER_STARTS
from bot.memory import store
from bot.memory.desk_cache import DeskCache, prompt_order
from bot.memory.embeddings import Embedder, EmbeddingError
from bot.memory.lexical import lexical_query
from bot.memory.models import (
    Conversation,
    Memory,
    MemoryList,
    Privacy,
    Recall,
    Rejection,
    SaveResult,
    ScoredMemory,
    Source,
)
from bot.memory.visibility import clean_text, context_words, normalize_tags

log = logging.getLogger(__name__)

NEVER = 2**31 - 1  # "days_unused below this" = every memory, for the desk when nothing decays


def split_at_threshold(
    rows: Sequence[Mapping[str, Any]], threshold: float, limit: int
) -> tuple[list[Mapping[str, Any]], float | None]:
    """Search rows (best first) scoring at least `threshold`, at most `limit` of them, and the best score under it.

    Chat history and documents search the same way; the best score under the threshold is what a
    receipt shows when nothing was relevant enough.
    """
    kept = [row for row in rows if float(row["similarity"]) >= threshold][:limit]
    below = [float(row["similarity"]) for row in rows if float(row["similarity"]) < threshold]
    return kept, max(below) if below else None


class Clock(Protocol):
    def now(self) -> datetime: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


@dataclass
class ManualClock:
    """A clock the simulator and tests move by hand."""

    current: datetime = field(default_factory=lambda: datetime(2026, 1, 1, 12, tzinfo=UTC))

    def now(self) -> datetime:
        return self.current

    def set_date(self, day: date) -> None:
        self.current = datetime(day.year, day.month, day.day, 12, tzinfo=UTC)


@dataclass(frozen=True)
class NewMemory:
    """A save request. `guild_id` is where it happens (None = a DM); personal memories need `owner_id`.

    `by_can_manage` is the adapter's answer to "does the actor have Manage Server here".
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


def _rejected(reason: Rejection, detail: str) -> SaveResult:
    return SaveResult(saved=None, forgotten=[], rejected=reason, detail=detail)


def desk_order(memories: list[Memory]) -> list[Memory]:
    """SPEC §5 order: server memories by id, then personal memories grouped by user, each by id."""
    return sorted(memories, key=prompt_order)


class MemoryCore:
    def __init__(self, pool: asyncpg.Pool, embedder: Embedder, settings: Settings, clock: Clock | None = None) -> None:
        self.pool = pool
        self.embedder = embedder
        self.settings = settings
        self.clock: Clock = clock or SystemClock()
        self._personas: dict[int | None, int] = {}
        self._space_id: int | None = None
        self.vectors_wanted = asyncio.Event()  # set when a memory was stored without a vector
        self._server_starts = SERVER_STARTS.changes
        # desk memories already built, so each reply's search returns only what changed (exact:
        # checked against row versions by the statement; see bot/memory/desk_cache.py)
        self.desk_cache = DeskCache()

    # --- small helpers ---------------------------------------------------------------------

    @property
    def decay_active(self) -> bool:
        """Decay needs the switch on and an embedding model (SPEC §7); otherwise all stays active."""
        return self.settings.memory_decay_enabled and self.embedder.space is not None

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
        persona = self._personas.get(guild_id)
        if persona is None:
            async with self.pool.acquire() as conn:
                persona = await store.persona_for_guild(conn, guild_id)
            self._personas[guild_id] = persona
        return persona

    async def _embed_one(self, text: str) -> tuple[object | None, str | None]:
        if self.embedder.space is None:
            return None, "no embedding provider is configured"
        try:
            return (await self.embedder.embed([text]))[0], None
        except EmbeddingError as exc:
            log.warning("Embedding failed: %s", exc)
            return None, str(exc)

    # --- SPEC §2: the search on every reply ----------------------------------------------------

    def was_on_desk_this_morning(self, memory: Memory, today: date) -> bool:
        """DESK_REFRESH=daily: whether the memory was active when today's first reply began.

        Derived from the counters: a memory saved, edited or recalled today (`desk_changed_on`)
        joined the desk today; one aged today was one day younger this morning; any other memory
        is as it was this morning (a reset of an active memory leaves it active).
        """
        if memory.desk_changed_on == today or memory.created_at.astimezone(UTC).date() >= today:
            return False
        used_today = memory.last_used_at is not None and memory.last_used_at.astimezone(UTC).date() == today
        aged_today = memory.last_aged_on == today and not used_today
        return memory.days_unused - (1 if aged_today else 0) < self.settings.dormant_after_days

    async def reply_search(self, conversation: Conversation) -> Recall:
        """One embedding of the latest message, then one statement that reads, scores and ages."""
        persona = await self.persona_id(conversation.guild_id)
        space = await self.space_id()
        vector, failure = await self._embed_one(conversation.text)
        now, today = self._now()
        decays = self.decay_active
        daily = decays and self.settings.desk_refresh == "daily"
        dormant_after = self.settings.dormant_after_days
        parts = DeskCache.parts(conversation.guild_id, persona, conversation.participants)
        held = self.desk_cache.held(parts, today)
        async with self.pool.acquire() as conn:
            if SERVER_STARTS.changes != self._server_starts:  # the server restarted: held versions prove nothing
                self._server_starts = SERVER_STARTS.changes
                self.desk_cache.clear()
                held = {}
            rows = await store.reply_search(
                conn,
                guild_id=conversation.guild_id,
                persona_id=persona,
                channel_id=conversation.channel_id,
                participants=conversation.participants,
                context_words=context_words((*conversation.context_texts, conversation.text)),
                query_vector=vector if decays else None,
                space=space,
                min_similarity=self.settings.min_similarity,
                max_used=self.settings.max_used,
                now=now,
                today=today,
                # daily: a memory that went dormant today stays on today's desk
                desk_below_days=(dormant_after + 1 if daily else dormant_after) if decays else NEVER,
                max_recalled=self.settings.max_recalled,
                dormant_after=dormant_after,
                lexical=lexical_query(conversation.text) if decays and self.settings.lexical_weight > 0 else None,
                lexical_weight=self.settings.lexical_weight,
                known_ids=list(held),
                known_stamps=[entry[0] for entry in held.values()],
            )
        # the snapshot comes in prompt order (desk_order), so the desk needs no sorting
        snapshot, similarities = self.desk_cache.resolve(parts, held, rows, today)
        desk: list[Memory] = []
        used: list[ScoredMemory] = []
        recalled: list[ScoredMemory] = []
        held_back: list[ScoredMemory] = []
        if not daily:
            # the desk is the snapshot's active memories, in its order; the few matches are looked
            # at on their own (a comprehension instead of a Python loop step per desk memory)
            desk = [m for m in snapshot if m.days_unused < dormant_after] if decays else snapshot
            for used_similarity, match, memory in similarities.values():
                scored = ScoredMemory(memory, float(match) if match is not None else 0.0)
                if match is not None and decays and memory.days_unused >= dormant_after:
                    recalled.append(scored)
                if used_similarity is not None:
                    used.append(scored)
        for memory in snapshot if daily else ():
            dormant = decays and memory.days_unused >= dormant_after  # self.is_dormant, inlined: ~60 per reply
            on_desk = self.was_on_desk_this_morning(memory, today)
            found = similarities.get(memory.id)
            if found is None:  # most of the snapshot: neither used nor a match
                if on_desk:
                    desk.append(memory)
                elif not dormant:
                    held_back.append(ScoredMemory(memory, 0.0))
                continue
            used_similarity, match, _ = found
            scored = ScoredMemory(memory, float(match) if match is not None else 0.0)
            if on_desk:
                desk.append(memory)
            elif match is not None and dormant:
                recalled.append(scored)
            elif not dormant:
                held_back.append(scored)
            if used_similarity is not None:
                used.append(scored)
        best_first = lambda items: sorted(items, key=lambda s: (-s.similarity, s.memory.id))  # noqa: E731
        return Recall(
            search_ok=vector is not None,
            failure=failure,
            persona_id=persona,
            desk=desk,
            used=best_first(used),
            recalled=best_first(recalled),
            query_vector=vector,  # type: ignore[arg-type]
            held_back=best_first(held_back),
        )

    # --- SPEC §3: saving and forgetting --------------------------------------------------------

    async def _save_refusal(self, conn: store.Connection, request: NewMemory) -> SaveResult | None:
        """Who may save what (SPEC §3, §4, §6), or None when the save may go ahead."""
        guild = await store.get_guild_settings(conn, request.guild_id) if request.guild_id is not None else None
        if request.list == MemoryList.SERVER:
            if guild is None:
                return _rejected(Rejection.NOT_ALLOWED, "server memories can only be saved in a server")
            if request.via == Source.BOT:
                if not guild.self_teaching:
                    return _rejected(Rejection.NOT_ALLOWED, "self-teaching is switched off in this server")
                if await store.is_blocked(conn, guild.guild_id, request.by):
                    return _rejected(Rejection.NOT_ALLOWED, "this user is blocked in this server")
            elif not (request.by_can_manage or (request.via == Source.COMMAND and guild.member_teaching)):
                return _rejected(Rejection.NOT_ALLOWED, "only members with Manage Server can add server memories here")
            return None
        if request.owner_id is None:
            return _rejected(Rejection.NOT_ALLOWED, "a personal memory needs the user it is about")
        if request.via != Source.BOT:
            if request.by != request.owner_id:
                return _rejected(Rejection.NOT_ALLOWED, "only its owner can save a personal memory")
            return None
        if await store.get_privacy(conn, request.owner_id) != Privacy.NONE:
            return _rejected(Rejection.PRIVACY, "this user's privacy setting does not let the bot save memories about them")
        if guild is not None:
            if not guild.self_teaching:
                return _rejected(Rejection.NOT_ALLOWED, "self-teaching is switched off in this server")
            if not guild.personal_memories:
                return _rejected(Rejection.NOT_ALLOWED, "personal memories are switched off in this server")
            if await store.is_blocked(conn, guild.guild_id, request.owner_id):
                return _rejected(Rejection.NOT_ALLOWED, "this user is blocked in this server")
        return None

    async def save(self, request: NewMemory, *, search_available: bool = True) -> SaveResult:
        """Save one memory; in a full list forget one dormant unprotected memory, or refuse.

        `search_available` is False when the reply this save belongs to could not search; a full
        list then refuses rather than forget something that could not have come back.
        """
        try:
            text = clean_text(request.text, self.settings.memory_max_chars)
            tags = normalize_tags(request.tags)
        except ValueError as exc:
            return _rejected(Rejection.INVALID_TEXT, str(exc))
        if request.list == MemoryList.SERVER and request.is_global:
            return _rejected(Rejection.NOT_ALLOWED, "only personal memories can be Global")
        async with self.pool.acquire() as conn:
            refusal = await self._save_refusal(conn, request)
        if refusal is not None:
            return refusal

        persona = await self.persona_id(request.guild_id)
        vector, _ = await self._embed_one(text)
        space = await self.space_id()
        now, today = self._now()
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

            forgotten: list[Memory] = []
            if lists_to_free:
                if not self.decay_active:
                    return _rejected(Rejection.LIST_FULL, "the list is full and memory decay is off, so nothing can be forgotten")
                if vector is None or not search_available:
                    return _rejected(
                        Rejection.SEARCH_UNAVAILABLE, "the list is full and the embedding model is unavailable right now"
                    )
                for list_persona in lists_to_free:
                    exclude = [m.id for m in forgotten]
                    if request.list == MemoryList.SERVER:
                        assert request.guild_id is not None
                        candidate = await store.forgettable_server_memory(
                            conn, request.guild_id, list_persona, dormant_after, exclude
                        )
                    else:
                        assert request.owner_id is not None
                        candidate = await store.forgettable_personal_memory(
                            conn, request.owner_id, list_persona, dormant_after, exclude
                        )
                    if candidate is None:
                        return _rejected(
                            Rejection.LIST_FULL, "the list is full and every memory in it is in use or protected"
                        )
                    forgotten.append(candidate)
                await store.delete_memories(conn, [m.id for m in forgotten])
                self.desk_cache.discard(m.id for m in forgotten)

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
                await store.store_vector(conn, saved.id, space, vector, text)  # type: ignore[arg-type]
        if vector is None and space is not None:
            self.vectors_wanted.set()
        return SaveResult(saved=saved, forgotten=forgotten, rejected=None, detail="saved")

    # --- edits and deletes ---------------------------------------------------------------------

    async def _change_refusal(
        self, conn: store.Connection, memory: Memory, by: int, via: Source, by_can_manage: bool, *, deleting: bool
    ) -> SaveResult | None:
        if memory.list == MemoryList.PERSONAL:
            assert memory.owner_id is not None
            if via == Source.BOT:
                if not deleting and await store.get_privacy(conn, memory.owner_id) != Privacy.NONE:
                    return _rejected(
                        Rejection.PRIVACY, "this user's privacy setting does not let the bot change memories about them"
                    )
                return None
            if by != memory.owner_id:
                return _rejected(Rejection.NOT_ALLOWED, "only its owner can change a personal memory")
            return None
        assert memory.guild_id is not None
        guild = await store.get_guild_settings(conn, memory.guild_id)
        if via == Source.BOT:
            if not guild.self_teaching:
                return _rejected(Rejection.NOT_ALLOWED, "self-teaching is switched off in this server")
            return None
        if by_can_manage or (guild.member_teaching and memory.created_by == by):
            return None
        return _rejected(Rejection.NOT_ALLOWED, "only members with Manage Server can change this server memory")

    async def edit(
        self, memory_id: int, text: str, *, by: int, via: Source = Source.COMMAND, by_can_manage: bool = False
    ) -> SaveResult:
        """Change a memory's text. A command edit protects it; the counter restarts at 0 either way."""
        try:
            cleaned = clean_text(text, self.settings.memory_max_chars)
        except ValueError as exc:
            return _rejected(Rejection.INVALID_TEXT, str(exc))
        async with self.pool.acquire() as conn:
            memory = await store.get_memory(conn, memory_id)
            if memory is None:
                return _rejected(Rejection.NOT_ALLOWED, f"there is no memory #{memory_id}")
            refusal = await self._change_refusal(conn, memory, by, via, by_can_manage, deleting=False)
        if refusal is not None:
            return refusal
        vector, _ = await self._embed_one(cleaned)
        space = await self.space_id()
        now, today = self._now()
        async with self.pool.acquire() as conn, conn.transaction():
            current = await store.get_memory(conn, memory_id, for_update=True)
            if current is None:
                return _rejected(Rejection.NOT_ALLOWED, f"memory #{memory_id} was deleted meanwhile")
            by_command = via == Source.COMMAND
            updated = await store.update_memory_text(
                conn,
                memory_id,
                text=cleaned,
                source=Source.COMMAND if by_command else current.source,
                protected=current.protected or by_command,
                now=now,
                today=today,
            )
            if vector is not None and space is not None:
                await store.store_vector(conn, memory_id, space, vector, cleaned)  # type: ignore[arg-type]
        if vector is None and space is not None:
            self.vectors_wanted.set()
        return SaveResult(saved=updated, forgotten=[], rejected=None, detail="edited")

    async def delete(
        self, memory_id: int, *, by: int, via: Source = Source.COMMAND, by_can_manage: bool = False
    ) -> SaveResult:
        """Delete a memory (deleting is allowed to the model even under `partial` privacy)."""
        async with self.pool.acquire() as conn, conn.transaction():
            memory = await store.get_memory(conn, memory_id, for_update=True)
            if memory is None:
                return _rejected(Rejection.NOT_ALLOWED, f"there is no memory #{memory_id}")
            refusal = await self._change_refusal(conn, memory, by, via, by_can_manage, deleting=True)
            if refusal is not None:
                return refusal
            await store.delete_memories(conn, [memory_id])
        self.desk_cache.discard([memory_id])
        return SaveResult(saved=None, forgotten=[memory], rejected=None, detail="deleted")

    # --- vectors for a new embedding space -----------------------------------------------------

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

    # --- people and server settings (the hiding rules' stored inputs) --------------------------

    async def set_privacy(self, user_id: int, level: Privacy) -> None:
        async with self.pool.acquire() as conn:
            await store.set_privacy(conn, user_id, level)

    async def set_blocked(self, guild_id: int, user_id: int, blocked: bool) -> None:
        async with self.pool.acquire() as conn:
            await store.set_blocked(conn, guild_id, user_id, blocked)

    async def update_guild_settings(self, guild_id: int, **changes: object) -> None:
        async with self.pool.acquire() as conn, conn.transaction():
            await store.update_guild_settings(conn, guild_id, dict(changes))

    async def all_memories(self) -> list[Memory]:
        async with self.pool.acquire() as conn:
            return await store.all_memories(conn)
