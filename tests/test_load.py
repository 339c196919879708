"""Load and scale-out: several bot processes on one PostgreSQL, thousands of replies and saves, many days.

Two in-process workers (each its own pool, memory core and reply pipeline, as separate bot processes
have) and at least one real second OS process (tests/load_worker.py) share one database. Every day of
tests/load_world.py's world runs its phases concurrently across all of them; then:

- a *reference replay*, the same operations one after another through a single core on a second
  database, must end the day with the same counters in every list and the same number of memories
  saved, forgotten and refused per list;
- every memory's counter must equal the analytic expectation (the number of days its list was
  searched since it was saved or last used), so no memory aged twice in a day and no reset was lost;
- no list is over its limit, every protected memory is still there, no operation failed, and every
  question used exactly the memory it asked about.

A final chaos day mixes command saves, first-of-day replies and saves at once; it is held to the
invariants, and `python -m bot check` must find nothing afterwards.

`make test` runs the CI size (about 1,500 operations, 5 days, 3 workers); `make soak` runs the full
size (`DESKMATE_SOAK=1`: 4 workers of which 2 are OS processes, 11 days) and writes its figures to
`DESKMATE_LOAD_REPORT` for docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Sequence
from datetime import date
from pathlib import Path
from typing import Any

import pytest

from bot.db import create_pool
from bot.memory import store
from bot.services import build_services, memory_core
from tests.conftest import Route, fresh_database
from tests.load_world import (
    START,
    Day,
    Op,
    Row,
    RuleChatServer,
    Size,
    Worker,
    World,
    create_anchors,
    snapshot,
)

ROOT = Path(__file__).resolve().parents[1]
SOAK = os.environ.get("DESKMATE_SOAK") == "1"
SIZE = Size.soak() if SOAK else Size.ci()


class ProcessWorker:
    """tests/load_worker.py as a child process, driven one phase at a time over stdin/stdout."""

    def __init__(self, process: asyncio.subprocess.Process, log: Path) -> None:
        self.process = process
        self.log = log

    @classmethod
    async def start(cls, db_url: str, chat_url: str, size: Size, log: Path, statement_cache: bool = True) -> ProcessWorker:
        handle = log.open("wb")
        process = await asyncio.create_subprocess_exec(
            sys.executable, str(ROOT / "tests" / "load_worker.py"), db_url, chat_url, json.dumps(size.__dict__),
            "true" if statement_cache else "false",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=handle, limit=256 * 1024 * 1024,
        )
        handle.close()
        worker = cls(process, log)
        assert (await worker._read())["ready"]
        return worker

    async def _read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), 600)
        assert line, f"the worker process died: {self.log.read_text()[-3000:]}"
        return json.loads(line)

    async def run(self, day: date, ops: Sequence[Op]) -> list[dict[str, Any]]:
        assert self.process.stdin is not None
        self.process.stdin.write((json.dumps({"date": day.isoformat(), "ops": [op.as_json() for op in ops]}) + "\n").encode())
        await self.process.stdin.drain()
        return (await self._read())["results"]

    async def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            await asyncio.wait_for(self.process.wait(), 30)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()


@pytest.fixture
async def reference_url(pg_server_url: str, template_ready: str) -> AsyncIterator[str]:
    """A second fresh database, for the sequential reference replay."""
    async with fresh_database(pg_server_url, template_ready, f"t_ref_{uuid.uuid4().hex[:12]}") as url:
        yield url


# --- expectations --------------------------------------------------------------------------------------


# Fault injection for the shared database only: every row written waits a little while holding its lock, as
# on a busy disk. Replies that start while another one is ageing the same list then really overlap, so a
# lost re-check of `last_aged_on` would show up as a memory aged twice (it does: tested by hand with a mutant).
SLOW_UPDATES_SQL = """
CREATE FUNCTION test_slow_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep(0.003); RETURN NEW; END $$;
CREATE TRIGGER test_slow_update BEFORE INSERT OR UPDATE ON memories FOR EACH ROW EXECUTE FUNCTION test_slow_update();
"""


def day_number(day: date) -> int:
    return (day - START).days


class Expectation:
    """The analytic counters: a memory ages once on each day its list is searched, and a use resets it."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.searched: dict[tuple[Any, ...], set[int]] = defaultdict(set)
        self.asked_on: dict[int, int] = {}  # anchor number -> last day it was asked about

    def add(self, day: Day) -> None:
        for guild, people in day.participants.items():
            if guild is not None and people:
                self.searched[("server", guild)].add(day.number)
            for user in people:
                self.searched[("personal", user, "global")].add(day.number)
                self.searched[("personal", user, guild)].add(day.number)
        for anchor in day.asked:
            self.asked_on[anchor] = day.number

    def expected(self, row: Row) -> tuple[int, date, date | None]:
        """(days_unused, last_aged_on, last_used_on) the rules give this memory by now."""
        base = day_number(row.created_on)
        used: date | None = None
        if row.text.startswith("anchor-"):
            number = int(row.text.split(" ", 1)[0].removeprefix("anchor-"))
            if number in self.asked_on:
                base = self.asked_on[number]
                used = START.fromordinal(START.toordinal() + base)
        later = sorted(day for day in self.searched[row.list_key] if day > base)
        last = later[-1] if later else base
        return len(later), START.fromordinal(START.toordinal() + last), used


