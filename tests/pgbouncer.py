"""A real PgBouncer in transaction mode in front of the test PostgreSQL.

Deployments that scale out put PgBouncer between the bot processes and PostgreSQL (docs/operations.md,
"PgBouncer"). In transaction mode a server connection goes back to PgBouncer's pool after every transaction,
so nothing tied to a session survives: named prepared statements stay behind on the server connection
for the next client, session advisory locks are held by whichever client happens to get it. The tests
that use this helper run the bot's own code through such a PgBouncer with `PG_STATEMENT_CACHE=false`.

The test databases are still created, cloned and dropped on PostgreSQL directly: PgBouncer keeps idle
server connections to every database it has served, and PostgreSQL refuses to clone a template that has
connections (`CREATE DATABASE ... TEMPLATE`).

PgBouncer refuses to run as root, so as root it runs as the embedded server's `pgserver` user (which can
also reach that server's Unix socket), or as `nobody`. `make test` installs Debian's `pgbouncer` package
when it can; where it is missing, the tests that need it are skipped with the reason.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from bot.db import with_database


def pgbouncer_binary() -> str | None:
    """The pgbouncer executable (Debian installs it in /usr/sbin, often not on a user's PATH)."""
    return shutil.which("pgbouncer") or next((p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.access(p, os.X_OK)),
                                             None)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _run_as() -> str | None:
    if os.geteuid() != 0:
        return None
    for user in ("pgserver", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(user)
            return user
    return None


def _target(server_url: str) -> tuple[str, str, str | None]:
    """(libpq-style connection string for [databases], user, password) of the PostgreSQL behind the bouncer."""
    parts = urlsplit(server_url)
    query = parse_qs(parts.query)
    host = query.get("host", [parts.hostname or "127.0.0.1"])[0]
    port = query.get("port", [str(parts.port or 5432)])[0]
    user = unquote(parts.username or "postgres")
    password = unquote(parts.password) if parts.password else None
    line = f"host={host} port={port} user={user}" + (f" password={password}" if password else "")
    return line, user, password


@dataclass
class Bouncer:
    """A running pgbouncer: `url(direct_url)` is the same database reached through it."""

    port: int
    directory: Path
    process: subprocess.Popen[bytes]
    user: str
    password: str | None

    def url(self, direct_url: str) -> str:
        database = urlsplit(direct_url).path.lstrip("/") or "postgres"
        secret = f":{self.password}" if self.password else ""
        return with_database(f"postgresql://{self.user}{secret}@127.0.0.1:{self.port}/postgres", database)

    def log(self) -> str:
        path = self.directory / "pgbouncer.log"
        return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # "safe shutdown": waits for clients, which are all gone by now
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def start_pgbouncer(server_url: str, directory: Path, *, pool_size: int = 40) -> Bouncer:
    """Start pgbouncer (transaction pooling, loopback only, a free port) in front of `server_url`'s server."""
    binary = pgbouncer_binary()
    if binary is None:
        raise FileNotFoundError("pgbouncer is not installed (Debian package 'pgbouncer')")
    directory.mkdir(parents=True, exist_ok=True)
    target, user, password = _target(server_url)
    run_as = _run_as()
    for _attempt in range(5):
        port = _free_port()
        (directory / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = {target}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {port}\n"
            "unix_socket_dir =\n"
            "auth_type = any\n"
            "pool_mode = transaction\n"
            "max_client_conn = 2000\n"
            f"default_pool_size = {pool_size}\n"
            "server_reset_query =\n"
            "ignore_startup_parameters = extra_float_digits\n"
            f"logfile = {directory / 'pgbouncer.log'}\n"
            f"pidfile = {directory / 'pgbouncer.pid'}\n",
            encoding="utf-8",
        )
        if run_as is not None:
            entry = pwd.getpwnam(run_as)
            for path in (directory, *directory.iterdir()):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        command = [binary, *(["-u", run_as] if run_as else []), str(directory / "pgbouncer.ini")]
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        bouncer = Bouncer(port, directory, process, user, password)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and process.poll() is None:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                return bouncer
            time.sleep(0.05)
        bouncer.stop()  # the port was taken in between, or it failed: try again on another port
    raise RuntimeError(f"pgbouncer did not start; its log says:\n{bouncer.log()[-2000:]}")


@contextlib.contextmanager
def running_pgbouncer(server_url: str, directory: Path) -> Iterator[Bouncer]:
    bouncer = start_pgbouncer(server_url, directory)
    try:
        yield bouncer
    finally:
        bouncer.stop()
