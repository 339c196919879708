"""What a reply may contain before people read it, and what the model is shown of the bot's earlier words.

Small models copy what they see: the transcript's `Name (user ID):` labels, a lone code fence, the field
names of a tool result, an earlier reply, the very message they answer. Each of those is a reply nobody
wants, and once posted it sits in the channel's history where the model sees it again and copies it
once more. So every reply passes `check` before it is posted:

- a speaker label or user id of anyone in the conversation at its start is cut, and so is a transcript
  the model went on writing for other speakers, and a `(user 123)` id anywhere;
- a lone fence, or a plain-text answer wrapped in one, loses the fence; so does a lead-in ("Sure, here's my reply
  in Markdown:") that only says an answer follows;
- a sentence in tool wording (`memory_id`, "forgotten to make room") goes, and so does a memory line or tool
  result the model copied (`{"id": 4, "text": "..."}`; when that is the whole reply, its text is the answer);
- a sentence saying a memory was saved, changed or forgotten when no such change ran in this reply goes,
  and one line says that nothing was saved (people must be able to trust such a sentence); so does a short
  "Sure thing, Rin!" that opens the answer to a request to remember, change or forget, when nothing ran;
- what is left is flagged when it is empty, an echo of the message, or a repeat of an earlier reply:
  the reply pipeline then asks the model once more, and if that fails too, posts one honest sentence;
- an answer in the other language (English to a Spanish message, Spanish to an English one) is asked for once more
  too, but kept if the second try is no better.

`history_text` is the other half: the bot's own fixed sentences (notices, apologies, the line about nothing
being saved) are not the model's words, so they are never shown to it as such.

Everything here is pure and bounded: it reads model output, which is untrusted.
"""

from __future__ import annotations

import functools
import json
import re
import unicodedata
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from difflib import SequenceMatcher

MAX_COMPARED = 1_000  # characters of each text compared for echoes and repeats (bounded work on long replies)
ECHO_RATIO = 0.8
ECHO_MIN_SAID = 24  # an earlier line of someone else this long, said again, is an echo ("ok" said again is an answer)
REPEAT_RATIO = 0.9
REPEAT_MIN_CHARS = 20  # a short "Thanks!" or "You're welcome" may come twice without being a loop

HONEST = "Sorry, I don't have a good answer to that right now. Could you put it another way?"
HONEST_ES = "Lo siento, ahora mismo no tengo una buena respuesta. ¿Puedes decirlo de otra manera?"
NOT_SAVED = "(I haven't saved anything to my memory in this reply.)"
NOT_SAVED_ES = "(No he guardado nada en mi memoria en esta respuesta.)"
NOTICE_MARKS = ("📝", "✏️", "🗑️", "📦", "⚠️", "🗒️")  # the first character of every notice line the bot writes

# Problems `check` reports (the receipts count them; `make smoke` fails on the ones that reach people).
LABEL, USER_ID, FENCE, TOOL_WORDING, CLAIM, ECHO, REPEAT, EMPTY, LANGUAGE, LEAD_IN, ONLY_CLAIM = (
    "label", "user id", "fence", "tool wording", "claim", "echo", "repeat", "empty", "language", "lead-in", "only a claim"
)
UNUSABLE = frozenset({ECHO, REPEAT, EMPTY})


@dataclass(frozen=True)
class ReplyFacts:
    """What a reply is checked against: the message it answers, who is in the conversation, the bot's earlier
    replies, and which memory changes really ran in this reply ("saved", "updated", "forgotten", "remembered")."""

    answered: str
    speakers: Mapping[int, str] = field(default_factory=dict)
    persona_name: str = ""
    earlier_replies: Sequence[str] = ()
    done: Collection[str] = ()
    earlier_asked: Sequence[str] = ()  # the message each earlier reply answered ("" when not known), in the same order
    also_not: Sequence[str] = ()  # other texts the reply must not merely repeat (the request to answer again)
    people_said: Sequence[str] = ()  # the people's earlier lines: Qwen2.5-Coder 0.5B answered Rin with Rin's own words


