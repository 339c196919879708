"""One reply: from an answered message to reply text, notices and a receipt.

Per reply it reads the context window and the server's settings, runs the memory search once (one
embedding, shared with every tail source), builds the prompt (`bot.prompt`) within the token
budgets, lets the chat model answer (with the memory tools, `bot.chat.tools`), and stores the
receipt. If the chat model fails or times out the outcome is a short apology and the error is
logged: the search already ran, and tool calls applied in earlier rounds stay applied and are
reported; nothing else changes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bot.chat.log import ChatLog
from bot.chat.messages import IncomingMessage
from bot.chat.model import ChatModel
from bot.chat.notices import ChangeKind, MemoryChange, Notices, build_notices, what_was_done
from bot.chat.receipts import Receipt, ReplyStatus, build_receipt, dry_run_text
from bot.chat.reply_text import (
    CLAIM,
    LANGUAGE,
    ONLY_CLAIM,
    ReplyFacts,
    again_request,
    check,
    history_text,
    honest_sentence,
    looks_spanish,
)
from bot.chat.sources import SummarySource, TailSource
from bot.chat.tools import MemoryTools, ToolContext
from bot.config import Settings
from bot.memory.models import Conversation, Recall
from bot.memory.service import MemoryCore
from bot.outgoing import neutralize_broadcasts, neutralize_mentions, split_message
from bot.prompt import (
    ChatLine,
    HeadSummary,
    Persona,
    Prompt,
    PromptInput,
    PromptTooLarge,
    TailItem,
    build_prompt,
    recalled_item,
)
from bot.servers.models import GuildSettings, PromptSettings
from bot.servers.service import Servers
from bot.tokens import count_tokens

log = logging.getLogger(__name__)

APOLOGY = "Sorry, I can't answer right now: my language model did not respond. Please try again in a moment."
EMPTY_ANSWER = "Sorry, my language model came back with an empty answer. Please try again, or put it another way."
TOO_LARGE = "Sorry, I can't answer: my instructions alone no longer fit in my context window. An admin needs to shorten them."
OWN_SENTENCES = frozenset({APOLOGY, EMPTY_ANSWER, TOO_LARGE})  # the bot's, never shown to the model as its words
_WORTH_ANOTHER_TRY = frozenset({LANGUAGE, ONLY_CLAIM})  # postable as they are, but a second answer is likely better


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


@dataclass
class _Read:
    """What a reply reads before its prompt: the window, who takes part, the search and the server's settings."""

    window: list[ChatLine]
    participants: list[int]
    conversation: Conversation
    recall: Recall
    settings: PromptSettings
    names: dict[int, str]  # the participants' names, and maybe a few more (harmless: looked up by id)
    previous_head: str | None
    summaries: list[HeadSummary]

    @property
    def guild(self) -> GuildSettings | None:
        return self.settings.guild


@dataclass
class _Answered:
    """What became of the model's turn: the status and text to post, and what the receipt tells about it."""

    status: ReplyStatus
    chunks: list[str]
    rounds: int = 0
    error: str | None = None
    calls_from_text: int = 0
    quoted_calls: int = 0
    problems: list[str] = field(default_factory=list)
    asked_again: bool = False


