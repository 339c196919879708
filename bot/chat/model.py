"""The chat model: one OpenAI-compatible endpoint, and the rounds of a reply (answer, or tool calls, their
results, and the answer after them).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import openai
from openai.types.chat import ChatCompletion

from bot.chat.text_calls import parse_text_calls, strip_tool_json
from bot.chat.tools import MemoryTools, ToolContext
from bot.config import Settings
from bot.prompt import Prompt
from bot.redact import redact
from bot.tokens import message_tokens

log = logging.getLogger(__name__)


MAX_CALLS_PER_ANSWER = 20  # calls of one answer that are run (or refused); the rest are dropped unanswered


MAX_ECHOED_ARGUMENTS = 4000  # characters of a call's arguments sent back to the model with its result


def _as_text(arguments: object) -> str | None:
    """Arguments as the JSON text the tools read: some servers (Ollama's shape) send an object instead."""
    if arguments is None or isinstance(arguments, str):
        return arguments
    try:
        return json.dumps(arguments, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return str(arguments)[:MAX_ECHOED_ARGUMENTS]


def _echoed(arguments: str | None) -> str:
    """What the next request repeats of a call: huge or garbled arguments (refused anyway) must not fill the context."""
    return arguments if arguments is not None and len(arguments) <= MAX_ECHOED_ARGUMENTS else "{}"


@dataclass
class Call:
    """One tool call, native or read from the text of the answer."""

    id: str
    name: str
    arguments: str | None


@dataclass
class _Rounds:
    rounds: int = 0


def output_limit_name(base_url: str) -> str:
    """OpenAI's own API wants max_completion_tokens; compatible servers widely take max_tokens."""
    host = urlparse(base_url).hostname if base_url else "api.openai.com"
    return "max_completion_tokens" if host == "api.openai.com" else "max_tokens"


def chat_configured(settings: Settings) -> bool:
    """A chat model is usable when it is named and there is somewhere to send it (a base URL or an OpenAI key)."""
    return bool(settings.chat_model) and bool(settings.chat_base_url or settings.chat_api_key)


class ChatModel:
    def __init__(self, settings: Settings, tools: MemoryTools, client: openai.AsyncOpenAI | None = None) -> None:
        self.settings = settings
        self.tools = tools
        self._client = client

    @property
    def configured(self) -> bool:
        return chat_configured(self.settings)

    @property
    def client(self) -> openai.AsyncOpenAI:
        """The chat model's client, on the SDK's aiohttp transport (`DefaultAioHttpClient`).

        The SDK's default transport (httpx2 over httpcore2/h11/anyio, all pure Python) cost ≈ 1.8 ms of CPU
        per request in the throughput benchmark, a third of what the pipeline does in Python; aiohttp
        (already the bot's HTTP library, with a C parser) ≈ 0.8 ms. Same client otherwise: base URL, key,
        timeouts, proxies from the environment, the `openai` exceptions.
        """
        if self._client is None:
            self._client = openai.AsyncOpenAI(
                base_url=self.settings.chat_base_url or None,
                api_key=self.settings.chat_api_key or "not-needed",
                timeout=self.settings.chat_timeout_s,
                max_retries=0,
                http_client=openai.DefaultAioHttpClient(),
            )
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    def _completion_kwargs(self) -> dict[str, Any]:
        """OpenAI's own API wants max_completion_tokens; compatible servers widely take max_tokens."""
        return {
            "model": self.settings.chat_model,
            "temperature": self.settings.chat_temperature,
            output_limit_name(self.settings.chat_base_url): self.settings.chat_max_output_tokens,
        }

    async def converse(self, prompt: Prompt, tools: list[dict[str, Any]], context: ToolContext) -> tuple[str, int, str | None]:
        """Chat-model rounds: (reply text, tool rounds used, error or None). CHAT_TIMEOUT_S covers them all."""
        state = _Rounds()
        try:
            async with asyncio.timeout(self.settings.chat_timeout_s):
                return await self._converse(prompt, tools, context, state)
        except TimeoutError:
            log.error("Chat model %s did not finish message %s within CHAT_TIMEOUT_S", self.settings.chat_model,
                      context.message.message_id)
            return "", state.rounds, f"the chat model did not answer within CHAT_TIMEOUT_S ({self.settings.chat_timeout_s:g} s)"

    async def _converse(
        self, prompt: Prompt, tools: list[dict[str, Any]], context: ToolContext, state: _Rounds
    ) -> tuple[str, int, str | None]:
        messages = list(prompt.messages)
        history_left = len(prompt.history_ids)
        total = prompt.tokens.total
        offered = {tool["function"]["name"] for tool in tools}
        while True:
            # tool rounds grow the request: make room by dropping the oldest history, as the prompt builder does
            while total + self.settings.chat_max_output_tokens > self.settings.chat_context_tokens and history_left:
                total -= message_tokens(messages.pop(1))
                history_left -= 1
            if total + self.settings.chat_max_output_tokens > self.settings.chat_context_tokens:
                log.error("Tool results for message %s no longer fit CHAT_CONTEXT_TOKENS", context.message.message_id)
                return "", state.rounds, "the tool results no longer fit in CHAT_CONTEXT_TOKENS"
            request: dict[str, Any] = {**self._completion_kwargs(), "messages": messages}
            may_call = bool(tools) and state.rounds < self.settings.max_tool_rounds
            if tools:  # always sent when offered, so the request start stays the same; "none" asks for the answer
                request["tools"] = tools
                if not may_call:
                    request["tool_choice"] = "none"
            try:
                completion = await self.chat_completion(request)
                reply = completion.choices[0].message
            except Exception as exc:  # any failure of the provider or its answer: apologise, never crash the bot
                log.error(
                    "Chat model %s failed for message %s: %s: %s",
                    self.settings.chat_model,
                    context.message.message_id,
                    type(exc).__name__,
                    exc,
                )
                return "", state.rounds, redact(f"{type(exc).__name__}: {exc}")  # stored in the receipt: no API key in it
            content = reply.content or ""
            calls = [
                Call(call.id or f"call_{index}", call.function.name, _as_text(call.function.arguments))
                for index, call in enumerate(reply.tool_calls or [])
                if getattr(call, "function", None) is not None
            ]
            if not calls and offered:  # small models write their calls in the text (see bot.chat.text_calls)
                parsed = parse_text_calls(content, offered, max_calls=MAX_CALLS_PER_ANSWER)
                calls = [Call(f"text_call_{index}", call.name, call.raw_arguments) for index, call in enumerate(parsed.calls)]
                content = parsed.text
                if may_call:
                    context.from_text += len(calls)
            if not calls or not may_call:
                return strip_tool_json(content).strip(), state.rounds, None
            state.rounds += 1
            added = len(messages)
            calls = calls[:MAX_CALLS_PER_ANSWER]
            messages.append(
                {
                    "role": "assistant",
                    "content": content or None,
                    "tool_calls": [
                        {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": _echoed(call.arguments)}}
                        for call in calls
                    ],
                }
            )
            for call in calls:
                result = await self.tools.run(call.name, call.arguments, context)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result, ensure_ascii=False)})
            total += sum(message_tokens(message) for message in messages[added:])

    async def chat_completion(self, request: dict[str, Any]) -> ChatCompletion:
        """POST one chat request through the client, without the SDK's request transform.

        `chat.completions.create(**request)` first walks every message and tool of the request
        against the SDK's TypedDicts (≈4-5 ms of CPU for a 30-message prompt with tools, the largest
        single cost of a reply in docs/benchmarks.md) to rename aliased keys and format dates — none of
        which our plain JSON dicts of strings have. `post` is the same client call otherwise: base URL,
        the API key as a bearer token (the `security` option `create` passes), timeout, retries, the
        typed `ChatCompletion` and the same `openai` exceptions.
        """
        return await self.client.post(
            "/chat/completions", body=request, cast_to=ChatCompletion, options={"security": {"bearer_auth": True}}
        )
