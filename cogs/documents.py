"""`/documents ...`: reference files the bot reads when a message touches them.

An admin (Manage Server) adds a `.txt` or `.md` file; it is split into passages and embedded, and
each reply in this server adds the passages that match the message to the end of its prompt.
Everyone may list the documents (they are what the bot reads here); adding and deleting need
Manage Server. Every answer is ephemeral.
"""

from __future__ import annotations

import discord
from discord import app_commands
from discord.ext import commands

from bot.documents.service import DocumentLibrary, describe_size
from cogs.ui import COLOUR, actor_of, clip, defer_and_read, reply, sentence, services_of


def library_of(interaction: discord.Interaction) -> DocumentLibrary:
    return services_of(interaction).documents


@app_commands.guild_only()
class Documents(commands.GroupCog, group_name="documents", group_description="Files the bot reads when a message touches them"):
    def __init__(self, bot: commands.Bot) -> None:
        self.bot = bot

    async def interaction_check(self, interaction: discord.Interaction, /) -> bool:
        if interaction.guild_id is None:
            raise app_commands.NoPrivateMessage()
        return True

    def guild_id(self, interaction: discord.Interaction) -> int:
        assert interaction.guild_id is not None
        return interaction.guild_id

    async def document_autocomplete(self, interaction: discord.Interaction, current: str) -> list[app_commands.Choice[int]]:
        if interaction.guild_id is None:
            return []
        wanted = current.strip().lstrip("#").casefold()
        documents = await library_of(interaction).list(interaction.guild_id)
        return [
            app_commands.Choice(name=clip(f"#{doc.id} · {doc.name}", 100), value=doc.id)
            for doc in documents
            if wanted in doc.name.casefold() or wanted == str(doc.id)
        ][:25]

    @app_commands.command(
        name="add", description="Add a .txt or .md file the bot reads when a message touches it (Manage Server)"
    )
    @app_commands.describe(file="A UTF-8 .txt or .md file; a file with the same name replaces the old one")
    async def add(self, interaction: discord.Interaction, file: discord.Attachment) -> None:
        library = library_of(interaction)
        library.check_upload(actor_of(interaction), file.size)  # before the download
        raw = await defer_and_read(interaction, file)
        added = await library.add(self.guild_id(interaction), file.filename, raw, actor_of(interaction))
        verb = "Replaced" if added.replaced else "Added"
        lines = [f"{verb} **{discord.utils.escape_markdown(added.name)}** (#{added.id}): {added.passages} passages."]
        if added.embedded < added.passages:
            lines.append(
                f"{added.passages - added.embedded} passages are waiting for a vector and will be embedded in the background."
            )
        lines.append("Replies in this server now add the passages that match a message (see `/memories why`).")
        await reply(interaction, "\n".join(lines))

    @app_commands.command(name="list", description="The documents the bot reads in this server")
    async def list_documents(self, interaction: discord.Interaction) -> None:
        documents = await library_of(interaction).list(self.guild_id(interaction))
        if not documents:
            await reply(interaction, "No documents yet. Someone with Manage Server can add one with `/documents add`.")
            return
        embed = discord.Embed(title="Documents", colour=COLOUR)
        for doc in documents[:25]:
            status = "embedded" if doc.embedded == doc.passages else f"{doc.passages - doc.embedded} waiting for a vector"
            added_by = f" by <@{doc.added_by}>" if doc.added_by else ""
            embed.add_field(
                name=clip(f"#{doc.id} · {doc.name}", 256),
                value=f"{describe_size(doc.size_bytes)} · {doc.passages} passages · {status}\n"
                f"added {discord.utils.format_dt(doc.created_at, 'd')}{added_by}",
                inline=False,
            )
        embed.set_footer(text=f"{len(documents)} documents · a reply adds the passages that match its message")
        await reply(interaction, embed=embed)

    @app_commands.command(name="delete", description="Delete a document and its passages (Manage Server)")
    @app_commands.describe(document="The document: start typing its name")
    @app_commands.autocomplete(document=document_autocomplete)
    async def delete(self, interaction: discord.Interaction, document: int) -> None:
        name = await library_of(interaction).delete(self.guild_id(interaction), document, actor_of(interaction))
        await reply(interaction, sentence(f"deleted the document {name} (#{document}) and its passages"))


async def setup(bot: commands.Bot) -> None:
    await bot.add_cog(Documents(bot))
