"""SQL of the chat log: the stored messages of each channel (the context window), the names people go
by, and reply receipts.

Only `bot.chat.log` imports this module. History chunks follow their messages by themselves
(migrations/008_chunks_follow_messages.sql): editing or deleting a message here drops its chunk.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import date, datetime
from typing import Any

import asyncpg

from bot.db import Connection

CHAT_MESSAGE_COLUMNS = (
    "channel_id, message_id, guild_id, author_id, author_name, is_bot, text, reply_to, mention_ids, created_at, edited_at,"
    " parent_channel_id"
)


RECORD_MESSAGE_SQL = (
    "WITH message AS ("
    f"  INSERT INTO chat_messages ({CHAT_MESSAGE_COLUMNS}, author_can_manage, private_thread)"
    "   VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, NULL, $13, $14, $15) ON CONFLICT (channel_id, message_id)"
    "   DO UPDATE SET reply_to = EXCLUDED.reply_to"
    "   WHERE chat_messages.reply_to IS NULL AND EXCLUDED.reply_to IS NOT NULL"
    "   RETURNING xmax = 0 AS inserted"
    "), named AS ("
    "  INSERT INTO chat_users (user_id, name)"
    "  SELECT user_id, name FROM unnest($11::bigint[], $12::text[]) AS given (user_id, name)"
    "  ON CONFLICT (user_id) DO UPDATE SET name = EXCLUDED.name, updated_at = now()"
    "  WHERE chat_users.name <> EXCLUDED.name"
    ") SELECT count(*) FROM message WHERE inserted"
)


async def record_chat_message(
    conn: Connection,
    *,
    guild_id: int | None,
    channel_id: int,
    message_id: int,
    author_id: int,
    author_name: str,
    is_bot: bool,
    text: str,
    reply_to: int | None,
    mention_ids: Sequence[int],
    created_at: datetime,
    names: Mapping[int, str] | None = None,
    parent_channel_id: int | None = None,
    author_can_manage: bool = False,
    private_thread: bool = False,
) -> bool:
    """Store a message once; a second delivery (gateway resume, history backfill) changes nothing.

    Returns whether the message was new. The latest display names of `names` (by default the
    author's; a reply adds the people it mentions) are kept alongside, in the same statement,
    upserted in id order so two messages never wait on each other's rows in opposite orders.
    A second delivery may only add what the first lacked: the message a bot's message answers
    (`reply_to`), which the adapter knows for every part of a long reply while the gateway's copy of
    the later parts has none, so delete-my-data and the summaries find every part of a reply to someone.
    `parent_channel_id` is the channel whose summaries hold the message (None for a private thread).
    """
    given = dict(names) if names is not None else {author_id: author_name}
    ids = sorted(given)
    return bool(
        await conn.fetchval(
            RECORD_MESSAGE_SQL,
            channel_id,
            message_id,
            guild_id,
            author_id,
            author_name,
            is_bot,
            text,
            reply_to,
            list(mention_ids),
            created_at,
            ids,
            [given[user_id] for user_id in ids],
            parent_channel_id if parent_channel_id != channel_id else None,
            author_can_manage,
            private_thread,
        )
    )


async def detach_private_thread(conn: Connection, thread_id: int) -> list[tuple[int, int]]:
    """A thread found to be private: its messages stored as its parent's (before the bot knew) become its own.

    Returns (parent, message id) of each message moved, so the parent's summaries that hold them can go.
    """
    rows = await conn.fetch(
        "UPDATE chat_messages m SET parent_channel_id = NULL, private_thread = true FROM chat_messages old"
        " WHERE m.channel_id = $1 AND m.parent_channel_id IS NOT NULL"
        "   AND old.channel_id = m.channel_id AND old.message_id = m.message_id"
        " RETURNING old.parent_channel_id AS parent, m.message_id",
        thread_id,
    )
    return [(row["parent"], row["message_id"]) for row in rows]


async def chat_user_names(conn: Connection, user_ids: Iterable[int]) -> dict[int, str]:
    rows = await conn.fetch("SELECT user_id, name FROM chat_users WHERE user_id = ANY ($1::bigint[])", sorted(set(user_ids)))
    return {row["user_id"]: row["name"] for row in rows}


async def edit_chat_message(conn: Connection, channel_id: int, message_id: int, text: str, edited_at: datetime) -> bool:
    status = await conn.execute(
        "UPDATE chat_messages SET text = $3, edited_at = $4 WHERE channel_id = $1 AND message_id = $2",
        channel_id,
        message_id,
        text,
        edited_at,
    )
    return status.endswith(" 1")


async def delete_chat_messages(conn: Connection, channel_id: int, message_ids: Sequence[int]) -> int:
    status = await conn.execute(
        "DELETE FROM chat_messages WHERE channel_id = $1 AND message_id = ANY ($2::bigint[])", channel_id, list(message_ids)
    )
    return int(status.split()[-1])


async def delete_channel_chat(conn: Connection, channel_id: int) -> int:
    """Forget a deleted channel or thread: its messages and receipts."""
    await conn.execute("DELETE FROM reply_receipts WHERE channel_id = $1", channel_id)
    status = await conn.execute("DELETE FROM chat_messages WHERE channel_id = $1", channel_id)
    return int(status.split()[-1])


async def delete_user_chat_data(conn: Connection, user_id: int) -> int:
    """Everything the pipeline stored about one user (/privacy delete-my-data): their messages and name,
    and the receipts of replies to them or naming them anywhere (a receipt keeps who each memory is about and
    the text of memories saved; matching the id as a whole number keeps up with new receipt fields)."""
    await conn.execute(
        "DELETE FROM reply_receipts WHERE message_id IN (SELECT message_id FROM chat_messages WHERE author_id = $1)"
        " OR receipt::text ~ ('(^|[^0-9])' || $1::bigint::text || '([^0-9]|$)')",
        user_id,
    )
    # the bots' replies to them go too: they often repeat what they answer
    replies = await conn.execute(
        "DELETE FROM chat_messages b USING chat_messages m"
        " WHERE m.author_id = $1 AND b.is_bot AND b.channel_id = m.channel_id AND b.reply_to = m.message_id",
        user_id,
    )
    status = await conn.execute("DELETE FROM chat_messages WHERE author_id = $1", user_id)
    await conn.execute("DELETE FROM chat_users WHERE user_id = $1", user_id)
    # others' messages stay (their words), but no longer record that they mentioned this user
    await conn.execute(
        "UPDATE chat_messages SET mention_ids = array_remove(mention_ids, $1::bigint) WHERE $1::bigint = ANY (mention_ids)",
        user_id,
    )
    return int(status.split()[-1]) + int(replies.split()[-1])


async def has_chat_messages(conn: Connection, channel_id: int) -> bool:
    return bool(await conn.fetchval("SELECT EXISTS (SELECT 1 FROM chat_messages WHERE channel_id = $1)", channel_id))


RECEIPTS_KEPT_PER_CHANNEL = 200


async def previous_head_hash(conn: Connection, channel_id: int) -> str | None:
    return await conn.fetchval("SELECT head_hash FROM reply_receipts WHERE channel_id = $1 ORDER BY id DESC LIMIT 1", channel_id)


async def get_receipt(conn: Connection, *, message_id: int | None = None, channel_id: int | None = None) -> dict[str, Any] | None:
    """The receipt of the reply to `message_id`, or else the latest one in `channel_id`."""
    if message_id is not None:
        raw = await conn.fetchval(
            "SELECT receipt FROM reply_receipts WHERE message_id = $1 ORDER BY id DESC LIMIT 1", message_id
        )
    else:
        raw = await conn.fetchval(
            "SELECT receipt FROM reply_receipts WHERE channel_id = $1 ORDER BY id DESC LIMIT 1", channel_id
        )
    if raw is None:
        return None
    return json.loads(raw) if isinstance(raw, str) else raw


async def user_chat_messages(conn: Connection, user_id: int) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT guild_id, channel_id, message_id, text, created_at FROM chat_messages WHERE author_id = $1"
        " ORDER BY channel_id, message_id",
        user_id,
    )


async def forget_guild_chat(conn: Connection, guild_id: int) -> dict[str, int]:
    """The bot left a server: its stored messages and receipts go (their chunks with them)."""

    def count(status: str) -> int:
        return int(status.split()[-1])

    return {
        "chat_messages": count(await conn.execute("DELETE FROM chat_messages WHERE guild_id = $1", guild_id)),
        "receipts": count(await conn.execute("DELETE FROM reply_receipts WHERE guild_id = $1", guild_id)),
    }


async def receipt_for_message(conn: Connection, message_id: int) -> dict[str, Any] | None:
    """The receipt of the reply to `message_id`, or of the message the bot's reply `message_id` answered.

    Receipts are keyed by the message answered; people copy the link of the bot's reply, which
    is stored as a chat message that replies to (references) the answered one.
    """
    raw = await conn.fetchval(
        "SELECT receipt FROM reply_receipts WHERE message_id = $1"
        "   OR message_id = (SELECT reply_to FROM chat_messages WHERE message_id = $1 AND reply_to IS NOT NULL LIMIT 1)"
        " ORDER BY (message_id = $1) DESC, id DESC LIMIT 1",
        message_id,
    )
    if raw is None:
        return None
    return json.loads(raw) if isinstance(raw, str) else raw


WINDOW_CONTEXT_SQL = """
WITH recent AS (
    SELECT message_id, author_id, author_name, is_bot, text, reply_to FROM chat_messages
    WHERE channel_id = $1 AND message_id < $2 ORDER BY message_id DESC LIMIT greatest($3::int - 1, 0)
), named AS (
    SELECT user_id, name FROM chat_users
    WHERE user_id = ANY ($4::bigint[] || ARRAY(SELECT author_id FROM recent))
)
SELECT (SELECT json_agg(recent ORDER BY message_id) FROM recent)::text AS recent,
       ARRAY(SELECT user_id FROM named ORDER BY user_id) AS name_ids,
       ARRAY(SELECT name FROM named ORDER BY user_id) AS names,
       (SELECT head_hash FROM reply_receipts WHERE channel_id = $1 ORDER BY id DESC LIMIT 1) AS previous_head
"""


async def window_context(
    conn: Connection,
    *,
    channel_id: int,
    answered_message_id: int,
    context_messages: int,
    user_ids: Iterable[int],
) -> dict[str, Any]:
    """What a reply's prompt needs from the chat log, in one statement (one snapshot).

    - `window`: the messages of the channel before the answered one, oldest first: the last
      `context_messages` up to and including the answered message, without it;
    - `previous_head` (as `previous_head_hash`);
    - `names`: the stored names of `user_ids` and of every author in the window; `names_for` says which
      ids were asked, so the caller knows whether a later id (a memory's owner) still needs a look-up.
    """
    asked = sorted(set(user_ids))
    row = await conn.fetchrow(WINDOW_CONTEXT_SQL, channel_id, answered_message_id, context_messages, asked)
    assert row is not None  # the statement always returns its row
    window = json.loads(row["recent"]) if row["recent"] else []
    return {
        "window": window,
        "previous_head": row["previous_head"],
        "names": dict(zip(row["name_ids"], row["names"], strict=True)),
        "names_for": {*asked, *(line["author_id"] for line in window)},
    }


async def save_reply_receipt(
    conn: Connection,
    *,
    guild_id: int | None,
    channel_id: int,
    message_id: int,
    head_hash: str,
    receipt: dict[str, Any],
    created_at: datetime,
) -> None:
    """Store a reply's receipt and keep only the channel's latest ones, in one statement.

    The DELETE sees the table as it was before the INSERT (one snapshot), so it keeps
    RECEIPTS_KEPT_PER_CHANNEL - 1 older receipts: RECEIPTS_KEPT_PER_CHANNEL with the new one.
    """
    await conn.execute(
        "WITH added AS ("
        "  INSERT INTO reply_receipts (guild_id, channel_id, message_id, head_hash, receipt, created_at)"
        "  VALUES ($1, $2, $3, $4, $5::text::jsonb, $6) RETURNING id"
        ") DELETE FROM reply_receipts WHERE channel_id = $2 AND id < ("
        "  SELECT id FROM reply_receipts WHERE channel_id = $2 ORDER BY id DESC OFFSET $7 LIMIT 1)",
        guild_id,
        channel_id,
        message_id,
        head_hash,
        json.dumps(receipt, ensure_ascii=False),
        created_at,
        RECEIPTS_KEPT_PER_CHANNEL - 2,
    )


# --- what the channel summaries read (a thread's messages count with its parent's) ---

SUMMARY_CHANNEL = "coalesce(parent_channel_id, channel_id)"


async def chat_days(
    conn: Connection, channel_id: int, since: datetime, until: datetime, zone: str, day_start_hour: int
) -> list[date]:
    """The chat days (local dates, a day starting at `day_start_hour` in `zone`) on which the channel has messages."""
    rows = await conn.fetch(
        f"SELECT DISTINCT ((created_at AT TIME ZONE $4) - make_interval(hours => $5))::date AS day FROM chat_messages"
        f" WHERE {SUMMARY_CHANNEL} = $1 AND created_at >= $2 AND created_at < $3 ORDER BY day",
        channel_id, since, until, zone, day_start_hour,
    )
    return [row["day"] for row in rows]


async def last_chat_day_before(
    conn: Connection, channel_id: int, until: datetime, zone: str, day_start_hour: int
) -> date | None:
    """The latest chat day before `until` on which the channel has messages (None if it has none)."""
    return await conn.fetchval(
        f"SELECT ((max(created_at) AT TIME ZONE $3) - make_interval(hours => $4))::date FROM chat_messages"
        f" WHERE {SUMMARY_CHANNEL} = $1 AND created_at < $2",
        channel_id, until, zone, day_start_hour,
    )


async def messages_between(conn: Connection, channel_id: int, since: datetime, until: datetime) -> list[asyncpg.Record]:
    """A summary channel's messages in a time range, oldest first, each with the message it answers, if any:
    `answered_author_id` (NULL when it answers nothing, or a message no longer stored), `answered_stored`, and
    `answered_edited` (the answered message was edited after this one was posted)."""
    return await conn.fetch(
        "SELECT m.channel_id, m.message_id, m.author_id, m.author_name, m.is_bot, m.text, m.created_at, m.reply_to,"
        "       m.author_can_manage, m.private_thread,"
        "       m.parent_channel_id, a.author_id AS answered_author_id, a.text AS answered_text,"
        "       a.parent_channel_id AS answered_parent_id, a.message_id IS NOT NULL AS answered_stored,"
        "       coalesce(a.edited_at > m.created_at, false) AS answered_edited"
        " FROM chat_messages m LEFT JOIN chat_messages a ON a.channel_id = m.channel_id AND a.message_id = m.reply_to"
        " WHERE coalesce(m.parent_channel_id, m.channel_id) = $1 AND m.created_at >= $2 AND m.created_at < $3"
        " ORDER BY m.created_at, m.message_id",
        channel_id, since, until,
    )


async def lock_unchanged(conn: Connection, versions: Sequence[tuple[int, int, str, int | None]]) -> bool:
    """Whether each (channel, message, text, parent) is still stored as given; the rows stay locked (FOR SHARE)
    until the caller's transaction ends, so an edit or delete racing it waits, then sees what was stored."""
    if not versions:
        return True
    rows = await conn.fetch(
        "SELECT m.channel_id, m.message_id, m.text, m.parent_channel_id FROM chat_messages m"
        " JOIN unnest($1::bigint[], $2::bigint[]) AS v (channel_id, message_id)"
        "   ON m.channel_id = v.channel_id AND m.message_id = v.message_id"
        " ORDER BY m.channel_id, m.message_id FOR SHARE OF m",
        [v[0] for v in versions], [v[1] for v in versions],
    )
    found = {(row["channel_id"], row["message_id"], row["text"], row["parent_channel_id"]) for row in rows}
    return found == set(versions)


async def channels_with_messages(conn: Connection, since: datetime) -> list[asyncpg.Record]:
    return await conn.fetch(
        f"SELECT {SUMMARY_CHANNEL} AS channel_id, max(guild_id) AS guild_id FROM chat_messages"
        " WHERE created_at >= $1 GROUP BY 1 ORDER BY 1",
        since,
    )

