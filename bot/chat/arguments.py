"""Lenient readers for the tool arguments small models send.

Small models do not keep to the schema: `"list": ["personal"]`, `"global": "yes"`, a user id as a string,
a mention or a name, `"memory_id": "#12"`. These read what was clearly meant and refuse the rest (None),
so the caller can tell the model what was wrong instead of acting on a guess.
"""

from __future__ import annotations

import re
from typing import Any

from bot.ids import parse_id

_MENTION = re.compile(r"<@!?([0-9]{1,20})>")


def as_list_name(value: Any) -> str | None:
    """The list a memory goes to, "personal" or "server" (any case, spaces around), bare or in a one-element list."""
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if isinstance(value, str):
        name = value.strip().lower()
        if name in ("personal", "server"):
            return name
    return None


_TRUE = frozenset({"true", "yes", "1"})
_FALSE = frozenset({"false", "no", "0"})


def as_bool(value: Any) -> bool | None:
    """A boolean written as a boolean, as true/false/yes/no/1/0 (any case) or as the ints 1 and 0; else None."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return {1: True, 0: False}.get(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
    return None


def _ascii_id(value: object) -> int | None:
    """An id as the one id parser reads it (`bot.ids.parse_id`), or None: a model's bad id is refused, not raised."""
    try:
        return parse_id(value, "id")
    except ValueError:
        return None


def as_user_ref(value: Any) -> int | str | None:
    """A user as an id (digits, an int or a `<@id>` mention) or as a name for the caller to resolve; else None.

    A string of digits is always taken as an id, so an id that is out of range is refused rather than
    looked up as somebody's name.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return _ascii_id(value)
    if not isinstance(value, str):
        return None
    text = value.strip()
    if not text or len(text) > 100:
        return None
    if text.isascii() and text.isdigit():
        return _ascii_id(text)
    mention = _MENTION.fullmatch(text)
    if mention:
        return _ascii_id(mention.group(1))
    return text


def as_memory_id(value: Any) -> int | None:
    """A memory id as an int or ASCII digits (also written "#12"), within 1..2**63-1; else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return _ascii_id(value)
    if not isinstance(value, str) or len(value) > 64:
        return None
    text = value.strip()
    if text.startswith("#"):
        text = text[1:].strip()
    return _ascii_id(text)
