"""Changes to many memories, or to what scope a memory has: imports, scope moves, tags, and a user's
part of delete-my-data.

Like every change to memories, each is one transaction under the list's lock (the lock `save`
takes, so imports and saves never interleave).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC
from typing import Any

import asyncpg

from bot.clock import Clock
from bot.config import Settings
from bot.db import Connection
from bot.embeddings.service import Embeddings
from bot.errors import NotAllowed
from bot.memory import store, versions_store
from bot.memory.lists import ImportEntry, ListRef
from bot.memory.models import Memory, MemoryList


class BulkWrites:
    """Imports, scope moves and a user's memories for export or deletion."""

    def __init__(
        self, pool: asyncpg.Pool, embeddings: Embeddings, settings: Settings, clock: Clock
    ) -> None:
        self.pool = pool
        self.embeddings = embeddings
        self.settings = settings
        self.clock = clock

    async def move_scope(self, ref: ListRef, memory_id: int, *, to_global: bool) -> Memory:
        """Make a personal memory Global or tie it to `ref`'s persona; refused if a personal list would overfill."""
        assert ref.owner_id is not None
        async with self.pool.acquire() as conn, conn.transaction():
            await store.lock_list(conn, ref.lock_key)
            moved = await store.set_personal_scope(conn, memory_id, None if to_global else ref.persona_id, self.clock.now())
            sizes = await store.personal_sizes_all(conn, ref.owner_id, [ref.persona_id])
            limit = self.settings.personal_memory_limit
            if any(size > limit for size in sizes.values()):
                raise NotAllowed(
                    f"making it Global would put more than {limit} memories in one of your personal lists "
                    "(Global memories count in every server); delete some first"
                )
        return moved

    async def import_entries(
        self, ref: ListRef, plan_entries: Sequence[ImportEntry], *, replace: bool, by: int, limit: int
    ) -> tuple[list[int], int, int, int]:
        """Merge or replace in ONE transaction: (new ids, removed, skipped as already there, embedded).

        What can be embedded now is; the rest waits for the background re-embedder.
        Merge skips texts the list already has; replace first deletes the list (for personal lists:
        the Global memories and those tied to this persona). A result over `limit` is refused, never trimmed.
        """
        target = ref.widened() if ref.list == MemoryList.PERSONAL else ref
        # what can be embedded now is; the rest waits for the background re-embedder
        vectors = await self.embeddings.embed_available([entry.text for entry in plan_entries], "imported memories")
        entries = list(zip(plan_entries, vectors, strict=True))
        space = await self.embeddings.space_id()
        now = self.clock.now().astimezone(UTC)
        removed_ids: list[int] = []
        async with self.pool.acquire() as conn, conn.transaction():
            await store.lock_list(conn, ref.lock_key)
            where, args = target.filter()
            chosen = list(entries)
            skipped = 0
            if replace:
                removed_ids = await store.delete_list(conn, where, args)
            else:
                existing = {(m.is_global, m.text.casefold()) for m in await store.list_memories(conn, where, args)}
                kept = [(entry, vector) for entry, vector in chosen if (entry.is_global, entry.text.casefold()) not in existing]
                skipped = len(chosen) - len(kept)
                chosen = kept
            ids = await store.insert_imported(
                conn,
                [
                    {
                        "text": entry.text,
                        "tags": entry.tags,
                        "channel_ids": entry.channel_ids,
                        "persona_id": None if entry.is_global else ref.persona_id,
                    }
                    for entry, _ in chosen
                ],
                memory_list=ref.list,
                guild_id=ref.guild_id if ref.list == MemoryList.SERVER else None,
                owner_id=ref.owner_id if ref.list == MemoryList.PERSONAL else None,
                created_by=by,
                now=now,
                today=now.date(),
            )
            await self._refuse_over_limit(conn, ref, where, args, limit)
            embedded = 0
            if space is not None:
                for memory_id, (entry, vector) in zip(ids, chosen, strict=True):
                    if vector is not None and await store.store_vector(conn, memory_id, space, vector, entry.text):
                        embedded += 1
        if space is not None and embedded < len(ids):
            self.embeddings.want_vectors()
        return ids, len(removed_ids), skipped, embedded

    async def _refuse_over_limit(self, conn: Connection, ref: ListRef, where: str, args: list[Any], limit: int) -> None:
        if ref.list == MemoryList.SERVER:
            size = await store.count_list(conn, where, args)
            if size > limit:
                raise NotAllowed(
                    f"this import would leave {size} server memories; the limit is {limit}. "
                    "Delete some first, import fewer, or use mode replace"
                )
            return
        assert ref.owner_id is not None
        sizes = await store.personal_sizes_all(conn, ref.owner_id, [ref.persona_id])
        worst = max(sizes.values(), default=0)
        if worst > limit:
            raise NotAllowed(
                f"this import would leave {worst} memories in one of your personal lists "
                f"(Global memories count in every server); the limit is {limit}"
            )

    async def export_user(self, conn: Connection, user_id: int) -> dict[str, Any]:
        """A user's memories for export-my-data (inside the caller's snapshot): rows, for the command layer to shape."""
        personal = await store.user_personal_memories(conn, user_id)
        versions = await versions_store.versions_of_memories(conn, [row["id"] for row in personal])
        return {
            "personal": personal,
            "authored": await store.user_authored_server_memories(conn, user_id),
            "versions": {memory_id: [v.as_export() for v in found] for memory_id, found in versions.items()},
        }

    async def forget_user(self, conn: Connection, user_id: int) -> dict[str, int]:
        """A user's part of delete-my-data among memories and their versions (inside the caller's transaction; the
        caller has locked the person, so a day-end note about them in flight waits, then finds them gone)."""
        versions = await versions_store.forget_user_versions(conn, user_id)
        return await store.forget_user_memories(conn, user_id) | {"memory_versions": versions}
