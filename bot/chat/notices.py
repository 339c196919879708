"""Memory notices: what the model's tool calls did, said where the server's notice settings want it.

DMs show them in the conversation, verbosely: it is the reader's own data. In a server, notices
are seen by the whole channel (or the log channel's readers), so `verbose` shows the text of server
memories only; personal data is only ever shown ephemerally or in DMs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from bot.memory.models import MemoryList, SaveResult
from bot.outgoing import neutralize_mentions, split_message
from bot.servers.models import GuildSettings


class ChangeKind(StrEnum):
    SAVED = "saved"
    UPDATED = "updated"
    FORGOTTEN = "forgotten"
    MADE_ROOM = "forgotten_to_make_room"
    MERGED = "merged_to_make_room"
    REJECTED = "rejected"


@dataclass(frozen=True)
class MemoryChange:
    """One thing a tool call did (or was refused), for notices and receipts."""

    kind: ChangeKind
    memory_id: int | None
    memory_list: MemoryList | None
    text: str
    about_user_id: int | None = None
    reason: str = ""
    old_text: str | None = None  # an update: the text it replaced
    absorbed_id: int | None = None  # a merge: the memory joined into `memory_id` (gone; its text kept as a version)

    def as_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind.value,
            "memory_id": self.memory_id,
            "list": self.memory_list.value if self.memory_list else None,
            "text": self.text,
            "about_user_id": self.about_user_id,
            "reason": self.reason,
            "old_text": self.old_text,
            "absorbed_id": self.absorbed_id,
        }


@dataclass(frozen=True)
class Notices:
    """Memory notices after the server's settings: where they go and the lines to show.

    `destination` is "channel" (post with the reply), "log" (post in `log_channel_id`) or "hidden"
    (do not post; they are still in the receipt and the log). Text is already defused of mentions.
    """

    destination: str
    log_channel_id: int | None
    verbosity: str
    lines: tuple[str, ...]

    @property
    def chunks(self) -> list[str]:
        return split_message("\n".join(self.lines))


def room_changes(result: SaveResult) -> list[MemoryChange]:
    """What a save into a full list did to make room: the merges first (nothing lost), then what it forgot."""
    changes = [
        MemoryChange(ChangeKind.MERGED, m.kept.id, m.kept.list, m.kept.text, m.kept.owner_id, absorbed_id=m.absorbed.id)
        for m in result.merged
    ]
    return changes + [MemoryChange(ChangeKind.MADE_ROOM, m.id, m.list, m.text, m.owner_id) for m in result.forgotten]


def build_notices(changes: Sequence[MemoryChange], guild: GuildSettings | None, names: dict[int, str]) -> Notices | None:
    """Memory notices. DMs show them in the conversation, verbosely: it is the reader's own data.

    In a server, notices are seen by the whole channel (or the log channel's readers), so `verbose` shows the
    text of server memories only: personal data is only ever shown ephemerally or in DMs. A personal
    notice still says what happened and about whom; its owner can read the text with /personal memories.
    """
    if not changes:
        return None
    if guild is None:
        destination, log_channel, verbosity = "channel", None, "verbose"
    else:
        destination = {"visible": "channel", "hidden": "hidden", "log": "log"}.get(guild.notices, "channel")
        log_channel, verbosity = guild.log_channel_id, guild.notice_verbosity
        if destination == "log" and log_channel is None:
            destination = "hidden"
    lines = tuple(
        neutralize_mentions(
            notice_line(change, verbosity if guild is None or change.memory_list == MemoryList.SERVER else "minimal", names)
        )
        for change in changes
    )
    return Notices(destination=destination, log_channel_id=log_channel, verbosity=verbosity, lines=lines)


def notice_line(change: MemoryChange, verbosity: str, names: dict[int, str]) -> str:
    """One notice line; `verbose` adds the memory text."""
    which = "a server memory" if change.memory_list == MemoryList.SERVER else "a personal memory"
    if change.memory_list == MemoryList.PERSONAL and change.about_user_id is not None:
        which += f" about {names.get(change.about_user_id, f'user {change.about_user_id}')}"
    ref = f" (#{change.memory_id})" if change.memory_id is not None else ""
    detail = f": “{change.text}”" if verbosity == "verbose" and change.text else ""
    if change.kind == ChangeKind.SAVED:
        return f"📝 Saved {which}{ref}{detail}"
    if change.kind == ChangeKind.UPDATED:
        if verbosity == "verbose" and change.old_text:
            detail = f": “{change.old_text}” → “{change.text}”"
        return f"✏️ Updated {which}{ref}{detail}"
    if change.kind == ChangeKind.FORGOTTEN:
        return f"🗑️ Forgot {which}{ref}{detail}"
    if change.kind == ChangeKind.MADE_ROOM:
        return f"📦 Forgot {which}{ref} to make room{detail}"
    if change.kind == ChangeKind.MERGED:
        return f"🧩 To make room, joined #{change.absorbed_id} into {which}{ref}, which now holds both{detail}"
    action = f"save {which}" if change.memory_id is None else f"change memory #{change.memory_id}"
    return f"⚠️ Couldn't {action}{detail}. Reason: {change.reason}"


UNCHANGED = "⚠️ I did not change my memory."  # what a refused call amounts to for people (the model reads why)
PARTLY_UNCHANGED = "⚠️ I did not make the other change."


def what_was_done(changes: Sequence[MemoryChange], extra: Sequence[str] = ()) -> str:
    """The reply when the model wrote no answer after its calls: one line per thing done, so a person never gets
    silence or tool JSON. Each line starts like a notice ("📝 Saved: ..."), so the bot never shows it to the
    model as the model's own words: copied once, it became every later reply. `extra` says what the calls that
    changed nothing amount to ("📝 I already remember that: ...")."""
    said: list[str] = []
    for change in changes:
        text = change.text.strip().rstrip(".")
        if change.kind == ChangeKind.SAVED:
            said.append(f"📝 Saved: {text}.")
        elif change.kind == ChangeKind.UPDATED:
            said.append(f"✏️ Updated: {text}.")
        elif change.kind == ChangeKind.FORGOTTEN:
            said.append(f"🗑️ Forgot: {text}." if text else f"🗑️ Forgot memory #{change.memory_id}.")
        elif change.kind == ChangeKind.REJECTED:  # the reason is the notice's: it is worded for the model here
            said.append(UNCHANGED)
    lines = list(dict.fromkeys([*said, *extra]))
    if UNCHANGED in lines and any(not line.startswith("⚠️") for line in lines):  # "Saved: … I did not change my memory."
        lines = [PARTLY_UNCHANGED if line == UNCHANGED else line for line in lines]  # read as a contradiction
    return "\n".join(lines) or "📝 Done."


def day_notes_notices(
    changes: Sequence[MemoryChange], guild: GuildSettings | None, names: dict[int, str], period: str
) -> Notices | None:
    """The one notice of a chat day's notes: a line saying which day, then one line per change, placed and worded
    by the server's notice settings like a reply's (personal text only in DMs)."""
    notices = build_notices(changes, guild, names)
    if notices is None:
        return None
    saved = sum(1 for change in changes if change.kind == ChangeKind.SAVED)
    updated = sum(1 for change in changes if change.kind == ChangeKind.UPDATED)
    counts = [f"{saved} new memor{'y' if saved == 1 else 'ies'}"] + ([f"{updated} updated"] if updated else [])
    header = f"🗒️ What I noted from {period}: {', '.join(counts)}"
    return Notices(notices.destination, notices.log_channel_id, notices.verbosity, (header, *notices.lines))
