"""`python -m bot check` finds every kind of inconsistency the rules forbid, and none in sound data."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import date, timedelta
from pathlib import Path

import asyncpg

from bot.clock import ManualClock
from bot.memory import store
from bot.memory.models import Conversation, MemoryList, NewMemory, Source
from tests.conftest import MakeCore

ROOT = Path(__file__).resolve().parents[1]


async def sound_data(make_core: MakeCore, clock: ManualClock) -> list[int]:
    core = await make_core(server_memory_limit=3, personal_memory_limit=2, dormant_after_days=1)
    clock.set_date(date(2026, 2, 1))
    ids = []
    for text in ("Juno's cat is called Mochi", "Movie night is on Fridays", "The mascot is a red panda"):
        result = await core.save(NewMemory(MemoryList.SERVER, text, by=1, guild_id=5, by_can_manage=True))
        assert result.saved
        ids.append(result.saved.id)
    global_memory = NewMemory(MemoryList.PERSONAL, "Bau is vegetarian", by=7, owner_id=7, is_global=True, via=Source.COMMAND)
    result = await core.save(global_memory)
    assert result.saved
    ids.append(result.saved.id)
    for offset in range(1, 4):
        clock.set_date(date(2026, 2, 1) + timedelta(days=offset))
        await core.reply_search(Conversation(5, 6, 7, "how is Mochi the cat?" if offset == 2 else "the train was late"))
    await core.save(NewMemory(MemoryList.SERVER, "Voice chat opens at eight", by=1, guild_id=5, by_can_manage=True))
    return ids


async def problems(pool: asyncpg.Pool) -> dict[str, list[str]]:
    async with pool.acquire() as conn:
        found = await store.integrity_problems(conn, 3, 2)
    return {name: lines for name, lines in found.items() if lines}


async def test_sound_data_has_no_problems(make_core: MakeCore, clock: ManualClock, pool: asyncpg.Pool) -> None:
    await sound_data(make_core, clock)
    assert await problems(pool) == {}


async def test_each_kind_of_damage_is_reported(make_core: MakeCore, clock: ManualClock, pool: asyncpg.Pool) -> None:
    cat, movie, mascot, vegetarian = await sound_data(make_core, clock)
    await pool.execute(
        "INSERT INTO memories (list, guild_id, persona_id, text, source, protected, last_aged_on, created_at, updated_at)"
        " SELECT list, guild_id, persona_id, 'one too many', 'bot', false, last_aged_on, created_at, updated_at"
        " FROM memories WHERE id = $1",
        cat,
    )
    await pool.execute("UPDATE memories SET days_unused = days_unused + 5 WHERE id = $1", mascot)
    await pool.execute("UPDATE memories SET protected = false WHERE id = $1", vegetarian)
    await pool.execute("UPDATE memories SET text = 'Juno has two cats' WHERE id = $1", cat)
    await pool.execute("UPDATE memories SET last_aged_on = '2020-01-01' WHERE id = $1", vegetarian)
    assert movie not in {row["id"] for row in await pool.fetch("SELECT id FROM memories")}  # forgotten to make room
    found = await problems(pool)
    assert set(found) == {
        "server list over its limit",
        "aged more than once a day",
        "unprotected memory that must be protected",
        "vector of an old text",
        "counter dates out of order",
    }
    assert any(f"memory {mascot}:" in line for line in found["aged more than once a day"])


def test_cli_exits_0_on_sound_data_and_1_on_damage(db_url: str) -> None:
    env = {**os.environ, "DATABASE_URL": db_url}
    command = [sys.executable, "-m", "bot", "check"]
    sound = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert sound.returncode == 0, sound.stderr
    assert sound.stdout.startswith("ok: 0 memories checked")

    async def damage() -> None:
        connection = await asyncpg.connect(db_url)
        try:
            await connection.execute(
                "INSERT INTO memories (list, owner_id, text, source, protected, last_aged_on, created_at, updated_at)"
                " VALUES ('personal', 1, 'Global but unprotected', 'import', false, '2026-01-01', now(), now())"
            )
        finally:
            await connection.close()

    import asyncio

    asyncio.run(damage())
    damaged = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert damaged.returncode == 1
    assert "unprotected memory that must be protected: 1" in damaged.stdout
