"""Discord pieces shared by the cogs: refusals, embeds, paginated lists, confirmations, modals.

Not an extension (no `setup`): the cogs import it. Everything that answers one person is
ephemeral; every view answers only the person who ran the command, and every refusal is one
ephemeral sentence that says why.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import discord
from discord import app_commands

from bot.errors import Refusal
from bot.failures import database_sentence
from bot.memory.lists import MemoryView, Page, looks_like_instruction
from bot.memory.models import Memory, MemoryList, SaveResult
from bot.servers.models import Actor
from bot.services import Services

log = logging.getLogger(__name__)

EPHEMERAL = True
LIST_PAGE_SIZE = 8
MEMORY_PREVIEW = 400
MAX_CHANNELS_SHOWN = 5  # an imported memory may name many channels; the list shows a few
DESK, DRAWER = "🗂️ desk", "🗄️ drawer"
SOURCE_LABELS = {"bot": "the model", "notes": "day-end notes", "import": "an import", "command": "a command"}
COLOUR = discord.Colour.blurple()


class Refused(Refusal, app_commands.CheckFailure):
    """A refusal raised where discord.py expects a check to fail (an `interaction_check`)."""


def sentence(text: str) -> str:
    """One readable sentence from a core/manager reason ("the list is full" -> "The list is full.")."""
    text = text.strip()
    if not text:
        return text
    text = text[0].upper() + text[1:]
    return text if text.endswith((".", "!", "?", ")")) else text + "."


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


# Discord refuses a whole message (HTTP 400) when one part is over its limit, so every answer is fitted first:
# a long memory, ten long tags or 25 lore entries shorten what is shown instead of failing the command.
CONTENT_LIMIT, DESCRIPTION_LIMIT, FIELD_NAME_LIMIT, FIELD_VALUE_LIMIT, EMBED_LIMIT = 2000, 4096, 256, 1024, 6000
SHRINK_FLOOR = 60


def fit_embed(embed: discord.Embed) -> discord.Embed:
    """Trim `embed` in place to Discord's limits: each part first, then the longest parts until the total fits."""
    if embed.title:
        embed.title = clip(embed.title, FIELD_NAME_LIMIT)
    if embed.description:
        embed.description = clip(embed.description, DESCRIPTION_LIMIT)
    for index, item in enumerate(embed.fields):
        name, value = clip(item.name or "", FIELD_NAME_LIMIT), clip(item.value or "", FIELD_VALUE_LIMIT)
        embed.set_field_at(index, name=name, value=value, inline=bool(item.inline))
    while len(embed) > EMBED_LIMIT:
        excess = len(embed) - EMBED_LIMIT
        parts = [(len(item.value or ""), index) for index, item in enumerate(embed.fields)]
        parts.append((len(embed.description or ""), -1))
        size, index = max(parts)
        if size <= SHRINK_FLOOR:  # nothing long is left to shorten: show fewer fields
            embed.remove_field(len(embed.fields) - 1)
            continue
        target = max(size - excess, SHRINK_FLOOR)
        if index == -1:
            embed.description = clip(embed.description or "", target)
        else:
            item = embed.fields[index]
            embed.set_field_at(index, name=item.name or "", value=clip(item.value or "", target), inline=bool(item.inline))
    return embed


async def reply(interaction: discord.Interaction, content: str | None = None, **kwargs: Any) -> None:
    """Answer an interaction whether or not it was already answered or deferred; ephemeral by default."""
    kwargs.setdefault("ephemeral", EPHEMERAL)
    if content:
        content = clip(content, CONTENT_LIMIT)
    if kwargs.get("embed") is not None:
        fit_embed(kwargs["embed"])
    if interaction.response.is_done():
        await interaction.followup.send(content, **kwargs)
    else:
        await interaction.response.send_message(content, **kwargs)


async def refuse(interaction: discord.Interaction, reason: str) -> None:
    await reply(interaction, sentence(reason), ephemeral=True)


def error_sentence(error: BaseException) -> str | None:
    """The sentence for an error a user caused, or None for a bug (logged, with a generic apology)."""
    if isinstance(error, app_commands.CommandInvokeError):
        error = error.original
    if isinstance(error, Refusal):
        return sentence(error.sentence)
    database = database_sentence(error)  # a full disk while saving: say so, not "something went wrong"
    if database is not None:
        return sentence(database)
    if isinstance(error, app_commands.NoPrivateMessage):
        return "This command only works in a server."
    if isinstance(error, app_commands.MissingPermissions):
        missing = ", ".join(p.replace("_", " ").replace("guild", "server").title() for p in error.missing_permissions)
        return f"You need the {missing} permission for this."
    if isinstance(error, app_commands.TransformerError):
        return f"I could not understand {error.value!r} for this option."
    if isinstance(error, app_commands.CheckFailure):
        return "You cannot use this command here."
    return None


