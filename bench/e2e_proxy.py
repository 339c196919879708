"""A recording, replaying proxy between the bot and the model under test (and the judge).

The end-to-end section points the bot's CHAT_BASE_URL at this proxy, so every call the bot makes —
replies, day summaries, whatever day-end work comes next — goes through one place, whichever client
inside the bot makes it. The proxy:

- makes the calls as deterministic as the provider allows: `temperature` 0 and a fixed `seed`;
- records every request and answer (the prompts of the run) in a JSON-lines file, and answers a
  request it has already seen from that file without calling the model again. So a run that was
  interrupted resumes at the first call it had not made yet, and the baselines that replay the
  same conversation pay for the model once;
- counts calls, tokens (the provider's `usage`) and seconds, per phase of the run.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

RETRIES = 3  # a dropped connection or a 5xx from the model is retried: one blip must not cost a measured reply
UPSTREAM_TIMEOUT_S = 1800


@dataclass
class PhaseCount:
    calls: int = 0
    replayed: int = 0  # answered from the recording
    failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0  # waiting for the model in this process (replayed calls cost none)
    model_seconds: float = 0.0  # what the calls took when they were made, replayed ones included

    def as_dict(self) -> dict[str, Any]:
        return {
            "calls": self.calls, "replayed": self.replayed, "failed": self.failed, "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens, "seconds": round(self.seconds, 1),
            "model_seconds": round(self.model_seconds, 1),
        }


def request_key(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


class ModelProxy:
    """An OpenAI-compatible `/v1/chat/completions` on 127.0.0.1 that forwards to `upstream` (a `/v1` base URL)."""

    def __init__(
        self, upstream: str, api_key: str, model: str, recording: Path | None, *, seed: int = 0,
        phase_of: Callable[[dict[str, Any]], str | None] | None = None,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        # what a request is, when its body says so better than the moment it came: the running bot folds a finished
        # week at the first message of a new day, so that call arrives while a reply is being measured
        self.phase_of = phase_of
        self.api_key = api_key
        self.model = model
        self.recording = recording
        self.seed = seed
        self.phase = "other"
        self.counts: dict[str, PhaseCount] = defaultdict(PhaseCount)
        self._known: dict[str, tuple[dict[str, Any], float]] = {}
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.port = 0
        if recording is not None and recording.is_file():
            for line in recording.read_text(encoding="utf-8").splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:  # the last line of a run killed mid-write
                    continue
                self._known[entry["key"]] = (entry["response"], float(entry.get("seconds") or 0.0))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def __aenter__(self) -> ModelProxy:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=UPSTREAM_TIMEOUT_S))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:  # first stop taking calls, then close the way out (a call in flight ends cleanly)
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def prepare(self, body: dict[str, Any]) -> dict[str, Any]:
        """The request as sent: the model under test, temperature 0, a fixed seed."""
        return {**body, "model": self.model, "temperature": 0, "seed": self.seed}

    async def complete(self, messages: list[dict[str, Any]], *, max_tokens: int = 8) -> str:
        """One call of the proxy's own (the judge): the answer's text, '' when the model failed."""
        status, answer = await self._call(self.prepare({"messages": messages, "max_tokens": max_tokens}))
        if status != 200:
            return ""
        choices = answer.get("choices") or [{}]
        return str((choices[0].get("message") or {}).get("content") or "")

    async def _chat(self, request: web.Request) -> web.Response:
        status, answer = await self._call(self.prepare(await request.json()))
        return web.json_response(answer, status=status)

    async def _call(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        phase = (self.phase_of(body) if self.phase_of is not None else None) or self.phase
        count = self.counts[phase]
        count.calls += 1
        key = request_key(body)
        known = self._known.get(key)
        if known is not None:
            count.replayed += 1
            count.model_seconds += known[1]
            self._count_usage(count, known[0])
            return 200, known[0]
        began = time.monotonic()
        status, answer = await self._forward(body)
        took = time.monotonic() - began
        count.seconds += took
        count.model_seconds += took
        if status != 200:
            count.failed += 1
            return status, answer
        self._count_usage(count, answer)
        self._known[key] = (answer, took)
        if self.recording is not None:
            with self.recording.open("a", encoding="utf-8") as out:
                out.write(json.dumps({"key": key, "phase": phase, "seconds": round(took, 2),
                                      "request": body, "response": answer}, ensure_ascii=False) + "\n")
        return status, answer

    async def _forward(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        assert self._session is not None
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        status, answer = 502, {"error": {"message": "the model was not reached", "type": "bench_proxy"}}
        for attempt in range(RETRIES):
            try:
                async with self._session.post(f"{self.upstream}/chat/completions", json=body, headers=headers) as response:
                    status = response.status
                    text = await response.text()
                try:
                    answer = json.loads(text)
                except ValueError:
                    status, answer = 502, {"error": {"message": f"not JSON: {text[:200]}", "type": "bench_proxy"}}
                if status < 500:
                    return status, answer
            except (aiohttp.ClientError, TimeoutError) as exc:
                answer = {"error": {"message": f"{type(exc).__name__}: {exc}", "type": "bench_proxy"}}
            await asyncio.sleep(2 ** attempt)
        return status, answer

    @staticmethod
    def _count_usage(count: PhaseCount, answer: dict[str, Any]) -> None:
        usage = answer.get("usage") or {}
        count.prompt_tokens += int(usage.get("prompt_tokens") or 0)
        count.completion_tokens += int(usage.get("completion_tokens") or 0)

    def totals(self) -> dict[str, dict[str, Any]]:
        return {phase: count.as_dict() for phase, count in sorted(self.counts.items())}
