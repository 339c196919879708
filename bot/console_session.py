"""The console chat's session and its server commands: settings, privacy, persona and lore, documents,
chat history, the memory viewer and rebuilds. `bot.console` adds the conversation and the memory commands.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TextIO

from bot.chat.receipts import Receipt
from bot.clock import ManualClock
from bot.documents.service import describe_size
from bot.errors import InvalidInput, Refusal
from bot.ids import parse_id
from bot.memory.lists import ListRef
from bot.memory.manage import MemoryManager
from bot.memory.service import MemoryCore
from bot.servers.models import Actor, Privacy
from bot.servers.service import Servers
from bot.services import Services
from bot.summaries.models import BackfillProgress, Off, Status, Summary, period_label
from bot.tools.chart import buckets, days_unused_chart

log = logging.getLogger(__name__)

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
SUMMARIES_USAGE = "/summaries [show ID | regenerate ID | backfill [DAYS] | on|off]"
SUMMARIES_OFF = {
    Off.EVERYWHERE: "summaries are switched off for this bot (SUMMARY_ENABLED=false), so none are written or shown",
    Off.NO_MODEL: "no summary model is configured (SUMMARY_MODEL, or CHAT_MODEL with its endpoint), so no summaries are written",
    Off.HERE: "summaries are off in this channel, so none are written or shown here; /summaries on turns them on",
}


def local_id(kind: str, name: str) -> int:
    """A stable id for a console user or channel: the same name is the same person in every session."""
    digest = hashlib.sha256(f"{kind}:{name.casefold()}".encode()).digest()
    return 1_000 + int.from_bytes(digest[:6], "big")


def read_at_most(path: Path, size: int) -> bytes:
    """The first `size` bytes of a file (all of it when shorter): a file's size can lie (/dev/zero says 0)."""
    with path.open("rb") as file:
        return file.read(size)


class CommandError(InvalidInput):
    """A console command was typed wrong; the sentence says how to type it."""


@dataclass
class ConsoleSession:
    """One console session: who you are and where you are; the commands are in `ConsoleChat`."""

    services: Services
    clock: ManualClock
    out: TextIO
    state_file: Path
    day_offset: int = 0
    user: str = "you"
    channel: str = "general"
    in_dm: bool = False
    persona_name: str = "Deskmate"
    receipts: bool = False  # a receipt after every reply buries the conversation: on demand (/receipt) unless switched on
    _last_message_id: int = field(default=0, repr=False)

    # --- where we are ---

    @property
    def core(self) -> MemoryCore:
        return self.services.core

    @property
    def manager(self) -> MemoryManager:
        return self.services.memories

    @property
    def servers(self) -> Servers:
        return self.services.servers

    @property
    def user_id(self) -> int:
        return local_id("user", self.user)

    @property
    def actor(self) -> Actor:
        """The console's user runs its local server: they may manage it."""
        return Actor(self.user_id, can_manage=True)

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
        self.persona_name = (await self.servers.persona(self.guild_id)).name

    async def move(self, *, user: str | None = None, channel: str | None = None, in_dm: bool | None = None) -> None:
        """Become another user or go somewhere else; when the new place's persona cannot be read (the database is
        down), the session stays who and where it was, as the error says."""
        before = (self.user, self.channel, self.in_dm)
        self.user = user if user is not None else self.user
        self.channel = channel if channel is not None else self.channel
        self.in_dm = in_dm if in_dm is not None else self.in_dm
        if (self.channel, self.in_dm) == before[1:]:
            return  # the same place, the same persona
        try:
            await self.refresh_persona()
        except BaseException:
            self.user, self.channel, self.in_dm = before
            raise

    # --- one line ---

    async def server_list(self) -> ListRef:
        if self.guild_id is None:
            raise CommandError("server memories exist only in a server; /channel NAME goes back to one")
        return await self.manager.server_list(self.guild_id)

    async def ref_of(self, memory_id: int) -> ListRef:
        """The list a memory id belongs to, among the ones the current user may change here."""
        refs = [await self.manager.personal_list(self.user_id, self.guild_id)]
        if self.guild_id is not None:
            refs.insert(0, await self.manager.server_list(self.guild_id))
        for ref in refs:
            with contextlib.suppress(Refusal):
                await self.manager.get(ref, memory_id)
                return ref
        raise CommandError(f"there is no memory #{memory_id} that you can change here")

    def id_arg(self, raw: str, usage: str) -> int:
        """An id as Discord and the database know them: ASCII digits, 1 to 2**63 - 1 (`²` or 20 nines are no id)."""
        try:
            return parse_id(raw.strip().lstrip("#"), "the id")
        except ValueError as exc:
            raise CommandError(f"{exc}; usage: {usage}") from None

    def name_arg(self, raw: str, usage: str) -> str:
        name = raw.strip().lstrip("@")
        if not name or " " in name:
            raise CommandError(f"{usage} (one word)")
        return name


