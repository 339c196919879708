"""The only module that speaks SQL. Functions take a connection so callers own the transaction.

The per-reply search is a single statement (`reply_search`): visibility, similarity, the resets
of used memories, the once-a-day aging and the desk snapshot happen in one round trip and one
snapshot. Concurrency safety comes from PostgreSQL's row-level re-check: the aging UPDATE keeps
`last_aged_on < today` in its own WHERE, so when two replies race, the second re-reads the row
another reply just changed and skips it; a reset always wins because it does not depend on the
old value.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from datetime import date, datetime
from typing import Any

import asyncpg
import numpy as np

from bot.memory.embeddings import EmbeddingSpace
from bot.memory.models import GuildSettings, Memory, MemoryList, Privacy, Source

MEMORY_COLUMNS = (
    "id, list, guild_id, owner_id, persona_id, text, tags, channel_ids, source, protected,"
    " days_unused, last_aged_on, last_used_at, created_by, created_at, updated_at"
)
Connection = asyncpg.Connection | asyncpg.pool.PoolConnectionProxy


def text_hash(text: str) -> str:
    """Identifies the text a vector was computed from."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


# --- personas ---------------------------------------------------------------------------------

async def persona_for_guild(conn: Connection, guild_id: int | None, default_name: str = "Deskmate") -> int:
    """The persona of a server, created on first use; None (DMs) gives the default persona."""
    if guild_id is None:
        return await conn.fetchval("SELECT id FROM personas WHERE guild_id IS NULL")
    persona_id = await conn.fetchval("SELECT id FROM personas WHERE guild_id = $1", guild_id)
    if persona_id is None:
        persona_id = await conn.fetchval(
            "INSERT INTO personas (guild_id, name, prompt, attributes)"
            " SELECT $1, name, prompt, attributes FROM personas WHERE guild_id IS NULL"
            " ON CONFLICT (guild_id) DO NOTHING RETURNING id",
            guild_id,
        )
        if persona_id is None:  # another process created it first
            persona_id = await conn.fetchval("SELECT id FROM personas WHERE guild_id = $1", guild_id)
    return persona_id


# --- embedding spaces and vectors ---------------------------------------------------------------

async def space_id(conn: Connection, space: EmbeddingSpace) -> int:
    return await conn.fetchval(
        "INSERT INTO embedding_spaces (provider, base_url, model) VALUES ($1, $2, $3)"
        " ON CONFLICT (provider, base_url, model) DO UPDATE SET provider = EXCLUDED.provider RETURNING id",
        space.provider,
        space.base_url,
        space.model,
    )


async def store_vector(conn: Connection, memory_id: int, space: int, vector: np.ndarray, text: str) -> bool:
    """Store a vector only if the memory still has the text it was computed from."""
    status = await conn.execute(
        "INSERT INTO memory_vectors (memory_id, space_id, embedding, text_hash)"
        " SELECT id, $2, $3, $4 FROM memories WHERE id = $1 AND text = $5"
        " ON CONFLICT (memory_id, space_id) DO UPDATE SET embedding = EXCLUDED.embedding, text_hash = EXCLUDED.text_hash",
        memory_id,
        space,
        vector,
        text_hash(text),
        text,
    )
    return status.endswith(" 1")


async def memories_waiting_for_vector(conn: Connection, space: int, limit: int) -> list[tuple[int, str]]:
    rows = await conn.fetch(
        "SELECT m.id, m.text FROM memories m"
        " WHERE NOT EXISTS (SELECT 1 FROM memory_vectors v WHERE v.memory_id = m.id AND v.space_id = $1)"
        " ORDER BY m.id LIMIT $2",
        space,
        limit,
    )
    return [(row["id"], row["text"]) for row in rows]


async def count_waiting_for_vector(conn: Connection, space: int) -> int:
    return await conn.fetchval(
        "SELECT count(*) FROM memories m"
        " WHERE NOT EXISTS (SELECT 1 FROM memory_vectors v WHERE v.memory_id = m.id AND v.space_id = $1)",
        space,
    )


