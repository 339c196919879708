"""What a finished chat day's notes kept and left out, as lines of text: for `python -m bot smoke` (and any report
that wants to show the day-end notes of a channel)."""

from __future__ import annotations

from bot.memory.models import MemoryList, Source
from bot.services import Services


async def day_notes_lines(services: Services, channel_id: int) -> list[str]:
    """The day-end notes of each chat day of `channel_id` checked in this process, then the memories they wrote."""
    notes = services.summaries.notes
    lines: list[str] = []
    days = sorted(day for channel, day in notes.last if channel == channel_id)
    if not days:
        why = "MEMORY_NOTES=tools" if services.settings.memory_notes == "tools" else "no chat day of this channel ended yet"
        return [f"Day-end notes: none ({why})"]
    for day in days:
        checked = notes.last[(channel_id, day)]
        lines.append(f"Day-end notes of {day.isoformat()}: {len(checked.notes)} kept, {len(checked.dropped)} left out")
        for note in checked.notes:
            where = "server" if note.memory_list == MemoryList.SERVER else f"about {note.speaker.name}"
            fixes = f", corrects #{note.replaces.id}" if note.replaces is not None else ""
            lines.append(f"  kept ({where}{fixes}): {note.text}")
        for fact, why in checked.dropped:
            lines.append(f"  left out ({why}): [{fact.by}] {fact.text}")
    written = [m for m in await services.core.all_memories() if m.source == Source.NOTES]
    lines.append(f"Memories written by the day-end notes: {len(written)}")
    lines += [f"  #{m.id} [{m.list.value}] {m.text}" for m in written]
    return lines
