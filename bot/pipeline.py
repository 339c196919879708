"""The reply pipeline (issue 3 item 2): from an incoming message to reply text, notices and a receipt.

It knows no Discord. Adapters (the Discord cog, the console) hand it plain values — an
`IncomingMessage` — and turn the `ReplyOutcome` back into messages. Per reply it:

1. records the message in the channel's context window and reads the last CONTEXT_MESSAGES;
2. runs the memory core's search once (one embedding, shared with every later lookup);
3. builds the SPEC §5 prompt (`bot.prompt`) within the token budgets;
4. calls the chat model with the memory tools, for at most MAX_TOOL_ROUNDS rounds of tool calls,
   applying each call through the core as the bot would (via=BOT), or explaining to the model why not;
5. returns the reply split into Discord-sized chunks, the memory notices shaped by the server's
   notice settings, and a receipt (also stored) of why each memory was in the prompt.

If the chat model fails or times out the outcome is a short apology and the error is logged: the
search already ran (as SPEC §2 says it does), and tool calls applied in earlier rounds stay applied
and are reported; nothing else changes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any
from urllib.parse import urlparse

import asyncpg
import openai
from openai.types.chat import ChatCompletion

from bot.config import Settings
from bot.failures import DISK_FULL
from bot.memory import store
from bot.memory.models import Conversation, GuildSettings, MemoryList, Recall, Rejection, SaveResult, Source
from bot.memory.recall import MemoryCore, NewMemory
from bot.outgoing import neutralize_broadcasts, neutralize_mentions, split_message
from bot.prompt import (
    ChatLine,
    Persona,
    Prompt,
    PromptInput,
    PromptTooLarge,
    TailItem,
    build_prompt,
    count_tokens,
    message_tokens,
    recalled_item,
    user_label,
)
from bot.redact import redact

log = logging.getLogger(__name__)

APOLOGY = "Sorry, I can't answer right now: my language model did not respond. Please try again in a moment."
EMPTY_ANSWER = "Sorry, my language model came back with an empty answer. Please try again, or put it another way."
TOO_LARGE = "Sorry, I can't answer: my instructions alone no longer fit in my context window. An admin needs to shorten them."
NAME_CHARS = re.compile(r"\w", re.UNICODE)


def chat_configured(settings: Settings) -> bool:
    """A chat model is usable when it is named and there is somewhere to send it (a base URL or an OpenAI key)."""
    return bool(settings.chat_model) and bool(settings.chat_base_url or settings.chat_api_key)


# --- triggers (SPEC §6) -----------------------------------------------------------------------------


class Trigger(StrEnum):
    DM = "dm"
    MENTION = "mention"
    REPLY = "reply"
    NAME = "name"
    AUTO_REPLY = "auto_reply"


@dataclass(frozen=True)
class TriggerFacts:
    """What an adapter knows about a message, as plain facts."""

    author_is_bot: bool = False
    author_blocked: bool = False
    is_dm: bool = False
    mentions_bot: bool = False
    replies_to_bot: bool = False
    says_persona_name: bool = False
    auto_reply_channel: bool = False


def should_reply(facts: TriggerFacts) -> Trigger | None:
    """Why the bot answers this message, or None. Bots and blocked users never get an answer."""
    if facts.author_is_bot or facts.author_blocked:
        return None
    if facts.is_dm:
        return Trigger.DM
    if facts.mentions_bot:
        return Trigger.MENTION
    if facts.replies_to_bot:
        return Trigger.REPLY
    if facts.says_persona_name:
        return Trigger.NAME
    if facts.auto_reply_channel:
        return Trigger.AUTO_REPLY
    return None


def says_name(text: str, name: str) -> bool:
    """Whether `name` appears in `text` as a whole word (any case): "hey Desk!" says "desk", "desktop" does not."""
    wanted = " ".join(name.split()).casefold()
    if not wanted:
        return False
    haystack = text.casefold()
    start = haystack.find(wanted)
    while start != -1:
        end = start + len(wanted)
        before_ok = start == 0 or not NAME_CHARS.match(haystack[start - 1])
        after_ok = end == len(haystack) or not NAME_CHARS.match(haystack[end])
        if before_ok and after_ok:
            return True
        start = haystack.find(wanted, start + 1)
    return False


# --- plain values in and out ---------------------------------------------------------------------------


@dataclass(frozen=True)
class UserRef:
    id: int
    name: str
    is_bot: bool = False


@dataclass(frozen=True)
class IncomingMessage:
    """A channel message in plain values.

    `channel_id` keys the context window (a thread has its own); `parent_channel_id` is the channel
    memory channel-limits refer to (a thread's parent). `mentions` are the users @mentioned in it.
    `where` is a short human description of the place for the prompt, e.g. '#general in "Juno's den"'.
    """

    message_id: int
    channel_id: int
    author_id: int
    author_name: str
    text: str
    created_at: datetime
    guild_id: int | None = None
    parent_channel_id: int | None = None
    is_bot: bool = False
    reply_to: int | None = None
    mentions: tuple[UserRef, ...] = ()
    where: str = ""

    @property
    def is_dm(self) -> bool:
        return self.guild_id is None

    @property
    def memory_channel_id(self) -> int:
        return self.parent_channel_id or self.channel_id


HISTORY_KIND = "recalled_chat_history"
DOCUMENT_KIND = "document_passage"
TAIL_PARTS = {"recalled_memory": "recalled_memories", HISTORY_KIND: "chat_history", DOCUMENT_KIND: "documents"}


@dataclass
class TailReport:
    """What a tail source adds, with what the receipt should say about it (issue 4).

    `section` names the source in the receipt ("history", "documents"); `note` says why it added
    nothing (None when it added something); `detail` is any small JSON-able extra for the receipt.
    """

    section: str
    items: list[TailItem]
    note: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)


TailSource = Callable[[IncomingMessage, Recall], Awaitable[Sequence[TailItem] | TailReport]]
"""Something that adds items near the end of the prompt (document hits, recalled chat history: issue 4).

It gets the message and the core's `Recall`, whose `query_vector` is the reply's one embedding (None when
the search failed); it must not embed the message again. Items are ranked by `score` against the budgets.
It returns the items, or a `TailReport` with them and what the receipt should say.
"""


class ReplyStatus(StrEnum):
    REPLIED = "replied"
    NO_MODEL = "no_model"  # no chat model configured: the outcome shows what would have been sent
    MODEL_ERROR = "model_error"  # the chat model failed or timed out: an apology
    PROMPT_TOO_LARGE = "prompt_too_large"  # even the fixed parts do not fit CHAT_CONTEXT_TOKENS


class ChangeKind(StrEnum):
    SAVED = "saved"
    UPDATED = "updated"
    FORGOTTEN = "forgotten"
    MADE_ROOM = "forgotten_to_make_room"
    REJECTED = "rejected"


@dataclass(frozen=True)
class MemoryChange:
    """One thing a tool call did (or was refused), for notices and receipts."""

    kind: ChangeKind
    memory_id: int | None
    memory_list: MemoryList | None
    text: str
    about_user_id: int | None = None
    reason: str = ""

    def as_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind.value,
            "memory_id": self.memory_id,
            "list": self.memory_list.value if self.memory_list else None,
            "text": self.text,
            "about_user_id": self.about_user_id,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Notices:
    """Memory notices after the server's settings: where they go and the lines to show.

    `destination` is "channel" (post with the reply), "log" (post in `log_channel_id`) or "hidden"
    (do not post; they are still in the receipt and the log). Text is already defused of mentions.
    """

    destination: str
    log_channel_id: int | None
    verbosity: str
    lines: tuple[str, ...]

    @property
    def chunks(self) -> list[str]:
        return split_message("\n".join(self.lines))



def recalled_label(item: dict[str, Any]) -> str:
    """How a receipt shows one recalled memory: its score, and whether it came back to the desk.

    The score is cosine similarity plus the word bonus (LEXICAL_WEIGHT), so it can exceed 1. Only
    the used ones come back; the others (up to MAX_RECALLED) were shown and stay in the drawer.
    Receipts stored before this field existed only held used ones.
    """
    where = "back on the desk" if item.get("back", True) else "shown, stays in the drawer"
    return f"score {float(item['similarity']):.2f}, {where}"

@dataclass
class Receipt:
    """Why each memory was in the prompt (SPEC §8), the token counts, and whether the head held."""

    guild_id: int | None
    channel_id: int
    message_id: int
    persona_id: int
    status: str
    desk_ids: list[int]
    recalled: list[dict[str, float | int]]
    used: list[dict[str, float | int]]
    dropped: list[dict[str, str]]
    search_ok: bool
    search_failure: str | None
    nothing_recalled_because: str | None
    tokens: dict[str, int]
    head_hash: str
    head_same_as_previous: bool | None
    history_messages: int
    tool_rounds: int = 0
    model: str | None = None
    changes: list[dict[str, object]] = field(default_factory=list)
    error: str | None = None
    elapsed_ms: int = 0
    # --- issue 4: why each memory was there, history chunks, document passages, tokens per tail part ---
    desk_detail: list[dict[str, Any]] = field(default_factory=list)  # id, list, days_unused, about (owner), matched
    history: list[dict[str, Any]] = field(default_factory=list)  # chunks in the prompt: chunk_id, similarity, tokens, cut, when
    documents: list[dict[str, Any]] = field(default_factory=list)  # passages in the prompt: document, section, similarity, ...
    sources: dict[str, dict[str, Any]] = field(default_factory=dict)  # per tail source: note (why nothing), detail
    tail_tokens: dict[str, int] = field(default_factory=dict)  # tail tokens per kind
    nothing_added_because: str | None = None  # nothing recalled at all (memories, history, documents): why

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Receipt:
        """A stored receipt (jsonb), ignoring fields this version does not know; older ones lack the newer fields."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})

    def render(self) -> str:
        """A few plain lines for people (console, a receipt command)."""
        desk = ", ".join(f"#{i}" for i in self.desk_ids) or "nothing"
        lines = [f"desk: {desk}"]
        if self.recalled:
            shown = ", ".join(f"#{item['id']} ({recalled_label(item)})" for item in self.recalled)
            lines.append(f"recalled from the drawer: {shown}")
        else:
            lines.append(f"recalled: nothing ({self.nothing_recalled_because})")
        for name, section, items in (("chat history", "history", self.history), ("documents", "documents", self.documents)):
            if items:
                lines.append(f"{name}: " + ", ".join(tail_item_label(item) for item in items))
            elif (self.sources.get(section) or {}).get("note"):
                lines.append(f"{name}: nothing ({self.sources[section]['note']})")
        if self.nothing_added_because:
            lines.append(f"nothing was recalled for this reply: {self.nothing_added_because}")
        if self.dropped:
            lines.append("left out: " + ", ".join(f"{item['key']} ({item['reason']})" for item in self.dropped))
        parts = token_parts(self.tokens)
        if self.tail_tokens:
            parts += " [near the end: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in self.tail_tokens.items()) + "]"
        lines.append(f"tokens: {self.tokens['total']} in total ({parts})")
        if self.head_same_as_previous is not None:
            lines.append(
                "prompt head: " + ("same as the previous reply (cacheable)" if self.head_same_as_previous else "changed")
            )
        return "\n".join(lines)


