"""Day-end notes: what a finished chat day taught, written down as memories by the pass that summarises the day.

The day's transcript labels every line with a short speaker tag (P1, P2, ...; BOT for the bot) and the model
answers, with its summary, the facts the day taught, each with the tag of the person who said it, whether it is
about that person ("self") or the server, and which remembered fact it corrects. The code, not the model, then
decides what becomes a memory (docs/memory-rules.md, "Versions and day-end notes"):

- whose fact it is is decided by id: the author of the day's line that supports it best (by the embedding model,
  the fact's names left out), never by a name; the tag the model wrote only breaks a near tie. So a birthday Bau
  gave is never noted as Juno's, and the bot's lines are never a source;
- a fact naming another speaker of the day is something said about someone else: never a memory, never a key
  detail;
- nothing from people with privacy `partial` or `full`, or blocked in the server; nothing from private threads
  (they are not in the transcript); no notes at all where self-teaching is off or MEMORY_NOTES=tools;
- each note goes through the memory service like any save (duplicates, list limits, forgetting, privacy), as
  source `notes`, acting for its speaker with the rights they had when they spoke; a correction is the model's
  update (versions, the unrelated-update guard);
- every save re-checks, in its own transaction, that the messages it came from are still there unchanged and
  its speaker may still be noted: a withdrawal during the model call wins.

The facts that pass are also the day's key details, so a summary follows the same rules.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import date, datetime
from typing import Any

import numpy as np

from bot.chat.log import ChatLog
from bot.chat.notices import ChangeKind, MemoryChange, Notices, day_notes_notices, room_changes
from bot.config import Settings
from bot.db import Connection
from bot.embeddings.providers import EmbeddingError
from bot.memory.models import Memory, MemoryList, NewMemory, SaveResult, Source
from bot.memory.saves import SaveCheck
from bot.memory.service import MemoryCore
from bot.servers.service import Servers
from bot.summaries import store
from bot.summaries.asked import asked_notes
from bot.summaries.facts import BOT_TAG, Checked, DayText, FactCheck, Note, Speaker
from bot.summaries.withdrawal import NOTES_LEAVE_OUT, Transcript, Withdrawals
from bot.summaries.writer import Written
from bot.third_person import clauses

log = logging.getLogger(__name__)

NotesListener = Callable[[int, int | None, Notices], Awaitable[None]]
"""Told of each day's notice (channel, server, what to show): the adapter posts it where the notice settings say."""

MAX_REMEMBERED = 20  # remembered facts shown to the model, the closest to the day's lines first
REMEMBERED_MIN = 0.25  # cosine a remembered fact needs with one of its people's lines (or clauses) to be shown
MAX_KEPT_CHECKS = 100
EMBED_BATCH = 32


