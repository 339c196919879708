"""The one parser of ids (Discord snowflakes, memory ids, shard numbers) written by people or read from files.

`str.isdigit()` is not a test for "int() will accept this": it is true for "²" or "①", which `int()`
refuses, and `int()` itself refuses strings of more than 4,300 digits. Every id that comes from a
setting, a file or a command goes through `parse_id`, so a bad one is a short sentence, never a
traceback, and an id is always a positive 64-bit integer that PostgreSQL's bigint can hold.
"""

from __future__ import annotations

import re

MAX_ID = 2**63 - 1
# ASCII digits only (re's \d would accept other scripts' digits); 20 digits hold every 64-bit value.
_DIGITS = re.compile(r"[0-9]{1,20}")


def parse_id(value: object, what: str, *, minimum: int = 1) -> int:
    """`value` as an id from `minimum` (1 unless said otherwise; shard numbers start at 0) to 2**63 - 1.

    Accepts an int (not a bool: `True` is no id) or a string of 1-20 ASCII digits, optionally
    surrounded by whitespace. Anything else raises ValueError with a short sentence naming `what`.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and _DIGITS.fullmatch(value.strip()):
        number = int(value.strip())
    else:
        raise ValueError(f"{what} must be a whole number written with the digits 0-9, got {_shown(value)}")
    if not minimum <= number <= MAX_ID:
        raise ValueError(f"{what} must be from {minimum} to {MAX_ID}, got {_shown(value)}")
    return number


def _shown(value: object) -> str:
    """The bad value, clipped: a 5,000-digit string must not become a 5,000-character error."""
    if isinstance(value, int) and value.bit_length() > 100:  # repr() itself fails past 4,300 digits
        return f"a number of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."
