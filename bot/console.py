"""The console chat (issue 3 item 6): the real reply pipeline and memory core in a terminal.

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
import hashlib
import json
import logging
import re
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TextIO

from bot.config import Settings
from bot.db import Database
from bot.failures import database_sentence
from bot.memory import store
from bot.memory.chart import buckets, days_unused_chart
from bot.memory.documents import DocumentError, DocumentLibrary, describe_size
from bot.memory.embeddings import BuiltinEmbedder, create_embedder
from bot.memory.history import HistoryIndex
from bot.memory.manage import ListRef, ManageError, MemoryManager, Scope, looks_like_instruction
from bot.memory.models import Privacy, SaveResult
from bot.memory.recall import ManualClock, MemoryCore
from bot.memory.upkeep import Upkeep
from bot.pipeline import IncomingMessage, Receipt, ReplyPipeline, ReplyStatus, UserRef, chat_configured
from bot.tail_sources import install as install_tail_sources

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
  /who                 where you are                    /help, /quit"""

LOCAL_GUILD_ID = 1
BOT_USER_ID = 2
MENTION = re.compile(r"@([\w-]+)")
SETTING_COLUMNS = {
    "notices": ("notices", ("visible", "hidden", "log")),
    "verbosity": ("notice_verbosity", ("minimal", "verbose")),
    "self-teaching": ("self_teaching", None),
    "member-teaching": ("member_teaching", None),
    "personal-memories": ("personal_memories", None),
    "tagging": ("tagging", None),
}
SWITCH = {"on": True, "off": False, "true": True, "false": False, "yes": True, "no": False}


def local_id(kind: str, name: str) -> int:
    """A stable id for a console user or channel: the same name is the same person in every session."""
    digest = hashlib.sha256(f"{kind}:{name.casefold()}".encode()).digest()
    return 1_000 + int.from_bytes(digest[:6], "big")


class CommandError(ValueError):
    """A console command was typed wrong; the message says how to type it."""


