"""The limits and permissions of a server's settings, decided here for every adapter (the Discord commands, the
console): who may change them, and which values are allowed. Each refusal is one sentence.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bot.errors import InvalidInput, NotAllowed
from bot.ids import parse_id
from bot.servers.models import Actor, GuildSettings
from bot.texts import clean_text

LORE_MAX_CHARS = 1000  # one always-on entry; the persona prompt is the place for more
MAX_LORE_ENTRIES = 25
PERSONA_NAME_MAX_CHARS = 80
PERSONA_PROMPT_MAX_CHARS = 4000
MAX_ATTRIBUTES = 25
ATTRIBUTE_KEY_MAX_CHARS = 40
ATTRIBUTE_VALUE_MAX_CHARS = 200
MAX_AUTO_REPLY_CHANNELS = 25

CHOICES: Mapping[str, tuple[str, ...]] = {"notices": ("visible", "hidden", "log"), "notice_verbosity": ("minimal", "verbose")}
SWITCHES = frozenset({"self_teaching", "member_teaching", "personal_memories", "tagging"})
NEEDS_MANAGER = "only members with Manage Server can change Deskmate's settings here"


def require_manager(actor: Actor, what: str = NEEDS_MANAGER) -> None:
    if not actor.can_manage:
        raise NotAllowed(what)


def checked_settings(changes: Mapping[str, object], current: GuildSettings) -> dict[str, Any]:
    """The changes with every value checked (and ids parsed), or InvalidInput naming the first bad one."""
    checked: dict[str, Any] = {}
    for name, value in changes.items():
        if name in CHOICES:
            if value not in CHOICES[name]:
                raise InvalidInput(f"{name} must be one of: {', '.join(CHOICES[name])}")
            checked[name] = value
        elif name in SWITCHES:
            if not isinstance(value, bool):
                raise InvalidInput(f"{name} must be on or off")
            checked[name] = value
        elif name == "log_channel_id":
            checked[name] = None if value is None else _id(value, "the log channel")
        elif name == "auto_reply_channel_ids":
            checked[name] = auto_reply_channels(value)
        else:
            raise InvalidInput(f"unknown server setting {name!r}")
    mode = checked.get("notices", current.notices)
    if mode == "log" and checked.get("log_channel_id", current.log_channel_id) is None:
        raise InvalidInput("pick a log channel: in log mode the notices go there")
    return checked


def auto_reply_channels(value: object) -> list[int]:
    if not isinstance(value, list | tuple):
        raise InvalidInput("auto-reply channels must be a list of channel ids")
    channels = list(dict.fromkeys(_id(channel, "an auto-reply channel") for channel in value))
    if len(channels) > MAX_AUTO_REPLY_CHANNELS:
        raise InvalidInput(f"a server can have at most {MAX_AUTO_REPLY_CHANNELS} auto-reply channels; remove one first")
    return channels


def persona_name(name: str) -> str:
    cleaned = " ".join(clean_text(name, PERSONA_NAME_MAX_CHARS * 4, "the persona's name").split())
    if len(cleaned) > PERSONA_NAME_MAX_CHARS:
        raise InvalidInput(f"the persona's name has {len(cleaned)} characters; the limit is {PERSONA_NAME_MAX_CHARS}")
    return cleaned


def persona_prompt(prompt: str) -> str:
    return clean_text(prompt, PERSONA_PROMPT_MAX_CHARS, "the persona prompt")


def attribute(key: str, value: str | None) -> tuple[str, str | None]:
    """A persona attribute as stored: the key in lower case, spaces collapsed; None removes it."""
    key = " ".join(clean_text(key, ATTRIBUTE_KEY_MAX_CHARS * 4, "the attribute's name").split()).lower()
    if len(key) > ATTRIBUTE_KEY_MAX_CHARS:
        raise InvalidInput(f"an attribute's name has at most {ATTRIBUTE_KEY_MAX_CHARS} characters")
    if value is None:
        return key, None
    shown = " ".join(clean_text(value, ATTRIBUTE_VALUE_MAX_CHARS * 4, f"the value of {key!r}").split())
    if len(shown) > ATTRIBUTE_VALUE_MAX_CHARS:
        raise InvalidInput(f"an attribute's value has at most {ATTRIBUTE_VALUE_MAX_CHARS} characters")
    return key, shown


def attributes(given: Mapping[str, str]) -> dict[str, str]:
    checked = dict(attribute(key, value) for key, value in given.items())
    if len(checked) > MAX_ATTRIBUTES:
        raise InvalidInput(f"a persona can have at most {MAX_ATTRIBUTES} attributes")
    return {key: value for key, value in checked.items() if value is not None}


def lore_text(text: str) -> str:
    return clean_text(text, LORE_MAX_CHARS, "a lore entry")


def _id(value: object, what: str) -> int:
    try:
        return parse_id(value, what)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
