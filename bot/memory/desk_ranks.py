"""Which desk memories the prompt keeps first when the desk is larger than its share of the budget.

In a busy server most memories stay active (every reply resets a few), so the desk can be several
times MEMORY_TOKEN_BUDGET. The prompt builder then keeps, for each person (and for the server
list), the memories ranked first here: the most recently used, as the group stood when the bot
first saw it today. The ranking is frozen for the chat day, so a memory used in the middle of the
day does not push another out of the prompt head (it reaches this reply's tail instead), and the
head stays byte-identical from one reply to the next; memories that join a group later in the day
(saved, recalled) rank after the ones it had when first seen. A new UTC day ranks afresh.

The ranks live in this process only: after a restart, or in another process, the first reply of a
group ranks it again from the counters as they stand then, which can differ a little from this
morning's order (the head changes once, nothing else does).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, date, datetime

from bot.memory.models import Memory, MemoryList

GroupKey = tuple[int | None, int, int | None]  # (guild, persona, owner; None = the server list)


def recency(memory: Memory) -> tuple[float, int]:
    """Most recently used first; a memory never used counts from when it was saved; ties: the newer memory."""
    when = memory.last_used_at or memory.created_at or datetime.min.replace(tzinfo=UTC)
    return (-when.timestamp(), -memory.id)


class DeskRanks:
    """Day-frozen ranks of desk memories, per group (the server list, or one person's memories)."""

    def __init__(self) -> None:
        self._day: date | None = None
        self._groups: dict[GroupKey, dict[int, int]] = {}

    def ranks(self, guild_id: int | None, persona_id: int, desk: Iterable[Memory], today: date) -> dict[int, int]:
        """Rank of every desk memory inside its group (0 = kept first)."""
        if self._day != today:
            self._day = today
            self._groups = {}
        members: dict[GroupKey, list[Memory]] = {}
        for memory in desk:
            owner = None if memory.list == MemoryList.SERVER else memory.owner_id
            members.setdefault((guild_id, persona_id, owner), []).append(memory)
        out: dict[int, int] = {}
        for key, group in members.items():
            known = self._groups.get(key)
            if known is None:
                known = self._groups[key] = {}
            new = [memory for memory in group if memory.id not in known]
            for memory in sorted(new, key=recency):
                known[memory.id] = len(known)
            out.update((memory.id, known[memory.id]) for memory in group)
        return out

    def clear(self) -> None:
        self._groups = {}