async def delete_stale_vectors(conn: Connection, keep_space: int) -> int:
    """Drop vectors of other spaces for memories that already have one in `keep_space`."""
    status = await conn.execute(
        "DELETE FROM memory_vectors old WHERE old.space_id <> $1"
        " AND EXISTS (SELECT 1 FROM memory_vectors new WHERE new.memory_id = old.memory_id AND new.space_id = $1)",
        keep_space,
    )
    return int(status.split()[-1])


# --- the per-reply search -------------------------------------------------------------------------

REPLY_SEARCH_SQL = f"""
WITH guild AS (
    SELECT coalesce(gs.tagging, false) AS tagging, coalesce(gs.personal_memories, true) AS personal_on
    FROM (VALUES (1)) AS one (x) LEFT JOIN guild_settings gs ON gs.guild_id = $1
),
people AS (
    SELECT p.user_id FROM unnest($4::bigint[]) AS p (user_id), guild
    WHERE ($1::bigint IS NULL OR guild.personal_on)
      AND NOT EXISTS (SELECT 1 FROM user_settings us WHERE us.user_id = p.user_id AND us.privacy = 'full')
      AND NOT EXISTS (SELECT 1 FROM guild_blocklist b WHERE b.guild_id = $1 AND b.user_id = p.user_id)
),
candidates AS (
    SELECT {MEMORY_COLUMNS} FROM memories
    WHERE list = 'server' AND guild_id = $1 AND persona_id = $2
    UNION ALL
    SELECT m.id, m.list, m.guild_id, m.owner_id, m.persona_id, m.text, m.tags, m.channel_ids, m.source,
           m.protected, m.days_unused, m.last_aged_on, m.last_used_at, m.created_by, m.created_at, m.updated_at
    FROM memories m JOIN people p ON m.owner_id = p.user_id
    WHERE m.list = 'personal' AND (m.persona_id IS NULL OR m.persona_id = $2)
),
visible AS (
    SELECT c.* FROM candidates c, guild
    WHERE (cardinality(c.channel_ids) = 0 OR $3::bigint = ANY (c.channel_ids))
      AND (NOT guild.tagging OR cardinality(c.tags) = 0 OR c.tags && $5::text[])
),
scored AS (
    SELECT v.id, 1 - (mv.embedding <=> $6::vector) AS similarity
    FROM visible v JOIN memory_vectors mv ON mv.memory_id = v.id AND mv.space_id = $7
    WHERE $6::vector IS NOT NULL AND vector_dims(mv.embedding) = vector_dims($6::vector)
),
used AS (
    SELECT id, similarity FROM scored WHERE similarity >= $8 ORDER BY similarity DESC, id LIMIT $9
),
reset AS (
    UPDATE memories m SET days_unused = 0, last_used_at = $10, last_aged_on = $11
    FROM used WHERE m.id = used.id
    RETURNING m.id
),
aged AS (
    UPDATE memories m SET days_unused = m.days_unused + 1, last_aged_on = $11
    WHERE m.id IN (SELECT id FROM scored) AND m.id NOT IN (SELECT id FROM used) AND m.last_aged_on < $11
    RETURNING m.id
)
SELECT v.*, u.similarity AS used_similarity
FROM visible v LEFT JOIN used u ON u.id = v.id
WHERE v.days_unused < $12 OR u.id IS NOT NULL
"""


async def reply_search(
    conn: Connection,
    *,
    guild_id: int | None,
    persona_id: int,
    channel_id: int,
    participants: Sequence[int],
    context_words: Sequence[str],
    query_vector: np.ndarray | None,
    space: int | None,
    min_similarity: float,
    max_used: int,
    now: datetime,
    today: date,
    desk_below_days: int,
) -> list[asyncpg.Record]:
    """Run SPEC §2 steps 2 and 4-6 in one statement and return the pre-search snapshot.

    With `query_vector` None nothing is scored or changed (failed search, decay off, no embedder).
    Returns the visible memories with `days_unused < desk_below_days` (the desk) plus the used ones;
    `used_similarity` is set on used rows. Values are as they were before this statement.
    """
    return await conn.fetch(
        REPLY_SEARCH_SQL,
        guild_id,
        persona_id,
        channel_id,
        list(participants),
        list(context_words),
        query_vector,
        space if space is not None else -1,
        min_similarity,
        max_used,
        now,
        today,
        desk_below_days,
    )


