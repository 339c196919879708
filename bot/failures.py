"""Failures a person can fix, as one sentence that names what to change.

Start-up can fail in many places (the data folder, the embedded server, the URL, the server itself),
and each library says so in its own way: an `OSError` with an errno, asyncpg's `ValueError` for a
bad port, `ClientConfigurationError` for a bad sslmode, a PostgreSQL error with a hint on three
lines. `startup_failure` is the one place that turns those into one line naming the setting
(DATA_DIR or DATABASE_URL); `Database.open` raises the result as a `DatabaseError`, which the
command line prints as `error: ...` with a non-zero exit status. Whatever it does not recognise is
a bug and keeps its traceback.

A full disk is the one database failure that also happens long after start-up, while saving: it
gets the same treatment everywhere (`database_sentence`), so a person reads "the disk is full"
instead of "something went wrong".
"""

from __future__ import annotations

import errno
import subprocess
import tempfile
from pathlib import Path

import asyncpg

from bot.config import Settings, redact_url

DISK_FULL = "the database's disk is full, so this was not saved; free some space on that disk and try again"


class DatabaseError(RuntimeError):
    """The database cannot be used; the message says what to do about it."""


def first_line(text: object) -> str:
    """PostgreSQL messages carry DETAIL and HINT on further lines: the first one is the sentence."""
    lines = str(text).strip().splitlines()
    return lines[0].strip() if lines else ""


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, asyncpg.exceptions.DiskFullError) or (isinstance(exc, OSError) and exc.errno == errno.ENOSPC)


DATABASE_UNREACHABLE = (
    "the database cannot be reached right now, so this was not done; try again in a moment (nothing is lost: "
    "the bot reconnects by itself when the database is back)"
)
# How asyncpg reports a server that is down, restarting or gone mid-statement: refused or reset connections, a
# socket file that is not there while the embedded server is stopped, "the database system is shutting down /
# starting up", a connection closed under a statement, a connect that timed out.
UNREACHABLE_ERRORS: tuple[type[BaseException], ...] = (
    ConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.PostgresConnectionError,
    asyncpg.exceptions.ConnectionDoesNotExistError,
)


def is_unreachable(exc: BaseException) -> bool:
    """The database server is down, restarting or unreachable (not a bug, not a refused statement)."""
    if isinstance(exc, UNREACHABLE_ERRORS):
        return True
    if isinstance(exc, asyncpg.InterfaceError):
        return "connection is closed" in str(exc) or "connection was closed" in str(exc)
    if isinstance(exc, FileNotFoundError | TimeoutError) and exc.__traceback__ is not None:
        return _raised_by_asyncpg(exc)
    return False


def _raised_by_asyncpg(exc: BaseException) -> bool:
    """A missing socket file or a timeout counts only when it came from opening a database connection."""
    traceback = exc.__traceback__
    while traceback is not None:
        if "asyncpg" in traceback.tb_frame.f_code.co_filename:
            return True
        traceback = traceback.tb_next
    return False


def database_sentence(exc: BaseException) -> str | None:
    """The sentence for a database failure met while serving people (a save, an edit, a reply), or None."""
    if is_disk_full(exc):
        return DISK_FULL
    return DATABASE_UNREACHABLE if is_unreachable(exc) else None


def data_dir_sentence(data_dir: Path, exc: OSError) -> str:
    """Why DATA_DIR cannot hold the embedded server, from the error of creating or writing in it."""
    shown = f"DATA_DIR ({data_dir})"
    if isinstance(exc, FileExistsError) or (data_dir.exists() and not data_dir.is_dir()):
        return f"{shown} is a file, not a folder; set DATA_DIR to a folder (it is created if missing)"
    if isinstance(exc, NotADirectoryError):
        blocking = next((parent for parent in data_dir.parents if parent.exists() and not parent.is_dir()), None)
        where = f" {blocking}" if blocking is not None else " a part of that path"
        return f"{shown} is inside{where}, which is a file, not a folder; set DATA_DIR to a folder"
    if exc.errno == errno.EROFS:
        return f"{shown} is on a read-only file system; set DATA_DIR to a writable folder"
    if isinstance(exc, PermissionError):
        return f"{shown} is not writable by this user; make it writable or set DATA_DIR to another folder"
    if exc.errno == errno.ENOSPC:
        return f"the disk of {shown} is full; free some space or set DATA_DIR to another disk"
    return f"{shown} cannot be used: {exc.strerror or first_line(exc)}"


def usable_data_dir(data_dir: Path) -> None:
    """Create DATA_DIR if needed and make sure this process can write there, or raise one sentence.

    Checked before the embedded server is touched: pgserver would fail deep inside, with a
    traceback, and as root it would even chown the folder first.
    """
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=data_dir, prefix=".deskmate-write-test-"):
            pass
    except OSError as exc:
        raise DatabaseError(data_dir_sentence(data_dir, exc)) from exc


def embedded_start_failure(data_dir: Path, exc: BaseException) -> str:
    """The embedded PostgreSQL (initdb or pg_ctl) failed: say where, and where its log is."""
    if isinstance(exc, OSError) and not isinstance(exc, subprocess.SubprocessError):
        return data_dir_sentence(data_dir, exc)
    pgdata = data_dir / "postgres"
    reason = "it did not answer in time" if isinstance(exc, subprocess.TimeoutExpired) else first_line(exc) or type(exc).__name__
    return f"the embedded PostgreSQL in DATA_DIR ({pgdata}) did not start ({reason}); its log is {pgdata / 'log'}"


def startup_failure(exc: BaseException, settings: Settings, url: str) -> str | None:
    """One sentence naming the setting for a failure of `Database.open`, or None when it is not one a
    person can fix by changing a setting or the server (a bug, an interrupt)."""
    if not isinstance(exc, Exception):
        return None
    if settings.database_url:
        where = f"the database of DATABASE_URL ({redact_url(url or settings.database_url)})"
    else:
        where = f"the embedded database in DATA_DIR ({settings.data_dir})"
    if is_disk_full(exc):
        return f"the disk of {where} is full; free some space there, then start again"
    if isinstance(exc, asyncpg.exceptions.InvalidPasswordError | asyncpg.exceptions.InvalidAuthorizationSpecificationError):
        return f"{where} refused the user or password: {first_line(exc)}"
    if isinstance(exc, asyncpg.exceptions.InvalidCatalogNameError):
        return f"{where} does not exist on that server ({first_line(exc)}); create it first"
    if isinstance(exc, asyncpg.PostgresError):
        return f"cannot use {where}: {first_line(exc)}"
    if isinstance(exc, OSError | TimeoutError):  # refused, unknown host, no route, socket missing
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else first_line(exc) or type(exc).__name__
        setting = "check the host and port in DATABASE_URL" if settings.database_url else "check DATA_DIR"
        return f"cannot reach {where} ({reason}); {setting} and that the server is running"
    if isinstance(exc, ValueError | asyncpg.InterfaceError):  # asyncpg's checks of the URL and its options
        return f"{where} cannot be used as written: {first_line(exc)}"
    return None
