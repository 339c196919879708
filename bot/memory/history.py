"""A memory's versions, as the commands see them: its history page by page, a restore, and the versions an
export carries.

Every change of a memory's text keeps the text it replaced (`bot.memory.versions_store`, written by the
change itself in its transaction); this reads them and turns one back into the memory's text. A restore is a
command edit like any other: it protects the memory and keeps the text it replaces as a version too, so a
restore can itself be undone.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from bot.errors import InvalidInput, NotFound
from bot.memory import command_rights as rights
from bot.memory import store, versions_store
from bot.memory.lists import ListRef
from bot.memory.models import Memory, MemoryVersion, SaveResult, Source, done_or_refused
from bot.memory.service import MemoryCore
from bot.servers.models import Actor

HISTORY_PAGE_SIZE = 5


@dataclass(frozen=True)
class HistoryPage:
    """One page of a memory's versions, newest first (`number` is 0-based)."""

    memory: Memory
    versions: list[MemoryVersion]
    number: int
    size: int
    total: int

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.size))


class MemoryHistory:
    """`/memories history`, `/personal memories history`, their restore, and the console's `/history ID`."""

    def __init__(self, core: MemoryCore) -> None:
        self.core = core

    async def _memory(self, ref: ListRef, memory_id: int) -> Memory:
        async with self.core.pool.acquire() as conn:
            memory = await store.get_memory(conn, memory_id)
        if memory is None or not ref.contains(memory):
            raise NotFound(f"there is no memory #{memory_id} in {ref.label}")
        return memory

    async def page(self, ref: ListRef, memory_id: int, number: int = 0, size: int = HISTORY_PAGE_SIZE) -> HistoryPage:
        """Page `number` of a memory's versions, newest first (clamped to the last page)."""
        memory = await self._memory(ref, memory_id)
        async with self.core.pool.acquire() as conn:
            total = await versions_store.count_versions(conn, memory_id)
            pages = max(1, -(-total // size))
            number = min(max(number, 0), pages - 1)
            versions = await versions_store.versions_of(conn, memory_id, offset=number * size, limit=size)
        return HistoryPage(memory, versions, number, size, total)

    async def restore(self, ref: ListRef, memory_id: int, version_id: int, *, actor: Actor) -> SaveResult:
        """Make a version's text the memory's text again: a command edit (protects the memory; the text it
        replaces becomes a version). Who may restore is who may edit."""
        memory = await self._memory(ref, memory_id)
        await rights.may_change(self.core.servers, ref, memory, actor, "restore")
        async with self.core.pool.acquire() as conn:
            version = await versions_store.get_version(conn, version_id)
        if version is None or version.memory_id != memory_id:
            raise NotFound(f"memory #{memory_id} has no version #{version_id}; its history lists them")
        if version.text == memory.text:
            raise InvalidInput(f"version #{version_id} is the text memory #{memory_id} already has")
        result = await self.core.edit(
            memory_id, version.text, by=actor.user_id, via=Source.COMMAND, by_can_manage=actor.can_manage,
            reason=f"restored version #{version_id}",
        )
        return done_or_refused(result, "not restored")

    async def for_export(self, memory_ids: Collection[int]) -> dict[int, list[dict[str, Any]]]:
        """The versions of each memory, newest first, as export entries."""
        async with self.core.pool.acquire() as conn:
            found = await versions_store.versions_of_memories(conn, memory_ids)
        return {memory_id: [v.as_export() for v in versions] for memory_id, versions in found.items()}


def describe_version(version: MemoryVersion, names: dict[int, str]) -> tuple[str, str]:
    """("version #34 · written 2026-01-05 10:02 UTC", "replaced 2026-01-06 09:00 UTC by Juno with a command: ...").

    `names` shows the people (display names, or mentions in Discord); one missing is "user ID"."""
    who = names.get(version.replaced_by, f"user {version.replaced_by}") if version.replaced_by is not None else "someone"
    how = {
        "bot": f"by the model for {who}",
        "command": f"by {who} with a command",
        "notes": f"by the day-end notes, from {who}'s words",
        "merge": "by a merge",
    }[version.replaced_via.value]
    reason = f": {version.reason}" if version.reason else ""
    return f"version #{version.id} · written {_day(version.written_at)}", f"replaced {_day(version.replaced_at)} {how}{reason}"


def _day(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
