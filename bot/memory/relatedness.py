"""Whether a new text is about the same thing as the memory it would replace (the unrelated-update guard).

A small model's `update_memory` sometimes puts a new, unrelated fact over an old one ("I love playing chess on
weekends" over "Juno's cat is called Mochi"): applied, the cat would be gone from the list. So the model's
updates and the day-end corrections are applied only when the two texts are about the same subject:

    score = cosine(old, new) + SHARED_WORD_BONUS if they share a content word (names that open the text,
            such as the person both are about, do not count) else cosine(old, new)
    same subject  iff  score >= UPDATE_MIN_SIMILARITY (0.60 for the built-in model)

The model's `forget_memory` follows a rule of the same kind: a small model asked to "forget Bau's birthday"
deleted "Juno is learning Spanish" (the id it had in view). A memory is forgotten by the model only when the
message asking for it names nothing (a bare "forget that": what it points at is the model's to say), or shares a
content word with the memory, or is about the same subject by the cosine rule.

A day-end correction is held to a lower bar when the line it comes from says it changes something ("I moved to
Lisbon", "la quedada se cambia al domingo") and it shares a content word with the fact it replaces: the
threshold less CORRECTION_MARGIN. 1.5B wrote the Spanish meetup's change as "Lucía changed the meeting time to
Sunday at 18h due to rain." over "The server's meeting is on Saturday at 6 PM in the park of the Retiro." (0.50):
two texts about one meeting, with different details. "server" is no content word, like a person's name in a
personal list: every server memory is about the server. The words of living somewhere and of moving are one
word here (`HOME_WORDS`): a move shares no other word with where one lived ("Rin moved to Lisbon last week, new job
there" over "Rin lives in Berlin now" scores 0.58 alone).

Calibrated on the hand-made pairs of tests/data/updates.jsonl (corrections, additions and unrelated facts
about the same person, some in Spanish); docs/memory-rules.md gives the figures. Without an embedding the
shared word alone decides.
"""

from __future__ import annotations

import re
import unicodedata

from bot.lexical import COMMON_ENGLISH, SPANISH_STOPWORDS

SHARED_WORD_BONUS = 0.15
CORRECTION_MARGIN = 0.15
STEM_LENGTH = 4

# Words that say nothing about a fact's subject: function words, and the verbs every memory uses.
_PLAIN_WORDS = """
    about after all also and are because been before being but called can could did does doing for from
    had has have having her hers him his how into its just more most named not now only other our ours
    over she some such than that the their theirs them then there these they this those too under very
    was were what when where which while who whom why will with would you your yours
    server servers servidor servidores
"""
_PLAIN = frozenset(_PLAIN_WORDS.split())
HOME_WORDS = """
    live lives lived living move moves moved moving relocate relocated vivo vive vivía vivir mudé mudó mudado mudarme
"""
HOME = "<home>"
WORD = re.compile(r"[^\W\d_]+|\d+", re.UNICODE)


def _bare(word: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFKD", word.casefold()) if not unicodedata.combining(c))


_HOME = frozenset(_bare(word) for word in HOME_WORDS.split())


def content_stems(text: str, *, keep_first: bool = False) -> set[str]:
    """The words of a text that name its subject, cut to a crude stem ("nursing" and "nurse" -> "nurs").

    The capitalised word that opens the text is left out: in "Juno's cat is called Mochi" it is the person
    every memory of Juno's list is about, and sharing it says nothing.
    """
    words = WORD.findall(text)
    if words and words[0][:1].isupper() and not keep_first:
        words = words[1:]
    stems = set()
    for word in words:
        bare = _bare(word)
        if bare.isdigit():
            stems.add(bare)
        elif bare in _HOME:
            stems.add(HOME)
        elif len(bare) >= 3 and bare not in _PLAIN and bare not in COMMON_ENGLISH and bare not in SPANISH_STOPWORDS:
            stems.add(bare.removesuffix("s")[:STEM_LENGTH])
    return stems


def shares_a_word(old: str, new: str) -> bool:
    return bool(content_stems(old) & content_stems(new))


def subject_score(old: str, new: str, cosine: float | None) -> float | None:
    """The guard's score; None when there is no cosine (then `shares_a_word` alone decides)."""
    if cosine is None:
        return None
    return cosine + (SHARED_WORD_BONUS if shares_a_word(old, new) else 0.0)


def same_subject(old: str, new: str, cosine: float | None, threshold: float, *, declared_change: bool = False) -> bool:
    """Whether `new` may replace `old` as an update (see the module docstring); `declared_change`: a day-end correction
    from a line that says it changes something."""
    score = subject_score(old, new, cosine)
    if score is None:
        return shares_a_word(old, new)
    if declared_change and shares_a_word(old, new):
        threshold -= CORRECTION_MARGIN
    return score >= threshold


# The words of asking to forget, which name no subject ("please forget", "borra eso").
_FORGET_WORDS = """
    forget forgot forgotten delete deleted remove erase please memory memories remember anymore
    olvida olvidar olvides borra borrar borres elimina eliminar recuerdo recuerdos favor
"""
_FORGET_STEMS = frozenset(_bare(word).removesuffix("s")[:STEM_LENGTH] for word in _FORGET_WORDS.split())


def asked_to_forget(memory_text: str, asked: str, cosine: float | None, threshold: float) -> bool:
    """Whether the message `asked` may be what made the model forget `memory_text` (see the module docstring)."""
    named = content_stems(asked) - _FORGET_STEMS
    if not named or named & content_stems(memory_text, keep_first=True):  # "Movie night is on Fridays" names a movie
        return True
    return cosine is not None and cosine >= threshold
