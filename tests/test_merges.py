"""A full list makes room without losing a fact: two memories of the same reach that belong together become one,
both texts kept among its versions; only when no pair qualifies does it forget, and only then refuse.

Against the real database and the real built-in embedder.
"""

from __future__ import annotations

import asyncio
from datetime import date

from bot.chat.notices import ChangeKind, MemoryChange, notice_line, room_changes
from bot.clock import ManualClock
from bot.config import Settings
from bot.db import create_pool
from bot.memory.history import MemoryHistory
from bot.memory.lists import ListRef
from bot.memory.models import Conversation, MemoryList, NewMemory, Rejection, Source, VersionVia
from bot.memory.service import MemoryCore
from bot.services import build_services, memory_core
from tests.recall_helpers import CHANNEL, GUILD, JUNO, OTHER_CHANNEL

ADMIN = 1
CAT = ["Juno has a cat called Mochi", "Juno's cat Mochi loves tuna"]
OTHERS = ["Juno plays chess on weekends", "Juno is learning Japanese"]


def personal(text: str, owner: int = JUNO) -> NewMemory:
    return NewMemory(MemoryList.PERSONAL, text, by=owner, via=Source.BOT, guild_id=GUILD, owner_id=owner)


def server(text: str, **extra: object) -> NewMemory:
    return NewMemory(MemoryList.SERVER, text, by=ADMIN, guild_id=GUILD, **extra)  # type: ignore[arg-type]


async def texts_kept(core: MemoryCore) -> tuple[list[str], list[str]]:
    """Every memory's text and every version's text."""
    async with core.pool.acquire() as conn:
        memories = [row["text"] for row in await conn.fetch("SELECT text FROM memories ORDER BY id")]
        versions = [row["text"] for row in await conn.fetch("SELECT text FROM memory_versions ORDER BY id")]
    return memories, versions


async def test_a_full_list_joins_two_related_memories_and_keeps_both_texts_as_versions(make_core, clock) -> None:
    core = await make_core(personal_memory_limit=4)
    first = [(await core.save(personal(text))).saved for text in [*CAT, *OTHERS]]
    assert all(first)
    # every memory is active (saved today): without a merge nothing could be forgotten and the save would be refused
    result = await core.save(personal("Juno drives a red bike to work"))
    assert result.saved is not None and result.forgotten == []
    [merge] = result.merged
    assert (merge.kept.id, merge.absorbed.id) == (first[0].id, first[1].id)  # the older one keeps its id
    assert merge.kept.text == "Juno has a cat called Mochi. Juno's cat Mochi loves tuna"
    memories = await core.all_memories()
    assert len(memories) == 4 and first[1].id not in {m.id for m in memories}

    ref = ListRef(MemoryList.PERSONAL, await core.servers.persona_id(GUILD), guild_id=GUILD, owner_id=JUNO)
    page = await MemoryHistory(core).page(ref, merge.kept.id)
    assert sorted(v.text for v in page.versions) == sorted(CAT)
    assert all(v.replaced_via == VersionVia.MERGE for v in page.versions)
    assert {v.written_by for v in page.versions} == {JUNO}
    problems = await core.integrity_problems()
    assert not any(problems.values()), problems

    # the merged memory has its vector: the next reply about the cat finds it
    recall = await core.reply_search(Conversation(GUILD, CHANNEL, JUNO, "what does Mochi like to eat?"))
    assert merge.kept.id in {s.memory.id for s in recall.used}


