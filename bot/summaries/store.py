"""SQL of channel summaries and their on/off switches.

Only `bot.summaries.service` imports this module. The messages summarised belong to the chat log and
are read through it; the database itself marks a day summary stale when one of its messages is edited
or deleted (migrations/009_channel_summaries.sql).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import date, datetime

from bot.db import Connection
from bot.summaries.models import Kind, Status, Summary

COLUMNS = (
    "id, channel_id, guild_id, kind, period_start, status, summary, key_details, author_ids, message_count, stale,"
    " folded_into, edited_by, edited_at, attempts, retry_on, last_error, model, updated_at"
)


async def summaries_since(conn: Connection, channel_id: int, since: date) -> list[Summary]:
    rows = await conn.fetch(
        f"SELECT {COLUMNS} FROM channel_summaries WHERE channel_id = $1 AND period_start >= $2 ORDER BY period_start, kind",
        channel_id, since,
    )
    return [Summary.from_row(row) for row in rows]


async def get_summary(conn: Connection, summary_id: int) -> Summary | None:
    row = await conn.fetchrow(f"SELECT {COLUMNS} FROM channel_summaries WHERE id = $1", summary_id)
    return Summary.from_row(row) if row else None


async def get_period(conn: Connection, channel_id: int, kind: Kind, start: date) -> Summary | None:
    row = await conn.fetchrow(
        f"SELECT {COLUMNS} FROM channel_summaries WHERE channel_id = $1 AND kind = $2 AND period_start = $3",
        channel_id, kind.value, start,
    )
    return Summary.from_row(row) if row else None


# A day summary one of whose messages was edited or deleted is marked stale by the database (migration 009);
# unless an admin wrote its text, it holds withdrawn words: out of the prompt at once, and soon deleted
# (`purge_withdrawn`), with the week folded from it.
WITHDRAWN_DAY = "stale AND edited_by IS NULL"
WITHDRAWN_DAYS_OF_WEEK = (
    "SELECT 1 FROM channel_summaries d WHERE d.folded_into = w.id AND d.stale AND d.edited_by IS NULL"
)


async def prompt_summaries(
    conn: Connection, channel_id: int, scope_ids: Sequence[int], weeks: int, days_from: date, days_before: date
) -> list[Summary]:
    """The last `weeks` week summaries, then the unfolded day summaries in [days_from, days_before): oldest first.

    None when the switch of the first of `scope_ids` that has one (the channel, then its server) is off. One
    statement: it runs on every reply.
    """
    rows = await conn.fetch(
        f"WITH switch AS (SELECT coalesce(({first_switch('$5')}), true) AS enabled_here)"
        f" (SELECT {COLUMNS} FROM channel_summaries w WHERE (SELECT enabled_here FROM switch) AND channel_id = $1"
        f"  AND kind = 'week' AND status = 'ready' AND NOT EXISTS ({WITHDRAWN_DAYS_OF_WEEK}) ORDER BY period_start DESC LIMIT $2)"
        f" UNION ALL (SELECT {COLUMNS} FROM channel_summaries WHERE (SELECT enabled_here FROM switch) AND channel_id = $1"
        f"  AND kind = 'day' AND status = 'ready' AND folded_into IS NULL AND NOT ({WITHDRAWN_DAY})"
        "  AND period_start >= $3 AND period_start < $4)",
        channel_id, weeks, days_from, days_before, list(scope_ids),
    )
    found = [Summary.from_row(row) for row in rows]
    return sorted(found, key=lambda s: (s.kind != Kind.WEEK, s.period_start))


async def save_written(
    conn: Connection,
    *,
    channel_id: int,
    guild_id: int | None,
    kind: Kind,
    start: date,
    status: Status,
    summary: str,
    key_details: Sequence[str],
    author_ids: Sequence[int],
    first_message_id: int | None,
    last_message_id: int | None,
    message_count: int,
    model: str | None,
    at: datetime,
) -> Summary:
    """Store what the summary model wrote for a period (or that nothing could be), replacing what was there.

    Never replaces an edited summary: the WHERE of the upsert leaves it as it is and the row comes back unchanged.
    """
    row = await conn.fetchrow(
        "INSERT INTO channel_summaries (channel_id, guild_id, kind, period_start, status, summary, key_details,"
        " author_ids, first_message_id, last_message_id, message_count, model, created_at, updated_at)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9, $10, $11, $12, $13, $13)"
        " ON CONFLICT (channel_id, kind, period_start) DO UPDATE SET status = EXCLUDED.status, summary = EXCLUDED.summary,"
        "  key_details = EXCLUDED.key_details, author_ids = EXCLUDED.author_ids, first_message_id = EXCLUDED.first_message_id,"
        "  last_message_id = EXCLUDED.last_message_id, message_count = EXCLUDED.message_count, model = EXCLUDED.model,"
        "  stale = false, folded_into = NULL, attempts = 0, retry_on = NULL, last_error = NULL, updated_at = EXCLUDED.updated_at"
        "  WHERE channel_summaries.edited_by IS NULL"
        f" RETURNING {COLUMNS}",
        channel_id, guild_id, kind.value, start, status.value, summary, json.dumps(list(key_details), ensure_ascii=False),
        list(author_ids), first_message_id, last_message_id, message_count, model, at,
    )
    if row is None:  # edited meanwhile: kept
        found = await get_period(conn, channel_id, kind, start)
        assert found is not None
        return found
    return Summary.from_row(row)


async def save_failure(
    conn: Connection, *, channel_id: int, guild_id: int | None, kind: Kind, start: date, error: str, retry_on: date, at: datetime
) -> Summary:
    """A failed summary call: the period is 'missing' with one more attempt, retried from `retry_on` on.

    A summary that was there before (stale, being regenerated) stays shown: only a period with none becomes missing.
    """
    row = await conn.fetchrow(
        "INSERT INTO channel_summaries (channel_id, guild_id, kind, period_start, status, attempts, retry_on, last_error,"
        " created_at, updated_at) VALUES ($1, $2, $3, $4, 'missing', 1, $5, $6, $7, $7)"
        " ON CONFLICT (channel_id, kind, period_start) DO UPDATE SET attempts = channel_summaries.attempts + 1,"
        "  retry_on = EXCLUDED.retry_on, last_error = EXCLUDED.last_error, updated_at = EXCLUDED.updated_at"
        f" RETURNING {COLUMNS}",
        channel_id, guild_id, kind.value, start, retry_on, error[:500], at,
    )
    assert row is not None  # the statement always returns its row
    return Summary.from_row(row)


async def fold_days(conn: Connection, week_id: int, day_ids: Sequence[int]) -> None:
    await conn.execute("UPDATE channel_summaries SET folded_into = $1 WHERE id = ANY ($2::bigint[])", week_id, list(day_ids))


async def edit_summary(
    conn: Connection, summary_id: int, text: str, key_details: Sequence[str], by: int, at: datetime
) -> Summary | None:
    row = await conn.fetchrow(
        "UPDATE channel_summaries SET summary = $2, key_details = $3::jsonb, status = 'ready', stale = false,"
        " edited_by = $4, edited_at = $5, updated_at = $5, retry_on = NULL, last_error = NULL"
        f" WHERE id = $1 RETURNING {COLUMNS}",
        summary_id, text, json.dumps(list(key_details), ensure_ascii=False), by, at,
    )
    return Summary.from_row(row) if row else None


async def mark_deleted(conn: Connection, summary_id: int, at: datetime) -> bool:
    """An admin's delete: the text goes, the row stays as 'deleted' so the day is not summarised again by itself."""
    status = await conn.execute(
        "UPDATE channel_summaries SET status = 'deleted', summary = '', key_details = '[]', author_ids = '{}',"
        " edited_by = NULL, edited_at = NULL, stale = false, updated_at = $2 WHERE id = $1",
        summary_id, at,
    )
    return status.endswith(" 1")


