"""Receipts, one embedding request per reply, `/memories why`, and the memory viewer.

The embedding requests are counted at a local OpenAI-compatible embeddings server (tests/fakes.py), with
memories, document passages and chat history all searched by the same reply."""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import AsyncIterator

import pytest
from PIL import Image

from bot.chat.messages import UserRef
from bot.chat.receipts import Receipt, ReplyStatus
from bot.chat.reply import ReplyPipeline
from bot.clock import ManualClock
from bot.config import Settings
from bot.embeddings.providers import BuiltinEmbedder, create_embedder
from bot.memory.models import MemoryList, NewMemory, Source
from bot.memory.service import MemoryCore
from bot.servers.models import Actor
from bot.services import memory_core
from bot.tools.chart import buckets, days_unused_chart
from tests.conftest import MakeCore
from tests.discord_fakes import ADMIN_PERMISSIONS, GENERAL_ID, GUILD_ID, Person, SlashHarness, slash_harness
from tests.fakes import FakeChatServer, FakeEmbeddingsServer
from tests.recall_helpers import BOT, CHATTER, GUILD, HIKE, JUNO, RIN, SAM, FlakyEmbedder, World, build_world

HANDBOOK = b"""# Game nights
We play every Friday at 8pm UTC in the voice channel. The game is picked by a poll on Wednesday.

# Minecraft
The server address is play.example.org, version 1.21. Backups run every night at 3am.
"""


@pytest.fixture
async def embeddings(builtin_embedder: BuiltinEmbedder) -> AsyncIterator[FakeEmbeddingsServer]:
    async with FakeEmbeddingsServer(builtin_embedder) as server:
        yield server


async def server_memory(core: MemoryCore, text: str, guild: int = GUILD) -> int:
    result = await core.save(NewMemory(MemoryList.SERVER, text, by=JUNO, via=Source.COMMAND, guild_id=guild, by_can_manage=True))
    assert result.saved is not None
    return result.saved.id


async def test_one_embedding_request_per_reply_for_memories_documents_and_history(
    make_core: MakeCore, clock: ManualClock, chat: FakeChatServer, embeddings: FakeEmbeddingsServer
) -> None:
    openai = Settings(
        embedding_provider="openai", embedding_base_url=embeddings.url, embedding_model="fake-embed", embedding_timeout_s=10.0
    )

    embedder = create_embedder(openai)

    async def core_on_the_server(**overrides: object) -> MemoryCore:
        return await make_core(embedder=embedder, context_messages=6, **overrides)

    world = await build_world(core_on_the_server, clock, chat.base_url)
    try:
        await server_memory(world.core, "Game night voice channel is called The Tavern")
        await world.documents.add(GUILD, "handbook.md", HANDBOOK, Actor(JUNO, can_manage=True))
        await world.say(HIKE + HIKE + [(SAM, "game night this friday? who is hosting the games")] * 2 + CHATTER)
        await world.upkeep.rebuild()
        assert (await world.upkeep.waiting()) == {"memories": 0, "chunks": 0, "passages": 0}

        for question in ("what time is game night on friday?", "how long was the hike with the marmots?"):
            before = len(embeddings.requests)
            outcome = await world.pipeline.reply(world.message(JUNO, question))
            assert outcome.status == ReplyStatus.REPLIED
            assert len(embeddings.requests) == before + 1  # one request, shared by every lookup of the reply
            assert embeddings.requests[-1]["body"]["input"] == [question]
            assert outcome.recall.query_vector is not None
        assert outcome.receipt.items("history")  # the last question found older chat with that one embedding
    finally:
        await world.pipeline.model.close()
        await embedder.inner.close()  # type: ignore[attr-defined]


@pytest.fixture
async def world(make_core: MakeCore, clock: ManualClock, chat: FakeChatServer) -> AsyncIterator[World]:
    built = await build_world(make_core, clock, chat.base_url, context_messages=6)
    yield built
    await built.pipeline.model.close()


