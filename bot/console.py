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
from pathlib import Path
from typing import TextIO

from bot.chat.messages import IncomingMessage, UserRef
from bot.chat.model import chat_configured
from bot.chat.receipts import ReplyStatus
from bot.config import Settings
from bot.console_session import BOT_USER_ID, MENTION, SUMMARIES_USAGE, CommandError, ServerCommands, local_id
from bot.errors import Refusal
from bot.failures import database_sentence
from bot.memory.clock import ManualClock
from bot.memory.embeddings import BuiltinEmbedder, create_embedder
from bot.memory.lists import ListRef, Scope, looks_like_instruction
from bot.memory.models import SaveResult
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
  /documents [add PATH | delete ID]  documents of the local server     /history [on|off]  this channel's chat history
  /stats [mine]        the memory viewer (writes a chart to DATA_DIR)   /rebuild        embed everything now, with progress
  /summaries [show ID | regenerate ID | backfill [DAYS] | on|off]  this channel's day and week summaries (/day ends a day)
  /who                 where you are                    /help, /quit"""



# What each command accepts after its name (a regular expression over the rest of the line), with its usage:
# anything else is refused with the usage instead of being ignored. Commands taking free text are not listed.
OPTIONS: dict[str, tuple[str, str]] = {
    "/help": (r"", "/help"), "/who": (r"", "/who"), "/dm": (r"", "/dm"), "/quit": (r"", "/quit"),
    "/receipt": (r"", "/receipt"), "/why": (r"", "/why"), "/rebuild": (r"", "/rebuild"),
    "/memories": (r"\d*", "/memories [PAGE]"), "/mine": (r"\d*", "/mine [PAGE]"), "/day": (r"\d*", "/day [N]"),
    "/stats": (r"(mine)?", "/stats [mine]"), "/privacy": (r"(none|partial|full)?", "/privacy none|partial|full"),
    "/history": (r"(on|off)?", "/history [on|off]"),
    "/summaries": (r"((show|regenerate) #?\d+|backfill( \d+)?|on|off)?", SUMMARIES_USAGE),
}


def refuse_unknown_options(command: str, rest: str) -> None:
    """A mistyped option is refused with the usage: silently ignoring it would do something else than asked."""
    accepted = OPTIONS.get(command)
    if accepted is not None and not re.fullmatch(accepted[0], rest, flags=re.IGNORECASE):
        raise CommandError(f"{command} does not take {rest!r}; usage: {accepted[1]}")


class ConsoleChat(ServerCommands):
    """The console chat: one input line at a time, messages to the bot and the memory commands."""

    async def handle(self, line: str) -> bool:
        """Run one input line; False means quit. A bad line prints an error and the session goes on."""
        self.tick()
        if not line:
            return True
        if not line.startswith("/"):
            await self.post(line, addressed=True)
            return True
        command, _, rest = line.partition(" ")
        rest = rest.strip()
        if command in ("/quit", "/exit"):
            return False
        handler = getattr(self, "cmd_" + command[1:].replace("-", "_"), None)
        if handler is None:
            self.show(f"unknown command {command}; /help lists them")
            return True
        try:
            refuse_unknown_options(command, rest)
            await handler(rest)
        except Refusal as exc:  # one handler for the whole family: a typo, a rule, a bad file
            self.show(f"error: {exc.sentence}")
        return True

    async def post(self, text: str, *, addressed: bool) -> None:
        """A message from the current user; the bot answers if it would on Discord."""
        mentions: list[UserRef] = []
        mentions_bot = addressed
        for name in MENTION.findall(text):
            if name.casefold() in (self.persona_name.casefold(), "bot"):
                mentions_bot = True
            elif name.casefold() != self.user.casefold():
                mentions.append(UserRef(local_id("user", name), name))
        incoming = IncomingMessage(
            message_id=self.next_message_id(),
            channel_id=self.channel_id,
            author_id=self.user_id,
            author_name=self.user,
            text=text,
            created_at=self.clock.now(),
            guild_id=self.guild_id,
            mentions=tuple(mentions),
            where=self.where,
            author_can_manage=True,  # the console's user runs the local server
        )
        outcome = await self.services.chat.handle(incoming, mentions_bot=mentions_bot)
        if outcome is None:
            if addressed:
                self.show(f"({self.persona_name} does not answer {self.user} here: blocked in this server)")
            return
        if outcome.status == ReplyStatus.NO_MODEL:
            self.show(f"{self.persona_name} (no chat model):")
            for chunk in outcome.chunks:
                self.show("  " + chunk.replace("\n", "\n  "))
        else:
            for chunk in outcome.chunks:
                self.show(f"{self.persona_name}: {chunk}")
        if outcome.status == ReplyStatus.REPLIED and outcome.chunks:
            for chunk in outcome.chunks:  # the bot's own messages are part of the context window, as on Discord
                await self.services.chat.record(
                    IncomingMessage(
                        message_id=self.next_message_id(),
                        channel_id=self.channel_id,
                        author_id=BOT_USER_ID,
                        author_name=self.persona_name,
                        text=chunk,
                        created_at=self.clock.now(),
                        guild_id=self.guild_id,
                        is_bot=True,
                        reply_to=incoming.message_id,
                    )
                )
        if outcome.notices is not None:
            prefix = {"channel": "", "hidden": "(hidden notice) ", "log": "[#log] "}[outcome.notices.destination]
            for notice in outcome.notices.lines:
                self.show(f"  {prefix}{notice}")
        self.show("  receipt: " + outcome.receipt.render().replace("\n", "\n           "))
        self.core.vectors_wanted.set()  # the background pass chunks what left the context window

    # --- where and who ---

    async def cmd_help(self, rest: str) -> None:
        self.show(HELP)

    async def cmd_who(self, rest: str) -> None:
        self.show(f"you are {self.user} (user {self.user_id}) in {self.where}; it is {self.clock.now():%Y-%m-%d} UTC")

    async def cmd_as(self, rest: str) -> None:
        name = self._name(rest, "/as NAME")
        self.user = name
        if self.in_dm:
            await self.refresh_persona()
        self.show(f"(you are now {name})")

    async def cmd_channel(self, rest: str) -> None:
        self.channel = self._name(rest.lstrip("#"), "/channel NAME")
        self.in_dm = False
        await self.refresh_persona()
        self.show(f"(you are in #{self.channel})")

    async def cmd_dm(self, rest: str) -> None:
        self.in_dm = True
        await self.refresh_persona()
        self.show(f"(you are in a DM with {self.persona_name}; /channel NAME goes back to the server)")

    async def cmd_day(self, rest: str) -> None:
        days = int(rest) if rest.isdigit() else 1
        if rest and not rest.isdigit():
            raise CommandError("/day takes a number of days, e.g. /day 3")
        self.day_offset += days
        self.tick()
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        self.state_file.write_text(json.dumps({"day_offset": self.day_offset}), encoding="utf-8")
        self.show(f"(it is now {self.clock.now():%Y-%m-%d} UTC)")

    async def cmd_say(self, rest: str) -> None:
        if not rest:
            raise CommandError("/say TEXT")
        await self.post(rest, addressed=False)

    # --- memories ---

    async def _show_page(self, ref: ListRef, rest: str) -> None:
        page = await self.manager.page(ref, int(rest) - 1 if rest.isdigit() else 0)
        self.show(f"{ref.label}: {page.total} of {self.manager.limit_of(ref)} (page {page.number + 1} of {page.pages})")
        for view in page.items:
            memory = view.memory
            marks = [view.state, f"{memory.days_unused} days unused"]
            if memory.protected:
                marks.append("protected")
            if view.scope_label:
                marks.append(view.scope_label)
            marks.append(view.vector.value)
            self.show(f"  #{memory.id} [{', '.join(marks)}] {memory.text}")

    async def cmd_memories(self, rest: str) -> None:
        await self._show_page(await self._server_list(), rest)

    async def cmd_mine(self, rest: str) -> None:
        await self._show_page(await self.manager.personal_list(self.user_id, self.guild_id), rest)

    def _saved(self, result: SaveResult, what: str) -> None:
        if result.saved is None:
            self.show(f"not saved: {result.detail}")
            return
        self.show(f"saved {what} #{result.saved.id}: {result.saved.text}")
        for gone in result.forgotten:
            self.show(f"  forgotten to make room: #{gone.id} {gone.text}")
        if looks_like_instruction(result.saved.text):
            self.show(
                "  note: this reads like an instruction. Memories that nobody mentions go to the drawer and stop applying;"
                " put rules in the persona prompt (/persona prompt ...) or an always-on lore entry (/lore add ...)."
            )

    async def cmd_remember(self, rest: str) -> None:
        result = await self.manager.add(await self._server_list(), rest, actor=self.actor)
        self._saved(result, "server memory")

    async def cmd_me(self, rest: str) -> None:
        ref = await self.manager.personal_list(self.user_id, self.guild_id, Scope.PERSONA)
        self._saved(await self.manager.add(ref, rest, actor=self.actor), "personal memory")

    async def cmd_global(self, rest: str) -> None:
        ref = await self.manager.personal_list(self.user_id, self.guild_id, Scope.GLOBAL)
        self._saved(await self.manager.add(ref, rest, actor=self.actor, is_global=True), "Global personal memory")

    async def cmd_edit(self, rest: str) -> None:
        raw_id, _, text = rest.partition(" ")
        memory_id = self._memory_id(raw_id, "/edit ID TEXT")
        result = await self.manager.edit(await self._ref_of(memory_id), memory_id, text, actor=self.actor)
        self.show(f"edited #{memory_id}: {result.saved.text}" if result.saved else f"not edited: {result.detail}")

    async def cmd_forget(self, rest: str) -> None:
        memory_id = self._memory_id(rest, "/forget ID")
        result = await self.manager.delete(await self._ref_of(memory_id), memory_id, actor=self.actor)
        self.show(f"deleted #{memory_id}: {result.forgotten[0].text}" if result.forgotten else f"not deleted: {result.detail}")


def _read_day_offset(path: Path) -> int:
    try:
        return int(json.loads(path.read_text(encoding="utf-8")).get("day_offset", 0))
    except (OSError, ValueError, AttributeError):
        return 0


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
            console = ConsoleChat(services, clock, out, state_file, _read_day_offset(state_file))
            console.tick()
            await console.refresh_persona()
            interactive = stdin.isatty()
            while True:
                if interactive:
                    print(f"{console.user}> ", end="", file=out, flush=True)
                raw = await asyncio.to_thread(stdin.readline)
                if not raw:
                    break
                try:
                    if not await console.handle(raw.strip()):
                        break
                except Exception as exc:  # one bad line never ends the session
                    explained = database_sentence(exc)  # a full disk while saving is one sentence, not a traceback
                    if explained is not None:
                        log.error("Console command failed: %s", explained)
                        console.show(f"error: {explained}")
                        continue
                    log.exception("Console command failed")
                    console.show(f"error: {type(exc).__name__}: {exc}")
        finally:
            stop.set()
            reembedder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reembedder
    return 0
