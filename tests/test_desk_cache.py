"""The core's desk cache (bot/memory/desk_cache.py) never changes what a reply's search returns.

The same operations run against two identical databases. On A one long-lived `MemoryCore` answers
every reply (its cache warm), and edits, deletes and other replies come from *another* core, as
from another bot process; on B every reply is answered by a brand-new core (empty cache). Each
pair of `Recall`s must be equal: same desk in the same order, same used/recalled/held-back with the
same similarities, every `Memory` field equal. The checks in between make sure the cache was
actually used (fewer rows than the desk came back) and that each step changed what it should.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import date, timedelta
from typing import Any

import asyncpg
import numpy as np
import pytest

from bot.clock import ManualClock
from bot.db import create_pool
from bot.memory import search_store, store
from bot.memory.desk_cache import DeskCache
from bot.memory.models import Conversation, Memory, MemoryList, NewMemory, Recall, Source
from bot.memory.recall import desk_order
from bot.memory.service import MemoryCore
from bot.servers.models import Actor, Privacy
from bot.services import build_services
from tests.conftest import MakeCore, fresh_database

GUILD, OTHER_GUILD, CHANNEL, OTHER_CHANNEL = 10, 11, 20, 21
JUNO, BAU, CARO, ADMIN = 31, 32, 33, 34
DAY1 = date(2026, 3, 2)
CHATTER = ["the train was late again this morning", "it snowed all night here", "our team shipped the release"]


def server_memory(text: str, **extra: Any) -> NewMemory:
    return NewMemory(list=MemoryList.SERVER, text=text, by=ADMIN, guild_id=GUILD, by_can_manage=True, **extra)


def personal_memory(text: str, owner: int, **extra: Any) -> NewMemory:
    return NewMemory(list=MemoryList.PERSONAL, text=text, by=owner, guild_id=GUILD, owner_id=owner, **extra)


def message(
    text: str, author: int = JUNO, *others: int, guild: int | None = GUILD, channel: int = CHANNEL, **extra: Any
) -> Conversation:
    return Conversation(guild_id=guild, channel_id=channel, author_id=author, text=text, participant_ids=others, **extra)


def assert_same(cached: Recall, fresh: Recall) -> None:
    assert (cached.search_ok, cached.failure, cached.persona_id) == (fresh.search_ok, fresh.failure, fresh.persona_id)
    assert cached.desk == desk_order(cached.desk)  # the cache hands the snapshot over already in prompt order
    assert cached.desk == fresh.desk
    assert cached.used == fresh.used
    assert cached.recalled == fresh.recalled
    assert cached.held_back == fresh.held_back
    assert (cached.query_vector is None) == (fresh.query_vector is None)
    if cached.query_vector is not None:
        assert np.array_equal(cached.query_vector, fresh.query_vector)  # type: ignore[arg-type]


class Twins:
    """Database A: one cached core replies, `other_a` acts as another process. Database B: fresh cores."""

    def __init__(self, make_core: MakeCore, pool_a: asyncpg.Pool, pool_b: asyncpg.Pool, overrides: dict[str, Any]) -> None:
        self.make_core = make_core
        self.pools = (pool_a, pool_b)
        self.overrides = overrides
        self.returned: list[tuple[int, int]] = []  # (rows the cached core's statement returned, snapshot size)

    async def start(self) -> None:
        self.cached = await self.make_core(pool_=self.pools[0], **self.overrides)
        self.other_a = await self.make_core(pool_=self.pools[0], **self.overrides)

    async def fresh_b(self) -> MemoryCore:
        return await self.make_core(pool_=self.pools[1], **self.overrides)

    async def reply(self, conversation: Conversation) -> Recall:
        """The cached core's answer on A, checked against a fresh core's on B."""
        original = search_store.reply_search
        rows: list[int] = []

        async def spy(conn: Any, **kwargs: Any) -> list[asyncpg.Record]:
            result = await original(conn, **kwargs)
            rows.append(len(result))
            return result

        search_store.reply_search = spy  # type: ignore[assignment]
        try:
            cached = await self.cached.reply_search(conversation)
        finally:
            search_store.reply_search = original  # type: ignore[assignment]
        fresh = await (await self.fresh_b()).reply_search(conversation)
        assert_same(cached, fresh)
        self.returned.append((rows[0], len(cached.desk) + len(cached.recalled) + len(cached.held_back)))
        return cached

    async def elsewhere(self, operation: Callable[[MemoryCore], Awaitable[Any]]) -> tuple[Any, Any]:
        """Run the same operation through another process on A and a fresh core on B."""
        return await operation(self.other_a), await operation(await self.fresh_b())

    async def by_cached(self, operation: Callable[[MemoryCore], Awaitable[Any]]) -> tuple[Any, Any]:
        """Run the same operation through the cached core itself on A (and a fresh core on B)."""
        return await operation(self.cached), await operation(await self.fresh_b())

    async def sql(self, statement: str, *args: Any) -> None:
        for pool in self.pools:
            await pool.execute(statement, *args)

    async def on_both(self, operation: Callable[[asyncpg.pool.PoolConnectionProxy], Awaitable[Any]]) -> None:
        for pool in self.pools:
            async with pool.acquire() as conn:
                await operation(conn)


@pytest.fixture
async def pool_b(pg_server_url: str, template_ready: str) -> AsyncIterator[asyncpg.Pool]:
    async with fresh_database(pg_server_url, template_ready, f"t_{uuid.uuid4().hex[:16]}") as url:
        pool = await create_pool(url, max_size=4)
        try:
            yield pool
        finally:
            await pool.close()


def shown(recall: Recall) -> list[Memory]:
    """What goes into the reply's prompt: the desk, and the tail (held back today, recalled)."""
    return [*recall.desk, *(s.memory for s in (*recall.held_back, *recall.recalled))]


