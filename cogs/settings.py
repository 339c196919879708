"""`/settings ...`: a server's Deskmate settings, for members with Manage Server.

The command is hidden from other members by its default permissions, and every call checks
Manage Server again: a server admin can grant the command to more people in Discord's
Integrations page, but these settings stay with Manage Server itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import discord
from discord import app_commands
from discord.ext import commands

from bot.errors import NotAllowed
from bot.servers.models import GuildSettings, PersonaSettings
from bot.servers.rules import LORE_MAX_CHARS, PERSONA_NAME_MAX_CHARS, PERSONA_PROMPT_MAX_CHARS, require_manager
from bot.servers.service import Servers
from bot.upkeep import RebuildProgress, Upkeep
from cogs.summaries import SummaryChannel
from cogs.ui import COLOUR, Refused, TextModal, actor_of, clip, reply, sentence, services_of

log = logging.getLogger(__name__)
ReplyChannel = discord.TextChannel | discord.VoiceChannel | discord.ForumChannel | discord.StageChannel | discord.Thread
ON_OFF = {True: "on", False: "off"}


def servers_of(interaction: discord.Interaction) -> Servers:
    return services_of(interaction).servers


async def persona_prompt_modal(servers: Servers, guild_id: int) -> TextModal:
    """The form that edits the persona prompt, filled with the current one."""
    persona = await servers.persona(guild_id)

    async def save(submitted: discord.Interaction, text: str, _: str | None) -> None:
        await servers.update_persona(guild_id, actor_of(submitted), prompt=text)
        await reply(submitted, "Saved the persona prompt. It is part of every reply's prompt from now on.")

    return TextModal(
        "Persona prompt",
        save,
        label="Who is the bot here, and how does it talk?",
        default=clip(persona.prompt, PERSONA_PROMPT_MAX_CHARS) or None,
        max_length=PERSONA_PROMPT_MAX_CHARS,
    )


def lore_saver(servers: Servers, guild_id: int) -> Callable[[discord.Interaction, str, str | None], Awaitable[None]]:
    """What saving a lore entry does, from the command's text or from the form."""

    async def save(submitted: discord.Interaction, body: str, _: str | None) -> None:
        entry = await servers.add_lore(guild_id, actor_of(submitted), body)
        await reply(submitted, f"Added lore entry #{entry.id}. It is in every prompt from now on (it never decays).")

    return save


def settings_embed(guild: GuildSettings, persona: PersonaSettings, lore_count: int, blocked: int) -> discord.Embed:
    embed = discord.Embed(title="Deskmate settings for this server", colour=COLOUR)
    where = {"visible": "in the channel", "hidden": "hidden", "log": "in a log channel"}[guild.notices]
    log_channel = f" (<#{guild.log_channel_id}>)" if guild.log_channel_id else ""
    embed.add_field(name="Memory notices", value=f"{where}{log_channel}, {guild.notice_verbosity}", inline=False)
    embed.add_field(name="Self-teaching", value=ON_OFF[guild.self_teaching], inline=True)
    embed.add_field(name="Member teaching", value=ON_OFF[guild.member_teaching], inline=True)
    embed.add_field(name="Personal memories", value=ON_OFF[guild.personal_memories], inline=True)
    embed.add_field(name="Tagging", value=ON_OFF[guild.tagging], inline=True)
    embed.add_field(name="Blocked members", value=str(blocked), inline=True)
    channels = " ".join(f"<#{channel}>" for channel in guild.auto_reply_channel_ids) or "none"
    embed.add_field(name="Auto-reply channels", value=channels, inline=False)
    shown = "\n".join(f"**{key}**: {value}" for key, value in sorted(persona.attributes.items())) or "none"
    embed.add_field(name=f"Persona: {persona.name}", value=clip(persona.prompt or "(no prompt)", 600), inline=False)
    embed.add_field(name="Persona attributes", value=clip(shown, 1000), inline=False)
    embed.add_field(name="Always-on lore", value=f"{lore_count} entries (`/settings lore list`)", inline=False)
    return embed


def summaries_state(guild_id: int, switches: dict[int, bool], active: bool) -> str:
    """The summaries line of the overview: the server's switch, and the channels that differ from it."""
    server_on = switches.get(guild_id, True)
    text = "on in this server" if server_on else "off in this server"
    differ = [channel for channel, on in sorted(switches.items()) if channel != guild_id and on != server_on]
    if differ:
        text += ("; off in " if server_on else "; on in ") + " ".join(f"<#{channel}>" for channel in differ)
    if not active:
        text += " (none are written: no summary model is configured, or SUMMARY_ENABLED is false)"
    return text


