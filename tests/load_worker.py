"""A second bot process for the load test (tests/test_load.py): its own pool, core and pipeline.

Usage: python tests/load_worker.py DATABASE_URL CHAT_URL SIZE_JSON [STATEMENT_CACHE] (true, or false behind
PgBouncer in transaction mode). It reads one JSON line per phase
from stdin, {"date": "2026-05-02", "ops": [...]}, runs the operations concurrently through the real
reply pipeline, and answers with one JSON line: {"results": [...]}. It exits when stdin closes.
"""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.load_world import Op, Size, Worker


async def main(db_url: str, chat_url: str, size_json: str, statement_cache: str = "true") -> None:
    worker = await Worker.open(db_url, Size(**json.loads(size_json)), chat_url, statement_cache=statement_cache == "true")
    loop = asyncio.get_running_loop()
    try:
        print(json.dumps({"ready": True}), flush=True)
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                break
            command = json.loads(line)
            ops = [Op.from_json(op) for op in command["ops"]]
            results = await worker.run(date.fromisoformat(command["date"]), ops)
            print(json.dumps({"results": results}), flush=True)
    finally:
        await worker.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
