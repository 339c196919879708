"""Hybrid scoring (LEXICAL_WEIGHT) and MAX_RECALLED: what they add to the plain search.

A memory's score is its cosine similarity plus LEXICAL_WEIGHT × the IDF-weighted share of the
message's words it holds; the weights come from the reply's own searchable set. These tests run
the real statement on the real database with the real built-in model and compare the same search
with the bonus on and off, so the expected bonus follows from the rule, not from a stored number.
"""

from __future__ import annotations

import math
from datetime import timedelta

import pytest

from bot.clock import ManualClock
from bot.lexical import lexical_query
from bot.memory.models import ScoredMemory
from bot.memory.service import MemoryCore
from tests.conftest import MakeCore
from tests.test_rules import DAY1, chat_days, message, save_ok, server_memory

MEMORIES = ("Juno's cat is called Mochi", "Juno drinks green tea every morning", "Juno plays the cello on weekends")


def by_id(scored: list[ScoredMemory]) -> dict[int, float]:
    return {s.memory.id: s.similarity for s in scored}


async def scores(core: MemoryCore, text: str) -> dict[int, float]:
    """Every memory's score for `text` (MAX_USED large and the threshold at -1, so all are used)."""
    return by_id((await core.reply_search(message(text))).used)


# --- the message side -------------------------------------------------------------------------------


def test_names_are_capitalised_words_that_do_not_open_a_sentence() -> None:
    query = lexical_query("Did Juno take Mochi to the vet? Then Paris.")
    assert query.names.split() == ["Juno", "Mochi", "Paris"]
    assert "vet" in query.words.split() and "Then" in query.words.split()  # ("did" is everyday chat)


def test_spanish_common_words_are_dropped_accents_or_not() -> None:
    assert lexical_query("¿Cómo está el gato de Juno?").words.split() == ["gato", "Juno"]


def test_text_search_syntax_in_a_message_is_plain_text() -> None:
    query = lexical_query("x | b & !c:* (d) <-> 'e' \\f")
    assert set(query.words.split()) == {"x", "b", "c", "d", "e", "f"}


# --- the statement --------------------------------------------------------------------------------


async def test_a_rare_shared_word_adds_the_weight_times_its_share(make_core: MakeCore, clock: ManualClock) -> None:
    clock.set_date(DAY1)
    hybrid = await make_core(max_used=10, min_similarity=-1.0, lexical_weight=0.5)
    cosine = await make_core(max_used=10, min_similarity=-1.0, lexical_weight=0.0)
    cat, tea, cello = [await save_ok(hybrid, server_memory(text)) for text in MEMORIES]
    with_words, alone = await scores(hybrid, "mochi"), await scores(cosine, "mochi")
    # "mochi" is the message's only word and only the cat memory holds it: the whole bonus, 0.5
    assert with_words[cat.id] - alone[cat.id] == pytest.approx(0.5, abs=1e-6)
    assert with_words[tea.id] == pytest.approx(alone[tea.id]) and with_words[cello.id] == pytest.approx(alone[cello.id])


async def test_a_word_every_memory_holds_weighs_nothing_and_names_weigh_double(
    make_core: MakeCore, clock: ManualClock
) -> None:
    clock.set_date(DAY1)
    hybrid = await make_core(max_used=10, min_similarity=-1.0, lexical_weight=1.0)
    cosine = await make_core(max_used=10, min_similarity=-1.0, lexical_weight=0.0)
    cat, tea, cello = [await save_ok(hybrid, server_memory(text)) for text in MEMORIES]
    common = await scores(hybrid, "juno"), await scores(cosine, "juno")
    assert all(common[0][m] == pytest.approx(common[1][m]) for m in (cat.id, tea.id, cello.id))  # IDF ln(4/4) = 0

    # "Ask Juno about Mochi and tea": juno weighs 0; mochi (a name: capitalised mid-sentence) and tea
    # each appear in one memory of three, IDF ln(4/2), mochi counting double; "ask" is in none, so it
    # weighs most, ln(4/1), and no memory gets its share
    text = "Ask Juno about Mochi and tea"
    hybrid_scores, cosine_scores = await scores(hybrid, text), await scores(cosine, text)
    idf = math.log(4 / 2)
    total = math.log(4 / 1) + 2 * idf + idf
    assert hybrid_scores[cat.id] - cosine_scores[cat.id] == pytest.approx(2 * idf / total, abs=1e-6)
    assert hybrid_scores[tea.id] - cosine_scores[tea.id] == pytest.approx(idf / total, abs=1e-6)
    assert hybrid_scores[cello.id] == pytest.approx(cosine_scores[cello.id])