@dataclass(frozen=True)
class CheckedReply:
    text: str  # what may be posted ("" when nothing usable is left)
    problems: tuple[str, ...]

    @property
    def usable(self) -> bool:
        return bool(self.text) and not UNUSABLE.intersection(self.problems)


# --- the bot's own words ---------------------------------------------------------------------------------

_OWN_LINES = (NOT_SAVED, NOT_SAVED_ES, HONEST, HONEST_ES)


def is_own_line(line: str) -> bool:
    """A line the bot itself wrote (a notice, an apology, the note that nothing was saved), not the model."""
    stripped = line.strip()
    return stripped.startswith(NOTICE_MARKS) or stripped in _OWN_LINES


def history_text(text: str, own_sentences: Collection[str] = ()) -> str:
    """What the model is shown of one of the bot's earlier messages: without the bot's own lines, so it never
    reads them as something it said (and copies them). "" when nothing of the model's is left."""
    if text.strip() in own_sentences:
        return ""
    return "\n".join(line for line in text.splitlines() if not is_own_line(line)).strip()


# --- language ----------------------------------------------------------------------------------------------

_SPANISH_WORDS = frozenset((
    "qué", "que", "cómo", "como", "cuándo", "cuando", "dónde", "donde", "por", "para", "el", "la", "los", "las",
    "una", "uno", "es", "está", "mi", "tu", "sabes", "puedes", "recuerdas", "gracias", "hola", "mañana", "noche",
    "juego", "libro", "mis", "sus", "pero", "también", "muy",
))


def looks_spanish(text: str) -> bool:
    """Rough and cheap: enough to word the bot's own fixed sentences in the language of the message."""
    if "¿" in text or "¡" in text or re.search(r"[ñáéíóú]", text.casefold()):
        return True
    words = re.findall(r"\w+", text.casefold())
    return sum(word in _SPANISH_WORDS for word in words) >= 3


_ENGLISH_WORDS = frozenset((
    "the", "is", "are", "you", "your", "what", "when", "where", "how", "my", "me", "do", "does", "can", "to", "of",
    "and", "it", "please", "thanks", "again", "now", "with", "about", "know", "remember", "i", "i'm", "that", "this",
))


_ABOUT_LANGUAGE = re.compile(r"spanish|español|translat|tradu[cz]", re.IGNORECASE)


def _word_counts(text: str) -> tuple[int, int]:
    """English and Spanish common words in `text`; an inverted question or exclamation mark counts as two Spanish."""
    words = re.findall(r"[\w']+", text.casefold())
    spanish = sum(word in _SPANISH_WORDS for word in words) + 2 * ("¿" in text or "¡" in text)
    return sum(word in _ENGLISH_WORDS for word in words), spanish


def wrong_language(answered: str, reply: str) -> bool:
    """An English answer to a Spanish message, or a Spanish one to a plainly English message (Qwen2.5-Coder 0.5B
    answered "What do you know about me?" with "¿Qué conoces sobre mí?")."""
    if looks_spanish(answered):
        return not looks_spanish(reply)
    if _ABOUT_LANGUAGE.search(answered):  # "how do I say that in Spanish?" wants Spanish in the answer
        return False
    english, spanish = _word_counts(answered)
    reply_english, reply_spanish = _word_counts(reply)
    return english >= 2 and spanish == 0 and reply_spanish >= 2 and reply_spanish > reply_english


def honest_sentence(answered: str) -> str:
    return HONEST_ES if looks_spanish(answered) else HONEST


# --- labels and ids ------------------------------------------------------------------------------------------

