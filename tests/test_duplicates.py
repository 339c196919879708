"""No duplicate memories, and updates instead of contradictions, on the real built-in embedder.

A save that repeats a memory of its list stores nothing and counts that memory as used; one that only
resembles a memory is stored, and the save's result names the closest memories so the model can
update the old fact instead. DUPLICATE_SIMILARITY (0.91) is held against the hand-made pairs
docs/models.md quotes: it must merge every pair above it that says the same fact and no pair of different facts.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import numpy as np

from bot.config import Settings
from bot.embeddings.providers import BuiltinEmbedder
from bot.memory.models import MemoryList, NewMemory, Source
from tests.conftest import MakeCore
from tests.recall_helpers import FlakyEmbedder

GUILD, JUNO = 1, 101
PAIRS = [json.loads(line) for line in (Path(__file__).parent / "data" / "duplicates.jsonl").read_text().splitlines()]


def personal(text: str, **extra: object) -> NewMemory:
    return NewMemory(MemoryList.PERSONAL, text, by=JUNO, guild_id=GUILD, owner_id=JUNO, **{"via": Source.BOT, **extra})


async def test_the_threshold_merges_no_different_facts(builtin_embedder: BuiltinEmbedder) -> None:
    threshold = Settings().duplicate_similarity
    a = await builtin_embedder.embed([pair["a"] for pair in PAIRS])
    b = await builtin_embedder.embed([pair["b"] for pair in PAIRS])
    cosines = [float(np.dot(x, y) / np.linalg.norm(x) / np.linalg.norm(y)) for x, y in zip(a, b, strict=True)]
    different = [c for c, pair in zip(cosines, PAIRS, strict=True) if not pair["same_fact"]]
    same = [c for c, pair in zip(cosines, PAIRS, strict=True) if pair["same_fact"]]
    assert max(different) < threshold, max(different)
    assert sum(c >= threshold for c in same) >= 9, sorted(same)  # most paraphrases are caught


async def test_a_paraphrase_is_already_remembered_and_counts_as_used(make_core: MakeCore, clock) -> None:
    core = await make_core(dormant_after_days=1)
    first = await core.save(personal("Juno's cat is called Mochi"))
    assert first.saved is not None
    clock.current += timedelta(days=3)
    again = await core.save(personal("Juno has a cat named Mochi."))
    assert again.repeated and again.saved is not None and again.saved.id == first.saved.id
    assert again.detail == f"already remembered as #{first.saved.id}"
    assert again.saved.days_unused == 0 and again.saved.last_used_at == clock.now()
    assert [m.text for m in await core.all_memories()] == ["Juno's cat is called Mochi"]


async def test_a_different_fact_is_stored_and_the_old_one_offered_for_an_update(make_core: MakeCore) -> None:
    core = await make_core()
    cat = await core.save(personal("Juno's cat is called Mochi"))
    await core.save(personal("Juno plays chess on weekends"))
    dog = await core.save(personal("Juno's dog is called Mochi"))
    assert not dog.repeated and dog.saved is not None and dog.saved.id != cat.saved.id  # type: ignore[union-attr]
    assert dog.similar[0].text == "Juno's cat is called Mochi" and len(dog.similar) == 2
    assert len(await core.all_memories()) == 3


async def test_the_same_text_is_caught_without_an_embedding(make_core: MakeCore, builtin_embedder: BuiltinEmbedder) -> None:
    core = await make_core(embedder=FlakyEmbedder(builtin_embedder, ok_calls=1))
    assert (await core.save(personal("Juno's cat is called Mochi"))).saved is not None
    again = await core.save(personal("  juno's cat is called   MOCHI!"))  # the embedder is down now
    assert again.repeated and len(await core.all_memories()) == 1


async def test_a_repeat_with_another_reach_is_a_new_memory(make_core: MakeCore) -> None:
    core = await make_core()
    assert (await core.save(personal("Juno's cat is called Mochi"))).saved is not None
    wider = await core.save(personal("Juno's cat is called Mochi", is_global=True, via=Source.COMMAND))  # Global: every server
    assert not wider.repeated and len(await core.all_memories()) == 2
