"""`python -m bench.notes`: what the bot remembers from scripted multi-person, multi-day chats, by who writes memories.

The conversations (bench/data/notes_conversations.json) are three people per server over three chat days:
facts people tell about themselves and their server (some to the bot, most to each other), corrections of
them, claims about someone else, chit-chat and lines in Spanish, with the facts each should leave behind.
Each is played through the same wiring as the bot (`open_services`, `ChatService.handle`) on a throwaway
database, against a real OpenAI-compatible chat model, once per path:

- `tools`: today's reply tools only (MEMORY_NOTES=tools): the model saves what it decides to, mid-reply;
- `notes`: the day-end notes only (MEMORY_NOTES=daily): the day summary's pass writes down what the day taught;
- `both`: the default (the reply's tools for "please remember", and the day-end notes).

The scorer reads the memories left at the end (and after each chat day) and counts, over all conversations:
facts kept (right text, right person, right list), memories about a person written from someone else's words
(another person's fact in their list, or a claim someone made about them), duplicates, contradictions left
standing after a correction, facts lost to an update (kept after some day, gone at the end without a
correction), and the model calls and tokens per chat day (every request passes through a recording proxy).

    python -m bench.notes --base-url http://127.0.0.1:8120/v1 --label qwen2.5-coder-1.5b [--paths tools,notes,both]

Needs a chat model; never run in CI. Results go to bench/notes_results.json (one entry per label and path).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from aiohttp import web

from bench import e2e_proxy
from bench.e2e_proxy import ModelProxy
from bot.chat.messages import IncomingMessage
from bot.chat.receipts import ReplyStatus
from bot.clock import ManualClock
from bot.config import Settings, load_settings
from bot.db import throwaway_database
from bot.memory.models import Memory, MemoryList
from bot.services import Services, open_services
from bot.summaries.writer import COMBINE_INSTRUCTIONS, DAY_INSTRUCTIONS, WEEK_INSTRUCTIONS

DATA = Path(__file__).resolve().parent / "data" / "notes_conversations.json"
RESULTS = Path(__file__).resolve().parent / "notes_results.json"
RECORDINGS = Path(__file__).resolve().parent / "notes_recordings"  # every model call of a run (resumable; not committed)
PATHS = {"tools": "tools", "notes": "daily", "both": "both"}
BOT_USER_ID = 2
SLOW_MODEL_S = 7_200.0
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)  # a Monday
log = logging.getLogger(__name__)


# --- the scorer (pure: memories in, figures out) ---------------------------------------------------------------


def _bare(text: str) -> str:
    folded = unicodedata.normalize("NFKD", text.casefold())
    return " ".join("".join(c for c in folded if not unicodedata.combining(c)).split())


def matches(text: str, keys: Sequence[Sequence[str]]) -> bool:
    """Every group of `keys` has one of its words in `text` (case and accents ignored)."""
    bare = _bare(text)
    return all(any(_bare(word) in bare for word in group) for group in keys)


@dataclass(frozen=True)
class Kept:
    """A memory as the scorer sees it: its list, whose it is (a person key, or None for the server), its text."""

    list: str
    who: str | None
    text: str


@dataclass
class Score:
    facts: int = 0
    kept: int = 0
    wrong_person: int = 0
    claims_saved: int = 0
    duplicates: int = 0
    corrections: int = 0
    contradictions: int = 0
    lost_to_update: int = 0
    memories: int = 0
    details: list[str] = field(default_factory=list)

    def add(self, other: Score) -> None:
        for name in ("facts", "kept", "wrong_person", "claims_saved", "duplicates", "corrections", "contradictions",
                     "lost_to_update", "memories"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.details += other.details


def _in_place(memory: Kept, who: str) -> bool:
    return memory.who is None and memory.list == "server" if who == "server" else memory.list == "personal" and memory.who == who


def score_conversation(conversation: dict[str, Any], final: Sequence[Kept], days: Sequence[Sequence[Kept]] = ()) -> Score:
    """The figures of one conversation from the memories it left (`final`) and after each chat day (`days`)."""
    name = conversation["name"]
    facts = {fact["id"]: fact for fact in conversation["facts"]}
    replaced = {fact["replaces"] for fact in facts.values() if fact.get("replaces")}
    score = Score(memories=len(final))
    for fact in facts.values():
        if fact["id"] in replaced:
            continue
        score.facts += 1
        placed = [m for m in final if _in_place(m, fact["who"]) and matches(m.text, fact["keys"])]
        if placed:
            score.kept += 1
            score.duplicates += len(placed) - 1
        else:
            score.details.append(f"{name}: not kept: {fact['id']}")
            if any(_kept(day, fact) for day in days):
                score.lost_to_update += 1
                score.details.append(f"{name}: lost after it was kept: {fact['id']}")
        old = facts.get(fact.get("replaces") or "")
        if old is not None:
            score.corrections += 1
            standing = [m for m in final if _in_place(m, old["who"]) and matches(m.text, old["keys"])
                        and not matches(m.text, fact["keys"])]
            if standing:
                score.contradictions += 1
                score.details.append(f"{name}: still stands after {fact['id']}: {standing[0].text!r}")
    for memory in final:
        if memory.list != "personal":
            continue
        others = [f for f in facts.values() if f["who"] not in (memory.who, "server") and matches(memory.text, f["keys"])]
        claims = [c for c in conversation.get("claims", []) if c["about"] == memory.who and matches(memory.text, c["keys"])]
        if others or claims:
            score.wrong_person += 1
            score.details.append(f"{name}: about {memory.who} from someone else's words: {memory.text!r}")
    score.claims_saved = sum(
        1 for memory in final for claim in conversation.get("claims", []) if matches(memory.text, claim["keys"])
        and (memory.list == "server" or memory.who == claim["about"])
    )
    return score


def _kept(memories: Sequence[Kept], fact: dict[str, Any]) -> bool:
    return any(_in_place(m, fact["who"]) and matches(m.text, fact["keys"]) for m in memories)


# --- the model's calls: through the end-to-end benchmark's recording proxy ------------------------------------

SUMMARY_PROMPTS = (DAY_INSTRUCTIONS, COMBINE_INSTRUCTIONS, WEEK_INSTRUCTIONS)


class NotesProxy(ModelProxy):
    """`bench.e2e_proxy.ModelProxy` (temperature 0, a fixed seed, every call recorded, a run resumed from its
    recording), counting replies and the summary pass apart: each request is filed by its system prompt."""

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        first = str((body.get("messages") or [{}])[0].get("content") or "")
        self.phase = "summary" if first in SUMMARY_PROMPTS else "reply"
        status, answer = await self._call(self.prepare(body))
        return web.json_response(answer, status=status)


# --- playing a conversation ----------------------------------------------------------------------------------


class Player:
    """Plays conversations into one set of services: each in its own server and channel, its people with their own ids."""

    def __init__(self, services: Services, clock: ManualClock, *, replies: bool = True) -> None:
        self.services = services
        self.clock = clock
        self.replies = replies  # False: lines said to the bot are stored but not answered (the notes alone, faster)
        self.message_id = 10_000

    def _next_id(self) -> int:
        self.message_id += 1
        return self.message_id

    async def play(self, number: int, conversation: dict[str, Any]) -> tuple[list[Kept], list[list[Kept]], int]:
        """All of a conversation's days, then one more message to end the last one. Returns the memories left,
        the memories after each chat day, and how many chat days it had."""
        guild, channel = 80_000 + number, 90_000 + number
        users = {key: 70_000 + number * 10 + index for index, key in enumerate(conversation["people"])}
        names = conversation["people"]
        snapshots: list[list[Kept]] = []
        for day, lines in enumerate(conversation["days"]):
            self.clock.current = START + timedelta(days=day + number * 10)
            for index, line in enumerate(lines):
                key, text, *to_bot = line
                self.clock.current += timedelta(minutes=3)
                manager = key in conversation.get("managers", ())
                await self._say(guild, channel, users[key], names[key], text, bool(to_bot), manager)
                if index == 0 and day > 0:  # the day before was summarised (and noted) in the background
                    await self.services.summaries.settle()
                    snapshots.append(await self.memories(guild, users))
        self.clock.current = START + timedelta(days=len(conversation["days"]) + number * 10, hours=1)
        first = next(iter(users))
        await self._say(guild, channel, users[first], names[first], "morning all", False, False)
        await self.services.summaries.settle()
        final = await self.memories(guild, users)
        snapshots.append(final)
        return final, snapshots, len(conversation["days"])

    async def _say(self, guild: int, channel: int, user: int, name: str, text: str, to_bot: bool, manager: bool) -> None:
        incoming = IncomingMessage(
            message_id=self._next_id(), channel_id=channel, author_id=user, author_name=name, text=text,
            created_at=self.clock.now(), guild_id=guild, where='#general in "bench server"', author_can_manage=manager,
        )
        if not self.replies:  # stored as the chat cog stores what it does not answer; the day rollover still counts
            await self.services.chat.record(incoming)
            self.services.summaries.saw(channel, guild)
            return
        outcome = await self.services.chat.handle(incoming, mentions_bot=to_bot)
        if outcome is None or outcome.status != ReplyStatus.REPLIED:
            return
        for chunk in outcome.chunks:  # the bot's messages are part of the channel, as on Discord
            self.clock.current += timedelta(seconds=20)
            await self.services.chat.record(IncomingMessage(
                message_id=self._next_id(), channel_id=channel, author_id=BOT_USER_ID, author_name="Deskmate",
                text=chunk, created_at=self.clock.now(), guild_id=guild, is_bot=True, reply_to=incoming.message_id,
            ))

    async def memories(self, guild: int, users: dict[str, int]) -> list[Kept]:
        keys = {user: key for key, user in users.items()}
        found: list[Memory] = await self.services.core.all_memories()
        kept = []
        for memory in found:
            if memory.list == MemoryList.SERVER and memory.guild_id == guild:
                kept.append(Kept("server", None, memory.text))
            elif memory.list == MemoryList.PERSONAL and memory.owner_id in keys:
                kept.append(Kept("personal", keys[memory.owner_id], memory.text))
        return kept


async def run_path(
    settings: Settings,
    conversations: list[dict[str, Any]],
    path: str,
    recording: Path | None,
    say: Any = print,
    *,
    replies: bool = True,
    summaries: bool = True,
    done: Any = None,
) -> dict[str, Any]:
    """Every conversation through one path (tools / notes / both) with the configured model; figures and memories.
    `recording` keeps every call, so an interrupted run resumes where it stopped. `replies=False`: lines said to
    the bot are not answered; `summaries=False`: no summary pass (for the tools path: what the tools alone save).
    `done` is given the figures so far after each conversation (a slow run that is stopped still leaves them)."""
    started = time.monotonic()
    e2e_proxy.UPSTREAM_TIMEOUT_S = SLOW_MODEL_S  # a loaded CPU: one call may take an hour, and a retry starts over
    async with NotesProxy(settings.chat_base_url, settings.chat_api_key, settings.chat_model, recording) as proxy:
        configured = settings.with_overrides(
            chat_base_url=proxy.url, summary_base_url=proxy.url, memory_notes=PATHS[path], summary_enabled=summaries,
            chat_timeout_s=SLOW_MODEL_S, summary_timeout_s=SLOW_MODEL_S,
        )
        async with throwaway_database(configured, "notes benchmark") as database:
            clock = ManualClock(START)
            async with open_services(configured, database=database, clock=clock, bot_user_id=BOT_USER_ID) as services:
                player = Player(services, clock, replies=replies)
                total, chat_days, left = Score(), 0, {}
                for number, conversation in enumerate(conversations):
                    final, snapshots, days = await player.play(number, conversation)
                    found = score_conversation(conversation, final, snapshots)
                    total.add(found)
                    chat_days += days
                    left[conversation["name"]] = [f"[{m.list}{':' + m.who if m.who else ''}] {m.text}" for m in final]
                    say(f"  {path} · {conversation['name']}: {found.kept}/{found.facts} kept, {found.wrong_person} wrong "
                        f"person, {found.contradictions} contradictions, {found.duplicates} duplicates")
                    if done is not None and number < len(conversations) - 1:
                        so_far = _figures(path, total, proxy.totals(), chat_days, time.monotonic() - started, left)
                        partial = f"{number + 1} of {len(conversations)} conversations"
                        done(so_far | {"replies": replies, "summaries": summaries, "partial": partial})
    figures = _figures(path, total, proxy.totals(), chat_days, time.monotonic() - started, left)
    return figures | {"replies": replies, "summaries": summaries}


def _figures(
    path: str, total: Score, usage: dict[str, dict[str, Any]], chat_days: int, seconds: float, left: dict[str, list[str]]
) -> dict[str, Any]:
    empty = {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0, "model_seconds": 0.0}
    reply, summary = usage.get("reply", empty), usage.get("summary", empty)
    days = max(chat_days, 1)
    return {
        "path": path, "facts": total.facts, "kept": total.kept, "kept_share": round(total.kept / max(total.facts, 1), 3),
        "wrong_person": total.wrong_person, "claims_saved": total.claims_saved, "duplicates": total.duplicates,
        "corrections": total.corrections, "contradictions": total.contradictions, "lost_to_update": total.lost_to_update,
        "memories": total.memories, "chat_days": chat_days,
        "reply_calls_per_day": round(reply["calls"] / days, 2),
        "summary_calls_per_day": round(summary["calls"] / days, 2),
        "reply_tokens_per_day": round((reply["prompt_tokens"] + reply["completion_tokens"]) / days),
        "summary_tokens_per_day": round((summary["prompt_tokens"] + summary["completion_tokens"]) / days),
        "model_seconds": {"reply": round(reply["model_seconds"]), "summary": round(summary["model_seconds"])},
        "wall_seconds": round(seconds), "details": total.details, "memories_left": left,
    }


def load_conversations(names: Sequence[str] = ()) -> list[dict[str, Any]]:
    found = json.loads(DATA.read_text(encoding="utf-8"))["conversations"]
    return [c for c in found if not names or c["name"] in names]


async def main(args: argparse.Namespace) -> int:
    settings = load_settings().with_overrides(chat_base_url=args.base_url, chat_model=args.model, summary_model="",
                                              summary_base_url="", summary_api_key="")
    conversations = load_conversations(args.conversations.split(",") if args.conversations else ())
    results = json.loads(RESULTS.read_text(encoding="utf-8")) if RESULTS.is_file() else {}
    for path in args.paths.split(","):
        print(f"{args.label}: path {path}", flush=True)
        recording = RECORDINGS / f"{args.label}-{path}-replies-{args.replies}-summaries-{args.summaries}.jsonl"
        recording.parent.mkdir(parents=True, exist_ok=True)
        key = f"{path} (replies {args.replies}, summaries {args.summaries})"

        def keep(figures: dict[str, Any], key: str = key) -> None:
            figures["date"] = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
            figures["conversations"] = [c["name"] for c in conversations]
            results.setdefault(args.label, {})[key] = figures
            RESULTS.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

        figures = await run_path(
            settings, conversations, path, recording, lambda line: print(line, flush=True),
            replies=args.replies == "all", summaries=args.summaries == "on", done=keep,
        )
        keep(figures)
        print(json.dumps({k: v for k, v in figures.items() if k not in ("details", "memories_left")}), flush=True)
    return 0


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.notes", description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", required=True, help="the chat model's OpenAI-compatible endpoint, e.g. http://127.0.0.1:8120/v1")
    parser.add_argument("--model", default="local")
    parser.add_argument("--label", required=True, help="what to file the figures under, e.g. qwen2.5-coder-1.5b")
    parser.add_argument("--paths", default="tools,notes,both")
    parser.add_argument("--conversations", default="", help="comma-separated names (default: all)")
    parser.add_argument("--replies", choices=("all", "none"), default="all", help="answer the lines said to the bot")
    parser.add_argument("--summaries", choices=("on", "off"), default="on", help="the summary pass (and so the notes)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    raise SystemExit(asyncio.run(main(parse())))
