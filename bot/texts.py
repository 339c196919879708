"""The one cleaner of short texts people type into the bot's settings and memories.

Trimmed; control characters other than newline and tab are removed (they cannot be seen and would only smuggle
formatting into prompts), and so are lone surrogates (an import file can spell them as \\ud800; they are not text
and PostgreSQL refuses them). A text made only of spaces and invisible marks (zero-width spaces, right-to-left
marks) is empty: nobody could read or find it. Such marks inside real text stay: right-to-left scripts need them.
"""

from __future__ import annotations

import unicodedata

from bot.errors import InvalidInput

INVISIBLE_CATEGORIES = frozenset({"Cf", "Zs", "Zl", "Zp"})  # format marks (zero-width, RTL/LTR marks) and spaces


def clean_text(text: str, max_chars: int, what: str = "the memory text") -> str:
    """The stored form of `text`, or InvalidInput saying why it cannot be stored (`what` names it)."""
    kept = "".join(ch for ch in text if ch in "\n\t" or unicodedata.category(ch) not in ("Cc", "Cs"))
    kept = kept.strip()
    if not kept or all(ch.isspace() or unicodedata.category(ch) in INVISIBLE_CATEGORIES for ch in kept):
        raise InvalidInput(f"{what} is empty")
    if len(kept) > max_chars:
        raise InvalidInput(f"{what} has {len(kept)} characters; the limit is {max_chars}")
    return kept
