"""`python -m bot reembed`: embed every memory, chat chunk and document passage in the current embedding space.

For after a change of EMBEDDING_PROVIDER / EMBEDDING_MODEL (or to catch up after an outage) without
waiting for the bot's background task. It shows a progress bar on the terminal (stderr), and can be
stopped at any time: it works from "what has no vector in the current space", so the next run (or
the bot) continues where it stopped. Exit status 0 when everything has a vector, 1 when embedding
failed midway (the reason is printed), 130 when interrupted.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from bot import shutdown
from bot.config import Settings
from bot.embeddings.providers import create_embedder
from bot.services import open_services
from bot.upkeep import RebuildProgress

BAR_WIDTH = 30


def progress_line(state: RebuildProgress) -> str:
    filled = round(state.fraction * BAR_WIDTH)
    return f"[{'#' * filled}{'-' * (BAR_WIDTH - filled)}] {state.fraction:4.0%}  {state.summary()}"


class TerminalBar:
    """A carriage-return progress bar: one line, redrawn at most ten times a second (always at the end)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.last = 0.0
        self.width = 0

    def __call__(self, state: RebuildProgress) -> None:
        now = time.monotonic()
        if not state.finished and now - self.last < 0.1:
            return
        self.last = now
        line = progress_line(state)
        self.out.write("\r" + line.ljust(self.width))
        self.width = len(line)
        if state.finished:
            self.out.write("\n")
        self.out.flush()


async def run_reembed(settings: Settings, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    embedder = create_embedder(settings)
    if embedder.space is None:
        print("error: no embedding provider is configured (EMBEDDING_PROVIDER=none); nothing to embed", file=err)
        return 1
    await embedder.warm_up()
    async with open_services(settings, embedder=embedder) as services:
        upkeep = services.upkeep
        print(f"Embedding with {embedder.space}; what is missing: {await upkeep.waiting()}", file=out, flush=True)
        state = await upkeep.rebuild(TerminalBar(err))
        if state.paused:
            print(f"Paused: {state.paused}\nRun `python -m bot reembed` again later: it continues where it stopped.", file=err)
            return 1
        print(
            f"Done: {state.summary()}; {state.chunks_made} new chunks of older chat; "
            f"{state.stale_removed} vectors of other models removed.",
            file=out,
        )
        return 0


def main(settings: Settings) -> int:
    try:
        return shutdown.run(run_reembed(settings))
    except (KeyboardInterrupt, shutdown.Interrupted) as exc:
        signum = shutdown.signal_of(exc)
        print(f"\nStopped by {shutdown.signal_name(signum)}; run it again to continue where it stopped.", file=sys.stderr)
        return 128 + signum
