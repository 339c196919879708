"""The Discord process: `DeskmateBot` and `run_bot`, what `python -m bot` starts when DISCORD_TOKEN is set.

The bot holds the process-wide services (database, memory core, command operations, reply
pipeline) and the cogs reach them through it. Start-up order matters: settings were validated
by the caller; `setup_hook` (after login, before the gateway connects) opens the database,
applies migrations, warms the embedder, loads the cogs and syncs the slash-command tree, so no
event is handled before the services exist.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import aiohttp
import discord
from discord import app_commands
from discord.ext import commands

from bot.config import Settings
from bot.db import Database
from bot.memory.documents import DocumentLibrary
from bot.memory.embeddings import BuiltinEmbedder, create_embedder
from bot.memory.history import HistoryIndex
from bot.memory.manage import MemoryManager
from bot.memory.recall import MemoryCore
from bot.memory.upkeep import Upkeep
from bot.pipeline import ReplyPipeline
from bot.redact import install as install_redaction
from bot.tail_sources import install as install_tail_sources

T = TypeVar("T")

log = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 30.0
# What the bot needs in a channel: see and read it, answer (also in threads), embeds for lists, files for exports.
INVITE_PERMISSIONS = discord.Permissions(
    view_channel=True,
    send_messages=True,
    send_messages_in_threads=True,
    embed_links=True,
    attach_files=True,
    read_message_history=True,
)
EXTENSIONS = ("cogs.memories", "cogs.personal", "cogs.settings", "cogs.privacy", "cogs.chat", "cogs.documents")


def deskmate_intents() -> discord.Intents:
    """Only what the bot uses. Message content is privileged: it must be switched on in the Developer Portal."""
    intents = discord.Intents.none()
    intents.guilds = True
    intents.guild_messages = True
    intents.dm_messages = True
    intents.message_content = True
    return intents


def invite_url(application_id: int) -> str:
    """The link that adds the bot to a server with the permissions it needs and its slash commands."""
    return discord.utils.oauth_url(application_id, permissions=INVITE_PERMISSIONS, scopes=("bot", "applications.commands"))


MAX_RATELIMIT_WAIT_S = 30.0  # the smallest value discord.py accepts


def shard_options(settings: Settings) -> dict[str, Any]:
    """AutoShardedBot's shard_count/shard_ids from SHARD_COUNT/SHARD_IDS (unset: Discord's recommendation, all here).

    Several processes split one bot by giving each the same SHARD_COUNT and its own SHARD_IDS; they
    share the database, whose locks keep the memory rules exact across processes.
    """
    options: dict[str, Any] = {}
    if settings.shard_count is not None:
        options["shard_count"] = settings.shard_count
        if settings.shard_ids is not None:
            options["shard_ids"] = list(settings.shard_ids)
    return options


class DeskmateTree(app_commands.CommandTree):
    """Every command error ends as one ephemeral sentence for the user (bugs also go to the log)."""

    async def on_error(self, interaction: discord.Interaction, error: app_commands.AppCommandError, /) -> None:
        from cogs.ui import report_error

        await report_error(interaction, error)


class DeskmateBot(commands.AutoShardedBot):
    """The bot. Services can be injected (tests, `python -m bot commands`); otherwise `setup_hook` opens them."""

    def __init__(
        self,
        settings: Settings,
        *,
        database: Database | None = None,
        core: MemoryCore | None = None,
        pipeline: ReplyPipeline | None = None,
        sync_commands: bool = True,
        **options: Any,
    ) -> None:
        options.setdefault("intents", deskmate_intents())
        for key, value in shard_options(settings).items():
            options.setdefault(key, value)
        # A 429 asking to wait longer than this fails that one request (logged) instead of stalling its handler.
        options.setdefault("max_ratelimit_timeout", MAX_RATELIMIT_WAIT_S)
        # Deskmate never joins voice: skip discord.py's warnings about the optional voice libraries.
        discord.VoiceClient.warn_nacl = discord.VoiceClient.warn_dave = False
        super().__init__(
            # Slash commands only; a mention is a chat message for the pipeline, never a prefix command.
            command_prefix=commands.when_mentioned,
            help_command=None,
            tree_cls=DeskmateTree,
            allowed_mentions=discord.AllowedMentions.none(),
            **options,
        )
        self.settings = settings
        self.database = database
        self._owns_database = database is None
        self.core = core
        self.manager: MemoryManager | None = MemoryManager(core, import_max_bytes=settings.import_max_bytes) if core else None
        self.pipeline = pipeline
        self._owns_pipeline = pipeline is None
        self.sync_commands = sync_commands
        self._stop_background: asyncio.Event | None = None
        self._background: list[asyncio.Task[None]] = []
        # issue 4: chat-history recall, documents, and the vectors of everything searchable
        self.history: HistoryIndex | None = None
        self.documents: DocumentLibrary | None = None
        self.upkeep: Upkeep | None = None

    # --- start-up -------------------------------------------------------------------------------

    async def open_services(self) -> None:
        """Database (embedded unless DATABASE_URL), embedder (warmed up), memory core, pipeline."""
        settings = self.settings
        if self.core is None:
            if self.database is None:
                self.database = await Database.open(settings)
            builtin = None
            if settings.embedding_provider == "builtin":
                builtin = BuiltinEmbedder()
                await asyncio.to_thread(builtin.warm_up)
            self.core = MemoryCore(self.database.pool, create_embedder(settings, builtin), settings)
        if self.manager is None:
            self.manager = MemoryManager(self.core, import_max_bytes=settings.import_max_bytes)
        if self.pipeline is None:
            self.pipeline = ReplyPipeline(self.core, settings)
            await self.pipeline.start()
        if self.upkeep is None:
            self.history = HistoryIndex(self.core)
            self.documents = DocumentLibrary(self.core)
            self.upkeep = Upkeep(self.core, self.history)
            install_tail_sources(self.pipeline.tail_sources, self.history, self.documents)
        if self.user is not None:
            self.pipeline.bot_user_id = self.user.id

    async def load_cogs(self) -> None:
        for extension in EXTENSIONS:
            await self.load_extension(extension)

    async def sync_tree(self) -> list[app_commands.AppCommand]:
        """Global sync (can take a while to show up), or instantly to DEV_GUILD_ID while developing."""
        if self.settings.dev_guild_id:
            guild = discord.Object(id=self.settings.dev_guild_id)
            self.tree.copy_global_to(guild=guild)
            synced = await self.tree.sync(guild=guild)
            log.info("Synced %d slash commands to the development server %s", len(synced), self.settings.dev_guild_id)
        else:
            synced = await self.tree.sync()
            log.info("Synced %d slash commands globally", len(synced))
        return synced

    async def setup_hook(self) -> None:
        await self.open_services()
        await self.load_cogs()
        if self.sync_commands:
            await self.sync_tree()
        assert self.core is not None
        self._stop_background = asyncio.Event()
        assert self.upkeep is not None  # chunks history and keeps every vector in the current embedding space
        self._background.append(asyncio.create_task(self.upkeep.run(self._stop_background), name="upkeep"))
        self._background.append(asyncio.create_task(self._heartbeat(self._stop_background), name="heartbeat"))

    async def _touch_heartbeat(self) -> None:
        if not self.is_ready() or self.is_closed():
            return
        path = self.settings.data_dir / "heartbeat"
        try:
            await asyncio.to_thread(path.write_text, f"{int(time.time())}\n")
        except OSError as exc:
            log.debug("Cannot write the heartbeat file %s: %s", path, exc)

    async def _heartbeat(self, stop: asyncio.Event) -> None:
        """Touch DATA_DIR/heartbeat while connected, for the Docker healthcheck (a stale file = unhealthy)."""
        while not stop.is_set():
            await self._touch_heartbeat()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), HEARTBEAT_INTERVAL_S)

    async def on_ready(self) -> None:
        await self._touch_heartbeat()
        assert self.user is not None
        log.info("Connected as %s (id %s) in %d servers", self.user, self.user.id, len(self.guilds))
        if self.shard_count is not None:
            log.info("Running shards %s of %d", ", ".join(map(str, self.shard_ids or range(self.shard_count))), self.shard_count)
        log.info("Invite link: %s", invite_url(self.application_id or self.user.id))

    async def on_message(self, message: discord.Message, /) -> None:
        """No prefix commands: messages belong to the chat cog's listener alone."""

    # --- shutdown -------------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop background work, disconnect, then close the pipeline, the pool and the embedded server."""
        if self._stop_background is not None:
            self._stop_background.set()
        for task in self._background:
            task.cancel()
        for task in self._background:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._background.clear()
        await super().close()
        if self.pipeline is not None and self._owns_pipeline:
            await self.pipeline.close()
            self.pipeline = None
        if self.database is not None and self._owns_database:
            await self.database.close()
            self.database = None