@dataclass
class ReplyOutcome:
    status: ReplyStatus
    chunks: list[str]  # the reply, each at most 2,000 characters; the first answers the message
    notices: Notices | None
    changes: list[MemoryChange]
    receipt: Receipt
    prompt: Prompt | None
    recall: Recall
    error: str | None = None

    @property
    def text(self) -> str:
        return "\n".join(self.chunks)


# --- the memory tools ------------------------------------------------------------------------------------


def memory_tools(*, server: bool, personal: bool, max_chars: int) -> list[dict[str, Any]]:
    """The tool definitions offered to the model; empty when the bot may not teach itself here."""
    lists = [name for name, on in (("server", server), ("personal", personal)) if on]
    if not lists:
        return []
    save_properties: dict[str, Any] = {
        "text": {
            "type": "string",
            "description": f"The fact, short and self-contained, in the third person (at most {max_chars} characters).",
        },
        "list": {
            "type": "string",
            "enum": lists,
            "description": "server: about this server or community; personal: about one person.",
        },
    }
    if personal:
        save_properties["about_user"] = {
            "type": "string",
            "description": "Personal memories: the user ID (digits) of the person it is about; defaults to the author.",
        }
        save_properties["global"] = {
            "type": "boolean",
            "description": "Personal memories: true to use it wherever this person talks to you, not only here.",
        }
    id_property = {"type": "integer", "description": "The id shown with the memory."}
    return [
        {
            "type": "function",
            "function": {
                "name": "save_memory",
                "description": "Remember a fact for later conversations.",
                "parameters": {"type": "object", "properties": save_properties, "required": ["text", "list"]},
            },
        },
        {
            "type": "function",
            "function": {
                "name": "update_memory",
                "description": "Replace the text of a memory shown in this conversation.",
                "parameters": {
                    "type": "object",
                    "properties": {"memory_id": id_property, "text": save_properties["text"]},
                    "required": ["memory_id", "text"],
                },
            },
        },
        {
            "type": "function",
            "function": {
                "name": "forget_memory",
                "description": "Delete a memory shown in this conversation that is wrong or that someone asked you to forget.",
                "parameters": {"type": "object", "properties": {"memory_id": id_property}, "required": ["memory_id"]},
            },
        },
    ]