_ID_LABEL = r"\(\s*(?:user|bot)\s*[:#]?\s*\d{2,}[^)\n]{0,60}\)"
_ANY_ID_LABEL = re.compile(r"[ \t]*" + _ID_LABEL)
_SCAFFOLD = re.compile(
    r"^\s*\[(?:Message to answer|Recalled memories|More notes|Your reply)[^\]\n]{0,200}\]\s*", re.IGNORECASE
)
_FENCE_LINE = re.compile(r"^\s*`{3,}\s*([\w+.#-]*)\s*$")
_PLAIN_LANGS = frozenset({"", "plaintext", "plain", "text", "txt", "markdown", "md"})


def _names_pattern(names: Collection[str]) -> str:
    cleaned = sorted({" ".join(name.split()) for name in names if name and name.strip()}, key=len, reverse=True)
    return "|".join(re.escape(name) for name in cleaned[:200])


def _label_patterns(facts: ReplyFacts) -> list[re.Pattern[str]]:
    names = [*facts.speakers.values(), facts.persona_name, "assistant", "bot", "Bot", "Assistant"]
    known = _names_pattern(names)
    emphasis = r"[*_]{0,2}"
    found = [re.compile(rf"^\s*{emphasis}[^\n:()\[\]]{{1,60}}?\s*{_ID_LABEL}\s*{emphasis}\s*:\s*", re.IGNORECASE)]
    found.append(re.compile(rf"^\s*{emphasis}{_ID_LABEL}\s*{emphasis}\s*:?\s*", re.IGNORECASE))
    if known:
        found.append(re.compile(rf"^\s*{emphasis}(?:{known}){emphasis}\s*:\s*", re.IGNORECASE))
    return found


def _strip_labels(text: str, facts: ReplyFacts, problems: list[str]) -> str:
    patterns = _label_patterns(facts)
    for _ in range(5):  # "Juno (user 1): Deskmate: hi" - a few labels in a row at most
        before = text
        text = _SCAFFOLD.sub("", text, count=1)
        for pattern in patterns:
            text = pattern.sub("", text, count=1)
        if text == before:
            break
        problems.append(LABEL)
    # a transcript the model went on writing: a later line spoken by someone else ends the reply there
    lines = text.split("\n")
    for number, line in enumerate(lines[1:], 1):
        if any(pattern.match(line) for pattern in patterns) or _SCAFFOLD.match(line):
            text = "\n".join(lines[:number])
            problems.append(LABEL)
            break
    without_ids = _ANY_ID_LABEL.sub("", text)
    for user_id, name in facts.speakers.items():
        if len(str(user_id)) >= 6:
            without_ids = re.sub(rf"(?<![<@!&\d])(?:user\s+)?{user_id}(?!\d|>)", " ".join(name.split()) or "someone", without_ids)
    if without_ids != text:
        problems.append(USER_ID)
    return without_ids


def without_transcript(text: str, speakers: Mapping[int, str]) -> str:
    """A memory text the model wrote, without what it copied of the transcript: a speaker label in front, the
    transcript it went on copying after a label further on ("...remember it. Rin (user 4012...): Hey..."), and any
    user id (a speaker's is written as their name). Whom a memory is about is kept beside it by id, so an id in its
    text only reaches whoever reads the memory or its notice."""
    text = text.strip()
    known = _names_pattern(speakers.values())
    later_label = re.compile(rf"(?:(?:{known})[ \t]*)?{_ID_LABEL}[ \t]*:" if known else rf"{_ID_LABEL}[ \t]*:", re.IGNORECASE)
    for found in later_label.finditer(text):
        if _has_words(text[: found.start()]):  # the same cut `_strip_labels` makes at a line, made inside one
            text = text[: found.start()]
            break
    return _strip_labels(text, ReplyFacts(answered="", speakers=speakers), []).strip()


# --- lead-ins -----------------------------------------------------------------------------------------------

# "Sure, here's my reply in Markdown:" - the instructions' words about the answer, in front of it (or instead of it)
_LEAD_IN = re.compile(
    r"^\s*(?:(?:sure|ok(?:ay)?|of course|certainly|claro)[,!.]?\s*)?here(?:'s| is| are)\s+(?:my|the|a|an|your)\s+"
    r"(?:[\w-]+\s+){0,4}?(?:reply|answer|response|recommendation|message)s?\b[^:\n]{0,40}:[ \t]*\n?",
    re.IGNORECASE,
)


