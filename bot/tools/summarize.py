"""`python -m bot summarize --backfill [--days N] [--channel ID]`: write the missing channel summaries now.

For a first start on a database that already holds chat, or after the summary model was down for a
while, without waiting for each channel's next day rollover. It backfills every channel with messages
in the last N chat days (SUMMARY_BACKFILL_DAYS), or one channel, with a progress bar per channel on
the terminal (stderr). It works from what is missing, so it can be stopped at any time and run again.
Exit status 0 when every day got its summary, 1 when the summary model failed on some days (they
stay missing), 2 when no summary model is configured, 130 when interrupted.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from bot import shutdown
from bot.config import Settings
from bot.embeddings.providers import create_embedder
from bot.services import open_services
from bot.summaries.models import BackfillProgress
from bot.summaries.writer import SummaryWriter

BAR_WIDTH = 30
EXIT_FAILED_DAYS = 1
EXIT_NOT_CONFIGURED = 2


def progress_line(label: str, state: BackfillProgress) -> str:
    filled = round(state.fraction * BAR_WIDTH)
    return f"{label} [{'#' * filled}{'-' * (BAR_WIDTH - filled)}] {state.fraction:4.0%}  {state.line()}"


class TerminalBar:
    """A carriage-return progress bar for one channel: one line, redrawn at most ten times a second (always at the end)."""

    def __init__(self, out: TextIO, label: str) -> None:
        self.out = out
        self.label = label
        self.last = 0.0
        self.width = 0

    def __call__(self, state: BackfillProgress) -> None:
        now = time.monotonic()
        if not state.finished and now - self.last < 0.1:
            return
        self.last = now
        line = progress_line(self.label, state)
        self.out.write("\r" + line.ljust(self.width))
        self.width = len(line)
        if state.finished:
            self.out.write("\n")
        self.out.flush()


async def run_summarize(
    settings: Settings, *, days: int | None = None, channel: int | None = None, out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    if not settings.summary_enabled:
        print("error: summaries are switched off (SUMMARY_ENABLED=false); nothing to summarise", file=err)
        return EXIT_NOT_CONFIGURED
    if not SummaryWriter(settings).configured:
        print("error: no summary model is configured (SUMMARY_MODEL, or CHAT_MODEL with its endpoint); nothing to summarise",
              file=err)
        return EXIT_NOT_CONFIGURED
    days = min(days or settings.summary_backfill_days, 365)
    # Summaries never embed anything: skip loading the embedding model.
    embedder = create_embedder(settings.with_overrides(embedding_provider="none"))
    async with open_services(settings, embedder=embedder) as services:
        summaries = services.summaries
        channels = await summaries.channels_to_backfill(days)
        if channel is not None:
            channels = [(channel_id, guild_id) for channel_id, guild_id in channels if channel_id == channel]
            if not channels:
                print(f"Channel {channel} has no messages in the last {days} chat days; nothing to summarise.", file=out)
                return 0
        print(f"Backfilling the summaries of {len(channels)} channels (the last {days} chat days)…", file=out, flush=True)
        written = weeks = 0
        failed: list[str] = []
        for channel_id, guild_id in channels:
            label = f"channel {channel_id}"
            state = await summaries.catch_up(channel_id, guild_id, days=days, progress=TerminalBar(err, label), retry_now=True)
            written += state.written
            weeks += state.weeks_done
            failed += [f"{label}: {failure}" for failure in state.failed]
        for failure in failed:
            print(f"failed: {failure}", file=err)
        print(
            f"Done: {len(channels)} channels, {written} day summaries written, {weeks} weeks folded, {len(failed)} days failed.",
            file=out,
        )
        if failed:
            print("The failed days stay missing; run it again later: it resumes where it stopped.", file=err)
            return EXIT_FAILED_DAYS
        return 0


def main(settings: Settings, days: int | None = None, channel: int | None = None) -> int:
    try:
        return shutdown.run(run_summarize(settings, days=days, channel=channel))
    except (KeyboardInterrupt, shutdown.Interrupted) as exc:
        signum = shutdown.signal_of(exc)
        print(f"\nStopped by {shutdown.signal_name(signum)}; run it again to continue where it stopped.", file=sys.stderr)
        return 128 + signum
