"""The Discord process: `DeskmateBot` and `run_bot`, what `python -m bot` starts when DISCORD_TOKEN is set.

`run_bot` opens the services first (`bot.services.open_services`: database, migrations, the
warmed-up embedder, every service) and hands them to the bot, so no event is ever handled before
they exist; the cogs reach them as `bot.services`. `setup_hook` (after login, before the gateway
connects) loads the cogs, syncs the slash-command tree and starts the background work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import aiohttp
import discord
from discord import app_commands
from discord.ext import commands

from bot import shutdown
from bot.config import Settings
from bot.redact import install as install_redaction
from bot.services import Services, open_services

T = TypeVar("T")

log = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 30.0
SYNC_RETRY_FIRST_S = 30.0  # a failed slash-command sync is tried again after this, then twice as long each time
SYNC_RETRY_MAX_S = 3600.0
# What the bot needs in a channel: see and read it, answer (also in threads), embeds for lists, files for exports.
INVITE_PERMISSIONS = discord.Permissions(
    view_channel=True,
    send_messages=True,
    send_messages_in_threads=True,
    embed_links=True,
    attach_files=True,
    read_message_history=True,
)
EXTENSIONS = (
    "cogs.errors", "cogs.memories", "cogs.personal", "cogs.settings", "cogs.privacy", "cogs.chat", "cogs.documents",
    "cogs.summaries",
)


def setup_logging(settings: Settings) -> None:
    """discord.py's own log format, for the bot and its libraries alike."""
    discord.utils.setup_logging(level=logging.getLevelName(settings.log_level), root=True)


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


