"""`python -m bot check`: verify that the stored memories obey the rules, e.g. after a crash.

Reports every list over its limit, counters that aged more than once a day or have dates out of
order, memories that should be protected and are not, server memories under a foreign persona,
and vectors computed from an old text. Exits 1 when anything is found, so scripts and monitoring
can act on it.
"""

from __future__ import annotations

from bot.config import Settings
from bot.embeddings.providers import NoEmbedder
from bot.services import open_services


async def run_check(settings: Settings) -> int:
    async with open_services(settings, embedder=NoEmbedder()) as services:
        problems = await services.core.integrity_problems()
        total = await services.core.count_memories()
    found = {name: lines for name, lines in problems.items() if lines}
    if not found:
        print(f"ok: {total} memories checked, {len(problems)} rules hold")
        return 0
    for name, lines in found.items():
        print(f"{name}: {len(lines)}")
        for line in lines[:20]:
            print(f"  {line}")
        if len(lines) > 20:
            print(f"  ... and {len(lines) - 20} more")
    print(f"{sum(len(lines) for lines in found.values())} problems in {total} memories")
    return 1
