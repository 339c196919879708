"""SQL of memory versions: the texts a memory had before each change (migrations/011_memory_versions.sql).

Functions take a connection so the memory service owns the transaction: a version is written in the
same transaction as the change that replaces its text. No other package imports this module.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

import asyncpg

from bot.db import Connection
from bot.memory.models import Memory, MemoryVersion, Source, VersionVia

VERSION_COLUMNS = (
    "id, memory_id, text, tags, source, written_by, written_at, replaced_by, replaced_via, replaced_at, reason"
)


def _version(row: asyncpg.Record) -> MemoryVersion:
    return MemoryVersion(
        id=row["id"],
        memory_id=row["memory_id"],
        text=row["text"],
        tags=tuple(row["tags"]),
        source=Source(row["source"]),
        written_by=row["written_by"],
        written_at=row["written_at"],
        replaced_by=row["replaced_by"],
        replaced_via=VersionVia(row["replaced_via"]),
        replaced_at=row["replaced_at"],
        reason=row["reason"],
    )


async def keep_version(
    conn: Connection, memory: Memory, *, replaced_by: int | None, via: VersionVia, reason: str, at: datetime
) -> MemoryVersion:
    """Keep `memory`'s current text as a version, before the caller replaces it in the same transaction.

    Who wrote the current text and when: whoever replaced the previous version (the latest one), or,
    for a memory never changed, whoever saved it.
    """
    row = await conn.fetchrow(
        "WITH latest AS (SELECT replaced_by, replaced_at FROM memory_versions WHERE memory_id = $1 ORDER BY id DESC LIMIT 1)"
        " INSERT INTO memory_versions (memory_id, text, tags, source, written_by, written_at, replaced_by, replaced_via,"
        "  replaced_at, reason)"
        " SELECT $1, $2, $3, $4,"
        "  CASE WHEN EXISTS (SELECT 1 FROM latest) THEN (SELECT replaced_by FROM latest) ELSE $5::bigint END,"
        "  coalesce((SELECT replaced_at FROM latest), $6), $7, $8, $9, $10"
        f" RETURNING {VERSION_COLUMNS}",
        memory.id,
        memory.text,
        list(memory.tags),
        memory.source.value,
        memory.created_by,
        memory.created_at,
        replaced_by,
        via.value,
        at,
        reason[:300],
    )
    assert row is not None  # the statement always returns its row
    return _version(row)


async def versions_of(conn: Connection, memory_id: int, *, offset: int = 0, limit: int = 1000) -> list[MemoryVersion]:
    """A memory's versions, newest first."""
    rows = await conn.fetch(
        f"SELECT {VERSION_COLUMNS} FROM memory_versions WHERE memory_id = $1 ORDER BY id DESC OFFSET $2 LIMIT $3",
        memory_id,
        offset,
        limit,
    )
    return [_version(row) for row in rows]


async def count_versions(conn: Connection, memory_id: int) -> int:
    return await conn.fetchval("SELECT count(*) FROM memory_versions WHERE memory_id = $1", memory_id)


async def get_version(conn: Connection, version_id: int) -> MemoryVersion | None:
    row = await conn.fetchrow(f"SELECT {VERSION_COLUMNS} FROM memory_versions WHERE id = $1", version_id)
    return _version(row) if row else None


async def versions_of_memories(conn: Connection, memory_ids: Iterable[int]) -> dict[int, list[MemoryVersion]]:
    """Versions of many memories (for exports), newest first for each."""
    rows = await conn.fetch(
        f"SELECT {VERSION_COLUMNS} FROM memory_versions WHERE memory_id = ANY ($1::bigint[]) ORDER BY memory_id, id DESC",
        sorted(set(memory_ids)),
    )
    found: dict[int, list[MemoryVersion]] = {}
    for row in rows:
        found.setdefault(row["memory_id"], []).append(_version(row))
    return found


async def forget_user_versions(conn: Connection, user_id: int) -> int:
    """A user's part of delete-my-data among versions (inside the caller's transaction).

    The versions of their personal memories go with the memories (ON DELETE CASCADE); here go the texts they
    wrote in other memories' histories, and their name leaves the versions they replaced.
    """
    status = await conn.execute("DELETE FROM memory_versions WHERE written_by = $1", user_id)
    await conn.execute("UPDATE memory_versions SET replaced_by = NULL WHERE replaced_by = $1", user_id)
    return int(status.split()[-1])


async def current_texts(
    conn: Connection, texts: Iterable[str], guild_id: int | None, owner_ids: Iterable[int]
) -> dict[str, str]:
    """For each of `texts` that is an earlier text of a memory (of this server's list, or of one of `owner_ids`),
    the memory's text now: what a fact became after its corrections."""
    rows = await conn.fetch(
        "SELECT DISTINCT ON (v.text) v.text AS old, m.text AS now FROM memory_versions v JOIN memories m ON m.id = v.memory_id"
        " WHERE v.text = ANY ($1::text[]) AND ((m.list = 'server' AND m.guild_id = $2)"
        "   OR (m.list = 'personal' AND m.owner_id = ANY ($3::bigint[])))"
        " ORDER BY v.text, v.id DESC",
        sorted(set(texts)),
        guild_id,
        sorted(set(owner_ids)),
    )
    return {row["old"]: row["now"] for row in rows if row["old"] != row["now"]}
