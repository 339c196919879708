"""Withdrawal wins: work derived from people's words (channel summaries, day-end notes) never keeps words that
were taken back, even when they were taken back while the work was being written.

A withdrawal is whatever takes someone's words out of what may be derived from them: a deleted or edited
message, delete-my-data, a block in a server, a privacy level (docs/memory-rules.md, "Withdrawal wins"). Derived
work reads messages, then waits minutes for a model; so the check that counts is the one made when its result
is stored:

1. `Withdrawals.read` reads a channel's messages as derived work may use them, a `Transcript`: without the
   people its `leave_out` levels name (and anyone blocked in the server), without the bots' replies to them or to
   messages deleted or edited since (a reply often repeats what it answers), and without private threads (the chat log
   files a private thread's messages under the thread itself). It records exactly what it kept.
2. The work calls its model, then stores the result in one transaction that first asks
   `Withdrawals.holds(conn, transcript)`. That locks the people whose words the transcript holds (shared) and the
   messages it kept (FOR SHARE), then says whether everything is still as it was read. False: store nothing; the
   work is done again from what is left.
3. Every withdrawal takes its own locks before removing what was derived: a change about a person (privacy,
   block, delete-my-data) locks that person exclusively (`Servers.lock_people`), an edit or deletion locks the
   message rows it changes. So whichever commits first, the other sees it: a withdrawal that came first makes
   `holds` false; a result stored first is found and removed by the withdrawal, which waited for it.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bot.chat.log import ChatLog
from bot.db import Connection
from bot.servers.models import Privacy
from bot.servers.service import Servers

SUMMARIES_LEAVE_OUT = frozenset({Privacy.FULL})
"""Privacy levels whose words no summary holds (blocked people are always left out)."""
NOTES_LEAVE_OUT = frozenset({Privacy.PARTIAL, Privacy.FULL})
"""Privacy levels whose words no day-end note holds: the model may save nothing about them."""

Version = tuple[int, int, str, int | None]  # (channel, message, text, parent channel) as read


@dataclass(frozen=True)
class Transcript:
    """A channel's messages of a time range as derived work may use them, and what to check before storing.

    `lines` are the kept messages, oldest first (chat log rows as dicts). `authors` are the people who wrote
    kept lines; `people` adds the authors of the messages that kept bot lines answer: everyone whose words the
    lines may hold. `first_message_id`/`last_message_id` span every message read, kept or not.
    """

    channel_id: int
    guild_id: int | None
    leave_out: frozenset[Privacy]
    lines: tuple[dict[str, Any], ...]
    authors: tuple[int, ...]
    people: tuple[int, ...]
    versions: tuple[Version, ...]
    first_message_id: int | None
    last_message_id: int | None


class Withdrawals:
    """Reads what derived work may use, and tells, inside the transaction that stores its result, whether it still may."""

    def __init__(self, chat_log: ChatLog, servers: Servers) -> None:
        self.chat_log = chat_log
        self.servers = servers

    async def read(
        self, channel_id: int, guild_id: int | None, since: datetime, until: datetime, leave_out: Collection[Privacy]
    ) -> Transcript:
        """The messages of a summary channel (its public threads included) in [since, until), as derived work may use them."""
        rows = await self.chat_log.messages_between(channel_id, since, until)
        asked = {row["author_id"] for row in rows if not row["is_bot"]}
        asked |= {row["answered_author_id"] for row in rows if row["is_bot"] and row["answered_author_id"] is not None}
        levels = frozenset(leave_out)
        left = await self.servers.left_out(guild_id, sorted(asked), levels)
        kept = [row for row in rows if _may_use(row, left)]
        answering = [row for row in kept if row["is_bot"] and row["reply_to"] is not None]
        authors = sorted({row["author_id"] for row in kept if not row["is_bot"]})
        versions = [_version(row) for row in kept]
        versions += [
            (row["channel_id"], row["reply_to"], row["answered_text"], row["answered_parent_id"]) for row in answering
        ]
        return Transcript(
            channel_id=channel_id,
            guild_id=guild_id,
            leave_out=levels,
            lines=tuple(kept),
            authors=tuple(authors),
            people=tuple(sorted({*authors, *(row["answered_author_id"] for row in answering)})),
            versions=tuple(dict.fromkeys(versions)),
            first_message_id=min((row["message_id"] for row in rows), default=None),
            last_message_id=max((row["message_id"] for row in rows), default=None),
        )

    async def holds(self, conn: Connection, transcript: Transcript) -> bool:
        """Call first in the transaction that stores what was derived from `transcript`: True when nothing it was
        read from has been withdrawn since. The people and messages stay locked until that transaction ends."""
        await self.servers.lock_people(conn, transcript.people, shared=True)
        if not await self.chat_log.lock_unchanged(conn, transcript.versions):
            return False
        left = await self.servers.left_out(transcript.guild_id, transcript.people, transcript.leave_out, conn)
        return not left


def _may_use(row: dict[str, Any], left_out: set[int]) -> bool:
    """A person's line unless they are left out; a bot's line unless it answers someone left out, a message no
    longer stored (deleted: the reply goes with it) or one edited since (it may repeat the words taken back)."""
    if not row["is_bot"]:
        return row["author_id"] not in left_out
    if row["reply_to"] is None:
        return True
    return bool(row["answered_stored"]) and not row["answered_edited"] and row["answered_author_id"] not in left_out


def _version(row: dict[str, Any]) -> Version:
    return (row["channel_id"], row["message_id"], row["text"], row["parent_channel_id"])
