"""A desk larger than MEMORY_TOKEN_BUDGET, as people in a busy server would notice it.

Ten people in one conversation, each with far more active memories than the budget holds: what
each one's messages matched reaches the prompt, nobody is remembered more because of a lower id,
and the prompt head stays byte-identical across a chat day's replies. The first tests use the
prompt builder alone; the last ones replay a day through the real memory core and database.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from datetime import date, timedelta

from bot.chat.receipts import memory_reasons
from bot.clock import ManualClock
from bot.desk_fit import water_fill
from bot.memory.models import Conversation, Memory, MemoryList, NewMemory, Recall, ScoredMemory, Source
from bot.prompt import DESK_SHARE, MATCHED_KIND, ChatLine, Persona, PromptInput, build_prompt, recalled_item
from tests.conftest import MakeCore
from tests.test_prompt import NOW
from tests.test_prompt import memory as personal_memory

GUILD = 77
PEOPLE = [1_000 + i for i in range(10)]
NAMES = {user: f"Person {i}" for i, user in enumerate(PEOPLE)}
HOBBIES = ("pottery", "chess", "sailing", "baking", "climbing", "violin", "gardening", "cycling", "poetry", "karate")


def memory(memory_id: int, owner: int, text: str, used_days_ago: int | None = None) -> Memory:
    return dataclasses.replace(
        personal_memory(memory_id, text, owner=owner), created_by=owner, created_at=NOW - timedelta(days=30),
        last_used_at=None if used_days_ago is None else NOW - timedelta(days=used_days_ago),
    )


def crowded_desk() -> list[Memory]:
    """30 memories per person, about 25 tokens each: ~7,500 tokens of desk for a 4,000-token budget."""
    desk = []
    for p, user in enumerate(PEOPLE):
        for k in range(30):
            text = f"{NAMES[user]} told the server about their {HOBBIES[p]} plans for week {k} and how it went with friends"
            desk.append(memory(len(desk) + 1, user, text, used_days_ago=k % 6))
    return desk


def build(desk: list[Memory], used: list[ScoredMemory], **changes: object) -> tuple[str, set[int], object]:
    prompt = build_prompt(PromptInput(
        persona=Persona("Deskmate"), lore=[], desk=desk, user_names=NAMES, history=[],
        tail=[], answered=ChatLine(1, PEOPLE[0], "Person 0", "hello"), now=NOW, memory_budget=4_000, used=used,
        **changes,  # type: ignore[arg-type]
    ))
    return prompt.messages[0]["content"], set(prompt.shown_memory_ids), prompt


def test_water_fill_gives_small_groups_their_need_and_splits_the_rest_equally() -> None:
    assert water_fill({1: 100, 2: 1_000, 3: 1_000}, 1_100) == {1: 100, 2: 500, 3: 500}
    assert water_fill({1: 50, 2: 60}, 1_000) == {1: 50, 2: 60}


def test_each_persons_matched_memories_reach_the_prompt_in_a_crowd() -> None:
    desk = crowded_desk()
    for person in range(10):  # one reply per person, matching three of their least recently used memories
        owned = [m for m in desk if m.owner_id == PEOPLE[person]]
        used = [ScoredMemory(m, 0.6) for m in owned[-3:]]
        head, shown, prompt = build(desk, used)
        assert {s.memory.id for s in used} <= shown
        assert not [d for d in prompt.dropped if d.key in {f"memory:{s.memory.id}" for s in used}]
        moved = [item for item in prompt.tail if item.kind == MATCHED_KIND]
        assert moved, "the desk's share could not hold them, so they are in the tail"
        assert all(f'"id": {item.memory_id},' not in head for item in moved)
        assert "More notes that match this message" in prompt.messages[-1]["content"]
        assert prompt.tokens.server_memories + prompt.tokens.personal_memories + prompt.tokens.tail <= 4_000 + 20


def test_no_person_is_favoured_by_a_lower_id() -> None:
    desk = crowded_desk()
    _, _, prompt = build(desk, [])
    owner_of = {m.id: m.owner_id for m in desk}
    per_person = Counter(owner_of[i] for i in prompt.desk_ids)
    assert set(per_person) == set(PEOPLE), "everyone has memories in the head"
    assert max(per_person.values()) - min(per_person.values()) <= 1
    assert {d.reason for d in prompt.dropped} == {DESK_SHARE}
    # the same people with their ids reversed are remembered alike
    flipped = {user: PEOPLE[-1 - i] for i, user in enumerate(PEOPLE)}
    mirrored = [memory(m.id, flipped[m.owner_id or 0], m.text, (NOW - m.last_used_at).days if m.last_used_at else None)
                for m in desk]
    _, _, again = build(mirrored, [])
    assert sorted(Counter(flipped[owner_of[i] or 0] for i in again.desk_ids).values()) == sorted(per_person.values())


def test_the_head_keeps_the_most_recently_used_of_each_person() -> None:
    desk = crowded_desk()
    _, _, prompt = build(desk, [])
    kept = {m.id: m for m in desk if m.id in set(prompt.desk_ids)}
    for user in PEOPLE:
        theirs = [m for m in desk if m.owner_id == user]
        worst_kept = max((NOW - m.last_used_at).days for m in theirs if m.id in kept and m.last_used_at)
        best_cut = min((NOW - m.last_used_at).days for m in theirs if m.id not in kept and m.last_used_at)
        assert worst_kept <= best_cut


def test_a_desk_that_fits_its_share_is_shown_whole_and_recalled_memories_keep_their_room() -> None:
    desk = crowded_desk()[:40]
    recalled = recalled_item(ScoredMemory(memory(999, PEOPLE[3], "Person 3 once sailed to Iceland"), 0.7), NAMES)
    prompt = build_prompt(PromptInput(
        persona=Persona("Deskmate"), lore=[], desk=desk, user_names=NAMES, history=[], tail=[recalled],
        answered=ChatLine(1, PEOPLE[0], "Person 0", "hello"), now=NOW, memory_budget=4_000,
    ))
    assert len(prompt.desk_ids) == 40 and prompt.dropped == ()
    assert [item.memory_id for item in prompt.tail] == [999]


def test_the_older_rule_cuts_in_prompt_order() -> None:
    _, _, prompt = build(crowded_desk(), [], desk_fit="prefix", tail_reserve=0.0)
    owners = {m.id: m.owner_id for m in crowded_desk()}
    assert {owners[i] for i in prompt.desk_ids} < set(PEOPLE[:6]), "the lowest ids take the whole budget"


async def test_a_crowded_day_keeps_the_head_identical_and_every_match_in_the_prompt(
    make_core: MakeCore, clock: ManualClock
) -> None:
    """Ten people talk all day about their hobbies: the head does not change after the day's first reply,
    and each reply's used memories are in its prompt (on the desk or in the tail)."""
    core = await make_core()
    clock.set_date(date(2026, 3, 1))
    for p, user in enumerate(PEOPLE):
        for k in range(25):
            await core.save(NewMemory(
                list=MemoryList.PERSONAL, by=user, via=Source.BOT, guild_id=GUILD, owner_id=user,
                text=f"{NAMES[user]} goes to {HOBBIES[p]} club number {k} on the {k + 1}th of each month",
            ))
    clock.set_date(date(2026, 3, 2))
    heads: list[str] = []
    for turn in range(30):
        author = PEOPLE[turn % 10]
        text = f"who else likes {HOBBIES[(turn * 3) % 10]} club number {turn % 25}?"
        recall = await core.reply_search(Conversation(GUILD, 5, author, text, tuple(p for p in PEOPLE if p != author)))
        assert recall.used
        prompt = build_prompt(PromptInput(
            persona=Persona("Deskmate"), lore=[], desk=recall.desk, user_names=NAMES, history=[],
            tail=[recalled_item(s, NAMES) for s in recall.recalled], answered=ChatLine(turn, author, NAMES[author], text),
            now=clock.now(), memory_budget=3_000, used=recall.used, desk_ranks=recall.desk_ranks,
        ))
        assert {s.memory.id for s in recall.used} <= prompt.shown_memory_ids
        assert len(prompt.desk_ids) < len(recall.desk), "the desk is larger than its share"
        heads.append(prompt.messages[0]["content"])
    assert len(set(heads)) == 1
    # the next chat day ranks afresh: the memories used today lead their owners' groups
    clock.set_date(date(2026, 3, 3))
    recall = await core.reply_search(Conversation(GUILD, 5, PEOPLE[0], "good morning", tuple(PEOPLE[1:])))
    firsts = {m.owner_id: m for m in recall.desk if recall.desk_ranks[m.id] == 0}
    assert all(m.last_used_at is not None and m.last_used_at.date() == date(2026, 3, 2) for m in firsts.values())


