"""What `python -m bot smoke` reads in every posted reply, and its longer conversation of three people over three days.

A reply people read must not start with a speaker label or carry a user id, be a lone fence or empty, speak in
tool wording, repeat an earlier reply, echo the message it answers, claim a memory change that did not run, or
answer a Spanish question in English. The checks are the bot's own (`bot.chat.reply_text`), applied to what was
posted: after the bot's checks nothing should be left to find, and a bot without them fails here.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bot.chat.reply_text import (
    CLAIM,
    ECHO,
    EMPTY,
    FENCE,
    HONEST,
    HONEST_ES,
    LABEL,
    LANGUAGE,
    NOT_SAVED,
    NOT_SAVED_ES,
    REPEAT,
    TOOL_WORDING,
    USER_ID,
    ReplyFacts,
    check,
    history_text,
    looks_spanish,
)
from bot.chat.text_calls import parse_text_calls, strip_tool_json

FAILURES = (LABEL, USER_ID, FENCE, EMPTY, TOOL_WORDING, REPEAT, ECHO, CLAIM, LANGUAGE)

# The longer conversation: (days to move the clock forward first, who speaks, what they say). Three people, three
# chat days, Spanish questions, a save, a forget of something never saved, an update, and questions asked twice.
RIN, BAU = "Rin", "Bau"
LONG_SCRIPT: tuple[tuple[int, str, str], ...] = (
    (0, RIN, "Hey Deskmate, I'm Rin. My birthday is on May 3, please remember it."),
    (0, BAU, "Please remember that I host game night every Friday at 8pm."),
    (0, "Juno", "Can you recommend a good sci-fi novel?"),
    (0, RIN, "¿Cuándo es la noche de juegos?"),
    (1, BAU, "When is game night again?"),
    (0, "Juno", "Forget Bau's birthday, please."),
    (0, RIN, "Do you remember when my birthday is?"),
    (0, "Juno", "¿Me recomiendas un juego de mesa para cuatro personas?"),
    (1, BAU, "Game night moved to Saturdays at 7pm. Please update that."),
    (0, RIN, "What do you know about me?"),
    (0, "Juno", "Thanks Deskmate, you're great!"),
    (0, BAU, "When is game night now?"),
)


@dataclass
class ReplyReading:
    """What was found in one posted reply (`problems`), and what the bot's checks had taken out before posting."""

    problems: list[str]
    fixed: list[str]
    asked_again: bool


def read_reply(
    posted: str, answered: str, speakers: dict[int, str], persona: str, earlier: Sequence[str], done: set[str],
    fixed: Sequence[str] = (), asked_again: bool = False, earlier_asked: Sequence[str] = (),
    people_said: Sequence[str] = (),
) -> ReplyReading:
    """The failures a person would see in `posted`, found with the bot's own checks (the same question asked again may
    get the same answer: `earlier_asked` says what each earlier reply answered)."""
    model_part = history_text(posted)  # the bot's own lines ("📝 Saved: …", the honest sentence) are no answer to read
    if not model_part:
        return ReplyReading([], list(fixed), asked_again)
    checked = check(model_part, ReplyFacts(answered, speakers, persona, earlier, done, earlier_asked=earlier_asked,
                                           people_said=people_said))
    problems = [problem for problem in checked.problems if problem in FAILURES]
    return ReplyReading(problems, list(fixed), asked_again)


@dataclass
class Tally:
    """The figures of a run: per failure, how many replies showed it; what the bot's checks fixed; Spanish answers."""

    replies: int = 0
    found: Counter[str] = field(default_factory=Counter)
    fixed: Counter[str] = field(default_factory=Counter)
    asked_again: int = 0
    spanish_asked: int = 0
    spanish_answered: int = 0
    honest: int = 0  # replies that were the bot's honest sentence: the model's own answers could not be posted
    not_saved: int = 0  # replies that carried the line saying nothing was saved (a claim was taken out)
    not_saved_alone: int = 0  # of those, the replies that were that line and nothing else
    failing_turns: list[str] = field(default_factory=list)

    def add(self, label: str, reading: ReplyReading, answered: str, posted: str) -> None:
        self.replies += 1
        self.found.update(set(reading.problems))
        self.fixed.update(set(reading.fixed))
        self.asked_again += reading.asked_again
        self.honest += posted.strip() in (HONEST, HONEST_ES)
        self.not_saved += any(line.strip() in (NOT_SAVED, NOT_SAVED_ES) for line in posted.splitlines())
        self.not_saved_alone += posted.strip() in (NOT_SAVED, NOT_SAVED_ES)
        if looks_spanish(answered):
            self.spanish_asked += 1
            self.spanish_answered += looks_spanish(posted)
        if reading.problems:
            self.failing_turns.append(f"{label} ({', '.join(reading.problems)})")

    def figures(self) -> str:
        seen = ", ".join(f"{name} {self.found[name]}" for name in FAILURES)
        fixed = ", ".join(f"{name} {count}" for name, count in sorted(self.fixed.items())) or "nothing"
        return (
            f"{self.replies} replies; in what was posted: {seen}; Spanish questions answered in Spanish "
            f"{self.spanish_answered}/{self.spanish_asked}. The bot's checks took out: {fixed}; asked the model again "
            f"{self.asked_again} times; the honest sentence instead of the model's answer {self.honest}/{self.replies}; "
            f"the line saying nothing was saved {self.not_saved} ({self.not_saved_alone} of them alone)"
        )


MEMORY_TOOLS = ("save_memory", "update_memory", "forget_memory")


def posted_part(raw: str) -> str:
    """What of a raw answer reaches the reply checks: the text around its calls, without tool JSON (as the bot does)."""
    return strip_tool_json(parse_text_calls(raw, MEMORY_TOOLS).text).strip()


class AnswerRecorder:
    """With `--record FILE`: each raw answer of the model, with what it answered, for the tests to replay."""

    def __init__(self, path: Path | None, model: str) -> None:
        self.path = path
        self.model = model
        self.records: list[dict[str, Any]] = []

    def add(self, label: str, raw: str, answered: str, speakers: dict[int, str], earlier: Sequence[str], done: set[str],
            persona: str) -> None:
        if self.path is None:
            return
        facts = ReplyFacts(answered, speakers, persona, earlier, done)
        text = posted_part(raw)
        self.records.append({
            "id": f"{self.model}-{label}-{len(self.records)}", "model": self.model, "answered": answered,
            "speakers": {str(user): name for user, name in speakers.items()}, "earlier": list(earlier),
            "done": sorted(done), "raw": raw, "problems": list(check(text, facts).problems),
        })

    def write(self) -> None:
        if self.path is None or not self.records:
            return
        with self.path.open("a", encoding="utf-8") as out:
            for record in self.records:
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.records.clear()