async def report_error(interaction: discord.Interaction, error: BaseException) -> None:
    """Shared by the tree, views and modals: a sentence for the user, a traceback for the log."""
    text = error_sentence(error)
    if text is None:
        original = error.original if isinstance(error, app_commands.CommandInvokeError) else error
        log.error("Interaction failed: %s", interaction.data, exc_info=original)
        text = "Something went wrong on my side; the details are in the bot's log."
    if interaction.type == discord.InteractionType.autocomplete:
        return  # autocomplete can only answer with choices; Discord shows its own "loading failed"
    try:
        await reply(interaction, text, ephemeral=True)
    except discord.HTTPException:
        log.warning("Could not tell the user about an error", exc_info=True)


def can_manage(interaction: discord.Interaction) -> bool:
    """Manage Server in this server (Administrator implies it); never true in DMs."""
    return interaction.guild_id is not None and interaction.permissions.manage_guild


def actor_of(interaction: discord.Interaction) -> Actor:
    """Who runs the command, as the services decide what they may do."""
    return Actor(interaction.user.id, can_manage=can_manage(interaction))


async def defer_and_read(interaction: discord.Interaction, attachment: discord.Attachment) -> bytes:
    """Defer (a download and what follows can outlast Discord's 3 s) and read the file; a failed download is a refusal."""
    await interaction.response.defer(ephemeral=True, thinking=True)
    try:
        return await attachment.read()
    except discord.HTTPException as exc:
        raise Refused(f"I could not download the file from Discord ({exc.status}); try again") from None


def services_of(interaction: discord.Interaction) -> Services:
    """The bot's services: always there, since the bot is only made once they are open."""
    return interaction.client.services  # type: ignore[attr-defined]


def json_file(doc: dict[str, Any], filename: str) -> discord.File:
    raw = (json.dumps(doc, ensure_ascii=False, indent=2) + "\n").encode("utf-8")
    return discord.File(io.BytesIO(raw), filename=filename)


# --- memories as text ------------------------------------------------------------------------------

def memory_meta(view: MemoryView) -> str:
    """The status line of a memory: protection, scope, tags, channel limit, vector status."""
    memory = view.memory
    parts: list[str] = []
    if view.scope_label:
        parts.append(view.scope_label)
    parts.append("🔒 protected" if memory.protected else f"from {SOURCE_LABELS.get(memory.source.value, memory.source.value)}")
    if memory.tags:
        parts.append("tags: " + ", ".join(memory.tags))
    if memory.channel_ids:
        shown = " ".join(f"<#{channel}>" for channel in memory.channel_ids[:MAX_CHANNELS_SHOWN])
        more = len(memory.channel_ids) - MAX_CHANNELS_SHOWN
        parts.append(f"only in {shown}" + (f" and {more} more" if more > 0 else ""))
    parts.append(view.vector.value)
    if view.similarity is not None:
        parts.append(f"similarity {view.similarity:.2f}")
    return " · ".join(parts)


def memory_title(view: MemoryView) -> str:
    days = view.memory.days_unused
    return f"#{view.memory.id} · {DRAWER if view.dormant else DESK} · {days} day{'s' if days != 1 else ''} unused"


def memory_embed(
    title: str, views: list[MemoryView], *, description: str | None = None, footer: str | None = None
) -> discord.Embed:
    embed = discord.Embed(title=title, description=description, colour=COLOUR)
    for view in views:
        embed.add_field(
            name=memory_title(view),
            value=f"{clip(view.memory.text, MEMORY_PREVIEW)}\n*{memory_meta(view)}*",
            inline=False,
        )
    if footer:
        embed.set_footer(text=footer)
    return embed


def page_embed(title: str, page: Page, empty: str) -> discord.Embed:
    if not page.items:
        return discord.Embed(title=title, description=empty, colour=COLOUR)
    footer = f"Page {page.number + 1} of {page.pages} · {page.total} memories · desk = read before every reply, drawer = dormant"
    return memory_embed(title, page.items, footer=footer)


def quote(text: str, limit: int = 900) -> str:
    """`text` as a Markdown block quote of about `limit` characters, the "> " of each line included (a text of
    many short lines would otherwise grow past Discord's 2,000 characters)."""
    lines: list[str] = []
    size = 0
    for line in clip(text, limit).splitlines() or [""]:
        quoted = f"> {line}"
        if size + len(quoted) > limit:
            lines.append("> …")
            break
        lines.append(quoted)
        size += len(quoted) + 1
    return "\n".join(lines)


