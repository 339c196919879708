"""Every rule of docs/memory-rules.md, each with a test that fails if the rule breaks.

All against the real PostgreSQL and the real built-in embedder. Dates move with a ManualClock;
`dormant_after_days` is lowered where a rule only needs "dormant", to keep tests short.
"""

from __future__ import annotations

from datetime import date, timedelta

import asyncpg
import numpy as np
import pytest

from bot.clock import ManualClock
from bot.embeddings.providers import EmbeddingError, EmbeddingSpace, NoEmbedder
from bot.memory.models import Conversation, Memory, MemoryList, NewMemory, Rejection, Source
from bot.memory.service import MemoryCore
from bot.servers.models import Actor, Privacy
from tests.conftest import MakeCore

GUILD, OTHER_GUILD, CHANNEL, OTHER_CHANNEL = 10, 11, 20, 21
JUNO, BAU, CARO, ADMIN = 31, 32, 33, 34
DAY1 = date(2026, 3, 2)

CAT = "Juno's cat is called Mochi"
TEA = "Bau prefers green tea over coffee"
BASS = "Juno is learning to play the bass guitar"
MINECRAFT = "The server's Minecraft world runs on version 1.20"
ASK_CAT = "how is my cat Mochi doing?"
ASK_TEA = "should I make green tea or coffee?"
ASK_BASS = "I practiced bass guitar for two hours"
CHATTER = ["the train was late again this morning", "it snowed all night here", "our team shipped the release"]


