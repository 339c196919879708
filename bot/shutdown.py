"""How a Deskmate process stops: SIGTERM (`docker stop`, systemd), SIGHUP (a closed terminal) and SIGINT (Ctrl-C)
all ask for the same clean shutdown, from the first line of `python -m bot` on.

Left to their defaults, SIGTERM and SIGHUP end the process on the spot: the embedded PostgreSQL it started runs on
with nobody left to stop it, and `docker stop` reports the bot as killed. Worse, in a container the bot is PID 1,
which the kernel spares every signal it has no handler for: a `docker stop` before the handlers exist is simply
lost, and Docker kills the bot ten seconds later. So `install` (the first thing `python -m bot` does) handles them:

- while `run` drives a coroutine, a signal cancels that coroutine's task, the way asyncio treats Ctrl-C: every
  `async with` on the way out closes what it opened (the gateway, the pool, the embedded server). Code with a
  gentler way to stop (the bot closes its gateway first) registers it with `on_signal` for as long as it runs.
- outside `run` (reading the settings, a tool's own steps) the signal raises `Interrupted` where the code is, and
  the command line ends with its exit status. While the command line is still being imported, the signal is only
  noted (an exception inside an import would be a traceback): `arm`, the first line of `main`, raises it.

A second signal while shutting down is ignored: the first one's shutdown is under way (Docker still sends SIGKILL
after its grace period if it takes too long). This module imports only light parts of the standard library (asyncio
when it is used), so it is ready before anything slow is loaded.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Coroutine, Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import asyncio

T = TypeVar("T")

SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)


class Interrupted(BaseException):
    """A shutdown signal came; a BaseException, like KeyboardInterrupt, so no `except Exception` swallows it."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stopped by {signal_name(signum)}")


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def signal_of(exc: BaseException) -> int:
    """The signal behind `exc`: an `Interrupted`'s, or SIGINT for Python's own KeyboardInterrupt."""
    return exc.signum if isinstance(exc, Interrupted) else int(signal.SIGINT)


_received: int | None = None
_armed = False
_previous: dict[int, Any] | None = None  # the handlers `install` replaced, while installed
_callbacks: list[tuple[asyncio.AbstractEventLoop, Callable[[], object]]] = []


def received() -> int | None:
    """The shutdown signal this process received, if any."""
    return _received


def install() -> bool:
    """Handle SIGINT, SIGTERM and SIGHUP from now on; False when they already are (or off the main thread)."""
    global _previous
    if _previous is not None or threading.current_thread() is not threading.main_thread():
        return False
    previous: dict[int, Any] = {}
    for signum in SIGNALS:
        previous[signum] = signal.signal(signum, _handle)
    _previous = previous
    return True


def arm() -> None:
    """From now on a signal outside `run` raises `Interrupted` where the code is; one that came earlier (while the
    command line was still being imported) raises it now."""
    global _armed
    _armed = True
    if _received is not None:
        raise Interrupted(_received)


def uninstall() -> None:
    """Give the signals back the handlers they had before `install`, and forget a received signal."""
    global _previous, _received
    if _previous is None:
        return
    for signum, handler in _previous.items():
        signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
    _previous = None
    _received = None


def _handle(signum: int, frame: FrameType | None) -> None:
    global _received
    if _received is not None:
        return  # already shutting down
    _received = signum
    if not _callbacks:
        if _armed:
            raise Interrupted(signum)
        return  # still importing: `arm` raises it, outside any import
    loop, callback = _callbacks[-1]
    loop.call_soon_threadsafe(callback)  # thread-safe also means safe between two steps of the loop's own code


@contextlib.contextmanager
def on_signal(callback: Callable[[], object]) -> Iterator[None]:
    """While inside, a shutdown signal calls `callback` on the running loop (the innermost registration wins).

    A process that did not install the handlers (a test, a program embedding the bot) gets them installed here and
    back as they were on the way out.
    """
    import asyncio

    loop = asyncio.get_running_loop()
    installed_here = install()
    entry = (loop, callback)
    _callbacks.append(entry)
    try:
        if _received is not None:  # it came before anyone listened: act on it now
            loop.call_soon(callback)
        yield
    finally:
        _callbacks.remove(entry)
        if installed_here:
            uninstall()


def run(main: Coroutine[Any, Any, T], *, loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None) -> T:
    """`asyncio.run(main)`, where a shutdown signal cancels `main` (which closes what it opened) and then raises
    `Interrupted`. A signal that came before the loop started cancels `main` before its first step."""
    import asyncio

    async def guarded() -> T:
        task = asyncio.current_task()
        assert task is not None
        with on_signal(task.cancel):
            return await main

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        try:
            return runner.run(guarded())
        except asyncio.CancelledError:
            if _received is not None:
                raise Interrupted(_received) from None
            raise