def test_the_receipt_says_for_every_memory_why_it_was_in_the_prompt_or_left_out() -> None:
    desk = crowded_desk()
    owned = [m for m in desk if m.owner_id == PEOPLE[4]]
    used = [ScoredMemory(owned[-1], 0.7), ScoredMemory(owned[0], 0.6)]
    dormant = ScoredMemory(memory(999, PEOPLE[4], "Person 4 sold their old karate belt"), 0.5)
    recall = Recall(search_ok=True, failure=None, persona_id=1, desk=desk, used=used, recalled=[dormant])
    prompt = build_prompt(PromptInput(
        persona=Persona("Deskmate"), lore=[], desk=desk, user_names=NAMES, history=[],
        tail=[recalled_item(dormant, NAMES)], answered=ChatLine(1, PEOPLE[4], "Person 4", "karate?"), now=NOW,
        memory_budget=4_000, used=used,
    ))
    groups = memory_reasons(recall, prompt)
    ids = [i for group in groups for i in group["ids"]]
    assert sorted(ids) == sorted([m.id for m in desk] + [999]), "every memory once"
    where = {i: (group["where"], group["why"]) for group in groups for i in group["ids"]}
    assert where[999][0] == "tail" and "recalled" in where[999][1]
    assert all(where[s.memory.id][0] in ("desk", "tail") for s in used)
    cut = [i for i, (place, _) in where.items() if place == "left out"]
    assert cut and all("cut by the budget" in where[i][1] and "desk's share" in where[i][1] for i in cut)
    assert set(prompt.desk_ids) == {i for i, (place, _) in where.items() if place == "desk"}


async def test_with_decay_off_the_desk_takes_the_whole_budget(make_core: MakeCore, clock: ManualClock, chat) -> None:
    """Nothing is matched or recalled with decay off, so a share kept for the tail would only be wasted room."""
    from tests.recall_helpers import GUILD as WORLD_GUILD
    from tests.recall_helpers import JUNO, build_world

    world = await build_world(make_core, clock, chat.base_url, memory_decay_enabled=False, memory_token_budget=600)
    for k in range(14):
        text = f"The server's book club read novel number {k} and met at the library on a rainy evening"
        assert (await world.core.save(NewMemory(MemoryList.SERVER, text, by=JUNO, guild_id=WORLD_GUILD))).saved
    outcome = await world.pipeline.reply(world.message(JUNO, "what did the book club read?"))
    assert outcome.prompt is not None and len(outcome.prompt.desk_ids) == 14  # ~400 tokens: more than half of 600
    assert not outcome.prompt.dropped