def history_recall_text(channel_id: int, enabled: bool) -> str:
    if enabled:
        return f"History recall is on in <#{channel_id}>: replies there may add older messages of that channel that match."
    return (
        f"History recall is off in <#{channel_id}>: its messages are still stored and chunked, "
        "but replies there never add older chat."
    )


def summaries_switch_text(channel: SummaryChannel | None, enabled: bool, active: bool) -> str:
    """What `/settings summaries` answers: which scope changed, and that a channel's own switch wins over the server's."""
    if channel is not None:
        text = (
            f"Summaries are on in {channel.mention}: its finished chat days are summarised and carried in its prompts."
            if enabled else f"Summaries are off in {channel.mention}: nothing there is summarised, and its prompts carry none."
        )
    else:
        text = (
            "Summaries are on in this whole server: each channel's finished chat days are summarised and carried "
            "in its prompts (channels switched off one by one stay off)."
            if enabled else "Summaries are off in this whole server: nothing is summarised, and prompts carry none "
            "(channels switched on one by one keep theirs)."
        )
    if enabled and not active:
        text += " None are written until a summary model is configured (SUMMARY_MODEL or CHAT_MODEL) and SUMMARY_ENABLED is true."
    return text


@app_commands.guild_only()
@app_commands.default_permissions(manage_guild=True)
class Settings(commands.GroupCog, group_name="settings", group_description="Deskmate's settings for this server (Manage Server)"):
    blocklist = app_commands.Group(name="blocklist", description="Members the bot ignores here (their memories stay unused here)")
    auto_reply = app_commands.Group(name="auto-reply", description="Channels where the bot answers every message")
    persona = app_commands.Group(name="persona", description="The bot's name, prompt and attributes in this server")
    lore = app_commands.Group(name="lore", description="Always-on lore: rules and facts in every prompt")
    embeddings = app_commands.Group(name="embeddings", description="The vectors the bot searches with")

    def __init__(self, bot: commands.Bot) -> None:
        self.bot = bot

    async def interaction_check(self, interaction: discord.Interaction, /) -> bool:
        if interaction.guild_id is None:
            raise app_commands.NoPrivateMessage()
        try:  # before a form opens; the services check again on every change
            require_manager(actor_of(interaction))
        except NotAllowed as exc:  # discord.py reports only check failures raised here
            raise Refused(exc.sentence) from None
        return True

    def guild_id(self, interaction: discord.Interaction) -> int:
        assert interaction.guild_id is not None
        return interaction.guild_id

    async def change(self, interaction: discord.Interaction, message: str, **changes: object) -> None:
        await servers_of(interaction).update_guild_settings(self.guild_id(interaction), actor_of(interaction), **changes)
        await reply(interaction, message)

    async def current(self, interaction: discord.Interaction) -> GuildSettings:
        return await servers_of(interaction).guild_settings(self.guild_id(interaction))

    @app_commands.command(name="show", description="All of Deskmate's settings in this server")
    async def show(self, interaction: discord.Interaction) -> None:
        guild_id = self.guild_id(interaction)
        servers = servers_of(interaction)
        embed = settings_embed(
            await servers.guild_settings(guild_id),
            await servers.persona(guild_id),
            len(await servers.lore(guild_id)),
            len(await servers.blocklist(guild_id)),
        )
        off = await services_of(interaction).history.recall_off_channels(guild_id)
        shown = "on everywhere" if not off else "off in " + " ".join(f"<#{channel}>" for channel in off)
        embed.add_field(name="History recall", value=clip(shown, 1000), inline=False)
        summaries = services_of(interaction).summaries
        state = summaries_state(guild_id, await summaries.switches(guild_id), summaries.active)
        embed.add_field(name="Channel summaries", value=clip(state, 1000), inline=False)
        await reply(interaction, embed=embed)

    @app_commands.command(name="notices", description="Where notices about memories the bot saved or forgot go, and how detailed")
    @app_commands.describe(
        mode="visible: in the channel; hidden: not shown; log: in a log channel",
        verbosity="minimal: what happened; verbose: also the saved and forgotten text",
        log_channel="The channel for notices in log mode",
    )
    @app_commands.choices(
        mode=[
            app_commands.Choice(name="visible in the channel", value="visible"),
            app_commands.Choice(name="hidden", value="hidden"),
            app_commands.Choice(name="sent to a log channel", value="log"),
        ],
        verbosity=[
            app_commands.Choice(name="minimal", value="minimal"),
            app_commands.Choice(name="verbose (shows saved and forgotten text)", value="verbose"),
        ],
    )
    async def notices(
        self,
        interaction: discord.Interaction,
        mode: str,
        verbosity: str | None = None,
        log_channel: discord.TextChannel | None = None,
    ) -> None:
        current = await self.current(interaction)
        changes: dict[str, object] = {"notices": mode}
        if verbosity is not None:
            changes["notice_verbosity"] = verbosity
        if log_channel is not None:
            me = log_channel.guild.me
            if me is not None and not log_channel.permissions_for(me).send_messages:
                raise Refused(f"I cannot send messages in {log_channel.mention}; give me Send Messages there first")
            changes["log_channel_id"] = log_channel.id
        log_id = changes.get("log_channel_id", current.log_channel_id)
        where = {"visible": "in the channel", "hidden": "nowhere (hidden)", "log": f"to <#{log_id}>"}[mode]
        detail = changes.get("notice_verbosity", current.notice_verbosity)
        await self.change(interaction, f"Memory notices now go {where}, {detail}.", **changes)

    async def switch(self, interaction: discord.Interaction, column: str, enabled: bool, on: str, off: str) -> None:
        await self.change(interaction, on if enabled else off, **{column: enabled})

    @app_commands.command(name="self-teaching", description="Whether the bot may save and change memories on its own")
    @app_commands.describe(enabled="On: the bot saves memories through its tools; off: only people add them")
    async def self_teaching(self, interaction: discord.Interaction, enabled: bool) -> None:
        await self.switch(
            interaction, "self_teaching", enabled,
            "Self-teaching is on: the bot may save and change memories by itself.",
            "Self-teaching is off: only people add memories here.",
        )

    @app_commands.command(name="member-teaching", description="Whether every member may add server memories")
    @app_commands.describe(enabled="On: anyone can add server memories and change their own")
    async def member_teaching(self, interaction: discord.Interaction, enabled: bool) -> None:
        await self.switch(
            interaction, "member_teaching", enabled,
            "Member teaching is on: everyone can add server memories and change the ones they added.",
            "Member teaching is off: only members with Manage Server change server memories.",
        )

    @app_commands.command(name="personal-memories", description="Whether the bot uses people's personal memories here")
    @app_commands.describe(enabled="Off: personal memories are neither used nor saved in this server")
    async def personal_memories(self, interaction: discord.Interaction, enabled: bool) -> None:
        await self.switch(
            interaction, "personal_memories", enabled,
            "Personal memories are on in this server.",
            "Personal memories are off here: the bot neither uses nor saves them in this server (they still work elsewhere).",
        )

    @app_commands.command(name="tagging", description="Whether tagged memories are used only when a tag comes up")
    @app_commands.describe(enabled="On: a tagged memory is used only when one of its tags appears in the conversation")
    async def tagging(self, interaction: discord.Interaction, enabled: bool) -> None:
        await self.switch(
            interaction, "tagging", enabled,
            "Tagging is on: a memory with tags is used only when one of its tags appears in the conversation.",
            "Tagging is off: tags are ignored.",
        )

    @app_commands.command(name="history-recall", description="Whether replies in a channel may recall its older chat")
    @app_commands.describe(
        enabled="Off: older messages of the channel are still stored and chunked, but never added to replies",
        channel="The channel (default: this one)",
    )
    async def history_recall(self, interaction: discord.Interaction, enabled: bool, channel: ReplyChannel | None = None) -> None:
        history = services_of(interaction).history
        target = channel.id if channel is not None else interaction.channel_id
        assert target is not None
        await history.set_recall(target, self.guild_id(interaction), enabled)
        await reply(interaction, history_recall_text(target, enabled))

    @app_commands.command(name="summaries", description="Whether the bot summarises each chat day, in this server or one channel")
    @app_commands.describe(
        enabled="Off: nothing is summarised there, and no summaries are in its prompts",
        channel="One channel (default: the whole server)",
    )
    async def summaries(self, interaction: discord.Interaction, enabled: bool, channel: SummaryChannel | None = None) -> None:
        guild_id = self.guild_id(interaction)
        summaries = services_of(interaction).summaries
        await summaries.set_enabled(channel.id if channel is not None else guild_id, guild_id, enabled)
        await reply(interaction, summaries_switch_text(channel, enabled, summaries.active))

    # --- embeddings ---

    @embeddings.command(name="rebuild", description="Embed every memory, chat chunk and document passage with the current model")
    async def embeddings_rebuild(self, interaction: discord.Interaction) -> None:
        await interaction.response.defer(ephemeral=True, thinking=True)
        await rebuild_flow(interaction, services_of(interaction).upkeep)

    # --- blocklist ---

    @blocklist.command(name="add", description="Block a member: no replies to them, their personal memories unused here")
    @app_commands.describe(user="The member to block")
    async def blocklist_add(self, interaction: discord.Interaction, user: discord.User) -> None:
        if user.bot:
            raise Refused("bots never get replies anyway; there is no need to block them")
        await services_of(interaction).set_blocked(self.guild_id(interaction), user.id, True, actor_of(interaction))
        await reply(interaction, f"Blocked {user.mention}: the bot will not answer them or use their personal memories here.")

    @blocklist.command(name="remove", description="Unblock a member")
    @app_commands.describe(user="The member to unblock")
    async def blocklist_remove(self, interaction: discord.Interaction, user: discord.User) -> None:
        await services_of(interaction).set_blocked(self.guild_id(interaction), user.id, False, actor_of(interaction))
        await reply(interaction, f"Unblocked {user.mention}.")

    @blocklist.command(name="list", description="Members the bot ignores in this server")
    async def blocklist_list(self, interaction: discord.Interaction) -> None:
        blocked = await servers_of(interaction).blocklist(self.guild_id(interaction))
        if not blocked:
            await reply(interaction, "Nobody is blocked in this server.")
            return
        lines = [f"<@{user_id}> (since {discord.utils.format_dt(since, 'd')})" for user_id, since in blocked]
        embed = discord.Embed(title="Blocked members", description=clip("\n".join(lines), 4000), colour=COLOUR)
        await reply(interaction, embed=embed)

    # --- auto-reply channels ---

    @auto_reply.command(name="add", description="Answer every message in a channel (threads in it included)")
    @app_commands.describe(channel="The channel")
    async def auto_reply_add(self, interaction: discord.Interaction, channel: ReplyChannel) -> None:
        await servers_of(interaction).set_auto_reply(self.guild_id(interaction), actor_of(interaction), channel.id, True)
        await reply(interaction, f"The bot now answers every message in {channel.mention}.")

    @auto_reply.command(name="remove", description="Stop answering every message in a channel")
    @app_commands.describe(channel="The channel")
    async def auto_reply_remove(self, interaction: discord.Interaction, channel: ReplyChannel) -> None:
        await servers_of(interaction).set_auto_reply(self.guild_id(interaction), actor_of(interaction), channel.id, False)
        await reply(interaction, f"The bot answers in {channel.mention} only when mentioned, replied to or called by name.")

    @auto_reply.command(name="list", description="Channels where the bot answers every message")
    async def auto_reply_list(self, interaction: discord.Interaction) -> None:
        channels = (await self.current(interaction)).auto_reply_channel_ids
        text = " ".join(f"<#{channel}>" for channel in channels)
        await reply(interaction, f"Auto-reply channels: {text}." if text else "No auto-reply channels.")

    # --- persona ---

    @persona.command(name="show", description="The persona's name, prompt and attributes")
    async def persona_show(self, interaction: discord.Interaction) -> None:
        persona = await servers_of(interaction).persona(self.guild_id(interaction))
        embed = discord.Embed(title=f"Persona: {persona.name}", description=clip(persona.prompt or "(no prompt)", 4000))
        for key, value in sorted(persona.attributes.items()):
            embed.add_field(name=clip(key, 256), value=clip(str(value), 1024), inline=True)
        await reply(interaction, embed=embed)

    @persona.command(name="name", description="The name the bot goes by here (it also answers when called by it)")
    @app_commands.describe(name="The new name")
    async def persona_name(
        self, interaction: discord.Interaction, name: app_commands.Range[str, 1, PERSONA_NAME_MAX_CHARS]
    ) -> None:
        persona = await servers_of(interaction).update_persona(self.guild_id(interaction), actor_of(interaction), name=name)
        await reply(interaction, f"The persona is now called **{discord.utils.escape_markdown(persona.name)}**.")

    @persona.command(name="prompt", description="Write the persona prompt: who the bot is and how it talks here (opens a form)")
    async def persona_prompt(self, interaction: discord.Interaction) -> None:
        await interaction.response.send_modal(await persona_prompt_modal(servers_of(interaction), self.guild_id(interaction)))

    @persona.command(name="attribute", description="Set a persona attribute (e.g. language = Spanish); no value removes it")
    @app_commands.describe(key="The attribute, e.g. language, tone, pronouns", value="Its value; leave empty to remove it")
    async def persona_attribute(
        self,
        interaction: discord.Interaction,
        key: app_commands.Range[str, 1, 40],
        value: app_commands.Range[str, 1, 200] | None = None,
    ) -> None:
        key, shown = await servers_of(interaction).set_persona_attribute(
            self.guild_id(interaction), actor_of(interaction), key, value
        )
        await reply(interaction, f"Removed the attribute **{key}**." if shown is None else f"Set **{key}** = {shown}.")

    # --- lore ---

    async def lore_autocomplete(self, interaction: discord.Interaction, current: str) -> list[app_commands.Choice[int]]:
        if interaction.guild_id is None:
            return []
        entries = await servers_of(interaction).lore(interaction.guild_id)
        wanted = current.strip().lstrip("#").casefold()
        return [
            app_commands.Choice(name=clip(f"#{entry.id} · {' '.join(entry.text.split())}", 100), value=entry.id)
            for entry in entries
            if wanted in entry.text.casefold() or wanted == str(entry.id)
        ][:25]

    @lore.command(name="add", description="Add an always-on lore entry: a rule or fact in every prompt (opens a form)")
    @app_commands.describe(text="The entry; leave empty to write it in a form")
    async def lore_add(
        self, interaction: discord.Interaction, text: app_commands.Range[str, 1, LORE_MAX_CHARS] | None = None
    ) -> None:
        save = lore_saver(servers_of(interaction), self.guild_id(interaction))
        if text is not None:
            await save(interaction, text, None)
            return
        await interaction.response.send_modal(
            TextModal("New lore entry", save, label="Lore (in every prompt)", max_length=LORE_MAX_CHARS)
        )

    @lore.command(name="list", description="The always-on lore entries")
    async def lore_list(self, interaction: discord.Interaction) -> None:
        entries = await servers_of(interaction).lore(self.guild_id(interaction))
        if not entries:
            await reply(interaction, "No lore entries yet. Add one with `/settings lore add`.")
            return
        from bot.memory.manage import count_tokens

        embed = discord.Embed(title="Always-on lore", colour=COLOUR)
        for entry in entries:
            embed.add_field(name=f"#{entry.id}", value=clip(entry.text, 1000), inline=False)
        embed.set_footer(text=f"~{sum(count_tokens(entry.text) for entry in entries)} tokens in every prompt")
        await reply(interaction, embed=embed)

    @lore.command(name="remove", description="Remove an always-on lore entry")
    @app_commands.describe(entry="The entry to remove: start typing its text")
    @app_commands.autocomplete(entry=lore_autocomplete)
    async def lore_remove(self, interaction: discord.Interaction, entry: int) -> None:
        await servers_of(interaction).remove_lore(self.guild_id(interaction), actor_of(interaction), entry)
        await reply(interaction, sentence(f"removed lore entry #{entry}"))


