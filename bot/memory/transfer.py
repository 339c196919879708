"""Reading an export file back: every check an import makes before anything is written.

The file format is described in docs/export-format.md. A file is refused whole, with the
first problem named ("memory 3: ..."), so an import is all or nothing.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from bot.errors import InvalidInput
from bot.ids import parse_id
from bot.memory.lists import ImportEntry, ImportPlan, ListRef
from bot.memory.models import MemoryList
from bot.memory.visibility import clean_text, normalize_tags

EXPORT_FORMAT = "deskmate-memories"
EXPORT_VERSION = 1

def _snowflake(value: object, where: str) -> int:
    """A channel id of an imported memory, through the one id parser: "²" or 5,000 digits are refused, not raised."""
    try:
        return parse_id(value, "a channel id")
    except ValueError as exc:
        raise InvalidInput(f"{where}: {exc}") from None


def parse_import(
    ref: ListRef, raw: bytes, *, max_chars: int, limit: int, max_bytes: int, known_channel_ids: Collection[int] | None = None
) -> ImportPlan:
    """Validate a whole file before anything is written; the first problem is an InvalidInput.

    `known_channel_ids` (a server's channels) drops channel limits that name channels which
    are not in this server: such a memory could never be used here.
    """
    memories = _memories_of(ref, _document(raw, max_bytes), limit)
    entries: list[ImportEntry] = []
    seen: set[tuple[bool, str]] = set()
    duplicates = dropped = 0
    for number, item in enumerate(memories, start=1):
        entry, limits_dropped = _entry(ref, item, f"memory {number}", max_chars, known_channel_ids)
        dropped += limits_dropped
        key = (entry.is_global, entry.text.casefold())
        if key in seen:
            duplicates += 1
            continue
        seen.add(key)
        entries.append(entry)
    return ImportPlan(ref.list, entries, duplicates, dropped)


def _document(raw: bytes, max_bytes: int) -> Any:
    """The file as JSON, within IMPORT_MAX_BYTES."""
    if len(raw) > max_bytes:
        raise InvalidInput(
            f"the file has {len(raw):,} bytes; imports are limited to {max_bytes:,} (IMPORT_MAX_BYTES)"
        )
    try:
        return json.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise InvalidInput("the file is not UTF-8 text; import a file made by an export command") from None
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"the file is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except (ValueError, RecursionError):  # a number of thousands of digits, or arrays nested thousands deep
        raise InvalidInput("the file is not a Deskmate memory export (nested too deeply, or absurdly long numbers)") from None


def _memories_of(ref: ListRef, doc: Any, limit: int) -> list[Any]:
    """The file's memories, once its format, version and list are the ones this import reads."""
    if not isinstance(doc, dict) or doc.get("format") != EXPORT_FORMAT:
        raise InvalidInput(f'the file is not a Deskmate memory export (it needs "format": "{EXPORT_FORMAT}")')
    version = doc.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise InvalidInput('the file has no valid "version" (a whole number; this Deskmate writes version 1)')
    if version > EXPORT_VERSION:
        raise InvalidInput(
            f"the file was made by a newer Deskmate (format version {version}); this one reads version {EXPORT_VERSION}"
        )
    kind = doc.get("list")
    if kind not in (MemoryList.SERVER.value, MemoryList.PERSONAL.value):
        raise InvalidInput('the file must say which list it holds: "list": "server" or "personal"')
    if kind != ref.list.value:
        command = "/memories import" if kind == MemoryList.SERVER.value else "/personal memories import"
        raise InvalidInput(f"the file holds {kind} memories; import it with {command}")
    memories = doc.get("memories")
    if not isinstance(memories, list):
        raise InvalidInput('the file needs a "memories" list')
    if len(memories) > limit:
        raise InvalidInput(f"the file has {len(memories)} memories; a list holds at most {limit}")
    return memories


def _entry(
    ref: ListRef, item: Any, where: str, max_chars: int, known_channel_ids: Collection[int] | None
) -> tuple[ImportEntry, int]:
    """One memory of the file, and 1 if channel limits naming channels not in this server were dropped from it."""
    if isinstance(item, str):
        item = {"text": item}
    if not isinstance(item, dict):
        raise InvalidInput(f"{where}: each memory must be an object with a \"text\" (or just a string)")
    text = item.get("text")
    if not isinstance(text, str):
        raise InvalidInput(f'{where}: "text" must be a string')
    try:
        cleaned = clean_text(text, max_chars)
        tags_raw = item.get("tags", [])
        if not isinstance(tags_raw, list) or not all(isinstance(tag, str) for tag in tags_raw):
            raise InvalidInput('"tags" must be a list of strings')
        tags = normalize_tags(tags_raw)
    except InvalidInput as exc:
        raise InvalidInput(f"{where}: {exc}") from None
    channels_raw = item.get("channel_ids", [])
    if not isinstance(channels_raw, list):
        raise InvalidInput(f'{where}: "channel_ids" must be a list')
    channels = tuple(dict.fromkeys(_snowflake(value, where) for value in channels_raw))
    dropped = 0
    if channels and known_channel_ids is not None:
        kept = tuple(channel for channel in channels if channel in known_channel_ids)
        dropped = int(len(kept) != len(channels))
        channels = kept
    is_global = False
    if ref.list == MemoryList.PERSONAL:
        scope = item.get("scope", "persona")
        if scope not in ("global", "persona"):
            raise InvalidInput(f'{where}: "scope" must be "global" or "persona"')
        is_global = scope == "global"
    return ImportEntry(cleaned, tags, channels, is_global), dropped
