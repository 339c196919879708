"""The flows `/memories` and `/personal memories` share: list, search, add, edit, delete, export, import, stats.

Not an extension. Each flow takes the interaction and the `ListRef` the cog resolved, calls the
`MemoryManager`, and answers ephemerally. Permission decisions stay in the core and the manager;
the pre-checks here only avoid opening a modal for someone whose save would be refused anyway.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from datetime import UTC, datetime

import discord
from discord import app_commands

from bot.errors import Refusal
from bot.memory.history import HistoryPage, describe_version
from bot.memory.lists import ImportMode, ImportPlan, ListRef, ListStats, Page, split_tags
from bot.memory.manage import MemoryManager
from bot.memory.models import MemoryList
from bot.tools.chart import days_unused_chart
from cogs.ui import (
    COLOUR,
    LIST_PAGE_SIZE,
    MEMORY_PREVIEW,
    Refused,
    TextModal,
    actor_of,
    ask_confirmation,
    clip,
    defer_and_read,
    json_file,
    memory_choice,
    memory_embed,
    page_embed,
    quote,
    reply,
    save_message,
    send_paged,
    sentence,
    services_of,
)

AUTOCOMPLETE_LIMIT = 25


def manager_of(interaction: discord.Interaction) -> MemoryManager:
    return services_of(interaction).memories


def parse_tags(raw: str | None) -> tuple[str, ...]:
    return split_tags(raw)


async def list_flow(interaction: discord.Interaction, ref: ListRef, page: int, title: str, empty: str) -> None:
    manager = manager_of(interaction)

    async def fetch(number: int) -> Page:
        return await manager.page(ref, number, LIST_PAGE_SIZE)

    await send_paged(interaction, fetch, lambda p: page_embed(title, p, empty), page - 1)


async def search_flow(interaction: discord.Interaction, ref: ListRef, query: str, title: str) -> None:
    manager = manager_of(interaction)
    await interaction.response.defer(ephemeral=True, thinking=True)
    result = await manager.search(ref, query)
    if not result.items:
        because = f" ({result.note})" if result.note else ""
        await reply(interaction, sentence(f"nothing in {ref.label} matches {clip(query, 80)!r}{because}"))
        return
    how = "closest by meaning first, then text matches" if result.semantic else "text matches"
    description = f"Search: **{discord.utils.escape_markdown(clip(query, 100))}** · {how}"
    footer = sentence(result.note) if result.note else "Searching never changes a memory's days unused."
    await reply(interaction, embed=memory_embed(title, result.items[:10], description=description, footer=footer))


async def add_flow(
    interaction: discord.Interaction,
    ref: ListRef,
    text: str | None,
    *,
    tags: str | None,
    channel_ids: Sequence[int] = (),
    is_global: bool = False,
    note: str | None = None,
) -> None:
    """Save now when the text was typed in the option, or open a modal to write it (not for someone refused anyway)."""
    manager = manager_of(interaction)
    tag_values = parse_tags(tags)
    await manager.may_add(ref, actor_of(interaction))

    async def save(submitted: discord.Interaction, body: str, modal_tags: str | None) -> None:
        chosen_tags = parse_tags(modal_tags) if modal_tags is not None else tag_values
        result = await manager.add(
            ref,
            body,
            actor=actor_of(submitted),
            tags=chosen_tags,
            channel_ids=channel_ids,
            is_global=is_global,
        )
        message = save_message(result)
        if note:
            message += "\n" + note
        await reply(submitted, message)

    if text is not None:
        await save(interaction, text, None)
        return
    modal = TextModal(
        "New server memory" if ref.list == MemoryList.SERVER else "New personal memory",
        save,
        label="What should I remember?",
        max_length=manager.settings.memory_max_chars,
        placeholder="A fact, e.g. Juno's cat is called Mochi",
        extra_label="Tags (optional, separated by spaces or commas)",
        extra_default=" ".join(tag_values) or None,
    )
    await interaction.response.send_modal(modal)


async def edit_flow(interaction: discord.Interaction, ref: ListRef, memory_id: int) -> None:
    """Open a modal with the memory's text and tags (for someone who may change it); saving protects it and restarts
    its counter."""
    manager = manager_of(interaction)
    memory = await manager.changeable(ref, memory_id, actor_of(interaction), "edit")

    async def save(submitted: discord.Interaction, body: str, modal_tags: str | None) -> None:
        result = await manager.edit(ref, memory.id, body, actor=actor_of(submitted), tags=parse_tags(modal_tags))
        await reply(submitted, save_message(result, verb="Updated"))

    modal = TextModal(
        f"Edit memory #{memory.id}",
        save,
        label="Memory",
        default=memory.text,
        max_length=manager.settings.memory_max_chars,
        extra_label="Tags (optional, separated by spaces or commas)",
        extra_default=" ".join(memory.tags) or None,
    )
    await interaction.response.send_modal(modal)


async def delete_flow(interaction: discord.Interaction, ref: ListRef, memory_id: int) -> None:
    manager = manager_of(interaction)
    memory = await manager.changeable(ref, memory_id, actor_of(interaction), "delete")

    async def confirmed(pressed: discord.Interaction) -> str:
        await manager.delete(ref, memory.id, actor=actor_of(pressed))
        return f"Deleted memory #{memory.id}."

    await ask_confirmation(interaction, f"Delete memory #{memory.id} for good?\n{quote(memory.text, 500)}", confirmed)


def history_embed(title: str, page: HistoryPage) -> discord.Embed:
    """A memory's text now, then its earlier texts, newest first, each with when, why and by whom it was replaced."""
    memory = page.memory
    embed = discord.Embed(title=f"{title}: history of #{memory.id}", colour=COLOUR)
    embed.add_field(name="Now", value=clip(memory.text, MEMORY_PREVIEW), inline=False)
    mentions = {v.replaced_by: f"<@{v.replaced_by}>" for v in page.versions if v.replaced_by is not None}
    for version in page.versions:
        heading, detail = describe_version(version, mentions)
        embed.add_field(name=heading, value=f"{clip(version.text, MEMORY_PREVIEW)}\n*{clip(detail, 300)}*", inline=False)
    if not page.total:
        embed.description = "No earlier texts: this memory was never changed."
    embed.set_footer(text=f"{page.total} earlier text{'s' if page.total != 1 else ''} · restore one with the restore command")
    return embed


