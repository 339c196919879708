"""The load test's world, shared by the test process and its worker processes (tests/load_worker.py).

A *world* is a few servers and users, the protected "anchor" memories they start with, and, for
each simulated UTC day, the operations people perform, in three phases:

0. `/memories add`-style command saves, at most one per list (protected memories);
1. replies only: chatter, questions about anchors, DMs; the first search of the day ages things;
2. replies and saves together: people ask the bot to remember facts (the chat model answers with a
   `save_memory` tool call), ask about anchors and chat.

Each phase's operations run concurrently across every worker, but the phases of a day run one after
the other. That keeps every day *confluent*: whatever the interleaving inside a phase, the end state
has the same counters (which of two identical facts saved the same day gets forgotten may differ; their
counters cannot), so a sequential replay of the same operations is a reference the concurrent run
must match exactly. A last "chaos" day mixes all phases at once and is checked against the invariants only.

Similarity is made exact by `TopicEmbedder`: a question about anchor N matches that anchor with cosine 1
and nothing else, facts never match anything, chatter matches nothing. So which memories a reply uses is
known, and each memory's counter can also be predicted from the days its list was searched.

The chat model is `RuleChatServer`, an OpenAI-compatible endpoint on 127.0.0.1 that answers
"remember-server: X" / "remember-personal: X" with a save_memory tool call and anything else with "ok".
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any, ClassVar

import asyncpg
import numpy as np
from aiohttp import web

from bot.chat.messages import IncomingMessage, UserRef
from bot.chat.reply import ReplyPipeline
from bot.clock import ManualClock
from bot.config import Settings
from bot.db import create_pool
from bot.embeddings.providers import DeadlineEmbedder, EmbeddingSpace
from bot.memory.models import MemoryList, NewMemory, Source
from bot.memory.service import MemoryCore
from bot.services import build_services, memory_core
from tests.fakes import LocalEndpoint

BOT_ID = 9_000_000
ADMIN_ID = 8_000_000
MESSAGE_ID_BASE = 10_000_000_000
REPLY_CHANNEL_BASE = 20_000_000_000
START = date(2026, 5, 1)
ANCHOR = re.compile(r"\banchor-(\d+)\b")


# --- sizes -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Size:
    """How big a run is. `ci` keeps `make test` short on a 2-core machine; `soak` is `make soak`."""

    guilds: int
    users: int
    channels_per_guild: int
    days: int  # confluent days, each compared with the reference replay; one chaos day follows
    chatter_per_participant: int  # phase 1 replies per (guild, participating user)
    questions_per_participant: int  # phase 1 and 2 questions about anchors
    remembers_per_participant: int  # phase 2 saves through the chat model
    participation: float  # chance a user takes part in a server on a day
    workers_in_process: int = 2
    worker_processes: int = 1
    server_limit: int = 10
    personal_limit: int = 5
    dormant_after_days: int = 2
    concurrency: int = 24  # operations in flight per worker

    @classmethod
    def ci(cls) -> Size:
        return cls(guilds=3, users=8, channels_per_guild=4, days=5, chatter_per_participant=3,
                   questions_per_participant=2, remembers_per_participant=3, participation=0.8)

    @classmethod
    def soak(cls) -> Size:
        return cls(guilds=6, users=16, channels_per_guild=6, days=10, chatter_per_participant=5,
                   questions_per_participant=3, remembers_per_participant=4, participation=0.7,
                   workers_in_process=2, worker_processes=2)

    def settings(self, chat_url: str) -> Settings:
        return Settings(
            chat_base_url=chat_url,
            chat_model="rule-model",
            chat_timeout_s=60.0,
            embedding_timeout_s=60.0,
            context_messages=3,  # the window: a message by each of the (at most two) other participants
            server_memory_limit=self.server_limit,
            personal_memory_limit=self.personal_limit,
            dormant_after_days=self.dormant_after_days,
            max_used=3,
            min_similarity=0.5,
            # the oracle knows every cosine similarity exactly (TopicEmbedder); the word bonus of hybrid
            # scoring ("anchor" is shared by every anchor) is tested on its own in test_lexical.py
            lexical_weight=0.0,
            max_recalled=0,
            memory_token_budget=8_000,
            # merging a full list's related memories makes the outcome depend on which save came first (the
            # pair joined first changes what the next save finds), which a sequential replay cannot mirror; its
            # concurrency is tested in test_merges.py, the forgetting rule's here
            merge_max_chars=0,
        )


# --- the embedder and the chat model -------------------------------------------------------------


class TopicEmbedder:
    """Exact similarities: "anchor-N" -> axis 2+N, facts and notes -> axis 1, everything else -> axis 0.

    A request to remember ("remember-...") is chatter (axis 0) even though it carries a fact, so asking
    to save never uses a memory.
    """

    def __init__(self, anchors: int) -> None:
        self.dimensions = anchors + 2
        self._space = EmbeddingSpace("test", "", "topics")

    @property
    def space(self) -> EmbeddingSpace:
        return self._space

    def axis(self, text: str) -> int:
        if "remember-" in text:
            return 0
        found = ANCHOR.search(text)
        if found:
            return 2 + int(found.group(1))
        if "fact-" in text or "note-" in text:
            return 1
        return 0

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        vectors = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        for row, text in enumerate(texts):
            vectors[row, self.axis(text)] = 1.0
        return vectors


REMEMBER = re.compile(r"remember-(server|personal): (.+)$")


class RuleChatServer(LocalEndpoint):
    """An OpenAI-compatible chat endpoint on 127.0.0.1 whose answer depends only on the request.

    (tests/fakes.py's FakeChatServer answers from a script in arrival order, which concurrent replies
    would scramble.)
    """

    runner_options: ClassVar[dict[str, Any]] = {"access_log": None, "shutdown_timeout": 0.5}

    def __init__(self) -> None:
        self.requests = 0

    def app(self) -> web.Application:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        return app

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests += 1
        messages = body["messages"]
        message: dict[str, Any] = {"role": "assistant", "content": "ok"}
        last = messages[-1]
        if last["role"] == "user" and body.get("tool_choice") != "none":
            found = REMEMBER.search(last["content"].rsplit("\n", 1)[-1])
            if found:
                arguments = json.dumps({"text": found.group(2), "list": found.group(1)})
                call = {"name": "save_memory", "arguments": arguments}
                message = {"role": "assistant", "content": None,
                           "tool_calls": [{"id": f"call_{self.requests}", "type": "function", "function": call}]}
        return web.json_response({
            "id": f"chatcmpl-{self.requests}", "object": "chat.completion", "created": int(time.time()), "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if "tool_calls" in message else "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        })


# --- the world ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Anchor:
    number: int
    list: str  # "server" | "personal"
    guild: int | None  # the server list's server, or the persona a personal anchor is tied to (None = Global)
    owner: int | None

    @property
    def text(self) -> str:
        return f"anchor-{self.number} is something people ask about"


@dataclass
class Op:
    id: int
    kind: str  # "reply" | "command"
    guild: int | None
    author: int
    text: str
    channel: int = 0
    mentions: tuple[int, ...] = ()
    list: str = ""  # command saves
    owner: int | None = None

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Op:
        return cls(**{**data, "mentions": tuple(data["mentions"])})


@dataclass
class Day:
    number: int  # 1-based
    phases: list[list[Op]]
    participants: dict[int | None, set[int]]  # guild (None = DMs) -> users taking part that day
    asked: set[int] = field(default_factory=set)  # anchors some reply asked about

    @property
    def date(self) -> date:
        return START + timedelta(days=self.number)


class World:
    def __init__(self, size: Size, seed: int = 6) -> None:
        self.size = size
        self.rng = random.Random(seed)
        self.guilds = [1000 + g for g in range(size.guilds)]
        self.users = [100 + u for u in range(size.users)]
        self.channels = {g: [g * 100 + c for c in range(size.channels_per_guild)] for g in self.guilds}
        anchors: list[Anchor] = []
        for guild in self.guilds:
            for _ in range(2):
                anchors.append(Anchor(len(anchors), "server", guild, None))
        for user in self.users:
            anchors.append(Anchor(len(anchors), "personal", None, user))  # Global
            anchors.append(Anchor(len(anchors), "personal", self.guilds[user % len(self.guilds)], user))
        self.anchors = anchors
        self._ids = 0

    def _op(self, **kwargs: Any) -> Op:
        self._ids += 1
        return Op(id=self._ids, **kwargs)

    def anchors_visible(self, guild: int | None, participants: Sequence[int]) -> list[Anchor]:
        """Anchors a reply in `guild` with these participants searches."""
        found = []
        for anchor in self.anchors:
            if anchor.list == "server":
                if anchor.guild == guild:
                    found.append(anchor)
            elif anchor.owner in participants and (anchor.guild is None or anchor.guild == guild):
                found.append(anchor)
        return found

    def reply(self, day: Day, guild: int | None, author: int, text: str, mentions: tuple[int, ...] = ()) -> Op:
        channel = self.rng.choice(self.channels[guild]) if guild is not None else 50_000 + author
        for anchor in ANCHOR.findall(text):
            day.asked.add(int(anchor))
        return self._op(kind="reply", guild=guild, author=author, text=text, channel=channel, mentions=mentions)

    def question(self, day: Day, guild: int | None, author: int, others: Sequence[int]) -> Op:
        mentions = tuple(self.rng.sample(list(others), min(len(others), self.rng.randint(0, 2))))
        anchor = self.rng.choice(self.anchors_visible(guild, (author, *mentions)))
        return self.reply(day, guild, author, f"what about anchor-{anchor.number}?", mentions)

    def make_day(self, number: int, quiet_guild: int | None = None) -> Day:
        size, rng = self.size, self.rng
        participants: dict[int | None, set[int]] = {}
        for guild in self.guilds:
            chosen = {u for u in self.users if rng.random() < size.participation} if guild != quiet_guild else set()
            if guild != quiet_guild and len(chosen) < 2:
                chosen |= set(rng.sample(self.users, 2))
            participants[guild] = chosen
        participants[None] = set(rng.sample(self.users, max(1, len(self.users) // 4)))  # some write in DMs
        day = Day(number, [[], [], []], participants)

        commands = day.phases[0]
        if number % 2 == 1:  # every other day, an admin adds a note to one server and a user to their own list
            guild = rng.choice(self.guilds)
            commands.append(self._op(kind="command", guild=guild, author=ADMIN_ID, list="server",
                                     text=f"note-{self._ids + 1} added by an admin"))
            user = rng.choice(sorted(participants[guild] or set(self.users)))
            commands.append(self._op(kind="command", guild=guild, author=user, list="personal", owner=user,
                                     text=f"note-{self._ids + 1} about myself"))

        first, second = day.phases[1], day.phases[2]
        for guild in self.guilds:
            people = sorted(participants[guild])
            for user in people:
                others = [p for p in people if p != user]
                for _ in range(size.chatter_per_participant):
                    first.append(self.reply(day, guild, user, f"chatter {self._ids + 1}: the train was late again"))
                for _ in range(size.questions_per_participant):
                    first.append(self.question(day, guild, user, others))
                    second.append(self.question(day, guild, user, others))
                for _ in range(size.remembers_per_participant):
                    which = "server" if rng.random() < 0.6 else "personal"
                    second.append(self.reply(day, guild, user, f"remember-{which}: fact-{self._ids + 1} learned on day {number}"))
                second.append(self.reply(day, guild, user, f"chatter {self._ids + 1}: see you later"))
        for user in sorted(participants[None]):
            first.append(self.question(day, None, user, ()))
        for phase in day.phases:
            rng.shuffle(phase)
        return day

    def days(self) -> list[Day]:
        quiet = self.guilds[-1]
        return [self.make_day(n, quiet_guild=quiet if n == 2 else None) for n in range(1, self.size.days + 1)]

    def chaos_day(self) -> Day:
        day = self.make_day(self.size.days + 1)
        mixed = [op for phase in day.phases for op in phase]
        self.rng.shuffle(mixed)
        day.phases = [mixed]
        return day


# --- running operations -----------------------------------------------------------------------------


class Worker:
    """One bot process's services: its own pool, memory core and reply pipeline on the shared database."""

    def __init__(self, core: MemoryCore, pipeline: ReplyPipeline, clock: ManualClock, concurrency: int) -> None:
        self.core = core
        self.pipeline = pipeline
        self.clock = clock
        self.concurrency = concurrency

    @classmethod
    async def open(cls, db_url: str, size: Size, chat_url: str, *, pool_size: int = 8, statement_cache: bool = True) -> Worker:
        settings = size.settings(chat_url).with_overrides(pg_statement_cache=statement_cache)
        pool = await create_pool(db_url, max_size=pool_size, statement_cache=statement_cache)
        clock = ManualClock()
        embedder = DeadlineEmbedder(TopicEmbedder(len(World(size).anchors)), settings.embedding_timeout_s)
        core = memory_core(pool, embedder, settings, clock)
        pipeline = build_services(core, bot_user_id=BOT_ID).pipeline
        await pipeline.servers.sync_default_persona()
        return cls(core, pipeline, clock, size.concurrency)

    async def close(self) -> None:
        await self.pipeline.model.close()
        await self.core.pool.close()

    async def run(self, day: date, ops: Sequence[Op], *, sequential: bool = False) -> list[dict[str, Any]]:
        self.clock.set_date(day)
        if sequential:
            return [await self.run_one(op) for op in ops]
        gate = asyncio.Semaphore(self.concurrency)

        async def bounded(op: Op) -> dict[str, Any]:
            async with gate:
                return await self.run_one(op)

        return list(await asyncio.gather(*(bounded(op) for op in ops)))

    async def run_one(self, op: Op) -> dict[str, Any]:
        started = time.perf_counter()
        result = await self._run_one(op)
        result["ms"] = round((time.perf_counter() - started) * 1000, 2)
        return result

    async def _run_one(self, op: Op) -> dict[str, Any]:
        try:
            if op.kind == "command":
                result = await self.core.save(NewMemory(
                    list=MemoryList(op.list), text=op.text, by=op.author, via=Source.COMMAND, guild_id=op.guild,
                    owner_id=op.owner, by_can_manage=True,
                ))
                change = {"kind": "saved" if result.saved else "rejected", "list": op.list,
                          "about_user_id": op.owner, "reason": result.rejected.value if result.rejected else ""}
                made_room = [{"kind": "forgotten_to_make_room", "list": op.list, "about_user_id": op.owner, "reason": ""}
                             for _ in result.forgotten]
                return {"id": op.id, "changes": [change, *made_room]}
            # the other participants write in the window first (a user who is only mentioned takes no part); a
            # channel of its own per reply keeps other workers' messages out of that window
            channel = REPLY_CHANNEL_BASE + op.id
            for number, user in enumerate(op.mentions):
                await self.pipeline.chat_log.record(IncomingMessage(
                    message_id=MESSAGE_ID_BASE + op.id - 1 - number, channel_id=channel, author_id=user,
                    author_name=f"user{user}", text="hi", created_at=self.clock.now(), guild_id=op.guild,
                ))
            incoming = IncomingMessage(
                message_id=MESSAGE_ID_BASE + op.id, channel_id=channel, author_id=op.author, author_name=f"user{op.author}",
                text=op.text, created_at=self.clock.now(), guild_id=op.guild,
                mentions=tuple(UserRef(user, f"user{user}") for user in op.mentions),
            )
            outcome = await self.pipeline.reply(incoming)
            return {
                "id": op.id, "status": outcome.status.value, "search_ok": outcome.recall.search_ok,
                "used": [scored.memory.id for scored in outcome.recall.used],
                "used_texts": [scored.memory.text for scored in outcome.recall.used],
                "changes": [change.as_dict() for change in outcome.changes],
            }
        except Exception as exc:  # reported, and the test fails on any
            return {"id": op.id, "error": f"{type(exc).__name__}: {exc}"}