async def setup(bot: commands.Bot) -> None:
    await bot.add_cog(Settings(bot))


REBUILD_EDIT_EVERY_S = 2.0  # Discord rate-limits edits; a bar that moves every two seconds reads as alive


def progress_text(state: RebuildProgress) -> str:
    width = 16
    filled = round(state.fraction * width)
    bar = "▰" * filled + "▱" * (width - filled)
    head = f"Rebuilding vectors with **{state.space}**"
    if state.finished and state.paused:
        return (
            f"{head}: paused.\n{bar} {state.fraction:.0%} · {state.summary()}\nWhy: {clip(state.paused, 500)}\n"
            "Run it again later: it continues where it stopped (the bot also retries in the background)."
        )
    if state.finished:
        extra = f" Removed {state.stale_removed} vectors of other models." if state.stale_removed else ""
        made = f" Made {state.chunks_made} new chunks of older chat." if state.chunks_made else ""
        return f"{head}: done.\n{bar} 100% · {state.summary()}.{made}{extra}"
    return f"{head}…\n{bar} {state.fraction:.0%} · {state.summary()}"


async def rebuild_flow(interaction: discord.Interaction, upkeep: Upkeep) -> None:
    """Run a pass and show its progress in one edited (ephemeral) message; the pass goes on if editing fails."""
    last = 0.0
    editing = True
    if upkeep.busy:
        await interaction.edit_original_response(content="A rebuild is already running; this one starts when it ends…")

    async def progress(state: RebuildProgress) -> None:
        nonlocal last, editing
        now = time.monotonic()
        if not editing or (not state.finished and now - last < REBUILD_EDIT_EVERY_S):
            return
        last = now
        try:
            await interaction.edit_original_response(content=progress_text(state))
        except discord.HTTPException as exc:  # the interaction expired (15 minutes): the pass itself goes on
            editing = False
            log.info("Stopped showing rebuild progress: %s", exc)

    state = await upkeep.rebuild(progress)
    if not editing:
        await interaction.followup.send(progress_text(state), ephemeral=True)