async def history_flow(interaction: discord.Interaction, ref: ListRef, memory_id: int, page: int, title: str) -> None:
    """A memory's versions, paginated (ephemeral, like every list)."""
    versions = manager_of(interaction).versions

    async def fetch(number: int) -> HistoryPage:
        return await versions.page(ref, memory_id, number)

    await send_paged(interaction, fetch, lambda p: history_embed(title, p), page - 1)


async def restore_flow(interaction: discord.Interaction, ref: ListRef, memory_id: int, version_id: int) -> None:
    """Make an earlier text the memory's text again (a command edit: it protects the memory; the text it replaces
    becomes a version)."""
    result = await manager_of(interaction).versions.restore(
        ref, memory_id, version_id, actor=actor_of(interaction)
    )
    await reply(interaction, save_message(result, verb=f"Restored version #{version_id} of", hint_instruction=False))


async def export_flow(interaction: discord.Interaction, ref: ListRef, filename: str) -> None:
    manager = manager_of(interaction)
    manager.check_whole_list(ref, actor_of(interaction), "export")
    await interaction.response.defer(ephemeral=True, thinking=True)
    doc = await manager.export(ref, actor_of(interaction))
    count = len(doc["memories"])
    today = datetime.now(UTC).date().isoformat()
    noun = "memory" if count == 1 else "memories"
    await reply(
        interaction,
        f"{count} {noun} from {ref.label}. Import the file with the import command (merge or replace).",
        file=json_file(doc, f"{filename}-{today}.json"),
    )


def describe_import(plan: ImportPlan) -> str:
    parts = [f"{len(plan.entries)} memor{'y' if len(plan.entries) == 1 else 'ies'}"]
    if plan.duplicates_in_file:
        parts.append(f"{plan.duplicates_in_file} repeated in the file (skipped)")
    if plan.dropped_channel_limits:
        parts.append(f"{plan.dropped_channel_limits} with channel limits naming channels not in this server (limits removed)")
    return ", ".join(parts)


