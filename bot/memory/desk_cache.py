"""The core's cache of the desk, so a reply's search sends back only what changed (docs/benchmarks.md §1).

Every reply's search returns its whole snapshot: the desk (≈ 60 memories in a busy server) and
the matches. Turning ≈ 60 rows × 17 columns into `Memory` objects on every reply was most of the
gap between the search and a bare top-k. The desk hardly changes between two replies, so the core
keeps the `Memory` objects it already built and tells the statement which ones it holds, each with
its row version (`stamp`: the row's xmin, the transaction that wrote that version). The statement
(`store.REPLY_SEARCH_SQL`) then returns a full row only for a snapshot memory the cache lacks or
holds with another stamp, the id and similarities of every other match, and a marker for each held
memory that is not in the snapshot any more (it left the desk, was hidden, changed or deleted).
The rows sent are read by primary key at the end of the statement, so the search itself carries
only ids, counters and stamps through its joins. A memory sent that the statement itself reset or
aged comes with the new row version's stamp and counters (`next_*`): the cache holds that version
from then on, so the next reply does not send it again in full (the memories a reply uses would
otherwise come back in full on the next one). The reply itself still sees the values from before
the search.

Why this is exact: any write to a memory (counters, text, tags, channel limits, owner, persona)
creates a new row version with a new xmin, and nothing of a `Memory` lives outside its row, so
"same id, same stamp" means the held `Memory` is the one the statement would have built. What is
in the snapshot is decided by the statement every time (visibility, privacy, blocklists, tags,
channel, desk rule); the cache only supplies the values of rows it already has. A held memory
the statement neither returns nor marks is therefore in the snapshot, unchanged and unmatched.

The cache is keyed by *parts* of the searchable set, not by conversation: the server list of a
persona and each participant's personal list under that persona, so replies in other channels
or with other participants reuse what they share. A part holds the snapshot memories of its list
as the last search that covered it saw them (hidden ones are dropped: they come back in full when
they reappear). A part not written today or yesterday (UTC, the core's clock) is not offered: the
first reply of a chat day still finds the day before's parts (it ages the whole set, so the next
reply reads it again anyway), and since every memory of a searched part is aged or reset on each
chat day, a held stamp is never more than about two days of transactions old, far from the
2^32 after which an xid can repeat. Total size is bounded (least recently used parts go first);
a bound of 0 turns it off.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from datetime import date
from operator import itemgetter
from typing import Any

from bot.memory.models import Memory, MemoryList

PartKey = tuple[bool, int, int]
"""(is a server list, guild id or user id, persona id)."""

OrderKey = tuple[bool, int, int]

Held = dict[int, tuple[int, Memory, PartKey, OrderKey]]
"""memory id -> (stamp, Memory, the part it belongs to, its prompt order key)."""

DEFAULT_MAX_MEMORIES = 20_000  # ≈ 20 MB of Memory objects at most; a busy server's desk is ≈ 60


def prompt_order(memory: Memory) -> OrderKey:
    """prompt order of the desk: server memories by id, then personal memories grouped by user, each by id."""
    return (memory.list != MemoryList.SERVER, memory.owner_id or 0, memory.id)


_ORDER = itemgetter(3)  # an entry's prompt order key, for sorting without a Python call per memory


def _as_written(memory: Memory, row: Mapping[str, Any]) -> Memory:
    """The memory as the search's own UPDATE left it: the same row with the new counters (`next_*`).

    Equal to `Memory.from_row` of the new row version: the UPDATE writes these four columns only.
    Built by copying the instance's fields (a frozen dataclass without slots), ≈ 10x cheaper than
    `dataclasses.replace`, which matters on a day's first reply (every desk memory ages).
    """
    written = object.__new__(Memory)
    fields = written.__dict__
    fields.update(memory.__dict__)
    fields["days_unused"] = row["next_days_unused"]
    fields["last_used_at"] = row["next_last_used_at"]
    fields["last_aged_on"] = row["next_last_aged_on"]
    fields["desk_changed_on"] = row["next_desk_changed_on"]
    return written


def _fresh_enough(stored: date, today: date) -> bool:
    """A part last written today or yesterday (in the core's clock) may be offered."""
    return 0 <= (today - stored).days <= 1


class DeskCache:
    """Snapshot memories by searchable-set part, least recently used first, at most `max_memories` in all."""

    def __init__(self, max_memories: int = DEFAULT_MAX_MEMORIES) -> None:
        self.max_memories = max_memories
        self._parts: OrderedDict[PartKey, tuple[date, Held]] = OrderedDict()  # least recently used first
        self._size = 0

    def __len__(self) -> int:
        """How many memories are held in all (a memory can be held under several personas)."""
        return self._size

    @staticmethod
    def parts(guild_id: int | None, persona_id: int, participants: Iterable[int]) -> list[PartKey]:
        """The parts a reply's searchable set is made of: the server list (not in DMs) and each participant's."""
        keys: list[PartKey] = [(False, user, persona_id) for user in participants]
        if guild_id is not None:
            keys.append((True, guild_id, persona_id))
        return keys

    def held(self, keys: Sequence[PartKey], today: date) -> Held:
        """What the cache holds for these parts, from a search made today or yesterday."""
        self._sweep(today)
        held: Held = {}
        for key in keys:
            found = self._parts.get(key)
            if found is None:
                continue
            day, part = found
            if not _fresh_enough(day, today):
                self._drop(key)
                continue
            self._parts.move_to_end(key)
            held.update(part)
        return held

    def resolve(
        self, keys: Sequence[PartKey], held: Held, rows: Iterable[Mapping[str, Any]], today: date
    ) -> tuple[list[Memory], dict[int, tuple[Any, Any, Memory]]]:
        """The whole snapshot, in prompt order, and (used, match similarity, the memory) of each match by id.

        Built from the statement's rows and what was held, and remembered for the next reply.
        Nothing is changed before every row has been read, so an error leaves the cache as it was.
        Only the parts whose memories changed are rewritten (a copy of the part, then swapped in).
        """
        persona = keys[0][2] if keys else 0
        fresh: Held = {}  # this reply's snapshot where the cache lacked the memory or held another version
        written: Held = {}  # the versions this search wrote (resets, agings), to hold from now on
        gone: list[int] = []
        similarities: dict[int, tuple[Any, Any, Memory]] = {}
        for row in rows:
            memory_id = row["id"]
            if memory_id is None:  # held, but not in the snapshot any more
                gone.append(row["known_id"])
                continue
            stamp = row["stamp"]
            entry = held.get(memory_id)
            if entry is None or entry[0] != stamp:
                memory = Memory.from_row(row)
                server = memory.list is MemoryList.SERVER
                key = (server, memory.guild_id if server else memory.owner_id, persona)
                entry = fresh[memory_id] = (stamp, memory, key, prompt_order(memory))
            next_stamp = row["next_stamp"]
            if next_stamp is not None:
                written[memory_id] = (next_stamp, _as_written(entry[1], row), entry[2], entry[3])
            used, match = row["used_similarity"], row["match_similarity"]
            if used is not None or match is not None:
                similarities[memory_id] = (used, match, entry[1])
        snapshot = {**held, **fresh}
        for memory_id in gone:
            snapshot.pop(memory_id, None)
        ordered = [entry[1] for entry in sorted(snapshot.values(), key=_ORDER)]
        if self.max_memories > 0 and (fresh or gone or written):
            self._store(keys, held, {**fresh, **written}, gone, today)
        return ordered, similarities

    def _store(self, keys: Sequence[PartKey], held: Held, fresh: Held, gone: list[int], today: date) -> None:
        """Apply what changed to the parts it belongs to.

        Starts from each part as it is now, which may already be another reply's version of it:
        any mix is still right, since every held memory is checked against its row's version.
        """
        searched = set(keys)
        changed: dict[PartKey, Held] = {}

        def part(key: PartKey) -> Held:
            found = changed.get(key)
            if found is None:
                current = self._parts.get(key)
                kept = current is not None and _fresh_enough(current[0], today)
                found = changed[key] = dict(current[1]) if kept and current is not None else {}
            return found

        for memory_id in gone:
            was = held.get(memory_id)
            if was is not None:
                part(was[2]).pop(memory_id, None)
        for memory_id, entry in fresh.items():
            was = held.get(memory_id)
            if was is not None and was[2] != entry[2]:  # moved to another list (owner or persona changed)
                part(was[2]).pop(memory_id, None)
            if entry[2] in searched:
                part(entry[2])[memory_id] = entry
        for key, memories in changed.items():
            self._drop(key)
            if memories:
                self._parts[key] = (today, memories)
                self._size += len(memories)
        while self._size > self.max_memories and self._parts:
            self._drop(next(iter(self._parts)))

    def _drop(self, key: PartKey) -> None:
        found = self._parts.pop(key, None)
        if found is not None:
            self._size -= len(found[1])

    def clear(self) -> None:
        self._parts.clear()
        self._size = 0

    def discard(self, memory_ids: Iterable[int]) -> None:
        """Let go of deleted memories at once. A deleted memory is never served (its row is gone, so the
        next search marks it gone), but its text should not stay in the process's memory either."""
        doomed = set(memory_ids)
        for key, (day, part) in list(self._parts.items()):
            kept = {memory_id: entry for memory_id, entry in part.items() if memory_id not in doomed}
            if len(kept) != len(part):
                self._drop(key)
                if kept:
                    self._parts[key] = (day, kept)
                    self._size += len(kept)

    def discard_owner(self, user_id: int) -> None:
        """Let go of everything held of one user's personal lists (their data was deleted)."""
        for key in [key for key in self._parts if not key[0] and key[1] == user_id]:
            self._drop(key)

    def _sweep(self, today: date) -> None:
        """Drop parts no search offered for two days, from the least recently used end: a conversation
        that is over should not keep its memories' texts in the process until the cache fills up."""
        while self._parts:
            key, (day, _part) = next(iter(self._parts.items()))
            if _fresh_enough(day, today):
                break
            self._drop(key)
