"""`/summaries ...`: what each channel talked about on its past chat days and weeks.

Everyone may read a channel's summaries (they are what the bot reads in its prompt there); editing,
deleting, regenerating and backfilling need Manage Server. A thread shows its parent channel's
summaries, since that is what the bot reads in it. Every answer is ephemeral and pings nobody (a
summary names people, and its mentions must stay text).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

import discord
from discord import app_commands
from discord.ext import commands

from bot.errors import NotAllowed
from bot.summaries.models import BackfillProgress, Kind, Off, OverviewEntry, Status, Summary, period_label
from bot.summaries.service import ChannelSummaries
from bot.summaries.writer import MAX_KEY_DETAILS, MAX_SUMMARY_CHARS
from cogs.ui import (
    COLOUR,
    OwnedView,
    Refused,
    actor_of,
    ask_confirmation,
    clip,
    quote,
    reply,
    report_error,
    send_paged,
    services_of,
)

log = logging.getLogger(__name__)

NO_PINGS = discord.AllowedMentions.none()
LINES_PER_PAGE = 15
BACKFILL_LIFETIME_S = 15 * 60.0  # an interaction's token lives 15 minutes: the Stop button with it
FAILED_SHOWN = 5
SummaryChannel = discord.TextChannel | discord.VoiceChannel | discord.ForumChannel | discord.StageChannel


def summaries_of(interaction: discord.Interaction) -> ChannelSummaries:
    return services_of(interaction).summaries


def memory_channel(interaction: discord.Interaction, channel: SummaryChannel | None = None) -> int:
    """The channel whose summaries a command is about: the one named, else this one (a public thread's parent for a
    thread; a private thread has its own)."""
    if channel is not None:
        return channel.id
    here = interaction.channel
    if isinstance(here, discord.Thread) and here.parent_id and here.type != discord.ChannelType.private_thread:
        return here.parent_id
    assert interaction.channel_id is not None
    return interaction.channel_id


def off_sentence(off: Off, channel_id: int) -> str:
    return {
        Off.EVERYWHERE: "summaries are switched off for this bot (SUMMARY_ENABLED=false), so none are written or shown",
        Off.NO_MODEL: "no summary model is configured (SUMMARY_MODEL, or CHAT_MODEL with its endpoint), "
        "so no summaries are written",
        Off.HERE: f"summaries are off in <#{channel_id}>, so none are written or shown there; "
        "`/settings summaries enabled:true` turns them on",
    }[off]


async def ensure_on(interaction: discord.Interaction, channel_id: int) -> None:
    off = await summaries_of(interaction).why_off(channel_id, interaction.guild_id)
    if off is not None:
        raise Refused(off_sentence(off, channel_id))


def ensure_manager(interaction: discord.Interaction, what: str) -> None:
    """The service's rule, asked before a form opens or a backfill starts (the service asks again on each change)."""
    try:
        ChannelSummaries.may_change(actor_of(interaction), what)
    except NotAllowed as exc:
        raise Refused(exc.sentence) from None


# --- summaries as text -----------------------------------------------------------------------------

def entry_line(entry: OverviewEntry) -> str:
    """One line of the list: "#12 · Tue 2026-01-06 · 42 tokens, edited", or a day with no summary yet."""
    s = entry.summary
    period = s.period if s is not None else period_label(entry.kind, entry.period_start)
    head = f"`#{s.id}`" if s is not None else "`—`"
    mark = "⚠️ " if s is None or s.status == Status.MISSING else ""
    return f"{head} · **{period}** · {mark}{entry.state}"


def status_line(summary: Summary) -> str:
    """What `show` says about a summary besides its text: status, edits, staleness, messages, model."""
    parts = [{Status.READY: "ready", Status.MISSING: "missing", Status.EMPTY: "nothing to summarise",
              Status.DELETED: "deleted"}[summary.status]]
    if summary.status == Status.MISSING:
        parts.append(f"failed {summary.attempts}×" + (f", retried from {summary.retry_on}" if summary.retry_on else ""))
    if summary.edited:
        when = f" on {discord.utils.format_dt(summary.edited_at, 'd')}" if summary.edited_at else ""
        parts.append(f"edited by <@{summary.edited_by}>{when}: never overwritten")
    if summary.stale:
        parts.append("messages changed since" if summary.edited else "stale: written again at the next day rollover")
    if summary.folded_into is not None:
        parts.append(f"folded into week summary #{summary.folded_into}")
    if summary.message_count:
        parts.append(f"{summary.message_count} messages")
    if summary.model:
        parts.append(summary.model)
    return " · ".join(parts)


