"""A process that saves memories as fast as it can until it is killed (used by test_faults.py).

Usage: python tests/burst_saves.py DATABASE_URL. Prints "day N" as it goes, so the test knows
the burst is under way before it sends SIGKILL.
"""

from __future__ import annotations

import asyncio
import sys
from datetime import date, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.clock import ManualClock
from bot.config import Settings
from bot.db import create_pool
from bot.embeddings.providers import BuiltinEmbedder, DeadlineEmbedder
from bot.memory.models import Conversation, MemoryList, NewMemory, Source
from bot.services import memory_core

LIMITS = {"server_memory_limit": 6, "personal_memory_limit": 4, "dormant_after_days": 1}


async def main(url: str) -> None:
    pool = await create_pool(url, max_size=10)
    clock = ManualClock()
    core = memory_core(pool, DeadlineEmbedder(BuiltinEmbedder(), 60.0), Settings().with_overrides(**LIMITS), clock)
    day = date(2026, 1, 1)
    number = 0
    while True:
        day += timedelta(days=1)
        clock.set_date(day)
        await core.reply_search(Conversation(1, 1, 7, "the train was late again", participant_ids=(8,)))
        saves = []
        for _ in range(20):
            number += 1
            if number % 2:
                saves.append(NewMemory(MemoryList.SERVER, f"Server fact {number}", by=7, guild_id=1, by_can_manage=True))
            else:
                owner = 7 + number % 4 // 2
                via = Source.COMMAND if number % 10 == 0 else Source.BOT
                saves.append(NewMemory(MemoryList.PERSONAL, f"Fact {number} about a person", by=owner, via=via,
                                       guild_id=1, owner_id=owner))
        await asyncio.gather(*(core.save(request) for request in saves))
        print(f"day {day}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
