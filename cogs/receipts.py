"""`/memories why`: a reply's receipt as an ephemeral embed. Not an extension.

The receipt says why each memory was in the prompt (on the desk; recalled from the drawer with its
similarity), which older chat and document passages were added, the tokens of each part, whether
the prompt head matched the previous reply's (a prompt-cache hit), and, when nothing was recalled,
why. Memory texts are shown for server memories and for the caller's own personal memories only:
someone else's personal memory is named, never quoted (personal data is only shown to its owner).
"""

from __future__ import annotations

import re

import discord

from bot.chat.receipts import Receipt, recalled_label, tail_item_label, token_parts
from bot.memory.models import Memory, MemoryList, Source
from cogs.ui import COLOUR, clip

MESSAGE_LINK = re.compile(r"^(?:https?://(?:\w+\.)?discord(?:app)?\.com/channels/(\d+|@me)/(\d+)/)?(\d{5,20})/?$")
FIELD_LIMIT = 1024


def parse_message_ref(text: str) -> tuple[int | None, int | None, int] | None:
    """(guild id, channel id, message id) from a message link, or (None, None, id) from a bare id; None if neither."""
    found = MESSAGE_LINK.match(text.strip())
    if found is None:
        return None
    guild, channel, message = found.groups()
    return (int(guild) if guild and guild != "@me" else None, int(channel) if channel else None, int(message))


def _memory_line(memory: Memory | None, memory_id: int, viewer_id: int, detail: str) -> str:
    if memory is None:
        return f"#{memory_id} · {detail} (since deleted)"
    if memory.source == Source.NOTES:  # where it came from: what a finished chat day taught
        detail += " · from day-end notes"
    if memory.list == MemoryList.SERVER:
        return f"#{memory_id} · {detail} · {clip(' '.join(memory.text.split()), 90)}"
    if memory.owner_id == viewer_id:
        return f"#{memory_id} · {detail} · yours: {clip(' '.join(memory.text.split()), 80)}"
    return f"#{memory_id} · {detail} · a personal memory about <@{memory.owner_id}>"


def _lines(lines: list[str], empty: str) -> str:
    text = "\n".join(lines) if lines else empty
    return clip(text, FIELD_LIMIT)


def receipt_embed(receipt: Receipt, memories: dict[int, Memory], viewer_id: int, dormant_after: int) -> discord.Embed:
    """The receipt for people: one field per prompt part, in prompt order."""
    answered = f"https://discord.com/channels/{receipt.guild_id or '@me'}/{receipt.channel_id}/{receipt.message_id}"
    description = f"Reply to {answered} · {receipt.status.replace('_', ' ')}"
    if receipt.model:
        description += f" · {receipt.model}"
    if receipt.elapsed_ms:
        description += f" · {receipt.elapsed_ms / 1000:.1f} s"
    embed = discord.Embed(title="Why the bot answered with what it knew", description=description, colour=COLOUR)

    details = {item["id"]: item for item in receipt.desk_detail}
    desk = []
    for memory_id in receipt.desk_ids:
        item = details.get(memory_id, {})
        days = item.get("days_unused")
        why = f"on the desk ({days} of {dormant_after} days unused)" if days is not None else "on the desk"
        if item.get("matched") is not None:
            why += f", matched {item['matched']:.2f}"
        desk.append(_memory_line(memories.get(memory_id), memory_id, viewer_id, why))
    embed.add_field(name=f"On the desk ({len(receipt.desk_ids)})", value=_lines(desk, "nothing"), inline=False)

    recalled = [
        _memory_line(memories.get(int(item["id"])), int(item["id"]), viewer_id, recalled_label(item))
        for item in receipt.recalled
    ]
    embed.add_field(
        name="Recalled from the drawer",
        value=_lines(recalled, f"nothing: {receipt.nothing_recalled_because}"),
        inline=False,
    )
    for report in receipt.sources.values():
        items, note = report.get("items") or [], report.get("note")
        if items or note:
            embed.add_field(
                name=str(report.get("heading") or report.get("title") or "?"),
                value=_lines([tail_item_label(item) for item in items], f"nothing: {note}"),
                inline=False,
            )
    if receipt.nothing_added_because:
        embed.add_field(name="Nothing was recalled", value=clip(receipt.nothing_added_because, FIELD_LIMIT), inline=False)

    tokens = f"**{receipt.tokens.get('total', 0)}** in total: {token_parts(receipt.tokens)}"
    if receipt.tail_tokens:
        tokens += "\nnear the end: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in receipt.tail_tokens.items())
    embed.add_field(name="Tokens", value=clip(tokens, FIELD_LIMIT), inline=False)
    if receipt.head_same_as_previous is None:
        cache = "first reply in this channel (nothing to compare with)"
    elif receipt.head_same_as_previous:
        cache = "the prompt head is the same as the previous reply's: a prompt-cache hit"
    else:
        cache = "the prompt head changed (a memory moved between desk and drawer, or the persona or lore changed)"
    embed.add_field(name="Prompt cache", value=cache, inline=False)
    if receipt.dropped:
        left = ", ".join(f"{item['key']} ({item['reason']})" for item in receipt.dropped)
        embed.add_field(name="Left out", value=clip(left, FIELD_LIMIT), inline=False)
    if receipt.error:
        embed.add_field(name="Error", value=clip(receipt.error, FIELD_LIMIT), inline=False)
    embed.set_footer(text="Only you can see this. The bot keeps the receipts of the latest 200 replies per channel.")
    return embed
