"""The console chat: the real reply pipeline and memory core in a terminal.

You talk as a user in a local server; lines starting with `/` are commands, anything else is a
message to the bot. It prints what Discord would show: the reply, memory notices, command answers.
With no chat model configured the bot's turn says so and shows what it would have sent (the desk,
what was recalled and why, token counts). It reads standard input line by line, so it can be
scripted: `printf 'hello\\n/day\\n' | python -m bot console`.

People, channels and the local server get stable ids derived from their names, so memories
survive restarts (the database lives under DATA_DIR, or at DATABASE_URL). `/day` moves a simulated
UTC date forward; the offset is kept in DATA_DIR/console.json for the next session.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TextIO, cast

from bot.chat.messages import IncomingMessage, UserRef, storable
from bot.chat.model import chat_configured
from bot.chat.notices import Notices, notice_line
from bot.chat.receipts import ReplyStatus
from bot.clock import ManualClock
from bot.config import Settings
from bot.console_session import BOT_USER_ID, MENTION, SUMMARIES_USAGE, CommandError, ConsoleSession, ServerCommands, local_id
from bot.embeddings.providers import BuiltinEmbedder, create_embedder
from bot.errors import Refusal
from bot.failures import database_sentence, first_line
from bot.memory.history import describe_version
from bot.memory.lists import ListRef, Scope, looks_like_instruction
from bot.memory.models import SaveResult, Source
from bot.outgoing import neutralize_mentions
from bot.services import open_services

log = logging.getLogger(__name__)

HELP = """Type a message to talk to the bot (as if you @mentioned it). Commands:
  /say TEXT            post without addressing the bot (it answers only to its name or in auto-reply channels)
  /as NAME             talk as another user            /channel NAME   move to another channel
  /dm                  talk to the bot in a DM          /day [N]        advance the simulated UTC date
  /memories [PAGE]     this server's memories           /mine [PAGE]    your personal memories
  /remember TEXT       add a server memory              /me TEXT        add a personal memory (this persona)
  /global TEXT         add a Global personal memory     /edit ID TEXT   change a memory
  /forget ID           delete a memory                  /privacy none|partial|full
  /settings [KEY VALUE]  show or change server settings (notices, verbosity, self-teaching, member-teaching,
                       personal-memories, tagging: on/off; auto-reply on/off for this channel; log-channel NAME)
  /block NAME, /unblock NAME                            /persona [name TEXT | prompt TEXT]
  /lore [add TEXT | remove ID]                          /receipt, /why  why the last reply used what it used
  /receipts [on|off]   a receipt after every reply (off by default)
  /documents [add PATH | delete ID]  documents of the local server     /history [on|off]  this channel's chat history
  /history ID [PAGE]   a memory's earlier texts         /restore ID VERSION  make an earlier text current again
  /stats [mine]        the memory viewer (writes a chart to DATA_DIR)   /rebuild        embed everything now, with progress
  /summaries [show ID | regenerate ID | backfill [DAYS] | on|off]  this channel's day and week summaries (/day ends a day)
  /who                 where you are                    /help, /quit"""


# What each command accepts after its name (a regular expression over the rest of the line), with its usage:
# anything else is refused with the usage instead of being ignored. Commands taking free text are not listed.
OPTIONS: dict[str, tuple[str, str]] = {
    "/help": (r"", "/help"),
    "/who": (r"", "/who"),
    "/dm": (r"", "/dm"),
    "/quit": (r"", "/quit"),
    "/receipt": (r"", "/receipt"),
    "/why": (r"", "/why"),
    "/rebuild": (r"", "/rebuild"),
    "/receipts": (r"(on|off)?", "/receipts [on|off]"),
    "/memories": (r"\d*", "/memories [PAGE]"),
    "/mine": (r"\d*", "/mine [PAGE]"),
    "/day": (r"\d*", "/day [N]"),
    "/stats": (r"(mine)?", "/stats [mine]"),
    "/privacy": (r"(none|partial|full)?", "/privacy none|partial|full"),
    "/history": (r"(on|off|#?\d+( \d+)?)?", "/history [on|off] (chat history) or /history ID [PAGE] (a memory's versions)"),
    "/restore": (r"#?\d+ #?\d+", "/restore ID VERSION"),
    "/summaries": (r"((show|regenerate) #?\d+|backfill( \d+)?|on|off)?", SUMMARIES_USAGE),
}


def refuse_unknown_options(command: str, rest: str) -> None:
    """A mistyped option is refused with the usage: silently ignoring it would do something else than asked."""
    accepted = OPTIONS.get(command)
    if accepted is not None and not re.fullmatch(accepted[0], rest, flags=re.IGNORECASE | re.ASCII):
        raise CommandError(f"{command} does not take {rest!r}; usage: {accepted[1]}")


MAX_DAY_OFFSET = 36_525  # 100 years: dates stay far from the end of the calendar (year 9999) and of every week sum


class ConsoleChat:
    """The console chat: one input line at a time, a message to the bot or a command. The commands live in parts
    that share this session: the conversation and where you are here, memories in `MemoryCommands`, the server
    and its people in `ServerCommands`."""

    def __init__(self, session: ConsoleSession) -> None:
        self.session = session
        self.memory = MemoryCommands(session)
        self.server = ServerCommands(session)

    async def handle(self, line: str) -> bool:
        """Run one input line; False means quit. A bad line prints an error and the session goes on."""
        self.session.tick()
        line = storable(line)
        if not line:
            return True
        if not line.startswith("/"):
            await self.post(line, addressed=True)
            return True
        command, _, rest = line.partition(" ")
        rest = rest.strip()
        if command in ("/quit", "/exit"):
            return False
        handler = self.handler_of(command)
        if handler is None:
            self.session.show(f"unknown command {command}; /help lists them")
            return True
        try:
            refuse_unknown_options(command, rest)
            await handler(rest)
        except Refusal as exc:  # one handler for the whole family: a typo, a rule, a bad file
            self.session.show(f"error: {exc.sentence}")
        return True

    def handler_of(self, command: str) -> Callable[[str], Awaitable[None]] | None:
        """The part that runs a command: the chat's own first, then the memory commands, then the server's."""
        name = "cmd_" + command[1:].replace("-", "_")
        for part in (self, self.memory, self.server):
            handler = getattr(part, name, None)
            if handler is not None:
                return cast("Callable[[str], Awaitable[None]]", handler)
        return None

    async def post(self, text: str, *, addressed: bool) -> None:
        """A message from the current user; the bot answers if it would on Discord."""
        mentions: list[UserRef] = []
        mentions_bot = addressed
        for name in MENTION.findall(text):
            if name.casefold() in (self.session.persona_name.casefold(), "bot"):
                mentions_bot = True
            elif name.casefold() != self.session.user.casefold():
                mentions.append(UserRef(local_id("user", name), name))
        incoming = IncomingMessage(
            message_id=self.session.next_message_id(),
            channel_id=self.session.channel_id,
            author_id=self.session.user_id,
            author_name=self.session.user,
            text=text,
            created_at=self.session.clock.now(),
            guild_id=self.session.guild_id,
            mentions=tuple(mentions),
            where=self.session.where,
            author_can_manage=True,  # the console's user runs the local server
        )
        outcome = await self.session.services.chat.handle(incoming, mentions_bot=mentions_bot)
        if outcome is None:
            if addressed:
                self.session.show(
                    f"({self.session.persona_name} does not answer {self.session.user} here: blocked in this server)"
                )
            return
        if outcome.status == ReplyStatus.NO_MODEL:
            self.session.show(f"{self.session.persona_name} (no chat model):")
            for chunk in outcome.chunks:
                self.session.show("  " + chunk.replace("\n", "\n  "))
        else:
            for chunk in outcome.chunks:
                self.session.show(f"{self.session.persona_name}: {chunk}")
        if outcome.status == ReplyStatus.REPLIED and outcome.chunks:
            for chunk in outcome.chunks:  # the bot's own messages are part of the context window, as on Discord
                await self.session.services.chat.record(
                    IncomingMessage(
                        message_id=self.session.next_message_id(),
                        channel_id=self.session.channel_id,
                        author_id=BOT_USER_ID,
                        author_name=self.session.persona_name,
                        text=chunk,
                        created_at=self.session.clock.now(),
                        guild_id=self.session.guild_id,
                        is_bot=True,
                        reply_to=incoming.message_id,
                    )
                )
        if outcome.notices is not None:  # with the memory's text: the console's user runs the server and reads it all
            prefix = {"channel": "", "hidden": "(hidden notice) ", "log": "[#log] "}[outcome.notices.destination]
            about = {change.about_user_id for change in outcome.changes if change.about_user_id is not None}
            names = await self.session.services.chat_log.names(about) if about else {}
            for change in outcome.changes:
                self.session.show(f"  {prefix}{neutralize_mentions(notice_line(change, 'verbose', names))}")
        if self.session.receipts:
            self.session.show("  receipt: " + outcome.receipt.render().replace("\n", "\n           "))
        self.session.services.upkeep.request_pass()  # chunk what left the context window now, not at the next interval

    async def show_day_notes(self, channel_id: int, guild_id: int | None, notices: Notices) -> None:
        """A finished chat day's notes notice (written in the background after the day's first message)."""
        prefix = {"channel": "", "hidden": "(hidden notice) ", "log": "[#log] "}[notices.destination]
        for line in notices.lines:
            self.session.show(f"  {prefix}{line}")

    # --- where and who ---

    async def cmd_help(self, rest: str) -> None:
        self.session.show(HELP)

    async def cmd_who(self, rest: str) -> None:
        self.session.show(
            f"you are {self.session.user} (user {self.session.user_id}) in {self.session.where}; "
            f"it is {self.session.clock.now():%Y-%m-%d} UTC"
        )

    async def cmd_as(self, rest: str) -> None:
        name = self.session.name_arg(rest, "/as NAME")
        await self.session.move(user=name)
        self.session.show(f"(you are now {name})")

    async def cmd_channel(self, rest: str) -> None:
        await self.session.move(channel=self.session.name_arg(rest.lstrip("#"), "/channel NAME"), in_dm=False)
        self.session.show(f"(you are in #{self.session.channel})")

    async def cmd_dm(self, rest: str) -> None:
        await self.session.move(in_dm=True)
        self.session.show(f"(you are in a DM with {self.session.persona_name}; /channel NAME goes back to the server)")

    async def cmd_day(self, rest: str) -> None:
        if rest and not (rest.isascii() and rest.isdigit()):
            raise CommandError("/day takes a number of days, e.g. /day 3")
        days = int(rest) if rest and len(rest) <= 9 else (1 if not rest else MAX_DAY_OFFSET + 1)
        if self.session.day_offset + days > MAX_DAY_OFFSET:
            raise CommandError(
                f"/day moves the simulated date at most {MAX_DAY_OFFSET} days (100 years) past today, and it is "
                f"{self.session.day_offset} days ahead now; "
                f"/day {max(MAX_DAY_OFFSET - self.session.day_offset, 0)} goes the furthest"
            )
        self.session.day_offset += days
        self.session.tick()
        self.session.state_file.parent.mkdir(parents=True, exist_ok=True)
        self.session.state_file.write_text(json.dumps({"day_offset": self.session.day_offset}), encoding="utf-8")
        self.session.show(f"(it is now {self.session.clock.now():%Y-%m-%d} UTC)")

    async def cmd_say(self, rest: str) -> None:
        if not rest:
            raise CommandError("/say TEXT")
        await self.post(rest, addressed=False)

    async def cmd_history(self, rest: str) -> None:
        """`/history ID [PAGE]`: a memory's versions; `/history [on|off]`: this channel's chat-history recall."""
        if rest.partition(" ")[0].lstrip("#").isdigit():
            await self.memory.versions(rest)
        else:
            await self.server.cmd_history(rest)


class MemoryCommands:
    """The console's memory commands, as `/memories` and `/personal memories` on Discord, for the session's
    user where they are."""

    def __init__(self, session: ConsoleSession) -> None:
        self.session = session

    async def _show_page(self, ref: ListRef, rest: str) -> None:
        page = await self.session.manager.page(ref, int(rest) - 1 if rest.isdigit() else 0)
        self.session.show(
            f"{ref.label}: {page.total} of {self.session.manager.limit_of(ref)} (page {page.number + 1} of {page.pages})"
        )
        for view in page.items:
            memory = view.memory
            marks = [view.state, f"{memory.days_unused} days unused"]
            if memory.protected:
                marks.append("protected")
            if memory.source == Source.NOTES:
                marks.append("from day-end notes")
            if view.scope_label:
                marks.append(view.scope_label)
            marks.append(view.vector.value)
            self.session.show(f"  #{memory.id} [{', '.join(marks)}] {memory.text}")

    async def cmd_memories(self, rest: str) -> None:
        await self._show_page(await self.session.server_list(), rest)

    async def cmd_mine(self, rest: str) -> None:
        await self._show_page(await self.session.manager.personal_list(self.session.user_id, self.session.guild_id), rest)

    def _saved(self, result: SaveResult, what: str) -> None:
        assert result.saved is not None  # a refusal is raised
        self.session.show(f"saved {what} #{result.saved.id}: {result.saved.text}")
        for merge in result.merged:
            self.session.show(f"  joined #{merge.absorbed.id} into #{merge.kept.id} to make room: {merge.kept.text}")
        for gone in result.forgotten:
            self.session.show(f"  forgotten to make room: #{gone.id} {gone.text}")
        if looks_like_instruction(result.saved.text):
            self.session.show(
                "  note: this reads like an instruction. Memories that nobody mentions go to the drawer and stop applying;"
                " put rules in the persona prompt (/persona prompt ...) or an always-on lore entry (/lore add ...)."
            )

    async def cmd_remember(self, rest: str) -> None:
        result = await self.session.manager.add(await self.session.server_list(), rest, actor=self.session.actor)
        self._saved(result, "server memory")

    async def cmd_me(self, rest: str) -> None:
        ref = await self.session.manager.personal_list(self.session.user_id, self.session.guild_id, Scope.PERSONA)
        self._saved(await self.session.manager.add(ref, rest, actor=self.session.actor), "personal memory")

    async def cmd_global(self, rest: str) -> None:
        ref = await self.session.manager.personal_list(self.session.user_id, self.session.guild_id, Scope.GLOBAL)
        self._saved(await self.session.manager.add(ref, rest, actor=self.session.actor, is_global=True), "Global personal memory")

    async def cmd_edit(self, rest: str) -> None:
        raw_id, _, text = rest.partition(" ")
        memory_id = self.session.id_arg(raw_id, "/edit ID TEXT")
        result = await self.session.manager.edit(await self.session.ref_of(memory_id), memory_id, text, actor=self.session.actor)
        assert result.saved is not None  # a refusal is raised
        self.session.show(f"edited #{memory_id}: {result.saved.text}")

    async def versions(self, rest: str) -> None:
        """`/history ID [PAGE]`: a memory's earlier texts, newest first."""
        raw_id, _, raw_page = rest.partition(" ")
        memory_id = self.session.id_arg(raw_id, "/history ID [PAGE]")
        page = await self.session.manager.versions.page(
            await self.session.ref_of(memory_id), memory_id, int(raw_page) - 1 if raw_page else 0
        )
        names = await self.session.services.chat_log.names([v.replaced_by for v in page.versions if v.replaced_by is not None])
        names.setdefault(self.session.user_id, self.session.user)
        self.session.show(f"#{memory_id} now: {page.memory.text}")
        if not page.total:
            self.session.show("  no earlier texts: it was never changed")
        else:
            self.session.show(
                f"  {page.total} earlier text{'s' if page.total != 1 else ''} (page {page.number + 1} of {page.pages})"
            )
        for version in page.versions:
            heading, detail = describe_version(version, names)
            self.session.show(f"  {heading}: {version.text}\n    {detail}")

    async def cmd_restore(self, rest: str) -> None:
        raw_id, _, raw_version = rest.partition(" ")
        memory_id = self.session.id_arg(raw_id, "/restore ID VERSION")
        version_id = self.session.id_arg(raw_version, "/restore ID VERSION")
        result = await self.session.manager.versions.restore(
            await self.session.ref_of(memory_id), memory_id, version_id, actor=self.session.actor
        )
        assert result.saved is not None  # a refusal is raised
        self.session.show(f"restored #{memory_id}: {result.saved.text}")

    async def cmd_forget(self, rest: str) -> None:
        memory_id = self.session.id_arg(rest, "/forget ID")
        result = await self.session.manager.delete(await self.session.ref_of(memory_id), memory_id, actor=self.session.actor)
        self.session.show(f"deleted #{memory_id}: {result.forgotten[0].text}")


