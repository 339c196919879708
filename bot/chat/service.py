"""The chat service: one call per conversation turn.

An adapter (the Discord cog, the console) hands over each message it sees, with what only it
knows (whether the bot was mentioned or replied to, and how to read the channel's recent history),
and presents what comes back. The service reads the recent history once for a channel it has never
seen, decides whether to answer, records the message exactly once, and replies.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Protocol

from bot.chat.log import ChatLog
from bot.chat.messages import IncomingMessage
from bot.chat.reply import ReplyOutcome, ReplyPipeline
from bot.chat.triggers import Trigger, TriggerFacts, says_name, should_reply
from bot.config import Settings
from bot.servers.service import Servers

log = logging.getLogger(__name__)

class DayWatch(Protocol):
    """Told of every message, so work due once a chat day (the summaries) starts with the day's first one, and of
    every message taken back, so what was derived from it goes (withdrawal wins)."""

    def saw(self, channel_id: int, guild_id: int | None) -> None: ...

    async def purge_withdrawn(self) -> None: ...

    async def withdraw_moved(self, moved: Sequence[tuple[int, int]]) -> None: ...


OlderMessages = Callable[[int], Awaitable[Sequence[IncomingMessage]]]
"""Reads up to N messages before the current one, oldest first (the adapter's channel history)."""


class ChatService:
    def __init__(
        self,
        pipeline: ReplyPipeline,
        chat_log: ChatLog,
        servers: Servers,
        settings: Settings,
        day_watch: DayWatch | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.chat_log = chat_log
        self.servers = servers
        self.settings = settings
        self.day_watch = day_watch
        self._private_threads: set[int] = set()  # private threads whose earlier messages were already made their own

    @property
    def bot_user_id(self) -> int | None:
        return self.pipeline.bot_user_id

    @bot_user_id.setter
    def bot_user_id(self, user_id: int | None) -> None:
        self.pipeline.bot_user_id = user_id

    async def handle(
        self,
        incoming: IncomingMessage,
        *,
        mentions_bot: bool = False,
        replies_to_bot: bool = False,
        older: OlderMessages | None = None,
        while_replying: Callable[[], contextlib.AbstractAsyncContextManager[object]] | None = None,
    ) -> ReplyOutcome | None:
        """One turn: the reply to `incoming`, or None when the bot does not answer it (it is still recorded)."""
        if older is not None and incoming.author_id != self.bot_user_id and await self.chat_log.is_empty(incoming.channel_id):
            await self.backfill(older)
        if incoming.private_thread and incoming.channel_id not in self._private_threads:
            await self._detach_private_thread(incoming.channel_id)
        trigger = await self.trigger(incoming, mentions_bot=mentions_bot, replies_to_bot=replies_to_bot)
        if trigger is None:
            await self.chat_log.record(incoming)
            self._saw(incoming)
            return None
        log.debug("Answering message %s (%s)", incoming.message_id, trigger.value)
        async with while_replying() if while_replying is not None else contextlib.nullcontext():
            outcome = await self.pipeline.reply(incoming)  # records the message, with the names it brings
        self._saw(incoming)
        return outcome

    async def _detach_private_thread(self, thread_id: int) -> None:
        """Once per private thread and process: messages stored as its parent's (the bot did not know it was private)
        become the thread's own, and the parent's summaries holding them go."""
        moved = await self.chat_log.detach_private_thread(thread_id)
        self._private_threads.add(thread_id)
        if moved and self.day_watch is not None:
            await self.day_watch.withdraw_moved(moved)

    def _saw(self, incoming: IncomingMessage) -> None:
        """The first message of a chat day starts the channel's summaries in the background, once it is stored
        and answered: a model server with one slot then never makes this reply wait behind a summary."""
        if self.day_watch is not None:
            self.day_watch.saw(incoming.summary_channel_id, incoming.guild_id)

    async def backfill(self, older: OlderMessages) -> int:
        """First message the bot sees in a channel: store its recent history once, so the window is not empty."""
        limit = max(0, self.settings.context_messages - 1)
        if not limit:
            return 0
        return await self.chat_log.record_backfill(list(await older(limit)))

    async def trigger(
        self, message: IncomingMessage, *, mentions_bot: bool = False, replies_to_bot: bool = False
    ) -> Trigger | None:
        """Why the bot should answer `message`, looking up the persona's name, auto-reply channels and the blocklist."""
        if message.is_bot or (self.bot_user_id is not None and message.author_id == self.bot_user_id):
            return None
        channels = list(dict.fromkeys((message.channel_id, message.memory_channel_id)))
        facts = await self.servers.trigger_facts(message.guild_id, message.author_id, channels)
        return should_reply(
            TriggerFacts(
                author_is_bot=message.is_bot,
                author_blocked=facts.blocked,
                is_dm=message.is_dm,
                mentions_bot=mentions_bot,
                replies_to_bot=replies_to_bot,
                says_persona_name=says_name(message.text, facts.persona_name),
                auto_reply_channel=facts.auto_reply,
            )
        )

    async def record(self, message: IncomingMessage) -> bool:
        """Store a message without answering it (the bot's own replies, for instance)."""
        return await self.chat_log.record(message)

    async def edited(self, channel_id: int, message_id: int, text: str, edited_at: datetime) -> bool:
        """A message edited: the new text in the log; the summaries holding the old one go (written again soon)."""
        changed = await self.chat_log.edit(channel_id, message_id, text, edited_at)
        if changed and self.day_watch is not None:
            await self.day_watch.purge_withdrawn()
        return changed

    async def deleted(self, channel_id: int, message_ids: Sequence[int]) -> int:
        """Messages deleted: out of the log (their chunks with them); the summaries holding them go (written again)."""
        count = await self.chat_log.delete(channel_id, message_ids)
        if count and self.day_watch is not None:
            await self.day_watch.purge_withdrawn()
        return count