# --- memories -------------------------------------------------------------------------------------

async def lock_list(conn: Connection, key: str) -> None:
    """Serialize saves into one list across every process until the transaction ends."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", key)


async def get_memory(conn: Connection, memory_id: int, *, for_update: bool = False) -> Memory | None:
    row = await conn.fetchrow(
        f"SELECT {MEMORY_COLUMNS} FROM memories WHERE id = $1" + (" FOR UPDATE" if for_update else ""), memory_id
    )
    return Memory.from_row(row) if row else None


async def all_memories(conn: Connection) -> list[Memory]:
    return [Memory.from_row(row) for row in await conn.fetch(f"SELECT {MEMORY_COLUMNS} FROM memories ORDER BY id")]


async def count_server_list(conn: Connection, guild_id: int, persona_id: int) -> int:
    return await conn.fetchval(
        "SELECT count(*) FROM memories WHERE list = 'server' AND guild_id = $1 AND persona_id = $2", guild_id, persona_id
    )


async def personal_list_sizes(conn: Connection, owner_id: int, personas: Iterable[int]) -> dict[int, int]:
    """Size of each of the owner's personal lists: memories tied to that persona plus Global ones."""
    rows = await conn.fetch(
        "SELECT p.persona_id, (SELECT count(*) FROM memories m WHERE m.list = 'personal' AND m.owner_id = $1"
        "   AND (m.persona_id = p.persona_id OR m.persona_id IS NULL)) AS size"
        " FROM unnest($2::bigint[]) AS p (persona_id)",
        owner_id,
        sorted(set(personas)),
    )
    return {row["persona_id"]: row["size"] for row in rows}


async def personas_with_personal_memories(conn: Connection, owner_id: int) -> list[int]:
    rows = await conn.fetch(
        "SELECT DISTINCT persona_id FROM memories WHERE list = 'personal' AND owner_id = $1 AND persona_id IS NOT NULL",
        owner_id,
    )
    return [row["persona_id"] for row in rows]


FORGET_ORDER = "ORDER BY last_used_at ASC NULLS FIRST, created_at, id"


async def forgettable_server_memory(
    conn: Connection, guild_id: int, persona_id: int, dormant_after: int, exclude: Sequence[int]
) -> Memory | None:
    """The memory SPEC §3 forgets first in a full server list: dormant, unprotected, never or least recently matched."""
    row = await conn.fetchrow(
        f"SELECT {MEMORY_COLUMNS} FROM memories WHERE list = 'server' AND guild_id = $1 AND persona_id = $2"
        f" AND NOT protected AND days_unused >= $3 AND NOT (id = ANY ($4::bigint[])) {FORGET_ORDER} LIMIT 1 FOR UPDATE",
        guild_id,
        persona_id,
        dormant_after,
        list(exclude),
    )
    return Memory.from_row(row) if row else None


async def forgettable_personal_memory(
    conn: Connection, owner_id: int, persona_id: int, dormant_after: int, exclude: Sequence[int]
) -> Memory | None:
    """Same as for servers, within one personal list (tied to the persona, or Global)."""
    row = await conn.fetchrow(
        f"SELECT {MEMORY_COLUMNS} FROM memories WHERE list = 'personal' AND owner_id = $1"
        " AND (persona_id = $2 OR persona_id IS NULL)"
        f" AND NOT protected AND days_unused >= $3 AND NOT (id = ANY ($4::bigint[])) {FORGET_ORDER} LIMIT 1 FOR UPDATE",
        owner_id,
        persona_id,
        dormant_after,
        list(exclude),
    )
    return Memory.from_row(row) if row else None