def failure_sentence(exc: Exception) -> str:
    """One line for a command that failed: what a person can act on (the database is down, the disk is full), or
    the error's first line; the traceback goes to the log (DATA_DIR/console.log), never between the turns."""
    explained = database_sentence(exc)
    if explained is not None:
        log.warning("Console command failed: %s (%s: %s)", explained, type(exc).__name__, first_line(exc))
        return explained
    log.warning("Console command failed", exc_info=exc)
    return f"something went wrong ({type(exc).__name__}: {first_line(exc)[:200]}); the details are in the log"


class LineReader:
    """Standard input, one line when asked, read in a daemon thread.

    `asyncio.to_thread(stdin.readline)` would leave a worker thread blocked on the terminal after a shutdown
    signal, and the interpreter waits for its worker threads before it exits: a `docker stop` or a SIGTERM of the
    console would hang until someone pressed Enter. A daemon thread does not hold the exit, and it reads only when
    asked, so nothing is taken from the input that the session does not handle. A closed terminal reads as the end.
    """

    def __init__(self, stdin: TextIO) -> None:
        self._stdin = stdin
        self._wanted = threading.Semaphore(0)
        self._pending: tuple[asyncio.AbstractEventLoop, asyncio.Future[str]] | None = None
        self._thread: threading.Thread | None = None
        self._ended = False

    async def readline(self) -> str:
        if self._ended:
            return ""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[str] = loop.create_future()
        self._pending = (loop, future)
        if self._thread is None:
            self._thread = threading.Thread(target=self._read, name="console-input", daemon=True)
            self._thread.start()
        self._wanted.release()
        return await future

    def _read(self) -> None:
        while True:
            self._wanted.acquire()
            assert self._pending is not None
            loop, future = self._pending
            try:
                line = self._stdin.readline()
            except (OSError, ValueError):  # the terminal is gone (EIO after a hang-up) or stdin was closed
                line = ""
            if not line:
                self._ended = True
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody is waiting
                loop.call_soon_threadsafe(_deliver, future, line)
            if not line:
                return