class ReplyPipeline:
    """One per process. Safe to share between channels: replies in one channel run one at a time."""

    def __init__(
        self,
        core: MemoryCore,
        chat_log: ChatLog,
        model: ChatModel,
        sources: Sequence[TailSource] = (),
        *,
        bot_user_id: int | None = None,
        summaries: SummarySource | None = None,
    ) -> None:
        self.core = core
        self.servers: Servers = core.servers
        self.chat_log = chat_log
        self.model = model
        self.tools: MemoryTools = model.tools
        self.settings: Settings = core.settings
        self.sources = list(sources)
        self.summaries = summaries
        self.bot_user_id = bot_user_id  # the adapter sets it once it knows who it is logged in as
        self._locks: weakref.WeakValueDictionary[int, asyncio.Lock] = weakref.WeakValueDictionary()

    def lock_for(self, channel_id: int) -> asyncio.Lock:
        lock = self._locks.get(channel_id)
        if lock is None:
            lock = asyncio.Lock()
            self._locks[channel_id] = lock
        return lock

    async def reply(self, message: IncomingMessage) -> ReplyOutcome:
        """Answer `message` (recording it first if the adapter has not). One reply at a time per channel."""
        async with self.lock_for(message.channel_id):
            return await self._reply(message)

    async def _reply(self, message: IncomingMessage) -> ReplyOutcome:
        started = time.monotonic()
        read = await self._read(message)
        tools = self.tools.offered(read.guild, private_thread=message.private_thread)
        prompt, error, tail_reports = await self._prompt(message, read, tools)
        changes: list[MemoryChange] = []
        if prompt is None:
            answered = _Answered(ReplyStatus.PROMPT_TOO_LARGE, [TOO_LARGE], error=error)
        elif not self.model.configured:
            answered = _Answered(ReplyStatus.NO_MODEL, [])
        else:
            answered = await self._answer(message, read, prompt, tools, changes)
        for change in changes:  # hidden notices are still traceable in the log (without the text: it may be personal)
            log.info(
                "Memory %s by the model in channel %s: #%s (%s) %s",
                change.kind.value,
                message.channel_id,
                change.memory_id,
                change.memory_list.value if change.memory_list else "?",
                change.reason,
            )
        receipt = build_receipt(
            message, read.recall, prompt, read.previous_head, answered.status, answered.rounds, changes, answered.error,
            tail_reports, decay_active=self.core.decay_active, min_similarity=self.settings.min_similarity,
            model=self.settings.chat_model or None,
        )
        receipt.elapsed_ms = int((time.monotonic() - started) * 1000)
        receipt.tool_calls_from_text = answered.calls_from_text
        receipt.quoted_calls = answered.quoted_calls
        receipt.reply_problems = answered.problems
        receipt.asked_again = answered.asked_again
        chunks = answered.chunks
        if answered.status == ReplyStatus.NO_MODEL:
            chunks = split_message(neutralize_mentions(dry_run_text(read.recall, receipt, read.names)))
        if prompt is not None:
            await self.chat_log.save_receipt(
                guild_id=message.guild_id,
                channel_id=message.channel_id,
                message_id=message.message_id,
                head_hash=prompt.head_hash,
                receipt=receipt.as_dict(),
                at=self.core.clock.now(),
            )
        return ReplyOutcome(
            status=answered.status,
            chunks=chunks,
            notices=build_notices(changes, read.guild, read.names),
            changes=changes,
            receipt=receipt,
            prompt=prompt,
            recall=read.recall,
            error=answered.error,
        )

    async def _read(self, message: IncomingMessage) -> _Read:
        """Record the message, read the window and the server's settings, and run the memory search."""
        persona_id = await self.servers.persona_id(message.guild_id)  # cached: the search uses the same
        # Before the search, two reads at once, each by the owner of its tables: the chat log records the
        # message and the names it brings (the author's, then the mentioned users', the last one winning as
        # if written one after the other) and reads the window; the servers' settings give persona, lore and
        # the server's settings. Nothing read here is cached between replies.
        given_names = {message.author_id: message.author_name} | {user.id: user.name for user in message.mentions}
        log_part, settings_part, summaries = await asyncio.gather(
            self.chat_log.record_and_read_window(message, names=given_names, context_messages=self.settings.context_messages),
            self.servers.prompt_settings(persona_id, message.guild_id),
            self._summaries(message),
        )
        window = [line for line in (self._chat_line(row) for row in log_part["window"]) if line.text]
        participants = self._participants(message, window)
        conversation = Conversation(
            guild_id=message.guild_id,
            channel_id=message.memory_channel_id,
            author_id=message.author_id,
            text=message.text,
            participant_ids=tuple(p for p in participants if p != message.author_id),
            context_texts=tuple(line.text for line in window),
            private_thread=message.private_thread,
        )
        recall = await self.core.reply_search(conversation)
        if recall.persona_id != persona_id:  # cannot happen while persona ids are cached; stay correct anyway
            again = await self.servers.prompt_settings(recall.persona_id, message.guild_id)
            settings_part = dataclasses.replace(settings_part, persona=again.persona, lore=again.lore)
        names: dict[int, str] = log_part["names"]  # the participants' names, and maybe a few more (harmless: looked up by id)
        owners = {m.owner_id for m in recall.desk if m.owner_id} | {
            s.memory.owner_id for s in (*recall.recalled, *recall.held_back, *recall.by_text) if s.memory.owner_id
        }
        missing = owners - log_part["names_for"]  # memories are about participants, so this is normally empty
        if missing:
            names = {**names, **await self.chat_log.names(missing)}
        return _Read(
            window, participants, conversation, recall, settings_part, names, log_part["previous_head"], summaries
        )

    async def _prompt(
        self, message: IncomingMessage, read: _Read, tools: list[dict[str, Any]]
    ) -> tuple[Prompt | None, str | None, dict[str, dict[str, Any]]]:
        """The prompt within the token budgets (None with the reason when the instructions alone do not fit), and
        what each tail source told the receipt."""
        recall = read.recall
        extra_tail, tail_reports = await self._extra_tail(message, recall)
        # DESK_REFRESH=daily keeps memories that joined the desk today in the tail, after this reply's recalls;
        # a failed search may still have found dormant memories by their words (read-only)
        tail = [recalled_item(s, read.names) for s in (*recall.recalled, *recall.held_back, *recall.by_text)] + extra_tail
        persona, settings = read.settings.persona, self.settings
        try:
            prompt = build_prompt(
                PromptInput(
                    persona=Persona(persona.name, persona.prompt, dict(persona.attributes)),
                    lore=list(read.settings.lore),
                    desk=recall.desk,
                    user_names=read.names,
                    history=read.window,
                    tail=tail,
                    answered=_answered_line(message),
                    now=self.core.clock.now(),
                    where=message.where,
                    context_tokens=settings.chat_context_tokens,
                    output_tokens=settings.chat_max_output_tokens,
                    memory_budget=settings.memory_token_budget,
                    tools_tokens=count_tokens(json.dumps(tools)) if tools else 0,
                    summaries=read.summaries,
                    summary_budget=settings.summary_token_budget,
                    used=recall.used,
                    desk_ranks=recall.desk_ranks,
                    tail_reserve=self.core.tail_reserve,
                    desk_fit=settings.desk_fit,
                )
            )
        except PromptTooLarge as exc:
            log.error("Cannot answer message %s in channel %s: %s", message.message_id, message.channel_id, exc)
            return None, str(exc), tail_reports
        return prompt, None, tail_reports

    async def _answer(
        self, message: IncomingMessage, read: _Read, prompt: Prompt, tools: list[dict[str, Any]], changes: list[MemoryChange]
    ) -> _Answered:
        """The model's answer with its tool calls (each change added to `changes`), checked before it is posted."""
        context = ToolContext(
            message=message,
            participants=set(read.participants),
            conversation=read.conversation,
            shown_ids=set(prompt.shown_memory_ids),
            search_ok=read.recall.search_ok,
            offered={tool["function"]["name"] for tool in tools},
            lists=_offered_lists(tools),
            changes=changes,
            names={user: read.names[user] for user in read.participants if user in read.names},
        )
        answer = await self.model.converse(prompt, tools, context)
        answered = _Answered(ReplyStatus.MODEL_ERROR, [APOLOGY], answer.rounds, answer.error, context.from_text, answer.quoted)
        if answer.error is not None:
            return answered
        text = answer.text
        acted = bool(changes or context.said or answer.quoted)
        posted, answered.problems, answered.asked_again = await self._checked(
            text, _reply_facts(message, read, context), answer.messages, message
        )
        answered.status = ReplyStatus.REPLIED
        done_something = any(change.kind != ChangeKind.REJECTED for change in changes) or context.remembered
        if not posted and done_something:  # only calls, even when asked for the answer twice: what they did
            posted = neutralize_mentions(what_was_done(changes, context.said))
        elif not posted and not text.strip() and not acted:  # no text at all, twice: never silence
            log.warning("Chat model %s answered message %s with no text", self.settings.chat_model, message.message_id)
            answered.status, answered.error = ReplyStatus.MODEL_ERROR, "the chat model answered with no text"
            posted = EMPTY_ANSWER
        elif not posted:
            posted = honest_sentence(message.text)
        answered.chunks = split_message(neutralize_broadcasts(posted))
        return answered

    async def _checked(
        self, text: str, facts: ReplyFacts, messages: list[dict[str, Any]], message: IncomingMessage
    ) -> tuple[str, list[str], bool]:
        """The reply as it may be posted (`bot.chat.reply_text`), what was wrong, and whether the model was asked
        again: an answer that is empty once cleaned, an echo of the message or a repeat of an earlier reply gets
        one more try (without tools), and so does an answer in another language than the message's; "" when that
        fails too, so the honest sentence in the message's language is posted: the person reads that no good answer
        came, in their language, instead of an answer they may not read (with the 0.5B model such answers were mostly
        the question echoed back or JSON). An answer that was only a claimed save gets one more try too: with the
        1.5B model the line saying nothing was saved was then the whole reply, five times in one run; the second
        answer is posted with that line, and the line alone when the second answer is no better."""
        checked = check(text, facts)
        problems = list(checked.problems)
        if checked.usable and not _WORTH_ANOTHER_TRY.intersection(checked.problems):
            return checked.text, problems, False
        request = again_request(checked.problems, message.author_name, looks_spanish(message.text))
        log.info("Reply to message %s could not be posted as it was (%s); asking the model again", message.message_id,
                 ", ".join(checked.problems))
        again, error = await self.model.answer_again([*messages, {"role": "assistant", "content": text}], request,
                                                     message.message_id)
        if error is None and again:
            second = check(again, dataclasses.replace(facts, also_not=(*facts.also_not, request, text)))
            problems += [problem for problem in second.problems if problem not in problems]
            if second.usable and not _WORTH_ANOTHER_TRY.intersection(second.problems):
                if ONLY_CLAIM in checked.problems and CLAIM not in second.problems:
                    return f"{second.text}\n{checked.text}", problems, True  # the answer, and that nothing was saved
                return second.text, problems, True
        return (checked.text if ONLY_CLAIM in checked.problems else ""), problems, True

    async def _summaries(self, message: IncomingMessage) -> list[HeadSummary]:
        """The channel's summaries for the head; a failure to read them is logged and costs the reply nothing else."""
        if self.summaries is None:
            return []
        try:
            return await self.summaries.for_prompt(message.summary_channel_id, message.guild_id)
        except Exception:
            log.exception("Reading the summaries of channel %s failed; answering without them", message.summary_channel_id)
            return []

    async def _extra_tail(self, message: IncomingMessage, recall: Recall) -> tuple[list[TailItem], dict[str, dict[str, Any]]]:
        """Items from the registered tail sources, and what each `TailReport` tells the receipt.

        A failing source is logged and skipped (the receipt says so), never the reply.
        """
        items: list[TailItem] = []
        reports: dict[str, dict[str, Any]] = {}
        for source in self.sources:
            names = {"title": source.title, "heading": source.heading, "part": source.part}
            try:
                found = await source.find(message, recall)
            except Exception as exc:
                log.exception("Tail source %r failed for message %s", source.name, message.message_id)
                reports[source.name] = {**names, "note": f"failed: {type(exc).__name__}", "added": 0}
                continue
            items.extend(found.items)
            reports[source.name] = {**names, "note": found.note, "added": len(found.items), **found.detail}
        return items, reports

    def _chat_line(self, row: Any) -> ChatLine:
        """One message of the window. The bot's own messages lose the lines the bot wrote itself (notices, apologies):
        shown to the model as its words, they are what it copies."""
        from_self = self.bot_user_id is not None and row["author_id"] == self.bot_user_id
        return ChatLine(
            message_id=row["message_id"],
            author_id=row["author_id"],
            author_name=row["author_name"],
            text=history_text(row["text"], OWN_SENTENCES) if from_self else row["text"],
            is_bot=row["is_bot"],
            from_self=from_self,
            reply_to=row["reply_to"],
        )

    def _participants(self, message: IncomingMessage, window: Sequence[ChatLine]) -> list[int]:
        """The author and the other non-bot authors of the window (in a DM: the DM's user).

        A user who is only @mentioned is not a participant: their personal memories come into a conversation
        once they write there themselves, so nobody can pull someone's memories into a server they never
        visited, or have the bot reveal or forget them, by naming them.
        """
        found = [message.author_id]
        found += [line.author_id for line in window if not line.is_bot and not line.from_self]
        return [p for p in dict.fromkeys(found) if p != self.bot_user_id]


