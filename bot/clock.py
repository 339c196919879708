"""The clock every service takes, so the simulator and the tests can move days by hand."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime: ...


def utc_now(clock: Clock) -> tuple[datetime, date]:
    """The clock's time in UTC, and the UTC date: decay counts UTC days."""
    now = clock.now().astimezone(UTC)
    return now, now.date()


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
