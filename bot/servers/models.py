"""Plain values of servers' and people's settings: what the hiding rules and the prompt read."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


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
    def from_row(cls, guild_id: int, row: Mapping[str, Any] | None) -> GuildSettings:
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