def desk_ids(recall: Recall) -> list[int]:
    return [m.id for m in shown(recall)]


def desk_text(recall: Recall) -> list[str]:
    return [m.text for m in shown(recall)]


@pytest.mark.parametrize("desk_refresh", ["reply", "daily"])
async def test_cached_core_answers_exactly_like_a_fresh_one(
    make_core: MakeCore, pool: asyncpg.Pool, pool_b: asyncpg.Pool, clock: ManualClock, desk_refresh: str
) -> None:
    twins = Twins(make_core, pool, pool_b, {"dormant_after_days": 2, "desk_refresh": desk_refresh})
    await twins.start()
    clock.set_date(DAY1)

    async def save(core: MemoryCore, request: NewMemory) -> Memory:
        result = await core.save(request)
        assert result.saved is not None, result.detail
        return result.saved

    cat, _ = await twins.elsewhere(lambda c: save(c, server_memory("Juno's cat is called Mochi")))
    minecraft, _ = await twins.elsewhere(
        lambda c: save(c, server_memory("The Minecraft world runs on 1.20", tags=("minecraft",)))
    )
    game_night, _ = await twins.elsewhere(lambda c: save(c, server_memory("Game night is on Fridays", channel_ids=(CHANNEL,))))
    await twins.elsewhere(lambda c: save(c, server_memory("The server speaks Spanish on Sundays")))
    await twins.elsewhere(lambda c: save(c, personal_memory("Juno is learning the bass guitar", JUNO)))
    tea_request = personal_memory("Bau prefers green tea over coffee", BAU, is_global=True, via=Source.COMMAND)
    tea, _ = await twins.elsewhere(lambda c: save(c, tea_request))
    caro, _ = await twins.elsewhere(lambda c: save(c, personal_memory("Caro runs marathons", CARO)))

    first = await twins.reply(message("how is my cat Mochi doing?", JUNO, BAU))
    assert first.used and first.used[0].memory.id == cat.id
    steady = await twins.reply(message(CHATTER[0], JUNO, BAU))
    assert game_night.id in desk_ids(steady) and tea.id in desk_ids(steady)
    rows, snapshot = twins.returned[-1]
    assert rows < snapshot, "the cache was not used: the whole snapshot came back"

    # a channel where the channel-limited memory is hidden, then back
    there = await twins.reply(message(CHATTER[1], JUNO, BAU, channel=OTHER_CHANNEL))
    assert game_night.id not in desk_ids(there)
    assert game_night.id in desk_ids(await twins.reply(message(CHATTER[2], JUNO, BAU)))

    # another process edits a desk memory's text: the cached core must not show the old text
    await twins.elsewhere(lambda c: c.edit(cat.id, "Juno's cat is called Mochi and she is three", by=ADMIN, by_can_manage=True))
    edited = await twins.reply(message(CHATTER[0], JUNO, BAU))
    assert "Juno's cat is called Mochi and she is three" in desk_text(edited)

    # another process's reply resets and ages counters (same desk, other values)
    await twins.elsewhere(lambda c: c.reply_search(message("should I make green tea or coffee?", BAU)))
    await twins.reply(message(CHATTER[1], JUNO, BAU))

    # channel limit and tags changed behind the core's back
    await twins.sql("UPDATE memories SET channel_ids = $2 WHERE id = $1", game_night.id, [OTHER_CHANNEL])
    assert game_night.id not in desk_ids(await twins.reply(message(CHATTER[2], JUNO, BAU)))
    await twins.sql("UPDATE memories SET channel_ids = '{}' WHERE id = $1", game_night.id)
    await twins.elsewhere(lambda c: c.servers.update_guild_settings(GUILD, Actor(1, can_manage=True), tagging=True))
    assert minecraft.id not in desk_ids(await twins.reply(message(CHATTER[0], JUNO, BAU)))
    tagged = await twins.reply(message("which version?", JUNO, BAU, context_texts=("anyone on the minecraft world?",)))
    assert minecraft.id in desk_ids(tagged)
    await twins.on_both(lambda conn: store.set_memory_tags(conn, minecraft.id, ["building"], clock.now()))
    assert minecraft.id not in desk_ids(await twins.reply(message("which version?", JUNO, context_texts=("minecraft",))))
    await twins.elsewhere(lambda c: c.servers.update_guild_settings(GUILD, Actor(1, can_manage=True), tagging=False))
    assert minecraft.id in desk_ids(await twins.reply(message(CHATTER[1], JUNO)))

    # privacy, blocklist, personal memories switched off, each undone
    await twins.elsewhere(lambda c: c.servers.set_privacy(BAU, Privacy.FULL))
    assert tea.id not in desk_ids(await twins.reply(message(CHATTER[2], JUNO, BAU)))
    await twins.elsewhere(lambda c: c.servers.set_privacy(BAU, Privacy.NONE))
    assert tea.id in desk_ids(await twins.reply(message(CHATTER[0], JUNO, BAU)))
    await twins.elsewhere(lambda c: c.servers.set_blocked(GUILD, BAU, True))
    assert tea.id not in desk_ids(await twins.reply(message(CHATTER[1], JUNO, BAU)))
    await twins.elsewhere(lambda c: c.servers.set_blocked(GUILD, BAU, False))
    await twins.elsewhere(lambda c: c.servers.update_guild_settings(GUILD, Actor(1, can_manage=True), personal_memories=False))
    assert tea.id not in desk_ids(await twins.reply(message(CHATTER[2], JUNO, BAU)))
    await twins.elsewhere(lambda c: c.servers.update_guild_settings(GUILD, Actor(1, can_manage=True), personal_memories=True))
    assert tea.id in desk_ids(await twins.reply(message(CHATTER[0], JUNO, BAU)))

    # another process deletes a desk memory; the cached core saves one itself
    await twins.elsewhere(lambda c: c.delete(game_night.id, by=ADMIN, by_can_manage=True))
    assert game_night.id not in desk_ids(await twins.reply(message(CHATTER[1], JUNO, BAU)))
    saved, _ = await twins.by_cached(lambda c: save(c, server_memory("The server's birthday is in May")))
    assert saved.id in desk_ids(await twins.reply(message(CHATTER[2], JUNO, BAU)))

    # other people, a DM (default persona: the Global memory only), a memory moved to a persona
    await twins.reply(message(CHATTER[0], CARO, JUNO))
    dm = await twins.reply(message("should I make green tea or coffee?", BAU, guild=None, channel=99))
    assert tea.id in desk_ids(dm) or tea.id in [s.memory.id for s in dm.held_back]
    persona = await twins.cached.servers.persona_id(GUILD)
    await twins.on_both(lambda conn: store.set_personal_scope(conn, tea.id, persona, clock.now()))
    assert tea.id not in desk_ids(await twins.reply(message(CHATTER[1], BAU, guild=None, channel=99)))
    assert tea.id in desk_ids(await twins.reply(message(CHATTER[2], BAU, JUNO)))

    # chat days: everything not used ages and goes dormant, then comes back when asked about
    day = DAY1
    for index in range(3):
        day += timedelta(days=1)
        clock.set_date(day)
        await twins.reply(message(CHATTER[index % 3], JUNO, BAU, CARO))
        await twins.reply(message(CHATTER[(index + 1) % 3], JUNO, BAU))
    drawer = await twins.reply(message(CHATTER[2], JUNO, BAU))
    assert cat.id not in [m.id for m in drawer.desk] and caro.id not in [m.id for m in drawer.desk]
    asked = await twins.reply(message("how is my cat Mochi doing?", JUNO, BAU))
    assert cat.id in [s.memory.id for s in asked.recalled]
    await twins.reply(message(CHATTER[0], JUNO, BAU))
    await twins.elsewhere(lambda c: c.reply_search(message("tell me about the marathon Caro runs", CARO)))
    await twins.reply(message(CHATTER[1], JUNO, CARO))
    day += timedelta(days=1)
    clock.set_date(day)
    await twins.reply(message(CHATTER[1], JUNO, CARO))
    await twins.reply(message(CHATTER[2], JUNO, CARO))

    # even in this run, where something changes before most replies, fewer rows came back than the
    # snapshots held (markers included)
    assert sum(rows for rows, _ in twins.returned) < sum(size for _, size in twins.returned)


