"""The hiding rules as SQL (docs/memory-rules.md, "What hides a memory"): one definition for everything the model is
shown or may change, so the per-reply search, its text fallback and what a save shows (the memories it resembles,
the one it forgets to make room) can never disagree.

Parameters: $1 guild, $2 persona, $3 channel (a thread's parent), $4 participants, $5 the words of the context
window (tags). `VISIBILITY_CTES` are the `guild` and `people` CTEs; `SEARCHABLE_LISTS` filters `memories m` to this
persona's server list and the lists of the participants whose personal memories may be used; `not_hidden(alias)`
filters any row with `channel_ids` and `tags` against the channel limits and tags (the query joins `guild`).
"""

from __future__ import annotations

VISIBILITY_CTES = """guild AS (
    SELECT coalesce(gs.tagging, false) AS tagging, coalesce(gs.personal_memories, true) AS personal_on
    FROM (VALUES (1)) AS one (x) LEFT JOIN guild_settings gs ON gs.guild_id = $1
),
people AS (
    SELECT p.user_id FROM unnest($4::bigint[]) AS p (user_id), guild
    WHERE ($1::bigint IS NULL OR guild.personal_on)
      AND NOT EXISTS (SELECT 1 FROM user_settings us WHERE us.user_id = p.user_id AND us.privacy = 'full')
      AND NOT EXISTS (SELECT 1 FROM guild_blocklist b WHERE b.guild_id = $1 AND b.user_id = p.user_id)
)"""

SEARCHABLE_LISTS = """(m.list = 'server' AND m.guild_id = $1 AND m.persona_id = $2)
       OR (m.list = 'personal' AND m.owner_id = ANY (ARRAY(SELECT user_id FROM people))
           AND (m.persona_id IS NULL OR m.persona_id = $2))"""


def not_hidden(alias: str) -> str:
    """The channel-limit and tag rules for rows of `alias`."""
    return f"""(cardinality({alias}.channel_ids) = 0 OR $3::bigint = ANY ({alias}.channel_ids))
      AND (NOT guild.tagging OR cardinality({alias}.tags) = 0 OR {alias}.tags && $5::text[])"""
