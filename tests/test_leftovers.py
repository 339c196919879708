"""The embedded PostgreSQL after processes that did not end cleanly, and two processes starting at once.

Real processes throughout: `python -m bot check` opens the database exactly as the bot does, a holder
process keeps it open until it is killed, and the benchmark's helper runs as `make bench` runs it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest

from bot.db import drop_database, ensure_database
from bot.embedded import HANDLE_FILE, POSTMASTER_PID, postgres_processes

ROOT = Path(__file__).resolve().parents[1]

HOLDER = """
import asyncio
from bot.config import load_settings
from bot.db import Database

async def main():
    database = await Database.open(load_settings(dotenv_path=None), max_size=1)
    print("ready", flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""

BENCH = """
import asyncio, sys
from bench.pg import bench_server

async def main():
    async with bench_server() as server:
        print(server.pgdata, flush=True)
        async with server.database("leftover"):
            print("ready", flush=True)
            if sys.argv[1] == "wait":
                await asyncio.sleep(600)

try:
    asyncio.run(main())
except asyncio.CancelledError:
    sys.exit(143)
"""


def env_for(data_dir: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in ("DATABASE_URL", "BENCH_DATABASE_URL")}
    return {**env, "DATA_DIR": str(data_dir), "LOG_LEVEL": "WARNING", "PYTHONPATH": str(ROOT)}


def check(data_dir: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bot", "check"], cwd=cwd, env=env_for(data_dir), capture_output=True,
                          text=True, timeout=300)


def gone(pgdata: Path, seconds: float = 20.0) -> bool:
    """No PostgreSQL process of `pgdata` is left (a stopping server takes a moment)."""
    deadline = time.monotonic() + seconds
    while postgres_processes(pgdata):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_after_a_kill_9_the_next_process_stops_the_orphaned_server(tmp_path: Path) -> None:
    data = tmp_path / "data"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], cwd=tmp_path, env=env_for(data), stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
    finally:
        holder.kill()  # kill -9: no clean-up of any kind
        holder.wait(30)
    pgdata = (data / "postgres").resolve()
    time.sleep(0.5)
    assert postgres_processes(pgdata), "the server should outlive the killed process (that is the leftover)"
    assert str(holder.pid) in (pgdata / HANDLE_FILE).read_text()

    done = check(data, tmp_path)
    assert done.returncode == 0 and done.stdout.startswith("ok:"), done.stdout + done.stderr
    assert gone(pgdata), "the process after the kill -9 left the orphaned server running"
    assert (pgdata / HANDLE_FILE).read_text().strip() == "[]"
    again = check(data, tmp_path)  # and the data folder is still fine to start from
    assert again.returncode == 0, again.stderr
    assert gone(pgdata)


def test_a_stale_postmaster_pid_that_now_names_another_live_process_is_removed(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = check(data, tmp_path)
    assert first.returncode == 0, first.stderr
    pgdata = (data / "postgres").resolve()
    assert gone(pgdata) and not (pgdata / POSTMASTER_PID).exists()
    other = subprocess.Popen(["sleep", "300"])  # the PID the old server had now belongs to this program
    try:
        (pgdata / POSTMASTER_PID).write_text(
            f"{other.pid}\n{pgdata}\n{int(time.time()) - 3600}\n5432\n{pgdata}\n\n  5432001     32768\nready   \n",
            encoding="utf-8",
        )
        done = check(data, tmp_path)
        assert done.returncode == 0 and done.stdout.startswith("ok:"), done.stdout + done.stderr
        assert "Traceback" not in done.stderr
        assert other.poll() is None, "the unrelated process must not be touched"
        assert gone(pgdata)
    finally:
        other.kill()
        other.wait(10)


def test_a_leftover_backend_of_this_data_dir_stops_start_up_with_one_sentence(tmp_path: Path) -> None:
    """A postmaster.pid naming a dead PID while a process of the same server still runs: removing the file would let
    a second server start beside it, so start-up refuses and says which processes to stop."""
    data = tmp_path / "data"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], cwd=tmp_path, env=env_for(data), stdout=subprocess.PIPE,
                              text=True)
    pgdata = (data / "postgres").resolve()
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        lines = (pgdata / POSTMASTER_PID).read_text(encoding="utf-8").splitlines()
        dead = subprocess.Popen(["true"])
        dead.wait(10)
        (pgdata / POSTMASTER_PID).write_text("\n".join([str(dead.pid), *lines[1:]]) + "\n", encoding="utf-8")
        done = check(data, tmp_path)
        assert done.returncode != 0 and "Traceback" not in done.stderr
        assert done.stderr.strip().splitlines()[-1].startswith("error: PostgreSQL processes ("), done.stderr
        (pgdata / POSTMASTER_PID).write_text("\n".join(lines) + "\n", encoding="utf-8")
    finally:
        holder.terminate()  # SIGTERM ends asyncio.run without clean-up either: stop the server by hand below
        holder.wait(30)
        for process in postgres_processes(pgdata):
            if process.pid == int((pgdata / POSTMASTER_PID).read_text().split()[0]):
                process.send_signal(signal.SIGINT)  # fast shutdown
        assert gone(pgdata, 60)


def test_two_processes_starting_at_once_on_a_fresh_data_dir_both_start(tmp_path: Path) -> None:
    for attempt in range(2):
        data = tmp_path / f"data-{attempt}"
        starts = [
            subprocess.Popen([sys.executable, "-m", "bot", "check"], cwd=tmp_path, env=env_for(data), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
            for _ in range(2)
        ]
        outputs = [start.communicate(timeout=300) for start in starts]
        results = [(start.returncode, out, err) for start, (out, err) in zip(starts, outputs, strict=True)]
        assert all(code == 0 and out.startswith("ok:") for code, out, _ in results), results
        assert gone((data / "postgres").resolve())


async def test_many_creates_of_one_new_database_at_once_all_succeed(pg_server_url: str) -> None:
    name = f"t_race_{uuid.uuid4().hex[:12]}"
    try:
        await asyncio.gather(*(ensure_database(pg_server_url, name) for _ in range(6)))
    finally:
        await drop_database(pg_server_url, name)


@pytest.mark.parametrize("ending", ["normal exit", "SIGTERM"])
def test_the_benchmark_server_is_gone_when_the_benchmark_ends(ending: str) -> None:
    # a short temporary folder of its own: a Unix socket path is at most about 100 characters, and
    # pytest's folders (named after this test) leave too little room for the server's socket under them
    tmp_path = Path(tempfile.mkdtemp(prefix="dm-leftover-", dir="/tmp"))
    bench = subprocess.Popen([sys.executable, "-c", BENCH, "wait" if ending == "SIGTERM" else "exit"], cwd=ROOT,
                             env={**env_for(tmp_path / "unused"), "TMPDIR": str(tmp_path)}, stdout=subprocess.PIPE, text=True)
    try:
        assert bench.stdout is not None
        pgdata = Path(bench.stdout.readline().strip())
        assert bench.stdout.readline().strip() == "ready"
        assert pgdata.is_relative_to(tmp_path)
        if ending == "SIGTERM":
            assert postgres_processes(pgdata)
            bench.send_signal(signal.SIGTERM)
        bench.wait(120)
    finally:
        if bench.poll() is None:
            bench.kill()
    assert gone(pgdata), [process.pid for process in postgres_processes(pgdata)]
    assert not pgdata.exists()
    assert not [p for p in psutil.process_iter(["name", "cmdline"])
                if p.info["name"] == "postgres" and str(pgdata) in " ".join(p.info["cmdline"] or [])]
    shutil.rmtree(tmp_path, ignore_errors=True)
