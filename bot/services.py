"""The one place that wires Deskmate's services, for the bot, the console, simulate, the tools and the benchmarks.

`open_services` opens, in order, the database (the embedded server unless DATABASE_URL), the
embedder (the built-in model warmed up, unless one is handed in), then every service, each the
only owner of its tables; it closes them in reverse. Adapters receive the `Services` ready and make
one call per event.

A few requests span several owners and must be one transaction: forgetting a user (delete-my-data),
a channel, or a server. They are here: each owner is asked to forget its part on the same connection.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC
from typing import Any

import asyncpg
import openai

from bot.chat.log import ChatLog
from bot.chat.model import ChatModel, ModelGate, replies_first
from bot.chat.reply import ReplyPipeline
from bot.chat.service import ChatService
from bot.chat.sources import TailSource
from bot.chat.tools import MemoryTools
from bot.clock import Clock
from bot.config import Settings
from bot.db import Database
from bot.documents.service import DocumentLibrary
from bot.documents.source import DocumentSource
from bot.embeddings.providers import BuiltinEmbedder, Embedder, create_embedder
from bot.embeddings.service import Embeddings
from bot.history.service import HistoryIndex
from bot.history.source import ChatHistorySource
from bot.memory.manage import USER_DATA_FORMAT, USER_DATA_VERSION, MemoryManager
from bot.memory.service import MemoryCore
from bot.servers.models import Actor, Privacy
from bot.servers.rules import require_manager
from bot.servers.service import Servers
from bot.summaries.notes import DayNotes
from bot.summaries.service import ChannelSummaries
from bot.summaries.writer import SummaryWriter
from bot.upkeep import Upkeep


@dataclass
class Services:
    settings: Settings
    database: Database
    servers: Servers
    embeddings: Embeddings
    core: MemoryCore
    memories: MemoryManager
    chat_log: ChatLog
    history: HistoryIndex
    documents: DocumentLibrary
    upkeep: Upkeep
    model: ChatModel
    pipeline: ReplyPipeline
    chat: ChatService
    summaries: ChannelSummaries

    # --- requests that span several owners: one transaction each ---

    async def forget_channel(self, channel_id: int) -> int:
        """A deleted channel or thread: its chunks and history switch, then its messages and receipts."""
        async with self.database.pool.acquire() as conn, conn.transaction():
            await self.history.forget_channel(conn, channel_id)
            await self.summaries.forget_channel(conn, channel_id)
            return await self.chat_log.forget_channel(conn, channel_id)

    async def forget_guild(self, guild_id: int) -> dict[str, int]:
        """The bot left a server: its stored messages, chunks and receipts go (memories, documents, settings stay)."""
        async with self.database.pool.acquire() as conn, conn.transaction():
            history = await self.history.forget_guild(conn, guild_id)
            summaries = await self.summaries.forget_guild(conn, guild_id)
            chat = await self.chat_log.forget_guild(conn, guild_id)
        return {"chat_messages": chat["chat_messages"], "history_chunks": history["history_chunks"],
                "receipts": chat["receipts"], "history_channels": history["history_channels"], **summaries}

    async def delete_user_data(self, user_id: int) -> dict[str, int]:
        """Delete-my-data: every owner forgets the user, in one transaction (all of it, or nothing).

        Withdrawal wins (bot/summaries/withdrawal.py): the person is locked first, so a summary being stored from
        their words either is stored before (and deleted here) or sees them gone (and is not stored). The channels
        whose summaries went are summarised again, without them, in the background.
        """
        counts: dict[str, int] = {}
        async with self.database.pool.acquire() as conn, conn.transaction():
            await self.servers.lock_people(conn, [user_id], shared=False)
            places = await self.summaries.places_of(conn, user_id)
            for owner in (self.core, self.servers, self.documents, self.summaries, self.chat_log):
                counts |= await owner.forget_user(conn, user_id)
        self.summaries.recheck(places)
        return counts

    async def set_privacy(self, user_id: int, level: Privacy) -> None:
        """A person's privacy level, everywhere. `full`: every summary holding their words goes at once (written again
        without them); the person is locked while it changes, so work in flight cannot bring their words back."""
        async with self.database.pool.acquire() as conn, conn.transaction():
            await self.servers.lock_people(conn, [user_id], shared=False)
            await self.servers.set_privacy(user_id, level, conn)
            places = await self.summaries.withdraw_person(conn, user_id, None) if level == Privacy.FULL else []
        self.summaries.recheck(places)

    async def set_blocked(self, guild_id: int, user_id: int, blocked: bool, actor: Actor) -> None:
        """Block or unblock someone in a server (Manage Server). A block removes the server's summaries holding their
        words, as `set_privacy` does for `full`."""
        require_manager(actor, "only members with Manage Server can change the blocklist here")
        async with self.database.pool.acquire() as conn, conn.transaction():
            await self.servers.lock_people(conn, [user_id], shared=False)
            await self.servers.set_blocked(guild_id, user_id, blocked, conn)
            places = await self.summaries.withdraw_person(conn, user_id, guild_id) if blocked else []
        self.summaries.recheck(places)

    async def export_user_data(self, user_id: int) -> dict[str, Any]:
        """Everything Deskmate stores about a user, in every server and DM (docs/export-format.md), one snapshot."""
        async with self.database.pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
            memories = await self.core.export_user(conn, user_id)
            settings = await self.servers.export_user(conn, user_id)
            messages = await self.chat_log.export_user(conn, user_id)
        shaped = self.memories.export_user_memories(memories)
        return {
            "format": USER_DATA_FORMAT,
            "version": USER_DATA_VERSION,
            "user_id": str(user_id),
            "exported_at": self.core.clock.now().astimezone(UTC).isoformat(),
            "privacy": settings["privacy"],
            "personal_memories": shaped["personal_memories"],
            "server_memories_added": shaped["server_memories_added"],
            "blocked_in_servers": [str(guild) for guild in settings["blocked_in_servers"]],
            "chat_messages": messages,
        }


async def make_embedder(settings: Settings) -> Embedder:
    """The configured embedder; the built-in model is loaded and warmed up off the event loop."""
    builtin = None
    if settings.embedding_provider == "builtin":
        builtin = await asyncio.to_thread(BuiltinEmbedder)
        await asyncio.to_thread(builtin.warm_up)
    return create_embedder(settings, builtin)


def memory_core(
    pool: asyncpg.Pool, embedder: Embedder, settings: Settings, clock: Clock | None = None, *, servers: Servers | None = None
) -> MemoryCore:
    """A memory core with an embeddings service of its own: for tests, benchmarks and tools that start from a core."""
    return MemoryCore(pool, Embeddings(pool, embedder, settings), settings, clock, servers=servers)


def build_services(
    core: MemoryCore,
    database: Database | None = None,
    *,
    chat_client: openai.AsyncOpenAI | None = None,
    bot_user_id: int | None = None,
    summary_client: openai.AsyncOpenAI | None = None,
) -> Services:
    """Every service around a memory core and its embeddings service (no I/O: `open_services` opens and closes
    around it).

    The tests build a core on their own database and hand it here, so they run the same wiring.
    """
    settings, embeddings = core.settings, core.embeddings
    database = database or Database(url="", pool=core.pool)
    chat_log = ChatLog(database.pool)
    history = HistoryIndex(database.pool, embeddings, settings)
    documents = DocumentLibrary(database.pool, embeddings, settings, core.clock)
    sources: list[TailSource] = [ChatHistorySource(history), DocumentSource(documents)]
    gate = ModelGate(enabled=replies_first(settings))  # one per model server: replies before summaries and notes
    model = ChatModel(settings, MemoryTools(core, settings), chat_client, gate)
    notes = DayNotes(core, core.servers, chat_log, settings)
    summaries = ChannelSummaries(
        database.pool, settings, core.clock, chat_log, core.servers, notes, SummaryWriter(settings, summary_client, gate)
    )
    pipeline = ReplyPipeline(core, chat_log, model, sources, bot_user_id=bot_user_id, summaries=summaries)
    return Services(
        settings=settings,
        database=database,
        servers=core.servers,
        embeddings=embeddings,
        core=core,
        memories=MemoryManager(core, import_max_bytes=settings.import_max_bytes),
        chat_log=chat_log,
        history=history,
        documents=documents,
        upkeep=Upkeep(embeddings, core.vectors, history),
        model=model,
        pipeline=pipeline,
        chat=ChatService(pipeline, chat_log, core.servers, settings, summaries),
        summaries=summaries,
    )


@contextlib.asynccontextmanager
async def open_services(
    settings: Settings,
    *,
    database: Database | None = None,
    embedder: Embedder | None = None,
    clock: Clock | None = None,
    chat_client: openai.AsyncOpenAI | None = None,
    bot_user_id: int | None = None,
) -> AsyncIterator[Services]:
    """Open the database and embedder (unless handed in), wire every service, and close it all in reverse."""
    async with contextlib.AsyncExitStack() as stack:
        if database is None:
            database = await Database.open(settings)
            stack.push_async_callback(database.close)
        if embedder is None:
            embedder = await make_embedder(settings)
        embeddings = Embeddings(database.pool, embedder, settings)
        core = MemoryCore(database.pool, embeddings, settings, clock, servers=Servers(database.pool, settings))
        services = build_services(core, database, chat_client=chat_client, bot_user_id=bot_user_id)
        stack.push_async_callback(services.model.close)
        stack.push_async_callback(services.summaries.close)
        await services.servers.sync_default_persona()
        yield services
