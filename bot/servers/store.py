"""SQL of the servers' and people's settings: personas, lore, server settings, blocklists, privacy.

Only `bot.servers.service` imports this module; functions take a connection, so the service owns the
transaction.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import asyncpg

from bot.db import Connection
from bot.servers.models import GuildSettings, LoreEntry, PersonaSettings, Privacy, PromptSettings, ReplyTriggers


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


async def blocked_or_private(
    conn: Connection, guild_id: int | None, user_ids: Sequence[int], levels: Sequence[str]
) -> set[int]:
    """Of `user_ids`, those blocked in `guild_id` or whose privacy is one of `levels`."""
    rows = await conn.fetch(
        "SELECT user_id FROM user_settings WHERE privacy = ANY ($3::text[]) AND user_id = ANY ($2::bigint[])"
        " UNION SELECT user_id FROM guild_blocklist WHERE guild_id = $1 AND user_id = ANY ($2::bigint[])",
        guild_id, list(user_ids), list(levels),
    )
    return {row["user_id"] for row in rows}


async def private_people_named(conn: Connection, text: str, user_ids: Sequence[int], min_name: int) -> list[tuple[int, str]]:
    """People with privacy `partial` or `full` that `text` may name: (id, the name the bot last saw them use).

    Those among `user_ids` (mentioned or written as ids), and those whose stored name (at least `min_name`
    characters) appears in the text, in any case; the caller checks that a name stands as a whole word. The names
    are the chat log's (`chat_users`), read here so the privacy check needs no second round trip.
    """
    rows = await conn.fetch(
        "SELECT us.user_id, coalesce(cu.name, '') AS name FROM user_settings us"
        " LEFT JOIN chat_users cu ON cu.user_id = us.user_id"
        " WHERE us.privacy IN ('partial', 'full')"
        "   AND (us.user_id = ANY ($2::bigint[])"
        "        OR (length(cu.name) >= $3 AND strpos(lower($1), lower(cu.name)) > 0))",
        text, list(user_ids), min_name,
    )
    return [(row["user_id"], row["name"]) for row in rows]


async def lock_people(conn: Connection, user_ids: Sequence[int], *, shared: bool) -> None:
    """Transaction-level locks on people (in id order): a change of what may be kept about someone (privacy,
    block, delete-my-data) takes theirs exclusively; work derived from their words takes it shared while it stores."""
    function = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
    await conn.execute(
        f"SELECT {function}(hashtextextended('person:' || p.id, 0))"
        " FROM (SELECT DISTINCT unnest($1::bigint[]) AS id ORDER BY 1) AS p",
        list(user_ids),
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


async def reply_trigger_facts(
    conn: Connection, guild_id: int | None, author_id: int, channel_ids: Sequence[int]
) -> ReplyTriggers:
    """In one round trip: the persona's name, whether a channel replies to everything, whether the author is blocked.

    A server whose persona does not exist yet answers to the default persona's name (it will be created from it).
    """
    row = await conn.fetchrow(
        "SELECT coalesce((SELECT name FROM personas WHERE guild_id = $1),"
        "                (SELECT name FROM personas WHERE guild_id IS NULL)) AS persona_name,"
        " coalesce((SELECT auto_reply_channel_ids && $3::bigint[] FROM guild_settings WHERE guild_id = $1), false)"
        "   AS auto_reply,"
        " EXISTS (SELECT 1 FROM guild_blocklist WHERE guild_id = $1 AND user_id = $2) AS blocked",
        guild_id,
        author_id,
        list(channel_ids),
    )
    assert row is not None  # the statement always returns its row
    return ReplyTriggers(row["persona_name"] or "", bool(row["auto_reply"]), bool(row["blocked"]))


def _persona_from_row(row: asyncpg.Record) -> PersonaSettings:
    attributes = row["attributes"]
    if isinstance(attributes, str):  # jsonb arrives as text unless a codec is registered
        attributes = json.loads(attributes)
    return PersonaSettings(row["id"], row["guild_id"], row["name"], row["prompt"] or "", dict(attributes or {}))


async def get_persona(conn: Connection, persona_id: int) -> PersonaSettings | None:
    row = await conn.fetchrow("SELECT id, guild_id, name, prompt, attributes FROM personas WHERE id = $1", persona_id)
    return _persona_from_row(row) if row else None


async def update_persona(
    conn: Connection,
    persona_id: int,
    *,
    name: str | None = None,
    prompt: str | None = None,
    attributes: dict[str, str] | None = None,
) -> PersonaSettings | None:
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


async def add_lore(conn: Connection, persona_id: int, text: str, created_by: int | None, max_entries: int) -> LoreEntry | None:
    """Add an entry unless the persona has `max_entries` already (None); one statement, so two adds at once cannot
    both pass the count."""
    row = await conn.fetchrow(
        "INSERT INTO lore_entries (persona_id, text, created_by)"
        " SELECT $1, $2, $3 WHERE (SELECT count(*) FROM lore_entries WHERE persona_id = $1) < $4"
        " RETURNING id, text, created_at",
        persona_id,
        text,
        created_by,
        max_entries,
    )
    return LoreEntry(row["id"], row["text"], row["created_at"]) if row else None


async def list_lore(conn: Connection, persona_id: int) -> list[LoreEntry]:
    rows = await conn.fetch("SELECT id, text, created_at FROM lore_entries WHERE persona_id = $1 ORDER BY id", persona_id)
    return [LoreEntry(row["id"], row["text"], row["created_at"]) for row in rows]


async def delete_lore(conn: Connection, persona_id: int, lore_id: int) -> bool:
    status = await conn.execute("DELETE FROM lore_entries WHERE persona_id = $1 AND id = $2", persona_id, lore_id)
    return status.endswith(" 1")


async def blocklist(conn: Connection, guild_id: int) -> list[tuple[int, datetime]]:
    rows = await conn.fetch("SELECT user_id, created_at FROM guild_blocklist WHERE guild_id = $1 ORDER BY created_at", guild_id)
    return [(row["user_id"], row["created_at"]) for row in rows]


async def user_settings_row(conn: Connection, user_id: int) -> asyncpg.Record | None:
    return await conn.fetchrow("SELECT privacy, updated_at FROM user_settings WHERE user_id = $1", user_id)


async def user_blocked_in(conn: Connection, user_id: int) -> list[int]:
    rows = await conn.fetch("SELECT guild_id FROM guild_blocklist WHERE user_id = $1 ORDER BY guild_id", user_id)
    return [row["guild_id"] for row in rows]


async def forget_user_settings(conn: Connection, user_id: int) -> dict[str, int]:
    """A user's part of delete-my-data among settings: their privacy level.

    Blocklist entries stay: they are the servers' moderation decisions, not the user's data to erase.
    """
    status = await conn.execute("DELETE FROM user_settings WHERE user_id = $1", user_id)
    return {"settings": int(status.split()[-1])}


PROMPT_SETTINGS_SQL = """
SELECT p.guild_id, p.name, p.prompt, p.attributes::text AS attributes,
       ARRAY(SELECT text FROM lore_entries WHERE persona_id = $1 ORDER BY id) AS lore,
       g.guild_id IS NOT NULL AS has_settings, g.notices, g.notice_verbosity, g.log_channel_id, g.self_teaching,
       g.member_teaching, g.personal_memories, g.tagging, g.auto_reply_channel_ids
