"""A person's own words: what a line says (`stated`), whether it speaks in the first person (`first_person`), and
the same as a fact about them (`in_third_person`, `as_fact_of`): "I live in Berlin now" said by Rin becomes
"Rin lives in Berlin now".

Day-end notes often keep a person's own words, and a memory stored as "Rin: I live in Berlin now" reads like a line
of the transcript. Shown among the remembered facts before a day's transcript, such lines sent Qwen2.5-Coder 1.5B
into a loop of mixed-up people ("Rin is allergic to penicillin, and Juno is allergic to penicillin..." for 600
tokens), and the move to Lisbon was never noted; the same facts written "Rin lives in Berlin" gave a clean answer.
A reply model shown "I moved here" as a memory also answers as if it had moved. The reply's own saves of what the
person answered said about themselves ("My cat is called Mochi.") are written the same way, so a fact saved mid-reply
and the same fact in the day's notes are one memory, not two.

Only English sentences that open with the speaker ("I", "I'm", "my") are rewritten, by a few plain rules: the
opening verb takes the third person, later "I" and "my" become "they" and "their". Anything else (Spanish, a
sentence that opens with something else, a verb the rules do not know) is left to the caller, which keeps the
"Name: " in front.
"""

from __future__ import annotations

import re

CONTRACTIONS = {  # the opening "I" and its verb, as one
    "i'm": "is", "i am": "is", "i've": "has", "i have": "has", "i was": "was", "i'll": "will", "i will": "will",
    "i'd": "would", "i do": "does", "i don't": "doesn't", "i do not": "does not", "i didn't": "didn't",
    "i can't": "can't", "i cannot": "cannot", "i haven't": "hasn't", "i wasn't": "wasn't", "i won't": "won't",
}
_UNCHANGED_WORDS = (  # verbs of the same form in the third person: past tense and modals
    "can could would should must might may did had was went got made took saw came left found bought began became "
    "brought built caught chose drove fell felt flew forgot gave grew heard hurt kept knew lost met paid put ran read "
    "said sold sent set sat slept spent spoke stood swam taught thought told understood won wore wrote broke"
)
UNCHANGED = frozenset(_UNCHANGED_WORDS.split())
_ADVERB_WORDS = (  # words between "I" and its verb that the verb keeps
    "also still just really now actually usually always never often sometimes recently finally mostly only "
    "already even sort kind"
)
ADVERBS = frozenset(_ADVERB_WORDS.split())
LATER = {  # the speaker again, after the opening
    "i": "they", "i'm": "they're", "i've": "they've", "i'll": "they'll", "i'd": "they'd", "me": "them",
    "my": "their", "mine": "theirs", "myself": "themselves",
}
I_WAS_LATER = re.compile(r"\bthey was\b", re.IGNORECASE)
WORD = re.compile(r"[A-Za-z]+(?:['’][A-Za-z]+)?")
PLAIN_ENGLISH = re.compile(r"^[A-Za-z0-9\s'’.,;:!?()\-&/\"%+#]+$")  # no accents or other scripts: Spanish is left alone


def in_third_person(text: str, name: str) -> str | None:
    """`text` as a fact about `name`, or None when the rules cannot tell (the caller keeps "Name: text")."""
    said = " ".join(text.replace("’", "'").split())
    if not said or not PLAIN_ENGLISH.match(said):
        return None
    opened = _opening(said, name)
    if opened is None:
        return None
    head, rest = opened
    return head + _later(rest)


def _opening(said: str, name: str) -> tuple[str, str] | None:
    """The rewritten opening ("Rin lives") and the text after it, or None."""
    lowered = said.casefold()
    for spoken in sorted(CONTRACTIONS, key=len, reverse=True):
        if lowered.startswith(spoken) and (len(said) == len(spoken) or not said[len(spoken)].isalpha()):
            return f"{name} {CONTRACTIONS[spoken]}", said[len(spoken) :]
    if lowered.startswith("my "):
        return f"{name}'s", said[2:]
    words = said.split(" ")
    if words[0].casefold() != "i" or len(words) < 2:
        return None
    kept = []
    for index, word in enumerate(words[1:], start=1):
        plain = word.casefold().strip(",.!?;:")
        if plain in ADVERBS:
            kept.append(word)
            continue
        verb = _third_person_verb(word)
        if verb is None:
            return None
        return " ".join([name, *kept, verb]), (" " + " ".join(words[index + 1 :])) if index + 1 < len(words) else ""
    return None