async def forget_channel(conn: Connection, channel_id: int) -> int:
    await conn.execute("DELETE FROM summary_switches WHERE scope_id = $1", channel_id)
    await conn.execute("DELETE FROM day_notes WHERE channel_id = $1", channel_id)
    status = await conn.execute("DELETE FROM channel_summaries WHERE channel_id = $1", channel_id)
    return int(status.split()[-1])


async def forget_guild(conn: Connection, guild_id: int) -> int:
    status = await conn.execute("DELETE FROM channel_summaries WHERE guild_id = $1", guild_id)
    return int(status.split()[-1])


async def forget_author(conn: Connection, user_id: int) -> int:
    """Every summary built from a person's messages (edited ones too: they may still quote them)."""
    status = await conn.execute("DELETE FROM channel_summaries WHERE $1::bigint = ANY (author_ids)", user_id)
    return int(status.split()[-1])


# --- withdrawal wins (docs/memory-rules.md): what holds withdrawn words goes ---


async def purge_withdrawn(conn: Connection) -> list[tuple[int, int | None]]:
    """Delete the day summaries that hold an edited or deleted message (not those an admin wrote) and the weeks
    folded from them; returns (channel, server) of each, to be written again from what is left.

    Two statements: the second sees the weeks a fold that the first waited for has just committed.
    """
    days = await conn.fetch(
        f"DELETE FROM channel_summaries WHERE kind = 'day' AND {WITHDRAWN_DAY} RETURNING channel_id, guild_id, folded_into"
    )
    weeks = [row["folded_into"] for row in days if row["folded_into"] is not None]
    if weeks:
        await conn.execute("DELETE FROM channel_summaries WHERE id = ANY ($1::bigint[]) AND edited_by IS NULL", weeks)
    return sorted({(row["channel_id"], row["guild_id"]) for row in days})


