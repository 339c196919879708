"""Concurrent replies and saves from two separate pools, as two bot processes would run them.

The guarantees of docs/memory-rules.md under concurrency: a memory ages at most once per UTC day, a reset
is never lost, and no list ever goes over its limit or loses a protected memory. Every test runs
twice (the `route` fixture): straight to PostgreSQL, and through a real PgBouncer in transaction
mode with the statement cache off, where nothing tied to a session survives a transaction.
"""

from __future__ import annotations

import asyncio
import random
from datetime import date, timedelta

import pytest

from bot.clock import ManualClock
from bot.config import Settings
from bot.db import create_pool
from bot.embeddings.providers import DeadlineEmbedder
from bot.memory.models import Conversation, MemoryList, NewMemory, Source
from bot.memory.service import MemoryCore
from bot.services import memory_core
from tests.conftest import Route

GUILD, CHANNEL = 10, 20
USERS = [101, 102, 103, 104, 105]
CHATTER = [
    "the train was late again this morning",
    "it snowed all night here",
    "our team shipped the release",
    "I'm repainting my room this weekend",
    "my laptop fan is so loud",
]
FACTS = [
    "The server's Minecraft world runs on version 1.20",
    "Movie night is every Friday at nine",
    "The server mascot is a red panda named Ember",
    "New members must read the rules channel first",
    "The book club is reading Dune this month",
]
CAT = "Juno's cat is called Mochi"
TOPICS = [CAT, *FACTS, "Bau prefers green tea over coffee", "The server runs a chess ladder every month"]
QUESTIONS = [
    "how is Juno's cat Mochi?", "which Minecraft version do we run?", "when is movie night?", "what is the mascot?",
    "what are the rules for new members?", "which book is the club reading?", "tea or coffee?", "who leads the chess ladder?",
]


async def two_cores(
    db_url: str, builtin_embedder: object, clock: ManualClock, route: Route, pool_size: int = 8, **overrides: object
) -> list[MemoryCore]:
    # a patient embedder: these tests are about what concurrent work does to the lists, not about timeouts (120
    # searches at once on a loaded two-core machine can take longer than the 2 s a reply waits by default)
    settings = Settings().with_overrides(
        **{"pg_statement_cache": route.statement_cache, "embedding_timeout_s": 60.0, **overrides}
    )
    cores = []
    for _ in range(2):
        pool = await create_pool(route.url(db_url), max_size=pool_size, statement_cache=route.statement_cache)
        cores.append(memory_core(pool, DeadlineEmbedder(builtin_embedder, 60.0), settings, clock))  # type: ignore[arg-type]
    return cores


async def close(cores: list[MemoryCore]) -> None:
    for core in cores:
        await core.pool.close()


async def test_many_concurrent_replies_age_each_memory_exactly_once_a_day(
    db_url: str, builtin_embedder: object, route: Route
) -> None:
    clock = ManualClock()
    clock.set_date(date(2026, 4, 1))
    cores = await two_cores(db_url, builtin_embedder, clock, route)
    try:
        for fact in FACTS:
            await cores[0].save(NewMemory(MemoryList.SERVER, fact, by=1, guild_id=GUILD))
        for user in USERS:
            fact = f"User {user} likes hiking"
            await cores[1].save(NewMemory(MemoryList.PERSONAL, fact, by=user, guild_id=GUILD, owner_id=user))
        rng = random.Random(7)
        for day in range(1, 4):
            clock.set_date(date(2026, 4, 1) + timedelta(days=day))
            replies = [
                cores[index % 2].reply_search(
                    Conversation(GUILD, CHANNEL, USERS[index % 5], rng.choice(CHATTER), participant_ids=tuple(USERS))
                )
                for index in range(120)
            ]
            results = await asyncio.gather(*replies)
            assert all(result.search_ok and result.used == [] for result in results)
            memories = await cores[0].all_memories()
            assert {m.days_unused for m in memories} == {day}, [(m.text, m.days_unused) for m in memories]
    finally:
        await close(cores)


async def test_a_reset_is_never_lost_to_a_concurrent_aging(db_url: str, builtin_embedder: object, route: Route) -> None:
    clock = ManualClock()
    clock.set_date(date(2026, 4, 1))
    cores = await two_cores(db_url, builtin_embedder, clock, route)
    try:
        saved = await cores[0].save(NewMemory(MemoryList.SERVER, CAT, by=1, guild_id=GUILD))
        assert saved.saved is not None
        for day in range(1, 6):
            clock.set_date(date(2026, 4, 1) + timedelta(days=day))
            texts = [CHATTER[i % 5] for i in range(60)]
            texts[random.Random(day).randrange(60)] = "how is Juno's cat Mochi doing?"
            results = await asyncio.gather(
                *(cores[i % 2].reply_search(Conversation(GUILD, CHANNEL, USERS[0], text)) for i, text in enumerate(texts))
            )
            assert sum(1 for r in results if r.used) == 1
            [memory] = await cores[1].all_memories()
            assert memory.days_unused == 0 and memory.last_aged_on == clock.now().date()
    finally:
        await close(cores)