def one_line(text: str, limit: int = 300) -> str:
    """Discord lists every refused field of a request on its own line (a rejected command tree: dozens of them);
    a log line holds the first ones, and how many there were in all."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    joined = "; ".join(lines)
    if len(joined) <= limit:
        return joined
    return f"{joined[:limit].rstrip()}… ({len(lines)} lines in all)"


class OneLineReconnects(logging.Filter):
    """discord.py logs each attempt to reconnect to the gateway as an ERROR with the whole traceback of why it lost
    the connection: a network outage of a few minutes filled the log with screens of identical tracebacks. Such a
    record becomes one WARNING line that keeps the reason (the bot reconnects by itself; nothing is wrong with it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None and str(record.msg).startswith("Attempting a reconnect"):
            exc = record.exc_info[1]
            reason = one_line(str(exc), 200) or "no detail"
            record.msg, record.args = f"{record.getMessage()} ({type(exc).__name__}: {reason})", None
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
        return True


def quiet_reconnects(logger: logging.Logger) -> None:
    if not any(isinstance(existing, OneLineReconnects) for existing in logger.filters):
        logger.addFilter(OneLineReconnects())


def guard_gateway_parsers(parsers: dict[str, Callable[[Any], None]]) -> None:
    """Make every gateway event parser skip an event it cannot read, with one log line, instead of ending the bot.

    discord.py parses each event inside the shard's read loop: an exception there (a field of the wrong type, say)
    ends the connection's worker and with it the whole process. Discord-compatible servers send what Discord does
    not, e.g. `"guild_id": null` on a direct message, which discord.py reads as a server id. A missing server is
    what such a null means, so it is dropped before parsing and the message is read as the DM it is; anything else
    that cannot be read is that one event lost, logged, and the bot goes on.
    """
    for event, parse in list(parsers.items()):
        if not getattr(parse, "guarded", False):
            parsers[event] = _guarded_parser(event, parse)


def _guarded_parser(event: str, parse: Callable[[Any], None]) -> Callable[[Any], None]:
    def guarded(data: Any) -> None:
        if isinstance(data, dict) and "guild_id" in data and data["guild_id"] is None:
            del data["guild_id"]
        try:
            parse(data)
        except Exception as exc:
            log.warning("Skipped a %s event from Discord that could not be read (%s: %s)", event, type(exc).__name__,
                        str(exc).splitlines()[0][:200] if str(exc) else "no detail")

    guarded.guarded = True  # type: ignore[attr-defined]  # a marker on the function, so a parser is wrapped once
    return guarded


class DeskmateBot(commands.AutoShardedBot):
    """The bot, on services that are already open (discord.py's "resources opened in main" pattern)."""

    def __init__(self, services: Services, *, sync_commands: bool = True, **options: Any) -> None:
        settings = services.settings
        options.setdefault("intents", deskmate_intents())
        for key, value in shard_options(settings).items():
            options.setdefault(key, value)
        # A 429 asking to wait longer than this fails that one request (logged) instead of stalling its handler.
        options.setdefault("max_ratelimit_timeout", MAX_RATELIMIT_WAIT_S)
        # Deskmate never joins voice: skip discord.py's warnings about the optional voice libraries.
        discord.VoiceClient.warn_nacl = discord.VoiceClient.warn_dave = False
        super().__init__(
            # Slash commands only; a mention is a chat message for the chat cog, never a prefix command.
            command_prefix=commands.when_mentioned,
            help_command=None,
            allowed_mentions=discord.AllowedMentions.none(),
            **options,
        )
        self.settings = settings
        self.services = services
        self.sync_commands = sync_commands
        guard_gateway_parsers(self._connection.parsers)
        for name in ("discord.shard", "discord.client"):
            quiet_reconnects(logging.getLogger(name))
        self._stop_background: asyncio.Event | None = None
        self._background: list[asyncio.Task[None]] = []

    # --- start-up -------------------------------------------------------------------------------

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

    async def _try_sync(self, retry_in: float | None) -> bool:
        """One sync attempt; a refusal or a network error is one log line, never the end of the bot.

        The bot serves messages without its slash commands meanwhile (and with the ones synced earlier,
        which Discord keeps): a rejected definition, a 429 or an outage must not take the chat down.
        """
        try:
            await self.sync_tree()
        except discord.HTTPException as exc:
            detail = one_line(exc.text or str(exc))
            why = f"Discord answered {exc.status}" + (f" (code {exc.code})" if exc.code else "") + f": {detail}"
        except discord.RateLimited as exc:  # a 429 asking to wait longer than MAX_RATELIMIT_WAIT_S
            why = f"Discord rate-limited it for {exc.retry_after:.0f} s"
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            why = f"cannot reach Discord ({type(exc).__name__}: {one_line(str(exc))})"
        else:
            return True
        later = f"retrying in {retry_in:g} s" if retry_in is not None else "retrying later"
        log.warning("Could not sync the slash commands, %s; %s (chat replies go on meanwhile)", why, later)
        return False

    async def _sync_later(self, stop: asyncio.Event) -> None:
        """Retry a failed command sync with backoff: SYNC_RETRY_FIRST_S, doubling up to SYNC_RETRY_MAX_S."""
        delay = SYNC_RETRY_FIRST_S
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            if stop.is_set():
                return
            delay = min(delay * 2, SYNC_RETRY_MAX_S)
            if await self._try_sync(delay):
                return

    async def setup_hook(self) -> None:
        if self.user is not None:
            self.services.chat.bot_user_id = self.user.id
        await self.load_cogs()
        self._stop_background = asyncio.Event()
        if self.sync_commands and not await self._try_sync(SYNC_RETRY_FIRST_S):
            self._background.append(asyncio.create_task(self._sync_later(self._stop_background), name="command-sync"))
        # chunks history and keeps every vector in the current embedding space
        self._background.append(asyncio.create_task(self.services.upkeep.run(self._stop_background), name="upkeep"))
        self._background.append(asyncio.create_task(self._heartbeat(self._stop_background), name="heartbeat"))

    def connected(self) -> bool:
        """Ready, and every shard of this process has an open gateway connection (not reconnecting)."""
        if not self.is_ready() or self.is_closed() or not self.shards:
            return False
        return all(not shard.is_closed() for shard in self.shards.values())

    async def _touch_heartbeat(self) -> None:
        if not self.connected():  # a bot that cannot reach Discord is unhealthy, whatever it did before
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
        """Stop background work and disconnect (the services are closed by whoever opened them)."""
        if self._stop_background is not None:
            self._stop_background.set()
        for task in self._background:
            task.cancel()
        for task in self._background:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._background.clear()
        await super().close()


class StartupError(RuntimeError):
    """Discord refused the bot; the message says what to change."""


def run_event_loop(main: Coroutine[Any, Any, T]) -> T:
    """`shutdown.run(main)` (a shutdown signal cancels `main`), on uvloop's event loop when it is installed
    (requirements.txt pins it, except on Windows, which it does not support). It is a drop-in asyncio loop written in
    C: in the throughput benchmark it took ≈ 0.9 ms of CPU off each reply (≈ 15% of the pipeline's own Python).
    Without it the standard loop runs the same code."""
    try:
        import uvloop
    except ImportError:
        return shutdown.run(main)
    return shutdown.run(main, loop_factory=uvloop.new_event_loop)


async def run_bot(settings: Settings, *, on_start: Callable[[DeskmateBot], object] | None = None, **options: Any) -> int:
    """Open the services, run the bot on them until SIGTERM/SIGHUP/SIGINT or a fatal error, then shut down cleanly.

    Returns the exit status. `on_start` sees the bot before it connects (tests wait on it).
    """
    install_redaction(settings)
    async with open_services(settings) as services:
        bot = DeskmateBot(services, **options)
        if on_start is not None:
            on_start(bot)
        return await _run(bot, settings)


async def _run(bot: DeskmateBot, settings: Settings) -> int:
    """Run the bot until it ends or a shutdown signal (SIGTERM, SIGHUP, SIGINT) asks it to close: the gateway is
    closed first, then `run_bot` closes the services. Before this point a signal cancels the start-up instead."""
    stop = asyncio.Event()
    with shutdown.on_signal(stop.set):
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
    return 0
