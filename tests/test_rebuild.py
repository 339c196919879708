"""Rebuild after a change of embedding space: two spaces in one database, a run interrupted
(a failing provider, a cancelled task) and resumed without embedding anything twice; old vectors never searched
and removed once the new ones exist; `python -m bot reembed`, `/settings embeddings rebuild` and history-recall."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from bot.clock import ManualClock
from bot.embeddings.providers import DeadlineEmbedder, EmbeddingSpace
from bot.history.service import HistoryIndex
from bot.memory.models import Conversation, MemoryList, NewMemory, Source
from bot.memory.service import MemoryCore
from bot.servers.models import Actor
from bot.services import memory_core
from bot.upkeep import Upkeep
from tests.conftest import MakeCore
from tests.discord_fakes import (
    ADMIN_PERMISSIONS,
    GENERAL_ID,
    GUILD_ID,
    OTHER_CHANNEL_ID,
    Person,
    SlashHarness,
    slash_harness,
)
from tests.recall_helpers import CHATTER, GAMES, GUILD, HIKE, JUNO, FlakyEmbedder, World, build_world

ROOT = Path(__file__).resolve().parents[1]
NEW_SPACE = EmbeddingSpace("test", "", "usem3-under-another-name")
HANDBOOK = b"# Game nights\nEvery Friday at 8pm UTC.\n\n# Minecraft\nThe server is play.example.org.\n"


async def vector_counts(world: World) -> dict[str, dict[int, int]]:
    found: dict[str, dict[int, int]] = {}
    for table in ("memory_vectors", "history_chunk_vectors", "document_passage_vectors"):
        rows = await world.core.pool.fetch(f"SELECT space_id, count(*) AS n FROM {table} GROUP BY space_id")
        found[table] = {row["space_id"]: row["n"] for row in rows}
    return found


async def in_new_space(world: World, embedder: FlakyEmbedder, clock: ManualClock, **overrides: object) -> World:
    """The same database seen by a bot whose EMBEDDING_MODEL changed."""

    async def core(**settings: object) -> MemoryCore:
        return memory_core(world.core.pool, DeadlineEmbedder(embedder, 30.0), world.core.settings.with_overrides(
            **settings, **overrides), clock)

    return await build_world(core, clock)


async def test_rebuild_across_two_spaces_resumes_where_it_stopped(make_core: MakeCore, clock: ManualClock) -> None:
    old = await build_world(make_core, clock, context_messages=6)
    for text in ("Game night is on Fridays", "Juno's cat is called Mochi", "The server was founded in 2019"):
        await old.core.save(NewMemory(MemoryList.SERVER, text, by=JUNO, via=Source.COMMAND, guild_id=GUILD, by_can_manage=True))
    await old.say(HIKE + HIKE + GAMES + GAMES + CHATTER)
    await old.documents.add(GUILD, "handbook.md", HANDBOOK, Actor(JUNO, can_manage=True))
    first = await old.upkeep.rebuild()
    assert first.counts["chunks"].done == 2 and first.paused is None
    old_space = await old.core.embeddings.space_id()
    assert await vector_counts(old) == {
        "memory_vectors": {old_space: 3}, "history_chunk_vectors": {old_space: 2}, "document_passage_vectors": {old_space: 2}
    }

    # the model changes; the provider fails after two requests (2 memories, then 1): the pass pauses
    flaky = FlakyEmbedder(old.core.embeddings.embedder, space=NEW_SPACE, ok_calls=2)
    new = await in_new_space(old, flaky, clock, embedding_batch_size=2, context_messages=6)
    seen: list[tuple[int, int]] = []
    paused = await new.upkeep.rebuild(lambda state: seen.append((state.done, state.total)))
    new_space = await new.core.embeddings.space_id()
    assert new_space != old_space
    assert paused.paused and "provider is down" in paused.paused and new.upkeep.last_error == paused.paused
    assert (paused.counts["memories"].done, paused.counts["chunks"].done, paused.counts["passages"].done) == (3, 0, 0)
    assert seen[0] == (0, 7) and seen[-1] == (3, 7)  # progress after every batch
    assert await new.upkeep.waiting() == {"memories": 0, "chunks": 2, "passages": 2}
    assert await vector_counts(new) == {  # old memory vectors gone (new ones exist); chunks and passages keep theirs
        "memory_vectors": {new_space: 3}, "history_chunk_vectors": {old_space: 2}, "document_passage_vectors": {old_space: 2}
    }

    # vectors of the old space are never searched, even where nothing newer exists yet
    query = (await flaky.inner.embed(["how long was the hike with the marmots?"]))[0]
    history = await new.history.search(channel_id=600, answered_message_id=2**62, query_vector=query)
    assert history.hits == [] and history.searched == 0
    documents = await new.documents.search(GUILD, (await flaky.inner.embed(["when is game night?"]))[0])
    assert documents.hits == [] and documents.searched == 0
    recall = await new.core.reply_search(Conversation(GUILD, 600, JUNO, "when is game night?"))
    assert recall.search_ok is False  # the provider is still down: a failed search, nothing changes

    # the provider is back: a new pass (a restart, the background task, or the command) does only what is left
    resumed = FlakyEmbedder(old.core.embeddings.embedder, space=NEW_SPACE)
    again = await in_new_space(old, resumed, clock, embedding_batch_size=2, context_messages=6)
    done = await again.upkeep.rebuild()
    assert done.paused is None and again.upkeep.last_error is None
    assert (done.counts["memories"].done, done.counts["chunks"].done, done.counts["passages"].done) == (0, 2, 2)
    assert len(resumed.texts) == 4 and not any("Mochi" in text for text in resumed.texts)  # nothing embedded twice
    assert done.stale_removed == 4
    assert await vector_counts(again) == {
        "memory_vectors": {new_space: 3}, "history_chunk_vectors": {new_space: 2}, "document_passage_vectors": {new_space: 2}
    }
    history = await again.history.search(channel_id=600, answered_message_id=2**62, query_vector=query)
    assert history.hits and "Mount Rainier" in history.hits[0].text
    assert (await again.documents.search(GUILD, (await resumed.embed(["when is game night?"]))[0])).hits
    for world in (old, new, again):
        await world.pipeline.model.close()


class Stalling:
    """Embeds `ok_calls` batches, then hangs until cancelled (a process killed mid-run, as far as the database knows)."""

    def __init__(self, inner: FlakyEmbedder, ok_calls: int) -> None:
        self.inner = inner
        self.ok_calls = ok_calls
        self.stalled = asyncio.Event()

    @property
    def space(self) -> EmbeddingSpace | None:
        return self.inner.space

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        if self.inner.calls >= self.ok_calls:
            self.stalled.set()
            await asyncio.Event().wait()
        return await self.inner.embed(texts)


async def test_a_cancelled_rebuild_leaves_nothing_half_done(make_core: MakeCore, clock: ManualClock) -> None:
    old = await build_world(make_core, clock)
    for number in range(5):
        await old.core.save(
            NewMemory(MemoryList.SERVER, f"Server fact {number}", by=JUNO, via=Source.COMMAND, guild_id=GUILD, by_can_manage=True)
        )
    stalling = Stalling(FlakyEmbedder(old.core.embeddings.embedder, space=NEW_SPACE), ok_calls=2)
    core = memory_core(old.core.pool, stalling, old.core.settings.with_overrides(embedding_batch_size=2), clock)
    upkeep = Upkeep(core.embeddings, core.vectors, HistoryIndex(core.pool, core.embeddings, core.settings))
    task = asyncio.create_task(upkeep.rebuild())
    await asyncio.wait_for(stalling.stalled.wait(), 30)
    assert upkeep.busy
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not upkeep.busy
    assert (await upkeep.waiting())["memories"] == 1  # two batches of two were stored; the third never was

    fresh = FlakyEmbedder(old.core.embeddings.embedder, space=NEW_SPACE)
    core = memory_core(old.core.pool, fresh, old.core.settings.with_overrides(embedding_batch_size=2), clock)
    state = await Upkeep(core.embeddings, core.vectors, HistoryIndex(core.pool, core.embeddings, core.settings)).rebuild()
    assert state.paused is None and fresh.texts == ["Server fact 4"]
    await old.pipeline.model.close()


async def test_python_m_bot_reembed(db_url: str, tmp_path: Path, make_core: MakeCore, clock: ManualClock) -> None:
    world = await build_world(make_core, clock)
    down = memory_core(world.core.pool, FlakyEmbedder(world.core.embeddings.embedder, ok_calls=0), world.core.settings, clock)
    saved = await down.save(NewMemory(MemoryList.SERVER, "Juno's cat is called Mochi", by=JUNO, via=Source.COMMAND,
                                      guild_id=GUILD, by_can_manage=True))
    assert saved.saved is not None and (await world.upkeep.waiting())["memories"] == 1
    await world.pipeline.model.close()

    env = {k: v for k, v in os.environ.items() if not k.startswith(("CHAT_", "DISCORD_", "EMBEDDING_", "MEMORY_"))}
    env.update(PYTHONPATH=str(ROOT), DATABASE_URL=db_url, DATA_DIR=str(tmp_path), LOG_LEVEL="WARNING")

    async def run(**extra: str) -> tuple[int, str, str]:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot", "reembed", cwd=tmp_path, env={**env, **extra},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), 300)
        return process.returncode or 0, out.decode(), err.decode()

    status, out, err = await run()
    assert status == 0, err
    assert "Done: memories 1/1" in out and "[##############################] 100%" in err and "\r" in err
    assert (await world.upkeep.waiting())["memories"] == 0
    status, _, err = await run(EMBEDDING_PROVIDER="none")
    assert status == 1 and "no embedding provider is configured" in err


ADMIN = Person(101, "Admin", ADMIN_PERMISSIONS)


@pytest.fixture
async def harness(make_core: MakeCore) -> AsyncIterator[SlashHarness]:
    async with slash_harness(await make_core()) as started:
        yield started


async def test_settings_embeddings_rebuild_shows_progress_in_an_edited_message(harness: SlashHarness, clock: ManualClock) -> None:
    core: MemoryCore = harness.bot.services.core  # type: ignore[attr-defined]
    down = memory_core(core.pool, FlakyEmbedder(core.embeddings.embedder, ok_calls=0), core.settings, clock)
    for text in ("Juno's cat is called Mochi", "Game night is on Fridays"):
        await down.save(NewMemory(MemoryList.SERVER, text, by=1, via=Source.COMMAND, guild_id=GUILD_ID, by_can_manage=True))
    refused = await harness.run(harness.slash("settings embeddings rebuild", Person(102, "Juno")))
    assert refused.ephemeral and "Only members with Manage Server" in refused.content

    command = harness.slash("settings embeddings rebuild", ADMIN)
    deferred = await harness.run(command)
    assert deferred.body == {"type": 5, "data": {"flags": 64}}
    final = await harness.fake.wait_for(
        lambda call: command["token"] in call.path and call.method == "PATCH" and "done" in call.content, after=0
    )
    assert "memories 2/2" in final.content and "▰" * 16 in final.content and "100%" in final.content
    assert await harness.bot.services.upkeep.waiting() == {"memories": 0, "chunks": 0, "passages": 0}  # type: ignore[attr-defined]


async def test_settings_history_recall(harness: SlashHarness) -> None:
    call = await harness.run(harness.slash("settings history-recall", ADMIN, enabled=False, channel=OTHER_CHANNEL_ID))
    assert call.ephemeral and f"History recall is off in <#{OTHER_CHANNEL_ID}>" in call.content
    here = await harness.run(harness.slash("settings history-recall", ADMIN, enabled=False))
    assert f"<#{GENERAL_ID}>" in here.content
    history: HistoryIndex = harness.bot.services.history  # type: ignore[attr-defined]
    assert not await history.recall_enabled(OTHER_CHANNEL_ID) and not await history.recall_enabled(GENERAL_ID)
    assert await history.recall_enabled(12345)  # on by default
    shown = await harness.run(harness.slash("settings show", ADMIN))
    assert f"off in <#{GENERAL_ID}> <#{OTHER_CHANNEL_ID}>" in shown.text()  # by channel id
    await harness.run(harness.slash("settings history-recall", ADMIN, enabled=True))
    assert await history.recall_enabled(GENERAL_ID)