async def create_anchors(worker: Worker, world: World) -> None:
    """Day 0: every anchor, added by a command (so protected), one after the other."""
    worker.clock.set_date(START)
    for anchor in world.anchors:
        result = await worker.core.save(NewMemory(
            list=MemoryList(anchor.list), text=anchor.text, by=anchor.owner or ADMIN_ID, via=Source.COMMAND,
            guild_id=anchor.guild, owner_id=anchor.owner, is_global=anchor.list == "personal" and anchor.guild is None,
            by_can_manage=True,
        ))
        assert result.saved is not None, result.detail


# --- what the database holds ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    list_key: tuple[Any, ...]
    text: str
    source: str
    protected: bool
    created_on: date
    days_unused: int
    last_aged_on: date
    last_used_on: date | None

    def shape(self) -> tuple[Any, ...]:
        """What must match the reference: everything but the text of unprotected facts (identical within a day)."""
        text = self.text if self.protected else self.text.split(" ", 1)[0].rstrip("0123456789")
        return (self.list_key, text, self.source, self.protected, self.created_on, self.days_unused, self.last_aged_on,
                self.last_used_on)


SNAPSHOT_SQL = """
SELECT m.list, m.guild_id, m.owner_id, p.guild_id AS persona_guild, m.persona_id IS NULL AS is_global, m.text, m.source,
       m.protected, (m.created_at AT TIME ZONE 'UTC')::date AS created_on, m.days_unused, m.last_aged_on,
       (m.last_used_at AT TIME ZONE 'UTC')::date AS last_used_on
FROM memories m LEFT JOIN personas p ON p.id = m.persona_id
"""


def list_key(row: asyncpg.Record) -> tuple[Any, ...]:
    if row["list"] == "server":
        return ("server", row["guild_id"])
    return ("personal", row["owner_id"], "global" if row["is_global"] else row["persona_guild"])


async def snapshot(pool: asyncpg.Pool) -> list[Row]:
    rows = await pool.fetch(SNAPSHOT_SQL)
    return [
        Row(list_key(r), r["text"], r["source"], r["protected"], r["created_on"], r["days_unused"], r["last_aged_on"],
            r["last_used_on"])
        for r in rows
    ]


def now_utc() -> datetime:
    return datetime.now(UTC)