def _strip_lead_in(text: str, problems: list[str]) -> str:
    without = _LEAD_IN.sub("", text, count=1)
    if without != text:
        problems.append(LEAD_IN)
    return without


# --- fences --------------------------------------------------------------------------------------------------


def _strip_fences(text: str, problems: list[str]) -> str:
    lines = text.strip().split("\n")
    fences = [number for number, line in enumerate(lines) if _FENCE_LINE.match(line)]
    if not fences:
        return text
    inner = [line for number, line in enumerate(lines) if number not in fences]
    if not "".join(inner).strip():  # nothing but fences
        problems.append(FENCE)
        return ""
    wrapped = fences == [0, len(lines) - 1] if len(lines) > 1 else False
    language = _FENCE_LINE.match(lines[0]).group(1).casefold() if wrapped else None  # type: ignore[union-attr]
    if wrapped and language in _PLAIN_LANGS and not _looks_like_code("\n".join(inner)):
        problems.append(FENCE)
        return "\n".join(inner)
    if len(fences) % 2:  # an unclosed fence: the model stopped, or wrote a lone marker
        problems.append(FENCE)
        return "\n".join(line for number, line in enumerate(lines) if number != fences[-1])
    return text


def _looks_like_code(text: str) -> bool:
    return bool(re.search(r"[{};=]|^\s*(?:def|class|import|return|for|if|function|const|let|var)\b", text, re.MULTILINE))


# --- sentences ------------------------------------------------------------------------------------------------

# A memory line or tool result the model copied as its answer: {"id": 4, "text": "..."} and the like.
_DATA_OBJECT = re.compile(r'\{[^{}\n]{0,2000}?"(?:id|text|list|about|memory_id|ok|error)"\s*:[^{}\n]{0,2000}\}')

_ANSWER_KEYS = ("text", "message", "content", "answer", "reply", "response")


def _lone_text_object(text: str) -> str | None:
    """What may be posted of a reply that is nothing but one JSON object (no call in it): its answer text (`text`,
    `message`, ... at the top or one level down: {"args": {"message": "..."}}), or "" when it has none or does not
    parse ('{"args": }'). None when the reply is something else."""
    if not (text.startswith("{") and text.endswith("}")) or len(text) > 4_000:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return "" if re.match(r'\{\s*"', text) else None
    if not isinstance(value, dict) or "name" in value:
        return None
    for layer in (value, *(inner for inner in value.values() if isinstance(inner, dict))):
        for key in _ANSWER_KEYS:
            if isinstance(layer.get(key), str):
                return str(layer[key]).strip()
    return ""


_FENCED = re.compile(r"\A\s*`{3,}[\w+.#-]*[ \t]*\n?(.*?)\n?[ \t]*`{3,}\s*\Z", re.DOTALL)  # one whole block

# The same, cut short by the output limit: an object opened with a data key and never closed.
# a call or result cut off at the end; or only its first key's beginning (0.5B's answer stopped at `{"name`)
_OPEN_DATA = re.compile(r'\{\s*"(?:(?:name|id|text|list|about|memory_id|arguments|ok|error)"\s*:[^}]*|[a-z_]{0,12})\Z')

_SENTENCE = re.compile(r"[^.!?\n]*(?:[.!?]+[\"'”’)\]]*|\n|$)")
_TOOL_WORDING = re.compile(
    r"\b(?:save_memory|update_memory|forget_memory|memory_id|forgotten_to_make_room|similar_memories|"
    r"already_remembered_as|about_user|tool_calls?|tool_choice|tool results?)\b|forgotten to make room|"
    r"already remembered as|\bsimilar memories\b|<\s*/?\s*(?:tool_(?:call|response|result)|tools?\s*>)|"
    r"\"(?:ok|error|hint|note)\"\s*:|"
    # what a tool result says, retold: "has been assigned the memory ... with an ID of 2", "memory #4", "the 7005 user"
    r"\bassigned (?:the |a |this )?memor(?:y|ies)\b|\bmemor(?:y|ies) (?:id|#)\s*\d|\b(?:with |con )(?:an? |the |el )?id\b"
    r"(?: of| is| de)?\s*#?\d|\b\d{3,} user\b",
    re.IGNORECASE,
)

