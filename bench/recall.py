"""Section 1: the cost of the per-reply search against the bare top-k lower bound.

What is timed is what the bot runs: `MemoryCore.reply_search(Conversation)` — persona and space
lookups (cached after the first reply), the one search statement (visibility, scoring, resets,
once-a-day aging, desk snapshot) and turning its rows into `Memory` objects. The embedding is
not part of it: a `PresetEmbedder` hands the core a vector computed beforehand, so both sides
get the same query and the embedder's cost is measured on its own in section 2.

The lower bound is one `SELECT id ... ORDER BY embedding <=> $q LIMIT 3` over the same
searchable set (server list + the participants' personal lists, same persona rule). Both sides
acquire a pooled connection, as any statement the bot runs must; they alternate in random order
reply by reply, so machine noise hits both alike.

The replies follow a day mix: each chat day a few servers are active and get 1–40 replies each,
mostly among a handful of regulars. The first reply of a day in a server ages its whole server
list and the participants' lists; later replies age only people who had not spoken yet that day.
Figures are reported over all replies and split into first-of-day and later replies.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import asyncpg
import numpy as np

from bench.synth import BASE_DAY, SPACE, Dataset, Server, message_text
from bot.clock import ManualClock
from bot.config import Settings
from bot.db import create_pool
from bot.embeddings.providers import EmbeddingSpace
from bot.lexical import lexical_query
from bot.memory import search_store
from bot.memory.models import Conversation
from bot.servers import store as servers_store
from bot.services import memory_core

TOPK_SQL = """
SELECT m.id FROM memories m JOIN memory_vectors v ON v.memory_id = m.id AND v.space_id = $4
WHERE (m.list = 'server' AND m.guild_id = $1 AND m.persona_id = $2)
   OR (m.list = 'personal' AND m.owner_id = ANY ($3::bigint[]) AND (m.persona_id IS NULL OR m.persona_id = $2))
ORDER BY v.embedding <=> $5 LIMIT 3
"""


class PresetEmbedder:
    """Returns the vector set just before the call, so the core's timing excludes the model."""

    def __init__(self, space: EmbeddingSpace = SPACE) -> None:
        self._space = space
        self.vector: np.ndarray | None = None

    @property
    def space(self) -> EmbeddingSpace:
        return self._space

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        assert self.vector is not None
        return np.repeat(self.vector[None, :], len(texts), axis=0)


@dataclass
class Timings:
    """Milliseconds of each side, tagged by whether the reply was its server's first of the day."""

    recall: list[float] = field(default_factory=list)
    topk: list[float] = field(default_factory=list)
    first: list[bool] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    used: list[int] = field(default_factory=list)

    def summary(self, mask: np.ndarray | None = None) -> dict[str, float]:
        recall = np.array(self.recall)
        topk = np.array(self.topk)
        if mask is not None:
            recall, topk = recall[mask], topk[mask]
        if len(recall) == 0:
            return {}
        p50, p50k = float(np.percentile(recall, 50)), float(np.percentile(topk, 50))
        return {
            "recall_ms_p50": round(p50, 3),
            "recall_ms_p99": round(float(np.percentile(recall, 99)), 3),
            "topk_ms_p50": round(p50k, 3),
            "topk_ms_p99": round(float(np.percentile(topk, 99)), 3),
            "ratio_p50": round(p50 / p50k, 3),
            "replies": len(recall),
        }

    def report(self) -> dict[str, Any]:
        first = np.array(self.first)
        result: dict[str, Any] = self.summary()
        result["first_of_day"] = self.summary(first)
        result["later"] = self.summary(~first)
        result["desk_rows_p50"] = float(np.median(self.rows))
        result["used_mean"] = round(float(np.mean(self.used)), 2)
        return result


def _participants(rng: random.Random, server: Server, regulars: list[int]) -> list[int]:
    """Three people: mostly the day's regulars, sometimes anyone from the server."""
    chosen: list[int] = []
    while len(chosen) < 3:
        pool = regulars if rng.random() < 0.8 else server.users
        user = rng.choice(pool)
        if user not in chosen:
            chosen.append(user)
    return chosen


async def measure(
    url: str, dataset: Dataset, replies: int, *, seed: int = 11, warmup: int = 50, progress: Callable[[str], None] | None = None
) -> Timings:
    """Replay `replies` timed replies (after `warmup` untimed ones) over simulated chat days."""
    say = progress or (lambda _: None)
    rng = random.Random(seed)
    vectors = np.random.default_rng(seed)
    pool = await create_pool(url, min_size=2, max_size=2)
    clock = ManualClock()
    embedder = PresetEmbedder()
    core = memory_core(pool, embedder, Settings(), clock)
    timings = Timings()
    day = BASE_DAY
    done = -warmup
    try:
        while done < replies:
            clock.set_date(day)
            active = rng.sample(dataset.servers, k=min(len(dataset.servers), rng.randint(3, 8)))
            schedule: list[Server] = []
            for server in active:
                schedule += [server] * rng.randint(1, 40)
            rng.shuffle(schedule)
            regulars = {s.guild_id: rng.sample(s.users, k=6) for s in active}
            seen: set[int] = set()
            for server in schedule:
                if done >= replies:
                    break
                people = _participants(rng, server, regulars[server.guild_id])
                topic = rng.choice(server.topics)
                embedder.vector = dataset.query_vector(vectors, topic)
                conversation = Conversation(
                    guild_id=server.guild_id,
                    channel_id=rng.choice(server.channel_ids),
                    author_id=people[0],
                    text=message_text(vectors, topic),
                    participant_ids=tuple(people[1:]),
                )
                first = server.guild_id not in seen
                seen.add(server.guild_id)
                persona = await core.servers.persona_id(server.guild_id)
                topk_args = (server.guild_id, persona, people, dataset.space_id, embedder.vector)
                recall_ms = topk_ms = 0.0
                outcome = None
                for side in rng.sample(("recall", "topk"), k=2):
                    started = time.perf_counter()
                    if side == "recall":
                        outcome = await core.reply_search(conversation)
                        recall_ms = (time.perf_counter() - started) * 1000
                    else:
                        async with pool.acquire() as conn:
                            await conn.fetch(TOPK_SQL, *topk_args)
                        topk_ms = (time.perf_counter() - started) * 1000
                done += 1
                if done > 0 and outcome is not None:
                    timings.recall.append(recall_ms)
                    timings.topk.append(topk_ms)
                    timings.first.append(first)
                    timings.rows.append(len(outcome.desk))
                    timings.used.append(len(outcome.used))
                    if done % 500 == 0:
                        say(f"  {done}/{replies} replies timed")
            day += timedelta(days=1)
    finally:
        await pool.close()
    return timings


