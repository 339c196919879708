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
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import date, datetime
from typing import Any

import asyncpg
import numpy as np

from bot.memory.embeddings import EmbeddingSpace
from bot.memory.lexical import LexicalQuery
from bot.memory.models import GuildSettings, Memory, MemoryList, Privacy, Source

MEMORY_COLUMNS = (
    "id, list, guild_id, owner_id, persona_id, text, tags, channel_ids, source, protected,"
    " days_unused, last_aged_on, last_used_at, created_by, created_at, updated_at, desk_changed_on"
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

# Locking and performance notes (measured by `make bench`, see BENCHMARKS.md):
# - Resets and agings are one UPDATE over `locked`, which takes the row locks in id order first.
#   Two replies in one server (or sharing a participant) change overlapping rows; with the locks
#   taken in whatever order each plan visits rows they deadlocked: 32 of 300 concurrent
#   first-of-day searches in one server failed with "deadlock detected" before this, 0 after.
# - Only rows whose snapshot says they were last aged before today are locked for aging, so the
#   later replies of a day (most of them) lock and write just their used memories. This is exact
#   because last_aged_on never moves backwards; the UPDATE's own `last_aged_on < $11` re-checks
#   the latest row version when replies race, so a memory never ages twice on one day.
# - The last line commits this statement with synchronous_commit=off (transaction-local): the
#   reply does not wait for the WAL flush. A server crash can lose the last fraction of a second
#   of resets and agings, whole statements at a time (never half of one, never out of order);
#   it cannot age a memory twice. On a busy disk the flush was most of the statement's time.
# - `visible` carries only what the search needs (ids, counters, stamps, the cosine, the words of
#   the few memories sharing one with the message); the full rows are read again by primary key
#   for the few rows the statement returns (the desk cache sends back only what the core lacks),
#   instead of copying ≈ 150 wide rows through the CTEs and joins. The re-read sees the
#   statement's snapshot, so it is the same row version as in `visible`. (Carrying the whole row
#   from `candidates` for the lists the cache lacks, to spare a day's first reply the re-read,
#   measured slower on later replies and no faster on first ones: 2.19 vs 2.07-2.10 ratio.)
# - The cosine is computed in `candidates` (LEFT JOIN, NULL = no vector of this space): joining
#   memory_vectors to `visible` afterwards got a Memoize node in the generic plan that never hit.
# - The lexical CTEs run only when a memory holds one of the message's words: the `@@` test is made
#   while reading the rows, and `lexical` is looked up only for those memories (A/B on captured
#   replies: ≈ 0.02 ms less; the lexical part still costs ≈ 0.07 ms when some memory shares a word).
# - `changed` returns the row versions it wrote (counters and new xmin), so the desk cache holds
#   them and the next reply does not re-read the memories this one reset, or aged while sending
#   them in full (full rows per reply p50 9 -> 4, mean 15 -> 8). Held memories that were only
#   aged are not sent for that: on a day's first reply that cost about what the next one saved.
ROW_COLUMNS = ", ".join(f"m.{column.strip()}" for column in MEMORY_COLUMNS.split(",")[1:])  # all but id

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
query AS (
    SELECT tsvector_to_array(words) AS words, tsvector_to_array(to_tsvector('english', $16::text)) AS names,
           array_to_string(tsvector_to_array(words), ' | ')::tsquery AS any_word
    FROM to_tsvector('english', $15::text) AS words
    WHERE $6::vector IS NOT NULL AND $17::float8 > 0 AND length(words) > 0
),
candidates AS (  -- cosine: NULL without a vector of this space and size (not searchable);
                 -- hit_terms: the memory's words if it holds any of the message's (lexical), else NULL
    SELECT m.id, m.tags, m.channel_ids, m.days_unused, m.last_aged_on, m.desk_changed_on,
           m.xmin::text::bigint AS stamp,
           CASE WHEN vector_dims(mv.embedding) = vector_dims($6::vector) THEN 1 - (mv.embedding <=> $6::vector) END AS cosine,
           CASE WHEN m.terms @@ (SELECT any_word FROM query) THEN m.terms END AS hit_terms
    FROM memories m LEFT JOIN memory_vectors mv ON $6::vector IS NOT NULL AND mv.memory_id = m.id AND mv.space_id = $7
    -- one scan of both lists (a BitmapOr, as the top-k does) rather than a UNION ALL of two
    WHERE (m.list = 'server' AND m.guild_id = $1 AND m.persona_id = $2)
       OR (m.list = 'personal' AND m.owner_id = ANY (ARRAY(SELECT user_id FROM people))
           AND (m.persona_id IS NULL OR m.persona_id = $2))
),
visible AS (
    SELECT c.id, c.days_unused, c.last_aged_on, c.desk_changed_on, c.hit_terms, c.stamp, c.cosine FROM candidates c, guild
    WHERE (cardinality(c.channel_ids) = 0 OR $3::bigint = ANY (c.channel_ids))
      AND (NOT guild.tagging OR cardinality(c.tags) = 0 OR c.tags && $5::text[])
),
word_hits AS (  -- which memory holds which of the message's words
    SELECT v.id, t.lexeme FROM visible v, query q, unnest(v.hit_terms) AS t
    WHERE v.hit_terms IS NOT NULL AND t.lexeme = ANY (q.words)
),
word_weights AS (  -- IDF over this reply's searchable set (a word no memory holds counts most), names double
    SELECT w.lexeme, ln((1 + (SELECT count(*) FROM visible)) / (1.0 + count(h.id)))
                     * CASE WHEN w.lexeme = ANY (q.names) THEN 2 ELSE 1 END AS weight
    FROM query q CROSS JOIN unnest(q.words) AS w (lexeme) LEFT JOIN word_hits h ON h.lexeme = w.lexeme
    GROUP BY w.lexeme, q.names
),
lexical AS (  -- share of the message's (weighted) words a memory holds, in [0, 1]; the whole never
              -- weighs less than one word held by a single memory, so a message of common words alone
              -- ("pizza?" where most memories mention pizza) gives only a small bonus
    SELECT h.id, sum(w.weight) / nullif(greatest((SELECT sum(weight) FROM word_weights),
                                                 ln((1 + (SELECT count(*) FROM visible)) / 2.0)), 0) AS overlap
    FROM word_hits h JOIN word_weights w USING (lexeme) GROUP BY h.id
),
scored AS (  -- lexical is looked up only for the few memories holding a word: with none, it is never computed
    SELECT v.id, v.last_aged_on, v.days_unused,
           v.cosine + CASE WHEN v.hit_terms IS NULL THEN 0
                           ELSE $17::float8 * coalesce((SELECT lx.overlap FROM lexical lx WHERE lx.id = v.id), 0) END
           AS similarity
    FROM visible v
    WHERE v.cosine IS NOT NULL
),
used AS (
    SELECT id, similarity FROM scored WHERE similarity >= $8 ORDER BY similarity DESC, id LIMIT $9
),
matches AS (  -- the used ones, and up to $13 more dormant matches for the tail (MAX_RECALLED)
    SELECT id, similarity FROM used
    UNION
    (SELECT id, similarity FROM scored WHERE similarity >= $8 AND days_unused >= $14
     ORDER BY similarity DESC, id LIMIT $13::int)
),
locked AS (  -- stamp: of the version locked, the latest (the statement's own, unless another reply changed it since)
    SELECT m.id, m.xmin::text::bigint AS stamp FROM memories m
    WHERE m.id = ANY (ARRAY(SELECT id FROM used UNION SELECT id FROM scored WHERE last_aged_on < $11))
    ORDER BY m.id
    FOR NO KEY UPDATE
),
changed AS (
    UPDATE memories m
    SET days_unused = CASE WHEN u.id IS NULL THEN m.days_unused + 1 ELSE 0 END,
        last_used_at = CASE WHEN u.id IS NULL THEN m.last_used_at ELSE $10 END,
        last_aged_on = $11,
        -- a recall = used while dormant as of this morning: a memory that aged into the drawer at
        -- today's first reply was on today's desk, so its reset later today is no comeback
        desk_changed_on = CASE
            WHEN u.id IS NOT NULL AND m.days_unused - CASE WHEN m.last_aged_on = $11
                AND (m.last_used_at IS NULL OR (m.last_used_at AT TIME ZONE 'UTC')::date < $11) THEN 1 ELSE 0 END >= $14::int
            THEN $11 ELSE m.desk_changed_on END
    FROM locked l LEFT JOIN used u ON u.id = l.id
    WHERE m.id = l.id AND (u.id IS NOT NULL OR m.last_aged_on < $11)
    -- the new row version, for the desk cache: what changed and the new stamp, with the stamp of
    -- the version updated (locked above). Plain RETURNING (new values), not PostgreSQL 18's
    -- old./new.: any PostgreSQL 13+ must work (README)
    RETURNING m.id, l.stamp AS old_stamp, m.xmin::text::bigint AS next_stamp,
              m.days_unused, m.last_used_at, m.last_aged_on, m.desk_changed_on
),
desk AS (  -- the pre-search snapshot the core turns into a Recall: the desk and the matches
    SELECT v.id, v.stamp, u.similarity AS used_similarity, mt.similarity AS match_similarity
    FROM visible v LEFT JOIN used u ON u.id = v.id LEFT JOIN matches mt ON mt.id = v.id
    WHERE (v.days_unused < $12 OR mt.id IS NOT NULL OR v.desk_changed_on = $11)
)
-- Only what the core's desk cache lacks (`DeskCache`). A memory it holds with this stamp (row
-- version: same xmin = same row = the same Memory) is not sent, or only as id and similarities
-- if it is a match; any other desk memory or match comes as a full row; a memory it holds that
-- is not in `desk` any more comes as a marker (id NULL, known_id set).
SELECT k.id AS known_id, d.id, {ROW_COLUMNS}, d.stamp, d.used_similarity, d.match_similarity,
       ch.next_stamp, ch.days_unused AS next_days_unused, ch.last_used_at AS next_last_used_at,
       ch.last_aged_on AS next_last_aged_on, ch.desk_changed_on AS next_desk_changed_on
FROM desk d FULL JOIN unnest(${{KNOWN_IDS}}::bigint[], ${{KNOWN_STAMPS}}::bigint[]) AS k (id, stamp) ON k.id = d.id
-- the version this statement wrote, for the rows sent anyway (full rows, matches): resets, agings
LEFT JOIN changed ch ON ch.id = d.id AND ch.old_stamp = d.stamp
    AND (k.stamp IS DISTINCT FROM d.stamp OR d.match_similarity IS NOT NULL)
-- the full row by primary key, only for those sent in full (OFFSET 0 keeps the planner from
-- turning this into a hash join over the whole table, as the generic plan did)
LEFT JOIN LATERAL (
    SELECT * FROM memories WHERE memories.id = d.id AND k.stamp IS DISTINCT FROM d.stamp OFFSET 0
) AS m ON true
WHERE (d.id IS NULL OR k.stamp IS DISTINCT FROM d.stamp OR d.match_similarity IS NOT NULL)
  AND (SELECT set_config('synchronous_commit', 'off', true)) IS NOT NULL
"""
# The desk cache's two parameters come after every parameter of the search itself, numbered here
# from the statement text: adding search parameters never needs renumbering them, and
# `reply_search` passes them last.
DESK_CACHE_PARAM = max(int(n) for n in re.findall(r"\$(\d+)", REPLY_SEARCH_SQL)) + 1
REPLY_SEARCH_SQL = REPLY_SEARCH_SQL.replace("${KNOWN_IDS}", f"${DESK_CACHE_PARAM}").replace(
    "${KNOWN_STAMPS}", f"${DESK_CACHE_PARAM + 1}"
)


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
    max_recalled: int = 0,
    dormant_after: int | None = None,
    lexical: LexicalQuery | None = None,
    lexical_weight: float = 0.0,
    known_ids: Sequence[int] = (),
    known_stamps: Sequence[int] = (),
) -> list[asyncpg.Record]:
    """Run SPEC §2 steps 2 and 4-6 in one statement and return the pre-search snapshot.

    With `query_vector` None nothing is scored or changed (failed search, decay off, no embedder).
    A memory's score is its cosine similarity plus `lexical_weight` x the IDF-weighted share of
    the `lexical` words it holds (hybrid scoring; weight 0 = cosine alone, as SPEC §2 words it).
    Returns the visible memories with `days_unused < desk_below_days` (the desk), those that joined
    the desk today, and the matches (`match_similarity`): the best `max_used` scoring at least
    `min_similarity` are used (`used_similarity`, reset), and up to `max_recalled` more dormant ones
    (`days_unused >= dormant_after`) come along for the prompt's tail without a reset. A used memory
    at `dormant_after` days or more is a recall: its `desk_changed_on` becomes today. Values are as
    they were before this statement.

    `known_ids`/`known_stamps` are the memories the caller already holds and their row versions
    (`stamp`, the row's xmin, as returned here). A held memory whose row has not changed does not
    come back, or, if it is a match, comes back with its id, stamp and similarities only (the
    other columns NULL); one that is not in the snapshot any more comes back as a marker row (`id`
    NULL, `known_id` set). Every other row of the snapshot comes back in full, so with nothing
    known the whole snapshot is returned. `known_id` is set on every row whose id was known.
    A row sent (in full, or as a match) that this statement updated (reset, aged) also carries the
    new row version's `next_stamp` and `next_*` counters, so the caller can hold the version
    written instead of the one read (NULL when another transaction had changed the row since this
    statement's snapshot). Held memories that were only aged are not sent for that.
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
        max_recalled,
        dormant_after if dormant_after is not None else desk_below_days,
        lexical.words if lexical is not None else "",
        lexical.names if lexical is not None else "",
        lexical_weight if lexical is not None else 0.0,
        list(known_ids),  # always last: $DESK_CACHE_PARAM
        list(known_stamps),
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
    names: Mapping[int, str] | None = None,
) -> bool:
    """Store a message once; a second delivery (gateway resume, history backfill) changes nothing.

    Returns whether the message was new. The latest display names of `names` (by default the
    author's; a reply adds the people it mentions) are kept alongside, in the same statement,
    upserted in id order so two messages never wait on each other's rows in opposite orders.
    """
    given = dict(names) if names is not None else {author_id: author_name}
    ids = sorted(given)
    return bool(
        await conn.fetchval(
            "WITH message AS ("
            f"  INSERT INTO chat_messages ({CHAT_MESSAGE_COLUMNS})"
            "   VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, NULL) ON CONFLICT (channel_id, message_id) DO NOTHING"
            "   RETURNING 1"
            "), named AS ("
            "  INSERT INTO chat_users (user_id, name)"
            "  SELECT user_id, name FROM unnest($11::bigint[], $12::text[]) AS given (user_id, name)"
            "  ON CONFLICT (user_id) DO UPDATE SET name = EXCLUDED.name, updated_at = now()"
            "  WHERE chat_users.name <> EXCLUDED.name"
            ") SELECT count(*) FROM message",
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
            ids,
            [given[user_id] for user_id in ids],
        )
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
    """Everything the pipeline stored about one user (/privacy delete-my-data): their messages and name,
    and the receipts of replies to them or naming them anywhere (a receipt keeps who each memory is about and
    the text of memories saved; matching the id as a whole number keeps up with new receipt fields)."""
    await conn.execute(
        "DELETE FROM reply_receipts WHERE message_id IN (SELECT message_id FROM chat_messages WHERE author_id = $1)"
        " OR receipt::text ~ ('(^|[^0-9])' || $1::bigint::text || '([^0-9]|$)')",
        user_id,
    )
    status = await conn.execute("DELETE FROM chat_messages WHERE author_id = $1", user_id)
    await conn.execute("DELETE FROM chat_users WHERE user_id = $1", user_id)
    # others' messages stay (their words), but no longer record that they mentioned this user
    await conn.execute(
        "UPDATE chat_messages SET mention_ids = array_remove(mention_ids, $1::bigint) WHERE $1::bigint = ANY (mention_ids)",
        user_id,
    )
    return int(status.split()[-1])


async def has_chat_messages(conn: Connection, channel_id: int) -> bool:
    return bool(await conn.fetchval("SELECT EXISTS (SELECT 1 FROM chat_messages WHERE channel_id = $1)", channel_id))


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

    # documents the user uploaded stay with their server too, no longer naming who uploaded them
    await conn.execute("UPDATE documents SET added_by = NULL WHERE added_by = $1", user_id)
    return {
        "personal_memories": count(await conn.execute("DELETE FROM memories WHERE list = 'personal' AND owner_id = $1", user_id)),
        "authored_server_memories": count(
            await conn.execute("UPDATE memories SET created_by = NULL WHERE created_by = $1", user_id)
        ),
        "settings": count(await conn.execute("DELETE FROM user_settings WHERE user_id = $1", user_id)),
    }


# --- history and documents ------------------------------------------------------------------------
# Chat-history chunks, documents and their passages (issue 4, migrations/005_history_documents.sql).
# Chunks and passages have vectors per embedding space, like memories: a search only ever reads the
# current space, so vectors of an old model are never searched; they are deleted once the item has
# a vector in the current space.

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


# chunking ----------------------------------------------------------------------------------------

async def channels_with_pending_history(conn: Connection, context_messages: int, limit: int) -> list[int]:
    """Channels with a message that is older than the context window and in no chunk yet."""
    rows = await conn.fetch(
        "SELECT c.channel_id FROM (SELECT DISTINCT channel_id FROM chat_messages WHERE chunk_id IS NULL) AS c"
        " WHERE EXISTS (SELECT 1 FROM chat_messages m WHERE m.channel_id = c.channel_id AND m.chunk_id IS NULL"
        "   AND m.message_id < (SELECT w.message_id FROM chat_messages w WHERE w.channel_id = c.channel_id"
        "                       ORDER BY w.message_id DESC OFFSET $1 LIMIT 1))"
        " ORDER BY c.channel_id LIMIT $2",
        max(context_messages - 1, 0),
        limit,
    )
    return [row["channel_id"] for row in rows]


async def lock_history_rows(conn: Connection, channel_id: int, context_messages: int, limit: int) -> list[asyncpg.Record]:
    """From the oldest unchunked message before the context window on: the channel's messages, locked.

    Chunked messages in that range come too (`chunk_id` set): they break runs. The oldest message of
    the context window comes last with `in_window` true, only so a pause before it can close a chunk.
    Locking the rows (call inside a transaction) makes an edit or delete racing the chunker wait,
    then see the chunk and delete it.
    """
    return await conn.fetch(
        "WITH boundary AS (SELECT message_id FROM chat_messages WHERE channel_id = $1"
        "                  ORDER BY message_id DESC OFFSET $2 LIMIT 1),"
        " start AS (SELECT min(message_id) AS message_id FROM chat_messages"
        "           WHERE channel_id = $1 AND chunk_id IS NULL AND message_id < (SELECT message_id FROM boundary))"
        " SELECT m.message_id, m.guild_id, m.author_id, m.author_name, m.is_bot, m.text, m.created_at, m.chunk_id,"
        "        m.message_id = (SELECT message_id FROM boundary) AS in_window"
        " FROM chat_messages m"
        " WHERE m.channel_id = $1 AND m.message_id >= (SELECT message_id FROM start)"
        "   AND m.message_id <= (SELECT message_id FROM boundary)"
        " ORDER BY m.message_id LIMIT $3 FOR UPDATE OF m",
        channel_id,
        max(context_messages - 1, 0),
        limit,
    )


async def insert_history_chunk(
    conn: Connection,
    *,
    guild_id: int | None,
    channel_id: int,
    message_ids: Sequence[int],
    author_ids: Sequence[int],
    started_at: datetime,
    ended_at: datetime,
    text: str,
) -> int:
    """Store a chunk and mark its messages (locked by `lock_history_rows` in the same transaction)."""
    chunk_id = await conn.fetchval(
        "INSERT INTO history_chunks (guild_id, channel_id, first_message_id, last_message_id, message_ids, author_ids,"
        " started_at, ended_at, text) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING id",
        guild_id,
        channel_id,
        min(message_ids),
        max(message_ids),
        list(message_ids),
        sorted(set(author_ids)),
        started_at,
        ended_at,
        text,
    )
    await conn.execute(
        "UPDATE chat_messages SET chunk_id = $3 WHERE channel_id = $1 AND message_id = ANY ($2::bigint[]) AND chunk_id IS NULL",
        channel_id,
        list(message_ids),
        chunk_id,
    )
    return chunk_id


# keeping chunks in step with Discord (call each inside a transaction) ------------------------------
# The message row is changed first: when the chunker holds it locked, the change waits for the
# chunker to commit and then sees the new chunk, which the next statement (a fresh snapshot) deletes.
# The other messages of a deleted chunk are free again (ON DELETE SET NULL) and are chunked anew.

async def edit_chat_message_rechunk(conn: Connection, channel_id: int, message_id: int, text: str, edited_at: datetime) -> bool:
    """Change a stored message; if its text changed, the chunk it was part of goes (it is rebuilt in the background)."""
    row = await conn.fetchrow(
        "SELECT text, chunk_id FROM chat_messages WHERE channel_id = $1 AND message_id = $2 FOR UPDATE", channel_id, message_id
    )
    if row is None:
        return False
    await conn.execute(
        "UPDATE chat_messages SET text = $3, edited_at = $4 WHERE channel_id = $1 AND message_id = $2",
        channel_id,
        message_id,
        text,
        edited_at,
    )
    if row["chunk_id"] is not None and row["text"] != text:
        await conn.execute("DELETE FROM history_chunks WHERE id = $1", row["chunk_id"])
    return True


async def delete_chat_messages_rechunk(conn: Connection, channel_id: int, message_ids: Sequence[int]) -> int:
    """Delete stored messages and the chunks they were part of."""
    rows = await conn.fetch(
        "DELETE FROM chat_messages WHERE channel_id = $1 AND message_id = ANY ($2::bigint[]) RETURNING chunk_id",
        channel_id,
        list(message_ids),
    )
    chunks = sorted({row["chunk_id"] for row in rows if row["chunk_id"] is not None})
    if chunks:
        await conn.execute("DELETE FROM history_chunks WHERE id = ANY ($1::bigint[])", chunks)
    return len(rows)


async def delete_channel_history(conn: Connection, channel_id: int) -> int:
    """A deleted channel or thread: its chunks and its history-recall switch (after its messages are gone)."""
    await conn.execute("DELETE FROM history_channels WHERE channel_id = $1", channel_id)
    status = await conn.execute("DELETE FROM history_chunks WHERE channel_id = $1", channel_id)
    return int(status.split()[-1])


async def delete_user_history(conn: Connection, user_id: int) -> int:
    """/privacy delete-my-data: every chunk a user's message is part of (the others' messages are chunked anew).

    Locks the user's messages first, so the chunker cannot put them into a new chunk meanwhile; delete
    them in the same transaction (`delete_user_chat_data`).
    """
    rows = await conn.fetch("SELECT chunk_id FROM chat_messages WHERE author_id = $1 FOR UPDATE", user_id)
    chunks = sorted({row["chunk_id"] for row in rows if row["chunk_id"] is not None})
    if not chunks:
        return 0
    status = await conn.execute("DELETE FROM history_chunks WHERE id = ANY ($1::bigint[])", chunks)
    return int(status.split()[-1])


async def forget_guild_chat(conn: Connection, guild_id: int) -> dict[str, int]:
    """The bot left a server: its stored messages, chunks, receipts and history switches go.

    Memories, documents and settings stay: admins curated them, and they are back if the bot is invited again.
    """

    def count(status: str) -> int:
        return int(status.split()[-1])

    messages = count(await conn.execute("DELETE FROM chat_messages WHERE guild_id = $1", guild_id))
    return {
        "chat_messages": messages,
        "history_chunks": count(await conn.execute("DELETE FROM history_chunks WHERE guild_id = $1", guild_id)),
        "receipts": count(await conn.execute("DELETE FROM reply_receipts WHERE guild_id = $1", guild_id)),
        "history_channels": count(await conn.execute("DELETE FROM history_channels WHERE guild_id = $1", guild_id)),
    }


# history recall ----------------------------------------------------------------------------------

HISTORY_SEARCH_SQL = """
WITH window_start AS (
    SELECT min(message_id) AS message_id FROM (
        SELECT message_id FROM chat_messages WHERE channel_id = $1 AND message_id <= $2
        ORDER BY message_id DESC LIMIT $3
    ) AS w
)
SELECT c.id, c.first_message_id, c.last_message_id, cardinality(c.message_ids) AS messages, c.started_at, c.ended_at,
       c.text, 1 - (v.embedding <=> $4::vector) AS similarity
FROM history_chunks c JOIN history_chunk_vectors v ON v.chunk_id = c.id AND v.space_id = $5
WHERE c.channel_id = $1
  AND c.last_message_id < coalesce((SELECT message_id FROM window_start), $2)
  AND vector_dims(v.embedding) = vector_dims($4::vector)
ORDER BY similarity DESC, c.id
LIMIT $6
"""


async def search_history(
    conn: Connection,
    *,
    channel_id: int,
    answered_message_id: int,
    context_messages: int,
    space: int,
    vector: np.ndarray,
    limit: int,
) -> list[asyncpg.Record]:
    """The chunks of a channel closest to `vector`, best first, none overlapping the context window (read-behind).

    The window is recomputed here rather than trusted from chunking time: deleting recent messages
    pulls older (already chunked) ones back into it, and those must not come twice.
    """
    return await conn.fetch(HISTORY_SEARCH_SQL, channel_id, answered_message_id, context_messages, vector, space, limit)


async def set_history_recall(conn: Connection, channel_id: int, guild_id: int | None, enabled: bool) -> None:
    await conn.execute(
        "INSERT INTO history_channels (channel_id, guild_id, recall_enabled) VALUES ($1, $2, $3)"
        " ON CONFLICT (channel_id) DO UPDATE SET recall_enabled = EXCLUDED.recall_enabled, updated_at = now()",
        channel_id,
        guild_id,
        enabled,
    )


async def history_recall_enabled(conn: Connection, channel_ids: Sequence[int]) -> bool:
    """The switch of the first of `channel_ids` that has one (a thread, then its parent); on by default."""
    rows = await conn.fetch(
        "SELECT channel_id, recall_enabled FROM history_channels WHERE channel_id = ANY ($1::bigint[])", list(channel_ids)
    )
    found = {row["channel_id"]: row["recall_enabled"] for row in rows}
    return next((found[channel] for channel in channel_ids if channel in found), True)


async def history_recall_off_channels(conn: Connection, guild_id: int) -> list[int]:
    rows = await conn.fetch(
        "SELECT channel_id FROM history_channels WHERE guild_id = $1 AND NOT recall_enabled ORDER BY channel_id", guild_id
    )
    return [row["channel_id"] for row in rows]


async def history_overview(conn: Connection, channel_id: int, space: int | None) -> asyncpg.Record:
    """Chunks of a channel, how many have a vector in `space`, and how many messages are in no chunk yet."""
    return await conn.fetchrow(
        "SELECT (SELECT count(*) FROM history_chunks WHERE channel_id = $1) AS chunks,"
        " (SELECT count(*) FROM history_chunks c JOIN history_chunk_vectors v ON v.chunk_id = c.id AND v.space_id = $2"
        "  WHERE c.channel_id = $1) AS embedded,"
        " (SELECT count(*) FROM chat_messages WHERE channel_id = $1 AND chunk_id IS NULL) AS unchunked",
        channel_id,
        space if space is not None else -1,
    )


# documents ---------------------------------------------------------------------------------------

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


async def document_passages_for_embedding(conn: Connection, document_id: int) -> list[tuple[int, str]]:
    items, _, _, text = VECTOR_KINDS["passage"]
    rows = await conn.fetch(
        f"SELECT i.id, {text} AS text FROM {items} i WHERE i.document_id = $1 ORDER BY i.ordinal", document_id
    )
    return [(row["id"], row["text"]) for row in rows]


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


# receipts ----------------------------------------------------------------------------------------

async def memories_by_id(conn: Connection, memory_ids: Iterable[int]) -> list[Memory]:
    rows = await conn.fetch(
        f"SELECT {MEMORY_COLUMNS} FROM memories WHERE id = ANY ($1::bigint[]) ORDER BY id", sorted(set(memory_ids))
    )
    return [Memory.from_row(row) for row in rows]


async def receipt_for_message(conn: Connection, message_id: int) -> dict[str, Any] | None:
    """The receipt of the reply to `message_id`, or of the message the bot's reply `message_id` answered.

    Receipts are keyed by the message answered; people copy the link of the bot's reply, which
    is stored as a chat message that replies to (references) the answered one.
    """
    raw = await conn.fetchval(
        "SELECT receipt FROM reply_receipts WHERE message_id = $1"
        "   OR message_id = (SELECT reply_to FROM chat_messages WHERE message_id = $1 AND reply_to IS NOT NULL LIMIT 1)"
        " ORDER BY (message_id = $1) DESC, id DESC LIMIT 1",
        message_id,
    )
    if raw is None:
        return None
    return json.loads(raw) if isinstance(raw, str) else raw


# === reply context (the reply pipeline's per-reply statements, issue 5) ==============================
# A reply used to run about fourteen statements over eight pool acquisitions. These fold them: one
# write for the incoming message and the names it brings, one read for everything the prompt needs
# besides the search (window, persona, lore, server settings, names, the previous head), and one for
# the receipt. Each read is done fresh per reply, so an admin's change made through another bot
# process shows on the next reply, as before: nothing here is cached.

REPLY_CONTEXT_SQL = """
WITH recent AS (
    SELECT message_id, author_id, author_name, is_bot, text, reply_to FROM chat_messages
    WHERE channel_id = $1 AND message_id < $2 ORDER BY message_id DESC LIMIT greatest($3::int - 1, 0)
), named AS (
    SELECT user_id, name FROM chat_users
    WHERE user_id = ANY ($5::bigint[] || ARRAY(SELECT author_id FROM recent))
)
SELECT p.name, p.prompt, p.attributes::text AS attributes,
       ARRAY(SELECT text FROM lore_entries WHERE persona_id = $4 ORDER BY id) AS lore,
       (SELECT json_agg(recent ORDER BY message_id) FROM recent)::text AS recent,
       ARRAY(SELECT user_id FROM named ORDER BY user_id) AS name_ids,
       ARRAY(SELECT name FROM named ORDER BY user_id) AS names,
       (SELECT head_hash FROM reply_receipts WHERE channel_id = $1 ORDER BY id DESC LIMIT 1) AS previous_head,
       g.guild_id IS NOT NULL AS has_settings, g.notices, g.notice_verbosity, g.log_channel_id, g.self_teaching,
       g.member_teaching, g.personal_memories, g.tagging, g.auto_reply_channel_ids
FROM personas p LEFT JOIN guild_settings g ON g.guild_id = $6
WHERE p.id = $4
"""


async def reply_context(
    conn: Connection,
    *,
    channel_id: int,
    answered_message_id: int,
    context_messages: int,
    persona_id: int,
    guild_id: int | None,
    user_ids: Iterable[int],
) -> dict[str, Any]:
    """What a reply's prompt needs besides the search, in one statement (one snapshot).

    - `window`: the messages of the channel before the answered one, oldest first: the last
      `context_messages` up to and including the answered message, without it (as `context_window`
      minus the answered message, which `record_chat_message` has stored);
    - `persona` (as `get_persona`), `lore` (texts, as `list_lore`), `guild` (`GuildSettings`, None in DMs),
      `previous_head` (as `previous_head_hash`);
    - `names`: the stored names of `user_ids` and of every author in the window; `names_for` says which
      ids were asked, so the caller knows whether a later id (a memory's owner) still needs a look-up.
    """
    asked = sorted(set(user_ids))
    row = await conn.fetchrow(
        REPLY_CONTEXT_SQL, channel_id, answered_message_id, context_messages, persona_id, asked, guild_id
    )
    if row is None:
        raise LookupError(f"persona {persona_id} does not exist")
    window = json.loads(row["recent"]) if row["recent"] else []
    guild = None
    if guild_id is not None:
        guild = GuildSettings.from_row(guild_id, row if row["has_settings"] else None)
    return {
        "window": window,
        "persona": {
            "id": persona_id,
            "name": row["name"],
            "prompt": row["prompt"],
            "attributes": json.loads(row["attributes"]) if row["attributes"] else {},
        },
        "lore": list(row["lore"]),
        "guild": guild,
        "previous_head": row["previous_head"],
        "names": dict(zip(row["name_ids"], row["names"], strict=True)),
        "names_for": {*asked, *(line["author_id"] for line in window)},
    }


async def save_reply_receipt(
    conn: Connection,
    *,
    guild_id: int | None,
    channel_id: int,
    message_id: int,
    head_hash: str,
    receipt: dict[str, Any],
    created_at: datetime,
) -> None:
    """Store a reply's receipt and keep only the channel's latest ones, in one statement.

    The DELETE sees the table as it was before the INSERT (one snapshot), so it keeps
    RECEIPTS_KEPT_PER_CHANNEL - 1 older receipts: RECEIPTS_KEPT_PER_CHANNEL with the new one.
    """
    await conn.execute(
        "WITH added AS ("
        "  INSERT INTO reply_receipts (guild_id, channel_id, message_id, head_hash, receipt, created_at)"
        "  VALUES ($1, $2, $3, $4, $5::text::jsonb, $6) RETURNING id"
        ") DELETE FROM reply_receipts WHERE channel_id = $2 AND id < ("
        "  SELECT id FROM reply_receipts WHERE channel_id = $2 ORDER BY id DESC OFFSET $7 LIMIT 1)",
        guild_id,
        channel_id,
        message_id,
        head_hash,
        json.dumps(receipt, ensure_ascii=False),
        created_at,
        RECEIPTS_KEPT_PER_CHANNEL - 2,
    )
