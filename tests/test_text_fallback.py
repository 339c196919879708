"""The text fallback: when the reply's message cannot be embedded, the search has failed (nothing ages,
nothing resets, the desk stays as it was), but dormant memories, older chat and document passages that share
words with the message are still found by PostgreSQL full-text search and shown, read-only, within the usual
budgets and visibility rules, and the receipt says they were found "by text (the embedder was unavailable)".

A world with a working embedder prepares memories, chat and documents; a second pipeline on the same database,
whose embedder is down, answers. Everything against the real PostgreSQL and the real built-in embedder.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from bot.chat.receipts import Receipt, ReplyStatus
from bot.chat.sources import BY_TEXT
from bot.clock import ManualClock
from bot.embeddings.providers import NoEmbedder
from bot.memory.models import Conversation, Memory, MemoryList, NewMemory, Source
from bot.memory.service import MemoryCore
from bot.servers.models import Actor, Privacy
from bot.services import memory_core
from tests.conftest import MakeCore
from tests.fakes import FakeChatServer
from tests.recall_helpers import CHANNEL, GUILD, HIKE, JUNO, OTHER_CHANNEL, RIN, SAM, FlakyEmbedder, World, build_world

OTHER_GUILD = 700
STRANGER = 104  # never writes where the bot answers: not a participant
FILLER = [(SAM, "lol"), (RIN, "ok"), (SAM, "brb"), (RIN, "back"), (SAM, "yes"), (RIN, "no")]  # pushes chat out of the window

HANDBOOK = b"""# Game nights
We play every Friday at 8pm UTC in the voice channel. The game is picked by a poll on Wednesday.

