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
import json
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


# --- chat pipeline ---
# The reply pipeline's tables (migrations/002_chat.sql): the per-channel context window, the names
# personal memories are labelled with, personas and always-on lore, and reply receipts.

CHAT_MESSAGE_COLUMNS = (
    "channel_id, message_id, guild_id, author_id, author_name, is_bot, text, reply_to, mention_ids, created_at, edited_at"
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
) -> bool:
    """Store a message once; a second delivery (gateway resume, history backfill) changes nothing.

    Returns whether the message was new. The author's latest display name is kept alongside.
    """
    status = await conn.execute(
        f"INSERT INTO chat_messages ({CHAT_MESSAGE_COLUMNS})"
        " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, NULL) ON CONFLICT (channel_id, message_id) DO NOTHING",
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
    )
    await remember_user_name(conn, author_id, author_name)
    return status.endswith(" 1")


async def remember_user_name(conn: Connection, user_id: int, name: str) -> None:
    await conn.execute(
        "INSERT INTO chat_users (user_id, name) VALUES ($1, $2)"
        " ON CONFLICT (user_id) DO UPDATE SET name = EXCLUDED.name, updated_at = now() WHERE chat_users.name <> EXCLUDED.name",
        user_id,
        name,
    )


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
    """Everything the pipeline stored about one user (/privacy delete-my-data): their messages and name."""
    status = await conn.execute("DELETE FROM chat_messages WHERE author_id = $1", user_id)
    await conn.execute("DELETE FROM chat_users WHERE user_id = $1", user_id)
    return int(status.split()[-1])


async def has_chat_messages(conn: Connection, channel_id: int) -> bool:
    return bool(await conn.fetchval("SELECT EXISTS (SELECT 1 FROM chat_messages WHERE channel_id = $1)", channel_id))


async def context_window(conn: Connection, channel_id: int, up_to_message_id: int, limit: int) -> list[asyncpg.Record]:
    """The last `limit` messages of a channel up to and including `up_to_message_id`, oldest first."""
    return await conn.fetch(
        f"SELECT * FROM (SELECT {CHAT_MESSAGE_COLUMNS} FROM chat_messages"
        "   WHERE channel_id = $1 AND message_id <= $2 ORDER BY message_id DESC LIMIT $3) AS latest"
        " ORDER BY message_id",
        channel_id,
        up_to_message_id,
        limit,
    )


async def reply_trigger_facts(
    conn: Connection, guild_id: int | None, author_id: int, channel_ids: Sequence[int]
) -> asyncpg.Record:
    """In one round trip: the persona's name, whether a channel replies to everything, whether the author is blocked.

    A server whose persona does not exist yet answers to the default persona's name (it will be created from it).
    """
    return await conn.fetchrow(
        "SELECT coalesce((SELECT name FROM personas WHERE guild_id = $1),"
        "                (SELECT name FROM personas WHERE guild_id IS NULL)) AS persona_name,"
        " coalesce((SELECT auto_reply_channel_ids && $3::bigint[] FROM guild_settings WHERE guild_id = $1), false)"
        "   AS auto_reply,"
        " EXISTS (SELECT 1 FROM guild_blocklist WHERE guild_id = $1 AND user_id = $2) AS blocked",
        guild_id,
        author_id,
        list(channel_ids),
    )


def _persona_from_row(row: asyncpg.Record) -> dict[str, Any]:
    attributes = row["attributes"]
    if isinstance(attributes, str):  # jsonb arrives as text unless a codec is registered
        attributes = json.loads(attributes)
    return {"id": row["id"], "guild_id": row["guild_id"], "name": row["name"], "prompt": row["prompt"], "attributes": attributes}


async def get_persona(conn: Connection, persona_id: int) -> dict[str, Any] | None:
    row = await conn.fetchrow("SELECT id, guild_id, name, prompt, attributes FROM personas WHERE id = $1", persona_id)
    return _persona_from_row(row) if row else None


async def update_persona(
    conn: Connection,
    persona_id: int,
    *,
    name: str | None = None,
    prompt: str | None = None,
    attributes: dict[str, str] | None = None,
) -> dict[str, Any] | None:
    """Change the given fields of a persona (None leaves a field as it is)."""
    row = await conn.fetchrow(
        "UPDATE personas SET name = coalesce($2, name), prompt = coalesce($3, prompt),"
        " attributes = coalesce($4::text::jsonb, attributes) WHERE id = $1"
        " RETURNING id, guild_id, name, prompt, attributes",
        persona_id,
        name,
        prompt,
        None if attributes is None else json.dumps(attributes, ensure_ascii=False, sort_keys=True),
    )
    return _persona_from_row(row) if row else None


