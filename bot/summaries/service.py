"""Channel summaries, what the rest of Deskmate asks of them: the prompt's summaries, the commands, forgetting.

The writing (day rollovers, backfills, folding weeks) is `bot.summaries.work.SummaryWork`, which this
service owns and hands the background work to; the module docstring there says how summaries are made and kept.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import date, timedelta

import asyncpg

from bot.chat.log import ChatLog
from bot.clock import Clock
from bot.config import Settings
from bot.db import Connection
from bot.errors import InvalidInput, NotAllowed, NotFound
from bot.prompt import HeadSummary, quoted
from bot.servers.models import Actor
from bot.servers.rules import require_manager
from bot.servers.service import Servers
from bot.summaries import store
from bot.summaries.models import Kind, Off, OverviewEntry, Status, Summary
from bot.summaries.notes import DayNotes
from bot.summaries.work import SummaryWork
from bot.summaries.writer import MAX_DETAIL_CHARS, MAX_KEY_DETAILS, MAX_SUMMARY_CHARS, SummaryWriter, detail_text
from bot.tokens import count_tokens


class ChannelSummaries:
    """What the rest of Deskmate asks of summaries; the writing is its `work`, the day-end notes its `notes`."""

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
        self.work = SummaryWork(pool, settings, clock, chat_log, servers, notes, writer)
        self.pool = pool
        self.settings = settings
        self.clock = clock
        self.chat_log = chat_log
        self.notes = notes
        self.writer = self.work.writer
        # the background work, as the chat, the cogs and the tools call it
        self.saw = self.work.saw
        self.recheck = self.work.recheck
        self.purge_withdrawn = self.work.purge_withdrawn
        self.settle = self.work.settle
        self.close = self.work.close
        self.catch_up = self.work.catch_up
        self.is_enabled = self.work.is_enabled
        self.today = self.work.today

    @property
    def active(self) -> bool:
        return self.work.active

    # --- the prompt ---

    async def for_prompt(self, channel_id: int, guild_id: int | None) -> list[HeadSummary]:
        """This channel's summaries for the prompt head, oldest first: the last SUMMARY_WEEKS weeks, then the days since."""
        if not self.settings.summary_enabled or self.settings.summary_token_budget == 0:
            return []
        today = self.today()
        monday = self.work.calendar.week_of(today)
        scopes = [channel_id, *([guild_id] if guild_id else [])]
        async with self.pool.acquire() as conn:
            found = await store.prompt_summaries(
                conn, channel_id, scopes, self.settings.summary_weeks, monday - timedelta(days=7), today
            )
        return [head_summary(s) for s in found]

    # --- commands ---

    async def why_off(self, channel_id: int, guild_id: int | None) -> Off | None:
        """Why no summaries are written or shown in a channel (None: they are), for the commands to say in one sentence."""
        if not self.settings.summary_enabled:
            return Off.EVERYWHERE
        if not self.writer.configured:
            return Off.NO_MODEL
        return None if await self.is_enabled(channel_id, guild_id) else Off.HERE

    async def switches(self, guild_id: int) -> dict[int, bool]:
        """The server's own switch (keyed by its id) and its channels' switches; what is missing is on."""
        async with self.pool.acquire() as conn:
            return await store.switches(conn, guild_id)

    async def set_enabled(self, scope_id: int, guild_id: int | None, enabled: bool) -> None:
        """Summaries on or off for a server (scope_id = its id) or one channel."""
        async with self.pool.acquire() as conn:
            await store.set_switch(conn, scope_id, guild_id, enabled)

    async def overview(self, channel_id: int) -> list[OverviewEntry]:
        """Weeks, then the days not folded into a week, then past chat days with no summary yet: newest first in each."""
        today = self.today()
        first = today - timedelta(days=self.settings.summary_backfill_days)
        known = await self.work.summaries_since(channel_id, date.min)
        chat_days = await self.work.chat_days(channel_id, first, today)
        entries = [
            OverviewEntry(s.kind, s.period_start, s, count_tokens(head_summary(s).line) if s.status == Status.READY else 0)
            for s in known.values()
            if s.kind == Kind.WEEK or s.folded_into is None
        ]
        entries += [OverviewEntry(Kind.DAY, day, None) for day in chat_days if (Kind.DAY, day) not in known]
        return sorted(entries, key=lambda e: (e.kind != Kind.WEEK, e.period_start), reverse=False)

    async def get(self, channel_id: int, summary_id: int) -> Summary:
        async with self.pool.acquire() as conn:
            found = await store.get_summary(conn, summary_id)
        if found is None or found.channel_id != channel_id:
            raise NotFound(f"there is no summary #{summary_id} in this channel")
        return found

    @staticmethod
    def may_change(actor: Actor, what: str) -> None:
        """Editing, deleting, regenerating and backfilling summaries need Manage Server (asked before a form opens)."""
        require_manager(actor, f"only members with Manage Server can {what} summaries")

    async def edit(self, channel_id: int, summary_id: int, text: str, key_details: Sequence[str], actor: Actor) -> Summary:
        """An admin's own text: kept as it is, never overwritten by a regeneration."""
        self.may_change(actor, "edit")
        await self.get(channel_id, summary_id)
        text = text.strip()
        details = [" ".join(line.split()) for line in key_details if line.strip()]
        if not text:
            raise InvalidInput("a summary cannot be empty: delete it instead")
        if len(text) > MAX_SUMMARY_CHARS or len(details) > MAX_KEY_DETAILS * 2:
            raise InvalidInput(f"a summary holds at most {MAX_SUMMARY_CHARS} characters and {MAX_KEY_DETAILS * 2} key details")
        if any(len(detail) > MAX_DETAIL_CHARS for detail in details):
            raise InvalidInput(f"a key detail holds at most {MAX_DETAIL_CHARS} characters; split a longer one")
        async with self.pool.acquire() as conn:
            edited = await store.edit_summary(conn, summary_id, text, details, actor.user_id, self.clock.now())
        if edited is None:
            raise NotFound(f"there is no summary #{summary_id} in this channel")
        return edited

    async def delete(self, channel_id: int, summary_id: int, actor: Actor) -> Summary:
        """Out of the prompt, and not summarised again by itself (`regenerate` writes it anew)."""
        self.may_change(actor, "delete")
        found = await self.get(channel_id, summary_id)
        async with self.pool.acquire() as conn:
            await store.mark_deleted(conn, summary_id, self.clock.now())
        return found

    async def regenerate(self, channel_id: int, guild_id: int | None, summary_id: int, actor: Actor) -> Summary:
        """Write one summary again from its messages (a week: from its days). An edited one is kept, and the refusal says so."""
        self.may_change(actor, "regenerate")
        found = await self.get(channel_id, summary_id)
        if found.edited:
            raise NotAllowed(
                f"summary #{summary_id} ({found.period}) was edited by hand, so it is never overwritten; "
                "delete it first to have it written again"
            )
        if not self.active:
            raise NotAllowed("summaries are off here, or no summary model is configured (SUMMARY_MODEL or CHAT_MODEL)")
        today = self.today()
        async with self.work.locks.setdefault(channel_id, asyncio.Lock()):
            if found.kind == Kind.DAY:  # a deleted or missing day is written anew like any other
                written = await self.work.summarise_day_anew(channel_id, guild_id, found.period_start, today)
            else:
                days = [
                    s for (kind, start), s in (await self.work.summaries_since(channel_id, found.period_start)).items()
                    if kind == Kind.DAY and start < found.period_start + timedelta(days=7) and s.status == Status.READY
                ]
                if not days:
                    raise NotFound(f"the days of {found.period} have no summaries to fold")
                written = await self.work.write_week(channel_id, guild_id, found.period_start, days, today)
        if written is None:
            raise NotAllowed(f"messages of {found.period} were deleted or edited while it was written; try again")
        return written

    async def channels_to_backfill(self, days: int) -> list[tuple[int, int | None]]:
        """Every channel with messages in the last `days` chat days (for `python -m bot summarize --backfill`)."""
        return await self.chat_log.channels_with_messages(self.work.calendar.start_of(self.today() - timedelta(days=days)))

    # --- forgetting (parts of one transaction the caller owns) ---

    async def forget_channel(self, conn: Connection, channel_id: int) -> dict[str, int]:
        return {"summaries": await store.forget_channel(conn, channel_id)}

    async def forget_guild(self, conn: Connection, guild_id: int) -> dict[str, int]:
        return {"summaries": await store.forget_guild(conn, guild_id)}

    async def forget_user(self, conn: Connection, user_id: int) -> dict[str, int]:
        """Every summary built from the user's messages; their days are summarised again, without them (`recheck`)."""
        return {"summaries": await store.forget_author(conn, user_id)}

    async def places_of(self, conn: Connection, user_id: int) -> list[tuple[int, int | None]]:
        """(channel, server) of every summary that may hold the user's words (to `recheck` once they are gone)."""
        return await store.places_of_author(conn, user_id)

    async def withdraw_person(self, conn: Connection, user_id: int, guild_id: int | None) -> list[tuple[int, int | None]]:
        """A block (in `guild_id`) or privacy `full` (everywhere, guild_id None), inside the caller's transaction, which
        locked the person: every summary that may hold their words goes; returns where, to `recheck` after commit."""
        return await store.withdraw_person(conn, user_id, guild_id)

    async def withdraw_moved(self, moved: Sequence[tuple[int, int]]) -> None:
        """Messages (parent channel, message id) that left their parent's summaries (a thread found to be private)."""
        if not moved:
            return
        async with self.pool.acquire() as conn, conn.transaction():
            await store.mark_covering_stale(conn, moved)
        await self.purge_withdrawn()


def head_summary(summary: Summary) -> HeadSummary:
    start = summary.period_start
    when = f"{start.isoformat()} – {(start + timedelta(days=6)).isoformat()}" if summary.kind == Kind.WEEK else summary.period
    shown: dict[str, object] = {summary.kind.value: when, "summary": summary.summary[:MAX_SUMMARY_CHARS]}
    if summary.key_details:  # capped again here: a row stored before the cap existed must not flood the head
        shown["key_details"] = [detail_text(detail) for detail in summary.key_details[:MAX_KEY_DETAILS * 2]]
    return HeadSummary(key=f"summary:{summary.id}", period=summary.period, line=quoted(shown))
