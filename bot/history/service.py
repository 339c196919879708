"""Chat-history recall: older channel messages in chunks, found by meaning.

Every message of a channel is stored as it arrives (the reply pipeline's `chat_messages`). Once a
message has left the context window (the last CONTEXT_MESSAGES of its channel) the background task
groups it with its neighbours into a *chunk* and embeds the chunk in the current embedding space.
A reply then finds the chunks of its channel closest to its one query embedding and adds the best
ones to the end of its prompt.

Rules (the tests hold them):
- Read-behind: a message inside the context window is never chunked, and a chunk overlapping the
  window is never recalled; the model already reads those messages.
- A chunk needs at least CHUNK_MIN_MESSAGES new messages. It closes at CHUNK_MAX_MESSAGES or
  CHUNK_MAX_TOKENS, or earlier at a pause of CHUNK_PAUSE or more (a conversation ended), once it has
  its minimum. A run of messages that has not closed yet waits for more to leave the window.
- A run that ends where an existing chunk starts closes whatever its size: that happens only when
  an edit or a delete freed the messages of a chunk, and they are chunked anew without waiting.
- Recall is per channel only: messages of one channel never show up in another (channels have
  their own permissions). A thread is its own channel.

Chunks never change: editing a message deletes the chunk it was in, and the background task
builds a new one from the messages as they are now (migrations/008_chunks_follow_messages.sql).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import numpy as np

from bot.config import Settings
from bot.db import Connection
from bot.embeddings.service import Embeddings, split_at_threshold
from bot.history import store
from bot.lexical import lexical_query
from bot.tokens import count_tokens

log = logging.getLogger(__name__)

CHUNK_MIN_MESSAGES = 5
CHUNK_MAX_MESSAGES = 12
CHUNK_MAX_TOKENS = 400
CHUNK_PAUSE = timedelta(minutes=30)
SCAN_ROWS = 400  # messages read (and locked) per chunking transaction
CHANNELS_PER_ROUND = 200


@dataclass(frozen=True)
class ChatRow:
    """A stored message as the chunker sees it."""

    message_id: int
    author_id: int
    author_name: str
    text: str
    created_at: datetime
    guild_id: int | None = None
    is_bot: bool = False
    chunked: bool = False  # already part of a chunk: it breaks runs
    in_window: bool = False  # the oldest message of the context window: only its time counts
    answered_author_id: int | None = None  # a reply: who wrote the message it answers (its words may be repeated)

    @classmethod
    def from_row(cls, row: Any) -> ChatRow:
        return cls(
            message_id=row["message_id"],
            author_id=row["author_id"],
            author_name=row["author_name"],
            text=row["text"],
            created_at=row["created_at"],
            guild_id=row["guild_id"],
            is_bot=row["is_bot"],
            chunked=row["chunk_id"] is not None,
            in_window=bool(row["in_window"]),
            answered_author_id=row.get("answered_author_id"),
        )


def chunk_people(rows: Sequence[ChatRow]) -> list[int]:
    """Whose words a chunk may hold: its authors, and the authors of the messages its replies answer. A chunk holding
    anyone blocked in its server or with privacy `full` is never recalled (docs/memory-rules.md, "Withdrawal wins")."""
    return sorted({row.author_id for row in rows} | {row.answered_author_id for row in rows if row.answered_author_id})


def chunk_line(row: ChatRow) -> str:
    """One message as a line of a chunk: `Name: text` (names on one line, so a text cannot fake a speaker)."""
    name = " ".join(row.author_name.split()) or "someone"
    return f"{name}: {row.text}"


def chunk_text(rows: Sequence[ChatRow]) -> str:
    return "\n".join(chunk_line(row) for row in rows)


def plan_chunks(rows: Sequence[ChatRow]) -> list[list[ChatRow]]:
    """Split a channel's messages (oldest first, as `store.lock_history_rows` returns them) into closed chunks.

    Pure, so the boundary rules can be tested without a database. Unclosed runs are left out: they
    wait for more messages.
    """
    chunks: list[list[ChatRow]] = []
    current: list[ChatRow] = []
    tokens = 0
    for index, row in enumerate(rows):
        if row.in_window:
            break
        if row.chunked:
            if current:  # freed by an edit or delete, bounded by a chunk: rebuild it now, whatever its size
                chunks.append(current)
            current, tokens = [], 0
            continue
        current.append(row)
        tokens += count_tokens(chunk_line(row)) + 1
        following = rows[index + 1] if index + 1 < len(rows) else None
        if len(current) < CHUNK_MIN_MESSAGES:
            continue
        paused = following is not None and following.created_at - row.created_at >= CHUNK_PAUSE
        if len(current) >= CHUNK_MAX_MESSAGES or tokens >= CHUNK_MAX_TOKENS or paused:
            chunks.append(current)
            current, tokens = [], 0
    return chunks


@dataclass(frozen=True)
class HistoryHit:
    chunk_id: int
    similarity: float
    text: str
    started_at: datetime
    ended_at: datetime
    messages: int
    first_message_id: int
    last_message_id: int
    by_text: bool = False  # found by its words (the embedder was unavailable): `similarity` is a text rank


@dataclass(frozen=True)
class HistoryOverview:
    """A channel's chunks, how many have a vector in the current space, and messages in no chunk yet."""

    chunks: int
    embedded: int
    unchunked: int