async def sync_default_persona(conn: Connection, name: str, prompt: str) -> None:
    """The default persona (DMs, template for new servers) follows DEFAULT_PERSONA_NAME/PROMPT."""
    await conn.execute(
        "UPDATE personas SET name = $1, prompt = $2 WHERE guild_id IS NULL AND (name, prompt) IS DISTINCT FROM ($1, $2)",
        name,
        prompt,
    )


async def add_lore(conn: Connection, persona_id: int, text: str, created_by: int | None) -> asyncpg.Record:
    return await conn.fetchrow(
        "INSERT INTO lore_entries (persona_id, text, created_by) VALUES ($1, $2, $3) RETURNING id, persona_id, text, created_at",
        persona_id,
        text,
        created_by,
    )


async def list_lore(conn: Connection, persona_id: int) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT id, persona_id, text, created_at FROM lore_entries WHERE persona_id = $1 ORDER BY id", persona_id
    )


async def delete_lore(conn: Connection, persona_id: int, lore_id: int) -> bool:
    status = await conn.execute("DELETE FROM lore_entries WHERE persona_id = $1 AND id = $2", persona_id, lore_id)
    return status.endswith(" 1")


RECEIPTS_KEPT_PER_CHANNEL = 200


async def save_receipt(
    conn: Connection,
    *,
    guild_id: int | None,
    channel_id: int,
    message_id: int,
    head_hash: str,
    receipt: dict[str, Any],
    created_at: datetime,
) -> None:
    """Store a reply's receipt, keeping only the latest ones of the channel."""
    await conn.execute(
        "INSERT INTO reply_receipts (guild_id, channel_id, message_id, head_hash, receipt, created_at)"
        " VALUES ($1, $2, $3, $4, $5::text::jsonb, $6)",
        guild_id,
        channel_id,
        message_id,
        head_hash,
        json.dumps(receipt, ensure_ascii=False),
        created_at,
    )
    await conn.execute(
        "DELETE FROM reply_receipts WHERE channel_id = $1 AND id < ("
        " SELECT id FROM reply_receipts WHERE channel_id = $1 ORDER BY id DESC OFFSET $2 LIMIT 1)",
        channel_id,
        RECEIPTS_KEPT_PER_CHANNEL - 1,
    )


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


# --- commands ---------------------------------------------------------------------------------
# SQL of the slash commands (bot/memory/manage.py): lists with paging, search, import/export,
# stats and privacy. A "list filter" is a WHERE fragment for one memory list
# (a server's list, or some of a user's personal lists) with its own numbered parameters.

LIST_SCOPES = ("all", "global", "persona")


def list_filter(
    memory_list: MemoryList, *, guild_id: int | None, owner_id: int | None, persona_id: int, scope: str = "all", start: int = 1
) -> tuple[str, list[Any]]:
    """WHERE fragment (on alias `m`) and its arguments, numbered from `$start`.

    Server list: the server's memories of its persona. Personal lists, by `scope`: `all` = Global
    plus those tied to `persona_id` (what the bot can use here), `global`, or `persona`.
    """
    if memory_list == MemoryList.SERVER:
        return f"m.list = 'server' AND m.guild_id = ${start} AND m.persona_id = ${start + 1}", [guild_id, persona_id]
    if scope not in LIST_SCOPES:
        raise ValueError(f"unknown scope {scope!r}")
    owner = f"m.list = 'personal' AND m.owner_id = ${start}"
    if scope == "global":
        return f"{owner} AND m.persona_id IS NULL", [owner_id]
    if scope == "persona":
        return f"{owner} AND m.persona_id = ${start + 1}", [owner_id, persona_id]
    return f"{owner} AND (m.persona_id = ${start + 1} OR m.persona_id IS NULL)", [owner_id, persona_id]


def _has_vector(space_param: str) -> str:
    return f"EXISTS (SELECT 1 FROM memory_vectors v WHERE v.memory_id = m.id AND v.space_id = {space_param}) AS has_vector"


def _m_columns() -> str:
    return ", ".join(f"m.{column.strip()}" for column in MEMORY_COLUMNS.split(","))