def summary_embed(summary: Summary) -> discord.Embed:
    text = summary.summary or {Status.MISSING: "(not written: the summary model failed)", Status.EMPTY: "(nothing to summarise)",
                               Status.DELETED: "(deleted)"}.get(summary.status, "(empty)")
    kind = "Week" if summary.kind == Kind.WEEK else "Day"
    embed = discord.Embed(title=f"{kind} summary #{summary.id} · {summary.period}", description=clip(text, 4000), colour=COLOUR)
    if summary.key_details:
        embed.add_field(name="Key details", value="\n".join(f"• {detail}" for detail in summary.key_details), inline=False)
    embed.add_field(name="Period", value=summary.period, inline=True)
    embed.add_field(name="Channel", value=f"<#{summary.channel_id}>", inline=True)
    embed.add_field(name="Status", value=status_line(summary), inline=False)
    if summary.last_error and summary.status == Status.MISSING:
        embed.add_field(name="Last error", value=clip(summary.last_error, 500), inline=False)
    return embed


@dataclass(frozen=True)
class SummaryPage:
    """One page of `/summaries list`, for `send_paged`."""

    lines: list[str]
    number: int
    pages: int
    total: int
    missing: int


def list_embed(channel_id: int, page: SummaryPage, elsewhere: bool) -> discord.Embed:
    head = f"Summaries of <#{channel_id}>: weeks, then the days not folded into a week, oldest first."
    if elsewhere:
        head += " Open one with `/summaries show` in that channel."
    embed = discord.Embed(title="Channel summaries", description=head + "\n\n" + "\n".join(page.lines), colour=COLOUR)
    footer = f"Page {page.number + 1} of {page.pages} · {page.total} entries"
    if page.missing:
        footer += f" · {page.missing} missing: `/summaries backfill` writes them"
    embed.set_footer(text=footer)
    return embed


def progress_text(channel_id: int, days: int, state: BackfillProgress) -> str:
    width = 16
    filled = round(state.fraction * width)
    bar = "▰" * filled + "▱" * (width - filled)
    head = f"Backfilling the summaries of <#{channel_id}> (the last {days} chat days)"
    if not state.finished:
        return f"{head}…\n{bar} {state.fraction:.0%} · {state.line()}"
    resume = "Running it again resumes: it only writes what is still missing."
    if state.stopped:
        return f"{head}: stopped.\n{bar} {state.fraction:.0%} · {state.line()}\n{resume}"
    if state.days_total == 0 and not state.weeks_done:
        return f"{head}: nothing to do, every chat day there already has a summary (or nothing to summarise).\n{resume}"
    lines = [f"{head}: done.", f"{bar} {state.fraction:.0%} · {state.line()}",
             f"Wrote {state.written} day summaries and folded {state.weeks_done} weeks."]
    if state.failed:
        lines.append(f"The summary model failed on {len(state.failed)} days; they stay missing:")
        lines += [f"• {clip(failure, 200)}" for failure in state.failed[:FAILED_SHOWN]]
        if len(state.failed) > FAILED_SHOWN:
            lines.append(f"… and {len(state.failed) - FAILED_SHOWN} more.")
    lines.append(resume)
    return "\n".join(lines)


# --- views and forms -------------------------------------------------------------------------------

class StopView(OwnedView):
    """The Stop button under a backfill's progress: it sets the stop event, and the backfill ends after its current day."""

    def __init__(self, owner_id: int, stop_event: asyncio.Event) -> None:
        super().__init__(owner_id, timeout=BACKFILL_LIFETIME_S)
        self.stop_event = stop_event

    @discord.ui.button(label="Stop", style=discord.ButtonStyle.danger)
    async def stop_backfill(self, interaction: discord.Interaction, button: discord.ui.Button[StopView]) -> None:
        self.stop_event.set()
        button.disabled = True
        button.label = "Stopping after this day…"
        await interaction.response.edit_message(view=self, allowed_mentions=NO_PINGS)


