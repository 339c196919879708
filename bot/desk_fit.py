"""Which desk memories fit the desk's share of MEMORY_TOKEN_BUDGET (docs/memory-rules.md, "Budgets").

The memory budget has two parts: the desk's share (the prompt head) and a reserved share for the
tail, where this reply's matches go. When the whole desk fits its share it is shown whole, as it
always was. When it does not (a busy server: many people, most memories active), cutting the desk
in prompt order would give the whole budget to the server list and the people with the lowest ids,
the oldest accounts on Discord. Instead, the share is split fairly:

- the server list and each participant is a *group*; every group gets an equal part of the share,
  and a group that needs less than its part (a small desk) leaves the rest to the others
  (max-min fairness, "water-filling"), so no id decides who is remembered;
- inside a group the memories ranked first are kept (`bot.memory.desk_ranks`: most recently
  used, frozen for the chat day), the others are left out of the head for this reply. A used one
  that is left out still reaches the prompt: the prompt builder puts it in the tail;
- what is kept is shown in the usual prompt order (by id), so the head depends only on the desk,
  the participants and the day's ranks, and stays byte-identical from reply to reply.

`prefix` (DESK_FIT=prefix) is the older rule, kept for comparison: the desk in prompt order until
the share is spent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from bot.memory.desk_ranks import recency
from bot.memory.models import Memory, MemoryList


@dataclass(frozen=True)
class DeskFit:
    kept: list[Memory]  # in prompt order
    cut: list[Memory]  # in prompt order
    spent: int
    shares: dict[int, int] = field(default_factory=dict)  # tokens each group could take (0 = the server list)


def group_of(memory: Memory) -> int:
    """0 for the server list, else the owner's id."""
    return 0 if memory.list == MemoryList.SERVER else (memory.owner_id or 0)


def water_fill(needs: Mapping[int, int], budget: int) -> dict[int, int]:
    """An equal part of `budget` for every group, capped at its need; what small groups leave goes to the others."""
    parts: dict[int, int] = {}
    left = budget
    order = sorted(needs, key=lambda group: needs[group])
    for done, group in enumerate(order):
        parts[group] = min(needs[group], left // (len(order) - done))
        left -= parts[group]
    return parts


def fit_desk(
    desk: Sequence[Memory],
    share: int,
    cost: Callable[[Memory], int],
    header_cost: Callable[[int], int],
    ranks: Mapping[int, int] | None = None,
    rule: str = "fair",
) -> DeskFit:
    """The desk memories the head shows within `share` tokens; `cost` is a memory's line, `header_cost` a
    personal group's heading (0 for the server list)."""
    costs = {memory.id: cost(memory) for memory in desk}
    members: dict[int, list[Memory]] = {}
    for memory in desk:
        members.setdefault(group_of(memory), []).append(memory)
    needs = {group: header_cost(group) + sum(costs[m.id] for m in group_members) for group, group_members in members.items()}
    if sum(needs.values()) <= share:
        return DeskFit(list(desk), [], sum(needs.values()), needs)
    if rule == "prefix":
        return _prefix(desk, share, costs, header_cost)
    parts = water_fill(needs, share)
    kept_ids: set[int] = set()
    spent = 0
    rank = ranks or {}
    for group, group_members in members.items():
        room = parts[group] - header_cost(group)
        chosen = 0
        for memory in sorted(group_members, key=lambda m: (rank.get(m.id, len(rank)), recency(m))):
            if costs[memory.id] <= room:
                kept_ids.add(memory.id)
                room -= costs[memory.id]
                chosen += costs[memory.id]
        if chosen:
            spent += chosen + header_cost(group)
    kept = [memory for memory in desk if memory.id in kept_ids]
    cut = [memory for memory in desk if memory.id not in kept_ids]
    return DeskFit(kept, cut, spent, parts)


def _prefix(desk: Sequence[Memory], share: int, costs: Mapping[int, int], header_cost: Callable[[int], int]) -> DeskFit:
    kept: list[Memory] = []
    cut: list[Memory] = []
    spent = 0
    group: int | None = None
    for memory in desk:
        here = costs[memory.id] + (header_cost(group_of(memory)) if group_of(memory) != group else 0)
        if cut or spent + here > share:
            cut.append(memory)  # once one is cut, later ones are too: "a prefix of the desk"
            continue
        kept.append(memory)
        spent += here
        group = group_of(memory)
    return DeskFit(kept, cut, spent)