# Minecraft
The server address is play.example.org, version 1.21. Backups run every night at 3am.
"""


@pytest.fixture
async def world(make_core: MakeCore, clock: ManualClock, chat: FakeChatServer) -> AsyncIterator[World]:
    built = await build_world(make_core, clock, chat.base_url, context_messages=6)
    yield built
    await built.pipeline.model.close()


async def embedder_down(world: World, chat: FakeChatServer, **overrides: object) -> World:
    """A second pipeline on the same database and clock whose embedder is down (the same embedding space)."""
    down = FlakyEmbedder(world.core.embeddings.embedder, ok_calls=0)
    settings = world.core.settings

    async def core(**more: object) -> MemoryCore:
        return memory_core(world.core.pool, down, settings.with_overrides(**{**more, **overrides}), world.clock)

    return await build_world(core, world.clock, chat.base_url, context_messages=6)


async def save(core: MemoryCore, text: str, **extra: Any) -> Memory:
    kind = MemoryList.PERSONAL if "owner_id" in extra else MemoryList.SERVER
    by = extra.get("owner_id", JUNO)
    request = NewMemory(kind, text, by=by, via=Source.COMMAND, by_can_manage=True, **{"guild_id": GUILD, **extra})
    result = await core.save(request)
    assert result.saved is not None, result.detail
    return result.saved


async def to_the_drawer(core: MemoryCore, *memories: Memory) -> None:
    """Put memories in the drawer as nine quiet chat days would (the counter only: the clock moves on too)."""
    await core.pool.execute("UPDATE memories SET days_unused = 9 WHERE id = ANY ($1::bigint[])", [m.id for m in memories])


async def counters(core: MemoryCore) -> dict[int, tuple[object, ...]]:
    return {m.id: (m.days_unused, m.last_used_at, m.last_aged_on, m.desk_changed_on) for m in await core.all_memories()}


def final_message(chat: FakeChatServer) -> str:
    return chat.messages()[-1]["content"]


def everything_sent(chat: FakeChatServer) -> str:
    return "\n".join(str(message["content"]) for message in chat.messages())


async def test_a_dormant_memory_the_message_names_is_in_the_prompt_and_no_counter_changed(
    world: World, chat: FakeChatServer, clock: ManualClock
) -> None:
    desk = await save(world.core, "Game night voice channel is called The Tavern")
    cat = await save(world.core, "The server's cat mascot is called Biscuit")
    bass = await save(world.core, "Juno is learning to play the bass guitar", owner_id=JUNO)
    quiet = await save(world.core, "The server's Minecraft world runs on version 1.20")
    await to_the_drawer(world.core, cat, bass, quiet)
    clock.current += timedelta(days=1)  # a later chat day: a search would age every memory it covers
    before = await counters(world.core)

    failing = await embedder_down(world, chat)
    try:
        # more words than the memory holds ("vet", "visit"): any shared word is enough
        outcome = await failing.pipeline.reply(failing.message(JUNO, "hey, how is Biscuit after the vet visit?"))
        assert outcome.status == ReplyStatus.REPLIED
        assert not outcome.recall.search_ok and outcome.recall.recalled == [] and outcome.recall.used == []
        assert [s.memory.id for s in outcome.recall.by_text] == [cat.id]
        head, final = chat.messages()[0]["content"], final_message(chat)
        assert cat.text in final and cat.text not in head
        assert "The Tavern" in head  # the desk is the desk as it stood
        assert "bass guitar" not in everything_sent(chat) and "Minecraft" not in everything_sent(chat)
        assert await counters(world.core) == before  # days_unused, last_used_at, last_aged_on: nothing moved

        receipt = outcome.receipt
        assert receipt.desk_ids == [desk.id] and not receipt.search_ok and receipt.search_failure
        [item] = receipt.recalled
        assert item == {"id": cat.id, "similarity": item["similarity"], "back": False, "by_text": True}
        assert receipt.nothing_recalled_because is None and receipt.nothing_added_because is None
        rendered = receipt.render()
        assert f"recalled from the drawer: #{cat.id} ({BY_TEXT}, text rank" in rendered and "stays in the drawer" in rendered
        assert "the search failed (the provider is down (test)); what says by text" in rendered
        stored = await failing.pipeline.chat_log.receipt(channel_id=CHANNEL)  # as /memories why reads it back
        assert stored is not None and BY_TEXT in Receipt.from_dict(json.loads(json.dumps(stored))).render()

        again = await failing.pipeline.reply(failing.message(JUNO, "and does Biscuit like the bass guitar?"))
        assert {s.memory.id for s in again.recall.by_text} == {cat.id, bass.id}
        assert again.receipt.head_same_as_previous is True  # nothing moved between desk and drawer
        assert await counters(world.core) == before
        assert (await failing.pipeline.reply(failing.message(JUNO, "lol ok"))).recall.by_text == []  # no word to go by
    finally:
        await failing.pipeline.model.close()

    # the embedder is back: the memory the fallback showed is still in the drawer, and a real search brings it back
    back = await world.pipeline.reply(world.message(JUNO, "how is our cat mascot Biscuit doing?"))
    assert back.recall.search_ok and [s.memory.id for s in back.recall.recalled][:1] == [cat.id]


async def test_the_fallback_sees_exactly_what_the_search_may_see(
    world: World, chat: FakeChatServer, clock: ManualClock, make_core: MakeCore
) -> None:
    core = world.core
    shown = [
        await save(core, "The pottery class meets on Tuesdays"),
        await save(core, "Juno glazes her pottery in blue", owner_id=JUNO, is_global=True),
        await save(core, "Pottery night is announced in this channel", channel_ids=(CHANNEL,)),
        await save(core, "The pottery kiln needs an hour to heat up", tags=("pottery",)),  # its tag is in the message
    ]
    hidden = [
        await save(core, "The pottery club of the other server sells mugs", guild_id=OTHER_GUILD),
        await save(core, "The stranger sells pottery online", owner_id=STRANGER),  # not a participant
        await save(core, "Rin collects pottery from Japan", owner_id=RIN),  # privacy full
        await save(core, "Sam broke the pottery wheel", owner_id=SAM),  # blocked in this server
        await save(core, "Pottery supplies are listed in the art channel", channel_ids=(OTHER_CHANNEL,)),
        await save(core, "The pottery glaze order is tracked with the kiln tag", tags=("kiln",)),
    ]
    await to_the_drawer(core, *shown, *hidden)
    await core.servers.update_guild_settings(GUILD, Actor(1, can_manage=True), tagging=True)
    await core.servers.set_privacy(RIN, Privacy.FULL)
    await core.servers.set_blocked(GUILD, SAM, True)
    before = await counters(core)
    question = "which pottery things do we have?"

    failing = await embedder_down(world, chat, max_recalled=20)
    try:
        await failing.say([(RIN, "I love ceramics"), (SAM, "me too")])  # both take part in the conversation
        outcome = await failing.pipeline.reply(failing.message(JUNO, question))
        found = {s.memory.id for s in outcome.recall.by_text}
        assert found == {m.id for m in shown}
        sent = everything_sent(chat)
        assert all(m.text in sent for m in shown) and not any(m.text in sent for m in hidden)
        assert await counters(core) == before
    finally:
        await failing.pipeline.model.close()

    # the same rules as the search itself: with decay off every memory the search may see is on the desk
    everything = await make_core(memory_decay_enabled=False)
    conversation = Conversation(GUILD, CHANNEL, JUNO, question, participant_ids=(RIN, SAM), context_texts=("me too",))
    visible = {m.id for m in (await everything.reply_search(conversation)).desk}
    assert visible & {m.id for m in shown + hidden} == found

    # in a DM only the author's own personal memories (unlimited to channels) can come by text
    dm = await embedder_down(world, chat)
    try:
        in_dm = await dm.pipeline.reply(dm.message(JUNO, question, guild=None))
        assert [s.memory.text for s in in_dm.recall.by_text] == ["Juno glazes her pottery in blue"]
    finally:
        await dm.pipeline.model.close()


async def test_as_many_as_a_search_recalls_within_the_memory_budget(world: World, chat: FakeChatServer) -> None:
    facts = (
        "Mochi the cat sleeps on the piano", "Mochi was adopted from a shelter in Lyon", "Mochi is afraid of the vacuum cleaner",
        "Mochi eats salmon treats on Sundays", "Mochi has a sister named Yuzu",
    )
    memories = [await save(world.core, fact) for fact in facts]
    await to_the_drawer(world.core, *memories)

    two = await embedder_down(world, chat, max_recalled=2)
    only_used = await embedder_down(world, chat, max_recalled=0, max_used=3)
    tight = await embedder_down(world, chat, memory_token_budget=60)
    try:
        outcome = await two.pipeline.reply(two.message(JUNO, "tell me about Mochi"))
        assert len(outcome.recall.by_text) == 2 and len(outcome.receipt.recalled) == 2
        outcome = await only_used.pipeline.reply(only_used.message(JUNO, "tell me about Mochi"))
        assert len(outcome.recall.by_text) == 3  # MAX_RECALLED=0: as many as the search may use

        outcome = await tight.pipeline.reply(tight.message(JUNO, "tell me about Mochi"))
        assert outcome.prompt is not None
        shown = [item for item in outcome.prompt.tail if item.is_memory]
        assert 0 < len(shown) < len(outcome.recall.by_text)  # the budget held: some were left out
        assert outcome.prompt.tokens.tail <= 60
        assert {d.reason for d in outcome.prompt.dropped} == {"memory budget: tail share"}
        assert {item["id"] for item in outcome.receipt.recalled} == {item.memory_id for item in shown}
    finally:
        for built in (two, only_used, tight):
            await built.pipeline.model.close()


async def test_older_chat_and_document_passages_are_found_by_text(world: World, chat: FakeChatServer) -> None:
    await world.documents.add(GUILD, "handbook.md", HANDBOOK, Actor(JUNO, can_manage=True))
    secret = b"# Minecraft\nThe other server's address is hidden.example.org.\n"
    await world.documents.add(OTHER_GUILD, "secret.md", secret, Actor(JUNO, can_manage=True))
    await world.say(HIKE + HIKE + FILLER)
    await world.say(HIKE + HIKE + FILLER, channel=OTHER_CHANNEL)
    await world.history.chunk_pending()
    chunks = await world.core.pool.fetch("SELECT id, channel_id FROM history_chunks ORDER BY id")
    here = {row["id"] for row in chunks if row["channel_id"] == CHANNEL}
    assert here and len(chunks) > len(here)

    failing = await embedder_down(world, chat, history_max_results=5)
    try:
        outcome = await failing.pipeline.reply(failing.message(JUNO, "how long was the hike with the marmots?"))
        history = outcome.receipt.items("history")
        assert history and {item["chunk_id"] for item in history} <= here  # this channel's chunks only
        assert all(item["by_text"] for item in history)
        assert "marmots" in final_message(chat)
        assert outcome.receipt.sources["history"]["by_text"] is True
        assert sum(item["tokens"] for item in history) <= failing.core.settings.history_token_budget
        rendered = outcome.receipt.render()
        assert f"chat history: chunk #{history[0]['chunk_id']}" in rendered and BY_TEXT in rendered
        assert outcome.receipt.sources["documents"]["note"].startswith("the search failed")
        assert BY_TEXT in outcome.receipt.sources["documents"]["note"]  # nothing in the handbook about marmots

        outcome = await failing.pipeline.reply(failing.message(RIN, "what's the minecraft server address?"))
        [passage] = [item for item in outcome.receipt.items("documents") if item["section"] == "Minecraft"]
        assert passage["document"] == "handbook.md" and passage["by_text"] is True
        assert "play.example.org" in final_message(chat) and "hidden.example.org" not in final_message(chat)
        assert f"“handbook.md” › Minecraft (passage #{passage['passage_id']}, {BY_TEXT}" in outcome.receipt.render()

        in_dm = await failing.pipeline.reply(failing.message(JUNO, "what's the minecraft server address?", guild=None))
        assert in_dm.receipt.items("documents") == []  # documents belong to servers, by text too

        await failing.history.set_recall(CHANNEL, GUILD, False)
        off = await failing.pipeline.reply(failing.message(JUNO, "were there marmots on the hike?"))
        assert off.receipt.items("history") == [] and "off in this channel" in off.receipt.sources["history"]["note"]
    finally:
        await failing.pipeline.model.close()


async def test_the_budgets_hold_for_what_is_found_by_text(world: World, chat: FakeChatServer) -> None:
    await world.say(HIKE + HIKE + HIKE + FILLER)
    await world.history.chunk_pending()
    failing = await embedder_down(world, chat, history_token_budget=80, history_max_results=5)
    try:
        outcome = await failing.pipeline.reply(failing.message(JUNO, "how long was the hike with the marmots?"))
        history = outcome.receipt.items("history")
        assert len(history) == 1 and history[0]["cut"] and history[0]["tokens"] <= 80
        assert outcome.receipt.tail_tokens["chat_history"] <= 80
    finally:
        await failing.pipeline.model.close()


async def test_a_failing_fallback_never_costs_the_reply(world: World, chat: FakeChatServer) -> None:
    await world.documents.add(GUILD, "handbook.md", HANDBOOK, Actor(JUNO, can_manage=True))
    await world.say(HIKE + HIKE + FILLER)
    await world.history.chunk_pending()
    pool = world.core.pool
    failing = await embedder_down(world, chat)
    try:
        await pool.execute("ALTER TABLE history_chunks RENAME COLUMN terms TO terms_elsewhere")
        await pool.execute("ALTER TABLE document_passages RENAME COLUMN terms TO terms_elsewhere")
        outcome = await failing.pipeline.reply(failing.message(JUNO, "minecraft address and the marmots on the hike?"))
        assert outcome.status == ReplyStatus.REPLIED and outcome.chunks == ["ok"]
        for source in ("history", "documents"):
            note = outcome.receipt.sources[source]["note"]
            assert note.startswith("the search failed") and "failed too" in note, note
    finally:
        await pool.execute("ALTER TABLE history_chunks RENAME COLUMN terms_elsewhere TO terms")
        await pool.execute("ALTER TABLE document_passages RENAME COLUMN terms_elsewhere TO terms")
        await failing.pipeline.model.close()


async def test_chunks_and_passages_carry_their_words(world: World) -> None:
    """The words are kept by the database however a row is written (migration 010), as memories' are."""
    await world.documents.add(GUILD, "handbook.md", HANDBOOK, Actor(JUNO, can_manage=True))
    await world.say(HIKE + HIKE + FILLER)
    await world.history.chunk_pending()
    pool = world.core.pool
    assert await pool.fetchval("SELECT bool_and(terms @@ 'marmot'::tsquery) FROM history_chunks WHERE text LIKE '%marmots%'")
    assert await pool.fetchval("SELECT count(*) FROM document_passages WHERE terms @@ 'minecraft'::tsquery") == 1
    assert await pool.fetchval("SELECT count(*) FROM history_chunks WHERE terms IS NULL") == 0


async def test_without_an_embedder_documents_are_found_by_their_words(
    make_core: MakeCore, clock: ManualClock, chat: FakeChatServer
) -> None:
    """EMBEDDING_PROVIDER=none: every memory stays on the desk, and documents can still be quoted, by text."""
    world = await build_world(lambda **kw: make_core(embedder=NoEmbedder(), **kw), clock, chat.base_url, context_messages=6)
    try:
        await world.documents.add(GUILD, "handbook.md", HANDBOOK, Actor(JUNO, can_manage=True))
        outcome = await world.pipeline.reply(world.message(RIN, "what's the minecraft server address?"))
        assert not outcome.recall.search_ok and outcome.recall.by_text == []
        assert [item["section"] for item in outcome.receipt.items("documents")] == ["Minecraft"]
        assert "play.example.org" in final_message(chat)
    finally:
        await world.pipeline.model.close()