def _deliver(future: asyncio.Future[str], line: str) -> None:
    if not future.done():
        future.set_result(line)


def _read_day_offset(path: Path) -> int:
    """The saved /day offset; 0 when the file is missing or holds something /day could not have written."""
    try:
        offset = json.loads(path.read_text(encoding="utf-8")).get("day_offset", 0)
    except (OSError, ValueError, AttributeError):
        return 0
    return offset if isinstance(offset, int) and not isinstance(offset, bool) and 0 <= offset <= MAX_DAY_OFFSET else 0


async def run_console(
    settings: Settings, *, stdin: TextIO | None = None, out: TextIO | None = None, builtin: BuiltinEmbedder | None = None
) -> int:
    """Run the console chat until /quit or end of input. `builtin` reuses an already loaded embedding model."""
    stdin = stdin or sys.stdin
    out = out or sys.stdout
    if settings.discord_token:
        print("Deskmate console: a local chat (the Discord bot is not started in this mode).", file=out)
    else:
        print("Deskmate console. No DISCORD_TOKEN is set, so you are chatting locally.", file=out)
        print("To connect to Discord, put DISCORD_TOKEN=... in .env (see README).", file=out)
    if chat_configured(settings):
        print(f"Chat model: {settings.chat_model} at {settings.chat_base_url or 'api.openai.com'}.", file=out)
    else:
        print(
            "No chat model is configured (CHAT_MODEL with CHAT_BASE_URL or CHAT_API_KEY), so the bot shows what it "
            "would have sent instead of answering.",
            file=out,
        )
    print("Type /help for commands.", file=out, flush=True)

    stop = asyncio.Event()
    clock = ManualClock()
    embedder = create_embedder(settings, builtin) if builtin is not None and settings.embedding_provider == "builtin" else None
    async with open_services(settings, clock=clock, embedder=embedder, bot_user_id=BOT_USER_ID) as services:
        reembedder = asyncio.create_task(services.upkeep.run(stop))  # history chunks and every vector, in the background
        try:
            state_file = settings.data_dir / "console.json"
            session = ConsoleSession(services, clock, out, state_file, _read_day_offset(state_file))
            console = ConsoleChat(session)
            services.summaries.notes.listener = console.show_day_notes
            session.tick()
            await session.refresh_persona()
            interactive = stdin.isatty()
            lines = LineReader(stdin)
            while True:
                if interactive:
                    print(f"{session.user}> ", end="", file=out, flush=True)
                raw = await lines.readline()
                if not raw:
                    break
                try:
                    if not await console.handle(raw.strip()):
                        break
                except Exception as exc:  # one bad line never ends the session
                    session.show(f"error: {failure_sentence(exc)}")
        finally:
            stop.set()
            reembedder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reembedder
    return 0
