"""SQL of memories, their vectors and the lists the commands show.

Functions take a connection so the memory service (`bot.memory`) owns the transaction; no other
package imports this module. The per-reply search statement is in `search_store`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from datetime import date, datetime
from typing import Any

import asyncpg
import numpy as np

from bot.db import Connection
from bot.memory.hiding_sql import SEARCHABLE_LISTS, VISIBILITY_CTES, not_hidden
from bot.memory.models import Conversation, Memory, MemoryList, Source
from bot.memory.visibility import context_words

MEMORY_COLUMNS = (
    "id, list, guild_id, owner_id, persona_id, text, tags, channel_ids, source, protected,"
    " days_unused, last_aged_on, last_used_at, created_by, created_at, updated_at, desk_changed_on"
)




# A text as duplicates are compared: case, spacing and end punctuation do not make a new fact.
NORMALIZED_TEXT_SQL = "lower(regexp_replace(btrim(m.text, ' .!?'), '\\s+', ' ', 'g'))"


def normalized_text(text: str) -> str:
    """The same normalisation as NORMALIZED_TEXT_SQL, for the text being saved."""
    return " ".join(text.strip(" .!?").split()).lower()


def text_hash(text: str) -> str:
    """Identifies the text a vector was computed from."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


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


async def count_memories(conn: Connection) -> int:
    return await conn.fetchval("SELECT count(*) FROM memories")


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


FORGET_ORDER = "ORDER BY m.last_used_at ASC NULLS FIRST, m.created_at, m.id"

# What a save in a conversation may show the model or change: the hiding rules of the reply's search
# (bot/memory/hiding_sql.py), whose parameters $1-$5 every statement below keeps; $6 says whether they apply
# (a command sees its whole list). Wrap a statement on `memories m` that joins `guild`.
SEEN_IN_CONVERSATION = f"(NOT $6::boolean OR (({SEARCHABLE_LISTS}) AND {not_hidden('m')}))"


def seen_in(conversation: Conversation | None, guild_id: int | None, persona_id: int) -> list[Any]:
    """$1-$6 of `SEEN_IN_CONVERSATION`: where a save happens, and whether its hiding rules apply."""
    if conversation is None:
        return [guild_id, persona_id, 0, [], [], False]
    words = context_words((*conversation.context_texts, conversation.text))
    return [guild_id, persona_id, conversation.channel_id, list(conversation.participants), words, True]


