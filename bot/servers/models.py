"""Plain values of servers' and people's settings: what the hiding rules and the prompt read."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bot.db import Row


class Privacy(StrEnum):
    NONE = "none"
    PARTIAL = "partial"
    FULL = "full"


@dataclass(frozen=True)
class GuildSettings:
    guild_id: int
    notices: str = "visible"
    notice_verbosity: str = "minimal"
    log_channel_id: int | None = None
    self_teaching: bool = True
    member_teaching: bool = False
    personal_memories: bool = True
    tagging: bool = False
    auto_reply_channel_ids: tuple[int, ...] = ()

    @classmethod
    def from_row(cls, guild_id: int, row: Row | None) -> GuildSettings:
        if row is None:
            return cls(guild_id)
        return cls(
            guild_id=guild_id,
            notices=row["notices"],
            notice_verbosity=row["notice_verbosity"],
            log_channel_id=row["log_channel_id"],
            self_teaching=row["self_teaching"],
            member_teaching=row["member_teaching"],
            personal_memories=row["personal_memories"],
            tagging=row["tagging"],
            auto_reply_channel_ids=tuple(row["auto_reply_channel_ids"]),
        )


@dataclass(frozen=True)
class Actor:
    """Who asks for a change, as the adapter knows them: every limit and permission is decided by the services from
    this. `can_manage`: the person has Manage Server where they act (never in a DM); the console's user runs its
    local server."""

    user_id: int
    can_manage: bool = False


@dataclass(frozen=True)
class PersonaSettings:
    """A persona as stored: a server's own (created from the default on first use), or the default one (guild None)."""

    id: int
    guild_id: int | None
    name: str
    prompt: str
    attributes: Mapping[str, str]


@dataclass(frozen=True)
class LoreEntry:
    """An always-on lore entry of a persona: a rule or fact in every prompt."""

    id: int
    text: str
    created_at: datetime


@dataclass(frozen=True)
class PromptSettings:
    """What a reply's prompt needs from the servers' settings, read fresh per reply: the persona, its lore texts and
    the server's settings (None in DMs)."""

    persona: PersonaSettings
    lore: tuple[str, ...]
    guild: GuildSettings | None


@dataclass(frozen=True)
class ReplyTriggers:
    """What decides, besides the message itself, whether the bot answers: the persona's name here, whether one of the
    channels replies to everything, whether the author is blocked here."""

    persona_name: str
    auto_reply: bool
    blocked: bool