class DayNotes:
    """Reads a finished chat day for notes, checks the model's facts, and saves what passes."""

    def __init__(self, core: MemoryCore, servers: Servers, chat_log: ChatLog, settings: Settings) -> None:
        self.core = core
        self.servers = servers
        self.chat_log = chat_log
        self.settings = settings
        self.withdrawals = Withdrawals(chat_log, servers)
        self.facts = FactCheck(self._embed, settings.update_min_similarity)
        self.listener: NotesListener | None = None
        self.last: dict[tuple[int, date], Checked] = {}  # the latest check of each channel-day (smoke, benchmarks)

    async def wanted(self, guild_id: int | None) -> bool:
        """Notes are written where the bot may teach itself: MEMORY_NOTES daily or both, and self-teaching on."""
        if self.settings.memory_notes == "tools":
            return False
        return guild_id is None or (await self.servers.guild_settings(guild_id)).self_teaching

    async def due(self, channel_id: int, guild_id: int | None, day: date) -> bool:
        """A day's notes are written once, and never for a day older than one already noted (an old day must not
        undo a newer correction): a regenerated or stale summary writes none."""
        if not await self.wanted(guild_id):
            return False
        async with self.core.pool.acquire() as conn:
            return not await store.notes_written_since(conn, channel_id, day)

    async def write(
        self, channel_id: int, guild_id: int | None, day: date, label: str, checked: Checked, text: DayText, at: datetime
    ) -> list[MemoryChange]:
        """Save a day's checked notes (once: the day is claimed first), then tell the listener the day's notice."""
        self.last[(channel_id, day)] = checked
        while len(self.last) > MAX_KEPT_CHECKS:
            self.last.pop(next(iter(self.last)))
        async with self.core.pool.acquire() as conn:
            if not await store.claim_day_notes(conn, channel_id, guild_id, day, at):
                return []
        changes = await self.save(checked.notes, text, guild_id=guild_id, reason=f"day-end notes of {label}")
        kinds = [change.kind for change in changes]
        async with self.core.pool.acquire() as conn:
            await store.count_day_notes(
                conn, channel_id, day, saved=kinds.count(ChangeKind.SAVED), updated=kinds.count(ChangeKind.UPDATED),
                refused=kinds.count(ChangeKind.REJECTED),
            )
        if changes:
            log.info("Day-end notes of %s in channel %s: %s", label, channel_id, ", ".join(k.value for k in kinds))
            await self._tell(channel_id, guild_id, changes, label)
        return changes

    async def write_asked(self, channel_id: int, guild_id: int | None, label: str, text: DayText) -> list[MemoryChange]:
        """When the day's summary failed: what people asked to remember about themselves is saved all the same, since
        a small model's summary may fail again on every retry (Qwen2.5-Coder 0.5B echoed its instructions). The day
        is not claimed: its notes are still written when its summary is, and what was saved now is among the
        remembered facts then, so it is not noted twice."""
        checked = Checked()
        checked.notes = asked_notes(text, checked)
        if not checked.notes:
            return []
        changes = await self.save(checked.notes, text, guild_id=guild_id, reason=f"day-end notes of {label}")
        if changes:
            await self._tell(channel_id, guild_id, changes, label)
        return changes

    async def _tell(self, channel_id: int, guild_id: int | None, changes: list[MemoryChange], label: str) -> None:
        guild = await self.servers.guild_settings(guild_id) if guild_id is not None else None
        names = await self.chat_log.names({c.about_user_id for c in changes if c.about_user_id is not None})
        notices = day_notes_notices(changes, guild, names, label)
        if notices is None or self.listener is None:
            return
        try:
            await self.listener(channel_id, guild_id, notices)
        except Exception:  # a notice that cannot be posted never undoes the notes
            log.exception("Could not post the day-end notes notice of channel %s", channel_id)

    # --- the day, as the model reads it ---

    async def read(
        self, channel_id: int, guild_id: int | None, rows: Sequence[dict[str, Any]], local_time: Any, *, remember: bool
    ) -> DayText:
        """Tag the speakers (in order of their first line), write the transcript, and, when notes are wanted
        (`remember`), pick the remembered facts the day may correct."""
        speakers: dict[str, Speaker] = {}
        by_user: dict[int, str] = {}
        lines = []
        for row in rows:
            if not row["is_bot"] and row["author_id"] not in by_user:
                tag = f"P{len(by_user) + 1}"
                by_user[row["author_id"]] = tag
                speakers[tag] = Speaker(tag, row["author_id"], " ".join(str(row["author_name"]).split()) or tag, False, False)
            lines.append(_line(row, by_user, local_time, channel_id))
        managing = {row["author_id"] for row in rows if row.get("author_can_manage")}
        left_out = await self.servers.left_out(guild_id, list(by_user), NOTES_LEAVE_OUT)
        for tag, speaker in list(speakers.items()):
            notable = speaker.user_id not in left_out
            speakers[tag] = Speaker(tag, speaker.user_id, speaker.name, speaker.user_id in managing, notable)
        day = DayText(speakers, list(rows), lines)
        opted_out = await self.servers.not_to_be_noted(guild_id)
        day.unnamed = sorted(set((await self.chat_log.names(opted_out)).values()))
        if remember:
            day.remembered = await self._remembered(channel_id, guild_id, day)
        return day

    async def _remembered(self, channel_id: int, guild_id: int | None, day: DayText) -> dict[str, Memory]:
        """The memories the day's people could see here that come closest to their lines (personal ones: to their
        owner's lines), so the model can say which one a fact corrects."""
        people = [s.user_id for s in day.speakers.values() if s.notable]
        spoken = [row for row in day.rows if not row["is_bot"] and row["author_id"] in people]
        if not people or not spoken:
            return {}
        found = await self.core.memories_for_notes(guild_id, channel_id, people, [row["text"] for row in spoken])
        pieces = [(row["author_id"], piece) for row in spoken for piece in clauses(str(row["text"]))]
        vectors = await self._embed([piece for _, piece in pieces])
        if vectors is None:
            return {}
        scored = []
        for memory, vector in found:
            if vector is None:
                continue
            own = [i for i, (author, _) in enumerate(pieces) if memory.list == MemoryList.SERVER or author == memory.owner_id]
            best = float(max(vectors[own] @ vector)) if own else -1.0
            if best >= REMEMBERED_MIN:
                scored.append((best, memory))
        scored.sort(key=lambda pair: (-pair[0], pair[1].id))
        chosen = sorted((m for _, m in scored[:MAX_REMEMBERED]), key=lambda m: m.id)
        return {f"M{number}": memory for number, memory in enumerate(chosen, 1)}

    async def _embed(self, texts: Sequence[str]) -> np.ndarray | None:
        """Unit vectors of `texts` with the memory embedder, in batches (each tried twice: this is background work on a
        machine that may be busy); None when it is unavailable."""
        if self.core.embeddings.space is None or not texts:
            return None
        embed = self.core.embeddings.embedder.embed
        parts = []
        for start in range(0, len(texts), EMBED_BATCH):
            batch = list(texts[start : start + EMBED_BATCH])
            for attempt in (1, 2):
                try:
                    parts.append(await embed(batch))
                    break
                except EmbeddingError as exc:
                    if attempt == 2:
                        log.warning("Day-end notes: the embedder is unavailable (%s); facts are checked by their words", exc)
                        return None
                    await asyncio.sleep(1.0)
        return np.vstack(parts)

    # --- the model's facts, checked ---

    async def check(self, written: Written, day: DayText) -> Checked:
        """The model's facts, checked (`bot.summaries.facts`): notes to save, the day's key details, what was dropped;
        and what people asked to remember about themselves that those notes left out (`bot.summaries.asked`)."""
        checked = await self.facts.check(written, day)
        checked.notes.extend(asked_notes(day, checked))
        return checked

    async def week_details(self, proposed: Sequence[str], checked: Sequence[str]) -> list[str]:
        return await self.facts.week_details(proposed, checked)

    async def save(self, notes: Sequence[Note], day: DayText, *, guild_id: int | None, reason: str) -> list[MemoryChange]:
        """Each note through the memory service (source `notes`), each re-checked in its own transaction (`_holds`).

        Returns what changed and what a rule refused, for the day's notice."""
        changes: list[MemoryChange] = []
        rows = {(row["channel_id"], row["message_id"]): row for row in day.rows}
        for note in notes:
            if not note.speaker.notable or note.private or (note.memory_list == MemoryList.SERVER and guild_id is None):
                continue
            read = [rows[(channel, message)] for channel, message, _ in note.sources]
            result = await self._save_one(note, guild_id=guild_id, reason=reason, check=self._holds(note, read, guild_id))
            changes += _changes_of(result, note)
        return changes

    def _holds(self, note: Note, read: list[dict[str, Any]], guild_id: int | None) -> SaveCheck:
        """Withdrawal wins (`bot.summaries.withdrawal`): run inside the note's save, under its list's lock. The messages
        it came from must still stand as read and its speaker may still be noted (privacy none, not blocked); the
        speaker and the messages stay locked until the save commits, so a withdrawal racing it either came first
        (nothing is saved) or waits and then finds the note (a deleted message deletes it)."""
        speaker = note.speaker.user_id
        transcript = Transcript(
            channel_id=read[0]["channel_id"], guild_id=guild_id, leave_out=NOTES_LEAVE_OUT, lines=tuple(read),
            authors=(speaker,), people=(speaker,),
            versions=tuple((r["channel_id"], r["message_id"], r["text"], r.get("parent_channel_id")) for r in read),
            first_message_id=None, last_message_id=None,
        )

        async def still_holds(conn: Connection) -> str | None:
            if await self.withdrawals.holds(conn, transcript):
                return None
            return "what it came from was withdrawn (a deletion, an edit, a privacy level or a block) while the day was read"

        return still_holds

    async def _save_one(self, note: Note, *, guild_id: int | None, reason: str, check: SaveCheck) -> SaveResult:
        speaker = note.speaker
        if note.replaces is not None:
            return await self.core.update_by_model(
                note.replaces.id, note.text, by=speaker.user_id, guild_id=guild_id, via=Source.NOTES,
                by_can_manage=speaker.can_manage, reason=reason, check=check, source_messages=note.sources,
                declared_change=note.declared_change,
            )
        request = NewMemory(
            list=note.memory_list, text=note.text, by=speaker.user_id, via=Source.NOTES, guild_id=guild_id,
            owner_id=speaker.user_id if note.memory_list == MemoryList.PERSONAL else None,
            by_can_manage=speaker.can_manage, source_messages=note.sources,
        )
        return await self.core.save(request, check=check)


