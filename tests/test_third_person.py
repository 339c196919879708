"""A day-end note from someone's own words reads as a fact about them, not as a line of the transcript."""

from __future__ import annotations

import pytest

from bot.third_person import as_fact_of, in_third_person


@pytest.mark.parametrize(
    ("said", "name", "fact"),
    [
        ("I live in Berlin now", "Rin", "Rin lives in Berlin now"),
        ("I moved to Lisbon last week, new job there", "Rin", "Rin moved to Lisbon last week, new job there"),
        ("I'm allergic to penicillin", "Juno", "Juno is allergic to penicillin"),
        ("my cat is actually called Luna, Mochi was my sister's cat", "Juno",
         "Juno's cat is actually called Luna, Mochi was their sister's cat"),
        ("I love playing chess on weekends, and I'm learning Spanish", "Juno",
         "Juno loves playing chess on weekends, and they're learning Spanish"),
        ("I really enjoy hiking and I was a nurse", "Bau", "Bau really enjoys hiking and they were a nurse"),
        ("I teach kids", "Bau", "Bau teaches kids"),
        ("I study biology", "Rin", "Rin studies biology"),
        ("I have two dogs", "Kai", "Kai has two dogs"),
        ("I don't eat meat", "Kai", "Kai doesn't eat meat"),
        ("I also go swimming", "Kai", "Kai also goes swimming"),
        ("I got a new job", "Rin", "Rin got a new job"),
    ],
)
def test_a_first_person_sentence_becomes_a_fact_about_its_speaker(said: str, name: str, fact: str) -> None:
    assert in_third_person(said, name) == fact


@pytest.mark.parametrize("said", ["vivo en Madrid con mi hermana", "we moved to Lisbon", "I", "the cat is called Mochi"])
def test_what_the_rules_cannot_rewrite_keeps_the_speakers_name_in_front(said: str) -> None:
    assert in_third_person(said, "Inés") is None
    assert as_fact_of(said, "Inés") == f"Inés: {said}"


def test_an_address_and_a_label_before_the_fact_are_left_out() -> None:
    said = "Deskmate, correction: my cat is actually called Luna"
    assert as_fact_of(said, "Juno") == "Juno's cat is actually called Luna"