async def forgettable_memory(
    conn: Connection,
    memory_list: MemoryList,
    owner: int,
    dormant_after: int,
    exclude: Sequence[int],
    where: list[Any],
) -> Memory | None:
    """The memory forgotten first in a full list (a server's, `owner` = the guild, or a personal list under the
    persona of `where`, tied to it or Global): dormant, unprotected, never or least recently matched, and, for a save
    made in a conversation (`where` from `seen_in`), one that conversation can see."""
    scope = "m.list = 'server' AND m.guild_id = $7" if memory_list == MemoryList.SERVER else (
        "m.list = 'personal' AND m.owner_id = $7 AND (m.persona_id = $2 OR m.persona_id IS NULL)"
    )
    if memory_list == MemoryList.SERVER:
        scope += " AND m.persona_id = $2"
    row = await conn.fetchrow(
        f"WITH {VISIBILITY_CTES} SELECT {_m_columns()} FROM memories m, guild WHERE {scope}"
        f" AND NOT m.protected AND m.days_unused >= $8 AND NOT (m.id = ANY ($9::bigint[])) AND {SEEN_IN_CONVERSATION}"
        f" {FORGET_ORDER} LIMIT 1 FOR UPDATE OF m",
        *where,
        owner,
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
        " days_unused, last_aged_on, created_by, created_at, updated_at, desk_changed_on)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 0, $10, $11, $12, $12, $10)"
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
    assert row is not None  # the statement always returns its row
    return Memory.from_row(row)


async def update_memory_text(
    conn: Connection, memory_id: int, *, text: str, source: Source, protected: bool, now: datetime, today: date
) -> Memory:
    """Replace the text; old vectors describe the old text, so they go. The counter restarts."""
    await conn.execute("DELETE FROM memory_vectors WHERE memory_id = $1", memory_id)
    row = await conn.fetchrow(
        "UPDATE memories SET text = $2, source = $3, protected = $4, days_unused = 0, last_aged_on = $5, desk_changed_on = $5,"
        f" updated_at = $6 WHERE id = $1 RETURNING {MEMORY_COLUMNS}",
        memory_id,
        text,
        source.value,
        protected,
        today,
        now,
    )
    assert row is not None  # the statement always returns its row
    return Memory.from_row(row)


async def delete_memories(conn: Connection, memory_ids: Sequence[int]) -> int:
    status = await conn.execute("DELETE FROM memories WHERE id = ANY ($1::bigint[])", list(memory_ids))
    return int(status.split()[-1])


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


async def delete_list(conn: Connection, where: str, args: Sequence[Any]) -> list[int]:
    """Delete a list's memories; returns their ids."""
    return [row["id"] for row in await conn.fetch(f"DELETE FROM memories m WHERE {where} RETURNING m.id", *args)]


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
        " days_unused, last_aged_on, created_by, created_at, updated_at, desk_changed_on)"
        " SELECT $2, $3, $4, x.persona_id, x.text, x.tags, x.channel_ids, 'import', $2 = 'personal' AND x.persona_id IS NULL,"
        " 0, $5, $6, $7, $7, $5"
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
    assert row is not None  # the statement always returns its row
    return Memory.from_row(row)


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


async def forget_user_memories(conn: Connection, user_id: int) -> dict[str, int]:
    """A user's part of delete-my-data among memories (inside the caller's transaction).

    Personal memories go with their vectors (ON DELETE CASCADE); server memories the user added
    stay (they belong to the server) but no longer name their author.
    """
    gone = await conn.fetch("DELETE FROM memories WHERE list = 'personal' AND owner_id = $1 RETURNING id", user_id)
    authored = await conn.execute("UPDATE memories SET created_by = NULL WHERE created_by = $1", user_id)
    return {"personal_memories": len(gone), "authored_server_memories": int(authored.split()[-1])}


async def memories_by_id(conn: Connection, memory_ids: Iterable[int]) -> list[Memory]:
    rows = await conn.fetch(
        f"SELECT {MEMORY_COLUMNS} FROM memories WHERE id = ANY ($1::bigint[]) ORDER BY id", sorted(set(memory_ids))
    )
    return [Memory.from_row(row) for row in rows]


async def closest_in_list(
    conn: Connection,
    *,
    memory_list: MemoryList,
    owner_id: int | None,
    normalized: str,
    space: int | None,
    vector: np.ndarray | None,
    where: list[Any],
    limit: int = 3,
) -> list[tuple[Memory, bool, float | None]]:
    """The memories of one list closest to a new text: (memory, same text after normalisation, cosine or None).

    The list is the one a save lands in: a server's persona list, or a user's personal memories here (tied to
    this persona, and Global). The same text comes first, then the highest cosine in `space`. `where` (from
    `seen_in`) keeps, for a save made in a conversation, only what that conversation may see: the model is shown
    these, and may change them.
    """
    if memory_list == MemoryList.SERVER:
        scope = "m.list = 'server' AND m.guild_id = $1 AND m.persona_id = $2"
    else:
        scope = "m.list = 'personal' AND m.owner_id = (SELECT id FROM owner) AND (m.persona_id IS NULL OR m.persona_id = $2)"
    rows = await conn.fetch(
        f"WITH {VISIBILITY_CTES}, owner AS (SELECT $7::bigint AS id)"
        f" SELECT {_m_columns()}, {NORMALIZED_TEXT_SQL} = $8 AS same_text,"
        "  CASE WHEN $10::vector IS NULL OR v.embedding IS NULL OR vector_dims(v.embedding) <> vector_dims($10::vector)"
        "       THEN NULL ELSE 1 - (v.embedding <=> $10::vector) END AS similarity"
        " FROM memories m LEFT JOIN memory_vectors v ON v.memory_id = m.id AND v.space_id = $9 CROSS JOIN guild"
        f" WHERE {scope} AND {SEEN_IN_CONVERSATION} ORDER BY same_text DESC, similarity DESC NULLS LAST, m.id LIMIT $11",
        *where,
        owner_id,
        normalized,
        space,
        vector,
        limit,
    )
    return [(Memory.from_row(row), bool(row["same_text"]), row["similarity"]) for row in rows]


async def count_as_used(conn: Connection, memory_id: int, now: datetime, today: date, dormant_after: int) -> Memory:
    """A repeated save: the memory it repeats counts as used (and, if it was in the drawer, is back on the desk)."""
    row = await conn.fetchrow(
        "UPDATE memories SET days_unused = 0, last_used_at = $2, last_aged_on = $3,"
        " desk_changed_on = CASE WHEN days_unused >= $4 THEN $3 ELSE desk_changed_on END"
        f" WHERE id = $1 RETURNING {MEMORY_COLUMNS}",
        memory_id,
        now,
        today,
        dormant_after,
    )
    assert row is not None  # the statement always returns its row
    return Memory.from_row(row)


async def vector_of(conn: Connection, memory_id: int, space: int) -> np.ndarray | None:
    """A memory's vector in `space`, or None while it waits for one."""
    found = await conn.fetchval("SELECT embedding FROM memory_vectors WHERE memory_id = $1 AND space_id = $2", memory_id, space)
    if found is None:
        return None
    return np.asarray(found.to_numpy() if hasattr(found, "to_numpy") else found, dtype=np.float32)


async def set_memory_sources(conn: Connection, memory_id: int, sources: Sequence[tuple[int, int, int]]) -> None:
    """The (channel, message, author) a memory's text came from (day-end notes), replacing what was recorded."""
    await conn.execute("DELETE FROM memory_sources WHERE memory_id = $1", memory_id)
    if sources:
        await conn.execute(
            "INSERT INTO memory_sources (memory_id, channel_id, message_id, author_id)"
            " SELECT $1, c, m, a FROM unnest($2::bigint[], $3::bigint[], $4::bigint[]) AS s (c, m, a) ON CONFLICT DO NOTHING",
            memory_id,
            [source[0] for source in sources],
            [source[1] for source in sources],
            [source[2] for source in sources],
        )