_CLAIMS: dict[str, tuple[re.Pattern[str], ...]] = {
    "saved": (
        re.compile(
            r"\bI(?:'ve| have)\s+(?:now\s+|also\s+|just\s+|already\s+)?(?:saved|stored|noted|recorded|added|written down|"
            r"made a note|remembered|kept)\b",
            re.IGNORECASE,
        ),
        re.compile(
            r"\bI(?:'ll| will| am going to|'m going to)\s+(?:now\s+|also\s+|definitely\s+|be sure to\s+|make sure to\s+)?"
            r"(?:remember|save|store|note|keep (?:that|this|it) in mind|make a note|add)\b",
            re.IGNORECASE,
        ),
        re.compile(r"\bI\s+(?:saved|stored|noted down|recorded)\b", re.IGNORECASE),
        re.compile(r"\b(?:saved|stored|added)\s+(?:it\s+|that\s+|this\s+)?(?:to|in|into)\s+(?:my\s+)?(?:memory|memories|notes)\b",
                   re.IGNORECASE),
        re.compile(r"\b(?:memory|note)\s+(?:has been|was|is now)\s+(?:saved|stored|added|created)\b", re.IGNORECASE),
        re.compile(r"(?<!no )\b(?:lo |la |los |las )?he\s+(?:guardado|anotado|apuntado|registrado)\b", re.IGNORECASE),
        re.compile(r"\b(?:recordaré|guardaré|anotaré|apuntaré)\b", re.IGNORECASE),
    ),
    "updated": (
        re.compile(r"\bI(?:'ve| have)\s+(?:now\s+|just\s+|also\s+)?(?:updated|changed|corrected|edited)\b", re.IGNORECASE),
        re.compile(r"\bI(?:'ll| will)\s+(?:now\s+)?(?:update|correct)\b", re.IGNORECASE),
        re.compile(r"\bI\s+(?:just\s+|also\s+)?(?:updated|corrected)\b", re.IGNORECASE),
        re.compile(r"\b(?:memory|note)\s+(?:has been|was|is now)\s+(?:updated|changed|corrected)\b", re.IGNORECASE),
        re.compile(r"(?<!no )\bhe\s+(?:actualizado|cambiado|corregido)\b|\bactualizaré\b", re.IGNORECASE),
    ),
    "forgotten": (
        re.compile(r"\bI(?:'ve| have)\s+(?:now\s+|just\s+|also\s+)?(?:forgotten|deleted|removed|erased)\b", re.IGNORECASE),
        re.compile(r"\bI(?:'ll| will)\s+(?:now\s+)?(?:forget|delete|remove|erase)\b", re.IGNORECASE),
        re.compile(r"\bI\s+(?:just\s+|also\s+)?(?:forgot|deleted|removed|erased)\b", re.IGNORECASE),
        re.compile(r"\b(?:memory|note)\s+(?:has been|was|is now)\s+(?:deleted|removed|forgotten|erased)\b", re.IGNORECASE),
        re.compile(r"(?<!no )\bhe\s+(?:olvidado|borrado|eliminado)\b|\b(?:olvidaré|borraré)\b", re.IGNORECASE),
    ),
    # a reply that is only an acknowledgement ("Done.", "Updated!", "Listo.") says a change ran, of whatever kind asked
    "done": (
        re.compile(
            r"^\s*(?:(?:ok(?:ay)?|sure|got it|alright|vale|claro)\s*[,!.]?\s*)?(?:all\s+|it's\s+|it is\s+)?"
            r"(?:done|updated|saved|noted|changed|deleted|forgotten|removed|hecho|listo|actualizado|guardado|anotado|"
            r"borrado)(?:\s+(?:it|that|this))?\s*[.!]*\s*$",
            re.IGNORECASE,
        ),
    ),
}
# A request for a change, and a short acknowledgement at the start of the answer to one: with nothing run, the
# acknowledgement is a claim (Qwen2.5-Coder 1.5B answered "Forget Bau's birthday, please." with "Sure thing, Juno!").
_REQUESTS = {
    "saved": re.compile(
        r"(?:^|[.!?,]\s*|\b(?:please|pls|can you|could you|would you|and)\s+)(?:remember|save|note|keep in mind)\b"
        r"|\b(?:recuerda|recuérdalo|apunta|guarda|anota)\b",
        re.IGNORECASE,
    ),
    "updated": re.compile(
        r"(?:^|[.!?,]\s*|\b(?:please|pls|can you|could you|would you|and)\s+)(?:update|change|correct)\b"
        r"|\b(?:actualiza|cambia|corrige)\b",
        re.IGNORECASE,
    ),
    "forgotten": re.compile(
        r"(?:^|[.!?,]\s*|\b(?:please|pls|can you|could you|would you|and)\s+)(?:forget|delete|remove|erase)\b"
        r"|\b(?:olvida|bórralo|borra|elimina)\b",
        re.IGNORECASE,
    ),
}
_ACKNOWLEDGEMENT = re.compile(
    r"[\s¡]*(?:sure(?: thing)?|got it|okay|ok|will do|of course|no problem|absolutely|alright|all right|understood|"
    r"certainly|claro|vale|de acuerdo|entendido|por supuesto|perfecto)\b",
    re.IGNORECASE,
)
ACKNOWLEDGEMENT_WORDS = 5  # "Sure thing, Rin." is the acknowledgement; "Sure, the capital of France is Paris." answers
# what really ran, for each kind of claim
_BACKED_BY = {
    "done": {"saved", "updated", "forgotten", "remembered"},
    "saved": {"saved", "updated", "remembered"},
    "updated": {"updated", "saved"},
    "forgotten": {"forgotten"},
}


