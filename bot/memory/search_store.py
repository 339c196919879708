"""The per-reply search as one SQL statement: visibility, similarity, the resets of used memories, the
once-a-day aging and the desk snapshot happen in one round trip and one snapshot.

Concurrency safety comes from PostgreSQL's row-level re-check: the aging UPDATE keeps
`last_aged_on < today` in its own WHERE, so when two replies race, the second re-reads the row
another reply just changed and skips it; a reset always wins because it does not depend on the
old value. The rules it applies are in docs/memory-rules.md ("The search on every reply").
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import date, datetime

import asyncpg
import numpy as np

from bot.db import Connection
from bot.lexical import LexicalQuery, any_word_query_cte
from bot.memory.hiding_sql import SEARCHABLE_LISTS, VISIBILITY_CTES, not_hidden
from bot.memory.store import MEMORY_COLUMNS

# Locking and performance notes (measured by `make bench`, see docs/benchmarks.md):
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


# Who and what a reply may see: bot/memory/hiding_sql.py, shared with what a save shows the model.
NOT_HIDDEN = not_hidden("c")


REPLY_SEARCH_SQL = f"""
WITH {VISIBILITY_CTES},
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
    WHERE {SEARCHABLE_LISTS}
),
visible AS (
    SELECT c.id, c.days_unused, c.last_aged_on, c.desk_changed_on, c.hit_terms, c.stamp, c.cosine FROM candidates c, guild
    WHERE {NOT_HIDDEN}
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
    -- old./new.: any PostgreSQL 13+ must work (docs/operations.md)
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
    """Run the search (docs/memory-rules.md, steps 2 and 4-6) in one statement and return the pre-search snapshot.

    With `query_vector` None nothing is scored or changed (failed search, decay off, no embedder).
    A memory's score is its cosine similarity plus `lexical_weight` x the IDF-weighted share of
    the `lexical` words it holds (hybrid scoring; weight 0 = cosine alone, as the plain rule words it).
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


# The text fallback: when the reply's message could not be embedded, the dormant memories this reply
# may see (the same visibility as above, word for word) that share a word with the message, best
# `ts_rank` first. Read-only on purpose: a failed search must not move a counter, so nothing here
# locks or writes, and the desk is not re-read (the failed search already returned it).
TEXT_SEARCH_SQL = f"""
WITH {VISIBILITY_CTES},
{any_word_query_cte('$6')},
candidates AS (
    SELECT m.id, m.tags, m.channel_ids, ts_rank(m.terms, q.any_word) AS rank
    FROM memories m, query q
    WHERE ({SEARCHABLE_LISTS})
      AND m.days_unused >= $7 AND m.terms @@ q.any_word AND NOT (m.id = ANY ($9::bigint[]))
)
SELECT m.id, {ROW_COLUMNS}, c.rank
FROM candidates c CROSS JOIN guild JOIN memories m ON m.id = c.id
WHERE {NOT_HIDDEN}
ORDER BY c.rank DESC, c.id
LIMIT $8
"""


async def text_search(
    conn: Connection,
    *,
    guild_id: int | None,
    persona_id: int,
    channel_id: int,
    participants: Sequence[int],
    context_words: Sequence[str],
    words: str,
    dormant_after: int,
    limit: int,
    exclude_ids: Sequence[int] = (),
) -> list[asyncpg.Record]:
    """The visible dormant memories holding at least one of `words`, best `ts_rank` first, at most `limit`.

    `words` are the message's words as `lexical_query` keeps them (plain letters and digits: nothing
    in them is text-search syntax). `exclude_ids` are memories the reply already shows (its desk).
    Changes nothing: no counter, no stamp, no lock. Each row is a full memory row plus its `rank`.
    """
    return await conn.fetch(
        TEXT_SEARCH_SQL,
        guild_id,
        persona_id,
        channel_id,
        list(participants),
        list(context_words),
        words,
        dormant_after,
        limit,
        list(exclude_ids),
    )
