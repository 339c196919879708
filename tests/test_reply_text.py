"""The reply checks (`bot.chat.reply_text`) on what small models really wrote: each failure people saw is a case here.

The first cases are replies seen with llama.cpp and Qwen2.5-Coder 1.5B/0.5B before the checks existed; the
recorded answers of later runs are replayed from tests/data/replies-qwen2.5-coder.jsonl.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bot.chat.reply_text import (
    CLAIM,
    ECHO,
    EMPTY,
    FENCE,
    LABEL,
    LANGUAGE,
    LEAD_IN,
    NOT_SAVED,
    NOT_SAVED_ES,
    ONLY_CLAIM,
    REPEAT,
    TOOL_WORDING,
    USER_ID,
    ReplyFacts,
    again_request,
    check,
    history_text,
    honest_sentence,
    is_own_line,
    without_transcript,
)
from bot.tools.smoke_checks import posted_part

JUNO, BAU, RIN = 35422606562367, 105407232310802, 223525073110616
SPEAKERS = {JUNO: "Juno", BAU: "Bau", RIN: "Rin"}
RECORDED = Path(__file__).parent / "data" / "replies-qwen2.5-coder.jsonl"


def facts(answered: str = "hi", *, earlier: tuple[str, ...] = (), done: tuple[str, ...] = ()) -> ReplyFacts:
    return ReplyFacts(answered=answered, speakers=SPEAKERS, persona_name="Deskmate", earlier_replies=earlier, done=done)


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("Juno (user 35422606562367): sorry, but I can't help you.", "sorry, but I can't help you."),
        ("Deskmate: Game night is on Friday!", "Game night is on Friday!"),
        ("**Rin**: Happy birthday!", "Happy birthday!"),
        ("(user 105407232310802): Sure thing.", "Sure thing."),
        ("Someone New (user 999999999): hello there", "hello there"),
        ("[Message to answer, 2026-11-03 18:00 UTC, #general]\nIt's on Friday.", "It's on Friday."),
    ],
)
def test_a_speaker_label_or_id_at_the_start_is_cut(reply: str, expected: str) -> None:
    checked = check(reply, facts("when is game night?"))
    assert checked.text == expected and checked.usable
    assert LABEL in checked.problems or USER_ID in checked.problems


def test_a_transcript_the_model_goes_on_writing_ends_at_the_next_speaker() -> None:
    reply = "Friday at 8!\nBau (user 105407232310802): cool, see you there\nDeskmate: see you!"
    checked = check(reply, facts("when is game night?"))
    assert checked.text == "Friday at 8!" and LABEL in checked.problems


def test_an_id_inside_the_reply_becomes_the_name() -> None:
    checked = check(f"I think user {BAU} said that, and Rin (user {RIN}) agreed.", facts("who said that?"))
    assert checked.text == "I think Bau said that, and Rin agreed." and USER_ID in checked.problems


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (  # what Qwen2.5-Coder 0.5B saved, and its notice showed to everyone
            f"Your birthday is on May 3, please remember it. Rin (user {RIN}): Hey Deskmate, I'm Rin. My birthday is on May 3.",
            "Your birthday is on May 3, please remember it.",
        ),
        (f"Rin (user {RIN}): my birthday is on May 3", "my birthday is on May 3"),
        (f"Rin's birthday is May 3 (user {RIN})", "Rin's birthday is May 3"),
        (f"user {BAU} hosts game night", "Bau hosts game night"),
        ("Juno's cat is called Mochi", "Juno's cat is called Mochi"),
    ],
)
def test_a_memory_text_keeps_nothing_of_the_transcript(text: str, expected: str) -> None:
    assert without_transcript(text, SPEAKERS) == expected


@pytest.mark.parametrize("reply", ["```", "```plaintext", "```plaintext\n```", "  ```\n\n```  "])
def test_a_fence_only_reply_is_empty(reply: str) -> None:
    checked = check(reply, facts("can you recommend a sci-fi novel?"))
    assert checked.text == "" and not checked.usable and EMPTY in checked.problems and FENCE in checked.problems


def test_plain_text_in_a_fence_is_unwrapped_and_code_is_kept() -> None:
    assert check("```plaintext\nTry Dune by Frank Herbert.\n```", facts()).text == "Try Dune by Frank Herbert."
    code = "Here:\n```python\nprint('hi')\n```"
    assert check(code, facts("how do I print in python?")).text == code
    assert check("Sure!\n```", facts("anything?")).text == "Sure!"  # an unclosed fence at the end


@pytest.mark.parametrize(
    "reply",
    [
        "There are no forgotten to make room tasks. Game night is on Friday.",
        'Game night is on Friday. {"ok": true, "memory_id": 3}',
        "Game night is on Friday. I called save_memory for it.",
        'Game night is on Friday. {"id": 4, "text": "Bau hosts game night every Friday at 8pm"}',
        'Game night is on Friday.\n{"name',  # a call cut off by the output limit (Qwen2.5-Coder 0.5B)
    ],
)
def test_tool_wording_goes_and_the_answer_stays(reply: str) -> None:
    checked = check(reply, facts("when is game night?"))
    assert checked.text == "Game night is on Friday." and TOOL_WORDING in checked.problems


@pytest.mark.parametrize(
    "reply",
    [
        "I've saved a memory about Rin's birthday. Happy early birthday, Rin!",
        "Happy early birthday, Rin! I'll remember that it's on May 3.",
        "I have updated it. Happy early birthday, Rin!",
    ],
)
def test_a_claimed_save_that_did_not_run_is_taken_out_and_said(reply: str) -> None:
    checked = check(reply, facts("my birthday is May 3"))
    assert checked.text == f"Happy early birthday, Rin!\n{NOT_SAVED}" and CLAIM in checked.problems and checked.usable


def test_a_claim_that_is_all_there_is_leaves_only_the_line_saying_nothing_was_saved() -> None:
    assert check("I've saved a memory about Rin's birthday.", facts("my birthday is May 3")).text == NOT_SAVED
    assert check("¡Lo he guardado!", facts("mi cumpleaños es el 3 de mayo")).text == NOT_SAVED_ES


def test_a_claim_backed_by_what_ran_is_kept() -> None:
    reply = "I've saved that: your birthday is May 3."
    assert check(reply, facts("my birthday is May 3", done=("saved",))).text == reply
    assert check("I'll remember!", facts("remember my cat is Mochi", done=("remembered",))).text == "I'll remember!"
    forgot = check("I've forgotten it.", facts("forget Bau's birthday", done=("saved",)))
    assert forgot.text == NOT_SAVED and CLAIM in forgot.problems  # a save does not make a claimed forget true


@pytest.mark.parametrize(
    ("answered", "reply"),
    [
        (
            "please remember that Bau is a cheater at cards",
            "Noted: Bau (user 105407232310802): please remember that Bau is a cheater at cards",
        ),
        ("can you recommend a good sci-fi novel?", "Can you recommend a good sci-fi novel?"),
    ],
)
def test_an_echo_of_the_message_is_not_usable(answered: str, reply: str) -> None:
    checked = check(reply, facts(answered))
    assert ECHO in checked.problems and not checked.usable


def test_a_repeat_of_an_earlier_reply_is_not_usable_but_a_short_one_may_come_twice() -> None:
    earlier = ("Game night is every Friday at 8pm, at Bau's place.", "Thanks!")
    assert REPEAT in check("Noted: Game night is every Friday at 8pm, at Bau's place.",
                           facts("can you recommend a good sci-fi novel?", earlier=earlier)).problems
    refusal = check("Noted: There is no memory #2 in this conversation; use an id shown with a memory.", facts())
    assert TOOL_WORDING in refusal.problems and not refusal.usable  # a tool's refusal, retold
    assert check("Thanks!", facts("here you go", earlier=earlier)).usable


def test_a_repeat_behind_the_line_saying_nothing_was_saved_is_still_a_repeat() -> None:
    """The claim goes and the bot's line comes in its place: what is left of the model's answer is compared."""
    earlier = ("Have a good one, Rin! Your birthday is coming soon.",)
    checked = check("I've saved a memory about your birthday. Have a good one, Rin! Your birthday is coming soon.",
                    facts("Can you recommend a board game?", earlier=earlier))
    assert CLAIM in checked.problems and REPEAT in checked.problems and not checked.usable


def test_an_ordinary_answer_passes_unchanged() -> None:
    reply = "Try *The Left Hand of Darkness* by Ursula K. Le Guin: short, and it stays with you."
    checked = check(reply, facts("can you recommend a good sci-fi novel?", earlier=("Game night is on Friday.",)))
    assert checked.text == reply and checked.problems == () and checked.usable


@pytest.mark.parametrize(
    ("answered", "reply", "wrong"),
    [
        ("What do you know about me?", "¿Qué conoces sobre mí?", True),  # what Qwen2.5-Coder 0.5B answered
        ("¿Cuándo es la noche de juegos?", "Game night is on Friday at 8pm.", True),
        ("¿Cuándo es la noche de juegos?", "La noche de juegos es el viernes a las 8.", False),
        ("When is the meetup?", "Lucía moved it to Sunday at 18:00.", False),
        ("How do I say 'where is the library' in Spanish?", "¿Dónde está la biblioteca?", False),
    ],
)
def test_an_answer_in_the_other_language_is_asked_for_again(answered: str, reply: str, wrong: bool) -> None:
    checked = check(reply, facts(answered))
    assert (LANGUAGE in checked.problems) is wrong and checked.usable


def test_the_bots_own_lines_are_not_shown_to_the_model_as_its_words() -> None:
    assert is_own_line("📝 Saved: Juno's cat is called Mochi.") and is_own_line("⚠️ I did not change my memory.")
    assert history_text("📝 Saved: Juno's cat is called Mochi.") == ""
    assert history_text(f"Happy birthday!\n{NOT_SAVED}") == "Happy birthday!"
    assert history_text("Sorry, the model failed.", {"Sorry, the model failed."}) == ""
    assert history_text("Game night is on Friday.") == "Game night is on Friday."


def test_the_honest_sentence_follows_the_language_of_the_message() -> None:
    assert honest_sentence("¿Cuándo es la noche de juegos?") != honest_sentence("When is game night?")


def recorded() -> list[dict[str, object]]:
    if not RECORDED.exists():
        return []
    return [json.loads(line) for line in RECORDED.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.mark.parametrize("record", recorded(), ids=lambda record: str(record["id"]))
def test_recorded_answers_of_the_local_models_leave_nothing_people_should_not_read(record: dict[str, object]) -> None:
    """Each raw answer of a real run, checked as the bot checks it: what would be posted has no label or id at its
    start, no lone fence, no tool wording, no unbacked claim; and what the run flagged is flagged again."""
    speakers = {int(user): name for user, name in dict(record["speakers"]).items()}  # type: ignore[arg-type]
    checked = check(
        posted_part(str(record["raw"])),
        ReplyFacts(
            answered=str(record["answered"]),
            speakers=speakers,
            persona_name="Deskmate",
            earlier_replies=tuple(record.get("earlier", ())),  # type: ignore[arg-type]
            done=tuple(record.get("done", ())),  # type: ignore[arg-type]
        ),
    )
    assert set(checked.problems) == set(record["problems"])  # type: ignore[arg-type]
    again = check(checked.text, ReplyFacts(answered=str(record["answered"]), speakers=speakers, persona_name="Deskmate",
                                           done=tuple(record.get("done", ()))))  # type: ignore[arg-type]
    assert not {LABEL, USER_ID, FENCE, TOOL_WORDING, CLAIM} & set(again.problems), again


def test_the_line_saying_nothing_was_saved_is_no_claim_itself() -> None:
    for line in (NOT_SAVED, NOT_SAVED_ES, "I haven't saved that yet.", "No he guardado nada."):
        assert CLAIM not in check(line, facts("hola")).problems


def test_an_answer_written_as_a_memory_line_is_unwrapped() -> None:
    """Qwen2.5-Coder 0.5B took the prompt's memory lines for the answer's format."""
    checked = check('{"id": 15, "text": "You\'re welcome, Juno!"}', facts("Thanks Deskmate, you're great!"))
    assert checked.text == "You're welcome, Juno!" and checked.usable and TOOL_WORDING in checked.problems
    echoed = check('{"id": 10, "text": "Forget Bau\'s birthday, please."}', facts("Forget Bau's birthday, please."))
    assert ECHO in echoed.problems and not echoed.usable


@pytest.mark.parametrize(
    "reply",
    ['{"name": "', '{"name": "Siempre que esté en la noche de juegos", "text": "Siempre", "id": 1, "text": "Siem'],
)
def test_json_cut_short_by_the_output_limit_is_not_posted(reply: str) -> None:
    checked = check(reply, facts("¿Cuándo es la noche de juegos?"))
    assert checked.text == "" and TOOL_WORDING in checked.problems and not checked.usable


@pytest.mark.parametrize(
    ("reply", "left"),
    [
        ("Sure, here's my reply in Markdown:", ""),
        ("Here's my reply in Markdown:\n\n\"Dune\" by Frank Herbert is a classic.", "\"Dune\" by Frank Herbert is a classic."),
        ("Sure, here's my sci-fi novel recommendation:\n\nTry \"Dune\".", "Try \"Dune\"."),
    ],
)
def test_a_lead_in_that_only_says_an_answer_follows_goes(reply: str, left: str) -> None:
    """Qwen2.5-Coder 0.5B wrote the instructions' words in front of its answer, then copied them into every later
    reply; with them gone, a reply that repeats an earlier one in other words is seen as the repeat it is."""
    checked = check(reply, facts("Can you recommend a good sci-fi novel?"))
    assert checked.text == left and LEAD_IN in checked.problems
    assert checked.usable is bool(left)


@pytest.mark.parametrize(
    ("reply", "left"),
    [
        ('```json\n{\n    "id": 3,\n    "text": "The capital of France is Paris."\n}\n```', "The capital of France is Paris."),
        ("<tool_response> </tool_response>", ""),
        ("<tools> </tools>", ""),  # 0.5B copied the chat template's tools section, posted as the whole reply
        ("<tools>\n</tools>\n\nRin's birthday is on May 3.", "Rin's birthday is on May 3."),
        ('<tool_response>\n{"ok": true}\n</tool_response>\nDone!', "Done!"),
    ],
)
def test_a_memory_line_in_a_json_block_and_tool_response_tags_are_not_posted(reply: str, left: str) -> None:
    """Qwen2.5-Coder 0.5B answered in ```json memory lines, then copied that format; 1.5B posted the tool result's
    tags of its chat template (after a save that ran: its "Done!" is true)."""
    checked = check(reply, facts("What's the capital of France?", done=("saved",)))
    assert checked.text == left and TOOL_WORDING in checked.problems


def test_a_fact_said_again_to_the_question_it_answers_is_no_repeat() -> None:
    """Qwen2.5-Coder 1.5B confirmed a save with "Juno's cat is called Mochi." and gave the same sentence when asked
    for the cat's name a day later: the right answer, not a loop (it was replaced by the honest sentence)."""
    earlier = ("Juno's cat is called Mochi.", "Paris")
    assert check("Juno's cat is called Mochi.", facts("Do you remember my cat's name?", earlier=earlier)).usable
    looped = check("Juno's cat is called Mochi.", facts("Can you recommend a good sci-fi novel?", earlier=earlier))
    assert REPEAT in looped.problems and not looped.usable


@pytest.mark.parametrize("reply", ["Rin.", "¡Juno!", "**Bau**", "Deskmate"])
def test_a_name_and_nothing_else_is_no_answer(reply: str) -> None:
    """Qwen2.5-Coder 0.5B answered "Rin.", then "Bau.", then "Juno." (each copying the one before)."""
    checked = check(reply, facts("Can you recommend a good sci-fi novel?"))
    assert checked.text == "" and LABEL in checked.problems and not checked.usable


def test_an_echo_of_an_earlier_message_is_no_answer_either() -> None:
    """Qwen2.5-Coder 0.5B answered Juno's board-game question with Rin's earlier "¿Cuándo es la noche de juegos?"."""
    checked = check("¿Cuándo es la noche de juegos?", ReplyFacts(
        answered="¿Me recomiendas un juego de mesa para cuatro personas?", speakers=SPEAKERS, persona_name="Deskmate",
        earlier_replies=("El viernes a las 8.",), earlier_asked=("¿Cuándo es la noche de juegos?",)))
    assert ECHO in checked.problems and not checked.usable


def test_anyones_earlier_line_said_again_is_no_answer_but_small_talk_may_be() -> None:
    """Qwen2.5-Coder 0.5B answered Rin's "Do you remember when my birthday is?" with Rin's own earlier message, which
    no earlier reply had answered in the window (its answer was only the saved notice)."""
    earlier = ("Hey Deskmate, I'm Rin. My birthday is on May 3, please remember it.", "ok")
    asked = "Do you remember when my birthday is?"
    checked = check("I'm Rin, my birthday is on May 3, please remember it.",
                    ReplyFacts(answered=asked, speakers=SPEAKERS, persona_name="Deskmate", people_said=earlier))
    assert ECHO in checked.problems and not checked.usable
    assert check("ok", ReplyFacts(answered="is 8pm fine?", speakers=SPEAKERS, people_said=earlier)).usable


@pytest.mark.parametrize("reply", ['I forgot "Bau\'s birthday is on May 3."', "I updated the game night time."])
def test_a_claim_in_the_simple_past_is_a_claim_too(reply: str) -> None:
    """Qwen2.5-Coder 1.5B answered "Forget Bau's birthday, please." with the first line, and no memory changed."""
    checked = check(reply, facts("Forget Bau's birthday, please."))
    assert CLAIM in checked.problems and checked.text == NOT_SAVED


@pytest.mark.parametrize(
    ("asked", "reply", "done", "posted"),
    [  # Qwen2.5-Coder 1.5B's answers to requests it made no call for
        ("Forget Bau's birthday, please.", "Sure thing, Juno!", (), NOT_SAVED),
        ("My birthday is on May 3, please remember it.", "Sure thing, Rin. May you have a happy birthday!", (),
         f"May you have a happy birthday!\n{NOT_SAVED}"),
        ("Game night moved to Saturdays at 7pm. Please update that.", "Okay! Game night is on Saturdays now.", (),
         f"Game night is on Saturdays now.\n{NOT_SAVED}"),
        ("¿Puedes olvidar mi cumpleaños? Olvida eso.", "¡Claro, Rin!", (), NOT_SAVED_ES),
        # a request that ran, a question, or an answer that says more than "sure": as they are
        ("Please remember that I host game night.", "Sure thing, Bau!", ("saved",), "Sure thing, Bau!"),
        ("Do you remember when my birthday is?", "Sure! It is on May 3.", (), "Sure! It is on May 3."),
        ("Can you recommend a good sci-fi novel?", "Sure thing, Juno!", (), "Sure thing, Juno!"),
        ("Please remember that I host game night.", "Sure, game night on Fridays sounds like a lot of fun.", (),
         "Sure, game night on Fridays sounds like a lot of fun."),
    ],
)
def test_a_bare_acknowledgement_of_a_request_that_did_not_run_is_a_claim(
    asked: str, reply: str, done: tuple[str, ...], posted: str
) -> None:
    checked = check(reply, facts(asked, done=done))
    assert checked.text == posted
    assert (CLAIM in checked.problems) is (posted != reply)


def test_an_answer_that_is_only_a_claim_is_worth_another_try() -> None:
    """What is left of "I've saved it." is true but answers nothing: the pipeline asks once more."""
    alone = check("I've saved your birthday.", facts("please remember my birthday is on May 3"))
    assert alone.text == NOT_SAVED and ONLY_CLAIM in alone.problems and alone.usable
    with_answer = check("I've saved your birthday. Happy early birthday!", facts("my birthday is on May 3"))
    assert ONLY_CLAIM not in with_answer.problems and CLAIM in with_answer.problems
    assert "do not say it was" in again_request(alone.problems, "Rin", spanish=False)
    assert "no digas" in again_request(alone.problems, "Rin", spanish=True)
    assert check("Saved it!", facts("and remember that I play the cello")).text == NOT_SAVED  # short, and a claim


@pytest.mark.parametrize(
    ("reply", "left"),
    [
        ('{"args": }', ""),
        ('{"args": {"message": "La noche de juegos es el viernes a las 8 pm.", "time": "2026-01-02 12:07 UTC"}}',
         "La noche de juegos es el viernes a las 8 pm."),
    ],
)
def test_a_reply_that_is_one_json_object_is_never_posted_as_json(reply: str, left: str) -> None:
    """Qwen2.5-Coder 0.5B answered two turns with a JSON object of its own making."""
    checked = check(reply, facts("¿Cuándo es la noche de juegos?"))
    assert checked.text == left and TOOL_WORDING in checked.problems


@pytest.mark.parametrize("reply", ["Done.", "Done!", "All done.", "Okay, updated!", "Got it, saved.", "Listo.", "Hecho."])
def test_a_bare_acknowledgement_with_nothing_done_is_a_claim(reply: str) -> None:
    """Qwen2.5-Coder 1.5B answered "Please update that" with "Done." and made no call: the change was claimed."""
    checked = check(reply, facts("Game night moved to Saturdays at 7pm. Please update that."))
    assert CLAIM in checked.problems and checked.text in (NOT_SAVED, NOT_SAVED_ES)
    assert check(reply, facts("Game night moved to Saturdays at 7pm. Please update that.", done=("updated",))).text == reply


def test_done_inside_a_longer_answer_is_no_claim() -> None:
    """Only an acknowledgement that is the whole sentence says a change ran: "when you're done" is no claim."""
    checked = check("Let me know when you're done with the board game.", facts("I'm setting up the game"))
    assert CLAIM not in checked.problems