async def test_receipts_match_what_was_sent(world: World, chat: FakeChatServer) -> None:
    desk = await server_memory(world.core, "Game night voice channel is called The Tavern")
    await world.documents.add(GUILD, "handbook.md", HANDBOOK, Actor(JUNO, can_manage=True))
    await world.say(HIKE + HIKE + CHATTER)
    await world.upkeep.rebuild()

    outcome = await world.pipeline.reply(world.message(JUNO, "what time is game night on friday?"))
    stored = await world.pipeline.chat_log.receipt(channel_id=outcome.receipt.channel_id)
    assert stored is not None
    receipt = Receipt.from_dict(json.loads(json.dumps(stored)))  # as read back from jsonb
    assert receipt.as_dict() == json.loads(json.dumps(outcome.receipt.as_dict()))
    sent = chat.messages()
    head, final = sent[0]["content"], sent[-1]["content"]

    assert receipt.desk_ids == [desk] and f'"id": {desk}' in head
    assert [(d["id"], d["list"], d["days_unused"], d["about"]) for d in receipt.desk_detail] == [(desk, "server", 0, None)]
    assert outcome.prompt is not None
    shown = {item.key: item for item in outcome.prompt.tail}
    assert receipt.items("documents") and receipt.items("history") == []
    for named in receipt.items("documents"):  # every passage the receipt names was sent, with the tokens it says
        item = shown[f"passage:{named['passage_id']}"]
        assert item.text in final and f"{item.text}" not in head
        assert named["tokens"] == item.meta["tokens"] if item.meta else False
    passages = {f"passage:{d['passage_id']}" for d in receipt.items("documents")}
    assert {key for key in shown if key.startswith("passage:")} == passages
    assert "nothing relevant" in receipt.sources["history"]["note"]
    assert receipt.tokens == outcome.prompt.tokens.as_dict()
    assert sum(receipt.tail_tokens.values()) == receipt.tokens["tail"]
    assert receipt.nothing_added_because is None and receipt.head_same_as_previous is None

    again = await world.pipeline.reply(world.message(RIN, "and what's the minecraft server address?"))
    assert again.receipt.head_same_as_previous is True  # nothing moved between desk and drawer: a cache hit
    assert "play.example.org" in chat.messages()[-1]["content"]
    rendered = again.receipt.render()
    assert "documents: “handbook.md” › Minecraft" in rendered and "prompt head: same as the previous reply" in rendered

    nothing = await world.pipeline.reply(world.message(SAM, "lol"))
    assert nothing.receipt.nothing_added_because is not None
    assert nothing.receipt.nothing_added_because.startswith("nothing relevant")
    assert "nothing was recalled for this reply: nothing relevant" in nothing.receipt.render()


async def test_receipts_say_when_the_search_failed_or_the_budget_was_full(
    make_core: MakeCore, clock: ManualClock, chat: FakeChatServer
) -> None:
    world = await build_world(make_core, clock, chat.base_url, context_messages=6, history_token_budget=20)
    try:
        await world.say(HIKE + HIKE + CHATTER)
        await world.upkeep.rebuild()
        full = await world.pipeline.reply(world.message(JUNO, "how long was the hike with the marmots?"))
        assert full.receipt.items("history") == []
        assert full.receipt.sources["history"]["note"] == "the history budget was full (HISTORY_TOKEN_BUDGET 20)"
        assert (full.receipt.nothing_added_because or "").startswith("the budget was full")

        down = FlakyEmbedder(world.core.embeddings.embedder, ok_calls=0)
        failing = await build_world(
            lambda **kw: _core(world.core, down, **kw), clock, chat.base_url, context_messages=6
        )
        failed = await failing.pipeline.reply(world.message(JUNO, "ok, brb"))
        assert failed.status == ReplyStatus.REPLIED and not failed.receipt.search_ok
        assert (failed.receipt.nothing_added_because or "").startswith("the search failed")
        assert failed.receipt.sources["history"]["note"].startswith("the search failed")
        assert failed.receipt.sources["documents"]["note"].startswith("the search failed")
        by_text = await failing.pipeline.reply(world.message(JUNO, "how long was the hike with the marmots?"))
        # the words still found the chat, and the budget (HISTORY_TOKEN_BUDGET 20 here) holds for it too
        assert not by_text.receipt.search_ok and by_text.receipt.sources["history"]["by_text"] is True
        assert by_text.receipt.sources["history"]["note"] == "the history budget was full (HISTORY_TOKEN_BUDGET 20)"
        await failing.pipeline.model.close()
    finally:
        await world.pipeline.model.close()


async def _core(core: MemoryCore, embedder: FlakyEmbedder, **overrides: object) -> MemoryCore:
    return memory_core(core.pool, embedder, core.settings.with_overrides(**overrides), core.clock)


def test_chart_buckets_and_png() -> None:
    bars = buckets([0, 0, 1, 6, 7, 13, 14, 40], dormant_after=7, decay=True)
    assert [b.label for b in bars] == ["0", "1", "2", "3", "4", "5", "6", "7-13", "14-27", "28+"]
    assert [b.count for b in bars] == [2, 1, 0, 0, 0, 0, 1, 2, 1, 1]
    assert [b.drawer for b in bars] == [False] * 7 + [True] * 3
    assert not any(b.drawer for b in buckets([9], dormant_after=7, decay=False))
    wide = buckets(list(range(60)), dormant_after=30, decay=True)
    assert len(wide) == 13 and wide[0].label == "0-2" and sum(b.count for b in wide) == 60
    png = days_unused_chart([0, 3, 9], 7)
    image = Image.open(io.BytesIO(png))
    assert image.format == "PNG" and image.size == (640, 300)


ADMIN = Person(101, "Admin", ADMIN_PERMISSIONS)
MAX = Person(104, "Max")
JUNO_P = Person(JUNO, "Juno")


@pytest.fixture
async def harness(make_core: MakeCore) -> AsyncIterator[SlashHarness]:
    async with slash_harness(await make_core()) as started:
        yield started


