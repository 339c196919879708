"""Channel summaries, the writing half: what each channel talked about on its past chat days and weeks.

The context window holds the last messages and chat-history recall brings back a few matching
chunks; summaries carry the rest. When a channel's chat day ends (the first message seen after the
rollover, SUMMARY_DAY_START_HOUR in SUMMARY_TIMEZONE), a background task summarises the channel's
finished days that have no summary yet (threads count with their parent), then folds each finished
week whose days are all summarised into one week summary. A reply never waits for it: the prompt
reads what is stored. The prompt carries the last SUMMARY_WEEKS week summaries and the days since,
in its stable head, so they change at most once a chat day.

Withdrawal wins (`bot.summaries.withdrawal`): what is summarised leaves out blocked people, people with
privacy `full`, the bots' replies to them and private threads; a result is stored only if nothing it was
written from was withdrawn while the model wrote it (else it is written again from what is left). A
withdrawal after the fact removes the summaries holding the words (`purge_withdrawn`, `withdraw_person`)
and has them written again in the background (`recheck`). A failed summary call leaves the day missing,
retried at later rollovers with a growing wait (1, 2, 4, 8 days), while it is within
SUMMARY_BACKFILL_DAYS; the messages stay stored, so nothing is lost. An edited summary is never
overwritten.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from datetime import date, timedelta
from typing import Any

import asyncpg

from bot.chat.log import ChatLog
from bot.clock import Clock
from bot.config import Settings
from bot.db import Connection
from bot.servers.service import Servers
from bot.summaries import store
from bot.summaries.models import BackfillProgress, ChatCalendar, Kind, Status, Summary, period_label
from bot.summaries.notes import DayNotes
from bot.summaries.withdrawal import SUMMARIES_LEAVE_OUT, Transcript, Withdrawals
from bot.summaries.writer import SummaryFailed, SummaryWriter, Written

log = logging.getLogger(__name__)

MAX_WAIT_DAYS = 8
WITHDRAWN_RETRIES = 2  # a day whose words were withdrawn while it was being written is written again at once, this often

Progress = Callable[[BackfillProgress], Awaitable[None] | None]


class SummaryWork:
    """Writing summaries: the background catch-up after a day rollover, backfills, and folding weeks."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        settings: Settings,
        clock: Clock,
        chat_log: ChatLog,
        servers: Servers,
        notes: DayNotes,
        writer: SummaryWriter | None = None,
    ) -> None:
        self.pool = pool
        self.settings = settings
        self.clock = clock
        self.chat_log = chat_log
        self.servers = servers
        self.writer = writer or SummaryWriter(settings)
        self.notes = notes  # the day's transcript, its facts checked, and the day-end notes: written by the same pass
        self.withdrawals = Withdrawals(chat_log, servers)
        self.calendar = ChatCalendar(settings.summary_timezone, settings.summary_day_start_hour)
        self._seen_day: dict[int, date] = {}
        self.locks: dict[int, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def active(self) -> bool:
        return self.settings.summary_enabled and self.writer.configured

    def today(self) -> date:
        return self.calendar.day_of(self.clock.now())

    async def is_enabled(self, channel_id: int, guild_id: int | None) -> bool:
        """Whether a channel is summarised: summaries are on, and neither the channel nor its server switched them off."""
        if not self.active:
            return False
        async with self.pool.acquire() as conn:
            return await store.switch_for(conn, [channel_id, *([guild_id] if guild_id else [])]) is not False

    # --- the day rollover, in the background ---

    def saw(self, channel_id: int, guild_id: int | None) -> None:
        """A message arrived in `channel_id` (a thread's parent for a thread): on a new chat day, catch up in the
        background. Costs nothing on the other messages of the day."""
        today = self.today()
        if not self.active or self._seen_day.get(channel_id) == today:
            return
        self._seen_day[channel_id] = today
        self._start(self._catch_up_quietly(channel_id, guild_id))

    def recheck(self, places: Sequence[tuple[int, int | None]]) -> None:
        """Summaries of these (channel, server) were withdrawn: write them again from what is left, in the background."""
        for channel_id, guild_id in places:
            if self.active:
                self._start(self._catch_up_quietly(channel_id, guild_id))

    def _start(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def purge_withdrawn(self) -> None:
        """After messages were edited or deleted: the summaries holding them go now, and are written again soon."""
        async with self.pool.acquire() as conn, conn.transaction():
            places = await store.purge_withdrawn(conn)
        self.recheck(places)

    async def settle(self) -> None:
        """Wait for the background catch-ups started so far (tests, and shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
        await self.writer.close()

    async def _catch_up_quietly(self, channel_id: int, guild_id: int | None) -> None:
        try:
            progress = await self.catch_up(channel_id, guild_id)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:  # InterfaceError: the pool is closing
            log.warning("Summaries of channel %s could not be brought up to date, retried on a later day: %s", channel_id, exc)
            self._seen_day.pop(channel_id, None)
            return
        if progress.written or progress.failed:
            log.info("Summaries of channel %s: %s", channel_id, progress.line())

    async def catch_up(
        self,
        channel_id: int,
        guild_id: int | None,
        *,
        days: int | None = None,
        progress: Progress | None = None,
        stop: asyncio.Event | None = None,
        retry_now: bool = False,
    ) -> BackfillProgress:
        """Summarise the finished chat days of the last `days` (SUMMARY_BACKFILL_DAYS) that need it, then fold weeks.

        Works from what is missing, so a run that stopped (Stop button, crash, failing model) resumes where it
        stopped. `retry_now` retries failed days without waiting for their next try (an explicit backfill).
        """
        state = BackfillProgress(channel_id)
        if not await self.is_enabled(channel_id, guild_id):
            state.finished = True
            return state
        async with self.locks.setdefault(channel_id, asyncio.Lock()):
            today = self.today()
            first = await self._window_start(channel_id, today, days)
            chat_days = await self.chat_days(channel_id, first, today)
            known = await self.summaries_since(channel_id, self.calendar.week_of(first))
            todo = [day for day in chat_days if self._needs_summary(known.get((Kind.DAY, day)), today, retry_now)]
            state.days_total = len(todo)
            await _report(progress, state)
            for day in todo:
                if stop is not None and stop.is_set():
                    state.stopped = True
                    break
                written = await self.summarise_day_anew(channel_id, guild_id, day, today)
                state.days_done += 1
                if written is None:
                    state.failed.append(f"{period_label(Kind.DAY, day)}: its messages kept changing while it was written")
                    await _report(progress, state)
                    continue
                known[(Kind.DAY, day)] = written
                if written.status == Status.MISSING:
                    state.failed.append(f"{written.period}: {written.last_error}")
                elif written.status == Status.READY:
                    state.written += 1
                await _report(progress, state)
            if not state.stopped:
                state.weeks_done = await self._fold_weeks(channel_id, guild_id, known, chat_days, today, retry_now)
            state.finished = True
            await _report(progress, state)
            return state

    def _needs_summary(self, found: Summary | None, today: date, retry_now: bool) -> bool:
        if found is None:
            return True
        if found.edited or found.status == Status.DELETED:
            return False
        if found.status == Status.MISSING:
            return retry_now or found.retry_on is None or found.retry_on <= today
        return found.stale

    async def summarise_day_anew(self, channel_id: int, guild_id: int | None, day: date, today: date) -> Summary | None:
        """`_summarise_day`, again from what is left when something was withdrawn meanwhile (a few times at most)."""
        for _ in range(WITHDRAWN_RETRIES + 1):
            written = await self._summarise_day(channel_id, guild_id, day, today)
            if written is not None:
                return written
            log.info("The summary of %s in channel %s was withdrawn while written; writing it again",
                     period_label(Kind.DAY, day), channel_id)
        return None

    async def _summarise_day(self, channel_id: int, guild_id: int | None, day: date, today: date) -> Summary | None:
        """Write and store one chat day's summary; None (nothing stored) when something it was written from was
        withdrawn while the model wrote it."""
        since, until = self.calendar.bounds(day)
        transcript = await self.withdrawals.read(channel_id, guild_id, since, until, SUMMARIES_LEAVE_OUT)
        common = {
            "channel_id": channel_id, "guild_id": guild_id, "kind": Kind.DAY, "start": day,
            "first_message_id": transcript.first_message_id, "last_message_id": transcript.last_message_id,
        }
        if not transcript.authors:  # nobody left whose words may be summarised (the bot alone would retell them)
            return await self._save(
                None, **common, status=Status.EMPTY, summary="", key_details=(), author_ids=(), message_count=0
            )
        notes_due = await self.notes.due(channel_id, guild_id, day)
        text = await self.notes.read(channel_id, guild_id, transcript.lines, self.calendar.local_time, remember=notes_due)
        label = period_label(Kind.DAY, day)
        try:
            written = await self.writer.day(f"Chat of {label}", text.lines, text.preamble)
        except SummaryFailed as exc:
            if notes_due:
                await self.notes.write_asked(channel_id, guild_id, label, text)
            return await self._failed(channel_id, guild_id, Kind.DAY, day, today, str(exc))
        checked = await self.notes.check(written, text)  # key details follow the notes' rules
        saved = await self._save(
            transcript, **common, status=Status.READY, summary=written.summary, key_details=checked.key_details,
            author_ids=transcript.people, message_count=len(transcript.lines),
        )
        if saved is not None and notes_due:
            await self.notes.write(channel_id, guild_id, day, label, checked, text, self.clock.now())
        return saved

    async def _fold_weeks(
        self,
        channel_id: int,
        guild_id: int | None,
        known: dict[tuple[Kind, date], Summary],
        chat_days: Sequence[date],
        today: date,
        retry_now: bool,
    ) -> int:
        """Fold each finished week whose chat days are all summarised (or have nothing to summarise) into one summary."""
        folded = 0
        for monday in sorted({self.calendar.week_of(day) for day in chat_days}):
            if monday + timedelta(days=7) > today:
                continue  # not over yet
            week_days = [known.get((Kind.DAY, day)) for day in chat_days if self.calendar.week_of(day) == monday]
            if any(s is None or s.status == Status.MISSING or (s.stale and not s.edited) for s in week_days):
                continue  # a day still to be summarised: fold when it is
            ready = [  # days before the window count too: a week is folded from all its summarised days
                s for (kind, start), s in sorted(known.items(), key=lambda item: item[0][1])
                if kind == Kind.DAY and self.calendar.week_of(start) == monday and s.status == Status.READY
            ]
            week = known.get((Kind.WEEK, monday))
            if not ready or (week is not None and all(s.folded_into == week.id for s in ready)):
                continue
            if week is not None and week.status == Status.MISSING and not self._needs_summary(week, today, retry_now):
                continue
            if week is None or (not week.edited and week.status != Status.DELETED):
                written = await self.write_week(channel_id, guild_id, monday, ready, today)
                if written is not None and written.status != Status.MISSING:
                    folded += 1
                continue
            async with self.pool.acquire() as conn, conn.transaction():  # kept by hand: its days are folded into it
                if await self._days_hold(conn, ready):
                    await store.fold_days(conn, week.id, [s.id for s in ready])
                    folded += 1
        return folded

    async def write_week(
        self, channel_id: int, guild_id: int | None, monday: date, days: Sequence[Summary], today: date
    ) -> Summary | None:
        """Write a week from its day summaries (each day's facts as they stand now, after the week's corrections),
        then store it and fold the days into it in one transaction, if none of them was withdrawn meanwhile (None:
        nothing stored, the week is written at a later catch-up)."""
        authors = sorted({author for s in days for author in s.author_ids})
        now = await self.notes.core.current_texts([d for s in days for d in s.key_details], guild_id, authors)
        facts = {s.id: tuple(dict.fromkeys(now.get(d, d) for d in s.key_details)) for s in days}
        try:
            written = await self.writer.week(  # each day's facts as they stand now, after the week's corrections
                f"Week of {period_label(Kind.WEEK, monday)}", [(s.period, Written(s.summary, facts[s.id], True)) for s in days]
            )
        except SummaryFailed as exc:
            return await self._failed(channel_id, guild_id, Kind.WEEK, monday, today, str(exc))
        details = await self.notes.week_details(written.key_details, [d for found in facts.values() for d in found])
        async with self.pool.acquire() as conn, conn.transaction():
            if not await self._days_hold(conn, days):
                log.info("A day of %s in channel %s was withdrawn while its week was written", period_label(Kind.WEEK, monday),
                         channel_id)
                return None
            week = await store.save_written(
                conn, model=self.writer.model or None, channel_id=channel_id, guild_id=guild_id, kind=Kind.WEEK,
                start=monday, status=Status.READY, summary=written.summary, key_details=details,
                author_ids=authors, first_message_id=None,
                last_message_id=None, message_count=sum(s.message_count for s in days), at=self.clock.now(),
            )
            await store.fold_days(conn, week.id, [s.id for s in days])
            return week

    async def _days_hold(self, conn: Connection, days: Sequence[Summary]) -> bool:
        """Withdrawal wins for a week: its days are still stored as read, nothing in them withdrawn (locked until commit)."""
        await self.servers.lock_people(conn, sorted({author for s in days for author in s.author_ids}), shared=True)
        return await store.lock_days_unchanged(conn, [(s.id, s.updated_at) for s in days])

    async def _save(self, transcript: Transcript | None, **values: Any) -> Summary | None:
        """Store a day's summary, unless something of `transcript` was withdrawn since it was read (None)."""
        async with self.pool.acquire() as conn, conn.transaction():
            if transcript is not None and not await self.withdrawals.holds(conn, transcript):
                return None
            return await store.save_written(conn, model=self.writer.model or None, at=self.clock.now(), **values)

    async def _failed(self, channel_id: int, guild_id: int | None, kind: Kind, start: date, today: date, error: str) -> Summary:
        async with self.pool.acquire() as conn:
            before = await store.get_period(conn, channel_id, kind, start)
            attempts = (before.attempts if before else 0) + 1
            wait = min(2 ** (attempts - 1), MAX_WAIT_DAYS)
            log.warning("Summary of %s in channel %s failed (attempt %d, next try in %d days): %s",
                        period_label(kind, start), channel_id, attempts, wait, error)
            return await store.save_failure(
                conn, channel_id=channel_id, guild_id=guild_id, kind=kind, start=start, error=error,
                retry_on=today + timedelta(days=wait), at=self.clock.now(),
            )

    async def _window_start(self, channel_id: int, today: date, days: int | None) -> date:
        """The first day a catch-up looks at: the last `days` (SUMMARY_BACKFILL_DAYS) calendar days, and for the
        automatic catch-up at least the channel's last chat day before today, so a day followed by weeks of
        silence is still summarised (and its notes written) when the channel speaks again."""
        first = today - timedelta(days=days or self.settings.summary_backfill_days)
        if days is not None:
            return first
        last = await self.chat_log.last_chat_day_before(
            channel_id, self.calendar.start_of(today), self.calendar.zone_name, self.calendar.start_hour
        )
        return min(first, last) if last is not None else first

    async def chat_days(self, channel_id: int, first: date, today: date) -> list[date]:
        since, until = self.calendar.start_of(first), self.calendar.start_of(today)
        zone, hour = self.calendar.zone_name, self.calendar.start_hour
        return await self.chat_log.chat_days(channel_id, since, until, zone, hour)

    async def summaries_since(self, channel_id: int, since: date) -> dict[tuple[Kind, date], Summary]:
        async with self.pool.acquire() as conn:
            return {(s.kind, s.period_start): s for s in await store.summaries_since(conn, channel_id, since)}


async def _report(progress: Progress | None, state: BackfillProgress) -> None:
    if progress is None:
        return
    result = progress(state)
    if result is not None:
        await result