def _third_person_verb(word: str) -> str | None:
    """The verb as "he/she" says it ("live" -> "lives", "moved" stays), or None for a word that is no plain verb."""
    match = re.fullmatch(r"([A-Za-z]+)([,.!?;:]*)", word)
    if match is None:
        return None
    verb, tail = match.group(1), match.group(2)
    lowered = verb.casefold()
    if lowered in UNCHANGED or lowered.endswith("ed"):
        return verb + tail
    if lowered in ("be", "am"):
        return "is" + tail
    if lowered == "have":
        return "has" + tail
    if lowered in ("do", "go"):
        return verb + "es" + tail
    if re.search(r"(s|sh|ch|x|z)$", lowered):
        return verb + "es" + tail
    if re.search(r"[^aeiou]y$", lowered):
        return verb[:-1] + "ies" + tail
    return verb + "s" + tail


def _later(rest: str) -> str:
    """The rest of the sentence with the speaker as "they" / "their"."""

    def swap(found: re.Match[str]) -> str:
        word = found.group(0)
        return LATER.get(word.casefold(), word)

    return I_WAS_LATER.sub("they were", WORD.sub(swap, rest))


ADDRESS = re.compile(r"^\s*(?:<@!?\d+>\s*,?|@?[^\W\d_][\w-]*\s*,)\s*")  # "Deskmate, ...", "<@123>, ..."
LABEL = re.compile(r"^\s*([^\W\d_]+(?:\s+[^\W\d_]+){0,2})\s*:\s+")  # "correction: ", "heads up: ", "big news: "


ASKED_TO_REMEMBER = re.compile(r"^\s*(?:please\s+)?(?:remember|note(?:\s+down)?|save)\s+(?:that\s+)?", re.IGNORECASE)
PLEASE_REMEMBER_IT = re.compile(
    r",?\s*(?:so\s+)?(?:please\s+)?remember\s+(?:it|that|this)(?:,?\s*please)?\s*([.!]*)\s*$", re.IGNORECASE
)


def without_request(sentence: str) -> str:
    """A sentence without its request to remember ("Please remember that my cat is called Mochi." -> "my cat is called
    Mochi.", "My birthday is on May 3, please remember it." -> "My birthday is on May 3."); "" when it had none."""
    said = PLEASE_REMEMBER_IT.sub(r"\1", ASKED_TO_REMEMBER.sub("", sentence, count=1)).strip()
    return said if said != sentence.strip() else ""


def stated(line: str) -> str:
    """What a line says, without an address to someone ("Deskmate, ") and a leading label ("correction: ",
    "heads up: "): "Deskmate, correction: my cat is actually called Luna" -> "my cat is actually called Luna".
    A word in the first person is never taken for an address or a label ("my cat: Luna" stays)."""
    text = " ".join(line.split())
    for pattern in (ADDRESS, LABEL, ADDRESS, LABEL):
        found = pattern.match(text)
        if found is not None and not first_person(found.group(0)) and found.end() < len(text):
            text = text[found.end() :]
    return text


CLAUSE_BREAK = re.compile(r"[.;!?¿¡:,\n]+|\s(?:and|but|y|pero|also|también)\s", re.IGNORECASE)


def clauses(text: str) -> list[str]:
    """A line and, when it says several things, each of its clauses ("I live in Berlin, and my cat is Mochi")."""
    parts = [" ".join(part.split()) for part in CLAUSE_BREAK.split(text)]
    return [text, *(part for part in parts if len(part) > 3 and part != text)][:8]


_FIRST_PERSON_WORDS = "i i'm im i've i'll i'd my me mine myself yo mi mis soy estoy tengo vivo trabajo estudio juego voy hago"
FIRST_PERSON = frozenset(_FIRST_PERSON_WORDS.split())


def first_person(text: str) -> bool:
    """Whether a text speaks of its speaker in the first person singular (English, or Spanish, which drops the "yo")."""
    words = re.findall(r"[^\W\d_]+(?:['’][^\W\d_]+)?", text.casefold())
    return any(word.replace("’", "'") in FIRST_PERSON for word in words)


def as_fact_of(said: str, name: str) -> str:
    """What a person said about themselves as a fact about them: "I live in Berlin" by Rin -> "Rin lives in Berlin"
    (see `bot.third_person`), or "Rin: vivo en Berlín" when the rules cannot rewrite it."""
    return in_third_person(stated(said), name) or f"{name}: {said}"


def spoken_as_fact(text: str, name: str) -> str:
    """A remembered "Rin: I live in Berlin" (the form notes were once kept in) as "Rin lives in Berlin"."""
    prefix = re.match(rf"^\s*{re.escape(name)}\s*:\s*", text, flags=re.IGNORECASE)
    if prefix is None:
        return text
    return in_third_person(stated(text[prefix.end() :]), name) or text