def _changes_of(result: SaveResult, note: Note) -> list[MemoryChange]:
    about = note.speaker.user_id if note.memory_list == MemoryList.PERSONAL else None
    if result.saved is None:
        if result.refusal is None or result.rejected is None or result.rejected.value == "invalid_text":
            return []
        memory_id = note.replaces.id if note.replaces is not None else None
        return [MemoryChange(ChangeKind.REJECTED, memory_id, note.memory_list, note.text, about, result.detail)]
    if result.repeated:
        return []
    saved = result.saved
    kind = ChangeKind.UPDATED if note.replaces is not None and result.kept_apart_from is None else ChangeKind.SAVED
    old = result.replaced_text if kind == ChangeKind.UPDATED else None
    changes = [MemoryChange(kind, saved.id, saved.list, saved.text, saved.owner_id, old_text=old)]
    changes += room_changes(result)
    return changes


def _line(row: dict[str, Any], tags: dict[int, str], local_time: Any, channel_id: int) -> str:
    """`P1 [10:02] Juno: text`: the speaker's tag first, then the time and name; a thread's lines say so; the bot's
    lines are tagged BOT."""
    name = " ".join(str(row["author_name"]).split()) or "someone"
    tag = BOT_TAG if row["is_bot"] else tags[row["author_id"]]
    where = " (in a thread)" if row["channel_id"] != channel_id else ""
    text = " ".join(str(row["text"]).split())
    if len(text) > MAX_LINE_CHARS:
        text = text[:MAX_LINE_CHARS] + "…"
    return f"{tag} [{local_time(row['created_at'])}]{where} {name}: {text}"


MAX_LINE_CHARS = 1_500  # of one message in a transcript: a pasted wall of text says little more after that
