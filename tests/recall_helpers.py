"""Shared by the pipeline and issue-4 tests (history, documents, receipts, rebuild): the test people and their
messages, a pipeline with both tail sources installed, as the bot and the console wire it, and helpers to write a
channel's chat history."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np

from bot.chat.messages import IncomingMessage, UserRef
from bot.chat.reply import ReplyPipeline
from bot.clock import ManualClock
from bot.documents.service import DocumentLibrary
from bot.embeddings.providers import Embedder, EmbeddingError, EmbeddingSpace
from bot.history.service import HistoryIndex
from bot.memory.service import MemoryCore
from bot.services import Services, build_services
from bot.upkeep import Upkeep

BOT, JUNO, SAM, RIN = 9000, 101, 102, 103
NAMES = {BOT: "Deskmate", JUNO: "Juno", SAM: "Sam", RIN: "Rin"}
GUILD, CHANNEL, OTHER_CHANNEL = 500, 600, 601

_ids = itertools.count(5_000_000)


class FlakyEmbedder:
    """Another embedder's vectors, optionally under another space (a model change), failing after `ok_calls` calls.

    Counts calls and texts, so tests can check what a (resumed) rebuild embedded. `ok_calls=None` never fails.
    """

    def __init__(self, inner: Embedder, *, space: EmbeddingSpace | None = None, ok_calls: int | None = None) -> None:
        self.inner = inner
        self._space = space
        self.ok_calls = ok_calls
        self.calls = 0
        self.texts: list[str] = []

    @property
    def space(self) -> EmbeddingSpace | None:
        return self._space or self.inner.space

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        if self.ok_calls is not None and self.calls >= self.ok_calls:
            raise EmbeddingError("the provider is down (test)")
        self.calls += 1
        self.texts += list(texts)
        return await self.inner.embed(texts)


def message(
    author: int,
    text: str,
    *,
    clock: ManualClock,
    at: datetime | None = None,
    channel: int = CHANNEL,
    guild: int | None = GUILD,
    mentions: tuple[int, ...] = (),
    reply_to: int | None = None,
) -> IncomingMessage:
    """A message by one of the test people (`NAMES`), with a new id, sent at `at` or the clock's now."""
    return IncomingMessage(
        message_id=next(_ids),
        channel_id=channel,
        author_id=author,
        author_name=NAMES[author],
        text=text,
        created_at=at or clock.now(),
        guild_id=guild,
        is_bot=author == BOT,
        reply_to=reply_to,
        mentions=tuple(UserRef(user, NAMES[user], user == BOT) for user in mentions),
    )


@dataclass
class World:
    services: Services
    pipeline: ReplyPipeline
    history: HistoryIndex
    documents: DocumentLibrary
    upkeep: Upkeep
    clock: ManualClock

    @property
    def core(self) -> MemoryCore:
        return self.pipeline.core

    def message(
        self,
        author: int,
        text: str,
        *,
        channel: int = CHANNEL,
        guild: int | None = GUILD,
        at: datetime | None = None,
        mentions: tuple[int, ...] = (),
    ) -> IncomingMessage:
        return message(author, text, clock=self.clock, at=at, channel=channel, guild=guild, mentions=mentions)

    async def say(
        self,
        lines: Sequence[tuple[int, str]],
        *,
        channel: int = CHANNEL,
        guild: int | None = GUILD,
        gap: timedelta = timedelta(minutes=1),
    ) -> list[IncomingMessage]:
        """Record messages one `gap` apart (moving the clock), as the chat cog records everything it reads."""
        recorded = []
        for author, text in lines:
            self.clock.current += gap
            message = self.message(author, text, channel=channel, guild=guild)
            await self.pipeline.chat_log.record(message)
            recorded.append(message)
        return recorded


async def build_world(make_core, clock: ManualClock, chat_base_url: str | None = None, **overrides: object) -> World:
    settings: dict[str, object] = {"chat_timeout_s": 5.0, **overrides}
    if chat_base_url is not None:
        settings.update(chat_base_url=chat_base_url, chat_model="fake-model")
    core: MemoryCore = await make_core(**settings)
    services = build_services(core, bot_user_id=BOT)
    await services.pipeline.servers.sync_default_persona()
    return World(services, services.pipeline, services.history, services.documents, services.upkeep, clock)


HIKE = [
    (JUNO, "we went hiking at Mount Rainier last weekend"),
    (SAM, "nice! how long was the trail?"),
    (JUNO, "about 12 miles, the views from the ridge were amazing"),
    (RIN, "did you see any marmots on the trail?"),
    (JUNO, "tons of marmots, and a black bear far away in the meadow"),
    (SAM, "a bear! were you scared on the hike?"),
]
GAMES = [
    (SAM, "the new RPG patch broke my save file"),
    (RIN, "same, I lost ten hours of progress"),
    (SAM, "the devs said a hotfix is coming on friday"),
    (JUNO, "I'll wait before updating the game then"),
    (RIN, "good call, the patch notes were vague"),
    (SAM, "at least the new boss fight looks fun"),
]
CHATTER = [
    (RIN, "good morning everyone"),
    (SAM, "morning!"),
    (JUNO, "coffee time"),
    (RIN, "lol"),
    (SAM, "brb"),
    (JUNO, "back"),
]
