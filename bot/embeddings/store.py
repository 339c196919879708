"""SQL of the embedding spaces, and of the vectors of history chunks and document passages.

Memories keep their vectors with their own SQL (`bot.memory.store`): a memory's text can change, so
its vector is stored with the text it was computed from, in the same transaction as the memory.

A search only ever reads the current space, so vectors of an old model are never searched; they are
deleted once the item has a vector in the current space. Only `bot.embeddings` imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg
import numpy as np

from bot.db import Connection
from bot.embeddings.providers import EmbeddingSpace


@dataclass(frozen=True)
class ItemTables:
    """Where one kind of item and its vectors live, and the text its vector is computed from."""

    items: str
    vectors: str
    key: str  # the vectors table's column naming the item
    group: str  # the items' column a fill may be limited to (one document's passages)
    text: str


ITEM_KINDS: dict[str, ItemTables] = {
    "chunk": ItemTables("history_chunks", "history_chunk_vectors", "chunk_id", "channel_id", "i.text"),
    "passage": ItemTables(
        "document_passages",
        "document_passage_vectors",
        "passage_id",
        "document_id",
        "CASE WHEN i.section = '' THEN i.text ELSE i.section || E'\\n\\n' || i.text END",
    ),
}


def tables(kind: str) -> ItemTables:
    if kind not in ITEM_KINDS:
        raise ValueError(f"unknown kind of item {kind!r}")
    return ITEM_KINDS[kind]


async def space_id(conn: Connection, space: EmbeddingSpace) -> int:
    """The id of an embedding space, created on first use."""
    return await conn.fetchval(
        "INSERT INTO embedding_spaces (provider, base_url, model) VALUES ($1, $2, $3)"
        " ON CONFLICT (provider, base_url, model) DO UPDATE SET provider = EXCLUDED.provider RETURNING id",
        space.provider,
        space.base_url,
        space.model,
    )


async def items_waiting_for_vector(
    conn: Connection, kind: str, space: int, limit: int, group: int | None = None
) -> list[tuple[int, str]]:
    """Chunks or passages without a vector in `space` (of one group, when given), oldest first, with the text to embed."""
    t = tables(kind)
    rows = await conn.fetch(
        f"SELECT i.id, {t.text} AS text FROM {t.items} i"
        f" WHERE NOT EXISTS (SELECT 1 FROM {t.vectors} v WHERE v.{t.key} = i.id AND v.space_id = $1)"
        f" AND ($3::bigint IS NULL OR i.{t.group} = $3) ORDER BY i.id LIMIT $2",
        space,
        limit,
        group,
    )
    return [(row["id"], row["text"]) for row in rows]


async def count_items_waiting(conn: Connection, kind: str, space: int) -> int:
    t = tables(kind)
    return await conn.fetchval(
        f"SELECT count(*) FROM {t.items} i"
        f" WHERE NOT EXISTS (SELECT 1 FROM {t.vectors} v WHERE v.{t.key} = i.id AND v.space_id = $1)",
        space,
    )


async def store_item_vector(conn: Connection, kind: str, item_id: int, space: int, vector: np.ndarray) -> bool:
    """Store one vector if the item still exists (a chunk may be rebuilt, a document deleted, meanwhile).

    Chunks and passages never change their text (an edit deletes the chunk), so no text check is needed.
    """
    t = tables(kind)
    try:
        status = await conn.execute(
            f"INSERT INTO {t.vectors} ({t.key}, space_id, embedding) SELECT id, $2, $3 FROM {t.items} WHERE id = $1"
            f" ON CONFLICT ({t.key}, space_id) DO UPDATE SET embedding = EXCLUDED.embedding",
            item_id,
            space,
            vector,
        )
    except asyncpg.ForeignKeyViolationError:  # deleted between the check and the insert
        return False
    return status.endswith(" 1")


async def delete_stale_item_vectors(conn: Connection, kind: str, keep_space: int) -> int:
    """Drop vectors of other spaces for chunks or passages that already have one in `keep_space`."""
    t = tables(kind)
    status = await conn.execute(
        f"DELETE FROM {t.vectors} old WHERE old.space_id <> $1"
        f" AND EXISTS (SELECT 1 FROM {t.vectors} new WHERE new.{t.key} = old.{t.key} AND new.space_id = $1)",
        keep_space,
    )
    return int(status.split()[-1])