FROM personas p LEFT JOIN guild_settings g ON g.guild_id = $2
WHERE p.id = $1
"""


async def prompt_settings(conn: Connection, persona_id: int, guild_id: int | None) -> PromptSettings:
    """What a reply's prompt needs from the server's settings, in one statement (read fresh per reply, so an
    admin's change made through another bot process shows on the next reply)."""
    row = await conn.fetchrow(PROMPT_SETTINGS_SQL, persona_id, guild_id)
    if row is None:
        raise LookupError(f"persona {persona_id} does not exist")
    guild = None
    if guild_id is not None:
        guild = GuildSettings.from_row(guild_id, row if row["has_settings"] else None)
    attributes = json.loads(row["attributes"]) if row["attributes"] else {}
    persona = PersonaSettings(persona_id, row["guild_id"], row["name"], row["prompt"] or "", attributes)
    return PromptSettings(persona, tuple(row["lore"]), guild)


async def not_to_be_noted(conn: Connection, guild_id: int | None) -> list[int]:
    """Everyone the model may write nothing about here: privacy `partial` or `full`, or blocked in this server."""
    rows = await conn.fetch(
        "SELECT user_id FROM user_settings WHERE privacy <> 'none'"
        " UNION SELECT user_id FROM guild_blocklist WHERE guild_id = $1",
        guild_id,
    )
    return sorted(row["user_id"] for row in rows)