def _sentences(text: str) -> list[str]:
    return [part for part in _SENTENCE.findall(text) if part]


def claimed(sentence: str) -> set[str]:
    """The kinds of memory change a sentence says the bot made ("saved", "updated", "forgotten")."""
    return {kind for kind, patterns in _CLAIMS.items() if any(pattern.search(sentence) for pattern in patterns)}


def requested(message: str) -> set[str]:
    """The kinds of memory change a message asks for ("Please remember that…", "Forget Bau's birthday, please.")."""
    return {kind for kind, pattern in _REQUESTS.items() if pattern.search(message)}


def _drop_sentences(text: str, facts: ReplyFacts, problems: list[str]) -> tuple[str, bool]:
    """Without the sentences in tool wording and those claiming a change that did not run; whether a claim went."""
    kept: list[str] = []
    false_claim = spanish_claim = False
    asked = requested(facts.answered)
    opening = True
    for sentence in _sentences(text):
        if _TOOL_WORDING.search(sentence):
            problems.append(TOOL_WORDING)
            kept.append("\n" if sentence.endswith("\n") else "")
            continue
        said = claimed(sentence)
        if opening and _has_words(sentence):
            opening = False
            if asked and _ACKNOWLEDGEMENT.match(sentence) and len(sentence.split()) <= ACKNOWLEDGEMENT_WORDS:
                said |= asked  # "Sure thing, Rin." to "please remember my birthday" says it is done
        unbacked = {kind for kind in said if not _BACKED_BY[kind] & set(facts.done)}
        if unbacked:
            problems.append(CLAIM)
            false_claim = True
            spanish_claim = spanish_claim or looks_spanish(sentence)
            kept.append("\n" if sentence.endswith("\n") else "")
            continue
        kept.append(sentence)
    cleaned = re.sub(r"[ \t]+\n", "\n", "".join(kept))
    cleaned = re.sub(r"\n{3,}", "\n\n", cleaned).strip()
    if false_claim:
        line = NOT_SAVED_ES if spanish_claim or looks_spanish(facts.answered) else NOT_SAVED
        cleaned = f"{cleaned}\n{line}" if _has_words(cleaned) else line
    return cleaned, false_claim