async def insert_memory(
    conn: Connection,
    *,
    memory_list: MemoryList,
    guild_id: int | None,
    owner_id: int | None,
    persona_id: int | None,
    text: str,
    tags: Sequence[str],
    channel_ids: Sequence[int],
    source: Source,
    protected: bool,
    created_by: int | None,
    now: datetime,
    today: date,
) -> Memory:
    row = await conn.fetchrow(
        "INSERT INTO memories (list, guild_id, owner_id, persona_id, text, tags, channel_ids, source, protected,"
        " days_unused, last_aged_on, created_by, created_at, updated_at)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 0, $10, $11, $12, $12)"
        f" RETURNING {MEMORY_COLUMNS}",
        memory_list.value,
        guild_id,
        owner_id,
        persona_id,
        text,
        list(tags),
        list(channel_ids),
        source.value,
        protected,
        today,
        created_by,
        now,
    )
    return Memory.from_row(row)


async def update_memory_text(
    conn: Connection, memory_id: int, *, text: str, source: Source, protected: bool, now: datetime, today: date
) -> Memory:
    """Replace the text; old vectors describe the old text, so they go. The counter restarts."""
    await conn.execute("DELETE FROM memory_vectors WHERE memory_id = $1", memory_id)
    row = await conn.fetchrow(
        "UPDATE memories SET text = $2, source = $3, protected = $4, days_unused = 0, last_aged_on = $5,"
        f" updated_at = $6 WHERE id = $1 RETURNING {MEMORY_COLUMNS}",
        memory_id,
        text,
        source.value,
        protected,
        today,
        now,
    )
    return Memory.from_row(row)


async def delete_memories(conn: Connection, memory_ids: Sequence[int]) -> int:
    status = await conn.execute("DELETE FROM memories WHERE id = ANY ($1::bigint[])", list(memory_ids))
    return int(status.split()[-1])


# --- integrity (python -m bot check) ---------------------------------------------------------------

INTEGRITY_CHECKS: dict[str, str] = {
    "server list over its limit": """
        SELECT format('server %s, persona %s: %s memories (limit %s)', guild_id, persona_id, count(*), $1::int)
        FROM memories WHERE list = 'server' GROUP BY guild_id, persona_id HAVING count(*) > $1::int""",
    "personal list over its limit": """
        WITH lists AS (
            SELECT DISTINCT owner_id, persona_id FROM memories WHERE list = 'personal' AND persona_id IS NOT NULL
            UNION SELECT DISTINCT owner_id, NULL::bigint FROM memories WHERE list = 'personal'
        )
        SELECT format('user %s, persona %s: %s memories (limit %s)', l.owner_id, coalesce(l.persona_id::text, 'Global'),
                      count(m.id), $1::int)
        FROM lists l JOIN memories m ON m.list = 'personal' AND m.owner_id = l.owner_id
             AND (m.persona_id IS NULL OR m.persona_id = l.persona_id)
        GROUP BY l.owner_id, l.persona_id HAVING count(m.id) > $1::int""",
    "counter dates out of order": """
        SELECT format('memory %s: last_aged_on %s is before the day it was saved (%s) or last used (%s)',
                      id, last_aged_on, created_at::date, last_used_at::date)
        FROM memories
        WHERE last_aged_on < (created_at AT TIME ZONE 'UTC')::date
           OR (last_used_at IS NOT NULL AND last_aged_on < (last_used_at AT TIME ZONE 'UTC')::date)""",
    "aged more than once a day": """
        SELECT format('memory %s: %s days unused but only %s days since it was saved or last used',
                      id, days_unused, last_aged_on - (coalesce(last_used_at, created_at) AT TIME ZONE 'UTC')::date)
        FROM memories
        WHERE days_unused > last_aged_on - (greatest(coalesce(last_used_at, created_at), created_at) AT TIME ZONE 'UTC')::date""",
    "unprotected memory that must be protected": """
        SELECT format('memory %s: %s but not protected', id,
                      CASE WHEN persona_id IS NULL THEN 'Global' ELSE 'added or edited by a command' END)
        FROM memories WHERE NOT protected AND (source = 'command' OR (list = 'personal' AND persona_id IS NULL))""",
    "server memory under another server's persona": """
        SELECT format('memory %s: server %s but persona %s belongs to %s', m.id, m.guild_id, m.persona_id, p.guild_id)
        FROM memories m JOIN personas p ON p.id = m.persona_id
        WHERE m.list = 'server' AND p.guild_id IS DISTINCT FROM m.guild_id""",
    "vector of an old text": """
        SELECT format('memory %s: its vector in space %s was computed from another text', v.memory_id, v.space_id)
        FROM memory_vectors v JOIN memories m ON m.id = v.memory_id
        WHERE v.text_hash <> left(encode(sha256(convert_to(m.text, 'UTF8')), 'hex'), 32)""",
}