class SummaryModal(discord.ui.Modal):
    """The form that edits a summary: its text and its key details, one per line, filled with the current ones."""

    def __init__(self, summary: Summary) -> None:
        super().__init__(title=clip(f"Edit summary #{summary.id} (kept as written)", 45), timeout=900.0)
        self.summary = summary
        self.text: discord.ui.TextInput[SummaryModal] = discord.ui.TextInput(
            label="Summary", style=discord.TextStyle.paragraph, default=clip(summary.summary, MAX_SUMMARY_CHARS) or None,
            max_length=MAX_SUMMARY_CHARS, placeholder="What was talked about; an edited summary is never overwritten",
        )
        self.details: discord.ui.TextInput[SummaryModal] = discord.ui.TextInput(
            label="Key details, one per line", style=discord.TextStyle.paragraph, required=False,
            default=clip("\n".join(summary.key_details), 2000) or None, max_length=2000,
            placeholder=f"Promises, plans, decisions, new facts about people (at most {MAX_KEY_DETAILS * 2})",
        )
        self.add_item(self.text)
        self.add_item(self.details)

    async def on_submit(self, interaction: discord.Interaction, /) -> None:
        edited = await summaries_of(interaction).edit(
            self.summary.channel_id, self.summary.id, self.text.value, self.details.value.splitlines(), actor_of(interaction)
        )
        await reply(
            interaction,
            f"Saved summary #{edited.id} ({edited.period}) as you wrote it, with {len(edited.key_details)} key details. "
            "An edited summary is never overwritten: regenerating and changed messages keep it; delete it to have it "
            f"written again.\n{quote(edited.summary, 600)}",
            allowed_mentions=NO_PINGS,
        )

    async def on_error(self, interaction: discord.Interaction, error: Exception, /) -> None:
        await report_error(interaction, error)


# --- the cog ---------------------------------------------------------------------------------------

