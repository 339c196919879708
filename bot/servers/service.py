"""The owner of servers' and people's settings: personas, always-on lore, server settings, blocklists and
privacy levels.

These are the stored inputs of the hiding rules (docs/memory-rules.md, "What hides a memory") and
of the prompt's stable head. The memory search reads them inside its one statement; every change
goes through here.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

import asyncpg

from bot.config import Settings
from bot.db import Connection
from bot.errors import NotAllowed, NotFound
from bot.servers import rules, store
from bot.servers.models import Actor, GuildSettings, LoreEntry, PersonaSettings, Privacy, PromptSettings, ReplyTriggers

ID_IN_TEXT = re.compile(r"<@!?(\d{1,20})>|(?<!\d)(\d{15,20})(?!\d)")  # a <@id> / <@!id> mention, or a bare Discord id
MIN_NAME_CHARS = 3


class Servers:
    def __init__(self, pool: asyncpg.Pool, settings: Settings) -> None:
        self.pool = pool
        self.settings = settings
        self._personas: dict[int | None, int] = {}

    @contextlib.asynccontextmanager
    async def _using(self, conn: Connection | None) -> AsyncIterator[Connection]:
        """The caller's connection (a read inside its transaction, e.g. a rule checked under a row lock), or one of ours."""
        if conn is not None:
            yield conn
            return
        async with self.pool.acquire() as own:
            yield own

    async def sync_default_persona(self) -> None:
        """Make the default persona follow DEFAULT_PERSONA_NAME / DEFAULT_PERSONA_PROMPT."""
        async with self.pool.acquire() as conn:
            await store.sync_default_persona(conn, self.settings.default_persona_name, self.settings.default_persona_prompt)

    # --- personas and lore ---

    async def persona_id(self, guild_id: int | None) -> int:
        """The persona of a server (created from the default on first use), cached: it never changes."""
        persona = self._personas.get(guild_id)
        if persona is None:
            async with self.pool.acquire() as conn:
                persona = await store.persona_for_guild(conn, guild_id)
            self._personas[guild_id] = persona
        return persona

    async def persona(self, guild_id: int | None) -> PersonaSettings:
        persona_id = await self.persona_id(guild_id)
        async with self.pool.acquire() as conn:
            found = await store.get_persona(conn, persona_id)
        if found is None:
            raise NotFound(f"persona {persona_id} does not exist")
        return found

    async def update_persona(
        self,
        guild_id: int,
        actor: Actor,
        *,
        name: str | None = None,
        prompt: str | None = None,
        attributes: Mapping[str, str] | None = None,
    ) -> PersonaSettings:
        """Change a server's persona (Manage Server): its name, prompt or all its attributes, each checked."""
        rules.require_manager(actor)
        persona_id = await self.persona_id(guild_id)
        async with self.pool.acquire() as conn:
            updated = await store.update_persona(
                conn, persona_id,
                name=None if name is None else rules.persona_name(name),
                prompt=None if prompt is None else rules.persona_prompt(prompt),
                attributes=None if attributes is None else rules.attributes(attributes),
            )
        if updated is None:
            raise NotFound(f"persona {persona_id} does not exist")
        return updated

    async def set_persona_attribute(
        self, guild_id: int, actor: Actor, key: str, value: str | None
    ) -> tuple[str, str | None]:
        """Set (or, with no value, remove) one persona attribute; returns the key and value as stored."""
        rules.require_manager(actor)
        attributes = dict((await self.persona(guild_id)).attributes)
        key, shown = rules.attribute(key, value)
        if shown is None:
            if attributes.pop(key, None) is None:
                raise NotFound(f"the persona has no attribute {key!r}")
        else:
            if key not in attributes and len(attributes) >= rules.MAX_ATTRIBUTES:
                raise NotAllowed(f"a persona can have at most {rules.MAX_ATTRIBUTES} attributes; remove one first")
            attributes[key] = shown
        await self.update_persona(guild_id, actor, attributes=attributes)
        return key, shown

    async def lore(self, guild_id: int | None) -> list[LoreEntry]:
        persona_id = await self.persona_id(guild_id)
        async with self.pool.acquire() as conn:
            return await store.list_lore(conn, persona_id)

    async def add_lore(self, guild_id: int, actor: Actor, text: str) -> LoreEntry:
        """An always-on lore entry (Manage Server): at most LORE_MAX_CHARS characters, MAX_LORE_ENTRIES per server."""
        rules.require_manager(actor)
        cleaned = rules.lore_text(text)
        persona_id = await self.persona_id(guild_id)
        async with self.pool.acquire() as conn:
            added = await store.add_lore(conn, persona_id, cleaned, actor.user_id, rules.MAX_LORE_ENTRIES)
        if added is None:
            raise NotAllowed(f"a server can have at most {rules.MAX_LORE_ENTRIES} lore entries; remove one first")
        return added

    async def remove_lore(self, guild_id: int, actor: Actor, lore_id: int) -> None:
        rules.require_manager(actor)
        persona_id = await self.persona_id(guild_id)
        async with self.pool.acquire() as conn:
            removed = await store.delete_lore(conn, persona_id, lore_id)
        if not removed:
            raise NotFound(f"there is no lore entry #{lore_id} in this server")

    async def prompt_settings(self, persona_id: int, guild_id: int | None) -> PromptSettings:
        """Persona, lore texts and server settings for one reply's prompt, in one statement, read fresh."""
        async with self.pool.acquire() as conn:
            return await store.prompt_settings(conn, persona_id, guild_id)

    # --- server settings and blocklists ---

    async def guild_settings(self, guild_id: int, conn: Connection | None = None) -> GuildSettings:
        async with self._using(conn) as using:
            return await store.get_guild_settings(using, guild_id)

    async def update_guild_settings(self, guild_id: int, actor: Actor, **changes: object) -> GuildSettings:
        """Change server settings (Manage Server); every name and value is checked, all or nothing."""
        rules.require_manager(actor)
        async with self.pool.acquire() as conn, conn.transaction():
            current = await store.get_guild_settings(conn, guild_id)
            return await store.update_guild_settings(conn, guild_id, rules.checked_settings(changes, current))

    async def set_auto_reply(self, guild_id: int, actor: Actor, channel_id: int, enabled: bool) -> GuildSettings:
        """Answer every message in a channel, or stop (at most MAX_AUTO_REPLY_CHANNELS per server)."""
        rules.require_manager(actor)
        current = list((await self.guild_settings(guild_id)).auto_reply_channel_ids)
        if enabled == (channel_id in current):
            state = "already" if enabled else "not"
            raise NotAllowed(f"<#{channel_id}> is {state} an auto-reply channel")
        wanted = [*current, channel_id] if enabled else [channel for channel in current if channel != channel_id]
        return await self.update_guild_settings(guild_id, actor, auto_reply_channel_ids=wanted)

    async def is_blocked(self, guild_id: int, user_id: int, conn: Connection | None = None) -> bool:
        async with self._using(conn) as using:
            return await store.is_blocked(using, guild_id, user_id)

    async def left_out(
        self, guild_id: int | None, user_ids: Sequence[int], levels: Collection[Privacy], conn: Connection | None = None
    ) -> set[int]:
        """Of `user_ids`, those whose words work derived from a chat may not hold: blocked in this server, or with
        one of the privacy `levels` (summaries: `full`; day-end notes: `partial` and `full`)."""
        if not user_ids:
            return set()
        async with self._using(conn) as using:
            return await store.blocked_or_private(using, guild_id, user_ids, [level.value for level in levels])

    async def private_people_named(self, text: str, conn: Connection | None = None) -> set[int]:
        """People with privacy `partial` or `full` whom `text` names (docs/memory-rules.md, "Saving and forgetting"): a
        mention (`<@id>`), their id, or the name the bot last saw them use, as a whole word in any case (names shorter
        than 3 characters only by mention or id: "Al" would be found in too many texts)."""
        ids = [int(number) for pair in ID_IN_TEXT.findall(text) for number in pair if number and int(number) < 2**63]
        async with self._using(conn) as using:
            candidates = await store.private_people_named(using, text, ids, MIN_NAME_CHARS)
        folded = text.casefold()
        return {
            user_id for user_id, name in candidates
            if user_id in ids or re.search(rf"(?<!\w){re.escape(name.casefold())}(?!\w)", folded)
        }
    async def not_to_be_noted(self, guild_id: int | None) -> list[int]:
        """Users the model may write nothing about here (privacy partial or full, or blocked in this server)."""
        async with self.pool.acquire() as conn:
            return await store.not_to_be_noted(conn, guild_id)

    async def lock_people(self, conn: Connection, user_ids: Sequence[int], *, shared: bool) -> None:
        """Inside the caller's transaction: exclusive for a change of what may be kept about someone, shared for work
        that stores what was derived from their words (docs/memory-rules.md, "Withdrawal wins")."""
        await store.lock_people(conn, user_ids, shared=shared)

    async def set_blocked(self, guild_id: int, user_id: int, blocked: bool, conn: Connection | None = None) -> None:
        async with self._using(conn) as using:
            await store.set_blocked(using, guild_id, user_id, blocked)

    async def blocklist(self, guild_id: int) -> list[tuple[int, datetime]]:
        async with self.pool.acquire() as conn:
            return await store.blocklist(conn, guild_id)

    async def trigger_facts(self, guild_id: int | None, author_id: int, channel_ids: Sequence[int]) -> ReplyTriggers:
        """The persona's name, whether a channel replies to everything, whether the author is blocked: one round trip."""
        async with self.pool.acquire() as conn:
            return await store.reply_trigger_facts(conn, guild_id, author_id, channel_ids)

    # --- people ---

    async def privacy(self, user_id: int, conn: Connection | None = None) -> Privacy:
        async with self._using(conn) as using:
            return await store.get_privacy(using, user_id)

    async def set_privacy(self, user_id: int, level: Privacy, conn: Connection | None = None) -> None:
        async with self._using(conn) as using:
            await store.set_privacy(using, user_id, level)

    async def export_user(self, conn: Connection, user_id: int) -> dict[str, Any]:
        """A user's settings for export-my-data (inside the caller's snapshot)."""
        row = await store.user_settings_row(conn, user_id)
        return {
            "privacy": row["privacy"] if row else Privacy.NONE.value,
            "blocked_in_servers": await store.user_blocked_in(conn, user_id),
        }

    async def forget_user(self, conn: Connection, user_id: int) -> dict[str, int]:
        """A user's part of delete-my-data among settings (inside the caller's transaction)."""
        return await store.forget_user_settings(conn, user_id)