async def test_merges_join_only_the_same_reach_and_never_a_protected_memory(make_core) -> None:
    core = await make_core(server_memory_limit=5)
    limited = (await core.save(server("Game night is on Fridays", channel_ids=(OTHER_CHANNEL,)))).saved
    tagged = (await core.save(server("Game night snacks are pizza and chips", tags=("games",)))).saved
    protected = (await core.save(server("Game night is hosted by Rin", via=Source.COMMAND, by_can_manage=True))).saved
    plain = (await core.save(server("Game night starts at 8pm"))).saved
    plain2 = (await core.save(server("Game night ends at 11pm"))).saved
    assert limited and tagged and protected and plain and plain2

    result = await core.save(server("The server's movie club meets on Sundays"))
    assert result.saved is not None
    [merge] = result.merged
    assert {merge.kept.id, merge.absorbed.id} == {plain.id, plain2.id}  # the only pair of the same reach
    after = {m.id: m for m in await core.all_memories()}
    assert after[protected.id].text == "Game night is hosted by Rin"  # a protected text is never rewritten
    assert after[limited.id].channel_ids == (OTHER_CHANNEL,) and after[tagged.id].tags == ("games",)
    assert after[plain.id].text == "Game night starts at 8pm. Game night ends at 11pm"

    # no pair is left that may be joined, and everything is active: refused with the reason, nothing changed
    refused = await core.save(server("Game night has a prize for the winner"))
    assert refused.saved is None and refused.rejected == Rejection.LIST_FULL
    assert "belong together" in refused.detail and "in use or protected" in refused.detail
    assert {m.id: m.text for m in await core.all_memories()} == {i: m.text for i, m in after.items()}


async def test_a_save_in_a_conversation_joins_only_memories_that_conversation_can_see(make_core) -> None:
    core = await make_core(server_memory_limit=3)
    hidden = [(await core.save(server(text, channel_ids=(OTHER_CHANNEL,)))).saved for text in
              ["Game night is on Fridays", "Game night starts at 8pm"]]
    assert all(hidden)
    assert (await core.save(server("The server's movie club meets on Sundays"))).saved
    seen_here = Conversation(GUILD, CHANNEL, JUNO, "remember this")
    refused = await core.save(NewMemory(MemoryList.SERVER, "Game night ends at 11pm", by=JUNO, guild_id=GUILD,
                                        conversation=seen_here))
    assert refused.saved is None and refused.rejected == Rejection.LIST_FULL
    assert "this conversation can see" in refused.detail
    # the same save made where those memories live joins them
    there = Conversation(GUILD, OTHER_CHANNEL, JUNO, "remember this")
    result = await core.save(NewMemory(MemoryList.SERVER, "Game night ends at 11pm", by=JUNO, guild_id=GUILD,
                                       conversation=there))
    assert result.saved is not None and len(result.merged) == 1


async def test_repeated_merges_keep_every_text_they_joined(make_core) -> None:
    core = await make_core(personal_memory_limit=3)
    facts = [
        "Juno has a cat called Mochi", "Juno's cat Mochi loves tuna", "Juno's cat Mochi is ten years old",
        "Juno's cat Mochi sleeps on the sofa", "Juno's cat Mochi hates the vet", "Juno adopted Mochi the cat in 2019",
    ]
    for text in facts:
        assert (await core.save(personal(text))).saved is not None
    memories, versions = await texts_kept(core)
    assert len(memories) <= 3
    for text in facts:  # every fact is in a memory, and every text a merge replaced is a version
        assert any(text in memory for memory in memories), text
    assert sum(1 for text in facts if text in versions) >= 2


async def test_with_merging_off_a_full_list_forgets_as_before(make_core, clock) -> None:
    core = await make_core(personal_memory_limit=2, merge_max_chars=0, dormant_after_days=1)
    old = [(await core.save(personal(text))).saved for text in CAT]
    clock.set_date(date(2030, 1, 2))
    await core.reply_search(Conversation(GUILD, CHANNEL, JUNO, "hello there"))  # both age to the drawer
    result = await core.save(personal("Juno plays chess on weekends"))
    assert result.merged == [] and [m.id for m in result.forgotten] == [old[0].id]  # never matched, oldest first


async def two_cores(db_url: str, builtin_embedder: object, clock: ManualClock, **overrides: object) -> list[MemoryCore]:
    settings = Settings().with_overrides(**overrides)
    return [memory_core(await create_pool(db_url, max_size=6), builtin_embedder, settings, clock) for _ in range(2)]  # type: ignore[arg-type]


