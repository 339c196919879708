"""Plain values of channel summaries: a summary row, the chat calendar, and what a backfill reports."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

if TYPE_CHECKING:
    from bot.db import Row


class Kind(StrEnum):
    DAY = "day"
    WEEK = "week"


class Off(StrEnum):
    """Why a channel has no summaries written or shown: what the commands say instead of a list."""

    EVERYWHERE = "everywhere"  # SUMMARY_ENABLED=false
    NO_MODEL = "no model"  # neither SUMMARY_MODEL nor CHAT_MODEL (with its endpoint) is configured
    HERE = "here"  # switched off for this channel or its server


class Status(StrEnum):
    READY = "ready"
    MISSING = "missing"  # the summary model failed; retried on a later day rollover
    EMPTY = "empty"  # nothing to summarise once blocked and fully private people are left out
    DELETED = "deleted"  # an admin deleted it: not shown, not regenerated until asked


@dataclass(frozen=True)
class Summary:
    id: int
    channel_id: int
    guild_id: int | None
    kind: Kind
    period_start: date
    status: Status
    summary: str
    key_details: tuple[str, ...]
    author_ids: tuple[int, ...]
    message_count: int
    stale: bool
    folded_into: int | None
    edited_by: int | None
    edited_at: datetime | None
    attempts: int
    retry_on: date | None
    last_error: str | None
    model: str | None
    updated_at: datetime

    @classmethod
    def from_row(cls, row: Row) -> Summary:
        details = row["key_details"]
        if isinstance(details, str):  # jsonb arrives as text: the pool sets no JSON codec
            details = json.loads(details)
        return cls(
            id=row["id"],
            channel_id=row["channel_id"],
            guild_id=row["guild_id"],
            kind=Kind(row["kind"]),
            period_start=row["period_start"],
            status=Status(row["status"]),
            summary=row["summary"],
            key_details=tuple(str(item) for item in (details if isinstance(details, list) else [])),
            author_ids=tuple(row["author_ids"]),
            message_count=row["message_count"],
            stale=row["stale"],
            folded_into=row["folded_into"],
            edited_by=row["edited_by"],
            edited_at=row["edited_at"],
            attempts=row["attempts"],
            retry_on=row["retry_on"],
            last_error=row["last_error"],
            model=row["model"],
            updated_at=row["updated_at"],
        )

    @property
    def period(self) -> str:
        """"Tue 2026-11-24" for a day, "week 2026-11-16 – 2026-11-22" for a week."""
        return period_label(self.kind, self.period_start)

    @property
    def edited(self) -> bool:
        return self.edited_by is not None


def period_label(kind: Kind, start: date) -> str:
    if kind == Kind.WEEK:
        return f"week {start.isoformat()} – {(start + timedelta(days=6)).isoformat()}"
    return f"{start.strftime('%a')} {start.isoformat()}"


class ChatCalendar:
    """Chat days: a day starts at `start_hour` local time in `zone` (04:00 by default, so a chat that runs past
    midnight stays on one day), and a week starts on Monday."""

    def __init__(self, zone: str, start_hour: int) -> None:
        self.zone_name = zone
        self.zone = ZoneInfo(zone)
        self.start_hour = start_hour

    def day_of(self, at: datetime) -> date:
        return (at.astimezone(self.zone) - timedelta(hours=self.start_hour)).date()

    def start_of(self, day: date) -> datetime:
        """The instant a chat day starts, in UTC (correct across daylight-saving changes)."""
        return datetime.combine(day, time(self.start_hour), tzinfo=self.zone).astimezone(UTC)

    def bounds(self, day: date) -> tuple[datetime, datetime]:
        return self.start_of(day), self.start_of(day + timedelta(days=1))

    @staticmethod
    def week_of(day: date) -> date:
        return day - timedelta(days=day.weekday())

    def local_time(self, at: datetime) -> str:
        return at.astimezone(self.zone).strftime("%H:%M")


@dataclass
class BackfillProgress:
    """Where a catch-up or backfill stands; handed to the progress callback after every step."""

    channel_id: int
    days_total: int = 0
    days_done: int = 0
    weeks_done: int = 0
    written: int = 0
    failed: list[str] = field(default_factory=list)  # "Tue 2026-11-24: the summary model timed out"
    skipped_edited: int = 0
    stopped: bool = False
    finished: bool = False

    @property
    def fraction(self) -> float:
        return 1.0 if self.days_total == 0 else min(self.days_done / self.days_total, 1.0)

    def line(self) -> str:
        """e.g. "days 3/10 · 2 written · 1 failed · weeks folded 1"."""
        parts = [f"days {self.days_done}/{self.days_total}", f"{self.written} written"]
        if self.failed:
            parts.append(f"{len(self.failed)} failed")
        if self.skipped_edited:
            parts.append(f"{self.skipped_edited} edited ones kept")
        parts.append(f"weeks folded {self.weeks_done}")
        return " · ".join(parts)


@dataclass(frozen=True)
class OverviewEntry:
    """One line of `/summaries list`: a stored summary, or a past chat day that has none yet (`summary` None)."""

    kind: Kind
    period_start: date
    summary: Summary | None
    tokens: int = 0

    @property
    def state(self) -> str:
        if self.summary is None:
            return "missing (not summarised yet)"
        s = self.summary
        if s.status == Status.MISSING:
            return f"missing (failed {s.attempts}×; retried from {s.retry_on})" if s.retry_on else "missing"
        if s.status == Status.EMPTY:
            return "nothing to summarise"
        if s.status == Status.DELETED:
            return "deleted"
        flags = [f"{self.tokens} tokens"]
        if s.edited:
            flags.append("edited")
        if s.stale:
            flags.append("stale: regenerated at the next day rollover" if not s.edited else "messages changed since")
        if s.folded_into is not None:
            flags.append("folded into its week")
        return ", ".join(flags)