INSTRUCTION_HINT_SERVER = (
    "⚠️ This reads like an instruction. Instructions rarely match what people say, so as a memory it would soon "
    "go to the drawer and stop applying. Rules belong in the persona prompt (`/settings persona prompt`), "
    "a persona attribute (`/settings persona attribute`) or an always-on lore entry (`/settings lore add`)."
)
INSTRUCTION_HINT_PERSONAL = (
    "⚠️ This reads like an instruction. Instructions rarely match what people say, so as a memory it would soon "
    "go to the drawer and stop applying. Rules for how the bot talks fit better in the server's persona prompt "
    "or an always-on lore entry (ask someone with Manage Server)."
)


def save_message(result: SaveResult, *, verb: str = "Saved", hint_instruction: bool = True) -> str:
    """What the user sees after a command save or edit: what was stored, and what was forgotten for room."""
    memory = result.saved
    assert memory is not None, "a refused command change is raised, never shown as a result"
    kind = "personal memory"
    if memory.list == MemoryList.SERVER:
        kind = "server memory"
    elif memory.is_global:
        kind = "Global personal memory"
    lines = [f"{verb} {kind} #{memory.id}:", quote(memory.text)]
    for merge in result.merged:
        lines += [f"To make room I joined #{merge.absorbed.id} into #{merge.kept.id} (both texts are kept; "
                  "its history shows the old ones):", quote(merge.kept.text, 300)]
    for forgotten in result.forgotten:
        lines += [f"To make room I forgot #{forgotten.id} (dormant, unprotected):", quote(forgotten.text, 300)]
    if hint_instruction and looks_like_instruction(memory.text):
        lines.append(INSTRUCTION_HINT_SERVER if memory.list == MemoryList.SERVER else INSTRUCTION_HINT_PERSONAL)
    return "\n".join(lines)


def memory_choice(memory: Memory) -> app_commands.Choice[int]:
    """An autocomplete entry: '#12 · text' (Discord allows 100 characters)."""
    return app_commands.Choice(name=clip(f"#{memory.id} · {' '.join(memory.text.split())}", 100), value=memory.id)


# --- views ---------------------------------------------------------------------------------------

class OwnedView(discord.ui.View):
    """A view only the person who ran the command can press; others get a sentence saying so."""

    def __init__(self, owner_id: int, *, timeout: float = 300.0) -> None:
        super().__init__(timeout=timeout)
        self.owner_id = owner_id
        self.interaction: discord.Interaction | None = None  # the command's interaction, to edit on timeout

    async def interaction_check(self, interaction: discord.Interaction, /) -> bool:
        if interaction.user.id != self.owner_id:
            await refuse(interaction, "only the person who ran this command can use these buttons; run it yourself")
            return False
        return True

    async def on_error(self, interaction: discord.Interaction, error: Exception, item: discord.ui.Item[Any], /) -> None:
        await report_error(interaction, error)

    async def on_timeout(self) -> None:
        for child in self.children:
            if isinstance(child, discord.ui.Button | discord.ui.Select):
                child.disabled = True
        if self.interaction is not None:
            with contextlib.suppress(discord.HTTPException):  # the message is gone or too old: nothing to disable
                await self.interaction.edit_original_response(view=self)


class Paged(Protocol):
    """A page of any list shown with `send_paged`: a memory list's `Page`, the summaries of a channel."""

    @property
    def number(self) -> int: ...  # 0-based

    @property
    def pages(self) -> int: ...


class PagedView(OwnedView):
    """Buttons to move through the pages of a list; each press reads the page afresh."""

    def __init__(
        self,
        owner_id: int,
        fetch: Callable[[int], Awaitable[Any]],
        render: Callable[[Any], discord.Embed],
        page: Paged,
    ) -> None:
        super().__init__(owner_id)
        self.fetch = fetch
        self.render = render
        self.page = page
        self._sync_buttons()

    def _sync_buttons(self) -> None:
        first = self.page.number == 0
        last = self.page.number >= self.page.pages - 1
        self.first_page.disabled = self.previous_page.disabled = first
        self.next_page.disabled = self.last_page.disabled = last
        self.position.label = f"{self.page.number + 1} / {self.page.pages}"

    async def show(self, interaction: discord.Interaction, number: int) -> None:
        self.page = await self.fetch(number)
        self._sync_buttons()
        await interaction.response.edit_message(embed=fit_embed(self.render(self.page)), view=self)

    @discord.ui.button(emoji="⏮️", style=discord.ButtonStyle.secondary)
    async def first_page(self, interaction: discord.Interaction, button: discord.ui.Button[PagedView]) -> None:
        await self.show(interaction, 0)

    @discord.ui.button(emoji="◀️", style=discord.ButtonStyle.secondary)
    async def previous_page(self, interaction: discord.Interaction, button: discord.ui.Button[PagedView]) -> None:
        await self.show(interaction, self.page.number - 1)

    @discord.ui.button(label="1 / 1", style=discord.ButtonStyle.secondary, disabled=True)
    async def position(self, interaction: discord.Interaction, button: discord.ui.Button[PagedView]) -> None:
        pass  # a label, not a button anyone can press

    @discord.ui.button(emoji="▶️", style=discord.ButtonStyle.secondary)
    async def next_page(self, interaction: discord.Interaction, button: discord.ui.Button[PagedView]) -> None:
        await self.show(interaction, self.page.number + 1)

    @discord.ui.button(emoji="⏭️", style=discord.ButtonStyle.secondary)
    async def last_page(self, interaction: discord.Interaction, button: discord.ui.Button[PagedView]) -> None:
        await self.show(interaction, self.page.pages - 1)