async def test_concurrent_saves_never_overfill_a_list_or_forget_protected(
    db_url: str, builtin_embedder: object, route: Route
) -> None:
    clock = ManualClock()
    clock.set_date(date(2026, 4, 1))
    limit = 8
    # merging off: this is the forgetting order under concurrency (tests/test_merges.py has merges under concurrency)
    cores = await two_cores(
        db_url, builtin_embedder, clock, route, server_memory_limit=limit, dormant_after_days=1, merge_max_chars=0
    )
    try:
        protected = []
        for index in range(3):
            text = f"Rule {index}: be kind"
            rule = NewMemory(MemoryList.SERVER, text, by=1, via=Source.COMMAND, guild_id=GUILD, by_can_manage=True)
            result = await cores[0].save(rule)
            assert result.saved is not None
            protected.append(result.saved.id)
        for index in range(limit - 4):
            assert (await cores[0].save(NewMemory(MemoryList.SERVER, f"Old fact number {index}", by=1, guild_id=GUILD))).saved
        clock.set_date(date(2026, 4, 2))
        await cores[0].reply_search(Conversation(GUILD, CHANNEL, USERS[0], CHATTER[0]))  # all dormant now

        saves = [
            cores[i % 2].save(NewMemory(MemoryList.SERVER, f"New fact {i} about the server", by=1, guild_id=GUILD))
            for i in range(30)
        ]
        results = await asyncio.gather(*saves)
        memories = await cores[0].all_memories()
        assert len(memories) <= limit
        assert set(protected) <= {m.id for m in memories}
        saved = [r for r in results if r.saved]
        forgotten = [m.id for r in results for m in r.forgotten]
        assert len(forgotten) == len(set(forgotten))  # nothing forgotten twice
        # one free slot, then one per dormant unprotected memory; the rest are refused
        assert len(saved) == 1 + (limit - 4)
        assert all(r.rejected is not None for r in results if not r.saved)
    finally:
        await close(cores)


@pytest.mark.timeout(120)
async def test_concurrent_start_ups_apply_migrations_once(pg_server_url: str, route: Route) -> None:
    """Five start-ups at once on an empty database: each migration is applied once, `vector` created once."""
    from bot.db import apply_migrations, connect, drop_database, ensure_database, migration_files, with_database

    name = f"t_concurrent_migrations_{route.name}"
    await drop_database(pg_server_url, name)
    await ensure_database(pg_server_url, name)
    url = route.url(with_database(pg_server_url, name))
    try:
        applied = await asyncio.gather(*(apply_migrations(url, statement_cache=route.statement_cache) for _ in range(5)))
        # each file is its own transaction, so the start-ups may share the work, but no file is applied twice
        assert sorted(name for names in applied for name in names) == [name for _, name, _ in migration_files()]
        connection = await connect(url, statement_cache=route.statement_cache)
        try:
            rows = await connection.fetch("SELECT version FROM schema_migrations ORDER BY version")
            assert [row["version"] for row in rows] == list(range(1, len(migration_files()) + 1))
        finally:
            await connection.close()
    finally:
        await drop_database(pg_server_url, name)


async def test_first_replies_of_a_day_in_one_busy_server_never_deadlock(
    db_url: str, builtin_embedder: object, route: Route
) -> None:
    """Many first-of-day replies in one server age overlapping rows at once: none may fail."""
    clock = ManualClock()
    clock.set_date(date(2026, 4, 1))
    cores = await two_cores(db_url, builtin_embedder, clock, route, pool_size=20)
    try:
        for index in range(60):
            text = f"{TOPICS[index % len(TOPICS)]} (note {index})"
            await cores[0].save(NewMemory(MemoryList.SERVER, text, by=1, guild_id=GUILD))
        for user in USERS:
            for index in range(8):
                await cores[1].save(NewMemory(MemoryList.PERSONAL, f"User {user} fact {index}", by=user, guild_id=GUILD,
                                              owner_id=user))
        rng = random.Random(3)
        for day in (2, 3):
            clock.set_date(date(2026, 4, day))
            replies = [
                cores[index % 2].reply_search(
                    Conversation(GUILD, CHANNEL, rng.choice(USERS), rng.choice(QUESTIONS),
                                 participant_ids=tuple(rng.sample(USERS, 3)))
                )
                for index in range(300)
            ]
            results = await asyncio.gather(*replies, return_exceptions=True)
            failures = [r for r in results if isinstance(r, BaseException)]
            assert failures == []
            memories = await cores[0].all_memories()
            assert {m.days_unused for m in memories if m.list == MemoryList.SERVER} <= {0, day - 1}
    finally:
        await close(cores)
