"""Memory lists as the commands see them: which list, which scope, and the values a command shows.

Plain values with no database access, shared by the memory service (which writes) and the command
layer (`manage`, which reads and presents).
"""

from __future__ import annotations

import builtins
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from bot.memory import store
from bot.memory.models import Memory, MemoryList
from bot.memory.visibility import normalize_tags


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

    def filter(self, start: int = 1) -> tuple[str, builtins.list[Any]]:
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
    """A memory with what a list shows about it."""

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
    # --- memory viewer ---
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
    entries: builtins.list[ImportEntry]
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
   ; the `add` reply then points to the persona prompt and lore instead.
    """
    if INSTRUCTION_ANYWHERE.search(text):
        return True
    return any(INSTRUCTION_START.match(sentence.strip()) for sentence in SENTENCE_SPLIT.split(text))


def split_tags(raw: str | None) -> tuple[str, ...]:
    """Tags typed in one field ("cats, games #music"); ValueError names a bad one."""
    if not raw:
        return ()
    return normalize_tags(part for part in re.split(r"[\s,]+", raw) if part)