async def test_memories_why_shows_the_receipt_to_the_caller_only(harness: SlashHarness, clock: ManualClock) -> None:
    bot = harness.bot
    core: MemoryCore = bot.services.core  # type: ignore[attr-defined]
    pipeline: ReplyPipeline = bot.services.pipeline  # type: ignore[attr-defined]
    empty = await harness.run(harness.slash("memories why", JUNO_P))
    assert empty.ephemeral and empty.content.startswith("I have not replied in this channel yet")

    tavern = await server_memory(core, "Game night voice channel is called The Tavern", guild=GUILD_ID)
    maxs = await core.save(NewMemory(MemoryList.PERSONAL, "Max is allergic to cats", by=MAX.id, via=Source.COMMAND,
                                     guild_id=GUILD_ID, owner_id=MAX.id))
    assert maxs.saved is not None
    await bot.services.documents.add(GUILD_ID, "handbook.md", HANDBOOK, Actor(ADMIN.id, can_manage=True))  # type: ignore[attr-defined]
    world = World(bot.services, pipeline, bot.services.history, bot.services.documents, bot.services.upkeep, clock)  # type: ignore[attr-defined]
    await world.say([(RIN, "hi all")], guild=GUILD_ID, channel=GENERAL_ID)
    await pipeline.chat_log.record(dataclasses.replace(  # Max writes in the channel: he takes part, his memories count
        world.message(JUNO, "hello", guild=GUILD_ID, channel=GENERAL_ID), author_id=MAX.id, author_name="Max"))
    asked = world.message(JUNO, "what time is game night?", guild=GUILD_ID, channel=GENERAL_ID)
    question = dataclasses.replace(asked, mentions=(UserRef(MAX.id, "Max"),))
    outcome = await pipeline.reply(question)  # no chat model in this bot: the receipt is kept all the same
    assert outcome.status == ReplyStatus.NO_MODEL

    shown = await harness.run(harness.slash("memories why", JUNO_P))
    assert shown.ephemeral
    text = shown.text()
    assert "On the desk (2)" in text and "Game night voice channel is called The Tavern" in text
    assert f"#{tavern}" in text and f"a personal memory about <@{MAX.id}>" in text
    assert "Max is allergic to cats" not in text  # someone else's personal memory is never quoted
    assert "“handbook.md” › Game nights" in text and "Prompt cache" in text and "Tokens" in text

    own = await harness.run(harness.slash("memories why", MAX))
    assert "yours: Max is allergic to cats" in own.text()

    reply_id = 9_123_456_789  # the bot's reply, as the chat cog records it: a message that references the question
    bot_reply = world.message(BOT, "Fridays at 8pm UTC", guild=GUILD_ID, channel=GENERAL_ID)
    await pipeline.chat_log.record(dataclasses.replace(bot_reply, message_id=reply_id, reply_to=question.message_id))
    link = f"https://discord.com/channels/{GUILD_ID}/{GENERAL_ID}/{reply_id}"
    linked = await harness.run(harness.slash("memories why", JUNO_P, message=link))
    assert f"/{question.message_id}" in linked.text() and "On the desk (2)" in linked.text()
    by_id = await harness.run(harness.slash("memories why", JUNO_P, message=str(question.message_id)))
    assert "On the desk (2)" in by_id.text()

    bad = await harness.run(harness.slash("memories why", JUNO_P, message="not a link"))
    assert bad.ephemeral and bad.content.startswith("That is not a message link or id")
    unknown = await harness.run(harness.slash("memories why", JUNO_P, message="123456789"))
    assert unknown.content.startswith("I have no receipt for that message")


async def test_stats_show_the_viewer_with_a_chart(harness: SlashHarness) -> None:
    core: MemoryCore = harness.bot.services.core  # type: ignore[attr-defined]
    for text in ("Juno's cat is called Mochi", "Game night is on Fridays", "The server was founded in 2019"):
        await server_memory(core, text, guild=GUILD_ID)
    await core.pool.execute("UPDATE memories SET days_unused = 9 WHERE text LIKE 'The server%'")
    await core.pool.execute("DELETE FROM memory_vectors WHERE memory_id = (SELECT min(id) FROM memories)")
    call = await harness.run(harness.slash("memories stats", JUNO_P))
    assert call.ephemeral
    fields = {f["name"]: f["value"] for f in call.embeds[0]["fields"]}
    assert fields["Memories"].startswith("3 of 100") and "3%" in fields["Memories"]
    assert (fields["On the desk"], fields["In the drawer"]) == ("2", "1")
    assert (fields["Waiting for a vector"], fields["Embedding unavailable"]) == ("1", "0")
    assert call.embeds[0]["image"]["url"] == "attachment://days-unused.png"
    image = Image.open(io.BytesIO(call.files["days-unused.png"]))
    assert image.size == (640, 300)

    harness.bot.services.upkeep.last_error = "openai: connection refused"  # type: ignore[attr-defined]
    call = await harness.run(harness.slash("memories stats", JUNO_P))
    fields = {f["name"]: f["value"] for f in call.embeds[0]["fields"]}
    assert (fields["Waiting for a vector"], fields["Embedding unavailable"]) == ("0", "1")
    assert fields["Why no vector can be made now"] == "openai: connection refused"

    personal = await harness.run(harness.slash("personal memories stats", JUNO_P))
    assert personal.ephemeral and "0 of 100" in personal.text()
