"""`python -m bench.first_reply`: how long the first reply after the day's background work takes, re-warm off and on.

A one-slot server (llama.cpp's default) keeps one prompt in its cache. The day summary and the notes run on it
between two replies and evict the chat's prompt, so the next reply reads its whole prompt again (on a small CPU
that is a minute or more). With CHAT_REWARM the bot sends the last reply's request again for one token once the
background work is done (`bot.chat.model.ModelGate`). This runs, per sample, through the bot's own wiring on a
throwaway database: a reply (the chat's prompt is cached), a day summary through the same gate (as the bot's
day roll-over does), then the timed reply, alternating CHAT_REWARM off and on. It needs CHAT_BASE_URL and
CHAT_MODEL (a local one-slot server); never run in CI.

    CHAT_BASE_URL=http://127.0.0.1:8090/v1 CHAT_MODEL=local .venv/bin/python -m bench.first_reply --samples 2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from datetime import timedelta

from bot.chat.messages import IncomingMessage
from bot.clock import ManualClock
from bot.config import Settings, load_settings
from bot.db import throwaway_database
from bot.services import open_services

GUILD, CHANNEL, BOT = 7_101, 7_102, 2
PEOPLE = {"Juno": 7_103, "Rin": 7_104}
DAY_ONE = (
    ("Juno", "Morning all! Game night is this Friday at 8pm, at Bau's place."),
    ("Rin", "I'll bring snacks. Juno, can you bring the new deck-building game?"),
    ("Juno", "Sure. Deskmate, what is a good snack for a board game night?"),
)
QUESTIONS = ("What's the capital of Italy?", "How many players does chess need?", "What's the capital of Spain?",
             "How many days are in a week?")


async def sample(settings: Settings, rewarm: bool, question: str) -> tuple[float, float]:
    """(seconds of the timed reply, seconds of the background work and re-warm before it)."""
    settings = settings.with_overrides(chat_rewarm=rewarm, summary_enabled=False)  # the summary is run below, by hand
    clock = ManualClock()
    async with throwaway_database(settings, "first-reply benchmark") as database, open_services(
        settings, database=database, clock=clock, bot_user_id=BOT
    ) as services:
        number = 0

        async def say(author: str, text: str, *, mention: bool) -> float:
            nonlocal number
            number += 1
            clock.current += timedelta(minutes=1)
            incoming = IncomingMessage(message_id=10_000 + number, channel_id=CHANNEL, author_id=PEOPLE[author],
                                       author_name=author, text=text, created_at=clock.now(), guild_id=GUILD)
            started = time.monotonic()
            outcome = await services.chat.handle(incoming, mentions_bot=mention)
            seconds = time.monotonic() - started
            if outcome is not None and outcome.chunks:
                number += 1
                await services.chat.record(IncomingMessage(
                    message_id=10_000 + number, channel_id=CHANNEL, author_id=BOT, author_name="Deskmate",
                    text=outcome.text, created_at=clock.now(), guild_id=GUILD, is_bot=True, reply_to=incoming.message_id))
            return seconds

        for author, text in DAY_ONE:
            await say(author, text, mention=text.startswith("Sure"))
        started = time.monotonic()
        transcript = [f"{author}: {text}" for author, text in DAY_ONE]
        await services.summaries.writer.day("Chat of Thu 2026-01-01", transcript)
        gate = services.model.gate
        while rewarm and gate.warmed == 0:  # noqa: ASYNC110  # the re-warm goes out once the background work is over
            await asyncio.sleep(0.5)
        background = time.monotonic() - started
        clock.current += timedelta(days=1)
        seconds = await say("Rin", question, mention=True)
        return seconds, background


async def main(args: argparse.Namespace) -> int:
    settings = load_settings()
    if not (settings.chat_base_url and settings.chat_model):
        print("set CHAT_BASE_URL and CHAT_MODEL (a local one-slot server)")
        return 2
    settings = settings.with_overrides(replies_first="on")
    rows = []
    for index in range(args.samples):
        for rewarm in (False, True):
            question = QUESTIONS[(2 * index + rewarm) % len(QUESTIONS)]
            seconds, background = await sample(settings, rewarm, question)
            load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
            rows.append((rewarm, seconds, background, load))
            print(f"sample {index + 1}, CHAT_REWARM={'on' if rewarm else 'off'}: first reply after the summary "
                  f"{seconds:.1f} s (summary{' and re-warm' if rewarm else ''} before it {background:.1f} s), "
                  f"load {load}", flush=True)
    for rewarm in (False, True):
        times = sorted(seconds for on, seconds, _, _ in rows if on is rewarm)
        print(f"CHAT_REWARM={'on' if rewarm else 'off'}: " + ", ".join(f"{t:.1f}" for t in times) + " s")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2)
    raise SystemExit(asyncio.run(main(parser.parse_args())))
