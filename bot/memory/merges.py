"""Making room in a full list: first join two memories that belong together, only then forget one.

A list of 100 fills within months, and forgetting throws a fact away. Most lists hold several facts about
one subject ("Juno works as a nurse", "Juno's hospital is in Lyon"), so joining the two closest of them into
one memory frees a place and loses nothing: both texts stay in the merged memory, and each old text is kept
among its versions (`/memories history`). The join needs no model (a save never waits for one): the two texts
are put one after the other, in the order they were saved.

Which two: memories of the same list with the same reach (the same persona, channel limits and tags, so a
merged memory is visible exactly where each part was), neither protected (a protected text stays as its
person wrote it), and, for a save made in a conversation, both visible there. Among those, the pair most
related (cosine, plus a bonus for a shared content word: `bot.memory.relatedness`) whose joined text fits in
`MERGE_MAX_CHARS`, if it reaches `MERGE_MIN_SIMILARITY`. The rules are in docs/memory-rules.md ("Saving and
forgetting").
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime

import numpy as np

from bot.config import Settings
from bot.db import Connection
from bot.memory import merges_store, store, versions_store
from bot.memory.models import Memory, MemoryList, Merge, Source, VersionVia
from bot.memory.relatedness import SHARED_WORD_BONUS, content_stems

Vector = np.ndarray
SENTENCE_ENDS = ".!?…"


@dataclass(frozen=True)
class MergePlan:
    """The pair a full list would join, and the text the join gives (`kept` is the older, its id stays)."""

    kept: Memory
    absorbed: Memory
    text: str

    @property
    def key(self) -> tuple[int, str, int, str]:
        return (self.kept.id, self.kept.text, self.absorbed.id, self.absorbed.text)


def joined_text(first: str, second: str) -> str:
    """Two texts as one: the first ends a sentence, then the second."""
    first, second = first.strip(), second.strip()
    if first[-1:] not in SENTENCE_ENDS:
        first += "."
    return f"{first} {second}"


def _reach(memory: Memory) -> tuple[object, ...]:
    return (memory.list, memory.guild_id, memory.owner_id, memory.persona_id,
            tuple(sorted(memory.channel_ids)), tuple(sorted(memory.tags)))


@functools.lru_cache(maxsize=8192)
def _stems(text: str) -> frozenset[str]:
    return frozenset(content_stems(text))


def best_pair(candidates: Sequence[tuple[Memory, Vector]], max_chars: int, min_score: float) -> MergePlan | None:
    """The most related pair of the same reach whose joined text fits `max_chars` (ties: the lower ids).

    Runs on every save into a full list, over up to a list's whole size: the cosines and lengths are compared as
    matrices, and words are compared only for the pairs that could still reach `min_score`."""
    groups: dict[tuple[object, ...], list[tuple[Memory, Vector]]] = {}
    for memory, vector in candidates:
        if not memory.protected:
            groups.setdefault(_reach(memory), []).append((memory, vector))
    best: tuple[float, int, int] | None = None
    found: tuple[Memory, Memory] | None = None
    for members in groups.values():
        if len(members) < 2:
            continue
        members.sort(key=lambda pair: pair[0].id)
        vectors = np.stack([vector for _, vector in members]).astype(np.float32)
        vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        # einsum, not `@`: a BLAS call spreads 100 x 100 dot products over threads and waits on a busy machine
        cosines = np.einsum("ij,kj->ik", vectors, vectors)
        texts = [memory.text.strip() for memory, _ in members]
        lengths = np.array([len(text) for text in texts])
        stops = np.array([text[-1:] not in SENTENCE_ENDS for text in texts], dtype=int)  # `joined_text` adds one
        fits = (lengths + stops + 1)[:, None] + lengths[None, :] <= max_chars  # row i is the older, the first text
        rows, cols = np.nonzero(np.triu(fits & (cosines + SHARED_WORD_BONUS >= min_score), k=1))
        for k in np.argsort(-cosines[rows, cols], kind="stable"):  # most similar first: stop once none can win
            i, j = int(rows[k]), int(cols[k])
            first, second = members[i][0], members[j][0]
            score = float(cosines[i, j])
            if score + SHARED_WORD_BONUS < (best[0] if best else min_score):
                break
            if _stems(first.text) & _stems(second.text):
                score += SHARED_WORD_BONUS
            rank = (score, -first.id, -second.id)
            if score >= min_score and (best is None or rank > best):
                best, found = rank, (first, second)
    if found is None:
        return None
    return MergePlan(found[0], found[1], joined_text(found[0].text, found[1].text))


class ListRoom:
    """Room in a full list: a merge where one fits, else the memory the forgetting order names, else a reason."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @property
    def max_chars(self) -> int:
        return min(self.settings.merge_max_chars, self.settings.memory_max_chars)

    async def plan(
        self, conn: Connection, memory_list: MemoryList, owner: int, space: int | None, where: list[object]
    ) -> MergePlan | None:
        """The merge a full list would make now (read without locks, so its text can be embedded before the save's
        transaction; the transaction checks that the pair is still the one it would choose)."""
        if space is None or self.max_chars <= 0:
            return None
        candidates = await merges_store.merge_candidates(conn, memory_list, owner, space, where, lock=False)
        return best_pair(candidates, self.max_chars, self.settings.merge_min_similarity)

    async def merge(
        self,
        conn: Connection,
        memory_list: MemoryList,
        owner: int,
        space: int | None,
        where: list[object],
        *,
        planned: tuple[MergePlan, Vector | None] | None,
        by: int,
        now: datetime,
        today: date,
    ) -> tuple[Merge, Vector | None] | None:
        """Join the best pair of the list, inside the save's transaction (rows locked); None when no pair qualifies.
        Returns the merge and the merged text's vector when the plan made before the transaction still holds."""
        if space is None or self.max_chars <= 0:
            return None
        candidates = await merges_store.merge_candidates(conn, memory_list, owner, space, where, lock=True)
        plan = best_pair(candidates, self.max_chars, self.settings.merge_min_similarity)
        if plan is None:
            return None
        kept, absorbed = plan.kept, plan.absorbed
        await versions_store.keep_version(
            conn, kept, replaced_by=by, via=VersionVia.MERGE, at=now,
            reason=f"merged with #{absorbed.id} to make room in a full list",
        )
        await versions_store.keep_version(
            conn, absorbed, replaced_by=by, via=VersionVia.MERGE, at=now,
            reason=f"was memory #{absorbed.id}, merged into #{kept.id} to make room in a full list",
        )
        source = Source.NOTES if Source.NOTES in (kept.source, absorbed.source) else kept.source
        merged = await merges_store.absorb(conn, kept, absorbed, text=plan.text, source=source, now=now, today=today)
        vector = planned[1] if planned is not None and planned[0].key == plan.key else None
        if vector is not None:
            await store.store_vector(conn, merged.id, space, vector, merged.text)
        return Merge(kept=merged, absorbed=absorbed, kept_text=kept.text), vector
