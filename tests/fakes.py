"""Test doubles shared by test files: local OpenAI-compatible chat and embeddings servers.

`FakeChatServer` is a real HTTP server (aiohttp on 127.0.0.1, a free port) that the real `openai`
client talks to. It records every request body and answers from a script: text, tool calls, an
HTTP error, a stall (for timeouts) or raw bytes. With the script empty it answers `default_text`.

    async with FakeChatServer() as chat:
        chat.tool_calls(("save_memory", {"text": "Juno likes tea", "list": "personal"}))
        chat.text("Noted!")
        settings = Settings(chat_base_url=chat.base_url, chat_model="fake", ...)
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from aiohttp import web

from bot.summaries.writer import COMBINE_INSTRUCTIONS, DAY_INSTRUCTIONS, WEEK_INSTRUCTIONS

SUMMARY_INSTRUCTIONS = (DAY_INSTRUCTIONS, COMBINE_INSTRUCTIONS, WEEK_INSTRUCTIONS)


async def serve_locally(app: web.Application, **runner_options: Any) -> tuple[web.AppRunner, int]:
    """Start `app` on 127.0.0.1 on a free port: its runner (`cleanup()` stops it) and the port it got."""
    runner = web.AppRunner(app, **runner_options)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


class LocalEndpoint:
    """An OpenAI-compatible endpoint on 127.0.0.1 (a free port) while in `async with`; `url` is its `/v1` base URL.

    Subclasses add their routes in `app()`; `runner_options` go to aiohttp's `AppRunner`.
    """

    runner_options: ClassVar[dict[str, Any]] = {}
    url: str = ""
    _runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        self._runner, port = await serve_locally(self.app(), **self.runner_options)
        self.url = f"http://127.0.0.1:{port}/v1"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@dataclass
class ScriptStep:
    kind: str  # "text" | "tools" | "error" | "stall" | "raw"
    text: str = ""
    calls: list[tuple[str, str]] = field(default_factory=list)  # (tool name, raw JSON arguments)
    status: int = 200
    seconds: float = 0.0
    until_in_flight: int | None = None  # a stall ends early once this many requests are in flight together


class FakeChatServer:
    def __init__(
        self,
        default_text: str = "ok",
        responder: Callable[[dict[str, Any]], str] | None = None,
        *,
        summaries_aside: bool = True,
    ) -> None:
        self.default_text = default_text
        self.responder = responder  # with the script empty: the answer's text made from the request body
        # Channel summaries default to the chat endpoint and run in the background: unless a test serves them
        # on their own server, they are answered aside (`summary_requests`), never from the script. So is the
        # one-token re-warm of the chat's prompt that follows them (`warm_requests`).
        self.summaries_aside = summaries_aside
        self.summary_requests: list[dict[str, Any]] = []
        self.warm_requests: list[dict[str, Any]] = []
        self.requests: list[dict[str, Any]] = []
        self.script: deque[ScriptStep] = deque()
        self.in_flight = 0
        self.max_in_flight = 0
        self._ids = itertools.count(1)
        self._closing = asyncio.Event()
        self._flight = asyncio.Condition()  # notified when in_flight grows, and on closing
        self._gate: asyncio.Event | None = None  # while set by `hold`: requests wait for `release`
        self._held = asyncio.Condition()
        self.held = 0  # requests that came to the gate since the last `hold`
        self._runner: web.AppRunner | None = None
        self.port = 0

    # --- scripting ---

    def text(self, text: str) -> FakeChatServer:
        self.script.append(ScriptStep("text", text=text))
        return self

    def tool_calls(self, *calls: tuple[str, dict[str, Any] | str], text: str = "") -> FakeChatServer:
        """Answer with tool calls; a str argument is sent as is (to test malformed JSON)."""
        raw = [(name, args if isinstance(args, str) else json.dumps(args)) for name, args in calls]
        self.script.append(ScriptStep("tools", text=text, calls=raw))
        return self

    def error(self, status: int = 500, message: str = "the model is on fire") -> FakeChatServer:
        self.script.append(ScriptStep("error", text=message, status=status))
        return self

    def stall(self, seconds: float, then_text: str = "too late", *, until_in_flight: int | None = None) -> FakeChatServer:
        """Answer `then_text` after `seconds`, or as soon as `until_in_flight` requests are in flight at once: a meeting
        point for tests about overlap, which waits for the condition instead of hoping a sleep is long enough."""
        self.script.append(ScriptStep("stall", text=then_text, seconds=seconds, until_in_flight=until_in_flight))
        return self

    def raw(self, body: str, status: int = 200) -> FakeChatServer:
        self.script.append(ScriptStep("raw", text=body, status=status))
        return self

    def hold(self) -> FakeChatServer:
        """From now on every request waits (recorded, unanswered) until `release`: a model busy for as long as a test
        needs, to change things while work waits for its answer."""
        self._gate = asyncio.Event()
        self.held = 0
        return self

    def release(self) -> None:
        if self._gate is not None:
            self._gate.set()
        self._gate = None

    async def wait_held(self, count: int = 1) -> None:
        """Wait (at most 30 s) until `count` requests came to the gate since the last `hold`."""
        async with asyncio.timeout(30), self._held:
            await self._held.wait_for(lambda: self.held >= count)

    # --- inspection ---

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def messages(self, index: int = -1) -> list[dict[str, Any]]:
        return self.requests[index]["messages"]

    def tool_results(self, index: int = -1) -> list[dict[str, Any]]:
        """The decoded `tool` messages of a request (what the pipeline told the model about its calls)."""
        return [json.loads(m["content"]) for m in self.messages(index) if m["role"] == "tool"]

    # --- server ---

    async def __aenter__(self) -> FakeChatServer:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner, self.port = await serve_locally(app, shutdown_timeout=0.5)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._closing.set()
        await self._flight_changed()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if self.summaries_aside and is_summary_request(body):
            self.summary_requests.append(body)
            return self._completion(body, {"role": "assistant", "content": plain_summary(body)}, "stop")
        if self.summaries_aside and is_warm_request(body):
            self.warm_requests.append(body)
            return self._completion(body, {"role": "assistant", "content": "."}, "length")
        self.requests.append(body)
        gate = self._gate
        if gate is not None:
            async with self._held:
                self.held += 1
                self._held.notify_all()
            await gate.wait()
        if self.script:
            step = self.script.popleft()
        else:
            step = ScriptStep("text", text=self.responder(body) if self.responder else self.default_text)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await self._flight_changed()
        try:
            if step.kind == "stall":
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stall_ends(step.until_in_flight), step.seconds)
            else:
                await asyncio.sleep(0.01)  # long enough for overlapping requests to show up in max_in_flight
        finally:
            self.in_flight -= 1
        if step.kind == "error":
            return web.json_response({"error": {"message": step.text, "type": "server_error"}}, status=step.status)
        if step.kind == "raw":
            return web.Response(text=step.text, status=step.status, content_type="application/json")
        message: dict[str, Any] = {"role": "assistant", "content": step.text or None}
        if step.kind == "tools":
            message["tool_calls"] = [
                {"id": f"call_{next(self._ids)}", "type": "function", "function": {"name": name, "arguments": arguments}}
                for name, arguments in step.calls
            ]
        return self._completion(body, message, "tool_calls" if step.kind == "tools" else "stop")

    async def _stall_ends(self, until_in_flight: int | None) -> None:
        async with self._flight:
            await self._flight.wait_for(
                lambda: self._closing.is_set() or (until_in_flight is not None and self.in_flight >= until_in_flight)
            )

    async def _flight_changed(self) -> None:
        async with self._flight:
            self._flight.notify_all()

    def _completion(self, body: dict[str, Any], message: dict[str, Any], finish_reason: str) -> web.Response:
        return web.json_response(
            {
                "id": f"chatcmpl-{next(self._ids)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", "fake"),
                "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )


def is_summary_request(body: dict[str, Any]) -> bool:
    messages = body.get("messages") or [{}]
    return str(messages[0].get("content") or "") in SUMMARY_INSTRUCTIONS


def is_warm_request(body: dict[str, Any]) -> bool:
    """The chat model's re-warm after background work: its last reply's request, for one token."""
    return body.get("max_tokens") == 1 or body.get("max_completion_tokens") == 1


def plain_summary(body: dict[str, Any]) -> str:
    """A summary model's JSON answer made from the request: the lines it was sent, joined."""
    lines = str(body["messages"][-1]["content"]).split("\n\n", 1)[-1].splitlines()
    return json.dumps({"summary": " | ".join(lines)[:500], "key_details": []})


