"""SQL shared by the stores whose items have one vector per embedding space: history chunks and
document passages.

A search only ever reads the current space, so vectors of an old model are never searched; they are
deleted once the item has a vector in the current space.
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg
import numpy as np

from bot.db import Connection

# kind -> (item table, vector table, key column of the vector table, text to embed)
VECTOR_KINDS: dict[str, tuple[str, str, str, str]] = {
    "chunk": ("history_chunks", "history_chunk_vectors", "chunk_id", "i.text"),
    "passage": (
        "document_passages",
        "document_passage_vectors",
        "passage_id",
        "CASE WHEN i.section = '' THEN i.text ELSE i.section || E'\\n\\n' || i.text END",
    ),
}


def _kind(kind: str) -> tuple[str, str, str, str]:
    if kind not in VECTOR_KINDS:
        raise ValueError(f"unknown vector kind {kind!r}")
    return VECTOR_KINDS[kind]


async def items_waiting_for_vector(conn: Connection, kind: str, space: int, limit: int) -> list[tuple[int, str]]:
    """Chunks or passages without a vector in `space`, oldest first, with the text to embed."""
    items, vectors, key, text = _kind(kind)
    rows = await conn.fetch(
        f"SELECT i.id, {text} AS text FROM {items} i"
        f" WHERE NOT EXISTS (SELECT 1 FROM {vectors} v WHERE v.{key} = i.id AND v.space_id = $1) ORDER BY i.id LIMIT $2",
        space,
        limit,
    )
    return [(row["id"], row["text"]) for row in rows]


async def count_items_waiting(conn: Connection, kind: str, space: int) -> int:
    items, vectors, key, _ = _kind(kind)
    return await conn.fetchval(
        f"SELECT count(*) FROM {items} i WHERE NOT EXISTS (SELECT 1 FROM {vectors} v WHERE v.{key} = i.id AND v.space_id = $1)",
        space,
    )


async def store_item_vector(conn: Connection, kind: str, item_id: int, space: int, vector: np.ndarray) -> bool:
    """Store one vector if the item still exists (a chunk may be rebuilt, a document deleted, meanwhile).

    Chunks and passages never change their text (an edit deletes the chunk), so no text check is needed.
    """
    items, vectors, key, _ = _kind(kind)
    try:
        status = await conn.execute(
            f"INSERT INTO {vectors} ({key}, space_id, embedding) SELECT id, $2, $3 FROM {items} WHERE id = $1"
            f" ON CONFLICT ({key}, space_id) DO UPDATE SET embedding = EXCLUDED.embedding",
            item_id,
            space,
            vector,
        )
    except asyncpg.ForeignKeyViolationError:  # deleted between the check and the insert
        return False
    return status.endswith(" 1")


async def delete_stale_item_vectors(conn: Connection, kind: str, keep_space: int) -> int:
    """Drop vectors of other spaces for chunks or passages that already have one in `keep_space`."""
    _, vectors, key, _ = _kind(kind)
    status = await conn.execute(
        f"DELETE FROM {vectors} old WHERE old.space_id <> $1"
        f" AND EXISTS (SELECT 1 FROM {vectors} new WHERE new.{key} = old.{key} AND new.space_id = $1)",
        keep_space,
    )
    return int(status.split()[-1])


class ItemVectors:
    """The vectors of one kind of item (history chunks or document passages), for the service that owns the items.

    The background rebuild (`bot.upkeep`) drives every owner's vectors through this same interface.
    """

    def __init__(self, pool: asyncpg.Pool, kind: str) -> None:
        _kind(kind)
        self.pool = pool
        self.kind = kind

    async def waiting(self, space: int) -> int:
        async with self.pool.acquire() as conn:
            return await count_items_waiting(conn, self.kind, space)

    async def next_batch(self, space: int, limit: int) -> list[tuple[int, str]]:
        async with self.pool.acquire() as conn:
            return await items_waiting_for_vector(conn, self.kind, space, limit)

    async def store(self, space: int, vectors: Sequence[tuple[int, np.ndarray]]) -> list[int]:
        """Store vectors; returns the ids whose item was gone meanwhile (skipped)."""
        gone: list[int] = []
        async with self.pool.acquire() as conn:
            for item_id, vector in vectors:
                if not await store_item_vector(conn, self.kind, item_id, space, vector):
                    gone.append(item_id)
        return gone

    async def drop_stale(self, keep_space: int) -> int:
        async with self.pool.acquire() as conn:
            return await delete_stale_item_vectors(conn, self.kind, keep_space)