class ServerCommands:
    """Console commands about the server and the people in it, as `/settings`, `/privacy` and friends on Discord:
    they act on the session they are given (who and where), which the chat and the memory commands share."""

    def __init__(self, session: ConsoleSession) -> None:
        self.session = session

    async def cmd_privacy(self, rest: str) -> None:
        if rest.lower() not in {level.value for level in Privacy}:
            raise CommandError("/privacy none|partial|full")
        level = Privacy(rest.lower())
        await self.session.services.set_privacy(self.session.user_id, level)
        self.session.show(f"privacy for {self.session.user}: {level.value}")

    # --- server settings, persona, lore ---

    async def cmd_settings(self, rest: str) -> None:
        if self.session.guild_id is None:
            raise CommandError("server settings exist only in a server")
        if rest:
            key, _, value = rest.partition(" ")
            await self._change_setting(key.lower(), value.strip().lower())
        guild = await self.session.servers.guild_settings(self.session.guild_id)
        autos = ", ".join(f"#{name}" for name in self._channel_names(guild.auto_reply_channel_ids)) or "none"
        on = {True: "on", False: "off"}
        self.session.show(
            f"notices: {guild.notices} ({guild.notice_verbosity}); self-teaching {on[guild.self_teaching]}; "
            f"member teaching {on[guild.member_teaching]}; personal memories {on[guild.personal_memories]}; "
            f"tagging {on[guild.tagging]}; auto-reply channels: {autos}"
        )

    def _channel_names(self, ids: tuple[int, ...]) -> list[str]:
        known = {local_id("channel", self.session.channel): self.session.channel}
        return [known.get(channel_id, str(channel_id)) for channel_id in ids]

    async def _change_setting(self, key: str, value: str) -> None:
        assert self.session.guild_id is not None
        if key == "auto-reply":
            if value not in SWITCH:
                raise CommandError("/settings auto-reply on|off (for the current channel)")
            current = (await self.session.servers.guild_settings(self.session.guild_id)).auto_reply_channel_ids
            if SWITCH[value] != (self.session.channel_id in current):
                await self.session.servers.set_auto_reply(
                    self.session.guild_id, self.session.actor, self.session.channel_id, SWITCH[value]
                )
            return
        if key == "log-channel":
            if not value:
                raise CommandError("/settings log-channel NAME")
            await self.session.servers.update_guild_settings(
                self.session.guild_id, self.session.actor, log_channel_id=local_id("channel", value.lstrip("#"))
            )
            return
        if key not in SETTING_COLUMNS:
            raise CommandError(
                f"unknown setting {key!r}; the settings are {', '.join([*SETTING_COLUMNS, 'auto-reply', 'log-channel'])}"
            )
        column, choices = SETTING_COLUMNS[key]
        if choices is None:
            if value not in SWITCH:
                raise CommandError(f"/settings {key} on|off")
            await self.session.servers.update_guild_settings(self.session.guild_id, self.session.actor, **{column: SWITCH[value]})
        else:
            if value not in choices:
                raise CommandError(f"/settings {key} {'|'.join(choices)}")
            await self.session.servers.update_guild_settings(self.session.guild_id, self.session.actor, **{column: value})

    async def cmd_block(self, rest: str, blocked: bool = True) -> None:
        if self.session.guild_id is None:
            raise CommandError("the blocklist exists only in a server")
        name = self.session.name_arg(rest, "/block NAME" if blocked else "/unblock NAME")
        await self.session.services.set_blocked(self.session.guild_id, local_id("user", name), blocked, self.session.actor)
        self.session.show(f"{name} is {'blocked' if blocked else 'no longer blocked'} in this server")

    async def cmd_unblock(self, rest: str) -> None:
        await self.cmd_block(rest, blocked=False)

    async def cmd_persona(self, rest: str) -> None:
        field_name, _, value = rest.partition(" ")
        if field_name in ("name", "prompt"):
            if self.session.guild_id is None:
                raise CommandError("the DM persona follows DEFAULT_PERSONA_NAME / DEFAULT_PERSONA_PROMPT")
            if not value.strip():
                raise CommandError(f"/persona {field_name} TEXT")
            if field_name == "name":
                await self.session.servers.update_persona(self.session.guild_id, self.session.actor, name=value.strip())
            else:
                await self.session.servers.update_persona(self.session.guild_id, self.session.actor, prompt=value.strip())
            await self.session.refresh_persona()
        elif rest:
            raise CommandError("/persona [name TEXT | prompt TEXT]")
        persona = await self.session.servers.persona(self.session.guild_id)
        self.session.show(f"persona: {persona.name}\nprompt: {persona.prompt or '(empty)'}")

    async def cmd_lore(self, rest: str) -> None:
        action, _, value = rest.partition(" ")
        if action in ("add", "remove") and self.session.guild_id is None:
            raise CommandError("lore entries belong to a server's persona")
        if action == "add":
            entry = await self.session.servers.add_lore(self.session.guild_id or 0, self.session.actor, value)
            self.session.show(f"lore #{entry.id} added: {entry.text}")
        elif action == "remove":
            lore_id = self.session.id_arg(value, "/lore remove ID")
            await self.session.servers.remove_lore(self.session.guild_id or 0, self.session.actor, lore_id)
            self.session.show(f"lore #{lore_id} removed")
        elif action:
            raise CommandError("/lore [add TEXT | remove ID]")
        else:
            entries = await self.session.servers.lore(self.session.guild_id)
            self.session.show("always-on lore: " + ("none" if not entries else ""))
            for entry in entries:
                self.session.show(f"  #{entry.id} {entry.text}")

    async def cmd_receipt(self, rest: str) -> None:
        receipt = await self.session.services.chat_log.receipt(channel_id=self.session.channel_id)
        if receipt is None:
            self.session.show("no reply in this channel yet")
            return
        self.session.show(Receipt.from_dict(receipt).render())

    async def cmd_why(self, rest: str) -> None:
        await self.cmd_receipt(rest)

    async def cmd_receipts(self, rest: str) -> None:
        if rest:
            self.session.receipts = rest.lower() == "on"
        self.session.show(
            f"receipts after each reply: {'on' if self.session.receipts else 'off'} (/receipt shows the last reply's)"
        )

    # --- documents, chat history, the memory viewer, rebuild ---

    async def cmd_documents(self, rest: str) -> None:
        if self.session.guild_id is None:
            raise CommandError("documents belong to a server; /channel NAME goes back to one")
        action, _, value = rest.partition(" ")
        if action == "add":
            path = Path(value.strip())
            documents = self.session.services.documents
            limit = documents.settings.document_max_bytes
            try:  # never more than the limit and one byte: /dev/zero or a 4 GB log is refused, not read
                raw = await asyncio.to_thread(read_at_most, path, limit + 1)
            except OSError as exc:
                raise CommandError(f"cannot read {path}: {exc.strerror or exc}") from None
            if len(raw) > limit:
                raise CommandError(f"{path} is larger than {limit:,} bytes; documents are limited to that (DOCUMENT_MAX_BYTES)")
            added = await documents.add(self.session.guild_id, path.name, raw, self.session.actor)
            verb = "replaced" if added.replaced else "added"
            self.session.show(f"{verb} document #{added.id} {added.name}: {added.passages} passages, {added.embedded} embedded")
        elif action == "delete":
            document_id = self.session.id_arg(value.strip(), "/documents delete ID")
            name = await self.session.services.documents.delete(self.session.guild_id, document_id, self.session.actor)
            self.session.show(f"deleted document #{document_id} {name}")
        elif action:
            raise CommandError("/documents [add PATH | delete ID]")
        else:
            found = await self.session.services.documents.list(self.session.guild_id)
            self.session.show("documents: " + ("none (add one with /documents add PATH)" if not found else ""))
            for doc in found:
                size = describe_size(doc.size_bytes)
                self.session.show(f"  #{doc.id} {doc.name}: {size}, {doc.passages} passages, {doc.embedded} embedded")

    async def cmd_history(self, rest: str) -> None:
        if rest:
            if rest.lower() not in SWITCH:
                raise CommandError("/history [on|off] (for the current channel)")
            await self.session.services.history.set_recall(self.session.channel_id, self.session.guild_id, SWITCH[rest.lower()])
        enabled = await self.session.services.history.recall_enabled(self.session.channel_id)
        overview = await self.session.services.history.overview(self.session.channel_id)
        self.session.show(
            f"history recall {'on' if enabled else 'off (messages are still stored and chunked)'} here; "
            f"{overview.chunks} chunks ({overview.embedded} embedded), {overview.unchunked} messages in no chunk yet "
            f"(the last {self.session.services.settings.context_messages} are the context window and are never chunked)"
        )

    async def cmd_stats(self, rest: str) -> None:
        if rest not in ("", "mine"):
            raise CommandError("/stats [mine]")
        ref = (
            await self.session.manager.personal_list(self.session.user_id, self.session.guild_id)
            if rest
            else await self.session.server_list()
        )
        stats = await self.session.manager.stats(ref, embedding_problem=self.session.services.upkeep.last_error)
        self.session.show(
            f"{ref.label}: {stats.total} of {stats.limit}; desk {stats.desk}, drawer {stats.drawer}, "
            f"waiting for vector {stats.waiting}, embedding unavailable {stats.unavailable}; "
            f"~{stats.desk_tokens} tokens on the desk"
        )
        if stats.unavailable_reason:
            self.session.show(f"  no vector can be made now: {stats.unavailable_reason}")
        for bucket in buckets(stats.days, stats.dormant_after, stats.decay):
            where = "drawer" if bucket.drawer else "desk"
            self.session.show(f"  {bucket.label:>7} days unused | {'#' * bucket.count} {bucket.count} ({where})")
        if stats.total:
            chart = self.session.state_file.parent / "days-unused.png"
            chart.parent.mkdir(parents=True, exist_ok=True)
            chart.write_bytes(days_unused_chart(stats.days, stats.dormant_after, decay=stats.decay, title=ref.label))
            self.session.show(f"  chart: {chart}")

    async def cmd_rebuild(self, rest: str) -> None:
        state = await self.session.services.upkeep.rebuild()
        verdict = f"paused: {state.paused}" if state.paused else "done"
        self.session.show(
            f"rebuild {verdict}: {state.summary()}; {state.chunks_made} new chunks; {state.stale_removed} old vectors removed"
        )

    # --- channel summaries ---

    async def cmd_summaries(self, rest: str) -> None:
        """This channel's day and week summaries, as `/summaries` on Discord; `/day` ends a chat day, and the
        channel's next message has it summarised in the background."""
        action, _, value = rest.partition(" ")
        action, value = action.lower(), value.strip()
        summaries = self.session.services.summaries
        if action in ("on", "off"):
            await summaries.set_enabled(self.session.channel_id, self.session.guild_id, SWITCH[action])
            self.session.show(
                f"summaries {action} in this channel" + ("" if SWITCH[action] else ": nothing here is summarised or shown")
            )
            return
        off = await summaries.why_off(self.session.channel_id, self.session.guild_id)
        if off is not None:
            raise CommandError(SUMMARIES_OFF[off])
        if action == "show":
            self._show_summary(await summaries.get(self.session.channel_id, self.session.id_arg(value, "/summaries show ID")))
        elif action == "regenerate":
            summary_id = self.session.id_arg(value, "/summaries regenerate ID")
            written = await summaries.regenerate(self.session.channel_id, self.session.guild_id, summary_id, self.session.actor)
            if written.last_error is not None:
                kept = "still missing" if written.status == Status.MISSING else "kept as it was"
                self.session.show(f"the summary model failed, so #{written.id} {written.period} is {kept}: {written.last_error}")
            else:
                self._show_summary(written)
        elif action == "backfill":
            days = (int(value) if len(value) <= 6 else 365) if value else self.session.services.settings.summary_backfill_days
            await self._backfill(days)
        elif action:
            raise CommandError(SUMMARIES_USAGE)
        else:
            await summaries.settle()  # a day rollover may be summarising in the background right now
            entries = await summaries.overview(self.session.channel_id)
            self.session.show(
                f"summaries of this channel: {len(entries) or 'none yet (a chat day is summarised after it ends; /day)'}"
            )
            for entry in entries:
                found = entry.summary
                head = f"#{found.id}" if found is not None else "--"
                period = found.period if found is not None else period_label(entry.kind, entry.period_start)
                text = f" {' '.join(found.summary.split())}" if found is not None and found.summary else ""
                self.session.show(f"  {head} {period} [{entry.state}]{text}")

    def _show_summary(self, found: Summary) -> None:
        marks = [found.status.value, f"{found.message_count} messages"]
        if found.edited:
            marks.append("edited: never overwritten")
        if found.stale:
            marks.append("stale")
        self.session.show(f"summary #{found.id} {found.period} [{', '.join(marks)}]")
        if found.summary:
            self.session.show(f"  {found.summary}")
        for detail in found.key_details:
            self.session.show(f"  - {detail}")
        if found.status == Status.MISSING and found.last_error:
            self.session.show(f"  last error: {found.last_error}")

    async def _backfill(self, days: int) -> None:
        def progress(state: BackfillProgress) -> None:
            if not state.finished:
                self.session.show(f"  {state.line()}")

        state = await self.session.services.summaries.catch_up(
            self.session.channel_id, self.session.guild_id, days=min(days, 365), progress=progress, retry_now=True
        )
        self.session.show(f"backfill done: {state.line()}")
        for failure in state.failed:
            self.session.show(f"  failed: {failure}")
        self.session.show("  running it again resumes: it only writes what is still missing")
