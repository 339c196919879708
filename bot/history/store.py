"""SQL of chat-history recall: chunks of older messages, their search, and the per-channel switch.

Only `bot.history.service` imports this module. The chunker reads `chat_messages` and sets their
`chunk_id` (the column the history's migration added); everything else about messages belongs to the
chat log.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import asyncpg
import numpy as np

from bot.db import Connection
from bot.lexical import any_word_query_cte


async def channels_with_pending_history(conn: Connection, context_messages: int, limit: int) -> list[int]:
    """Channels with a message that is older than the context window and in no chunk yet."""
    rows = await conn.fetch(
        "SELECT c.channel_id FROM (SELECT DISTINCT channel_id FROM chat_messages WHERE chunk_id IS NULL) AS c"
        " WHERE EXISTS (SELECT 1 FROM chat_messages m WHERE m.channel_id = c.channel_id AND m.chunk_id IS NULL"
        "   AND m.message_id < (SELECT w.message_id FROM chat_messages w WHERE w.channel_id = c.channel_id"
        "                       ORDER BY w.message_id DESC OFFSET $1 LIMIT 1))"
        " ORDER BY c.channel_id LIMIT $2",
        max(context_messages - 1, 0),
        limit,
    )
    return [row["channel_id"] for row in rows]


async def lock_history_rows(conn: Connection, channel_id: int, context_messages: int, limit: int) -> list[asyncpg.Record]:
    """From the oldest unchunked message before the context window on: the channel's messages, locked.

    Chunked messages in that range come too (`chunk_id` set): they break runs. The oldest message of
    the context window comes last with `in_window` true, only so a pause before it can close a chunk.
    Locking the rows (call inside a transaction) makes an edit or delete racing the chunker wait,
    then see the chunk and delete it.
    """
    return await conn.fetch(
        "WITH boundary AS (SELECT message_id FROM chat_messages WHERE channel_id = $1"
        "                  ORDER BY message_id DESC OFFSET $2 LIMIT 1),"
        " start AS (SELECT min(message_id) AS message_id FROM chat_messages"
        "           WHERE channel_id = $1 AND chunk_id IS NULL AND message_id < (SELECT message_id FROM boundary))"
        " SELECT m.message_id, m.guild_id, m.author_id, m.author_name, m.is_bot, m.text, m.created_at, m.chunk_id,"
        "        m.message_id = (SELECT message_id FROM boundary) AS in_window,"
        "        (SELECT a.author_id FROM chat_messages a WHERE a.channel_id = m.channel_id AND a.message_id = m.reply_to)"
        "          AS answered_author_id"
        " FROM chat_messages m"
        " WHERE m.channel_id = $1 AND m.message_id >= (SELECT message_id FROM start)"
        "   AND m.message_id <= (SELECT message_id FROM boundary)"
        " ORDER BY m.message_id LIMIT $3 FOR UPDATE OF m",
        channel_id,
        max(context_messages - 1, 0),
        limit,
    )


async def insert_history_chunk(
    conn: Connection,
    *,
    guild_id: int | None,
    channel_id: int,
    message_ids: Sequence[int],
    author_ids: Sequence[int],
    started_at: datetime,
    ended_at: datetime,
    text: str,
) -> int:
    """Store a chunk and mark its messages (locked by `lock_history_rows` in the same transaction)."""
    chunk_id = await conn.fetchval(
        "INSERT INTO history_chunks (guild_id, channel_id, first_message_id, last_message_id, message_ids, author_ids,"
        " started_at, ended_at, text) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING id",
        guild_id,
        channel_id,
        min(message_ids),
        max(message_ids),
        list(message_ids),
        sorted(set(author_ids)),
        started_at,
        ended_at,
        text,
    )
    await conn.execute(
        "UPDATE chat_messages SET chunk_id = $3 WHERE channel_id = $1 AND message_id = ANY ($2::bigint[]) AND chunk_id IS NULL",
        channel_id,
        list(message_ids),
        chunk_id,
    )
    return chunk_id


async def delete_channel_history(conn: Connection, channel_id: int) -> int:
    """A deleted channel or thread: its chunks and its history-recall switch (after its messages are gone)."""
    await conn.execute("DELETE FROM history_channels WHERE channel_id = $1", channel_id)
    status = await conn.execute("DELETE FROM history_chunks WHERE channel_id = $1", channel_id)
    return int(status.split()[-1])


# The oldest message of the reply's context window ($1 channel, $2 the answered message, $3 the window's
# size): chunks ending before it are outside the window. Shared by both searches (read-behind).
WINDOW_START_CTE = """window_start AS (
    SELECT min(message_id) AS message_id FROM (
        SELECT message_id FROM chat_messages WHERE channel_id = $1 AND message_id <= $2
        ORDER BY message_id DESC LIMIT $3
    ) AS w
)"""

# Withdrawal wins (docs/memory-rules.md): a chunk that may hold the words of someone blocked in its server or with
# privacy `full` (its authors, and whom its replies answer) is never recalled. Checked at every search, so a block
# or a privacy level applies at once and undoing it brings the chunks back; a deletion deletes the chunk itself.
NOT_WITHDRAWN = """NOT EXISTS (
      SELECT 1 FROM unnest(c.author_ids) AS p (user_id)
      WHERE EXISTS (SELECT 1 FROM user_settings us WHERE us.user_id = p.user_id AND us.privacy = 'full')
         OR EXISTS (SELECT 1 FROM guild_blocklist b WHERE b.guild_id = c.guild_id AND b.user_id = p.user_id)
  )"""

HISTORY_SEARCH_SQL = f"""
WITH {WINDOW_START_CTE}
SELECT c.id, c.first_message_id, c.last_message_id, cardinality(c.message_ids) AS messages, c.started_at, c.ended_at,
       c.text, 1 - (v.embedding <=> $4::vector) AS similarity
