"""What people asked the bot to remember about themselves, noted from their own lines when the model's notes left it out.

"Please remember that my cat is called Mochi." is the clearest thing a day can teach, and the one a person expects
to find again. Qwen2.5-Coder 0.5B made no call for it in its reply and wrote no facts at all for that day (its
summary named the cat), so the person's request was lost. Such a line is noted as said, as a fact about its speaker:
the request goes, the first person becomes the third ("Juno's cat is called Mochi."), and only where the rules of
the day-end notes allow it: a notable speaker (privacy none, not blocked), a sentence in the first person that is no
question and names nobody else. What the plain rules cannot rewrite (Spanish, a sentence that opens with something
else) is left to the model: a line copied with its "Name: " in front reads like the transcript.
"""

from __future__ import annotations

import re

from bot.memory.models import MemoryList
from bot.summaries.facts import Checked, DayText, Note, names_in
from bot.summaries.writer import MAX_KEY_DETAILS
from bot.third_person import first_person, in_third_person, stated, without_request

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def asked_notes(day: DayText, checked: Checked) -> list[Note]:
    """Notes for the requests to remember that none of `checked`'s notes comes from (and that say nothing new of a
    note or remembered fact already there)."""
    noted = {(channel, message) for note in checked.notes for channel, message, _ in note.sources}
    known = {_key(note.text) for note in checked.notes} | {_key(memory.text) for memory in day.remembered.values()}
    by_user = {speaker.user_id: speaker for speaker in day.speakers.values()}
    found: list[Note] = []
    for row in day.rows:
        speaker = by_user.get(row["author_id"])
        if row["is_bot"] or speaker is None or not speaker.notable or (row["channel_id"], row["message_id"]) in noted:
            continue
        others = [s.name for s in day.speakers.values() if s.user_id != speaker.user_id] + day.unnamed
        for sentence in _SENTENCE_END.split(stated(str(row["text"]))):
            said = stated(without_request(sentence))
            if not said or said.rstrip().endswith("?") or not first_person(said):
                continue
            if any(names_in(said, name) and not names_in(speaker.name, name) for name in others):
                continue
            text = in_third_person(said.rstrip(" .!"), speaker.name)
            if text is None or _key(text) in known:
                continue
            known.add(_key(text))
            source = ((row["channel_id"], row["message_id"], row["author_id"]),)
            found.append(Note(speaker, MemoryList.PERSONAL, f"{text}.", None, source, bool(row.get("private_thread"))))
    room = max(0, MAX_KEY_DETAILS - len(checked.key_details))
    checked.key_details.extend(note.text for note in found[:room])
    return found


def _key(text: str) -> str:
    return " ".join(text.casefold().rstrip(" .!").split())
