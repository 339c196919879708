"""SQL of documents: a server's files, their passages and the passages' search.

Only `bot.documents.service` imports this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import asyncpg
import numpy as np

from bot.db import Connection
from bot.lexical import any_word_query_cte


async def insert_document(
    conn: Connection,
    *,
    guild_id: int,
    name: str,
    size_bytes: int,
    sha256: str,
    added_by: int | None,
    created_at: datetime,
    passages: Sequence[tuple[str, str]],
) -> tuple[int, bool]:
    """Store a document and its (section, text) passages; one with the same name is replaced. Returns (id, replaced)."""
    replaced = await conn.execute("DELETE FROM documents WHERE guild_id = $1 AND name = $2", guild_id, name)
    document_id = await conn.fetchval(
        "INSERT INTO documents (guild_id, name, size_bytes, sha256, added_by, created_at) VALUES ($1, $2, $3, $4, $5, $6)"
        " RETURNING id",
        guild_id,
        name,
        size_bytes,
        sha256,
        added_by,
        created_at,
    )
    await conn.executemany(
        "INSERT INTO document_passages (document_id, guild_id, ordinal, section, text) VALUES ($1, $2, $3, $4, $5)",
        [(document_id, guild_id, ordinal, section, text) for ordinal, (section, text) in enumerate(passages)],
    )
    return document_id, replaced.endswith(" 1")


async def documents_of_guild(conn: Connection, guild_id: int, space: int | None) -> list[asyncpg.Record]:
    """A server's documents, oldest first, with their passage counts and how many have a vector in `space`."""
    return await conn.fetch(
        "SELECT d.id, d.name, d.size_bytes, d.added_by, d.created_at,"
        " (SELECT count(*) FROM document_passages p WHERE p.document_id = d.id) AS passages,"
        " (SELECT count(*) FROM document_passages p JOIN document_passage_vectors v ON v.passage_id = p.id"
        "  AND v.space_id = $2 WHERE p.document_id = d.id) AS embedded"
        " FROM documents d WHERE d.guild_id = $1 ORDER BY d.id",
        guild_id,
        space if space is not None else -1,
    )


async def delete_document(conn: Connection, guild_id: int, document_id: int) -> str | None:
    """Delete a server's document (its passages and vectors go with it); returns its name, or None if there is none."""
    return await conn.fetchval("DELETE FROM documents WHERE guild_id = $1 AND id = $2 RETURNING name", guild_id, document_id)


async def search_passages(conn: Connection, *, guild_id: int, space: int, vector: np.ndarray, limit: int) -> list[asyncpg.Record]:
    """The passages of a server's documents closest to `vector`, best first."""
    return await conn.fetch(
        "SELECT p.id, p.document_id, d.name AS document, p.ordinal, p.section, p.text,"
        " 1 - (v.embedding <=> $3::vector) AS similarity"
        " FROM document_passages p JOIN documents d ON d.id = p.document_id"
        " JOIN document_passage_vectors v ON v.passage_id = p.id AND v.space_id = $2"
        " WHERE p.guild_id = $1 AND vector_dims(v.embedding) = vector_dims($3::vector)"
        " ORDER BY similarity DESC, p.id LIMIT $4",
        guild_id,
        space,
        vector,
        limit,
    )


PASSAGE_TEXT_SEARCH_SQL = f"""
WITH {any_word_query_cte('$2')}
SELECT p.id, p.document_id, d.name AS document, p.ordinal, p.section, p.text, ts_rank(p.terms, q.any_word) AS similarity
FROM document_passages p JOIN documents d ON d.id = p.document_id, query q
WHERE p.guild_id = $1 AND p.terms @@ q.any_word
ORDER BY similarity DESC, p.id
LIMIT $3
"""


async def search_passages_by_text(conn: Connection, *, guild_id: int, words: str, limit: int) -> list[asyncpg.Record]:
    """The passages of a server's documents holding any of `words`, best `ts_rank` first (`similarity`).

    The text fallback of `search_passages`, for a reply whose message could not be embedded.
    """
    return await conn.fetch(PASSAGE_TEXT_SEARCH_SQL, guild_id, words, limit)


async def forget_document_uploader(conn: Connection, user_id: int) -> None:
    """Documents a user uploaded stay with their server, no longer naming who uploaded them."""
    await conn.execute("UPDATE documents SET added_by = NULL WHERE added_by = $1", user_id)


async def lock_documents(conn: Connection, guild_id: int) -> None:
    """Serialize changes to one server's documents across every process until the transaction ends."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", f"documents:{guild_id}")