class ToolCallError(ValueError):
    """A tool call the pipeline refuses before touching anything; the message goes back to the model."""


@dataclass
class _ToolContext:
    message: IncomingMessage
    participants: set[int]
    shown_ids: set[int]
    search_ok: bool
    offered: set[str]
    lists: set[str]
    changes: list[MemoryChange] = field(default_factory=list)


def _parse_id(value: object, what: str) -> int:
    """An id as the model may write it: 12, "12", or a mention such as "<@12>"."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        digits = value.strip().removeprefix("<@").removeprefix("!").removesuffix(">")
        if digits.isdigit():
            return int(digits)
    raise ToolCallError(f"{what} must be a number, got {value!r}")


def _text_argument(arguments: dict[str, Any], max_chars: int) -> str:
    text = arguments.get("text")
    if not isinstance(text, str) or not text.strip():
        raise ToolCallError("text must be a non-empty string")
    if len(text.strip()) > max_chars:
        raise ToolCallError(f"text has {len(text.strip())} characters; the limit is {max_chars}. Shorten it and try again")
    return text


# --- the pipeline ------------------------------------------------------------------------------------------


class ReplyPipeline:
    """One per process. Safe to share between channels: replies in one channel run one at a time."""

    def __init__(
        self,
        core: MemoryCore,
        settings: Settings | None = None,
        *,
        bot_user_id: int | None = None,
        chat_client: openai.AsyncOpenAI | None = None,
    ) -> None:
        self.core = core
        self.settings = settings or core.settings
        self.bot_user_id = bot_user_id  # the adapter sets it once it knows who it is logged in as
        self._client = chat_client
        self._locks: weakref.WeakValueDictionary[int, asyncio.Lock] = weakref.WeakValueDictionary()
        self.tail_sources: list[TailSource] = []  # issue 4 registers document and chat-history recall here

    @property
    def chat_configured(self) -> bool:
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

    async def start(self) -> None:
        """Make the default persona follow DEFAULT_PERSONA_NAME / DEFAULT_PERSONA_PROMPT."""
        async with self.core.pool.acquire() as conn:
            await store.sync_default_persona(conn, self.settings.default_persona_name, self.settings.default_persona_prompt)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    def lock_for(self, channel_id: int) -> asyncio.Lock:
        lock = self._locks.get(channel_id)
        if lock is None:
            lock = asyncio.Lock()
            self._locks[channel_id] = lock
        return lock

    # --- the context window ---

    async def record_message(self, message: IncomingMessage) -> bool:
        """Store a message as it arrives (every message of a channel the bot can read, its own too)."""
        async with self.core.pool.acquire() as conn:
            return await self._record(conn, message)

    async def _record(self, conn: store.Connection, message: IncomingMessage, names: dict[int, str] | None = None) -> bool:
        return await store.record_chat_message(
            conn,
            guild_id=message.guild_id,
            channel_id=message.channel_id,
            message_id=message.message_id,
            author_id=message.author_id,
            author_name=message.author_name,
            is_bot=message.is_bot,
            text=message.text,
            reply_to=message.reply_to,
            mention_ids=[user.id for user in message.mentions],
            created_at=message.created_at,
            names=names,
        )

    async def needs_history(self, channel_id: int) -> bool:
        """True when the bot has no message of this channel yet (read `channel.history` once, then record it)."""
        async with self.core.pool.acquire() as conn:
            return not await store.has_chat_messages(conn, channel_id)

    async def record_history(self, messages: Sequence[IncomingMessage]) -> int:
        """Store a backfill of older messages in one transaction; returns how many were new."""
        async with self.core.pool.acquire() as conn, conn.transaction():
            return sum([await self._record(conn, message) for message in messages])

    async def edit_message(self, channel_id: int, message_id: int, text: str, edited_at: datetime) -> bool:
        """An edited message: the new text, and the history chunk it was part of goes (rebuilt in the background)."""
        async with self.core.pool.acquire() as conn, conn.transaction():
            return await store.edit_chat_message_rechunk(conn, channel_id, message_id, text, edited_at)

    async def delete_messages(self, channel_id: int, message_ids: Sequence[int]) -> int:
        """Deleted messages, and the history chunks they were part of (the rest is chunked anew in the background)."""
        async with self.core.pool.acquire() as conn, conn.transaction():
            return await store.delete_chat_messages_rechunk(conn, channel_id, message_ids)

    async def forget_channel(self, channel_id: int) -> int:
        """A deleted channel or thread: its messages, receipts, history chunks and history-recall switch."""
        async with self.core.pool.acquire() as conn, conn.transaction():
            deleted = await store.delete_channel_chat(conn, channel_id)
            await store.delete_channel_history(conn, channel_id)
            return deleted

    async def forget_guild(self, guild_id: int) -> dict[str, int]:
        """The bot left (or was removed from) a server: its stored messages, chunks and receipts go."""
        async with self.core.pool.acquire() as conn, conn.transaction():
            return await store.forget_guild_chat(conn, guild_id)

    async def forget_user_chat(self, user_id: int) -> int:
        """Delete every stored message and the display name of a user (part of /privacy delete-my-data),
        and every history chunk one of their messages was part of (the others' messages are chunked anew)."""
        async with self.core.pool.acquire() as conn, conn.transaction():
            await store.delete_user_history(conn, user_id)
            return await store.delete_user_chat_data(conn, user_id)

    # --- triggers ---

    async def trigger(
        self, message: IncomingMessage, *, mentions_bot: bool = False, replies_to_bot: bool = False
    ) -> Trigger | None:
        """Why the bot should answer `message` (SPEC §6), looking up name, auto-reply channels and blocklist."""
        if message.is_bot or (self.bot_user_id is not None and message.author_id == self.bot_user_id):
            return None
        channels = list(dict.fromkeys((message.channel_id, message.memory_channel_id)))
        async with self.core.pool.acquire() as conn:
            facts = await store.reply_trigger_facts(conn, message.guild_id, message.author_id, channels)
        return should_reply(
            TriggerFacts(
                author_is_bot=message.is_bot,
                author_blocked=bool(facts["blocked"]),
                is_dm=message.is_dm,
                mentions_bot=mentions_bot,
                replies_to_bot=replies_to_bot,
                says_persona_name=says_name(message.text, facts["persona_name"] or ""),
                auto_reply_channel=bool(facts["auto_reply"]),
            )
        )

    # --- personas and lore ---

    async def persona(self, guild_id: int | None) -> dict[str, Any]:
        persona_id = await self.core.persona_id(guild_id)
        async with self.core.pool.acquire() as conn:
            found = await store.get_persona(conn, persona_id)
        assert found is not None
        return found

    async def update_persona(
        self, guild_id: int, *, name: str | None = None, prompt: str | None = None, attributes: dict[str, str] | None = None
    ) -> dict[str, Any]:
        persona_id = await self.core.persona_id(guild_id)
        async with self.core.pool.acquire() as conn:
            updated = await store.update_persona(conn, persona_id, name=name, prompt=prompt, attributes=attributes)
        assert updated is not None
        return updated

    async def lore(self, guild_id: int | None) -> list[dict[str, Any]]:
        persona_id = await self.core.persona_id(guild_id)
        async with self.core.pool.acquire() as conn:
            return [dict(row) for row in await store.list_lore(conn, persona_id)]

    async def add_lore(self, guild_id: int, text: str, *, by: int | None) -> dict[str, Any]:
        cleaned = text.strip()
        if not 1 <= len(cleaned) <= 4000:
            raise ValueError(f"a lore entry must have 1 to 4000 characters, this one has {len(cleaned)}")
        persona_id = await self.core.persona_id(guild_id)
        async with self.core.pool.acquire() as conn:
            return dict(await store.add_lore(conn, persona_id, cleaned, by))

    async def remove_lore(self, guild_id: int, lore_id: int) -> bool:
        persona_id = await self.core.persona_id(guild_id)
        async with self.core.pool.acquire() as conn:
            return await store.delete_lore(conn, persona_id, lore_id)

    async def receipt(self, *, message_id: int | None = None, channel_id: int | None = None) -> dict[str, Any] | None:
        async with self.core.pool.acquire() as conn:
            return await store.get_receipt(conn, message_id=message_id, channel_id=channel_id)

    async def receipt_for(self, message_id: int) -> dict[str, Any] | None:
        """The receipt of the reply to `message_id`, or of the reply that is message `message_id` (a copied link)."""
        async with self.core.pool.acquire() as conn:
            return await store.receipt_for_message(conn, message_id)

    # --- the reply ---

    async def reply(self, message: IncomingMessage) -> ReplyOutcome:
        """Answer `message` (recording it first if the adapter has not). One reply at a time per channel."""
        async with self.lock_for(message.channel_id):
            return await self._reply(message)

    async def _reply(self, message: IncomingMessage) -> ReplyOutcome:
        started = time.monotonic()
        settings = self.settings
        persona_id = await self.core.persona_id(message.guild_id)  # cached by the core: the search uses the same
        # Two statements on one connection before the search: the message and the names it brings (the
        # author's, then the mentioned users', the last one winning as if written one after the other),
        # then everything the prompt needs besides the search. Nothing read here is cached between replies.
        given_names = {message.author_id: message.author_name} | {user.id: user.name for user in message.mentions}
        async with self.core.pool.acquire() as conn:
            await self._record(conn, message, names=given_names)
            context = await store.reply_context(
                conn,
                channel_id=message.channel_id,
                answered_message_id=message.message_id,
                context_messages=settings.context_messages,
                persona_id=persona_id,
                guild_id=message.guild_id,
                user_ids=given_names,
            )
        window = [self._chat_line(row) for row in context["window"]]
        answered = ChatLine(
            message_id=message.message_id,
            author_id=message.author_id,
            author_name=message.author_name,
            text=message.text,
            is_bot=message.is_bot,
            reply_to=message.reply_to,
        )
        participants = self._participants(message, window)
        conversation = Conversation(
            guild_id=message.guild_id,
            channel_id=message.memory_channel_id,
            author_id=message.author_id,
            text=message.text,
            participant_ids=tuple(p for p in participants if p != message.author_id),
            context_texts=tuple(line.text for line in window),
        )
        recall = await self.core.reply_search(conversation)

        owners = {m.owner_id for m in recall.desk if m.owner_id} | {
            s.memory.owner_id for s in (*recall.recalled, *recall.held_back) if s.memory.owner_id
        }
        persona_row, lore, guild = context["persona"], context["lore"], context["guild"]
        previous_head: str | None = context["previous_head"]
        names: dict[int, str] = context["names"]  # the participants' names, and maybe a few more (harmless: looked up by id)
        if recall.persona_id != persona_id:  # cannot happen while the core caches persona ids; stay correct anyway
            async with self.core.pool.acquire() as conn:
                persona_row = await store.get_persona(conn, recall.persona_id)
                lore = [row["text"] for row in await store.list_lore(conn, recall.persona_id)]
            assert persona_row is not None
        missing = owners - context["names_for"]  # memories are about participants, so this is normally empty
        if missing:
            async with self.core.pool.acquire() as conn:
                names = {**names, **await store.chat_user_names(conn, missing)}

        tools = self._tools_for(guild)
        extra_tail, tail_reports = await self._extra_tail(message, recall)
        # DESK_REFRESH=daily keeps memories that joined the desk today in the tail, after this reply's recalls
        tail = [recalled_item(scored, names) for scored in (*recall.recalled, *recall.held_back)] + extra_tail
        outcome_prompt: Prompt | None = None
        error: str | None = None
        try:
            outcome_prompt = build_prompt(
                PromptInput(
                    persona=Persona(persona_row["name"], persona_row["prompt"], persona_row["attributes"] or {}),
                    lore=lore,
                    desk=recall.desk,
                    user_names=names,
                    history=window,
                    tail=tail,
                    answered=answered,
                    now=self.core.clock.now(),
                    where=message.where,
                    context_tokens=settings.chat_context_tokens,
                    output_tokens=settings.chat_max_output_tokens,
                    memory_budget=settings.memory_token_budget,
                    tools_tokens=count_tokens(json.dumps(tools)) if tools else 0,
                )
            )
        except PromptTooLarge as exc:
            log.error("Cannot answer message %s in channel %s: %s", message.message_id, message.channel_id, exc)
            error = str(exc)

        changes: list[MemoryChange] = []
        rounds = 0
        if outcome_prompt is None:
            status, chunks = ReplyStatus.PROMPT_TOO_LARGE, [TOO_LARGE]
        elif not self.chat_configured:
            status, chunks = ReplyStatus.NO_MODEL, []
        else:
            context = _ToolContext(
                message=message,
                participants=set(participants),
                shown_ids=set(outcome_prompt.shown_memory_ids),
                search_ok=recall.search_ok,
                offered={tool["function"]["name"] for tool in tools},
                lists=set(tools[0]["function"]["parameters"]["properties"]["list"]["enum"]) if tools else set(),
                changes=changes,
            )
            text, rounds, error = await self._converse(outcome_prompt, tools, context)
            if error is None and not text.strip():  # e.g. only tool calls, even after tool_choice "none": never silence
                log.warning("Chat model %s answered message %s with no text", settings.chat_model, message.message_id)
                error, chunks = "the chat model answered with no text", [EMPTY_ANSWER]
                status = ReplyStatus.MODEL_ERROR
            elif error is not None:
                status, chunks = ReplyStatus.MODEL_ERROR, [APOLOGY]
            else:
                status, chunks = ReplyStatus.REPLIED, split_message(neutralize_broadcasts(text))

        for change in changes:  # hidden notices are still traceable in the log (without the text: it may be personal)
            log.info(
                "Memory %s by the model in channel %s: #%s (%s) %s",
                change.kind.value,
                message.channel_id,
                change.memory_id,
                change.memory_list.value if change.memory_list else "?",
                change.reason,
            )
        receipt = self._receipt(message, recall, outcome_prompt, previous_head, status, rounds, changes, error, tail_reports)
        receipt.elapsed_ms = int((time.monotonic() - started) * 1000)
        if status == ReplyStatus.NO_MODEL:
            chunks = split_message(neutralize_mentions(self._dry_run_text(recall, receipt, names)))
        if outcome_prompt is not None:
            async with self.core.pool.acquire() as conn:
                await store.save_reply_receipt(
                    conn,
                    guild_id=message.guild_id,
                    channel_id=message.channel_id,
                    message_id=message.message_id,
                    head_hash=outcome_prompt.head_hash,
                    receipt=receipt.as_dict(),
                    created_at=self.core.clock.now(),
                )
        return ReplyOutcome(
            status=status,
            chunks=chunks,
            notices=self._notices(changes, guild, names),
            changes=changes,
            receipt=receipt,
            prompt=outcome_prompt,
            recall=recall,
            error=error,
        )

    async def _extra_tail(self, message: IncomingMessage, recall: Recall) -> tuple[list[TailItem], dict[str, dict[str, Any]]]:
        """Items from the registered tail sources, and what each `TailReport` tells the receipt.

        A failing source is logged and skipped (the receipt says so), never the reply.
        """
        items: list[TailItem] = []
        reports: dict[str, dict[str, Any]] = {}
        for source in self.tail_sources:
            try:
                found = await source(message, recall)
            except Exception as exc:
                log.exception("Tail source %r failed for message %s", source, message.message_id)
                name = getattr(source, "section", getattr(source, "__name__", "source"))
                reports[name] = {"note": f"failed: {type(exc).__name__}", "added": 0}
                continue
            if isinstance(found, TailReport):
                items.extend(found.items)
                reports[found.section] = {"note": found.note, "added": len(found.items), **found.detail}
            else:
                items.extend(found)
        return items, reports

    def _chat_line(self, row: Any) -> ChatLine:
        return ChatLine(
            message_id=row["message_id"],
            author_id=row["author_id"],
            author_name=row["author_name"],
            text=row["text"],
            is_bot=row["is_bot"],
            from_self=self.bot_user_id is not None and row["author_id"] == self.bot_user_id,
            reply_to=row["reply_to"],
        )

    def _participants(self, message: IncomingMessage, window: Sequence[ChatLine]) -> list[int]:
        """SPEC §2: the author, the other non-bot authors of the window, and the users mentioned (bots excluded)."""
        found = [message.author_id]
        found += [line.author_id for line in window if not line.is_bot and not line.from_self]
        found += [user.id for user in message.mentions if not user.is_bot]
        return [p for p in dict.fromkeys(found) if p != self.bot_user_id]

    def _tools_for(self, guild: GuildSettings | None) -> list[dict[str, Any]]:
        """No tools where the bot may not teach itself (fewer tokens, no refusals to explain)."""
        if guild is None:  # a DM: only the author's personal memories make sense
            return memory_tools(server=False, personal=True, max_chars=self.settings.memory_max_chars)
        if not guild.self_teaching:
            return []
        return memory_tools(server=True, personal=guild.personal_memories, max_chars=self.settings.memory_max_chars)

    def _completion_kwargs(self) -> dict[str, Any]:
        """OpenAI's own API wants max_completion_tokens; compatible servers widely take max_tokens."""
        host = urlparse(self.settings.chat_base_url).hostname if self.settings.chat_base_url else "api.openai.com"
        limit_name = "max_completion_tokens" if host == "api.openai.com" else "max_tokens"
        return {
            "model": self.settings.chat_model,
            "temperature": self.settings.chat_temperature,
            limit_name: self.settings.chat_max_output_tokens,
        }

    async def _converse(self, prompt: Prompt, tools: list[dict[str, Any]], context: _ToolContext) -> tuple[str, int, str | None]:
        """Chat-model rounds: (reply text, tool rounds used, error or None)."""
        messages = list(prompt.messages)
        rounds = 0
        history_left = len(prompt.history_ids)
        total = prompt.tokens.total
        while True:
            # tool rounds grow the request: make room by dropping the oldest history, as the prompt builder does
            while total + self.settings.chat_max_output_tokens > self.settings.chat_context_tokens and history_left:
                total -= message_tokens(messages.pop(1))
                history_left -= 1
            if total + self.settings.chat_max_output_tokens > self.settings.chat_context_tokens:
                log.error("Tool results for message %s no longer fit CHAT_CONTEXT_TOKENS", context.message.message_id)
                return "", rounds, "the tool results no longer fit in CHAT_CONTEXT_TOKENS"
            request: dict[str, Any] = {**self._completion_kwargs(), "messages": messages}
            may_call = bool(tools) and rounds < self.settings.max_tool_rounds
            if tools:  # always sent when offered, so the request start stays the same; "none" ends the rounds
                request["tools"] = tools
                if not may_call:
                    request["tool_choice"] = "none"
            try:
                async with asyncio.timeout(self.settings.chat_timeout_s):
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
                return "", rounds, redact(f"{type(exc).__name__}: {exc}")  # stored in the receipt: no API key in it
            calls = reply.tool_calls or []
            if not calls or not may_call:
                return (reply.content or "").strip(), rounds, None
            rounds += 1
            added = len(messages)
            messages.append(
                {
                    "role": "assistant",
                    "content": reply.content or None,
                    "tool_calls": [
                        {
                            "id": call.id,
                            "type": "function",
                            "function": {"name": call.function.name, "arguments": call.function.arguments},
                        }
                        for call in calls
                        if getattr(call, "function", None) is not None
                    ],
                }
            )
            for call in calls:
                if getattr(call, "function", None) is None:
                    continue
                result = await self._run_tool(call.function.name, call.function.arguments, context)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result, ensure_ascii=False)})
            total += sum(message_tokens(message) for message in messages[added:])

    async def chat_completion(self, request: dict[str, Any]) -> ChatCompletion:
        """POST one chat request through the client, without the SDK's request transform.

        `chat.completions.create(**request)` first walks every message and tool of the request
        against the SDK's TypedDicts (≈4-5 ms of CPU for a 30-message prompt with tools, the largest
        single cost of a reply in BENCHMARKS.md) to rename aliased keys and format dates — none of
        which our plain JSON dicts of strings have. `post` is the same client call otherwise: base URL,
        the API key as a bearer token (the `security` option `create` passes), timeout, retries, the
        typed `ChatCompletion` and the same `openai` exceptions.
        """
        return await self.client.post(
            "/chat/completions", body=request, cast_to=ChatCompletion, options={"security": {"bearer_auth": True}}
        )

    async def _run_tool(self, name: str, raw_arguments: str | None, context: _ToolContext) -> dict[str, Any]:
        try:
            if name not in context.offered:
                offered = ", ".join(sorted(context.offered)) or "none"
                raise ToolCallError(f"there is no tool named {name!r} here; the tools are: {offered}")
            try:
                arguments = json.loads(raw_arguments or "{}")
            except json.JSONDecodeError as exc:
                raise ToolCallError(f"the arguments are not valid JSON ({exc.msg}); send a JSON object") from None
            if not isinstance(arguments, dict):
                raise ToolCallError("the arguments must be a JSON object")
            if name == "save_memory":
                return await self._tool_save(arguments, context)
            if name == "update_memory":
                return await self._tool_update(arguments, context)
            return await self._tool_forget(arguments, context)
        except ToolCallError as exc:
            log.info("Refused a %s tool call for message %s: %s", name, context.message.message_id, exc)
            return {"ok": False, "error": str(exc)}
        except asyncpg.exceptions.DiskFullError:  # the reply still goes out; the model is told nothing was saved
            log.error("A %s tool call for message %s failed: %s", name, context.message.message_id, DISK_FULL)
            return {"ok": False, "error": DISK_FULL}

    def _shown_id(self, arguments: dict[str, Any], context: _ToolContext) -> int:
        memory_id = _parse_id(arguments.get("memory_id"), "memory_id")
        if memory_id not in context.shown_ids:
            raise ToolCallError(f"there is no memory #{memory_id} in this conversation; use an id shown with a memory")
        return memory_id

    def _refused(
        self,
        result: SaveResult,
        context: _ToolContext,
        memory_id: int | None,
        memory_list: MemoryList | None,
        text: str,
        about: int | None,
    ) -> dict[str, Any]:
        """A refusal by the core: invalid input is the model's to fix; a rule (full list, privacy) is also a notice."""
        if result.rejected != Rejection.INVALID_TEXT:
            context.changes.append(MemoryChange(ChangeKind.REJECTED, memory_id, memory_list, text, about, result.detail))
        return {"ok": False, "error": result.detail}

    async def _tool_save(self, arguments: dict[str, Any], context: _ToolContext) -> dict[str, Any]:
        text = _text_argument(arguments, self.settings.memory_max_chars)
        list_name = arguments.get("list")
        if list_name not in context.lists:
            raise ToolCallError(f"list must be one of: {', '.join(sorted(context.lists))}")
        memory_list = MemoryList(list_name)
        is_global = arguments.get("global", False)
        if not isinstance(is_global, bool):
            raise ToolCallError("global must be true or false")
        about: int | None = None
        if memory_list == MemoryList.PERSONAL:
            about = context.message.author_id
            if arguments.get("about_user") not in (None, ""):
                about = _parse_id(arguments["about_user"], "about_user")
            if about not in context.participants:
                raise ToolCallError(f"user {about} is not in this conversation; personal memories are about its participants")
        elif is_global:
            raise ToolCallError("only personal memories can be global")
        result = await self.core.save(
            NewMemory(
                list=memory_list,
                text=text,
                by=context.message.author_id,
                via=Source.BOT,
                guild_id=context.message.guild_id,
                owner_id=about,
                is_global=is_global,
            ),
            search_available=context.search_ok,
        )
        if result.saved is None:
            return self._refused(result, context, None, memory_list, text.strip(), about)
        saved = result.saved
        context.changes.append(MemoryChange(ChangeKind.SAVED, saved.id, saved.list, saved.text, saved.owner_id))
        for gone in result.forgotten:
            context.changes.append(MemoryChange(ChangeKind.MADE_ROOM, gone.id, gone.list, gone.text, gone.owner_id))
            context.shown_ids.discard(gone.id)
        context.shown_ids.add(saved.id)
        return {
            "ok": True,
            "memory_id": saved.id,
            "forgotten_to_make_room": [{"id": gone.id, "text": gone.text} for gone in result.forgotten],
        }

    async def _tool_update(self, arguments: dict[str, Any], context: _ToolContext) -> dict[str, Any]:
        memory_id = self._shown_id(arguments, context)
        text = _text_argument(arguments, self.settings.memory_max_chars)
        result = await self.core.edit(memory_id, text, by=context.message.author_id, via=Source.BOT)
        if result.saved is None:
            return self._refused(result, context, memory_id, None, text.strip(), None)
        updated = result.saved
        context.changes.append(MemoryChange(ChangeKind.UPDATED, updated.id, updated.list, updated.text, updated.owner_id))
        return {"ok": True, "memory_id": updated.id}

    async def _tool_forget(self, arguments: dict[str, Any], context: _ToolContext) -> dict[str, Any]:
        memory_id = self._shown_id(arguments, context)
        result = await self.core.delete(memory_id, by=context.message.author_id, via=Source.BOT)
        if not result.forgotten:
            return self._refused(result, context, memory_id, None, "", None)
        gone = result.forgotten[0]
        context.changes.append(MemoryChange(ChangeKind.FORGOTTEN, gone.id, gone.list, gone.text, gone.owner_id))
        context.shown_ids.discard(memory_id)
        return {"ok": True, "forgotten": memory_id}

    # --- notices, receipts, the dry run ---

    def _notices(self, changes: Sequence[MemoryChange], guild: GuildSettings | None, names: dict[int, str]) -> Notices | None:
        """SPEC §6 notices. DMs show them in the conversation, verbosely: it is the reader's own data.

        In a server, notices are seen by the whole channel (or the log channel's readers), so `verbose` shows the
        text of server memories only: personal data is only ever shown ephemerally or in DMs (issue 6). A personal
        notice still says what happened and about whom; its owner can read the text with /personal memories.
        """
        if not changes:
            return None
        if guild is None:
            destination, log_channel, verbosity = "channel", None, "verbose"
        else:
            destination = {"visible": "channel", "hidden": "hidden", "log": "log"}.get(guild.notices, "channel")
            log_channel, verbosity = guild.log_channel_id, guild.notice_verbosity
            if destination == "log" and log_channel is None:
                destination = "hidden"
        lines = tuple(
            neutralize_mentions(
                notice_line(change, verbosity if guild is None or change.memory_list == MemoryList.SERVER else "minimal", names)
            )
            for change in changes
        )
        return Notices(destination=destination, log_channel_id=log_channel, verbosity=verbosity, lines=lines)

    def _receipt(
        self,
        message: IncomingMessage,
        recall: Recall,
        prompt: Prompt | None,
        previous_head: str | None,
        status: ReplyStatus,
        rounds: int,
        changes: Sequence[MemoryChange],
        error: str | None,
        sources: dict[str, dict[str, Any]] | None = None,
    ) -> Receipt:
        kept_tail = {item.memory_id for item in prompt.tail} if prompt else set()
        used = {s.memory.id for s in recall.used}
        recalled = [  # "back": used, so on the desk from the next reply on; else only shown (MAX_RECALLED)
            {"id": s.memory.id, "similarity": round(s.similarity, 4), "back": s.memory.id in used}
            for s in recall.recalled
            if s.memory.id in kept_tail
        ]
        if not recall.search_ok:
            why = f"the search failed: {recall.failure}"
        elif recalled:
            why = None
        elif recall.recalled:
            why = "the memory budget was full"
        elif recall.used:
            why = "the best matches were already on the desk"
        elif not self.core.decay_active:
            why = "memory decay is off, so every memory is on the desk"
        else:
            why = f"nothing relevant: no memory in the drawer reached MIN_SIMILARITY {self.settings.min_similarity:g}"
        head = prompt.head_hash if prompt else ""
        return Receipt(
            guild_id=message.guild_id,
            channel_id=message.channel_id,
            message_id=message.message_id,
            persona_id=recall.persona_id,
            status=status.value,
            desk_ids=list(prompt.desk_ids) if prompt else [m.id for m in recall.desk],
            recalled=recalled,
            used=[{"id": s.memory.id, "similarity": round(s.similarity, 4)} for s in recall.used],
            dropped=[{"key": d.key, "reason": d.reason} for d in prompt.dropped] if prompt else [],
            search_ok=recall.search_ok,
            search_failure=recall.failure,
            nothing_recalled_because=why,
            tokens=prompt.tokens.as_dict() if prompt else {"total": 0},
            head_hash=head,
            head_same_as_previous=None if previous_head is None or not head else previous_head == head,
            history_messages=len(prompt.history_ids) if prompt else 0,
            tool_rounds=rounds,
            model=self.settings.chat_model or None,
            changes=[change.as_dict() for change in changes],
            error=error,
            **self._receipt_tail(recall, prompt, recalled, dict(sources or {})),
        )

    def _receipt_tail(
        self,
        recall: Recall,
        prompt: Prompt | None,
        recalled: list[dict[str, float | int]],
        sources: dict[str, dict[str, Any]],
    ) -> dict[str, Any]:
        """The issue-4 part of a receipt: why each desk memory was there, the chunks and passages that made it
        into the prompt, tokens per tail part, and, when nothing at all was recalled, why."""
        kept = list(prompt.tail) if prompt else []
        in_prompt = set(prompt.desk_ids) if prompt else {m.id for m in recall.desk}
        matched = {s.memory.id: round(s.similarity, 4) for s in recall.used}
        desk_detail = [
            {"id": m.id, "list": m.list.value, "days_unused": m.days_unused, "about": m.owner_id, "matched": matched.get(m.id)}
            for m in recall.desk
            if m.id in in_prompt
        ]
        history = [dict(item.meta or {}) for item in kept if item.kind == HISTORY_KIND]
        documents = [dict(item.meta or {}) for item in kept if item.kind == DOCUMENT_KIND]
        tail_tokens: dict[str, int] = {}
        for item in kept:
            part = TAIL_PARTS.get(item.kind, item.kind)
            tail_tokens[part] = tail_tokens.get(part, 0) + count_tokens(item.text) + 1
        for section, kind in (("history", HISTORY_KIND), ("documents", DOCUMENT_KIND)):
            report = sources.get(section)
            if report and report.get("added") and not any(item.kind == kind for item in kept):
                report["note"] = "the context budget was full (CHAT_CONTEXT_TOKENS), so they were left out"
        # the one-line answer to "why was nothing recalled?"; each part's own note says more
        full = (["memories"] if recall.recalled else []) + [
            name for name, report in sources.items() if "budget" in str(report.get("note") or "")
        ]
        if recalled or history or documents:
            overall = None
        elif not recall.search_ok:
            overall = f"the search failed ({recall.failure})"
        elif full:
            overall = f"the budget was full ({', '.join(full)})"
        else:
            overall = "nothing relevant"
        return {
            "desk_detail": desk_detail,
            "history": history,
            "documents": documents,
            "sources": sources,
            "tail_tokens": tail_tokens,
            "nothing_added_because": overall,
        }

    def _dry_run_text(self, recall: Recall, receipt: Receipt, names: dict[int, str]) -> str:
        """What an unconfigured bot says: plainly that no model is set, and what it would have sent."""
        lines = [
            "I have no chat model configured, so I can't answer yet. Set CHAT_MODEL plus CHAT_BASE_URL "
            "(any OpenAI-compatible server) or CHAT_API_KEY (OpenAI). This is what I would have sent:",
        ]
        in_prompt = set(receipt.desk_ids)
        desk = [m for m in recall.desk if m.id in in_prompt]
        lines.append(f"Desk: {len(desk)} active {'memory' if len(desk) == 1 else 'memories'}" + (":" if desk else "."))
        for memory in desk:
            about = f" about {user_label(memory.owner_id, names)}" if memory.owner_id else ""
            lines.append(f"  #{memory.id} [{memory.list.value}{about}, {memory.days_unused} days unused] {memory.text}")
        items = {item["id"]: item for item in receipt.recalled}
        recalled = [s.memory for s in recall.recalled if s.memory.id in items]
        if recalled:
            lines.append("Recalled from the drawer (dormant, but they match this message):")
            lines += [f"  #{m.id} ({recalled_label(items[m.id])}) {m.text}" for m in recalled]
        else:
            lines.append(f"Recalled: nothing, because {receipt.nothing_recalled_because}.")
        for title, items in (("Older chat of this channel", receipt.history), ("Document passages", receipt.documents)):
            if items:
                lines.append(f"{title}: " + ", ".join(tail_item_label(item) for item in items) + ".")
        parts = token_parts(receipt.tokens)
        lines.append(f"Tokens: {receipt.tokens['total']} ({parts}).")
        return "\n".join(lines)