async def breakdown(url: str, dataset: Dataset, replies: int, *, seed: int = 13) -> dict[str, float]:
    """Where the core's time goes, on later-in-the-day replies only (nothing left to age).

    Interleaves three sides on the same replies: the core's call, the bare search statement
    (`search_store.reply_search`, same parameters, so it returns the same rows; no `Memory` objects) and the top-k. The difference
    core − statement is Python (row decoding, `Memory` objects, desk order); statement − top-k is
    the SQL work beyond scoring (visibility, resets, desk snapshot, larger result).
    """
    rng = random.Random(seed)
    vectors = np.random.default_rng(seed)
    pool = await create_pool(url, min_size=2, max_size=2)
    clock = ManualClock()
    clock.set_date(BASE_DAY + timedelta(days=5000))  # after every day `measure` used
    embedder = PresetEmbedder()
    settings = Settings()
    core = memory_core(pool, embedder, settings, clock)
    combos = []
    for server in rng.sample(dataset.servers, k=min(20, len(dataset.servers))):
        combos.append((server, rng.sample(server.users, k=3)))
    times: dict[str, list[float]] = {"core": [], "statement": [], "topk": []}
    space = await core.embeddings.space_id()
    try:
        for index in range(replies + len(combos)):
            server, people = combos[index % len(combos)]
            embedder.vector = dataset.query_vector(vectors, rng.choice(server.topics))
            conversation = Conversation(server.guild_id, server.channel_ids[0], people[0], "hello", tuple(people[1:]))
            persona = await core.servers.persona_id(server.guild_id)
            if index < len(combos):  # the day's first reply of each group: ages, untimed
                await core.reply_search(conversation)
                continue
            for side in rng.sample(list(times), k=3):
                started = time.perf_counter()
                if side == "core":
                    await core.reply_search(conversation)
                elif side == "statement":
                    async with pool.acquire() as conn:
                        await search_store.reply_search(
                            conn, guild_id=server.guild_id, persona_id=persona, channel_id=server.channel_ids[0],
                            participants=people, context_words=["hello"], query_vector=embedder.vector, space=space,
                            min_similarity=settings.min_similarity, max_used=settings.max_used, now=clock.now(),
                            today=clock.now().date(), desk_below_days=settings.dormant_after_days,
                            max_recalled=settings.max_recalled, dormant_after=settings.dormant_after_days,
                            lexical=lexical_query(conversation.text), lexical_weight=settings.lexical_weight,
                        )
                else:
                    async with pool.acquire() as conn:
                        await conn.fetch(TOPK_SQL, server.guild_id, persona, people, dataset.space_id, embedder.vector)
                times[side].append((time.perf_counter() - started) * 1000)
    finally:
        await pool.close()
    return {f"{side}_ms_p50": round(float(np.median(values)), 3) for side, values in times.items()}


async def explain(url: str, dataset: Dataset, *, first_of_day: bool, seed: int = 3) -> str:
    """EXPLAIN ANALYZE of one reply's search statement and of the top-k, rolled back (diagnosis only)."""
    rng = random.Random(seed)
    vectors = np.random.default_rng(seed)
    server = rng.choice(dataset.servers)
    people = rng.sample(server.users, k=3)
    vector = dataset.query_vector(vectors, rng.choice(server.topics))
    connection = await asyncpg.connect(url)
    from pgvector.asyncpg import register_vector

    await register_vector(connection)
    out: list[str] = []
    try:
        persona = await servers_store.persona_for_guild(connection, server.guild_id)
        day = BASE_DAY + timedelta(days=1000)
        settings = Settings()
        args = (
            server.guild_id, persona, server.channel_ids[0], people, [], vector, dataset.space_id,
            settings.min_similarity, settings.max_used, clock_now(day), day, settings.dormant_after_days,
            settings.max_recalled, settings.dormant_after_days, "hello", "", settings.lexical_weight,
        )
        if not first_of_day:  # age this set today first, so the explained run is a later reply
            await connection.fetch(search_store.REPLY_SEARCH_SQL, *args)
        for label, sql, params in (
            ("reply search", search_store.REPLY_SEARCH_SQL, args),
            ("top-k", TOPK_SQL, (server.guild_id, persona, people, dataset.space_id, vector)),
        ):
            transaction = connection.transaction()
            await transaction.start()
            try:
                plan = await connection.fetch(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", *params)
            finally:
                await transaction.rollback()
            out.append(f"--- {label} ({'first of day' if first_of_day else 'later in the day'})")
            out.extend(row[0] for row in plan)
    finally:
        await connection.close()
    return "\n".join(out)


def clock_now(day: Any) -> Any:
    clock = ManualClock()
    clock.set_date(day)
    return clock.now()