def _reply_facts(message: IncomingMessage, read: _Read, context: ToolContext) -> ReplyFacts:
    """What the check of the reply text compares it with: the message, who speaks, earlier replies, what was done."""
    window, names = read.window, read.names
    asked = {line.message_id: line.text for line in window}
    return ReplyFacts(
        answered=message.text,
        speakers={**{user: names.get(user, "") for user in read.participants}, message.author_id: message.author_name},
        persona_name=read.settings.persona.name,
        earlier_replies=[line.text for line in window if line.from_self],
        earlier_asked=[asked.get(line.reply_to or 0, "") for line in window if line.from_self],
        people_said=[line.text for line in window if not line.from_self and line.message_id != message.message_id],
        done=_done(context.changes, context.remembered),
    )


def _done(changes: Sequence[MemoryChange], remembered: bool) -> set[str]:
    """Which kinds of memory change really ran in this reply, for the check of what the reply claims."""
    done = {change.kind.value for change in changes if change.kind != ChangeKind.REJECTED}
    if ChangeKind.MADE_ROOM.value in done:
        done.add(ChangeKind.FORGOTTEN.value)
    return done | ({"remembered"} if remembered else set())


def _answered_line(message: IncomingMessage) -> ChatLine:
    return ChatLine(
        message_id=message.message_id,
        author_id=message.author_id,
        author_name=message.author_name,
        text=message.text,
        is_bot=message.is_bot,
        reply_to=message.reply_to,
    )


def _offered_lists(tools: list[dict[str, Any]]) -> set[str]:
    """The lists the offered save tool may write to (its `list` argument's choices); none without tools."""
    return set(tools[0]["function"]["parameters"]["properties"]["list"]["enum"]) if tools else set()
