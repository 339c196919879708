"""The owner of the chat log: every message of the channels the bot reads (the context window), the
names people go by, and the receipts of replies.

Editing or deleting a message here also drops the history chunk it was part of (the database
does it: migrations/008_chunks_follow_messages.sql), so chat-history recall never shows words that
were taken back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, date, datetime
from typing import Any

import asyncpg

from bot.chat import log_store as store
from bot.chat.messages import IncomingMessage, storable
from bot.db import Connection


class ChatLog:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def record(self, message: IncomingMessage, names: Mapping[int, str] | None = None) -> bool:
        """Store a message as it arrives (every message of a channel the bot can read, its own too).

        Returns whether it was new. `names` are the display names to keep (by default the author's).
        """
        async with self.pool.acquire() as conn:
            return await self._record(conn, message, names)

    async def _record(self, conn: Connection, message: IncomingMessage, names: Mapping[int, str] | None = None) -> bool:
        return await store.record_chat_message(
            conn,
            guild_id=message.guild_id,
            channel_id=message.channel_id,
            message_id=message.message_id,
            author_id=message.author_id,
            author_name=message.author_name,
            is_bot=message.is_bot,
            text=message.text,
            reply_to=message.reply_to,
            mention_ids=[user.id for user in message.mentions],
            created_at=message.created_at,
            names=names,
            parent_channel_id=None if message.private_thread else message.parent_channel_id,
            author_can_manage=message.author_can_manage,
            private_thread=message.private_thread,
        )

    async def record_and_read_window(
        self, message: IncomingMessage, *, names: Mapping[int, str], context_messages: int
    ) -> dict[str, Any]:
        """The answered message (once) and what the prompt needs from the log, on one connection: the window
        before it, the stored names of `names`' ids and of the window's authors, the previous prompt head."""
        async with self.pool.acquire() as conn:
            await self._record(conn, message, names)
            return await store.window_context(
                conn,
                channel_id=message.channel_id,
                answered_message_id=message.message_id,
                context_messages=context_messages,
                user_ids=names,
            )

    async def is_empty(self, channel_id: int) -> bool:
        """True when no message of this channel is stored yet (the adapter then reads its recent history once)."""
        async with self.pool.acquire() as conn:
            return not await store.has_chat_messages(conn, channel_id)

    async def record_backfill(self, messages: Sequence[IncomingMessage]) -> int:
        """Store a backfill of older messages in one transaction; returns how many were new."""
        async with self.pool.acquire() as conn, conn.transaction():
            return sum([await self._record(conn, message) for message in messages])

    async def detach_private_thread(self, thread_id: int) -> list[tuple[int, int]]:
        """A private thread's messages stored as its parent's become its own; returns (parent, message id) of each."""
        async with self.pool.acquire() as conn:
            return await store.detach_private_thread(conn, thread_id)

    async def names(self, user_ids: Iterable[int]) -> dict[int, str]:
        async with self.pool.acquire() as conn:
            return await store.chat_user_names(conn, user_ids)

    async def edit(self, channel_id: int, message_id: int, text: str, edited_at: datetime) -> bool:
        """An edited message: the new text (its history chunk goes, and is rebuilt in the background)."""
        async with self.pool.acquire() as conn:
            return await store.edit_chat_message(conn, channel_id, message_id, storable(text), edited_at)

    async def delete(self, channel_id: int, message_ids: Sequence[int]) -> int:
        """Deleted messages (and the history chunks they were part of)."""
        async with self.pool.acquire() as conn:
            return await store.delete_chat_messages(conn, channel_id, message_ids)

    # --- what the channel summaries read ---

    async def chat_days(self, channel_id: int, since: datetime, until: datetime, zone: str, day_start_hour: int) -> list[date]:
        """The chat days with messages in a channel (its threads included), between two instants."""
        async with self.pool.acquire() as conn:
            return await store.chat_days(conn, channel_id, since, until, zone, day_start_hour)

    async def last_chat_day_before(self, channel_id: int, until: datetime, zone: str, day_start_hour: int) -> date | None:
        """The channel's latest chat day with messages before an instant (its threads included)."""
        async with self.pool.acquire() as conn:
            return await store.last_chat_day_before(conn, channel_id, until, zone, day_start_hour)

    async def messages_between(self, channel_id: int, since: datetime, until: datetime) -> list[dict[str, Any]]:
        """A channel's messages (its public threads' included) in a time range, oldest first, each with the
        author of the message it answers (`answered_author_id`, `answered_stored`)."""
        async with self.pool.acquire() as conn:
            return [dict(row) for row in await store.messages_between(conn, channel_id, since, until)]

    async def lock_unchanged(self, conn: Connection, versions: Sequence[tuple[int, int, str, int | None]]) -> bool:
        """Inside the caller's transaction: whether each (channel, message, text, parent) is still stored as it was
        read, the rows locked until the transaction ends (an edit or delete racing it waits, then sees the result)."""
        return await store.lock_unchanged(conn, versions)

    async def channels_with_messages(self, since: datetime) -> list[tuple[int, int | None]]:
        """(channel, server) of every channel with messages since `since` (threads counted with their parent)."""
        async with self.pool.acquire() as conn:
            return [(row["channel_id"], row["guild_id"]) for row in await store.channels_with_messages(conn, since)]

    # --- receipts ---

    async def save_receipt(
        self, *, guild_id: int | None, channel_id: int, message_id: int, head_hash: str, receipt: dict[str, Any], at: datetime
    ) -> None:
        async with self.pool.acquire() as conn:
            await store.save_reply_receipt(
                conn,
                guild_id=guild_id,
                channel_id=channel_id,
                message_id=message_id,
                head_hash=head_hash,
                receipt=receipt,
                created_at=at,
            )

    async def receipt(self, *, message_id: int | None = None, channel_id: int | None = None) -> dict[str, Any] | None:
        async with self.pool.acquire() as conn:
            return await store.get_receipt(conn, message_id=message_id, channel_id=channel_id)

    async def receipt_for(self, message_id: int) -> dict[str, Any] | None:
        """The receipt of the reply to `message_id`, or of the reply that is message `message_id` (a copied link)."""
        async with self.pool.acquire() as conn:
            return await store.receipt_for_message(conn, message_id)

    # --- forgetting (parts of one transaction the caller owns) ---

    async def forget_channel(self, conn: Connection, channel_id: int) -> int:
        return await store.delete_channel_chat(conn, channel_id)

    async def forget_guild(self, conn: Connection, guild_id: int) -> dict[str, int]:
        return await store.forget_guild_chat(conn, guild_id)

    async def export_user(self, conn: Connection, user_id: int) -> list[dict[str, Any]]:
        return [
            {
                "server_id": str(row["guild_id"]) if row["guild_id"] is not None else None,
                "channel_id": str(row["channel_id"]),
                "message_id": str(row["message_id"]),
                "text": row["text"],
                "created_at": row["created_at"].astimezone(UTC).isoformat(),
            }
            for row in await store.user_chat_messages(conn, user_id)
        ]

    async def forget_user(self, conn: Connection, user_id: int) -> dict[str, int]:
        """A user's messages and the bots' replies to them, their name and the receipts naming them (inside the
        caller's transaction)."""
        return {"chat_messages": await store.delete_user_chat_data(conn, user_id)}