def problems_in(rows: Sequence[Row], size: Size) -> list[str]:
    """Lists over their limit (a Global memory counts in each of its owner's persona lists)."""
    problems = []
    sizes = Counter(row.list_key for row in rows)
    for key, count in sizes.items():
        if key[0] == "server" and count > size.server_limit:
            problems.append(f"{key}: {count} memories")
        if key[0] == "personal" and key[2] != "global":
            total = count + sizes.get(("personal", key[1], "global"), 0)
            if total > size.personal_limit:
                problems.append(f"{key}: {total} memories with the Global ones")
    return problems


def tally(ops: Sequence[Op], results: Sequence[dict[str, Any]]) -> Counter[tuple[Any, ...]]:
    """Saved / forgotten / refused (with the reason) per list, from what each operation reported."""
    by_id = {op.id: op for op in ops}
    counted: Counter[tuple[Any, ...]] = Counter()
    for result in results:
        op = by_id[result["id"]]
        for change in result.get("changes", []):
            if change["list"] == "server":
                key: tuple[Any, ...] = ("server", op.guild)
            else:
                key = ("personal", change["about_user_id"], op.guild)
            reason = change["reason"] if change["kind"] == "rejected" else ""
            if "list is full" in reason or reason == "list_full":
                reason = "list_full"
            counted[(key, change["kind"], reason)] += 1
    return counted


def check_results(ops: Sequence[Op], results: Sequence[dict[str, Any]], world: World) -> None:
    assert sorted(r["id"] for r in results) == sorted(op.id for op in ops)
    errors = [r for r in results if "error" in r]
    assert errors == [], errors[:5]
    by_id = {op.id: op for op in ops}
    for result in results:
        op = by_id[result["id"]]
        if op.kind != "reply":
            continue
        assert result["status"] == "replied" and result["search_ok"], result
        if "anchor-" in op.text:  # a question uses exactly the anchor it names
            number = int(op.text.split("anchor-")[1].rstrip("?"))
            assert result["used_texts"] == [world.anchors[number].text], (op, result)
        else:
            assert result["used"] == [], (op, result)


def shapes(rows: Sequence[Row]) -> list[tuple[Any, ...]]:
    return sorted((row.shape() for row in rows), key=repr)


async def run_phase(workers: Sequence[Any], day: Day, ops: Sequence[Op]) -> list[dict[str, Any]]:
    shares = [list(ops[index :: len(workers)]) for index in range(len(workers))]
    results = await asyncio.gather(*(worker.run(day.date, share) for worker, share in zip(workers, shares, strict=True)))
    return [result for share in results for result in share]


# --- the test -----------------------------------------------------------------------------------------


