"""When the bot answers a message: in DMs, when mentioned, replied to, named, or in an auto-reply channel.

Bots and blocked users never get an answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

NAME_CHARS = re.compile(r"\w", re.UNICODE)


class Trigger(StrEnum):
    DM = "dm"
    MENTION = "mention"
    REPLY = "reply"
    NAME = "name"
    AUTO_REPLY = "auto_reply"


@dataclass(frozen=True)
class TriggerFacts:
    """What an adapter knows about a message, as plain facts."""

    author_is_bot: bool = False
    author_blocked: bool = False
    is_dm: bool = False
    mentions_bot: bool = False
    replies_to_bot: bool = False
    says_persona_name: bool = False
    auto_reply_channel: bool = False


def should_reply(facts: TriggerFacts) -> Trigger | None:
    """Why the bot answers this message, or None. Bots and blocked users never get an answer."""
    if facts.author_is_bot or facts.author_blocked:
        return None
    if facts.is_dm:
        return Trigger.DM
    if facts.mentions_bot:
        return Trigger.MENTION
    if facts.replies_to_bot:
        return Trigger.REPLY
    if facts.says_persona_name:
        return Trigger.NAME
    if facts.auto_reply_channel:
        return Trigger.AUTO_REPLY
    return None


def says_name(text: str, name: str) -> bool:
    """Whether `name` appears in `text` as a whole word (any case): "hey Desk!" says "desk", "desktop" does not."""
    wanted = " ".join(name.split()).casefold()
    if not wanted:
        return False
    haystack = text.casefold()
    start = haystack.find(wanted)
    while start != -1:
        end = start + len(wanted)
        before_ok = start == 0 or not NAME_CHARS.match(haystack[start - 1])
        after_ok = end == len(haystack) or not NAME_CHARS.match(haystack[end])
        if before_ok and after_ok:
            return True
        start = haystack.find(wanted, start + 1)
    return False
