"""A local OpenAI-compatible chat endpoint that answers at once, so throughput measures the bot, not a model.

Run as its own process (`python -m bench.stub`): it prints `PORT <n>` when it listens on
127.0.0.1 and serves until stdin closes or it is terminated. A separate process keeps its CPU
out of the measured bot process while still sharing the machine, as a real local model would.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from aiohttp import web

REPLY = "Sure! Happy to help with that."


async def chat_completions(request: web.Request) -> web.Response:
    body = await request.json()
    answer = {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "stub"),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": REPLY}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 0, "completion_tokens": 8, "total_tokens": 8},
    }
    return web.Response(text=json.dumps(answer), content_type="application/json")


async def serve() -> None:
    app = web.Application(client_max_size=32 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", chat_completions)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    print(f"PORT {port}", flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)  # until the parent closes our stdin
    await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(serve())