async def test_concurrent_saves_into_a_full_list_never_exceed_the_limit(db_url: str, builtin_embedder: object) -> None:
    clock = ManualClock()
    clock.set_date(date(2026, 4, 1))
    limit = 6
    cores = await two_cores(db_url, builtin_embedder, clock, server_memory_limit=limit)
    try:
        for text in ["Game night is on Fridays", "Game night starts at 8pm", "Movie club meets on Sundays",
                     "Movie club watches horror films", "The book club reads sci-fi", "The book club meets monthly"]:
            assert (await cores[0].save(server(text))).saved
        news = [f"Game night round {i} uses board game number {i}" for i in range(12)]
        results = await asyncio.gather(*(cores[i % 2].save(server(text)) for i, text in enumerate(news)))
        memories, _ = await texts_kept(cores[0])
        assert len(memories) <= limit
        saved = [text for text, r in zip(news, results, strict=True) if r.saved is not None]
        assert saved, [r.detail for r in results]
        for text in saved:  # nothing saved was lost: a merge only ever joins texts
            assert any(text in memory for memory in memories), text
        assert all(r.rejected == Rejection.LIST_FULL for r in results if r.saved is None)
        problems = await cores[0].integrity_problems()
        assert not any(problems.values()), problems
    finally:
        for core in cores:
            await core.pool.close()


async def test_a_merge_and_delete_my_data_at_the_same_time_leave_nothing_of_the_person(
    db_url: str, builtin_embedder: object
) -> None:
    """Delete-my-data is asked for while the save that merges is inside its transaction (the save's `check` hook
    runs there, under the list's lock): it waits for the save and then deletes everything, the merged memory and
    the new one included. Asked for before, it leaves an empty list that the save fills with its one new text."""
    clock = ManualClock()
    clock.set_date(date(2026, 4, 1))
    cores = await two_cores(db_url, builtin_embedder, clock, personal_memory_limit=4)
    services = build_services(cores[1])
    deleting: list[asyncio.Task[dict[str, int]]] = []

    async def meanwhile(_conn: object) -> None:
        deleting.append(asyncio.create_task(services.delete_user_data(JUNO)))
        await asyncio.sleep(0.5)  # the deletion is under way while this transaction holds the merge

    try:
        for delete_first in (False, True):
            old = [f"{text} ({delete_first})" for text in [*CAT, *OTHERS]]
            for text in old:
                assert (await cores[0].save(personal(text))).saved
            new = f"Juno's cat Mochi got a new collar ({delete_first})"
            if delete_first:
                await services.delete_user_data(JUNO)
                save = await cores[0].save(personal(new))
            else:
                save = await cores[0].save(personal(new), check=meanwhile)  # type: ignore[arg-type]
                await deleting[0]
            async with cores[0].pool.acquire() as conn:
                left = [row["text"] for row in await conn.fetch("SELECT text FROM memories WHERE owner_id = $1", JUNO)]
                versions = [row["text"] for row in await conn.fetch(
                    "SELECT v.text FROM memory_versions v JOIN memories m ON m.id = v.memory_id WHERE m.owner_id = $1"
                    " UNION ALL SELECT text FROM memory_versions WHERE written_by = $1", JUNO)]
            assert versions == []
            if delete_first:
                assert save.merged == [] and left == [new]
            else:
                assert len(save.merged) == 1 and left == []
            async with cores[0].pool.acquire() as conn:
                await conn.execute("DELETE FROM memories WHERE owner_id = $1", JUNO)
    finally:
        for core in cores:
            await core.pool.close()


def test_the_notice_says_what_was_joined_and_verbose_shows_the_text() -> None:
    change = MemoryChange(ChangeKind.MERGED, 12, MemoryList.SERVER, "Game night starts at 8pm. Game night ends at 11pm",
                          absorbed_id=13)
    assert notice_line(change, "minimal", {}) == "🧩 To make room, joined #13 into a server memory (#12), which now holds both"
    assert notice_line(change, "verbose", {}).endswith(": “Game night starts at 8pm. Game night ends at 11pm”")


async def test_the_tool_result_and_notice_report_a_merge(make_core) -> None:
    core = await make_core(personal_memory_limit=4)
    for text in [*CAT, *OTHERS]:
        await core.save(personal(text))
    result = await core.save(personal("Juno drives a red bike to work"))
    [change] = room_changes(result)
    assert change.kind == ChangeKind.MERGED and change.absorbed_id == result.merged[0].absorbed.id
    assert change.text == result.merged[0].kept.text


