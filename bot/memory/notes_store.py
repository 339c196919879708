"""SQL the day-end notes read: the memories a finished chat day may correct, under the hiding rules of a reply.

Only the memory package imports this module. The visibility is the per-reply search's, word for word
(`search_store.VISIBILITY_CTES`, `SEARCHABLE_LISTS`, `NOT_HIDDEN`), so a note can never correct a memory the
speakers could not have seen in that channel. Read-only: reading for notes is not a reply, no counter moves.
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from bot.db import Connection
from bot.memory.hiding_sql import SEARCHABLE_LISTS, VISIBILITY_CTES
from bot.memory.search_store import NOT_HIDDEN, ROW_COLUMNS

VISIBLE_SQL = f"""
WITH {VISIBILITY_CTES}
SELECT m.id, {ROW_COLUMNS}, v.embedding
FROM memories m CROSS JOIN guild
LEFT JOIN memory_vectors v ON v.memory_id = m.id AND v.space_id = $6
WHERE ({SEARCHABLE_LISTS}) AND {NOT_HIDDEN.replace('c.', 'm.')}
ORDER BY m.id
LIMIT $7
"""


async def visible_memories(
    conn: Connection,
    *,
    guild_id: int | None,
    persona_id: int,
    channel_id: int,
    people: Sequence[int],
    context_words: Sequence[str],
    space: int,
    limit: int,
) -> list[asyncpg.Record]:
    """Every memory a conversation of `people` in `channel_id` may see, with its vector in `space` (or NULL)."""
    return await conn.fetch(
        VISIBLE_SQL, guild_id, persona_id, channel_id, list(people), list(context_words), space, limit
    )