async def test_a_failed_search_leaves_the_cache_as_it_was(
    make_core: MakeCore, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = await make_core()
    clock.set_date(DAY1)
    for text in ("Juno's cat is called Mochi", "Game night is on Fridays", "The server speaks Spanish on Sundays"):
        assert (await core.save(server_memory(text))).ok
    assert (await core.save(personal_memory("Juno is learning the bass guitar", JUNO))).ok
    before = await core.reply_search(message(CHATTER[0]))

    def parts() -> dict[Any, Any]:
        return {key: (day, dict(part)) for key, (day, part) in core.desk_cache._parts.items()}

    held = parts()
    assert len(core.desk_cache) == 4
    original = search_store.reply_search

    async def broken_statement(conn: Any, **kwargs: Any) -> list[Any]:
        raise asyncpg.exceptions.DeadlockDetectedError("deadlock detected (test)")

    async def broken_row(conn: Any, **kwargs: Any) -> list[Any]:
        rows = [dict(row) for row in await original(conn, **kwargs)]
        return [*rows, {**rows[0], "id": 10**9, "known_id": None, "list": "no such list"}]

    await core.edit(before.desk[0].id, "Juno's cat is called Mochi and she is three", by=ADMIN, by_can_manage=True)
    for broken in (broken_statement, broken_row):
        monkeypatch.setattr(search_store, "reply_search", broken)
        with pytest.raises((asyncpg.exceptions.DeadlockDetectedError, KeyError)):
            await core.reply_search(message(CHATTER[1]))
        assert parts() == held
    monkeypatch.setattr(search_store, "reply_search", original)
    after = await core.reply_search(message(CHATTER[2]))
    assert "Juno's cat is called Mochi and she is three" in desk_text(after)
    assert after.desk == (await (await make_core()).reply_search(message(CHATTER[2]))).desk


async def test_the_cache_is_bounded_and_stays_exact_when_it_evicts(
    make_core: MakeCore, pool: asyncpg.Pool, pool_b: asyncpg.Pool, clock: ManualClock
) -> None:
    twins = Twins(make_core, pool, pool_b, {})
    await twins.start()
    twins.cached.desk_cache.max_memories = 5
    clock.set_date(DAY1)
    users = list(range(100, 112))
    for user in users:
        for index in range(2):
            await twins.elsewhere(lambda c, u=user, i=index: c.save(personal_memory(f"user {u} likes hobby number {i}", u)))
    for round_ in range(3):
        for index, user in enumerate(users):
            await twins.reply(message(CHATTER[(index + round_) % 3], user, users[(index + 1) % len(users)]))
            assert len(twins.cached.desk_cache) <= 5
    assert len(twins.cached.desk_cache) > 0


async def test_parts_older_than_yesterday_are_not_offered(make_core: MakeCore, clock: ManualClock) -> None:
    """Yesterday's parts serve the first reply of a day; older ones go, so an xid cannot repeat under a held stamp."""
    core = await make_core()
    clock.set_date(DAY1)
    assert (await core.save(server_memory("Juno's cat is called Mochi"))).ok
    await core.reply_search(message(CHATTER[0]))
    parts = DeskCache.parts(GUILD, await core.servers.persona_id(GUILD), (JUNO,))
    assert core.desk_cache.held(parts, DAY1)
    assert core.desk_cache.held(parts, DAY1 + timedelta(days=1))
    assert core.desk_cache.held(parts, DAY1 - timedelta(days=1)) == {}  # a clock moved back: not trusted
    assert len(core.desk_cache) == 0
    await core.reply_search(message(CHATTER[0]))
    assert core.desk_cache.held(parts, DAY1 + timedelta(days=2)) == {}
    assert len(core.desk_cache) == 0


def held_texts(core: MemoryCore) -> set[str]:
    return {entry[1].text for _day, part in core.desk_cache._parts.values() for entry in part.values()}


async def test_deleted_memories_and_old_conversations_leave_the_process(
    make_core: MakeCore, clock: ManualClock
) -> None:
    """Deleted memories are never served (their rows are gone), and their texts go from memory at once."""

    core = await make_core()
    clock.set_date(DAY1)
    cat = (await core.save(server_memory("Juno's cat is called Mochi"))).saved
    assert cat is not None and (await core.save(personal_memory("Juno plays the cello", JUNO))).ok
    await core.reply_search(message(CHATTER[0]))
    assert held_texts(core) == {"Juno's cat is called Mochi", "Juno plays the cello"}
    assert (await core.delete(cat.id, by=JUNO, by_can_manage=True)).forgotten
    assert held_texts(core) == {"Juno plays the cello"}
    await build_services(core).delete_user_data(JUNO)
    assert held_texts(core) == set()

    assert (await core.save(server_memory("Movie night is on Friday"))).ok
    await core.reply_search(message(CHATTER[0]))
    assert held_texts(core) == {"Movie night is on Friday"}
    other = DeskCache.parts(GUILD + 1, await core.servers.persona_id(GUILD + 1), (JUNO,))
    core.desk_cache.held(other, DAY1 + timedelta(days=3))  # any later look-up sweeps parts no search offered for days
    assert held_texts(core) == set() and len(core.desk_cache) == 0
