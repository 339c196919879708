"""SQL of merges: the memories of a full list that may be joined, and the join itself.

Functions take a connection so the memory service owns the transaction: a merge rewrites one memory, moves
the other's versions and sources onto it and deletes it, all in the transaction of the save that needed
the room. No other package imports this module.
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Any

import numpy as np

from bot.db import Connection
from bot.memory.hiding_sql import VISIBILITY_CTES
from bot.memory.models import Memory, MemoryList, Source
from bot.memory.store import MEMORY_COLUMNS, SEEN_IN_CONVERSATION

_M_COLUMNS = ", ".join(f"m.{column.strip()}" for column in MEMORY_COLUMNS.split(","))


def _vector(found: Any) -> np.ndarray:
    return np.asarray(found.to_numpy() if hasattr(found, "to_numpy") else found, dtype=np.float32)


async def merge_candidates(
    conn: Connection, memory_list: MemoryList, owner: int, space: int, where: list[Any], *, lock: bool
) -> list[tuple[Memory, np.ndarray]]:
    """The memories of one list that a merge may join, with their vectors in `space`: unprotected, tied to the
    list's persona (a Global memory is protected), and, for a save made in a conversation (`where` from
    `store.seen_in`), only those that conversation can see. `lock`: inside the save's transaction."""
    if memory_list == MemoryList.SERVER:
        scope = "m.list = 'server' AND m.guild_id = $7 AND m.persona_id = $2"
    else:
        scope = "m.list = 'personal' AND m.owner_id = $7 AND m.persona_id = $2"
    rows = await conn.fetch(
        f"WITH {VISIBILITY_CTES} SELECT {_M_COLUMNS}, v.embedding"
        " FROM memories m JOIN memory_vectors v ON v.memory_id = m.id AND v.space_id = $8 CROSS JOIN guild"
        f" WHERE {scope} AND NOT m.protected AND {SEEN_IN_CONVERSATION} ORDER BY m.id"
        + (" FOR UPDATE OF m" if lock else ""),
        *where,
        owner,
        space,
    )
    return [(Memory.from_row(row), _vector(row["embedding"])) for row in rows]


async def absorb(
    conn: Connection, kept: Memory, absorbed: Memory, *, text: str, source: Source, now: datetime, today: date
) -> Memory:
    """Join `absorbed` into `kept`: `kept` gets `text`, `absorbed`'s versions and the messages its text came from,
    and the counter of whichever part was used more recently (a merge is not a use); `absorbed` is deleted.

    The caller keeps both old texts as versions first. The old vectors describe the old text, so they go.
    """
    await conn.execute("UPDATE memory_versions SET memory_id = $1 WHERE memory_id = $2", kept.id, absorbed.id)
    await conn.execute(
        "INSERT INTO memory_sources (memory_id, channel_id, message_id, author_id)"
        " SELECT $1, channel_id, message_id, author_id FROM memory_sources WHERE memory_id = $2 ON CONFLICT DO NOTHING",
        kept.id,
        absorbed.id,
    )
    await conn.execute("DELETE FROM memories WHERE id = $1", absorbed.id)
    await conn.execute("DELETE FROM memory_vectors WHERE memory_id = $1", kept.id)
    row = await conn.fetchrow(
        "UPDATE memories SET text = $2, source = $3, days_unused = least(days_unused, $4),"
        " last_used_at = CASE WHEN last_used_at IS NULL THEN $5 WHEN $5::timestamptz IS NULL THEN last_used_at"
        "   ELSE greatest(last_used_at, $5) END,"
        " last_aged_on = greatest(last_aged_on, $6), desk_changed_on = $7, updated_at = $8"
        f" WHERE id = $1 RETURNING {MEMORY_COLUMNS}",
        kept.id,
        text,
        source.value,
        absorbed.days_unused,
        absorbed.last_used_at,
        absorbed.last_aged_on,
        today,
        now,
    )
    assert row is not None, "the kept memory is locked by the save's transaction"
    return Memory.from_row(row)