def like_pattern(text: str) -> str:
    """`%text%` for ILIKE with the wildcards of `text` escaped (backslash is the escape)."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


async def count_list(conn: Connection, where: str, args: Sequence[Any]) -> int:
    return await conn.fetchval(f"SELECT count(*) FROM memories m WHERE {where}", *args)


async def page_of_list(
    conn: Connection, where: str, args: Sequence[Any], *, space: int | None, offset: int, limit: int
) -> list[tuple[Memory, bool]]:
    """One page of a list, oldest first (ids are stable, so pages do not shift while you read)."""
    n = len(args)
    rows = await conn.fetch(
        f"SELECT {_m_columns()}, {_has_vector(f'${n + 1}')} FROM memories m WHERE {where}"
        f" ORDER BY m.id OFFSET ${n + 2} LIMIT ${n + 3}",
        *args,
        space if space is not None else -1,
        offset,
        limit,
    )
    return [(Memory.from_row(row), row["has_vector"]) for row in rows]


async def semantic_search_list(
    conn: Connection, where: str, args: Sequence[Any], *, space: int, vector: np.ndarray, limit: int
) -> list[tuple[Memory, float]]:
    """The memories of a list closest to `vector` (cosine); read-only, so searching never resets a counter."""
    n = len(args)
    rows = await conn.fetch(
        f"SELECT {_m_columns()}, 1 - (v.embedding <=> ${n + 2}::vector) AS similarity"
        f" FROM memories m JOIN memory_vectors v ON v.memory_id = m.id AND v.space_id = ${n + 1}"
        f" WHERE {where} AND vector_dims(v.embedding) = vector_dims(${n + 2}::vector)"
        f" ORDER BY similarity DESC, m.id LIMIT ${n + 3}",
        *args,
        space,
        vector,
        limit,
    )
    return [(Memory.from_row(row), float(row["similarity"])) for row in rows]


async def text_search_list(
    conn: Connection,
    where: str,
    args: Sequence[Any],
    *,
    text: str,
    limit: int,
    space: int | None = None,
    created_by: int | None = None,
) -> list[tuple[Memory, bool]]:
    """Memories of a list whose text contains `text` (case-insensitive), or whose id it names; newest first."""
    n = len(args)
    digits = text.strip().lstrip("#")
    rows = await conn.fetch(
        f"SELECT {_m_columns()}, {_has_vector(f'${n + 1}')} FROM memories m WHERE {where}"
        f" AND (m.text ILIKE ${n + 2} ESCAPE '\\' OR m.id = ${n + 3})"
        f" AND (${n + 4}::bigint IS NULL OR m.created_by = ${n + 4})"
        f" ORDER BY m.id DESC LIMIT ${n + 5}",
        *args,
        space if space is not None else -1,
        like_pattern(text.strip()),
        int(digits) if digits.isdigit() and len(digits) < 19 else None,
        created_by,
        limit,
    )
    return [(Memory.from_row(row), row["has_vector"]) for row in rows]


async def list_memories(conn: Connection, where: str, args: Sequence[Any]) -> list[Memory]:
    rows = await conn.fetch(f"SELECT {_m_columns()} FROM memories m WHERE {where} ORDER BY m.id", *args)
    return [Memory.from_row(row) for row in rows]


async def list_state_rows(conn: Connection, where: str, args: Sequence[Any], *, space: int | None) -> list[asyncpg.Record]:
    """text, days_unused, protected, has_vector of every memory in a list (for stats)."""
    n = len(args)
    return await conn.fetch(
        f"SELECT m.text, m.days_unused, m.protected, {_has_vector(f'${n + 1}')} FROM memories m WHERE {where} ORDER BY m.id",
        *args,
        space if space is not None else -1,
    )


async def delete_list(conn: Connection, where: str, args: Sequence[Any]) -> int:
    status = await conn.execute(f"DELETE FROM memories m WHERE {where}", *args)
    return int(status.split()[-1])


async def insert_imported(
    conn: Connection,
    entries: Sequence[dict[str, Any]],
    *,
    memory_list: MemoryList,
    guild_id: int | None,
    owner_id: int | None,
    created_by: int,
    now: datetime,
    today: date,
) -> list[int]:
    """Insert many imported memories in one statement (source `import`, counter 0; only Global ones protected).

    Each entry: text, tags, channel_ids, persona_id (None = Global). Returns ids in entry order.
    """
    payload = [
        {
            "ord": i,
            "text": e["text"],
            "tags": list(e["tags"]),
            "channel_ids": list(e["channel_ids"]),
            "persona_id": e["persona_id"],
        }
        for i, e in enumerate(entries)
    ]
    rows = await conn.fetch(
        "INSERT INTO memories (list, guild_id, owner_id, persona_id, text, tags, channel_ids, source, protected,"
        " days_unused, last_aged_on, created_by, created_at, updated_at)"
        " SELECT $2, $3, $4, x.persona_id, x.text, x.tags, x.channel_ids, 'import', $2 = 'personal' AND x.persona_id IS NULL,"
        " 0, $5, $6, $7, $7"
        " FROM jsonb_to_recordset($1::jsonb) AS x (ord int, text text, tags text[], channel_ids bigint[], persona_id bigint)"
        " ORDER BY x.ord RETURNING id",
        json.dumps(payload),
        memory_list.value,
        guild_id,
        owner_id,
        today,
        created_by,
        now,
    )
    return sorted(row["id"] for row in rows)


async def personal_sizes_all(conn: Connection, owner_id: int, also: Iterable[int]) -> dict[int, int]:
    """Size of every personal list of the owner (each persona it has memories tied to, plus `also`)."""
    personas = set(await personas_with_personal_memories(conn, owner_id)) | set(also)
    return await personal_list_sizes(conn, owner_id, personas)


async def set_memory_tags(conn: Connection, memory_id: int, tags: Sequence[str], now: datetime) -> None:
    await conn.execute("UPDATE memories SET tags = $2, updated_at = $3 WHERE id = $1", memory_id, list(tags), now)


async def set_personal_scope(conn: Connection, memory_id: int, persona_id: int | None, now: datetime) -> Memory:
    """Tie a personal memory to a persona, or make it Global; a command did it, so it is protected."""
    row = await conn.fetchrow(
        "UPDATE memories SET persona_id = $2, source = 'command', protected = true, updated_at = $3"
        f" WHERE id = $1 AND list = 'personal' RETURNING {MEMORY_COLUMNS}",
        memory_id,
        persona_id,
        now,
    )
    return Memory.from_row(row)


async def blocklist(conn: Connection, guild_id: int) -> list[tuple[int, datetime]]:
    rows = await conn.fetch("SELECT user_id, created_at FROM guild_blocklist WHERE guild_id = $1 ORDER BY created_at", guild_id)
    return [(row["user_id"], row["created_at"]) for row in rows]


# privacy: everything stored about one user ----------------------------------------------------

async def user_personal_memories(conn: Connection, user_id: int) -> list[asyncpg.Record]:
    """Every personal memory of the user, with the server its persona speaks in (NULL = DMs or Global)."""
    return await conn.fetch(
        f"SELECT {_m_columns()}, p.guild_id AS persona_guild_id, p.name AS persona_name"
        " FROM memories m LEFT JOIN personas p ON p.id = m.persona_id"
        " WHERE m.list = 'personal' AND m.owner_id = $1 ORDER BY m.id",
        user_id,
    )


async def user_authored_server_memories(conn: Connection, user_id: int) -> list[Memory]:
    rows = await conn.fetch(
        f"SELECT {_m_columns()} FROM memories m WHERE m.list = 'server' AND m.created_by = $1 ORDER BY m.id", user_id
    )
    return [Memory.from_row(row) for row in rows]


async def user_settings_row(conn: Connection, user_id: int) -> asyncpg.Record | None:
    return await conn.fetchrow("SELECT privacy, updated_at FROM user_settings WHERE user_id = $1", user_id)


async def user_blocked_in(conn: Connection, user_id: int) -> list[int]:
    rows = await conn.fetch("SELECT guild_id FROM guild_blocklist WHERE user_id = $1 ORDER BY guild_id", user_id)
    return [row["guild_id"] for row in rows]


async def user_chat_messages(conn: Connection, user_id: int) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT guild_id, channel_id, message_id, text, created_at FROM chat_messages WHERE author_id = $1"
        " ORDER BY channel_id, message_id",
        user_id,
    )


async def delete_user_data(conn: Connection, user_id: int) -> dict[str, int]:
    """Remove what is stored about a user (call inside a transaction).

    Personal memories go with their vectors (ON DELETE CASCADE); server memories the user added
    stay (they belong to the server) but no longer name their author. Blocklist entries stay:
    they are the servers' moderation decisions, not the user's data to erase. Chat messages are
    removed by `delete_user_chat_data` in the same transaction.
    """

    def count(status: str) -> int:
        return int(status.split()[-1])

    return {
        "personal_memories": count(await conn.execute("DELETE FROM memories WHERE list = 'personal' AND owner_id = $1", user_id)),
        "authored_server_memories": count(
            await conn.execute("UPDATE memories SET created_by = NULL WHERE created_by = $1", user_id)
        ),
        "settings": count(await conn.execute("DELETE FROM user_settings WHERE user_id = $1", user_id)),
    }
