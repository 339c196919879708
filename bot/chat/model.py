"""The chat model: one OpenAI-compatible endpoint, the rounds of a reply (answer, or tool calls, their
results, and the answer after them), and the gate that puts replies before background work on it.

The answer after a tool round is asked for with no tools at all: a model that still sees them (even
with `tool_choice: "none"`) writes another call instead of an answer, and small models do so every time.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlparse

import openai
from openai.types.chat import ChatCompletion, ChatCompletionMessage

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


def call_key(name: str, raw_arguments: str | None) -> tuple[str, str]:
    """A call as one comparable value whatever its spacing and key order: its tool name and its arguments."""
    try:
        arguments = json.dumps(json.loads(raw_arguments or "{}"), sort_keys=True, ensure_ascii=False)
    except (ValueError, TypeError, RecursionError):
        arguments = " ".join((raw_arguments or "").split())
    return name, arguments


def quoted_calls(texts: Iterable[str], offered: Collection[str]) -> set[tuple[str, str]]:
    """Every call of an offered tool written in `texts` (the conversation's messages and summaries), as `call_key`s.

    A call the model writes that is already one of these merely quotes the conversation ("Sam said: {...}"):
    running it would act on someone else's words with the rights of the person answered, so it is not a call.
    """
    found: set[tuple[str, str]] = set()
    for text in texts:
        if "{" not in text and "<" not in text:
            continue
        for call in parse_text_calls(text, offered, max_calls=MAX_QUOTED_CALLS).calls:
            found.add(call_key(call.name, call.raw_arguments))
    return found


MAX_QUOTED_CALLS = 50  # calls read from one message of the conversation


@dataclass
class Call:
    """One tool call, native or read from the text of the answer."""

    id: str
    name: str
    arguments: str | None


@dataclass
class _Rounds:
    rounds: int = 0
    quoted: int = 0  # calls not run: their text already stood in the conversation (a quotation, not a call)
    messages: list[dict[str, Any]] = field(default_factory=list)  # the last request's messages
    raw: str = ""  # the last answer's content as the model wrote it
    tokens: int = 0  # the request's prompt tokens so far
    history_left: int = 0  # history messages still in the request (the oldest go first when it grows too large)


@dataclass
class Answer:
    """What the chat model's rounds came to: the reply text, tool rounds used, an error or None, calls that were
    quotations, and the messages of the last request (to ask again from where the model stood)."""

    text: str
    rounds: int
    error: str | None
    quoted: int = 0
    messages: list[dict[str, Any]] = field(default_factory=list)
    raw: str = ""  # the last answer's content before calls and tool JSON were taken out (for reports)


def _calls(reply: ChatCompletionMessage, offered: set[str], counted: ToolContext | None) -> tuple[list[Call], str]:
    """The answer's calls, native or written in its text (small models do: see bot.chat.text_calls), and its text
    without them; calls read from the text are counted in `counted` (the receipt says how many)."""
    content = reply.content or ""
    calls = [
        Call(call.id or f"call_{index}", call.function.name, _as_text(call.function.arguments))
        for index, call in enumerate(reply.tool_calls or [])
        if getattr(call, "function", None) is not None
    ]
    if not calls and offered:
        parsed = parse_text_calls(content, offered, max_calls=MAX_CALLS_PER_ANSWER)
        calls = [Call(f"text_call_{index}", call.name, call.raw_arguments) for index, call in enumerate(parsed.calls)]
        content = parsed.text
        if counted is not None:
            counted.from_text += len(calls)
    return calls, content


def _unquoted(calls: list[Call], quotations: set[tuple[str, str]], context: ToolContext, state: _Rounds) -> list[Call]:
    """The calls that are not quotations of the conversation; those are counted, not run."""
    kept = [call for call in calls if call_key(call.name, call.arguments) not in quotations]
    if len(kept) < len(calls):
        log.info("Message %s: %d tool call(s) quoted from the conversation, not run",
                 context.message.message_id, len(calls) - len(kept))
        state.quoted += len(calls) - len(kept)
    return kept


T = TypeVar("T")


def is_local_url(base_url: str) -> bool:
    """A server on this machine or the local network (loopback, a private address, a one-word host name such as a
    compose service): the kind that has one slot, so background work would hold up a reply."""
    host = urlparse(base_url).hostname or ""
    if not host:
        return False
    if host == "localhost" or ("." not in host and ":" not in host):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host.endswith((".local", ".lan", ".internal"))
    return address.is_loopback or address.is_private or address.is_link_local


def replies_first(settings: Settings) -> bool:
    """REPLIES_FIRST: on, off, or (auto) on when the summaries use the chat model's own server and it is local."""
    if settings.replies_first != "auto":
        return settings.replies_first == "on"
    base_url = settings.summary_endpoint[0]
    return bool(base_url) and base_url == settings.chat_base_url and is_local_url(base_url)


class ModelGate:
    """Orders the calls to one model server so that a person never waits for background work.

    A one-slot server (llama.cpp's default) answers one request at a time: a day summary that holds it
    for a minute makes every reply in that minute wait, and may time it out. So background calls
    (summaries, day-end notes) start only while no reply is in flight or waiting, one at a time, and a
    reply that comes while one runs stops it: the background call is cancelled (its connection closed,
    which ends the server's work on it) and started again once the replies are done. Replies are never
    held back by the gate, only by each other at the server. Off (`enabled` false), it orders nothing.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._replies = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._turn = asyncio.Lock()
        self._running: asyncio.Future[Any] | None = None
        self._stopped: asyncio.Future[Any] | None = None
        self.stopped = 0  # background calls stopped for a reply (then started again)
        self.after_background: Callable[[], Awaitable[object]] | None = None  # the re-warm (CHAT_REWARM)
        self._background = 0  # background calls waiting or running
        self._warming: asyncio.Task[None] | None = None
        self.warmed = 0  # re-warm requests that finished

    @property
    def replies_waiting(self) -> int:
        return self._replies

    @contextlib.asynccontextmanager
    async def reply(self) -> AsyncIterator[None]:
        """Around a reply's model calls: background work waits until it is over, and a running call stops."""
        if not self.enabled:
            yield
            return
        self._replies += 1
        self._idle.clear()
        running = self._running
        if running is not None and not running.done():
            self._stopped = running
            self.stopped += 1
            running.cancel()
        try:
            yield
        finally:
            self._replies -= 1
            if self._replies == 0:
                self._idle.set()

    async def background(self, call: Callable[[], Awaitable[T]]) -> T:
        """Run `call` (a fresh request each time it is called) when no reply is in flight or waiting; again if a
        reply stopped it. Its own timeout belongs inside `call`, so waiting here never counts against it."""
        if not self.enabled:
            return await call()
        self._background += 1
        try:
            async with self._turn:
                while True:
                    await self._idle.wait()
                    task = asyncio.ensure_future(call())
                    self._running = task
                    try:
                        return await task
                    except asyncio.CancelledError:
                        if not self._stopped_for_reply(task):
                            raise
                        log.info("Background model work stopped for a reply; it starts again once the replies are done")
                    finally:
                        self._running = None
        finally:
            self._background -= 1
            if self._background == 0 and self.after_background is not None:
                self._warm_soon()

    def _stopped_for_reply(self, task: asyncio.Future[Any]) -> bool:
        current = asyncio.current_task()
        return self._stopped is task and not (current is not None and current.cancelling())

    def _warm_soon(self) -> None:
        if self._warming is None or self._warming.done():
            self._warming = asyncio.get_running_loop().create_task(self._warm())

    async def _warm(self) -> None:
        """After the last background call: the re-warm, while no reply is in flight. A reply that comes meanwhile
        stops it for good: the reply's own request puts its prompt in the server's cache."""
        warm = self.after_background
        async with self._turn:
            await self._idle.wait()
            if warm is None or self._background:  # more background work came: warm after that
                return
            task = asyncio.ensure_future(warm())
            self._running = task
            try:
                await task
                self.warmed += 1
            except asyncio.CancelledError:
                if not self._stopped_for_reply(task):
                    raise
                self.stopped -= 1  # not background work to make again: nothing was lost
            except Exception as exc:  # a failed re-warm costs the next reply its cached prompt, nothing else
                log.warning("Re-warming the chat model's prompt cache failed: %s", redact(f"{type(exc).__name__}: {exc}"))
            finally:
                self._running = None

    async def close(self) -> None:
        """Stop a re-warm in progress (the client it uses is closing)."""
        if self._warming is not None and not self._warming.done():
            self._warming.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._warming


def output_limit_name(base_url: str) -> str:
    """OpenAI's own API wants max_completion_tokens; compatible servers widely take max_tokens."""
    host = urlparse(base_url).hostname if base_url else "api.openai.com"
    return "max_completion_tokens" if host == "api.openai.com" else "max_tokens"


def chat_configured(settings: Settings) -> bool:
    """A chat model is usable when it is named and there is somewhere to send it (a base URL or an OpenAI key)."""
    return bool(settings.chat_model) and bool(settings.chat_base_url or settings.chat_api_key)


class ChatModel:
    def __init__(
        self, settings: Settings, tools: MemoryTools, client: openai.AsyncOpenAI | None = None, gate: ModelGate | None = None
    ) -> None:
        self.settings = settings
        self.tools = tools
        self._client = client
        self.gate = gate or ModelGate(enabled=False)
        self._warm_request: dict[str, Any] | None = None  # the last reply's first request, for the re-warm
        if settings.chat_rewarm:
            self.gate.after_background = self.rewarm

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
        await self.gate.close()
        if self._client is not None:
            await self._client.close()

    async def rewarm(self) -> None:
        """The last reply's first request again, for one token: a one-slot server (llama.cpp) keeps one prompt in its
        cache, and a day summary or the notes evict the chat's. Sent after them (`ModelGate`), it puts the chat's
        prompt back (the instructions, persona, desk and history: all but the last message are what the next reply
        in that channel starts with), so the next reply reads only what is new instead of the whole prompt."""
        request = self._warm_request
        if request is None:
            return
        body = {**request, output_limit_name(self.settings.chat_base_url): 1}
        async with asyncio.timeout(self.settings.chat_timeout_s):
            await self.chat_completion(body)

    def _completion_kwargs(self) -> dict[str, Any]:
        """OpenAI's own API wants max_completion_tokens; compatible servers widely take max_tokens."""
        return {
            "model": self.settings.chat_model,
            "temperature": self.settings.chat_temperature,
            output_limit_name(self.settings.chat_base_url): self.settings.chat_max_output_tokens,
        }

    async def converse(self, prompt: Prompt, tools: list[dict[str, Any]], context: ToolContext) -> Answer:
        """Chat-model rounds: the reply's text, rounds used, and an error or None. CHAT_TIMEOUT_S covers them all."""
        state = _Rounds(messages=list(prompt.messages), tokens=prompt.tokens.total, history_left=len(prompt.history_ids))
        first: dict[str, Any] = {**self._completion_kwargs(), "messages": list(prompt.messages)}
        self._warm_request = {**first, "tools": tools} if tools and self.settings.max_tool_rounds else first  # as sent
        try:
            async with self.gate.reply(), asyncio.timeout(self.settings.chat_timeout_s):
                text, error = await self._converse(prompt, tools, context, state)
        except TimeoutError:
            log.error("Chat model %s did not finish message %s within CHAT_TIMEOUT_S", self.settings.chat_model,
                      context.message.message_id)
            text, error = "", f"the chat model did not answer within CHAT_TIMEOUT_S ({self.settings.chat_timeout_s:g} s)"
        return Answer(text, state.rounds, error, state.quoted, state.messages, state.raw)

    async def answer_again(self, messages: list[dict[str, Any]], request: str, message_id: int) -> tuple[str, str | None]:
        """One more answer, without tools, after the model's answer could not be posted: `request` (a user turn) says
        why. A little more randomness than usual, so the same prompt does not bring back the same answer."""
        body: dict[str, Any] = {
            **self._completion_kwargs(),
            "messages": [*messages, {"role": "user", "content": request}],
            "temperature": max(self.settings.chat_temperature, 0.9),
        }
        try:
            async with self.gate.reply(), asyncio.timeout(self.settings.chat_timeout_s):
                completion = await self.chat_completion(body)
            content = completion.choices[0].message.content or ""
        except TimeoutError:
            return "", f"the chat model did not answer again within CHAT_TIMEOUT_S ({self.settings.chat_timeout_s:g} s)"
        except Exception as exc:  # a second try that fails costs nothing: the bot falls back to its own sentence
            log.warning("Chat model %s failed to answer message %s again: %s", self.settings.chat_model, message_id, exc)
            return "", redact(f"{type(exc).__name__}: {exc}")
        return strip_tool_json(content).strip(), None

    async def _converse(
        self, prompt: Prompt, tools: list[dict[str, Any]], context: ToolContext, state: _Rounds
    ) -> tuple[str, str | None]:
        offered = {tool["function"]["name"] for tool in tools}
        quotations: set[tuple[str, str]] | None = None
        while True:
            if not self._make_room(state):
                log.error("Tool results for message %s no longer fit CHAT_CONTEXT_TOKENS", context.message.message_id)
                return "", "the tool results no longer fit in CHAT_CONTEXT_TOKENS"
            request: dict[str, Any] = {**self._completion_kwargs(), "messages": state.messages}
            may_call = bool(tools) and state.rounds < self.settings.max_tool_rounds
            if may_call:  # the answer after the tools is asked for without them: no tool in sight, no call written
                request["tools"] = tools
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
                return "", redact(f"{type(exc).__name__}: {exc}")  # stored in the receipt: no API key in it
            state.raw = reply.content or ""
            calls, content = _calls(reply, offered, counted=context if may_call else None)
            if calls and may_call:
                if quotations is None:  # read once per reply, and only when there is a call to compare
                    quotations = quoted_calls([str(m.get("content") or "") for m in prompt.messages], offered)
                calls = _unquoted(calls, quotations, context, state)
            if not calls or not may_call:
                return strip_tool_json(content).strip(), None
            await self._run_calls(calls[:MAX_CALLS_PER_ANSWER], content, context, state)

    def _make_room(self, state: _Rounds) -> bool:
        """Tool rounds grow the request: make room by dropping the oldest history, as the prompt builder does.
        False when the request no longer fits even without it."""
        limit = self.settings.chat_context_tokens - self.settings.chat_max_output_tokens
        while state.tokens > limit and state.history_left:
            state.tokens -= message_tokens(state.messages.pop(1))
            state.history_left -= 1
        return state.tokens <= limit

    async def _run_calls(self, calls: list[Call], content: str, context: ToolContext, state: _Rounds) -> None:
        """One tool round: the model's calls and each one's result added to the request, and counted."""
        state.rounds += 1
        messages = state.messages
        added = len(messages)
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
        state.tokens += sum(message_tokens(message) for message in messages[added:])

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
