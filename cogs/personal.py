"""`/personal memories ...`: the caller's own personal memories.

A personal memory is tied to one persona (this server's, or the DM persona in direct messages)
or Global (used wherever its owner talks to the bot). Only the owner sees and changes them, so
every answer is ephemeral, and a memory id that is not the caller's is simply "not there".
"""

from __future__ import annotations

import discord
from discord import app_commands
from discord.ext import commands

from bot.memory.lists import ListRef, Scope
from bot.servers.models import Privacy
from cogs import memory_flows as flows
from cogs.ui import actor_of, reply, services_of

SCOPE_CHOICES = [
    app_commands.Choice(name="Global and this server's persona (what the bot uses here)", value=Scope.ALL.value),
    app_commands.Choice(name="Global only (used everywhere)", value=Scope.GLOBAL.value),
    app_commands.Choice(name="This server's persona only (or DMs, in DMs)", value=Scope.PERSONA.value),
]
ADD_SCOPE_CHOICES = [
    app_commands.Choice(name="This server's persona (or DMs, in DMs)", value=Scope.PERSONA.value),
    app_commands.Choice(name="Global: everywhere you talk to the bot", value=Scope.GLOBAL.value),
]


@app_commands.allowed_contexts(guilds=True, dms=True, private_channels=False)
class Personal(commands.GroupCog, group_name="personal", group_description="Your own data with the bot"):
    memories = app_commands.Group(name="memories", description="What the bot remembers about you (only you can see these)")

    def __init__(self, bot: commands.Bot) -> None:
        self.bot = bot

    async def ref(self, interaction: discord.Interaction, scope: str = Scope.ALL.value) -> ListRef:
        return await flows.manager_of(interaction).personal_list(interaction.user.id, interaction.guild_id, Scope(scope))

    async def where_unused(self, interaction: discord.Interaction) -> str | None:
        """A note when the caller's personal memories are not used here (privacy `full`, or switched off here)."""
        servers = services_of(interaction).servers
        if await servers.privacy(interaction.user.id) == Privacy.FULL:
            return "Note: your privacy level is `full`, so the bot does not use your personal memories (see `/privacy level`)."
        if interaction.guild_id is not None and not (await servers.guild_settings(interaction.guild_id)).personal_memories:
            return "Note: this server has personal memories switched off, so the bot does not use them here."
        return None

    async def memory_autocomplete(self, interaction: discord.Interaction, current: str) -> list[app_commands.Choice[int]]:
        return await flows.memory_choices(interaction, await self.ref(interaction), current)

    @memories.command(name="list", description="Your personal memories: desk or drawer, days unused, Global or this persona")
    @app_commands.describe(page="Page to open (oldest memories first)", scope="Which of your lists to show")
    @app_commands.choices(scope=SCOPE_CHOICES)
    async def list_memories(
        self, interaction: discord.Interaction, page: app_commands.Range[int, 1, 10_000] = 1, scope: str = Scope.ALL.value
    ) -> None:
        ref = await self.ref(interaction, scope)
        await flows.list_flow(
            interaction, ref, page, "Your personal memories", "No personal memories here. Add one with `/personal memories add`."
        )

    @memories.command(name="search", description="Find your personal memories by meaning or by text")
    @app_commands.describe(query="Words or a question", scope="Which of your lists to search")
    @app_commands.choices(scope=SCOPE_CHOICES)
    async def search(
        self, interaction: discord.Interaction, query: app_commands.Range[str, 1, 200], scope: str = Scope.ALL.value
    ) -> None:
        await flows.search_flow(interaction, await self.ref(interaction, scope), query, "Your personal memories")

    @memories.command(name="add", description="Tell the bot something about you (opens a form if you leave text empty)")
    @app_commands.describe(
        text="What the bot should remember about you; leave empty to write it in a form",
        scope="Tie it to this server's persona, or make it Global",
        tags="Optional tags, separated by spaces or commas",
    )
    @app_commands.choices(scope=ADD_SCOPE_CHOICES)
    async def add(
        self,
        interaction: discord.Interaction,
        text: app_commands.Range[str, 1, 4000] | None = None,
        scope: str = Scope.PERSONA.value,
        tags: app_commands.Range[str, 1, 300] | None = None,
    ) -> None:
        ref = await self.ref(interaction)
        note = await self.where_unused(interaction)
        await flows.add_flow(interaction, ref, text, tags=tags, is_global=scope == Scope.GLOBAL.value, note=note)

    @memories.command(name="edit", description="Change one of your personal memories (protects it from being forgotten)")
    @app_commands.describe(memory="The memory to edit: start typing its text")
    @app_commands.autocomplete(memory=memory_autocomplete)
    async def edit(self, interaction: discord.Interaction, memory: int) -> None:
        await flows.edit_flow(interaction, await self.ref(interaction), memory)

    @memories.command(name="delete", description="Delete one of your personal memories for good (asks first)")
    @app_commands.describe(memory="The memory to delete: start typing its text")
    @app_commands.autocomplete(memory=memory_autocomplete)
    async def delete(self, interaction: discord.Interaction, memory: int) -> None:
        await flows.delete_flow(interaction, await self.ref(interaction), memory)

    @memories.command(name="move", description="Make a personal memory Global, or tie it to this server's persona")
    @app_commands.describe(memory="The memory to move: start typing its text", to="Where it should apply")
    @app_commands.autocomplete(memory=memory_autocomplete)
    @app_commands.choices(to=ADD_SCOPE_CHOICES)
    async def move(self, interaction: discord.Interaction, memory: int, to: str) -> None:
        ref = await self.ref(interaction)
        to_global = to == Scope.GLOBAL.value
        moved = await flows.manager_of(interaction).move(ref, memory, to_global=to_global, actor=actor_of(interaction))
        where = "Global: the bot can use it wherever you talk to it" if moved.is_global else "tied to this server's persona"
        await reply(interaction, f"Memory #{moved.id} is now {where}. It is protected from being forgotten.")

    @memories.command(name="history", description="One of your memories' earlier texts: when, why and by whom each changed")
    @app_commands.describe(memory="The memory: start typing its text", page="Page to open (newest changes first)")
    @app_commands.autocomplete(memory=memory_autocomplete)
    async def history(self, interaction: discord.Interaction, memory: int, page: app_commands.Range[int, 1, 10_000] = 1) -> None:
        await flows.history_flow(interaction, await self.ref(interaction), memory, page, "Your memory")

    @memories.command(name="restore", description="Make an earlier text of one of your memories its text again")
    @app_commands.describe(memory="The memory: start typing its text", version="The version number its history shows")
    @app_commands.autocomplete(memory=memory_autocomplete)
    async def restore(self, interaction: discord.Interaction, memory: int, version: app_commands.Range[int, 1]) -> None:
        await flows.restore_flow(interaction, await self.ref(interaction), memory, version)

    @memories.command(name="export", description="Download your personal memories as a JSON file")
    @app_commands.describe(scope="Which of your lists to export")
    @app_commands.choices(scope=SCOPE_CHOICES)
    async def export(self, interaction: discord.Interaction, scope: str = Scope.ALL.value) -> None:
        await flows.export_flow(interaction, await self.ref(interaction, scope), "deskmate-personal")

    @memories.command(name="import", description="Load your personal memories from an export file (merge, or replace)")
    @app_commands.describe(
        file="A JSON file made by /personal memories export",
        mode="merge: add what is new (default); replace: delete your memories here first (asks first)",
    )
    @app_commands.choices(
        mode=[
            app_commands.Choice(name="merge: add what is new", value="merge"),
            app_commands.Choice(name="replace: delete your current memories here first", value="replace"),
        ]
    )
    async def import_memories(self, interaction: discord.Interaction, file: discord.Attachment, mode: str = "merge") -> None:
        await flows.import_flow(interaction, await self.ref(interaction), file, mode)

    @memories.command(name="stats", description="How many of your memories are on the desk, in the drawer, and their size")
    async def stats(self, interaction: discord.Interaction) -> None:
        await flows.stats_flow(interaction, await self.ref(interaction), "Your personal memories here")


async def setup(bot: commands.Bot) -> None:
    await bot.add_cog(Personal(bot))