def tail_item_label(item: dict[str, Any]) -> str:
    """A history chunk or document passage of a receipt, in a few words."""
    if "chunk_id" in item:
        what = f"chunk #{item['chunk_id']} ({item.get('when', '?')}, {item.get('messages', '?')} messages"
    else:
        section = f" › {item['section']}" if item.get("section") else ""
        what = f"“{item.get('document', '?')}”{section} (passage #{item.get('passage_id')}"
    cut = ", cut to fit" if item.get("cut") else ""
    return f"{what}, similarity {item.get('similarity', 0):.2f}, {item.get('tokens', 0)} tokens{cut})"


def token_parts(tokens: dict[str, int]) -> str:
    """Token counts in prompt order (a receipt read back from jsonb has its keys reordered)."""
    order = ("system", "server_memories", "personal_memories", "history", "tail", "answered", "tools")
    return ", ".join(f"{name.replace('_', ' ')} {tokens[name]}" for name in order if name in tokens)


def notice_line(change: MemoryChange, verbosity: str, names: dict[int, str]) -> str:
    """One notice line; `verbose` adds the memory text (SPEC §6)."""
    which = "a server memory" if change.memory_list == MemoryList.SERVER else "a personal memory"
    if change.memory_list == MemoryList.PERSONAL and change.about_user_id is not None:
        which += f" about {names.get(change.about_user_id, f'user {change.about_user_id}')}"
    ref = f" (#{change.memory_id})" if change.memory_id is not None else ""
    detail = f": “{change.text}”" if verbosity == "verbose" and change.text else ""
    if change.kind == ChangeKind.SAVED:
        return f"📝 Saved {which}{ref}{detail}"
    if change.kind == ChangeKind.UPDATED:
        return f"✏️ Updated {which}{ref}{detail}"
    if change.kind == ChangeKind.FORGOTTEN:
        return f"🗑️ Forgot {which}{ref}{detail}"
    if change.kind == ChangeKind.MADE_ROOM:
        return f"📦 Forgot {which}{ref} to make room{detail}"
    action = f"save {which}" if change.memory_id is None else f"change memory #{change.memory_id}"
    return f"⚠️ Couldn't {action}{detail}. Reason: {change.reason}"