# --- echoes and repeats --------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def normalized(text: str) -> str:
    """Letters and digits in lower case, single-spaced: what two texts are compared by. Cached: every reply compares
    itself with the same window lines as the replies before it."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    return " ".join(re.sub(r"[^\w]+", " ", folded).split())[:MAX_COMPARED]


def _similar(a: str, b: str, at_least: float) -> bool:
    """Whether the two texts' similarity ratio reaches `at_least`. The two upper bounds of the ratio (lengths, then
    letters in common) settle most pairs first: the full comparison of a reply with each line of the window was half
    of the bot's CPU per reply in the throughput benchmark's profile."""
    if not a or not b:
        return False
    matcher = SequenceMatcher(None, a, b, autojunk=False)
    return matcher.real_quick_ratio() >= at_least and matcher.quick_ratio() >= at_least and matcher.ratio() >= at_least


def is_echo(reply: str, source: str) -> bool:
    """The reply only says again what it answers: the same words, maybe with a word or two around them."""
    mine, theirs = normalized(reply), normalized(source)
    if not mine or not theirs:
        return False
    if _similar(mine, theirs, ECHO_RATIO):
        return True
    return len(theirs) >= 20 and theirs in mine and len(mine) <= len(theirs) + 30


_COMMON_WORDS = frozenset((
    "the", "and", "you", "your", "are", "what", "when", "where", "who", "how", "why", "does", "did", "can", "could",
    "please", "again", "now", "about", "that", "this", "with", "for", "have", "has", "was", "were", "will", "would",
    "there", "their", "they", "them", "from", "not", "but", "all", "any", "some", "que", "por", "para", "una", "los",
    "las", "del", "con", "thanks", "thank", "hey", "hello", "hola",
))


def _content_words(text: str, names: Collection[str]) -> set[str]:
    skip = _COMMON_WORDS | {word for name in names for word in normalized(name).split()}
    return {word for word in normalized(text).split() if len(word) >= 3 and word not in skip and not word.isdigit()}


def answers_the_message(reply: str, answered: str, names: Collection[str] = ()) -> bool:
    """The reply takes up what the message asks about (a word of it besides names and common words): saying a fact
    again to the question it answers ("Do you remember my cat's name?" - "Juno's cat is called Mochi.") is no loop."""
    return bool(_content_words(reply, names) & _content_words(answered.replace("'s", ""), names))


def is_repeat(
    reply: str, earlier: Sequence[str], earlier_asked: Sequence[str] = (), answered: str = "", names: Collection[str] = ()
) -> bool:
    """The reply says again what an earlier reply said, to another question (the same question asked again may get
    the same answer, and so may a question about what that reply said)."""
    mine = normalized(reply)
    if len(mine) < REPEAT_MIN_CHARS or (answered and answers_the_message(reply, answered, names)):
        return False
    question = normalized(answered)
    for number, before in enumerate(earlier):
        if not _similar(mine, normalized(before), REPEAT_RATIO):
            continue
        asked = normalized(earlier_asked[number]) if number < len(earlier_asked) else ""
        if not (asked and question and _similar(asked, question, ECHO_RATIO)):
            return True
    return False


def _only_a_name(text: str, facts: ReplyFacts) -> bool:
    names = {normalized(name) for name in (*facts.speakers.values(), facts.persona_name) if name.strip()}
    return bool(text.strip()) and normalized(text) in names


def _has_words(text: str) -> bool:
    return any(character.isalnum() for character in text)


# --- the check -------------------------------------------------------------------------------------------------


def _echo_sources(facts: ReplyFacts) -> list[str]:
    """What a reply may not merely say again: the message, the request to answer again, the messages earlier replies
    answered, and anyone's earlier line long enough not to be small talk."""
    said = [line for line in facts.people_said if len(normalized(line)) >= ECHO_MIN_SAID]
    return [facts.answered, *facts.also_not, *facts.earlier_asked, *said]