@pytest.mark.timeout(3600 if SOAK else 600)
async def test_several_processes_on_one_postgresql_keep_every_rule(
    db_url: str, reference_url: str, tmp_path: Path, route: Route
) -> None:
    """Run twice (`route`): straight to PostgreSQL, and with every worker, the check and the processes behind a real
    PgBouncer in transaction mode with the statement cache off. The fault-injection trigger, the snapshots and the
    reference replay use PostgreSQL directly: they are the referee, not the bot."""
    world = World(SIZE)
    days = world.days()
    chaos = world.chaos_day()
    figures: dict[str, Any] = {"size": SIZE.__dict__, "days": len(days) + 1, "route": route.name}
    latencies: list[float] = []
    totals: Counter[str] = Counter()
    async with RuleChatServer() as chat:
        shared_url, cache = route.url(db_url), route.statement_cache
        workers: list[Any] = [
            await Worker.open(shared_url, SIZE, chat.url, statement_cache=cache) for _ in range(SIZE.workers_in_process)
        ]
        processes = [
            await ProcessWorker.start(shared_url, chat.url, SIZE, tmp_path / f"worker-{n}.log", cache)
            for n in range(SIZE.worker_processes)
        ]
        everyone = [*workers, *processes]
        reference = await Worker.open(reference_url, SIZE, chat.url, pool_size=2)
        pool = await create_pool(db_url, max_size=2)
        await pool.execute(SLOW_UPDATES_SQL)
        expectation = Expectation(world)
        protected_texts = {anchor.text for anchor in world.anchors}
        load_seconds = 0.0
        try:
            await create_anchors(workers[0], world)
            await create_anchors(reference, world)
            for day in days:
                concurrent: list[dict[str, Any]] = []
                started = time.perf_counter()
                for phase in day.phases:
                    concurrent += await run_phase(everyone, day, phase)
                load_seconds += time.perf_counter() - started
                replayed: list[dict[str, Any]] = []
                for phase in day.phases:
                    replayed += await reference.run(day.date, phase, sequential=True)
                ops = [op for phase in day.phases for op in phase]
                check_results(ops, concurrent, world)
                check_results(ops, replayed, world)
                latencies += [r["ms"] for r in concurrent]

                rows, reference_rows = await snapshot(pool), await snapshot(reference.core.pool)
                assert shapes(rows) == shapes(reference_rows), f"day {day.number}: counters differ from the replay"
                assert tally(ops, concurrent) == tally(ops, replayed), f"day {day.number}: saves differ from the replay"
                expectation.add(day)
                wrong = [(row, expectation.expected(row)) for row in rows
                         if (row.days_unused, row.last_aged_on, row.last_used_on) != expectation.expected(row)]
                assert wrong == [], f"day {day.number}: {wrong[:5]}"
                assert problems_in(rows, SIZE) == []
                protected_texts |= {op.text for op in ops if op.kind == "command"
                                    and any(r["id"] == op.id and r["changes"][0]["kind"] == "saved" for r in concurrent)}
                assert protected_texts <= {row.text for row in rows if row.protected}, "a protected memory was forgotten"
                for (_, kind, reason), count in tally(ops, concurrent).items():
                    totals[f"{kind} {reason}".strip()] += count
                totals["operations"] += len(ops)

            # chaos: every phase of a day at once; counters may move by one, resets must hold, limits too
            before = {row.text: row for row in await snapshot(pool)}
            [mixed] = chaos.phases
            started = time.perf_counter()
            results = await run_phase(everyone, chaos, mixed)
            load_seconds += time.perf_counter() - started
            check_results(mixed, results, world)
            latencies += [r["ms"] for r in results]
            after = await snapshot(pool)
            for row in after:
                if row.text in before:
                    assert row.days_unused in (0, before[row.text].days_unused, before[row.text].days_unused + 1), row
            for number in chaos.asked:
                [row] = [row for row in after if row.text == world.anchors[number].text]
                assert row.days_unused == 0 and row.last_used_on == chaos.date, row
            assert problems_in(after, SIZE) == []
            assert {anchor.text for anchor in world.anchors} <= {row.text for row in after}
            for (_, kind, reason), count in tally(mixed, results).items():
                totals[f"{kind} {reason}".strip()] += count
            totals["operations"] += len(mixed)
            async with pool.acquire() as conn:
                found = await store.integrity_problems(conn, SIZE.server_limit, SIZE.personal_limit)
            assert {name: lines for name, lines in found.items() if lines} == {}
            figures["memories_at_end"] = len(after)
        finally:
            for process in processes:
                await process.close()
            for worker in workers:
                await worker.close()
            await reference.close()
            await pool.close()
        figures["chat_requests"] = chat.requests

    env = {**os.environ, **route.env(), "DATABASE_URL": route.url(db_url), "SERVER_MEMORY_LIMIT": str(SIZE.server_limit),
           "PERSONAL_MEMORY_LIMIT": str(SIZE.personal_limit), "PYTHONPATH": str(ROOT)}
    check = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "bot", "check"], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=300,
    )
    assert check.returncode == 0 and check.stdout.startswith("ok:"), check.stdout + check.stderr

    latencies.sort()
    figures.update(
        operations=totals["operations"], workers=len(workers), processes=len(processes),
        load_seconds=round(load_seconds, 1), operations_per_second=round(totals["operations"] / load_seconds, 1),
        latency_ms_p50=round(statistics.median(latencies), 1), latency_ms_p95=round(latencies[int(len(latencies) * 0.95)], 1),
        latency_ms_max=round(latencies[-1], 1), outcomes=dict(sorted(totals.items())), check=check.stdout.strip(),
    )
    print(json.dumps(figures, indent=2))
    report = os.environ.get("DESKMATE_LOAD_REPORT")
    if report and route.bouncer is not None:  # the PgBouncer run's figures go beside the direct run's
        report = str(Path(report).with_name(f"{Path(report).stem}-pgbouncer{Path(report).suffix}"))
    if report:
        await asyncio.to_thread(Path(report).write_text, json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    assert totals["operations"] >= (5_000 if SOAK else 1_000)
    assert totals["forgotten_to_make_room"] > 0 and any(key.startswith("rejected") for key in totals)


# --- shard groups ----------------------------------------------------------------------------------------


async def test_two_shard_groups_share_the_database_and_answer_only_their_own_servers(
    db_url: str, builtin_embedder: object, tmp_path: Path
) -> None:
    """SHARD_COUNT=2 with SHARD_IDS=0 in one bot and 1 in another, as two processes would run: each connects
    its own shard, gets only its servers' events (the fake Discord routes by (guild_id >> 22) % 2, as Discord
    does), and every message is answered exactly once, with both bots on one PostgreSQL."""
    from bot.bot import DeskmateBot
    from bot.config import load_settings
    from bot.embeddings.providers import DeadlineEmbedder
    from tests.discord_fakes import BOT_ID, BOT_USER, Call, FakeDiscord, channel_payload, guild_payload, message_payload
    from tests.discord_fakes import user_payload as user
    from tests.fakes import FakeChatServer

    odd, even = 900_000_000_000_000_100, 900_000_000_004_194_404  # shards 1 and 0 of 2
    guilds = [guild_payload(g, f"server {g}", [channel_payload(g + 1, "general", g)]) for g in (odd, even)]
    async with FakeChatServer(default_text="Happy to help!") as chat, FakeDiscord(guilds=guilds) as fake:
        bots, tasks, pools = [], [], []
        for shard in ("0", "1"):
            settings = load_settings({"SHARD_COUNT": "2", "SHARD_IDS": shard, "CHAT_BASE_URL": chat.base_url,
                                      "CHAT_MODEL": "fake-model", "DATA_DIR": str(tmp_path)}, dotenv_path=None)
            pool = await create_pool(db_url, max_size=4)
            pools.append(pool)
            core = memory_core(pool, DeadlineEmbedder(builtin_embedder, 30.0), settings)  # type: ignore[arg-type]
            bot = DeskmateBot(build_services(core), sync_commands=False, guild_ready_timeout=0.1)
            bots.append(bot)
            tasks.append(asyncio.create_task(bot.start("fake-token")))
        try:
            await asyncio.wait_for(asyncio.gather(*(bot.wait_until_ready() for bot in bots)), 60)
            identified = sorted(tuple(frame["d"]["shard"]) for frame in fake.received if frame["op"] == 2)
            assert identified == [(0, 2), (1, 2)]
            assert [[guild.id for guild in bot.guilds] for bot in bots] == [[even], [odd]]

            juno = user(102, "Juno")
            for guild in (odd, even, odd):
                await fake.dispatch("MESSAGE_CREATE", message_payload(
                    channel_id=guild + 1, guild_id=guild, author=juno, content=f"<@{BOT_ID}> hello", mentions=[BOT_USER]))

            def replies() -> list[Call]:
                return [c for c in fake.calls if c.method == "POST" and c.path.endswith("/messages")
                        and (c.body or {}).get("message_reference")]

            for _ in range(600):
                if len(replies()) >= 3:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)  # room for a duplicate answer to show up, if there were one
            assert sorted(c.path for c in replies()) == sorted(f"/channels/{g + 1}/messages" for g in (odd, even, odd))
            assert len(chat.requests) == 3
        finally:
            for bot in bots:
                await bot.close()
            for task in tasks:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(task, 30)
            for bot in bots:
                assert bot.services.pipeline is not None
                await bot.services.pipeline.model.close()
            for pool in pools:
                await pool.close()
