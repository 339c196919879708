"""Leftovers of processes that used the embedded PostgreSQL and did not exit cleanly.

pgserver shares one server between processes through two files in its data folder:

- `.handle_pids.json`, the PIDs of the processes using the server; the last one to leave stops it.
  A process killed with `kill -9` never takes its PID out, so every later process sees a user that
  is not there and none of them ever stops the server: it runs on after the bot is gone.
- `postmaster.pid`, PostgreSQL's own lock file. After a crash of the machine or of the server, its
  PID may later belong to some other live process. pgserver then takes the server for running and
  connects to nothing, and PostgreSQL itself refuses to start until someone deletes the file by hand.

`clear_leftovers` runs before a process joins the server, under the start lock of `EmbeddedServer`,
so no other Deskmate process is starting or stopping the server meanwhile. It only removes what
provably belongs to no one: PIDs of dead processes (or of processes started after the handle file
was last written, which therefore cannot be in it), and a `postmaster.pid` whose PID is not a
PostgreSQL process of this data folder, and only when no process of this data folder is left at
all (backends outliving a killed postmaster still hold its shared memory; a second postmaster
beside them could damage the data, which is what the lock file protects against).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import psutil

from bot.failures import DatabaseError

log = logging.getLogger(__name__)

HANDLE_FILE = ".handle_pids.json"
POSTMASTER_PID = "postmaster.pid"


def clear_leftovers(pgdata: Path) -> None:
    if not pgdata.is_dir():
        return
    forget_dead_handles(pgdata)
    remove_stale_postmaster_pid(pgdata)


def forget_dead_handles(pgdata: Path) -> list[int]:
    """Drop the PIDs of processes that are gone from the handle file; returns the PIDs dropped."""
    path = pgdata / HANDLE_FILE
    try:
        text = path.read_text(encoding="utf-8")
        written_at = path.stat().st_mtime
    except FileNotFoundError:
        return []
    try:
        pids = json.loads(text) if text.strip() else []
    except ValueError:
        pids = None
    if not isinstance(pids, list) or not all(isinstance(pid, int) and not isinstance(pid, bool) for pid in pids):
        log.warning("The embedded server's handle file %s was unreadable (%r); starting it afresh", path, text[:80])
        path.write_text("[]", encoding="utf-8")
        return []
    alive = [pid for pid in pids if _alive_since(pid, written_at)]
    gone = [pid for pid in pids if pid not in alive]
    if gone:
        log.warning("Forgot the embedded server's users %s: those processes ended without leaving", gone)
        path.write_text(json.dumps(alive), encoding="utf-8")
    return gone


def _alive_since(pid: int, written_at: float) -> bool:
    """The process exists, is not a zombie, and was started before the handle file was last written."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        return process.create_time() <= written_at + 1.0  # create_time is rounded to the clock tick
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True


def postgres_processes(pgdata: Path) -> list[psutil.Process]:
    """Every PostgreSQL process (postmaster or backend) whose data folder is `pgdata`."""
    found = []
    for process in psutil.process_iter(["name"]):
        if process.info["name"] == "postgres" and _serves(process, pgdata):
            found.append(process)
    return found


def _serves(process: psutil.Process, pgdata: Path) -> bool:
    """PostgreSQL runs in its data folder; where that cannot be read, its command line names the folder."""
    try:
        if process.name() != "postgres":
            return False
        try:  # Linux shows a deleted folder as "path (deleted)": still this folder's server
            return Path(process.cwd().removesuffix(" (deleted)")).resolve() == pgdata.resolve()
        except psutil.AccessDenied:
            return str(pgdata.resolve()) in process.cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return False


def remove_stale_postmaster_pid(pgdata: Path) -> bool:
    """Remove `postmaster.pid` unless its PID is this data folder's running server; True when removed."""
    path = pgdata / POSTMASTER_PID
    try:
        first = path.read_text(encoding="utf-8", errors="replace").splitlines()[:1]
    except FileNotFoundError:
        return False
    pid = int(first[0]) if first and first[0].strip().isascii() and first[0].strip().isdigit() else None
    if pid is not None:
        try:
            if _serves(psutil.Process(pid), pgdata):
                return False  # the server is running: join it
        except psutil.NoSuchProcess:
            pass
    survivors = postgres_processes(pgdata)
    if survivors:
        pids = ", ".join(str(process.pid) for process in survivors)
        raise DatabaseError(
            f"PostgreSQL processes ({pids}) of the embedded server in {pgdata} are still running without their "
            f"server; stop them (kill {pids}), then start again"
        )
    owner = _describe(pid)
    log.warning("Removing the stale %s of the embedded server (PID %s is %s)", path, pid, owner)
    path.unlink(missing_ok=True)
    return True


def running_postmaster(pgdata: Path) -> int | None:
    """The PID of the server running on `pgdata` per its `postmaster.pid`, or None when none is."""
    try:
        first = (pgdata / POSTMASTER_PID).read_text(encoding="utf-8", errors="replace").splitlines()[:1]
    except FileNotFoundError:
        return None
    if not (first and first[0].strip().isascii() and first[0].strip().isdigit()):
        return None
    pid = int(first[0])
    try:
        return pid if _serves(psutil.Process(pid), pgdata) else None
    except psutil.NoSuchProcess:
        return None


def nobody_uses(pgdata: Path) -> bool:
    """No live process is listed in the handle file (the last user has left)."""
    forget_dead_handles(pgdata)
    try:
        text = (pgdata / HANDLE_FILE).read_text(encoding="utf-8")
    except FileNotFoundError:
        return True
    try:
        return not json.loads(text or "[]")
    except ValueError:
        return False


def _describe(pid: int | None) -> str:
    if pid is None:
        return "unreadable"
    try:
        return f"now {psutil.Process(pid).name()!r}, another program"
    except psutil.NoSuchProcess:
        return "no longer running"
    except psutil.AccessDenied:
        return "another user's program"