async def test_an_edit_changes_the_words_a_memory_is_found_by(make_core: MakeCore, clock: ManualClock) -> None:
    clock.set_date(DAY1)
    hybrid = await make_core(max_used=10, min_similarity=-1.0, lexical_weight=0.5)
    cosine = await make_core(max_used=10, min_similarity=-1.0, lexical_weight=0.0)
    cat, _, _ = [await save_ok(hybrid, server_memory(text)) for text in MEMORIES]
    edited = await hybrid.edit(cat.id, "Juno's cat is called Biscuit", by=1, by_can_manage=True)
    assert edited.ok, edited.detail
    assert (await scores(hybrid, "biscuit"))[cat.id] - (await scores(cosine, "biscuit"))[cat.id] == pytest.approx(0.5, abs=1e-6)
    assert (await scores(hybrid, "mochi"))[cat.id] == pytest.approx((await scores(cosine, "mochi"))[cat.id])


async def test_messages_with_text_search_syntax_are_searched_normally(make_core: MakeCore, clock: ManualClock) -> None:
    clock.set_date(DAY1)
    core = await make_core(max_used=10, min_similarity=-1.0)
    cat = await save_ok(core, server_memory(MEMORIES[0]))
    for text in ("Mochi | !cat & 'x'", "(((", ":*", "", "¿?", "the and of"):
        recall = await core.reply_search(message(text or "…"))
        assert recall.search_ok and [s.memory.id for s in recall.used] == [cat.id]


# --- MAX_RECALLED --------------------------------------------------------------------------------


async def test_max_recalled_shows_more_dormant_matches_but_only_used_ones_come_back(
    make_core: MakeCore, clock: ManualClock
) -> None:
    core = await make_core(dormant_after_days=1, max_used=1, max_recalled=2)
    clock.set_date(DAY1)
    cat, _, _ = [await save_ok(core, server_memory(text)) for text in MEMORIES]
    await chat_days(core, clock, 1, DAY1)  # everything is in the drawer now
    clock.set_date(DAY1 + timedelta(days=2))
    recall = await core.reply_search(message("what is Juno's cat called, and what does she drink?"))
    assert [s.memory.id for s in recall.used] == [cat.id]
    assert len(recall.recalled) == 2 and recall.recalled[0].memory.id == cat.id  # best first, the used one among them
    extra = recall.recalled[1].memory.id
    after = await core.reply_search(message("nice weather today"))
    assert cat.id in [m.id for m in after.desk] and extra not in [m.id for m in after.desk]  # shown, not reset


async def test_a_message_of_common_words_alone_gets_only_a_small_bonus(make_core: MakeCore, clock: ManualClock) -> None:
    clock.set_date(DAY1)
    hybrid = await make_core(max_used=10, min_similarity=-1.0, lexical_weight=0.5)
    cosine = await make_core(max_used=10, min_similarity=-1.0, lexical_weight=0.0)
    saved = [await save_ok(hybrid, server_memory(text)) for text in (*MEMORIES, "Juno's cat naps after breakfast")]
    cats = (saved[0].id, saved[3].id)
    with_words, alone = await scores(hybrid, "cat"), await scores(cosine, "cat")
    # "cat" is in 2 of 4 memories (IDF ln(5/3)); the whole weighs at least one word held by a single
    # memory (ln(5/2)), so each cat memory gets 0.5 x ln(5/3)/ln(5/2), not the whole 0.5
    expected = 0.5 * math.log(5 / 3) / math.log(5 / 2)
    assert all(with_words[m] - alone[m] == pytest.approx(expected, abs=1e-6) for m in cats)
    assert expected < 0.3


def test_a_word_opening_a_line_or_a_sentence_is_no_name_and_capitals_tell_nothing() -> None:
    assert lexical_query("hi there\nLater we play.  Then Mochi naps").names.split() == ["Mochi"]
    assert lexical_query("WHERE IS MOCHI THE CAT").names == ""
    assert lexical_query("I met Caroline at the LGBTQ group").names.split() == ["Caroline", "LGBTQ"]
