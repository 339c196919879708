"""The one place a slash command's error becomes what the user reads: installed on the command tree by this
cog's `setup`, so every command, view and modal answers a refusal with one ephemeral sentence and a bug
with a short apology (the traceback goes to the log)."""

from __future__ import annotations

from discord.ext import commands

from cogs.ui import report_error


class Errors(commands.Cog):
    def __init__(self, bot: commands.Bot) -> None:
        self.bot = bot
        self._previous = bot.tree.on_error
        bot.tree.on_error = report_error  # type: ignore[assignment]

    async def cog_unload(self) -> None:
        self.bot.tree.on_error = self._previous  # type: ignore[method-assign]


async def setup(bot: commands.Bot) -> None:
    await bot.add_cog(Errors(bot))