class FlakyEmbedder:
    """The real embedder behind a switch, to play "provider down"."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.available = True
        self.calls = 0

    @property
    def space(self) -> EmbeddingSpace | None:
        return self.inner.space  # type: ignore[attr-defined]

    async def embed(self, texts: list[str]) -> np.ndarray:
        self.calls += 1
        if not self.available:
            raise EmbeddingError("provider down (test)")
        return await self.inner.embed(texts)  # type: ignore[attr-defined]


def server_memory(text: str, *, via: Source = Source.BOT, guild: int = GUILD, **extra: object) -> NewMemory:
    return NewMemory(list=MemoryList.SERVER, text=text, by=ADMIN, via=via, guild_id=guild, by_can_manage=True, **extra)


def personal_memory(text: str, owner: int, *, via: Source = Source.BOT, guild: int | None = GUILD, **extra: object) -> NewMemory:
    return NewMemory(list=MemoryList.PERSONAL, text=text, by=owner, via=via, guild_id=guild, owner_id=owner, **extra)


def message(text: str, author: int = JUNO, *, guild: int | None = GUILD, channel: int = CHANNEL, **extra: object) -> Conversation:
    return Conversation(guild_id=guild, channel_id=channel, author_id=author, text=text, **extra)  # type: ignore[arg-type]


async def save_ok(core: MemoryCore, request: NewMemory) -> Memory:
    result = await core.save(request)
    assert result.saved is not None, result.detail
    return result.saved


async def fetch(core: MemoryCore, memory: Memory) -> Memory:
    found = {m.id: m for m in await core.all_memories()}
    return found[memory.id]


async def chat_days(core: MemoryCore, clock: ManualClock, days: int, start: date, **kwargs: object) -> date:
    """One unrelated message on each of `days` consecutive days after `start`; returns the last day."""
    day = start
    for index in range(days):
        day += timedelta(days=1)
        clock.set_date(day)
        await core.reply_search(message(CHATTER[index % len(CHATTER)], **kwargs))  # type: ignore[arg-type]
    return day


# --- the search on every reply ---------------------------------------------------------------------


async def test_memory_ages_once_per_chat_day_and_not_on_the_day_it_is_saved(make_core: MakeCore, clock: ManualClock) -> None:
    core = await make_core()
    clock.set_date(DAY1)
    cat = await save_ok(core, server_memory(CAT))
    for text in CHATTER:
        await core.reply_search(message(text))
    assert (await fetch(core, cat)).days_unused == 0
    clock.set_date(DAY1 + timedelta(days=1))
    for text in CHATTER:
        await core.reply_search(message(text))
    assert (await fetch(core, cat)).days_unused == 1
    clock.set_date(DAY1 + timedelta(days=30))  # a quiet month is one chat day
    await core.reply_search(message(CHATTER[0]))
    assert (await fetch(core, cat)).days_unused == 2


async def test_used_memory_resets_and_dormant_one_is_recalled_then_active(make_core: MakeCore, clock: ManualClock) -> None:
    core = await make_core(dormant_after_days=2)
    clock.set_date(DAY1)
    cat = await save_ok(core, server_memory(CAT))
    last = await chat_days(core, clock, 2, DAY1)
    assert (await fetch(core, cat)).days_unused == 2 and core.is_dormant(await fetch(core, cat))

    clock.set_date(last + timedelta(days=1))
    recall = await core.reply_search(message(ASK_CAT))
    assert [s.memory.id for s in recall.used] == [cat.id]
    assert [s.memory.id for s in recall.recalled] == [cat.id]
    assert recall.recalled[0].similarity >= core.settings.min_similarity
    assert cat.id not in [m.id for m in recall.desk]  # the desk is the snapshot before the search
    after = await fetch(core, cat)
    assert after.days_unused == 0 and after.last_used_at is not None and after.last_aged_on == last + timedelta(days=1)

    again = await core.reply_search(message(CHATTER[0]))
    assert [m.id for m in again.desk] == [cat.id] and again.recalled == []


async def test_used_is_at_most_max_used_best_first_above_threshold(make_core: MakeCore, clock: ManualClock) -> None:
    core = await make_core(max_used=2)
    clock.set_date(DAY1)
    exact = await save_ok(core, server_memory("Juno's cat Mochi loves tuna"))
    close = await save_ok(core, server_memory(CAT))
    also = await save_ok(core, server_memory("Mochi the cat sleeps on the sofa"))
    unrelated = await save_ok(core, server_memory(MINECRAFT))
    recall = await core.reply_search(message("does Mochi the cat like tuna?"))
    assert len(recall.used) == 2
    similarities = [s.similarity for s in recall.used]
    assert similarities == sorted(similarities, reverse=True)
    assert all(s >= core.settings.min_similarity for s in similarities)
    assert unrelated.id not in [s.memory.id for s in recall.used]
    assert {s.memory.id for s in recall.used} <= {exact.id, close.id, also.id}


async def test_only_participants_personal_memories_are_searched_and_aged(make_core: MakeCore, clock: ManualClock) -> None:
    core = await make_core()
    clock.set_date(DAY1)
    tea = await save_ok(core, personal_memory(TEA, BAU))
    bass = await save_ok(core, personal_memory(BASS, JUNO))
    clock.set_date(DAY1 + timedelta(days=1))
    recall = await core.reply_search(message(CHATTER[0], author=JUNO))
    assert [m.id for m in recall.desk] == [bass.id]
    assert (await fetch(core, tea)).days_unused == 0  # Bau did not take part
    assert (await fetch(core, bass)).days_unused == 1
    recall = await core.reply_search(message(ASK_TEA, author=JUNO, participant_ids=(BAU,)))
    assert [s.memory.id for s in recall.used] == [tea.id]
    mentioned = await core.reply_search(message(CHATTER[1], author=CARO, participant_ids=(BAU,)))
    assert tea.id in [m.id for m in mentioned.desk]


async def test_desk_order_is_server_by_id_then_personal_grouped_by_user(make_core: MakeCore, clock: ManualClock) -> None:
    core = await make_core()
    clock.set_date(DAY1)
    bau_1 = await save_ok(core, personal_memory(TEA, BAU))
    server_1 = await save_ok(core, server_memory(MINECRAFT))
    juno_1 = await save_ok(core, personal_memory(BASS, JUNO))
    server_2 = await save_ok(core, server_memory(CAT))
    bau_2 = await save_ok(core, personal_memory("Bau lives in Valencia", BAU))
    recall = await core.reply_search(message(CHATTER[0], author=BAU, participant_ids=(JUNO,)))
    assert [m.id for m in recall.desk] == [server_1.id, server_2.id, juno_1.id, bau_1.id, bau_2.id]


# --- saving and forgetting -----------------------------------------------------------------------


async def test_forgetting_order_never_matched_oldest_first_then_matched_longest_ago(
    make_core: MakeCore, clock: ManualClock
) -> None:
    core = await make_core(dormant_after_days=1, server_memory_limit=3)
    clock.set_date(DAY1)
    cat = await save_ok(core, server_memory(CAT))
    tea = await save_ok(core, server_memory("The server's tea of the month is jasmine green tea"))
    mc = await save_ok(core, server_memory(MINECRAFT))
    clock.set_date(DAY1 + timedelta(days=1))
    recall = await core.reply_search(message("what green tea should I brew?"))
    assert [s.memory.id for s in recall.used] == [tea.id]
    await chat_days(core, clock, 1, DAY1 + timedelta(days=1))  # now all three are dormant

    first = await core.save(server_memory("The server's birthday is on 4 May"))
    assert [m.id for m in first.forgotten] == [cat.id]  # never matched, oldest
    second = await core.save(server_memory("The weekly movie night is on Fridays"))
    assert [m.id for m in second.forgotten] == [mc.id]  # never matched
    third = await core.save(server_memory("The server mascot is a red panda"))
    assert [m.id for m in third.forgotten] == [tea.id]  # matched, longest ago
    fourth = await core.save(server_memory("Voice chat is open on weekends"))
    assert fourth.rejected == Rejection.LIST_FULL and fourth.forgotten == []
    assert len(await core.all_memories()) == 3


async def test_protected_memories_are_never_forgotten_but_do_go_dormant(make_core: MakeCore, clock: ManualClock) -> None:
    core = await make_core(dormant_after_days=1, server_memory_limit=2)
    clock.set_date(DAY1)
    by_command = await save_ok(core, server_memory(CAT, via=Source.COMMAND))
    imported = await save_ok(core, server_memory(MINECRAFT, via=Source.IMPORT))
    assert by_command.protected and not imported.protected
    await chat_days(core, clock, 1, DAY1)
    assert core.is_dormant(await fetch(core, by_command))

    edited = await core.edit(imported.id, MINECRAFT + " (Java edition)", by=ADMIN, via=Source.COMMAND, by_can_manage=True)
    assert edited.saved is not None and edited.saved.protected and edited.saved.source == Source.COMMAND
    await chat_days(core, clock, 1, DAY1 + timedelta(days=1))
    result = await core.save(server_memory("The server mascot is a red panda"))
    assert result.rejected == Rejection.LIST_FULL
    assert {m.id for m in await core.all_memories()} == {by_command.id, imported.id}


async def test_bot_edit_does_not_protect_but_command_edit_does(make_core: MakeCore, clock: ManualClock) -> None:
    core = await make_core()
    clock.set_date(DAY1)
    memory = await save_ok(core, server_memory(CAT))
    by_bot = await core.edit(memory.id, CAT + " and she is grey", by=ADMIN, via=Source.BOT, by_can_manage=True)
    assert by_bot.saved is not None and not by_bot.saved.protected and by_bot.saved.source == Source.BOT
    by_command = await core.edit(memory.id, CAT + " and she is white", by=ADMIN, via=Source.COMMAND, by_can_manage=True)
    assert by_command.saved is not None and by_command.saved.protected


async def test_global_personal_memories_are_protected_and_count_against_every_persona(
    make_core: MakeCore, clock: ManualClock
) -> None:
    core = await make_core(personal_memory_limit=2, dormant_after_days=1)
    clock.set_date(DAY1)
    tied_here = await save_ok(core, personal_memory(TEA, BAU, guild=GUILD))
    tied_there = await save_ok(core, personal_memory("Bau collects vinyl records", BAU, guild=OTHER_GUILD))
    global_one = await save_ok(core, personal_memory("Bau is vegetarian", BAU, guild=None, is_global=True, via=Source.COMMAND))
    assert global_one.protected and global_one.is_global
    # Both persona lists now hold 2 (one tied + the Global one): full. Make the tied ones dormant.
    await chat_days(core, clock, 1, DAY1, author=BAU)
    await chat_days(core, clock, 1, DAY1 + timedelta(days=1), author=BAU, guild=OTHER_GUILD)
    result = await core.save(personal_memory("Bau runs marathons", BAU, guild=GUILD))
    assert [m.id for m in result.forgotten] == [tied_here.id]
    other = await core.save(personal_memory("Bau plays chess online", BAU, guild=OTHER_GUILD))
    assert [m.id for m in other.forgotten] == [tied_there.id]
    assert global_one.id in {m.id for m in await core.all_memories()}


async def test_saving_into_a_full_list_needs_the_embedder(make_core: MakeCore, clock: ManualClock, builtin_embedder) -> None:
    flaky = FlakyEmbedder(builtin_embedder)
    core = await make_core(embedder=flaky, dormant_after_days=1, server_memory_limit=1)
    clock.set_date(DAY1)
    old = await save_ok(core, server_memory(CAT))
    await chat_days(core, clock, 1, DAY1)
    flaky.available = False
    result = await core.save(server_memory(MINECRAFT))
    assert result.rejected == Rejection.SEARCH_UNAVAILABLE and result.forgotten == []
    flaky.available = True
    in_failed_reply = await core.save(server_memory(MINECRAFT), search_available=False)
    assert in_failed_reply.rejected == Rejection.SEARCH_UNAVAILABLE
    assert [m.id for m in await core.all_memories()] == [old.id]
    assert [m.id for m in (await core.save(server_memory(MINECRAFT))).forgotten] == [old.id]


@pytest.mark.parametrize("text", ["", "   \n\t ", "x" * 1001])
async def test_invalid_text_is_rejected(make_core: MakeCore, text: str) -> None:
    core = await make_core()
    result = await core.save(server_memory(text))
    assert result.rejected == Rejection.INVALID_TEXT and result.saved is None
    assert await core.all_memories() == []


async def test_text_is_trimmed_and_the_limit_counts_after_trimming(make_core: MakeCore) -> None:
    core = await make_core()
    saved = await save_ok(core, server_memory("  " + "x" * 1000 + "\n "))
    assert saved.text == "x" * 1000


async def test_who_may_save_and_change(make_core: MakeCore, clock: ManualClock) -> None:
    core = await make_core()
    clock.set_date(DAY1)
    stranger = await core.save(NewMemory(MemoryList.PERSONAL, TEA, by=JUNO, via=Source.COMMAND, guild_id=GUILD, owner_id=BAU))
    assert stranger.rejected == Rejection.NOT_ALLOWED
    member = await core.save(NewMemory(MemoryList.SERVER, CAT, by=JUNO, via=Source.COMMAND, guild_id=GUILD))
    assert member.rejected == Rejection.NOT_ALLOWED
    await core.servers.update_guild_settings(GUILD, Actor(1, can_manage=True), member_teaching=True)
    own = await save_ok(core, NewMemory(MemoryList.SERVER, CAT, by=JUNO, via=Source.COMMAND, guild_id=GUILD))
    assert (await core.edit(own.id, CAT + "!", by=JUNO, via=Source.COMMAND)).saved is not None
    admin_made = await save_ok(core, server_memory(MINECRAFT, via=Source.COMMAND))
    assert (await core.delete(admin_made.id, by=JUNO, via=Source.COMMAND)).rejected == Rejection.NOT_ALLOWED
    bau_tea = await save_ok(core, personal_memory(TEA, BAU, via=Source.COMMAND))
    assert (await core.edit(bau_tea.id, "tea", by=JUNO, via=Source.COMMAND)).rejected == Rejection.NOT_ALLOWED
    assert (await core.delete(bau_tea.id, by=BAU, via=Source.COMMAND)).rejected is None

    await core.servers.update_guild_settings(GUILD, Actor(1, can_manage=True), self_teaching=False)
    assert (await core.save(server_memory(TEA))).rejected == Rejection.NOT_ALLOWED
    assert (await core.save(personal_memory(BASS, JUNO))).rejected == Rejection.NOT_ALLOWED
    assert (await core.save(personal_memory(BASS, JUNO, guild=None))).saved is not None  # DMs are not that server


async def test_partial_privacy_blocks_bot_saves_and_edits_but_not_deletes(make_core: MakeCore, clock: ManualClock) -> None:
    core = await make_core()
    clock.set_date(DAY1)
    tea = await save_ok(core, personal_memory(TEA, BAU))
    await core.servers.set_privacy(BAU, Privacy.PARTIAL)
    assert (await core.save(personal_memory("Bau has two sisters", BAU))).rejected == Rejection.PRIVACY
    assert (await core.edit(tea.id, "Bau now drinks coffee", by=BAU, via=Source.BOT)).rejected == Rejection.PRIVACY
    # the model acts for the person it answers: someone else's memory is not theirs to change or forget
    assert (await core.edit(tea.id, "Bau now drinks coffee", by=JUNO, via=Source.BOT)).rejected == Rejection.NOT_ALLOWED
    assert (await core.delete(tea.id, by=JUNO, via=Source.BOT)).rejected == Rejection.NOT_ALLOWED
    assert (await core.save(personal_memory("Bau has two sisters", BAU, via=Source.COMMAND))).saved is not None
    recall = await core.reply_search(message(ASK_TEA, author=BAU))
    assert [s.memory.id for s in recall.used] == [tea.id]  # partial still uses existing memories
    assert (await core.delete(tea.id, by=BAU, via=Source.BOT)).rejected is None


async def test_blocked_users_and_personal_memories_off(make_core: MakeCore, clock: ManualClock) -> None:
    core = await make_core()
    clock.set_date(DAY1)
    tea = await save_ok(core, personal_memory(TEA, BAU, guild=None, is_global=True, via=Source.COMMAND))
    await core.servers.set_blocked(GUILD, BAU, True)
    assert (await core.save(personal_memory("Bau has two sisters", BAU))).rejected == Rejection.NOT_ALLOWED
    assert (await core.save(NewMemory(MemoryList.SERVER, CAT, by=BAU, guild_id=GUILD))).rejected == Rejection.NOT_ALLOWED
    recall = await core.reply_search(message(ASK_TEA, author=JUNO, participant_ids=(BAU,)))
    assert recall.used == [] and recall.desk == []
    elsewhere = await core.reply_search(message(ASK_TEA, author=BAU, guild=OTHER_GUILD))
    assert [s.memory.id for s in elsewhere.used] == [tea.id]  # the block holds in that server only

    await core.servers.update_guild_settings(OTHER_GUILD, Actor(1, can_manage=True), personal_memories=False)
    off = await core.reply_search(message(ASK_TEA, author=BAU, guild=OTHER_GUILD))
    assert off.used == [] and off.desk == []
    assert (await core.save(personal_memory("Bau has two sisters", BAU, guild=OTHER_GUILD))).rejected == Rejection.NOT_ALLOWED
    dm = await core.reply_search(message(ASK_TEA, author=BAU, guild=None, channel=99))
    assert [s.memory.id for s in dm.used] == [tea.id]


# --- hidden memories are never searched, aged, recalled or shown -------------------------


async def test_full_privacy_hides_personal_memories_everywhere(make_core: MakeCore, clock: ManualClock) -> None:
    core = await make_core()
    clock.set_date(DAY1)
    tea = await save_ok(core, personal_memory(TEA, BAU, guild=None, is_global=True, via=Source.COMMAND))
    await core.servers.set_privacy(BAU, Privacy.FULL)
    clock.set_date(DAY1 + timedelta(days=1))
    for guild in (GUILD, None):
        recall = await core.reply_search(message(ASK_TEA, author=BAU, guild=guild))
        assert recall.used == [] and recall.desk == []
    assert (await fetch(core, tea)).days_unused == 0  # hidden memories never age
    assert (await core.save(personal_memory("Bau has two sisters", BAU))).rejected == Rejection.PRIVACY


async def test_channel_limits(make_core: MakeCore, clock: ManualClock) -> None:
    core = await make_core()
    clock.set_date(DAY1)
    limited = await save_ok(core, server_memory(CAT, channel_ids=(OTHER_CHANNEL,)))
    clock.set_date(DAY1 + timedelta(days=1))
    here = await core.reply_search(message(ASK_CAT, channel=CHANNEL))
    assert here.used == [] and here.desk == []
    assert (await fetch(core, limited)).days_unused == 0
    there = await core.reply_search(message(ASK_CAT, channel=OTHER_CHANNEL))
    assert [s.memory.id for s in there.used] == [limited.id]


async def test_tags_hide_a_memory_unless_a_tag_is_in_the_context_when_tagging_is_on(
    make_core: MakeCore, clock: ManualClock
) -> None:
    core = await make_core()
    clock.set_date(DAY1)
    tagged = await save_ok(core, server_memory(MINECRAFT, tags=("Minecraft", "#servers")))
    untagged = await save_ok(core, server_memory(CAT))
    assert tagged.tags == ("minecraft", "servers")
    without = await core.reply_search(message(CHATTER[0]))
    assert {m.id for m in without.desk} == {tagged.id, untagged.id}  # tagging is off by default
    await core.servers.update_guild_settings(GUILD, Actor(1, can_manage=True), tagging=True)
    clock.set_date(DAY1 + timedelta(days=1))
    hidden = await core.reply_search(message(CHATTER[0]))
    assert [m.id for m in hidden.desk] == [untagged.id]
    assert (await fetch(core, tagged)).days_unused == 0 and (await fetch(core, untagged)).days_unused == 1
    shown = await core.reply_search(message("which version?", context_texts=("anyone on the MINECRAFT world?",)))
    assert tagged.id in [m.id for m in shown.desk]


async def test_persona_ties_and_global_memories(make_core: MakeCore, clock: ManualClock) -> None:
    core = await make_core()
    clock.set_date(DAY1)
    tied = await save_ok(core, personal_memory(TEA, BAU, guild=GUILD))
    global_one = await save_ok(core, personal_memory("Bau is vegetarian", BAU, guild=None, is_global=True, via=Source.COMMAND))
    here = await core.reply_search(message(CHATTER[0], author=BAU, guild=GUILD))
    there = await core.reply_search(message(CHATTER[0], author=BAU, guild=OTHER_GUILD))
    dm = await core.reply_search(message(CHATTER[0], author=BAU, guild=None, channel=99))
    assert [m.id for m in here.desk] == [tied.id, global_one.id]
    assert [m.id for m in there.desk] == [global_one.id]
    assert [m.id for m in dm.desk] == [global_one.id]
    server_here = await save_ok(core, server_memory(CAT))
    assert server_here.id not in [m.id for m in (await core.reply_search(message(ASK_CAT, guild=OTHER_GUILD))).desk]


# --- switches ---------------------------------------------------------------------------


async def test_decay_switched_off_keeps_everything_active_and_full_lists_reject(make_core: MakeCore, clock: ManualClock) -> None:
    core = await make_core(memory_decay_enabled=False, server_memory_limit=2, dormant_after_days=1)
    clock.set_date(DAY1)
    first = await save_ok(core, server_memory(CAT))
    second = await save_ok(core, server_memory(MINECRAFT))
    last = await chat_days(core, clock, 5, DAY1)
    for memory in (first, second):
        current = await fetch(core, memory)
        assert current.days_unused == 0 and not core.is_dormant(current)
    clock.set_date(last + timedelta(days=1))
    recall = await core.reply_search(message(ASK_CAT))
    assert recall.search_ok and recall.recalled == []
    assert [m.id for m in recall.desk] == [first.id, second.id]
    assert (await core.save(server_memory(TEA))).rejected == Rejection.LIST_FULL


async def test_no_embedder_means_every_memory_stays_active(make_core: MakeCore, clock: ManualClock) -> None:
    core = await make_core(embedder=NoEmbedder(), server_memory_limit=1)
    clock.set_date(DAY1)
    cat = await save_ok(core, server_memory(CAT))
    last = await chat_days(core, clock, 10, DAY1)
    clock.set_date(last)
    recall = await core.reply_search(message(ASK_CAT))
    assert not recall.search_ok and recall.used == [] and [m.id for m in recall.desk] == [cat.id]
    assert (await fetch(core, cat)).days_unused == 0
    assert (await core.save(server_memory(TEA))).rejected == Rejection.LIST_FULL


async def test_embedder_down_changes_nothing_and_saves_wait_for_their_vector(
    make_core: MakeCore, clock: ManualClock, builtin_embedder, pool: asyncpg.Pool
) -> None:
    flaky = FlakyEmbedder(builtin_embedder)
    core = await make_core(embedder=flaky, dormant_after_days=2)
    clock.set_date(DAY1)
    cat = await save_ok(core, server_memory(CAT))
    last = await chat_days(core, clock, 2, DAY1)
    flaky.available = False
    clock.set_date(last + timedelta(days=1))
    before = await core.all_memories()
    recall = await core.reply_search(message(ASK_CAT))
    assert not recall.search_ok and recall.failure and recall.used == [] and recall.desk == []
    assert await core.all_memories() == before  # no counter changed
    waiting = await save_ok(core, server_memory(MINECRAFT))
    assert await pool.fetchval("SELECT count(*) FROM memory_vectors WHERE memory_id = $1", waiting.id) == 0
    assert core.embeddings.wanted.is_set()

    flaky.available = True
    clock.set_date(last + timedelta(days=2))
    recall = await core.reply_search(message("which Minecraft version does the server run?"))
    assert waiting.id not in [s.memory.id for s in recall.used]  # no vector yet: not searchable
    assert (await fetch(core, waiting)).days_unused == 0  # ... and so not aged
    assert await core.reembed_missing() == 1
    recall = await core.reply_search(message("which Minecraft version does the server run?"))
    assert [s.memory.id for s in recall.used] == [waiting.id]
    assert [s.memory.id for s in (await core.reply_search(message(ASK_CAT))).recalled] == [cat.id]


async def test_a_failed_embedding_never_ages_or_deletes(make_core: MakeCore, clock: ManualClock, builtin_embedder) -> None:
    flaky = FlakyEmbedder(builtin_embedder)
    core = await make_core(embedder=flaky, dormant_after_days=1, server_memory_limit=1)
    clock.set_date(DAY1)
    await save_ok(core, server_memory(CAT))
    flaky.available = False
    for offset in range(1, 6):
        clock.set_date(DAY1 + timedelta(days=offset))
        await core.reply_search(message(CHATTER[0]))
        assert (await core.save(server_memory(f"fact number {offset}"))).rejected == Rejection.SEARCH_UNAVAILABLE
    memories = await core.all_memories()
    assert [(m.text, m.days_unused) for m in memories] == [(CAT, 0)]


async def test_changing_the_embedding_space_waits_then_reembeds(
    make_core: MakeCore, clock: ManualClock, builtin_embedder, pool: asyncpg.Pool
) -> None:
    class OtherModel(FlakyEmbedder):
        @property
        def space(self) -> EmbeddingSpace:
            return EmbeddingSpace("openai", "http://127.0.0.1:1/v1", "same-dimension-other-model")

    core = await make_core()
    clock.set_date(DAY1)
    cat = await save_ok(core, server_memory(CAT))
    moved = await make_core(embedder=OtherModel(builtin_embedder))
    recall = await moved.reply_search(message(ASK_CAT))
    assert recall.search_ok and recall.used == []  # the old space's vector is never used
    assert await moved.reembed_missing() == 1
    assert [s.memory.id for s in (await moved.reply_search(message(ASK_CAT))).used] == [cat.id]
    spaces = await pool.fetch("SELECT s.model FROM memory_vectors v JOIN embedding_spaces s ON s.id = v.space_id")
    assert [row["model"] for row in spaces] == ["same-dimension-other-model"]  # stale vectors removed


# --- beyond the plain rules: MAX_RECALLED and DESK_REFRESH=daily --------------------------------------


async def test_max_recalled_brings_more_dormant_matches_into_the_tail_without_resetting_them(
    make_core: MakeCore, clock: ManualClock
) -> None:
    core = await make_core(dormant_after_days=1, max_used=1, max_recalled=3)
    clock.set_date(DAY1)
    facts = [await save_ok(core, server_memory(text)) for text in (
        "Juno's cat Mochi loves tuna", CAT, "Mochi the cat sleeps on the sofa", MINECRAFT)]
    await chat_days(core, clock, 1, DAY1)
    clock.set_date(DAY1 + timedelta(days=2))
    recall = await core.reply_search(message("does Mochi the cat like tuna?"))
    assert len(recall.used) == 1 and len(recall.recalled) == 3
    assert recall.recalled[0].memory.id == recall.used[0].memory.id
    assert facts[3].id not in [s.memory.id for s in recall.recalled]
    states = {m.id: m.days_unused for m in await core.all_memories()}
    assert states[recall.used[0].memory.id] == 0
    assert sorted(states[s.memory.id] for s in recall.recalled[1:]) == [2, 2]  # recalled, yet still in the drawer


async def test_max_recalled_zero_is_spec_behaviour(make_core: MakeCore, clock: ManualClock) -> None:
    core = await make_core(dormant_after_days=1, max_used=1, max_recalled=0)
    clock.set_date(DAY1)
    for text in ("Juno's cat Mochi loves tuna", CAT, "Mochi the cat sleeps on the sofa"):
        await save_ok(core, server_memory(text))
    await chat_days(core, clock, 1, DAY1)
    clock.set_date(DAY1 + timedelta(days=2))
    recall = await core.reply_search(message("does Mochi the cat like tuna?"))
    assert [s.memory.id for s in recall.recalled] == [s.memory.id for s in recall.used] and len(recall.used) == 1


async def test_daily_desk_refresh_changes_the_desk_at_most_once_a_day(make_core: MakeCore, clock: ManualClock) -> None:
    core = await make_core(dormant_after_days=2, desk_refresh="daily")
    clock.set_date(DAY1)
    cat = await save_ok(core, server_memory(CAT))
    first = await core.reply_search(message(CHATTER[0]))
    assert first.desk == [] and [s.memory.id for s in first.held_back] == [cat.id]  # new today: in the tail
    minecraft = await save_ok(core, server_memory(MINECRAFT))
    again = await core.reply_search(message(CHATTER[1]))
    assert again.desk == [] and {s.memory.id for s in again.held_back} == {cat.id, minecraft.id}

    clock.set_date(DAY1 + timedelta(days=1))
    for text in (*CHATTER, "which Minecraft version do we run?"):
        recall = await core.reply_search(message(text))
        assert [m.id for m in recall.desk] == [cat.id, minecraft.id] and recall.held_back == []

    last = await chat_days(core, clock, 1, DAY1 + timedelta(days=1))  # the cat ages into the drawer...
    recall = await core.reply_search(message(CHATTER[1]))
    assert cat.id in [m.id for m in recall.desk]  # ...but stays on the desk the day it went dormant
    clock.set_date(last + timedelta(days=1))
    recall = await core.reply_search(message(ASK_CAT))
    assert [s.memory.id for s in recall.recalled] == [cat.id] and cat.id not in [m.id for m in recall.desk]
    later = await core.reply_search(message(CHATTER[2]))
    desk_after = [m.id for m in later.desk]
    assert cat.id not in desk_after and [s.memory.id for s in later.held_back] == [cat.id]  # tail until tomorrow
    clock.set_date(last + timedelta(days=2))
    tomorrow = await core.reply_search(message(CHATTER[0]))
    assert cat.id in [m.id for m in tomorrow.desk] and tomorrow.held_back == []


async def test_daily_desk_keeps_a_memory_that_went_dormant_today_and_was_used_later_today(
    make_core: MakeCore, clock: ManualClock
) -> None:
    core = await make_core(dormant_after_days=1, desk_refresh="daily")
    clock.set_date(DAY1)
    cat = await save_ok(core, server_memory(CAT))
    clock.set_date(DAY1 + timedelta(days=1))
    morning = await core.reply_search(message(CHATTER[0]))  # ages the cat into the drawer...
    assert [m.id for m in morning.desk] == [cat.id] and core.is_dormant(await fetch(core, cat))
    asked = await core.reply_search(message(ASK_CAT))  # ...and it is used later the same day
    assert [s.memory.id for s in asked.used] == [cat.id] and asked.recalled == []
    after = await core.reply_search(message(CHATTER[1]))
    assert [m.id for m in after.desk] == [cat.id] and after.held_back == []  # no comeback: the head stays