async def send_paged(
    interaction: discord.Interaction,
    fetch: Callable[[int], Awaitable[Any]],
    render: Callable[[Any], discord.Embed],
    number: int,
) -> None:
    """Send page `number` with paging buttons when there is more than one page."""
    page = await fetch(number)
    if page.pages <= 1:
        await reply(interaction, embed=render(page))
        return
    view = PagedView(interaction.user.id, fetch, render, page)
    view.interaction = interaction
    await reply(interaction, embed=render(page), view=view)


class ConfirmView(OwnedView):
    """Confirm or cancel a destructive action; `on_confirm` runs on the button press and returns the outcome text."""

    def __init__(
        self, owner_id: int, on_confirm: Callable[[discord.Interaction], Awaitable[str]], *, confirm_label: str = "Delete"
    ) -> None:
        super().__init__(owner_id, timeout=120.0)
        self.on_confirm = on_confirm
        self.confirmed: bool | None = None
        self.confirm.label = confirm_label

    def _close(self) -> None:
        for child in self.children:
            if isinstance(child, discord.ui.Button):
                child.disabled = True
        self.stop()

    @discord.ui.button(label="Confirm", style=discord.ButtonStyle.danger)
    async def confirm(self, interaction: discord.Interaction, button: discord.ui.Button[ConfirmView]) -> None:
        self.confirmed = True
        self._close()
        await interaction.response.defer()
        try:
            outcome = await self.on_confirm(interaction)
        except (Refusal, Refused) as exc:
            outcome = sentence(str(exc))
        await interaction.edit_original_response(content=outcome, view=self, embed=None)

    @discord.ui.button(label="Cancel", style=discord.ButtonStyle.secondary)
    async def cancel(self, interaction: discord.Interaction, button: discord.ui.Button[ConfirmView]) -> None:
        self.confirmed = False
        self._close()
        await interaction.response.edit_message(content="Cancelled; nothing changed.", view=self, embed=None)


async def ask_confirmation(
    interaction: discord.Interaction,
    question: str,
    on_confirm: Callable[[discord.Interaction], Awaitable[str]],
    *,
    confirm_label: str = "Delete",
) -> ConfirmView:
    view = ConfirmView(interaction.user.id, on_confirm, confirm_label=confirm_label)
    view.interaction = interaction
    await reply(interaction, question, view=view, ephemeral=True)
    return view


class TextModal(discord.ui.Modal):
    """A modal with one long text field and an optional short one, handing both to `on_submit_text`.

    Used to write and edit memories (text + tags), the persona prompt and lore entries.
    """

    def __init__(
        self,
        title: str,
        on_submit_text: Callable[[discord.Interaction, str, str | None], Awaitable[None]],
        *,
        label: str = "Memory",
        default: str | None = None,
        max_length: int = 1000,
        placeholder: str | None = None,
        extra_label: str | None = None,
        extra_default: str | None = None,
        extra_placeholder: str | None = None,
    ) -> None:
        super().__init__(title=clip(title, 45), timeout=900.0)
        self.on_submit_text = on_submit_text
        self.text: discord.ui.TextInput[TextModal] = discord.ui.TextInput(
            label=label,
            style=discord.TextStyle.paragraph,
            default=default,
            max_length=max_length,
            placeholder=placeholder,
        )
        self.add_item(self.text)
        self.extra: discord.ui.TextInput[TextModal] | None = None
        if extra_label:
            self.extra = discord.ui.TextInput(
                label=extra_label, required=False, default=extra_default, placeholder=extra_placeholder, max_length=400
            )
            self.add_item(self.extra)

    async def on_submit(self, interaction: discord.Interaction, /) -> None:
        await self.on_submit_text(interaction, self.text.value, self.extra.value if self.extra is not None else None)

    async def on_error(self, interaction: discord.Interaction, error: Exception, /) -> None:
        await report_error(interaction, error)