FROM history_chunks c JOIN history_chunk_vectors v ON v.chunk_id = c.id AND v.space_id = $5
WHERE c.channel_id = $1
  AND c.last_message_id < coalesce((SELECT message_id FROM window_start), $2)
  AND vector_dims(v.embedding) = vector_dims($4::vector)
  AND {NOT_WITHDRAWN}
ORDER BY similarity DESC, c.id
LIMIT $6
"""


async def search_history(
    conn: Connection,
    *,
    channel_id: int,
    answered_message_id: int,
    context_messages: int,
    space: int,
    vector: np.ndarray,
    limit: int,
) -> list[asyncpg.Record]:
    """The chunks of a channel closest to `vector`, best first, none overlapping the context window (read-behind).

    The window is recomputed here rather than trusted from chunking time: deleting recent messages
    pulls older (already chunked) ones back into it, and those must not come twice.
    """
    return await conn.fetch(HISTORY_SEARCH_SQL, channel_id, answered_message_id, context_messages, vector, space, limit)


HISTORY_TEXT_SEARCH_SQL = f"""
WITH {WINDOW_START_CTE},
{any_word_query_cte('$4')}
SELECT c.id, c.first_message_id, c.last_message_id, cardinality(c.message_ids) AS messages, c.started_at, c.ended_at,
       c.text, ts_rank(c.terms, q.any_word) AS similarity
FROM history_chunks c, query q
WHERE c.channel_id = $1
  AND c.last_message_id < coalesce((SELECT message_id FROM window_start), $2)
  AND c.terms @@ q.any_word
  AND {NOT_WITHDRAWN}
ORDER BY similarity DESC, c.id
LIMIT $5
"""


async def search_history_by_text(
    conn: Connection, *, channel_id: int, answered_message_id: int, context_messages: int, words: str, limit: int
) -> list[asyncpg.Record]:
    """The chunks of a channel holding any of `words`, best `ts_rank` first (`similarity`), none in the window.

    The text fallback of `search_history`, for a reply whose message could not be embedded: the same
    channel and the same read-behind rule, with the words instead of the vector.
    """
    return await conn.fetch(HISTORY_TEXT_SEARCH_SQL, channel_id, answered_message_id, context_messages, words, limit)


async def set_history_recall(conn: Connection, channel_id: int, guild_id: int | None, enabled: bool) -> None:
    await conn.execute(
        "INSERT INTO history_channels (channel_id, guild_id, recall_enabled) VALUES ($1, $2, $3)"
        " ON CONFLICT (channel_id) DO UPDATE SET recall_enabled = EXCLUDED.recall_enabled, updated_at = now()",
        channel_id,
        guild_id,
        enabled,
    )


async def history_recall_enabled(conn: Connection, channel_ids: Sequence[int]) -> bool:
    """The switch of the first of `channel_ids` that has one (a thread, then its parent); on by default."""
    rows = await conn.fetch(
        "SELECT channel_id, recall_enabled FROM history_channels WHERE channel_id = ANY ($1::bigint[])", list(channel_ids)
    )
    found = {row["channel_id"]: row["recall_enabled"] for row in rows}
    return next((found[channel] for channel in channel_ids if channel in found), True)


async def history_recall_off_channels(conn: Connection, guild_id: int) -> list[int]:
    rows = await conn.fetch(
        "SELECT channel_id FROM history_channels WHERE guild_id = $1 AND NOT recall_enabled ORDER BY channel_id", guild_id
    )
    return [row["channel_id"] for row in rows]


async def history_overview(conn: Connection, channel_id: int, space: int | None) -> asyncpg.Record:
    """Chunks of a channel, how many have a vector in `space`, and how many messages are in no chunk yet."""
    row = await conn.fetchrow(
        "SELECT (SELECT count(*) FROM history_chunks WHERE channel_id = $1) AS chunks,"
        " (SELECT count(*) FROM history_chunks c JOIN history_chunk_vectors v ON v.chunk_id = c.id AND v.space_id = $2"
        "  WHERE c.channel_id = $1) AS embedded,"
        " (SELECT count(*) FROM chat_messages WHERE channel_id = $1 AND chunk_id IS NULL) AS unchunked",
        channel_id,
        space if space is not None else -1,
    )
    assert row is not None  # the statement always returns its row
    return row


async def forget_guild_history(conn: Connection, guild_id: int) -> dict[str, int]:
    """The bot left a server: its chunks and history-recall switches go (before its messages do)."""

    def count(status: str) -> int:
        return int(status.split()[-1])

    return {
        "history_chunks": count(await conn.execute("DELETE FROM history_chunks WHERE guild_id = $1", guild_id)),
        "history_channels": count(await conn.execute("DELETE FROM history_channels WHERE guild_id = $1", guild_id)),
    }
