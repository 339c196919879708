"""`/memories ...`: the server memories of this server's persona.

Everyone may read the list (it is what the bot knows about the server). Changing it needs Manage
Server, or, when the server switched member teaching on, anyone may add memories and change the
ones they added. Import and export stay with Manage Server: they move the whole list at once.
"""

from __future__ import annotations

import discord
from discord import app_commands
from discord.ext import commands

from bot.chat.receipts import Receipt
from bot.memory.lists import ListRef
from cogs import memory_flows as flows
from cogs.receipts import parse_message_ref, receipt_embed
from cogs.ui import Refused, can_manage, reply, services_of

AnyChannel = discord.TextChannel | discord.VoiceChannel | discord.ForumChannel | discord.StageChannel


@app_commands.guild_only()
class Memories(commands.GroupCog, group_name="memories", group_description="What the bot remembers about this server"):
    def __init__(self, bot: commands.Bot) -> None:
        self.bot = bot

    async def interaction_check(self, interaction: discord.Interaction, /) -> bool:
        if interaction.guild_id is None:  # guild_only hides it in DMs; a stale client could still send it
            raise app_commands.NoPrivateMessage()
        return True

    async def ref(self, interaction: discord.Interaction) -> ListRef:
        assert interaction.guild_id is not None
        return await flows.manager_of(interaction).server_list(interaction.guild_id)

    async def memory_autocomplete(self, interaction: discord.Interaction, current: str) -> list[app_commands.Choice[int]]:
        if interaction.guild_id is None:
            return []
        ref = await self.ref(interaction)
        # members without Manage Server can only change their own, so only those are offered
        created_by = None if can_manage(interaction) else interaction.user.id
        return await flows.memory_choices(interaction, ref, current, created_by=created_by)

    @app_commands.command(name="list", description="This server's memories: desk or drawer, days unused, protection, tags")
    @app_commands.describe(page="Page to open (oldest memories first)")
    async def list_memories(self, interaction: discord.Interaction, page: app_commands.Range[int, 1, 10_000] = 1) -> None:
        ref = await self.ref(interaction)
        await flows.list_flow(
            interaction, ref, page, "Server memories", "No server memories yet. Add one with `/memories add`."
        )

    @app_commands.command(name="search", description="Find server memories by meaning or by text")
    @app_commands.describe(query="Words or a question, e.g. 'Juno's pets'")
    async def search(self, interaction: discord.Interaction, query: app_commands.Range[str, 1, 200]) -> None:
        await flows.search_flow(interaction, await self.ref(interaction), query, "Server memories")

    @app_commands.command(name="add", description="Teach the bot a fact about this server (opens a form if you leave text empty)")
    @app_commands.describe(
        text="The fact to remember; leave empty to write it in a form",
        tags="Optional tags, separated by spaces or commas (used when tagging is on)",
        channel="Only use this memory in one channel",
    )
    async def add(
        self,
        interaction: discord.Interaction,
        text: app_commands.Range[str, 1, 4000] | None = None,
        tags: app_commands.Range[str, 1, 300] | None = None,
        channel: AnyChannel | None = None,
    ) -> None:
        channels = (channel.id,) if channel is not None else ()
        await flows.add_flow(interaction, await self.ref(interaction), text, tags=tags, channel_ids=channels)

    @app_commands.command(name="edit", description="Change a server memory's text or tags (protects it from being forgotten)")
    @app_commands.describe(memory="The memory to edit: start typing its text")
    @app_commands.autocomplete(memory=memory_autocomplete)
    async def edit(self, interaction: discord.Interaction, memory: int) -> None:
        await flows.edit_flow(interaction, await self.ref(interaction), memory)

    @app_commands.command(name="delete", description="Delete a server memory for good (asks first)")
    @app_commands.describe(memory="The memory to delete: start typing its text")
    @app_commands.autocomplete(memory=memory_autocomplete)
    async def delete(self, interaction: discord.Interaction, memory: int) -> None:
        await flows.delete_flow(interaction, await self.ref(interaction), memory)

    @app_commands.command(name="history", description="A server memory's earlier texts: when, why and by whom each was changed")
    @app_commands.describe(memory="The memory: start typing its text", page="Page to open (newest changes first)")
    @app_commands.autocomplete(memory=memory_autocomplete)
    async def history(self, interaction: discord.Interaction, memory: int, page: app_commands.Range[int, 1, 10_000] = 1) -> None:
        await flows.history_flow(interaction, await self.ref(interaction), memory, page, "Server memory")

    @app_commands.command(name="restore", description="Make an earlier text of a server memory its text again")
    @app_commands.describe(memory="The memory: start typing its text", version="The version number its history shows")
    @app_commands.autocomplete(memory=memory_autocomplete)
    async def restore(self, interaction: discord.Interaction, memory: int, version: app_commands.Range[int, 1]) -> None:
        await flows.restore_flow(interaction, await self.ref(interaction), memory, version)

    @app_commands.command(name="export", description="Download this server's memories as a JSON file")
    async def export(self, interaction: discord.Interaction) -> None:
        await flows.export_flow(interaction, await self.ref(interaction), f"deskmate-server-{interaction.guild_id}")

    @app_commands.command(name="import", description="Load server memories from an export file (merge, or replace all)")
    @app_commands.describe(
        file="A JSON file made by /memories export",
        mode="merge: add what is new (default); replace: delete the current memories first (asks first)",
    )
    @app_commands.choices(
        mode=[
            app_commands.Choice(name="merge: add what is new", value="merge"),
            app_commands.Choice(name="replace: delete the current memories first", value="replace"),
        ]
    )
    async def import_memories(
        self, interaction: discord.Interaction, file: discord.Attachment, mode: str = "merge"
    ) -> None:
        guild = interaction.guild
        known = None
        if guild is not None and guild.channels:
            known = {channel.id for channel in guild.channels}
        await flows.import_flow(interaction, await self.ref(interaction), file, mode, known_channel_ids=known)

    @app_commands.command(name="stats", description="How many server memories are on the desk, in the drawer, and their size")
    async def stats(self, interaction: discord.Interaction) -> None:
        await flows.stats_flow(interaction, await self.ref(interaction), "Server memories")

    @app_commands.command(name="why", description="Why a reply used the memories, chat and documents it used")
    @app_commands.describe(message="Link or id of the bot's reply, or of the message it answered (default: latest reply here)")
    async def why(self, interaction: discord.Interaction, message: app_commands.Range[str, 1, 200] | None = None) -> None:
        """The receipt of the latest reply in this channel, or of the reply a link points to (ephemeral)."""
        chat_log = services_of(interaction).chat_log
        if message is None:
            raw = await chat_log.receipt(channel_id=interaction.channel_id)
            missing = "I have not replied in this channel yet (or its receipts were deleted)"
        else:
            ref = parse_message_ref(message)
            if ref is None:
                raise Refused("that is not a message link or id; use Copy Message Link on the bot's reply")
            raw = await chat_log.receipt_for(ref[2])
            missing = "I have no receipt for that message: it is not one of my replies, or it is too old"
        if raw is None or raw.get("guild_id") != interaction.guild_id:  # never show another server's receipt
            raise Refused(missing)
        receipt = Receipt.from_dict(raw)
        if receipt.channel_id != interaction.channel_id and not self.can_read(interaction, receipt.channel_id):
            raise Refused("you cannot read the channel of that reply, so I cannot show its receipt")
        ids = {*receipt.desk_ids, *(int(item["id"]) for item in receipt.recalled)}
        memories = await flows.manager_of(interaction).memories_by_id(ids)
        dormant_after = flows.manager_of(interaction).settings.dormant_after_days
        await reply(interaction, embed=receipt_embed(receipt, memories, interaction.user.id, dormant_after))

    @staticmethod
    def can_read(interaction: discord.Interaction, channel_id: int) -> bool:
        guild = interaction.guild
        channel = guild.get_channel_or_thread(channel_id) if guild is not None else None
        member = interaction.user
        if channel is None or not isinstance(member, discord.Member):
            return False
        permissions = channel.permissions_for(member)
        return permissions.view_channel and permissions.read_message_history


async def setup(bot: commands.Bot) -> None:
    await bot.add_cog(Memories(bot))