def check(text: str, facts: ReplyFacts) -> CheckedReply:
    """The reply as it may be posted, and what was wrong with it (see the module docstring)."""
    problems: list[str] = []
    cleaned = _strip_labels(text.strip(), facts, problems)
    cleaned = _strip_fences(cleaned, problems).strip()
    cleaned = _strip_labels(cleaned, facts, problems).strip()  # a label inside the fence
    cleaned = _strip_fences(_strip_lead_in(cleaned, problems), problems).strip()  # "Here's my reply:" and its fence
    fenced = _FENCED.match(cleaned)
    inner = _lone_text_object(cleaned if fenced is None else fenced.group(1).strip())
    if inner is not None:  # the answer written as a memory line: {"id": 15, "text": "You're welcome, Juno!"}
        problems += [TOOL_WORDING] if fenced is None else [FENCE, TOOL_WORDING]  # or one in a ```json block
        cleaned = inner
    without_data = _OPEN_DATA.sub("", _DATA_OBJECT.sub("", cleaned))
    if without_data != cleaned:
        problems.append(TOOL_WORDING)
        cleaned = without_data.strip()
    cleaned, false_claim = _drop_sentences(cleaned, facts, problems)
    if _only_a_name(cleaned, facts):  # "Rin." - a speaker's label with nothing after it
        problems += [LABEL, EMPTY]
        cleaned = ""
    elif not _has_words(cleaned):
        problems.append(EMPTY)
        cleaned = ""
    elif false_claim and not history_text(cleaned):
        problems.append(ONLY_CLAIM)  # postable (it is true), but worth one more try for an answer to go with it
    elif any(is_echo(history_text(cleaned), source) for source in _echo_sources(facts)):
        problems.append(ECHO)  # of this message or an earlier one; without the line saying nothing was saved (the bot's)
    elif is_repeat(history_text(cleaned), facts.earlier_replies, facts.earlier_asked, facts.answered,
                   (*facts.speakers.values(), facts.persona_name)):
        problems.append(REPEAT)
    elif wrong_language(facts.answered, cleaned):
        problems.append(LANGUAGE)  # usable, but worth one more try in the right language
    return CheckedReply(cleaned, tuple(dict.fromkeys(problems)))


def again_request(problems: Collection[str], author_name: str, spanish: bool) -> str:
    """What the model is told when its answer cannot be posted: short, and nothing it could usefully copy. To a
    Spanish message it is written in Spanish: a small model answers in the language of the last thing it read, so
    an English request for a Spanish answer got English again."""
    if spanish:
        if ECHO in problems:
            why = f"Eso solo repetía el mensaje de {author_name}."
        elif REPEAT in problems:
            why = "Eso repetía una de tus respuestas anteriores."
        elif ONLY_CLAIM in problems:
            why = "No se guardó nada en la memoria; no digas que sí."
        elif LANGUAGE in problems:
            why = f"{author_name} escribió en español."
        else:
            why = "Eso no tenía ninguna respuesta."
        return (
            f"[{why} Responde ahora a {author_name} en español, con tus propias palabras, brevemente, "
            "sin nombre ni etiqueta delante.]"
        )
    if ECHO in problems:
        why = f"That only repeated {author_name}'s message."
    elif REPEAT in problems:
        why = "That repeated one of your earlier replies."
    elif ONLY_CLAIM in problems:
        why = "Nothing was saved to memory; do not say it was."
    elif LANGUAGE in problems:
        why = f"{author_name} wrote in English."
    else:
        why = "That had no answer in it."
    return f"[{why} Answer {author_name} now in your own words, briefly, with no name or label in front.]"
