"""Inputs of the hiding rules (docs/memory-rules.md) that are computed from text rather than stored state.

The stored rules (privacy, blocklist, personal memories off, channel limits, persona) are applied
inside the search statement (`hiding_sql.py`, used by `search_store.py`); this module prepares what that statement needs and
validates what people type, so both the bot and commands use one definition of "a tag" and
"a valid memory text".
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from bot.errors import InvalidInput
from bot.texts import clean_text as clean_setting_text

TAG_PATTERN = re.compile(r"^[\w-]{1,32}$")
WORD_PATTERN = re.compile(r"[\w-]+")
MAX_TAGS = 10


def context_words(texts: Iterable[str]) -> list[str]:
    """The lowercase words of the context window; a tagged memory needs one of its tags among them."""
    words: set[str] = set()
    for text in texts:
        words.update(match.group(0) for match in WORD_PATTERN.finditer(text.casefold()))
    return sorted(words)


def shown(value: object, limit: int = 40) -> str:
    """A bad value as an error message quotes it: repr (so invisible characters show), cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def normalize_tags(tags: Iterable[str]) -> tuple[str, ...]:
    """Lowercase, strip '#', drop duplicates; raise ValueError naming the first bad tag."""
    seen: dict[str, None] = {}
    for raw in tags:
        tag = raw.strip().lstrip("#").casefold()
        if not tag:
            continue
        if not TAG_PATTERN.match(tag):
            raise InvalidInput(f"tag {shown(raw)} must be one word of letters, digits, '-' or '_' (at most 32)")
        seen[tag] = None
    if len(seen) > MAX_TAGS:
        raise InvalidInput(f"a memory can have at most {MAX_TAGS} tags")
    return tuple(seen)


def clean_text(text: str, max_chars: int) -> str:
    """The stored form of a memory text, or InvalidInput saying why it cannot be stored (bot/texts.py)."""
    return clean_setting_text(text, max_chars, "the memory text")