async def integrity_problems(conn: Connection, server_limit: int, personal_limit: int) -> dict[str, list[str]]:
    """Every inconsistency the rules forbid, by kind; empty lists mean the data is sound."""
    limits = {"server list over its limit": (server_limit,), "personal list over its limit": (personal_limit,)}
    found: dict[str, list[str]] = {}
    for name, sql in INTEGRITY_CHECKS.items():
        found[name] = [row[0] for row in await conn.fetch(sql, *limits.get(name, ()))]
    return found


# --- people and servers ----------------------------------------------------------------------------

async def get_privacy(conn: Connection, user_id: int) -> Privacy:
    value = await conn.fetchval("SELECT privacy FROM user_settings WHERE user_id = $1", user_id)
    return Privacy(value or "none")


async def set_privacy(conn: Connection, user_id: int, level: Privacy) -> None:
    await conn.execute(
        "INSERT INTO user_settings (user_id, privacy) VALUES ($1, $2)"
        " ON CONFLICT (user_id) DO UPDATE SET privacy = EXCLUDED.privacy, updated_at = now()",
        user_id,
        level.value,
    )


async def is_blocked(conn: Connection, guild_id: int, user_id: int) -> bool:
    return bool(
        await conn.fetchval("SELECT 1 FROM guild_blocklist WHERE guild_id = $1 AND user_id = $2", guild_id, user_id)
    )


async def set_blocked(conn: Connection, guild_id: int, user_id: int, blocked: bool) -> None:
    if blocked:
        await conn.execute(
            "INSERT INTO guild_blocklist (guild_id, user_id) VALUES ($1, $2) ON CONFLICT DO NOTHING", guild_id, user_id
        )
    else:
        await conn.execute("DELETE FROM guild_blocklist WHERE guild_id = $1 AND user_id = $2", guild_id, user_id)


GUILD_SETTING_COLUMNS = frozenset(
    {
        "notices",
        "notice_verbosity",
        "log_channel_id",
        "self_teaching",
        "member_teaching",
        "personal_memories",
        "tagging",
        "auto_reply_channel_ids",
    }
)


async def get_guild_settings(conn: Connection, guild_id: int) -> GuildSettings:
    row = await conn.fetchrow("SELECT * FROM guild_settings WHERE guild_id = $1", guild_id)
    return GuildSettings.from_row(guild_id, row)


async def update_guild_settings(conn: Connection, guild_id: int, changes: dict[str, Any]) -> GuildSettings:
    unknown = set(changes) - GUILD_SETTING_COLUMNS
    if unknown:
        raise ValueError(f"unknown server settings: {', '.join(sorted(unknown))}")
    await conn.execute("INSERT INTO guild_settings (guild_id) VALUES ($1) ON CONFLICT DO NOTHING", guild_id)
    for column, value in changes.items():  # column names come from the allow-list above
        await conn.execute(f"UPDATE guild_settings SET {column} = $2, updated_at = now() WHERE guild_id = $1", guild_id, value)
    return await get_guild_settings(conn, guild_id)