@dataclass
class FakeEmbeddingsServer(LocalEndpoint):
    """An OpenAI-compatible /v1/embeddings endpoint on 127.0.0.1 backed by the built-in model.

    Every request is recorded (`requests`), so tests can count embedding requests (one per
    reply). `mode` makes it misbehave: "error" (HTTP 500), "slow" (5 s), "nan", "short", "missing".

        async with FakeEmbeddingsServer(builtin_embedder) as server:
            embedder = create_embedder(Settings(embedding_provider="openai", embedding_base_url=server.url, ...))
    """

    model: Any  # a BuiltinEmbedder
    mode: str = "ok"
    requests: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""
    _runner: web.AppRunner | None = None

    @property
    def texts(self) -> list[str]:
        """Every text embedded so far, in order."""
        found: list[str] = []
        for request in self.requests:
            raw = request["body"]["input"]
            found += raw if isinstance(raw, list) else [raw]
        return found

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append({"body": body, "auth": request.headers.get("Authorization")})
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        if self.mode == "error":
            return web.json_response({"error": {"message": "overloaded", "type": "server_error"}}, status=500)
        if self.mode == "slow":
            await asyncio.sleep(5)
        vectors = self.model.encode_now(texts).tolist()
        if self.mode == "nan":
            vectors[0][0] = math.nan
        if self.mode == "short":
            vectors = [vector[:100] for vector in vectors]
        if self.mode == "missing":
            vectors = vectors[:-1]
        data = [{"object": "embedding", "index": i, "embedding": v} for i, v in reversed(list(enumerate(vectors)))]
        payload = {"object": "list", "data": data, "model": body["model"], "usage": {"prompt_tokens": 1, "total_tokens": 1}}
        return web.json_response(payload)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/embeddings", self.handle)
        return app
