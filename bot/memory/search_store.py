"""The per-reply search as one SQL statement: visibility, similarity, the resets of used memories, the
once-a-day aging and the desk snapshot happen in one round trip and one snapshot.

Concurrency safety comes from PostgreSQL's row-level re-check: the aging UPDATE keeps
`last_aged_on < today` in its own WHERE, so when two replies race, the second re-reads the row
another reply just changed and skips it; a reset always wins because it does not depend on the
old value. The rules it applies are in docs/memory-rules.md ("The search on every reply").
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, datetime

import asyncpg
import numpy as np

from bot.db import Connection
from bot.lexical import LexicalQuery, any_word_query_cte
from bot.memory.hiding_sql import SEARCHABLE_LISTS, VISIBILITY_CTES, not_hidden
from bot.memory.store import MEMORY_COLUMNS

# Why the statement is shaped this way (figures from `make bench`, docs/benchmarks.md):
# - Resets and agings are one UPDATE over `locked`, which takes the row locks in id order first:
#   with the locks taken in whatever order each plan visits rows, 32 of 300 concurrent first-of-day
#   searches in one server deadlocked.
# - Only rows whose snapshot says they were last aged before today are locked for aging, so the
#   later replies of a day (most of them) lock and write just their used memories. This is exact
#   because last_aged_on never moves backwards; the UPDATE's own `last_aged_on < $11` re-checks
#   the latest row version when replies race, so a memory never ages twice on one day.
# - The last line commits this statement with synchronous_commit=off (transaction-local): the
#   reply does not wait for the WAL flush. A server crash can lose the last fraction of a second
#   of resets and agings, whole statements at a time (never half of one, never out of order);
#   it cannot age a memory twice. On a busy disk the flush was most of the statement's time.
# - `visible` carries only what the search needs (ids, counters, the cosine, the words of the few
#   memories sharing one with the message); the full rows are read by primary key at the end, for
#   the rows returned, rather than carried through the CTEs and joins. The re-read sees the
#   statement's snapshot, so it is the same row version as in `visible`.
# - The cosine is computed in `candidates` (LEFT JOIN, NULL = no vector of this space): joining
#   memory_vectors to `visible` afterwards got a Memoize node in the generic plan that never hit.
# - The lexical CTEs run only for the memories holding one of the message's words (the `@@` test is
#   made while reading the rows).
ROW_COLUMNS = ", ".join(f"m.{column.strip()}" for column in MEMORY_COLUMNS.split(",")[1:])  # all but id


# Who and what a reply may see: bot/memory/hiding_sql.py, shared with what a save shows the model.
NOT_HIDDEN = not_hidden("c")


def days_unused_this_morning(alias: str) -> str:
    """A memory's days unused when today's first reply began: one less if it was aged today and not used today.

    The one definition of "this morning" (DESK_REFRESH=daily, and whether a use is a recall)."""
    return f"""({alias}.days_unused - CASE WHEN {alias}.last_aged_on = $11
        AND ({alias}.last_used_at AT TIME ZONE 'UTC')::date IS DISTINCT FROM $11 THEN 1 ELSE 0 END)"""


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
           CASE WHEN vector_dims(mv.embedding) = vector_dims($6::vector) THEN 1 - (mv.embedding <=> $6::vector) END AS cosine,
           CASE WHEN m.terms @@ (SELECT any_word FROM query) THEN m.terms END AS hit_terms
    FROM memories m LEFT JOIN memory_vectors mv ON $6::vector IS NOT NULL AND mv.memory_id = m.id AND mv.space_id = $7
    -- one scan of both lists (a BitmapOr, as the top-k does) rather than a UNION ALL of two
    WHERE {SEARCHABLE_LISTS}
),
visible AS (
    SELECT c.id, c.days_unused, c.last_aged_on, c.desk_changed_on, c.hit_terms, c.cosine FROM candidates c, guild
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
locked AS (
    SELECT m.id FROM memories m
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
        desk_changed_on = CASE WHEN u.id IS NOT NULL AND {days_unused_this_morning("m")} >= $14::int
                               THEN $11 ELSE m.desk_changed_on END
    FROM locked l LEFT JOIN used u ON u.id = l.id
    WHERE m.id = l.id AND (u.id IS NOT NULL OR m.last_aged_on < $11)
),
desk AS (  -- the pre-search snapshot the core turns into a Recall: the desk and the matches
    SELECT v.id, u.similarity AS used_similarity, mt.similarity AS match_similarity
    FROM visible v LEFT JOIN used u ON u.id = v.id LEFT JOIN matches mt ON mt.id = v.id
    WHERE (v.days_unused < $12 OR mt.id IS NOT NULL OR v.desk_changed_on = $11)
)
-- the full rows by primary key, as they were before this statement (OFFSET 0 keeps the planner from
-- turning this into a hash join over the whole table, as the generic plan did)
SELECT d.id, {ROW_COLUMNS}, d.used_similarity, d.match_similarity,
       m.desk_changed_on IS DISTINCT FROM $11 AND (m.created_at AT TIME ZONE 'UTC')::date < $11
           AND {days_unused_this_morning("m")} < $14::int AS on_desk_this_morning
FROM desk d CROSS JOIN LATERAL (SELECT * FROM memories WHERE memories.id = d.id OFFSET 0) AS m
WHERE (SELECT set_config('synchronous_commit', 'off', true)) IS NOT NULL
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
    max_recalled: int = 0,
    dormant_after: int | None = None,
    lexical: LexicalQuery | None = None,
    lexical_weight: float = 0.0,
) -> list[asyncpg.Record]:
    """Run the search (docs/memory-rules.md, steps 2 and 4-6) in one statement and return the pre-search snapshot.

    With `query_vector` None nothing is scored or changed (failed search, decay off, no embedder).
    A memory's score is its cosine similarity plus `lexical_weight` x the IDF-weighted share of
    the `lexical` words it holds (hybrid scoring; weight 0 = cosine alone, as the plain rule words it).
    Returns the visible memories with `days_unused < desk_below_days` (the desk), those that joined
    the desk today, and the matches (`match_similarity`): the best `max_used` scoring at least
    `min_similarity` are used (`used_similarity`, reset), and up to `max_recalled` more dormant ones
    (`days_unused >= dormant_after`) come along for the prompt's tail without a reset. A used memory
    dormant as of this morning is a recall: its `desk_changed_on` becomes today. Values are as
    they were before this statement; `on_desk_this_morning` says whether the memory was active when
    today's first reply began (neither saved nor recalled today, and not dormant then).
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
    Changes nothing: no counter, no lock. Each row is a full memory row plus its `rank`.
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
