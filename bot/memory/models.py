"""Plain values the memory core takes and returns. No Discord types: adapters convert."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import numpy as np

from bot.errors import InvalidInput, NotAllowed, Refusal

if TYPE_CHECKING:
    from bot.db import Row


class MemoryList(StrEnum):
    SERVER = "server"
    PERSONAL = "personal"


class Source(StrEnum):
    """Who wrote the memory: the model (tool call), a person (slash command), an import, or the day-end notes
    (what a finished chat day taught, written down by the summary pass)."""

    BOT = "bot"
    COMMAND = "command"
    IMPORT = "import"
    NOTES = "notes"


MODEL_SOURCES = frozenset({Source.BOT, Source.NOTES})
"""The model writes these (a reply's tool call, or the day-end notes): it acts for a person, never with more
rights than that person has by command."""


class VersionVia(StrEnum):
    """How a memory's text was replaced: the model's update, a command (an edit or a restore), a day-end
    correction, or a merge of memories that belong together."""

    BOT = "bot"
    COMMAND = "command"
    NOTES = "notes"
    MERGE = "merge"


class Rejection(StrEnum):
    """Why a save or an edit was refused; the values are the ones `simulate` prints."""

    LIST_FULL = "list_full"
    SEARCH_UNAVAILABLE = "search_unavailable"
    INVALID_TEXT = "invalid_text"
    PRIVACY = "privacy"
    NOT_ALLOWED = "not_allowed"
    WITHDRAWN = "withdrawn"  # what the save came from was deleted or withdrawn while it was being made


_LISTS: dict[str, MemoryList] = {member.value: member for member in MemoryList}
_SOURCES: dict[str, Source] = {member.value: member for member in Source}


@dataclass(frozen=True)
class Memory:
    id: int
    list: MemoryList
    guild_id: int | None
    owner_id: int | None
    persona_id: int | None
    text: str
    tags: tuple[str, ...]
    channel_ids: tuple[int, ...]
    source: Source
    protected: bool
    days_unused: int
    last_aged_on: date
    last_used_at: datetime | None
    created_by: int | None
    created_at: datetime
    updated_at: datetime
    desk_changed_on: date | None = None

    @property
    def is_global(self) -> bool:
        return self.list == MemoryList.PERSONAL and self.persona_id is None

    @classmethod
    def from_row(cls, row: Row) -> Memory:
        """Build from a `MEMORY_COLUMNS` row; runs for every desk row of every reply, so it is kept lean.

        The enums are looked up in dicts: `MemoryList(value)` goes through `EnumMeta.__call__`,
        which took half of this function's time (2.9 -> 1.4 µs per row measured).
        """
        return cls(
            id=row["id"],
            list=_LISTS[row["list"]],
            guild_id=row["guild_id"],
            owner_id=row["owner_id"],
            persona_id=row["persona_id"],
            text=row["text"],
            tags=tuple(row["tags"]),
            channel_ids=tuple(row["channel_ids"]),
            source=_SOURCES[row["source"]],
            protected=row["protected"],
            days_unused=row["days_unused"],
            last_aged_on=row["last_aged_on"],
            last_used_at=row["last_used_at"],
            created_by=row["created_by"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            desk_changed_on=row.get("desk_changed_on"),
        )


@dataclass(frozen=True)
class MemoryVersion:
    """A text a memory had before a change: who wrote it and when, who replaced it, how, when and why."""

    id: int
    memory_id: int
    text: str
    tags: tuple[str, ...]
    source: Source
    written_by: int | None
    written_at: datetime
    replaced_by: int | None
    replaced_via: VersionVia
    replaced_at: datetime
    reason: str

    def as_export(self) -> dict[str, Any]:
        """This version in an export file (docs/export-format.md); imports accept and skip it."""
        return {
            "text": self.text,
            "source": self.source.value,
            "written_at": self.written_at.astimezone(UTC).isoformat(),
            "replaced_at": self.replaced_at.astimezone(UTC).isoformat(),
            "replaced_via": self.replaced_via.value,
            "reason": self.reason,
        }


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
    source_messages: tuple[tuple[int, int, int], ...] = ()
    """Day-end notes: the (channel, message, author) the text came from; deleting one of them deletes the note."""
    conversation: Conversation | None = None


@dataclass(frozen=True)
class ScoredMemory:
    memory: Memory
    similarity: float


@dataclass(frozen=True)
class Conversation:
    """The reply being prepared, in plain values.

    `channel_id` is the channel the memory channel-limits refer to (a thread passes its parent).
    `participant_ids` are the other non-bot authors of the context window (a user who is only
    mentioned is not one); the author is always a participant.
    `context_texts` are the texts of the context window, used by tag matching. `private_thread`: what is said
    there never leaves it, so the model saves no server memory there.
    """

    guild_id: int | None
    channel_id: int
    author_id: int
    text: str
    participant_ids: tuple[int, ...] = ()
    context_texts: tuple[str, ...] = ()
    private_thread: bool = False

    @property
    def participants(self) -> tuple[int, ...]:
        """Author first, then the others in first-seen order, without duplicates."""
        return tuple(dict.fromkeys((self.author_id, *self.participant_ids)))


@dataclass
class Recall:
    """The outcome of one reply's search.

    `desk` is the active set as it stood before this search, in prompt order (server memories by
    id, then personal memories grouped by user). `used` are the top matches, best first;
    `recalled` the dormant matches that go near the end of this reply's prompt, best first: the
    used ones that were dormant and, up to MAX_RECALLED in
    all, further dormant matches, which are shown but stay in the drawer.
    """

    search_ok: bool
    failure: str | None
    persona_id: int
    desk: list[Memory]
    used: list[ScoredMemory]
    recalled: list[ScoredMemory]
    query_vector: np.ndarray | None = field(default=None, repr=False)
    held_back: list[ScoredMemory] = field(default_factory=list)
    """DESK_REFRESH=daily: memories that joined the desk today (saved, edited or recalled earlier
    today). They go in the prompt's tail, not its head, until the next chat day."""
    by_text: list[ScoredMemory] = field(default_factory=list)
    """When the message could not be embedded (the search failed): dormant memories that share words
    with it, best text rank first (`similarity` holds the rank). Shown in the tail, read-only: the
    failed search changed no counter, and finding them by text changes none either."""
    desk_ranks: dict[int, int] = field(default_factory=dict)
    """Rank of each desk memory inside its group (server list, or one person), 0 first: which ones the
    prompt keeps when the desk is larger than its share of the budget (bot/memory/desk_ranks.py)."""


@dataclass(frozen=True)
class Merge:
    """Two memories of a full list joined into one to make room: `kept` (its id stays) now holds both texts;
    `absorbed` is gone, its text kept among `kept`'s versions, as is `kept_text`, the text `kept` had before."""

    kept: Memory
    absorbed: Memory
    kept_text: str


@dataclass
class SaveResult:
    saved: Memory | None
    forgotten: list[Memory]
    rejected: Rejection | None
    detail: str
    repeated: bool = False  # the text repeats `saved`, which was counted as used instead of storing a copy
    similar: list[Memory] = field(default_factory=list)  # the closest other memories of the list (for an update)
    replaced_text: str | None = None  # an edit: the text before it
    kept_apart_from: int | None = None  # an update about something else than this memory: saved as new, that one kept
    merged: list[Merge] = field(default_factory=list)  # memories joined to make room before this save (a full list)

    @property
    def ok(self) -> bool:
        return self.saved is not None

    @property
    def refusal(self) -> Refusal | None:
        """The refusal this result carries, as the one family adapters translate (None when nothing was refused).

        The core returns refusals as results rather than raising them, because a reply's tool calls go on
        after one is refused and each refusal is reported to the model.
        """
        if self.rejected is None:
            return None
        kind = InvalidInput if self.rejected == Rejection.INVALID_TEXT else NotAllowed
        return kind(self.detail, reason=self.rejected.value)


def done_or_refused(result: SaveResult, refused: str) -> SaveResult:
    """A command's change either happened or is raised as a refusal saying what did not happen ("not saved: ...").

    Commands go through the one family of refusals; only the model's tools read refusals as results.
    """
    refusal = result.refusal
    if refusal is not None:
        raise type(refusal)(f"{refused}: {refusal.sentence}", reason=refusal.reason)
    return result
