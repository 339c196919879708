"""`/privacy ...`: a user's own privacy level and data, valid in every server and DM."""

from __future__ import annotations

import discord
from discord import app_commands
from discord.ext import commands

from bot.servers.models import Privacy as PrivacyLevel
from cogs.ui import ask_confirmation, json_file, reply, services_of

LEVEL_TEXT = {
    PrivacyLevel.NONE: "`none`: the bot may remember things about you and use them.",
    PrivacyLevel.PARTIAL: "`partial`: the bot may not save or change memories about you (it may still delete them); "
    "you can still add your own with `/personal memories add`.",
    PrivacyLevel.FULL: "`full`: the bot never uses your personal memories and never saves new ones.",
}


@app_commands.allowed_contexts(guilds=True, dms=True, private_channels=False)
class Privacy(commands.GroupCog, group_name="privacy", group_description="What the bot may keep about you, everywhere"):
    def __init__(self, bot: commands.Bot) -> None:
        self.bot = bot

    @app_commands.command(name="level", description="How much the bot may remember about you, in every server and DM")
    @app_commands.describe(level="none: normal; partial: the bot saves nothing about you; full: your memories are never used")
    @app_commands.choices(
        level=[
            app_commands.Choice(name="none: the bot may remember things about you", value="none"),
            app_commands.Choice(name="partial: the bot may not save or change memories about you", value="partial"),
            app_commands.Choice(name="full: your personal memories are never used", value="full"),
        ]
    )
    async def level(self, interaction: discord.Interaction, level: str | None = None) -> None:
        servers = services_of(interaction).servers
        if level is None:
            current = await servers.privacy(interaction.user.id)
            await reply(interaction, f"Your privacy level is {LEVEL_TEXT[current]}")
            return
        chosen = PrivacyLevel(level)
        await services_of(interaction).set_privacy(interaction.user.id, chosen)
        await reply(interaction, f"Your privacy level is now {LEVEL_TEXT[chosen]} This applies in every server and in DMs.")

    @app_commands.command(name="export-my-data", description="Download everything the bot stores about you, as JSON")
    async def export_my_data(self, interaction: discord.Interaction) -> None:
        await interaction.response.defer(ephemeral=True, thinking=True)
        data = await services_of(interaction).export_user_data(interaction.user.id)
        await reply(
            interaction,
            f"Everything stored about you: {len(data['personal_memories'])} personal memories, "
            f"{len(data['server_memories_added'])} server memories you added, {len(data['chat_messages'])} stored messages.",
            file=json_file(data, f"deskmate-my-data-{interaction.user.id}.json"),
        )

    @app_commands.command(name="delete-my-data", description="Delete your personal memories, settings and messages, everywhere")
    async def delete_my_data(self, interaction: discord.Interaction) -> None:
        services = services_of(interaction)
        user_id = interaction.user.id

        async def confirmed(_: discord.Interaction) -> str:
            counts = await services.delete_user_data(user_id)
            return (
                f"Deleted {counts['personal_memories']} personal memories, your settings, {counts['chat_messages']} stored "
                f"messages and {counts['summaries']} channel summaries built from them (they are written again without you), "
                f"in every server and DM. {counts['authored_server_memories']} server memories you added stay "
                "(they belong to their servers) but no longer name you."
            )

        await ask_confirmation(
            interaction,
            "This deletes **all** your personal memories (Global and in every server), your privacy setting and the "
            "messages the bot stored from you, everywhere. It cannot be undone. Continue?",
            confirmed,
            confirm_label="Delete everything",
        )


async def setup(bot: commands.Bot) -> None:
    await bot.add_cog(Privacy(bot))
