"""The words side of hybrid scoring: what of a message the search statement weighs against memories.

Embeddings match meaning but blur the words that identify a fact — a pet's name, "pottery",
"Sweden" — so a question about one of them can rank a vaguely related memory above the one that
names it. The search statement adds a lexical bonus to cosine similarity (`LEXICAL_WEIGHT` x an
IDF-weighted overlap in [0, 1]): the words are stemmed by PostgreSQL's 'english' text search
configuration on both sides (memories carry them in `memories.terms`, migration 007), and the
weights come from the searchable set of that very reply, so a word every memory shares (the
speaker's own name, "likes") counts for almost nothing and a rare one for most.

This module only prepares the message: it keeps letters and digits (so nothing in it can be read
as text-search syntax), drops common Spanish words and everyday English chat words (PostgreSQL's
'english' configuration drops only English function words), and picks out names, which count
double.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

# Common Spanish words: the bot's documented second language. They would carry some weight in a
# small searchable set where only a few memories happen to contain them.
_SPANISH_STOPWORDS = """
    a al algo algun alguna algunas alguno algunos ante antes aqui asi aun bien cada como con contra
    cual cuales cuando de del desde donde dos el ella ellas ello ellos en entre era eran es esa esas
    ese eso esos esta estaba estaban estado estan estar este esto estos fue fueron ha habia han hasta
    hay la las le les lo los mas me mi mis mucho muy nada ni no nos nosotros o otra otras otro otros
    para pero poco por porque que quien se sea ser si sido sin sobre son su sus tambien te tiene
    tienen todo todos tu tus un una unas uno unos usted ya yo
"""
SPANISH_STOPWORDS = frozenset(_SPANISH_STOPWORDS.split())

# Everyday English chat words that PostgreSQL's stop list keeps but that name nothing: in a small
# searchable set they can be rare ("night" in one memory of ten) and would pull "it snowed all
# night" towards "Movie night is every Friday". Rare words and names are what identify a fact.
_COMMON_ENGLISH = """
    actually after again ago already also always amazing anyone anything around away awesome back bad
    best better big bit come coming cool could day days definitely did does doing done easy else
    even ever every everyone everything feel feeling fine first found fun get gets getting give glad
    go goes going gone good got great guess guys happy hard hear heard hello help hey hi hope hour
    hours idea just keep kind know last later least let lets life like liked little lol long look
    looking looks lot lots love loved made make makes many maybe mean much need never new next nice
    night now ok okay old one oh people pretty probably put quite really right said say says see seems
    seen shall sharing since something soon sorry sound sounds still stuff sure take talk tell thank
    thanks thing things think thought time times today together told tomorrow tonight totally try
    trying two use used want wanted way week weekend well went whole wish without wonderful work
    working wow yeah year years yes yesterday yet
"""
COMMON_ENGLISH = frozenset(_COMMON_ENGLISH.split())

WORD = re.compile(r"\w+", re.UNICODE)
SENTENCE_BREAK = re.compile(r"(?<=[.!?¿¡…])\s+|\n+")
# A capitalised word that does not open a sentence: a person, a pet, a place, a title.
NAME = re.compile(r"(?<![.!?¿¡]\s)(?<!^)(?<![.!?¿¡])\b([^\W\d_][^\W_]*)\b", re.UNICODE)


@dataclass(frozen=True)
class LexicalQuery:
    """The message's words for `to_tsvector('english', ...)` in the search statement, and its names."""

    words: str
    names: str


def _letters_and_digits(words: list[str]) -> list[str]:
    return [w for w in (w.replace("_", "") for w in words) if w]


def _is_stopword(word: str) -> bool:
    """Accents do not matter: "está" and "esta" are both the common word."""
    bare = "".join(c for c in unicodedata.normalize("NFKD", word.casefold()) if not unicodedata.combining(c))
    return bare in SPANISH_STOPWORDS or bare in COMMON_ENGLISH


def lexical_query(text: str) -> LexicalQuery:
    """Split a message into the words to weigh and the names among them.

    >>> lexical_query("How is Mochi, Juno's cat?")
    LexicalQuery(words='How is Mochi Juno s cat', names='Mochi Juno')
    """
    words = _letters_and_digits(WORD.findall(text))
    kept = [w for w in words if not _is_stopword(w)]
    # each line and each sentence on its own, so the word that opens one is never taken for a name;
    # a message in capitals has no telling capitals at all
    sentences = [] if text.isupper() else SENTENCE_BREAK.split(text.strip())
    names = _letters_and_digits(
        [
            m.group(1)
            for sentence in sentences
            for m in NAME.finditer(sentence.strip())
            if m.group(1)[0].isupper() and not _is_stopword(m.group(1))
        ]
    )
    return LexicalQuery(words=" ".join(kept), names=" ".join(names))


def any_word_query_cte(param: str) -> str:
    """SQL of a `query` CTE with one column, `any_word`: a tsquery matching any of the words in `param`.

    The text fallback of every search (memories, older chat, documents) matches this way: OR, so a
    message with words no row holds still finds the rows holding the others. The words are stemmed
    by the 'english' configuration, as `terms` are; a text of stop words alone gives no row (rather
    than an empty tsquery, which PostgreSQL warns about). `param` is a placeholder such as `$4`
    holding `LexicalQuery.words`: letters and digits only, so nothing in it is tsquery syntax.
    """
    return (
        "query AS (SELECT array_to_string(tsvector_to_array(words), ' | ')::tsquery AS any_word"
        f" FROM to_tsvector('english', {param}::text) AS words WHERE length(words) > 0)"
    )