@app_commands.guild_only()
class Summaries(
    commands.GroupCog, group_name="summaries", group_description="What each channel talked about on its past days and weeks"
):
    def __init__(self, bot: commands.Bot) -> None:
        self.bot = bot

    async def interaction_check(self, interaction: discord.Interaction, /) -> bool:
        if interaction.guild_id is None:
            raise app_commands.NoPrivateMessage()
        return True

    async def summary_autocomplete(self, interaction: discord.Interaction, current: str) -> list[app_commands.Choice[int]]:
        if interaction.guild_id is None:
            return []
        wanted = current.strip().lstrip("#").casefold()
        entries = await summaries_of(interaction).overview(memory_channel(interaction))
        choices = [
            app_commands.Choice(name=clip(f"#{e.summary.id} · {e.summary.period} · {e.state}", 100), value=e.summary.id)
            for e in reversed(entries)  # the newest first: the ones people ask about
            if e.summary is not None and (wanted in e.summary.period.casefold() or wanted == str(e.summary.id))
        ]
        return choices[:25]

    @app_commands.command(name="list", description="A channel's week and day summaries, missing days marked")
    @app_commands.describe(channel="The channel (default: this one; a thread shows its parent's)")
    async def list_summaries(self, interaction: discord.Interaction, channel: SummaryChannel | None = None) -> None:
        channel_id = memory_channel(interaction, channel)
        await ensure_on(interaction, channel_id)
        summaries = summaries_of(interaction)
        elsewhere = channel_id != memory_channel(interaction)

        async def fetch(number: int) -> SummaryPage:
            entries = await summaries.overview(channel_id)
            pages = max(1, -(-len(entries) // LINES_PER_PAGE))
            number = min(max(number, 0), pages - 1)
            shown = entries[number * LINES_PER_PAGE:(number + 1) * LINES_PER_PAGE]
            missing = sum(1 for e in entries if e.summary is None or e.summary.status == Status.MISSING)
            return SummaryPage([entry_line(e) for e in shown], number, pages, len(entries), missing)

        first = await fetch(0)
        if not first.total:
            await reply(
                interaction,
                f"No summaries in <#{channel_id}> yet: a chat day is summarised after it ends, when the channel's next "
                "message arrives.",
                allowed_mentions=NO_PINGS,
            )
            return
        await send_paged(interaction, fetch, lambda page: list_embed(channel_id, page, elsewhere), 0)

    @app_commands.command(name="show", description="One summary: its text, key details, period and status")
    @app_commands.describe(summary="The summary: start typing its date or #id")
    @app_commands.autocomplete(summary=summary_autocomplete)
    async def show(self, interaction: discord.Interaction, summary: int) -> None:
        channel_id = memory_channel(interaction)
        await ensure_on(interaction, channel_id)
        found = await summaries_of(interaction).get(channel_id, summary)
        await reply(interaction, embed=summary_embed(found), allowed_mentions=NO_PINGS)

    @app_commands.command(
        name="edit", description="Rewrite a summary in a form; an edited summary is never overwritten (Manage Server)"
    )
    @app_commands.describe(summary="The summary: start typing its date or #id")
    @app_commands.autocomplete(summary=summary_autocomplete)
    async def edit(self, interaction: discord.Interaction, summary: int) -> None:
        ensure_manager(interaction, "edit")
        channel_id = memory_channel(interaction)
        await ensure_on(interaction, channel_id)
        found = await summaries_of(interaction).get(channel_id, summary)
        await interaction.response.send_modal(SummaryModal(found))

    @app_commands.command(
        name="delete", description="Delete a summary: out of the prompt, not written again unless regenerated (Manage Server)"
    )
    @app_commands.describe(summary="The summary: start typing its date or #id")
    @app_commands.autocomplete(summary=summary_autocomplete)
    async def delete(self, interaction: discord.Interaction, summary: int) -> None:
        ensure_manager(interaction, "delete")
        channel_id = memory_channel(interaction)
        await ensure_on(interaction, channel_id)
        summaries = summaries_of(interaction)
        found = await summaries.get(channel_id, summary)

        async def confirmed(pressed: discord.Interaction) -> str:
            gone = await summaries.delete(channel_id, summary, actor_of(pressed))
            return (
                f"Deleted summary #{gone.id} ({gone.period}): it is out of the prompt and is not written again by itself; "
                "`/summaries regenerate` writes it anew."
            )

        await ask_confirmation(
            interaction,
            f"Delete summary #{found.id} ({found.period})? It leaves the prompt and is not written again unless regenerated.",
            confirmed,
        )

    @app_commands.command(name="regenerate", description="Write a summary again from its messages (Manage Server)")
    @app_commands.describe(summary="The summary: start typing its date or #id")
    @app_commands.autocomplete(summary=summary_autocomplete)
    async def regenerate(self, interaction: discord.Interaction, summary: int) -> None:
        ensure_manager(interaction, "regenerate")
        channel_id = memory_channel(interaction)
        await ensure_on(interaction, channel_id)
        await interaction.response.defer(ephemeral=True, thinking=True)
        # an edited one is refused by the service, and the refusal says it was kept
        written = await summaries_of(interaction).regenerate(channel_id, interaction.guild_id, summary, actor_of(interaction))
        if written.last_error is not None:  # the model failed: a summary that was there stays as it was
            kept = "is still missing" if written.status == Status.MISSING else "keeps its earlier text"
            text = (
                f"The summary model failed, so summary #{written.id} ({written.period}) {kept}: "
                f"{clip(written.last_error, 300)}. It is tried again at a later day rollover, "
                "or now with `/summaries regenerate` or `/summaries backfill`."
            )
        elif written.status == Status.EMPTY:
            text = (
                f"Summary #{written.id} ({written.period}) has nothing to summarise: nobody whose words may be "
                "summarised wrote there."
            )
        else:
            text = f"Wrote summary #{written.id} ({written.period}) again:\n{quote(written.summary, 1200)}"
        await reply(interaction, text, allowed_mentions=NO_PINGS)

    @app_commands.command(
        name="backfill", description="Summarise the past chat days that have no summary yet, with progress (Manage Server)"
    )
    @app_commands.describe(
        days="How many past chat days (default SUMMARY_BACKFILL_DAYS, at most 365)",
        channel="The channel (default: this one; a thread backfills its parent)",
    )
    async def backfill(
        self,
        interaction: discord.Interaction,
        days: app_commands.Range[int, 1, 365] | None = None,
        channel: SummaryChannel | None = None,
    ) -> None:
        ensure_manager(interaction, "backfill")
        channel_id = memory_channel(interaction, channel)
        await ensure_on(interaction, channel_id)
        await interaction.response.defer(ephemeral=True, thinking=True)
        summaries = summaries_of(interaction)
        await backfill_flow(interaction, summaries, channel_id, days or summaries.settings.summary_backfill_days)


async def backfill_flow(interaction: discord.Interaction, summaries: ChannelSummaries, channel_id: int, days: int) -> None:
    """Run a backfill and show its progress in one edited (ephemeral) message after each day, with a Stop button.

    The backfill goes on if editing fails (the interaction expired): the end is then a new message.
    """
    stop = asyncio.Event()
    view = StopView(interaction.user.id, stop)
    view.interaction = interaction
    editing = True
    ended = False

    async def show(state: BackfillProgress) -> None:
        nonlocal editing, ended
        if not editing:
            return
        try:  # the last one takes the Stop button away
            await interaction.edit_original_response(
                content=progress_text(channel_id, days, state), view=None if state.finished else view,
                allowed_mentions=NO_PINGS,
            )
            ended = state.finished
        except discord.HTTPException as exc:
            editing = False
            log.info("Stopped showing backfill progress: %s", exc)

    state = await summaries.catch_up(channel_id, interaction.guild_id, days=days, progress=show, stop=stop, retry_now=True)
    view.stop()
    if ended:
        return
    with contextlib.suppress(discord.HTTPException):  # an expired interaction leaves nothing to tell
        if editing:
            await interaction.edit_original_response(content=progress_text(channel_id, days, state), view=None,
                                                     allowed_mentions=NO_PINGS)
        else:
            await interaction.followup.send(progress_text(channel_id, days, state), ephemeral=True, allowed_mentions=NO_PINGS)


async def setup(bot: commands.Bot) -> None:
    await bot.add_cog(Summaries(bot))