class StartupError(RuntimeError):
    """Discord refused the bot; the message says what to change."""


def run_event_loop(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)`, on uvloop's event loop when it is installed (requirements.txt pins it, except on
    Windows, which it does not support). It is a drop-in asyncio loop written in C: in the throughput
    benchmark it took ≈ 0.9 ms of CPU off each reply (≈ 15% of the pipeline's own Python). Without it the
    standard loop runs the same code."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


async def run_bot(settings: Settings, *, bot: DeskmateBot | None = None) -> int:
    """Run until SIGINT/SIGTERM or a fatal error, then shut down cleanly. Returns the exit status."""
    install_redaction(settings)
    bot = bot or DeskmateBot(settings)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not on the main thread / Windows
            loop.add_signal_handler(signum, stop.set)
    try:
        async with bot:
            runner = asyncio.create_task(bot.start(settings.discord_token), name="discord")
            stopper = asyncio.create_task(stop.wait(), name="signals")
            await asyncio.wait({runner, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if stopper.done():
                log.info("Shutting down")
                await bot.close()
            stopper.cancel()
            try:
                await runner
            except discord.LoginFailure as exc:
                raise StartupError(
                    "Discord rejected DISCORD_TOKEN; copy the token again from the Bot page of your application"
                ) from exc
            except (aiohttp.ClientError, OSError) as exc:
                raise StartupError(f"cannot reach Discord ({exc}); check this machine's network connection") from exc
            except discord.PrivilegedIntentsRequired as exc:
                raise StartupError(
                    "Discord refused the Message Content intent: switch on 'Message Content Intent' on the Bot page "
                    "of your application in the Developer Portal, then start again"
                ) from exc
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signum)
    return 0