async def mark_covering_stale(conn: Connection, moved: Sequence[tuple[int, int]]) -> None:
    """Mark stale the day summaries of `moved`'s (channel, message) pairs (messages that left those channels)."""
    await conn.execute(
        "UPDATE channel_summaries s SET stale = true FROM unnest($1::bigint[], $2::bigint[]) AS c (channel_id, message_id)"
        " WHERE s.kind = 'day' AND NOT s.stale AND s.channel_id = c.channel_id"
        "   AND c.message_id BETWEEN s.first_message_id AND s.last_message_id",
        [pair[0] for pair in moved], [pair[1] for pair in moved],
    )


async def withdraw_person(conn: Connection, user_id: int, guild_id: int | None) -> list[tuple[int, int | None]]:
    """Delete every summary that may hold a person's words (edited ones too: they may quote them), in one server or
    (guild_id None) everywhere; returns (channel, server) of each. Weeks go with their days: a week's authors are
    its days' authors."""
    rows = await conn.fetch(
        "DELETE FROM channel_summaries WHERE $1::bigint = ANY (author_ids) AND ($2::bigint IS NULL OR guild_id = $2)"
        " RETURNING channel_id, guild_id",
        user_id, guild_id,
    )
    return sorted({(row["channel_id"], row["guild_id"]) for row in rows})


async def places_of_author(conn: Connection, user_id: int) -> list[tuple[int, int | None]]:
    rows = await conn.fetch(
        "SELECT DISTINCT channel_id, guild_id FROM channel_summaries WHERE $1::bigint = ANY (author_ids)", user_id
    )
    return sorted((row["channel_id"], row["guild_id"]) for row in rows)


async def lock_days_unchanged(conn: Connection, days: Sequence[tuple[int, datetime]]) -> bool:
    """Whether each (day summary, updated_at) is still stored as read and holds nothing withdrawn; the rows stay
    locked (FOR SHARE) until the caller's transaction ends, so a withdrawal racing a week's fold waits for it."""
    rows = await conn.fetch(
        "SELECT id, updated_at FROM channel_summaries WHERE id = ANY ($1::bigint[])"
        f" AND status = 'ready' AND NOT ({WITHDRAWN_DAY}) ORDER BY id FOR SHARE",
        [day[0] for day in days],
    )
    return {(row["id"], row["updated_at"]) for row in rows} == set(days)


def first_switch(scopes: str) -> str:
    """SQL: the switch of the first of the `scopes` array that has one (a channel, then its server), or NULL."""
    return (
        f"SELECT enabled FROM summary_switches WHERE scope_id = ANY ({scopes}::bigint[])"
        f" ORDER BY array_position({scopes}::bigint[], scope_id) LIMIT 1"
    )


async def switch_for(conn: Connection, scope_ids: Sequence[int]) -> bool | None:
    """The switch of the first of `scope_ids` that has one (a channel, then its server); None when none has."""
    return await conn.fetchval(first_switch("$1"), list(scope_ids))


async def set_switch(conn: Connection, scope_id: int, guild_id: int | None, enabled: bool) -> None:
    await conn.execute(
        "INSERT INTO summary_switches (scope_id, guild_id, enabled) VALUES ($1, $2, $3)"
        " ON CONFLICT (scope_id) DO UPDATE SET enabled = EXCLUDED.enabled, updated_at = now()",
        scope_id, guild_id, enabled,
    )


async def switches(conn: Connection, guild_id: int) -> dict[int, bool]:
    """Every switch of a server: its own (scope_id = the server's id) and its channels'."""
    rows = await conn.fetch("SELECT scope_id, enabled FROM summary_switches WHERE guild_id = $1 OR scope_id = $1", guild_id)
    return {row["scope_id"]: row["enabled"] for row in rows}


async def notes_written_since(conn: Connection, channel_id: int, day: date) -> bool:
    """Whether this day, or a later one, of the channel already had its notes written."""
    return bool(
        await conn.fetchval("SELECT 1 FROM day_notes WHERE channel_id = $1 AND period_start >= $2 LIMIT 1", channel_id, day)
    )


async def claim_day_notes(conn: Connection, channel_id: int, guild_id: int | None, day: date, at: datetime) -> bool:
    """Claim a day's notes before writing them (once, whichever process gets there first); False: already claimed."""
    return bool(
        await conn.fetchval(
            "INSERT INTO day_notes (channel_id, period_start, guild_id, written_at) VALUES ($1, $2, $3, $4)"
            " ON CONFLICT (channel_id, period_start) DO NOTHING RETURNING 1",
            channel_id, day, guild_id, at,
        )
    )


async def count_day_notes(conn: Connection, channel_id: int, day: date, *, saved: int, updated: int, refused: int) -> None:
    await conn.execute(
        "UPDATE day_notes SET saved = $3, updated = $4, refused = $5 WHERE channel_id = $1 AND period_start = $2",
        channel_id, day, saved, updated, refused,
    )
