"""Text the bot sends back to Discord: split to fit a message, and mentions defused.

`allowed_mentions` on the adapter side decides who is pinged; defusing the text as well keeps
memory texts (which anyone could have written) from even looking like a ping in notices, log
channels and the console, whatever the sending side sets.
"""

from __future__ import annotations

import re

DISCORD_MESSAGE_LIMIT = 2000
ZERO_WIDTH_SPACE = "\u200b"
_ANY_MENTION = re.compile(r"@(everyone|here|[!&]?\d+)")
_BROADCAST = re.compile(r"@(everyone|here)\b")
_SENTENCE_END = re.compile(r"[.!?…。！？][\"'”’)\]]*\s")
_FENCE = "```"
_FENCE_ROOM = 24  # room for closing a code block and reopening it (with its language) in the next chunk


def neutralize_mentions(text: str) -> str:
    """Defuse @everyone, @here, <@user>, <@!user> and <@&role> with a zero-width space: they read the same, ping nobody."""
    return _ANY_MENTION.sub(lambda match: f"@{ZERO_WIDTH_SPACE}{match.group(1)}", text)


def neutralize_broadcasts(text: str) -> str:
    """Defuse only @everyone and @here (for the model's own replies, where <@id> may be a wanted mention)."""
    return _BROADCAST.sub(lambda match: f"@{ZERO_WIDTH_SPACE}{match.group(1)}", text)


def _cut_at(text: str, limit: int) -> int:
    """Where to end a chunk of at most `limit` characters: paragraph, line, sentence, word, or hard cut."""
    window = text[:limit]
    for separator in ("\n\n", "\n"):
        at = window.rfind(separator)
        if at >= limit // 2:
            return at
    sentence_ends = [match.end() for match in _SENTENCE_END.finditer(window)]
    if sentence_ends and sentence_ends[-1] >= limit // 3:
        return sentence_ends[-1]
    at = max(window.rfind(" "), window.rfind("\t"))
    if at >= limit // 3:
        return at
    return limit


def split_message(text: str, limit: int = DISCORD_MESSAGE_LIMIT) -> list[str]:
    """Split `text` into chunks of at most `limit` characters at the most natural break.

    A code block cut in two is closed at the end of one chunk and reopened (same language) in the next.
    """
    rest = text.strip()
    chunks: list[str] = []
    reopen = ""
    while rest:
        rest = reopen + rest
        if len(rest) <= limit:
            chunks.append(rest)
            break
        room = limit - _FENCE_ROOM if _FENCE in rest else limit
        cut = _cut_at(rest, room)
        chunk, rest = rest[:cut].rstrip(), rest[cut:]
        reopen = ""
        if chunk.count(_FENCE) % 2 == 1:  # inside a code block: close it here, reopen it next, keep indentation
            opening = chunk[chunk.rfind(_FENCE) :].split("\n", 1)[0]
            chunk += "\n" + _FENCE
            reopen = opening[: _FENCE_ROOM - 5] + "\n"
            rest = rest.lstrip("\n")
        else:
            rest = rest.lstrip()
        if chunk.strip():
            chunks.append(chunk)
    return chunks