@dataclass(frozen=True)
class HistorySearch:
    """What one reply's history lookup found: `hits` at or above the threshold, best first.

    `searched` is how many chunks were scored (0: no embedded chunk outside the context window yet);
    `best_below` is the best similarity that did not make it (for receipts: "nothing relevant").
    """

    enabled: bool
    hits: list[HistoryHit]
    searched: int
    best_below: float | None


def _hit(row: Any, *, by_text: bool = False) -> HistoryHit:
    return HistoryHit(
        chunk_id=row["id"],
        similarity=float(row["similarity"]),
        text=row["text"],
        started_at=row["started_at"],
        ended_at=row["ended_at"],
        messages=row["messages"],
        first_message_id=row["first_message_id"],
        last_message_id=row["last_message_id"],
        by_text=by_text,
    )


class HistoryIndex:
    """Chunking (background) and per-reply search of older channel messages."""

    def __init__(self, pool: asyncpg.Pool, embeddings: Embeddings, settings: Settings) -> None:
        self.pool = pool
        self.embeddings = embeddings  # the current embedding space (chunks' vectors are its own)
        self.settings = settings

    # --- background: chunking ----------------------------------------------------------------

    async def chunk_pending(self) -> int:
        """Chunk every message that left its context window and can close a chunk; returns chunks made.

        Each channel is chunked in short transactions that lock the messages they read, so several
        processes (shards) never chunk a message twice, and an edit or a delete racing the chunker
        waits for it and then removes what it made.
        """
        context = self.settings.context_messages
        made = 0
        async with self.pool.acquire() as conn:
            channels = await store.channels_with_pending_history(conn, context, CHANNELS_PER_ROUND)
        for channel_id in channels:
            while True:
                async with self.pool.acquire() as conn, conn.transaction():
                    rows = [ChatRow.from_row(row) for row in await store.lock_history_rows(conn, channel_id, context, SCAN_ROWS)]
                    planned = plan_chunks(rows)
                    for chunk in planned:
                        await store.insert_history_chunk(
                            conn,
                            guild_id=chunk[0].guild_id,
                            channel_id=channel_id,
                            message_ids=[row.message_id for row in chunk],
                            author_ids=chunk_people(chunk),
                            started_at=chunk[0].created_at,
                            ended_at=chunk[-1].created_at,
                            text=chunk_text(chunk),
                        )
                made += len(planned)
                if not planned:
                    break
        if made:
            log.info("Chat history: %d new chunks", made)
        return made

    # --- per reply ----------------------------------------------------------------------------

    async def recall_enabled(self, channel_id: int, parent_channel_id: int | None = None) -> bool:
        channels = [channel_id] + ([parent_channel_id] if parent_channel_id and parent_channel_id != channel_id else [])
        async with self.pool.acquire() as conn:
            return await store.history_recall_enabled(conn, channels)

    async def set_recall(self, channel_id: int, guild_id: int | None, enabled: bool) -> None:
        async with self.pool.acquire() as conn:
            await store.set_history_recall(conn, channel_id, guild_id, enabled)

    async def recall_off_channels(self, guild_id: int) -> list[int]:
        async with self.pool.acquire() as conn:
            return await store.history_recall_off_channels(conn, guild_id)

    async def search(
        self,
        *,
        channel_id: int,
        answered_message_id: int,
        query_vector: np.ndarray,
        parent_channel_id: int | None = None,
    ) -> HistorySearch:
        """The chunks of this channel that match the reply's query embedding (never embeds anything itself)."""
        space = await self.embeddings.space_id()
        if not await self.recall_enabled(channel_id, parent_channel_id):
            return HistorySearch(enabled=False, hits=[], searched=0, best_below=None)
        if space is None:
            return HistorySearch(enabled=True, hits=[], searched=0, best_below=None)
        async with self.pool.acquire() as conn:
            rows = await store.search_history(
                conn,
                channel_id=channel_id,
                answered_message_id=answered_message_id,
                context_messages=self.settings.context_messages,
                space=space,
                vector=query_vector,
                limit=self.settings.history_max_results + 1,
            )
        kept, best_below = split_at_threshold(rows, self.settings.history_min_similarity, self.settings.history_max_results)
        return HistorySearch(enabled=True, hits=[_hit(row) for row in kept], searched=len(rows), best_below=best_below)

    async def search_by_text(
        self, *, channel_id: int, answered_message_id: int, text: str, parent_channel_id: int | None = None
    ) -> HistorySearch:
        """The text fallback, for a reply whose message could not be embedded: chunks sharing a word with it.

        Read-only like `search`, under the same rules (the channel's switch, this channel only,
        read-behind) and the same HISTORY_MAX_RESULTS. Any shared word will do, best `ts_rank` first:
        a text rank says nothing a similarity threshold could be compared with. `searched` counts the
        chunks that share a word.
        """
        if not await self.recall_enabled(channel_id, parent_channel_id):
            return HistorySearch(enabled=False, hits=[], searched=0, best_below=None)
        words = lexical_query(text).words
        if not words:
            return HistorySearch(enabled=True, hits=[], searched=0, best_below=None)
        async with self.pool.acquire() as conn:
            rows = await store.search_history_by_text(
                conn,
                channel_id=channel_id,
                answered_message_id=answered_message_id,
                context_messages=self.settings.context_messages,
                words=words,
                limit=self.settings.history_max_results,
            )
        return HistorySearch(enabled=True, hits=[_hit(row, by_text=True) for row in rows], searched=len(rows), best_below=None)

    async def overview(self, channel_id: int) -> HistoryOverview:
        """Chunks of a channel, how many are embedded in the current space, messages in no chunk yet."""
        space = await self.embeddings.space_id()
        async with self.pool.acquire() as conn:
            row = await store.history_overview(conn, channel_id, space)
        return HistoryOverview(chunks=row["chunks"], embedded=row["embedded"], unchunked=row["unchunked"])

    # --- forgetting (parts of one transaction the caller owns) ---

    async def forget_channel(self, conn: Connection, channel_id: int) -> int:
        """A deleted channel or thread: its chunks and its history-recall switch."""
        return await store.delete_channel_history(conn, channel_id)

    async def forget_guild(self, conn: Connection, guild_id: int) -> dict[str, int]:
        """The bot left a server: its chunks and switches (called before its messages go, to count the chunks)."""
        return await store.forget_guild_history(conn, guild_id)