@dataclass
class ConsoleChat:
    """One console session: who you are, where you are, and the commands."""

    pipeline: ReplyPipeline
    manager: MemoryManager
    clock: ManualClock
    out: TextIO
    state_file: Path
    day_offset: int = 0
    user: str = "you"
    channel: str = "general"
    in_dm: bool = False
    persona_name: str = "Deskmate"
    _last_message_id: int = field(default=0, repr=False)
    history: HistoryIndex | None = None
    documents: DocumentLibrary | None = None
    upkeep: Upkeep | None = None

    # --- where we are ---

    @property
    def core(self) -> MemoryCore:
        return self.pipeline.core

    @property
    def user_id(self) -> int:
        return local_id("user", self.user)

    @property
    def guild_id(self) -> int | None:
        return None if self.in_dm else LOCAL_GUILD_ID

    @property
    def channel_id(self) -> int:
        return local_id("dm", self.user) if self.in_dm else local_id("channel", self.channel)

    @property
    def where(self) -> str:
        return "a direct message" if self.in_dm else f'#{self.channel} in "local server"'

    def show(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def tick(self) -> None:
        """The simulated clock: real time, moved forward by the /day offset."""
        self.clock.current = datetime.now(UTC) + timedelta(days=self.day_offset)

    def next_message_id(self) -> int:
        """Increasing like Discord snowflakes (microseconds), so the context window orders correctly across sessions."""
        self._last_message_id = max(self._last_message_id + 1, time.time_ns() // 1_000)
        return self._last_message_id

    async def refresh_persona(self) -> None:
        self.persona_name = (await self.pipeline.persona(self.guild_id))["name"]

    # --- one line ---

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
            await handler(rest)
        except (CommandError, ManageError, ValueError) as exc:
            self.show(f"error: {exc}")
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
        )
        await self.pipeline.record_message(incoming)
        if await self.pipeline.trigger(incoming, mentions_bot=mentions_bot) is None:
            if addressed:
                self.show(f"({self.persona_name} does not answer {self.user} here: blocked in this server)")
            return
        outcome = await self.pipeline.reply(incoming)
        if outcome.status == ReplyStatus.NO_MODEL:
            self.show(f"{self.persona_name} (no chat model):")
            for chunk in outcome.chunks:
                self.show("  " + chunk.replace("\n", "\n  "))
        else:
            for chunk in outcome.chunks:
                self.show(f"{self.persona_name}: {chunk}")
        if outcome.status == ReplyStatus.REPLIED and outcome.chunks:
            for chunk in outcome.chunks:  # the bot's own messages are part of the context window, as on Discord
                await self.pipeline.record_message(
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

    async def _server_list(self) -> ListRef:
        if self.guild_id is None:
            raise CommandError("server memories exist only in a server; /channel NAME goes back to one")
        return await self.manager.server_list(self.guild_id)

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
        result = await self.manager.add(await self._server_list(), rest, by=self.user_id, by_can_manage=True)
        self._saved(result, "server memory")

    async def cmd_me(self, rest: str) -> None:
        ref = await self.manager.personal_list(self.user_id, self.guild_id, Scope.PERSONA)
        self._saved(await self.manager.add(ref, rest, by=self.user_id), "personal memory")

    async def cmd_global(self, rest: str) -> None:
        ref = await self.manager.personal_list(self.user_id, self.guild_id, Scope.GLOBAL)
        self._saved(await self.manager.add(ref, rest, by=self.user_id, is_global=True), "Global personal memory")

    async def _ref_of(self, memory_id: int) -> ListRef:
        """The list a memory id belongs to, among the ones the current user may change here."""
        refs = [await self.manager.personal_list(self.user_id, self.guild_id)]
        if self.guild_id is not None:
            refs.insert(0, await self.manager.server_list(self.guild_id))
        for ref in refs:
            with contextlib.suppress(ManageError):
                await self.manager.get(ref, memory_id)
                return ref
        raise CommandError(f"there is no memory #{memory_id} that you can change here")

    def _memory_id(self, raw: str, usage: str) -> int:
        raw = raw.lstrip("#")
        if not raw.isdigit():
            raise CommandError(usage)
        return int(raw)

    async def cmd_edit(self, rest: str) -> None:
        raw_id, _, text = rest.partition(" ")
        memory_id = self._memory_id(raw_id, "/edit ID TEXT")
        result = await self.manager.edit(await self._ref_of(memory_id), memory_id, text, by=self.user_id, by_can_manage=True)
        self.show(f"edited #{memory_id}: {result.saved.text}" if result.saved else f"not edited: {result.detail}")

    async def cmd_forget(self, rest: str) -> None:
        memory_id = self._memory_id(rest, "/forget ID")
        result = await self.manager.delete(await self._ref_of(memory_id), memory_id, by=self.user_id, by_can_manage=True)
        self.show(f"deleted #{memory_id}: {result.forgotten[0].text}" if result.forgotten else f"not deleted: {result.detail}")

    async def cmd_privacy(self, rest: str) -> None:
        try:
            level = Privacy(rest.lower())
        except ValueError:
            raise CommandError("/privacy none|partial|full") from None
        await self.core.set_privacy(self.user_id, level)
        self.show(f"privacy for {self.user}: {level.value}")

    # --- server settings, persona, lore ---

    async def cmd_settings(self, rest: str) -> None:
        if self.guild_id is None:
            raise CommandError("server settings exist only in a server")
        if rest:
            key, _, value = rest.partition(" ")
            await self._change_setting(key.lower(), value.strip().lower())
        async with self.core.pool.acquire() as conn:
            guild = await store.get_guild_settings(conn, self.guild_id)
        autos = ", ".join(f"#{name}" for name in self._channel_names(guild.auto_reply_channel_ids)) or "none"
        on = {True: "on", False: "off"}
        self.show(
            f"notices: {guild.notices} ({guild.notice_verbosity}); self-teaching {on[guild.self_teaching]}; "
            f"member teaching {on[guild.member_teaching]}; personal memories {on[guild.personal_memories]}; "
            f"tagging {on[guild.tagging]}; auto-reply channels: {autos}"
        )

    def _channel_names(self, ids: tuple[int, ...]) -> list[str]:
        known = {local_id("channel", self.channel): self.channel}
        return [known.get(channel_id, str(channel_id)) for channel_id in ids]

    async def _change_setting(self, key: str, value: str) -> None:
        assert self.guild_id is not None
        if key == "auto-reply":
            if value not in SWITCH:
                raise CommandError("/settings auto-reply on|off (for the current channel)")
            async with self.core.pool.acquire() as conn:
                current = set((await store.get_guild_settings(conn, self.guild_id)).auto_reply_channel_ids)
            current = current | {self.channel_id} if SWITCH[value] else current - {self.channel_id}
            await self.core.update_guild_settings(self.guild_id, auto_reply_channel_ids=sorted(current))
            return
        if key == "log-channel":
            if not value:
                raise CommandError("/settings log-channel NAME")
            await self.core.update_guild_settings(self.guild_id, log_channel_id=local_id("channel", value.lstrip("#")))
            return
        if key not in SETTING_COLUMNS:
            raise CommandError(
                f"unknown setting {key!r}; the settings are {', '.join([*SETTING_COLUMNS, 'auto-reply', 'log-channel'])}"
            )
        column, choices = SETTING_COLUMNS[key]
        if choices is None:
            if value not in SWITCH:
                raise CommandError(f"/settings {key} on|off")
            await self.core.update_guild_settings(self.guild_id, **{column: SWITCH[value]})
        else:
            if value not in choices:
                raise CommandError(f"/settings {key} {'|'.join(choices)}")
            await self.core.update_guild_settings(self.guild_id, **{column: value})

    async def cmd_block(self, rest: str, blocked: bool = True) -> None:
        if self.guild_id is None:
            raise CommandError("the blocklist exists only in a server")
        name = self._name(rest, "/block NAME" if blocked else "/unblock NAME")
        await self.core.set_blocked(self.guild_id, local_id("user", name), blocked)
        self.show(f"{name} is {'blocked' if blocked else 'no longer blocked'} in this server")

    async def cmd_unblock(self, rest: str) -> None:
        await self.cmd_block(rest, blocked=False)

    async def cmd_persona(self, rest: str) -> None:
        field_name, _, value = rest.partition(" ")
        if field_name in ("name", "prompt"):
            if self.guild_id is None:
                raise CommandError("the DM persona follows DEFAULT_PERSONA_NAME / DEFAULT_PERSONA_PROMPT")
            if not value.strip():
                raise CommandError(f"/persona {field_name} TEXT")
            await self.pipeline.update_persona(self.guild_id, **{field_name: value.strip()})
            await self.refresh_persona()
        elif rest:
            raise CommandError("/persona [name TEXT | prompt TEXT]")
        persona = await self.pipeline.persona(self.guild_id)
        self.show(f"persona: {persona['name']}\nprompt: {persona['prompt'] or '(empty)'}")

    async def cmd_lore(self, rest: str) -> None:
        action, _, value = rest.partition(" ")
        if action in ("add", "remove") and self.guild_id is None:
            raise CommandError("lore entries belong to a server's persona")
        if action == "add":
            entry = await self.pipeline.add_lore(self.guild_id or 0, value, by=self.user_id)
            self.show(f"lore #{entry['id']} added: {entry['text']}")
        elif action == "remove":
            lore_id = self._memory_id(value, "/lore remove ID")
            removed = await self.pipeline.remove_lore(self.guild_id or 0, lore_id)
            self.show(f"lore #{lore_id} removed" if removed else f"there is no lore #{lore_id}")
        elif action:
            raise CommandError("/lore [add TEXT | remove ID]")
        else:
            entries = await self.pipeline.lore(self.guild_id)
            self.show("always-on lore: " + ("none" if not entries else ""))
            for entry in entries:
                self.show(f"  #{entry['id']} {entry['text']}")

    async def cmd_receipt(self, rest: str) -> None:
        receipt = await self.pipeline.receipt(channel_id=self.channel_id)
        if receipt is None:
            self.show("no reply in this channel yet")
            return
        self.show(Receipt.from_dict(receipt).render())

    async def cmd_why(self, rest: str) -> None:
        await self.cmd_receipt(rest)

    # --- issue 4: documents, chat history, the memory viewer, rebuild ---

    async def cmd_documents(self, rest: str) -> None:
        if self.documents is None:
            raise CommandError("documents are not available in this session")
        if self.guild_id is None:
            raise CommandError("documents belong to a server; /channel NAME goes back to one")
        action, _, value = rest.partition(" ")
        if action == "add":
            path = Path(value.strip())
            try:
                raw = await asyncio.to_thread(path.read_bytes)
            except OSError as exc:
                raise CommandError(f"cannot read {path}: {exc.strerror}") from None
            try:
                added = await self.documents.add(self.guild_id, path.name, raw, by=self.user_id)
            except DocumentError as exc:
                raise CommandError(str(exc)) from None
            verb = "replaced" if added.replaced else "added"
            self.show(f"{verb} document #{added.id} {added.name}: {added.passages} passages, {added.embedded} embedded")
        elif action == "delete":
            document_id = self._memory_id(value.strip(), "/documents delete ID")
            try:
                self.show(f"deleted document #{document_id} {await self.documents.delete(self.guild_id, document_id)}")
            except DocumentError as exc:
                raise CommandError(str(exc)) from None
        elif action:
            raise CommandError("/documents [add PATH | delete ID]")
        else:
            found = await self.documents.list(self.guild_id)
            self.show("documents: " + ("none (add one with /documents add PATH)" if not found else ""))
            for doc in found:
                size = describe_size(doc.size_bytes)
                self.show(f"  #{doc.id} {doc.name}: {size}, {doc.passages} passages, {doc.embedded} embedded")

    async def cmd_history(self, rest: str) -> None:
        if self.history is None:
            raise CommandError("chat history is not available in this session")
        if rest:
            if rest.lower() not in SWITCH:
                raise CommandError("/history [on|off] (for the current channel)")
            await self.history.set_recall(self.channel_id, self.guild_id, SWITCH[rest.lower()])
        enabled = await self.history.recall_enabled(self.channel_id)
        overview = await self.history.overview(self.channel_id)
        self.show(
            f"history recall {'on' if enabled else 'off (messages are still stored and chunked)'} here; "
            f"{overview['chunks']} chunks ({overview['embedded']} embedded), {overview['unchunked']} messages in no chunk yet "
            f"(the last {self.pipeline.settings.context_messages} are the context window and are never chunked)"
        )

    async def cmd_stats(self, rest: str) -> None:
        if rest not in ("", "mine"):
            raise CommandError("/stats [mine]")
        ref = await self.manager.personal_list(self.user_id, self.guild_id) if rest else await self._server_list()
        stats = await self.manager.stats(ref, embedding_problem=self.upkeep.last_error if self.upkeep else None)
        self.show(
            f"{ref.label}: {stats.total} of {stats.limit}; desk {stats.desk}, drawer {stats.drawer}, "
            f"waiting for vector {stats.waiting}, embedding unavailable {stats.unavailable}; "
            f"~{stats.desk_tokens} tokens on the desk"
        )
        if stats.unavailable_reason:
            self.show(f"  no vector can be made now: {stats.unavailable_reason}")
        for bucket in buckets(stats.days, stats.dormant_after, stats.decay):
            where = "drawer" if bucket.drawer else "desk"
            self.show(f"  {bucket.label:>7} days unused | {'#' * bucket.count} {bucket.count} ({where})")
        if stats.total:
            chart = self.state_file.parent / "days-unused.png"
            chart.parent.mkdir(parents=True, exist_ok=True)
            chart.write_bytes(days_unused_chart(stats.days, stats.dormant_after, decay=stats.decay, title=ref.label))
            self.show(f"  chart: {chart}")

    async def cmd_rebuild(self, rest: str) -> None:
        if self.upkeep is None:
            raise CommandError("rebuilding is not available in this session")
        state = await self.upkeep.rebuild()
        verdict = f"paused: {state.paused}" if state.paused else "done"
        self.show(
            f"rebuild {verdict}: {state.summary()}; {state.chunks_made} new chunks; {state.stale_removed} old vectors removed"
        )

    def _name(self, raw: str, usage: str) -> str:
        name = raw.strip().lstrip("@")
        if not name or " " in name:
            raise CommandError(f"{usage} (one word)")
        return name


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

    database = await Database.open(settings)
    stop = asyncio.Event()
    pipeline: ReplyPipeline | None = None
    reembedder: asyncio.Task[None] | None = None
    try:
        if settings.embedding_provider == "builtin" and builtin is None:
            builtin = await asyncio.to_thread(BuiltinEmbedder)
            await asyncio.to_thread(builtin.warm_up)
        clock = ManualClock()
        core = MemoryCore(database.pool, create_embedder(settings, builtin), settings, clock)
        history = HistoryIndex(core)
        documents = DocumentLibrary(core)
        upkeep = Upkeep(core, history)
        reembedder = asyncio.create_task(upkeep.run(stop))  # history chunks and every vector, in the background
        pipeline = ReplyPipeline(core, settings, bot_user_id=BOT_USER_ID)
        install_tail_sources(pipeline.tail_sources, history, documents)
        await pipeline.start()
        state_file = settings.data_dir / "console.json"
        console = ConsoleChat(pipeline, MemoryManager(core), clock, out, state_file, _read_day_offset(state_file))
        console.history, console.documents, console.upkeep = history, documents, upkeep
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
        if reembedder is not None:
            reembedder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reembedder
        if pipeline is not None:
            await pipeline.close()
        await database.close()
    return 0
