"""The bot behind a real PgBouncer in transaction mode with PG_STATEMENT_CACHE=false (docs/operations.md, "PgBouncer").

PgBouncer keeps its server connections when a client leaves, prepared statements included, and every
new process numbers asyncpg's statements from 1 again: a start-up whose migration connection still
prepared named statements failed the second time with `prepared statement "__asyncpg_stmt_1__" already
exists`. So the start-ups here are separate processes, one after another, through one PgBouncer. The
concurrency and load tests run through it too (their `route` fixture).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path

import asyncpg

from bot.config import load_settings
from bot.db import Database, connect, drop_database, ensure_database, migration_files, with_database
from tests.pgbouncer import Bouncer

ROOT = Path(__file__).resolve().parents[1]


async def test_the_bot_starts_three_times_in_a_row_through_pgbouncer(
    pg_server_url: str, pgbouncer: Bouncer, tmp_path: Path
) -> None:
    name = f"t_bouncer_{uuid.uuid4().hex[:12]}"
    await ensure_database(pg_server_url, name)
    url = pgbouncer.url(with_database(pg_server_url, name))
    env = {**os.environ, "DATABASE_URL": url, "PG_STATEMENT_CACHE": "false", "PYTHONPATH": str(ROOT), "LOG_LEVEL": "WARNING"}
    try:
        for start in range(3):  # `check` opens the database as the bot does: migrations, then the pool
            done = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "bot", "check"], cwd=tmp_path, env=env,
                                           capture_output=True, text=True, timeout=300)
            assert done.returncode == 0 and done.stdout.startswith("ok:"), (start, done.stdout, done.stderr)
        settings = load_settings({"DATABASE_URL": url, "PG_STATEMENT_CACHE": "false"}, dotenv_path=None)
        for _ in range(3):  # and in this process, where asyncpg's statement numbers go on from the last connection
            database = await Database.open(settings, max_size=2)
            try:
                assert await database.pool.fetchval("SELECT count(*) FROM schema_migrations") == len(migration_files())
            finally:
                await database.close()
        connection = await connect(url, statement_cache=False)
        try:
            prepared = await connection.fetch("SELECT name FROM pg_prepared_statements")
            extensions = await connection.fetchval("SELECT count(*) FROM pg_extension WHERE extname = 'vector'")
        finally:
            await connection.close()
        assert [row["name"] for row in prepared] == [] and extensions == 1
    finally:
        await drop_database(pg_server_url, name)


async def test_pgbouncer_really_pools_by_transaction(pg_server_url: str, pgbouncer: Bouncer) -> None:
    """The fixture is the real thing: one client's session setting shows up in another client's statement,
    because both ran on the same server connection, one transaction each. Nothing in the bot may rely on
    session state (prepared statements, session advisory locks, SET) behind such a PgBouncer."""
    database = f"t_bouncer_{uuid.uuid4().hex[:12]}"
    await ensure_database(pg_server_url, database)
    url = pgbouncer.url(with_database(pg_server_url, database))
    try:
        first = await asyncpg.connect(url, statement_cache_size=0)
        try:
            await first.execute("SET statement_timeout = '12345ms'")
            second = await asyncpg.connect(url, statement_cache_size=0)
            try:
                leaked = await second.fetchval("SHOW statement_timeout")
            finally:
                await second.close()
        finally:
            await first.close()
        assert leaked == "12345ms"
    finally:
        await drop_database(pg_server_url, database)