async def import_flow(
    interaction: discord.Interaction,
    ref: ListRef,
    attachment: discord.Attachment,
    mode: str,
    *,
    known_channel_ids: set[int] | None = None,
) -> None:
    """Check the whole file first; merge at once, replace only after a confirmation. One transaction either way."""
    manager = manager_of(interaction)
    actor = actor_of(interaction)
    manager.check_whole_list(ref, actor, "import into")
    if attachment.size > manager.import_max_bytes:
        raise Refused(f"the file has {attachment.size:,} bytes; imports are limited to {manager.import_max_bytes:,}")
    raw = await defer_and_read(interaction, attachment)
    plan = manager.parse_import(ref, raw, known_channel_ids=known_channel_ids)
    chosen = ImportMode(mode)

    async def run(_: discord.Interaction | None = None) -> str:
        result = await manager.import_memories(ref, plan, mode=chosen, actor=actor)
        lines = [f"Imported {result.added} memor{'y' if result.added == 1 else 'ies'} into {ref.label} ({chosen.value})."]
        if result.removed:
            lines.append(f"Replaced {result.removed} that were there before.")
        if result.skipped_duplicates:
            lines.append(f"Skipped {result.skipped_duplicates} already there or repeated in the file.")
        if result.embedded < result.added:
            lines.append(f"{result.added - result.embedded} are waiting for a vector and will be embedded in the background.")
        if result.dropped_channel_limits:
            lines.append(f"Removed the channel limits of {result.dropped_channel_limits} (channels not in this server).")
        lines.append("Imported memories are unprotected until someone edits them with a command.")
        return "\n".join(lines)

    if chosen == ImportMode.MERGE:
        await reply(interaction, await run())
        return
    target = ref.widened() if ref.list == MemoryList.PERSONAL else ref
    current = (await manager.page(target, 0, 1)).total
    await ask_confirmation(
        interaction,
        f"Replace deletes the {current} memories now in {target.label} and imports {describe_import(plan)}. Go ahead?",
        run,
        confirm_label="Replace",
    )


CHART_NAME = "days-unused.png"


def fill_bar(used: int, limit: int, width: int = 12) -> str:
    """`▰▰▰▱▱▱ 50%`: how full a list is against its limit, readable at a glance."""
    share = min(used / limit, 1.0) if limit else 0.0
    filled = round(share * width)
    return "▰" * filled + "▱" * (width - filled) + f" {share:.0%}"


def stats_embed(title: str, stats: ListStats) -> discord.Embed:
    embed = discord.Embed(title=title, colour=COLOUR)
    embed.add_field(name="Memories", value=f"{stats.total} of {stats.limit}\n{fill_bar(stats.total, stats.limit)}", inline=True)
    embed.add_field(name="On the desk", value=str(stats.desk), inline=True)
    embed.add_field(name="In the drawer", value=str(stats.drawer), inline=True)
    embed.add_field(name="Waiting for a vector", value=str(stats.waiting), inline=True)
    embed.add_field(name="Embedding unavailable", value=str(stats.unavailable), inline=True)
    embed.add_field(name="Protected", value=str(stats.protected), inline=True)
    embed.add_field(name="Tokens", value=f"~{stats.desk_tokens} on the desk, ~{stats.total_tokens} in all", inline=True)
    if stats.unavailable_reason:
        embed.add_field(name="Why no vector can be made now", value=clip(stats.unavailable_reason, 1000), inline=False)
    decay = "on" if stats.decay else "off (every memory stays on the desk)"
    embed.set_footer(text=f"Embedding model: {stats.embedding} · decay {decay} · drawer after {stats.dormant_after} chat days")
    return embed


async def stats_flow(interaction: discord.Interaction, ref: ListRef, title: str) -> None:
    """Counts, desk tokens, fill against the limit, and a PNG chart of days unused across the list."""
    stats = await manager_of(interaction).stats(ref, embedding_problem=services_of(interaction).upkeep.last_error)
    embed = stats_embed(title, stats)
    if not stats.total:
        await reply(interaction, embed=embed)
        return
    png = days_unused_chart(stats.days, stats.dormant_after, decay=stats.decay, title=title)
    embed.set_image(url=f"attachment://{CHART_NAME}")
    await reply(interaction, embed=embed, file=discord.File(io.BytesIO(png), filename=CHART_NAME))


async def memory_choices(
    interaction: discord.Interaction, ref: ListRef, current: str, *, created_by: int | None = None
) -> list[app_commands.Choice[int]]:
    """Autocomplete: never raises (Discord would only show 'loading options failed')."""
    try:
        memories = await manager_of(interaction).suggest(ref, current, created_by=created_by, limit=AUTOCOMPLETE_LIMIT)
    except Refusal:
        return []
    return [memory_choice(memory) for memory in memories]
