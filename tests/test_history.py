"""Chat-history recall against the real database and the built-in embedder: chunk boundaries,
read-behind, recall within HISTORY_TOKEN_BUDGET, and chunks that follow edits and deletes in Discord."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from bot.chat.receipts import ReplyStatus
from bot.clock import ManualClock
from bot.history import store as history_store
from bot.history.service import CHUNK_MAX_MESSAGES, ChatRow, plan_chunks
from bot.memory.service import MemoryCore
from bot.services import memory_core
from bot.tokens import count_tokens
from tests.conftest import MakeCore
from tests.fakes import FakeChatServer
from tests.recall_helpers import CHANNEL, CHATTER, GAMES, GUILD, HIKE, JUNO, OTHER_CHANNEL, RIN, SAM, World, build_world

T0 = datetime(2026, 1, 5, 12, tzinfo=UTC)


def rows(count: int, *, start: int = 1, at: datetime = T0, text: str = "hi") -> list[ChatRow]:
    """`count` messages of Sam's, one minute apart."""
    return [ChatRow(start + i, SAM, "Sam", text, at + timedelta(minutes=i)) for i in range(count)]


def window_row(after: ChatRow, gap: timedelta) -> ChatRow:
    return ChatRow(after.message_id + 1, RIN, "Rin", "in the window", after.created_at + gap, in_window=True)


def ids(chunks: list[list[ChatRow]]) -> list[list[int]]:
    return [[row.message_id for row in chunk] for chunk in chunks]


def test_a_chunk_needs_five_messages_and_closes_at_a_pause_or_its_size() -> None:
    four = rows(4)
    assert plan_chunks([*four, window_row(four[-1], timedelta(hours=3))]) == []  # a pause, but only 4 messages
    five = rows(5)
    assert plan_chunks([*five, window_row(five[-1], timedelta(minutes=1))]) == []  # 5, no pause: waits for more
    assert ids(plan_chunks([*five, window_row(five[-1], timedelta(hours=1))])) == [[1, 2, 3, 4, 5]]  # the pause closes it

    many = rows(30)
    assert ids(plan_chunks(many)) == [list(range(1, 13)), list(range(13, 25))]  # CHUNK_MAX_MESSAGES; 6 wait
    assert CHUNK_MAX_MESSAGES == 12

    # 3 messages, a long pause, 4 more: the pause cannot close a run under 5, so one chunk of 7 closes later
    split = [*rows(3), *rows(4, start=4, at=T0 + timedelta(days=1))]
    assert ids(plan_chunks([*split, window_row(split[-1], timedelta(hours=2))])) == [list(range(1, 8))]

    long_lines = rows(6, text="word " * 90)  # ~90 tokens each: the token cap closes at the minimum of 5
    assert ids(plan_chunks(long_lines)) == [[1, 2, 3, 4, 5]]


def test_messages_freed_by_an_edit_are_chunked_again_whatever_their_number() -> None:
    before = ChatRow(1, SAM, "Sam", "old", T0, chunked=True)
    freed = rows(2, start=2)
    after = ChatRow(4, SAM, "Sam", "old", T0 + timedelta(minutes=5), chunked=True)
    assert ids(plan_chunks([before, *freed, after])) == [[2, 3]]
    assert plan_chunks([window_row(before, timedelta(minutes=1)), *rows(6, start=3)]) == []  # the window stops the scan


@pytest.fixture
async def world(make_core: MakeCore, clock: ManualClock, chat: FakeChatServer) -> AsyncIterator[World]:
    built = await build_world(make_core, clock, chat.base_url, context_messages=6)
    yield built
    await built.pipeline.model.close()


async def chunk_rows(pool: asyncpg.Pool, channel: int = CHANNEL) -> list[asyncpg.Record]:
    return await pool.fetch("SELECT * FROM history_chunks WHERE channel_id = $1 ORDER BY first_message_id", channel)


async def test_chunking_leaves_the_context_window_alone(world: World) -> None:
    messages = await world.say([(SAM, f"message number {i}") for i in range(20)])
    assert await world.history.chunk_pending() == 1
    [chunk] = await chunk_rows(world.core.pool)
    assert list(chunk["message_ids"]) == [m.message_id for m in messages[:12]]  # closed at CHUNK_MAX_MESSAGES
    assert chunk["text"].splitlines()[0] == "Sam: message number 0"
    assert (chunk["started_at"], chunk["ended_at"]) == (messages[0].created_at, messages[11].created_at)
    unchunked = await world.core.pool.fetch(
        "SELECT message_id FROM chat_messages WHERE channel_id = $1 AND chunk_id IS NULL ORDER BY message_id", CHANNEL
    )
    assert [row["message_id"] for row in unchunked] == [m.message_id for m in messages[12:]]  # 2 waiting + the window of 6

    more = await world.say([(RIN, f"later message {i}") for i in range(10)])
    assert await world.history.chunk_pending() == 1
    second = (await chunk_rows(world.core.pool))[1]
    assert list(second["message_ids"]) == [m.message_id for m in [*messages[12:], *more][:12]]
    window = {m.message_id for m in more[-6:]}
    for chunk in await chunk_rows(world.core.pool):
        assert not window & set(chunk["message_ids"])  # read-behind: the window is never chunked
    assert await world.history.chunk_pending() == 0  # nothing closes: the rest waits for more messages


async def test_a_chunk_pulled_back_into_the_window_is_not_recalled(world: World) -> None:
    """Deleting recent messages widens the window backwards over chunked messages: those chunks stay out."""
    first = await world.say(HIKE + HIKE)  # 12: one chunk
    second = await world.say(GAMES + GAMES)  # 12: a second chunk
    tail = await world.say(CHATTER)
    await world.history.chunk_pending()
    await world.upkeep.rebuild()
    [one, two] = await chunk_rows(world.core.pool)
    assert set(one["message_ids"]) == {m.message_id for m in first}
    vector = (await world.core.embeddings.embedder.embed([two["text"]]))[0]

    async def found(answered: int) -> list[int]:
        search = await world.history.search(channel_id=CHANNEL, answered_message_id=answered, query_vector=vector)
        return [hit.chunk_id for hit in search.hits]

    latest = tail[-1].message_id
    assert two["id"] in await found(latest)
    await world.pipeline.chat_log.delete(CHANNEL, [m.message_id for m in tail])  # the window is now games messages
    assert second[-1].message_id in {r["message_id"] for r in await world.core.pool.fetch(
        "SELECT message_id FROM chat_messages WHERE channel_id = $1 ORDER BY message_id DESC LIMIT 6", CHANNEL)}
    assert two["id"] not in await found(second[-1].message_id)


async def test_recall_adds_the_matching_chunk_within_the_budget(world: World, chat: FakeChatServer) -> None:
    await world.say(HIKE + HIKE + GAMES + GAMES)  # two chunks of 12
    await world.say(CHATTER)  # the context window
    await world.upkeep.rebuild()

    outcome = await world.pipeline.reply(world.message(JUNO, "remind me, how long was that hike with the marmots?"))
    assert outcome.status == ReplyStatus.REPLIED
    [item] = outcome.receipt.items("history")
    assert item["similarity"] >= world.core.settings.history_min_similarity and not item["cut"]
    final = chat.messages()[-1]["content"]
    assert "[Recalled chat history that may help" in final and "Mount Rainier" in final
    assert final.index("Mount Rainier") < final.index("[Message to answer")
    assert "Mount Rainier" not in chat.messages()[0]["content"]  # never in the cacheable head
    assert "RPG patch" not in final  # the other chunk is not relevant
    history_tokens = outcome.receipt.tail_tokens["chat_history"]
    assert history_tokens == item["tokens"] <= world.core.settings.history_token_budget

    small = await build_world(lambda **kw: _same_core(world, **kw), world.clock, chat.base_url, history_token_budget=60)
    outcome = await small.pipeline.reply(world.message(JUNO, "remind me, how long was that hike with the marmots?"))
    [item] = outcome.receipt.items("history")
    assert item["cut"] and item["tokens"] <= 60  # a long chunk is cut, never the budget exceeded
    kept = next(t for t in outcome.prompt.tail if t.key == f"history:{item['chunk_id']}")  # type: ignore[union-attr]
    assert count_tokens(kept.text) + 1 == item["tokens"] and kept.text.endswith('…"}')

    outcome = await small.pipeline.reply(world.message(SAM, "what's the weather like today?"))
    assert outcome.receipt.items("history") == []
    assert "nothing relevant" in outcome.receipt.sources["history"]["note"]
    await small.pipeline.model.close()


async def _same_core(world: World, **overrides: object) -> MemoryCore:
    """A core on the same database and embedder with other settings (a second process, as it were)."""
    settings = world.core.settings.with_overrides(**overrides)
    return memory_core(world.core.pool, world.core.embeddings.embedder, settings, world.clock)


async def test_history_recall_switch_is_per_channel_and_storing_goes_on(world: World, chat: FakeChatServer) -> None:
    await world.say(HIKE + HIKE)
    await world.say(CHATTER)
    await world.history.set_recall(CHANNEL, GUILD, False)
    await world.upkeep.rebuild()
    assert len(await chunk_rows(world.core.pool)) == 1  # still chunked and embedded while off
    outcome = await world.pipeline.reply(world.message(JUNO, "how long was the hike at Mount Rainier?"))
    assert outcome.receipt.items("history") == [] and "off in this channel" in outcome.receipt.sources["history"]["note"]
    assert "Mount Rainier" not in chat.messages()[-1]["content"].split("[Message to answer")[0]

    await world.history.set_recall(CHANNEL, GUILD, True)
    outcome = await world.pipeline.reply(world.message(JUNO, "how long was the hike at Mount Rainier?"))
    assert len(outcome.receipt.items("history")) == 1
    other = await world.pipeline.reply(world.message(JUNO, "how long was the hike at Mount Rainier?", channel=OTHER_CHANNEL))
    assert other.receipt.items("history") == []  # recall is per channel: never another channel's chat


async def test_edits_and_deletes_rebuild_or_remove_chunks(world: World) -> None:
    first = await world.say(HIKE + HIKE)
    second = await world.say(GAMES + GAMES)
    await world.say(CHATTER)
    await world.history.chunk_pending()
    [one, two] = await chunk_rows(world.core.pool)

    # an edit: the chunk goes and is rebuilt from the messages as they are now
    assert await world.pipeline.chat_log.edit(CHANNEL, first[2].message_id, "about 15 miles actually", datetime.now(UTC))
    assert [c["id"] for c in await chunk_rows(world.core.pool)] == [two["id"]]
    assert await world.history.chunk_pending() == 1
    rebuilt = (await chunk_rows(world.core.pool))[0]
    assert "Juno: about 15 miles actually" in rebuilt["text"] and rebuilt["text"].count("12 miles") == 1  # was twice
    assert list(rebuilt["message_ids"]) == list(one["message_ids"])
    same_text = await world.pipeline.chat_log.edit(CHANNEL, first[0].message_id, first[0].text, datetime.now(UTC))
    assert same_text and len(await chunk_rows(world.core.pool)) == 2  # an embed-only edit keeps the chunk

    # a delete: the chunk goes, and the rest (bounded by the next chunk) is chunked again without it
    await world.pipeline.chat_log.delete(CHANNEL, [first[4].message_id])
    assert await world.history.chunk_pending() == 1
    rebuilt = (await chunk_rows(world.core.pool))[0]
    assert first[4].message_id not in rebuilt["message_ids"] and len(rebuilt["message_ids"]) == 11
    assert rebuilt["text"].count("black bear") == 1  # the second copy of that line was deleted

    # /privacy delete-my-data: Sam's messages leave every chunk; everyone else's are chunked again
    await world.services.delete_user_data(SAM)
    assert await chunk_rows(world.core.pool) == []  # both chunks had a message of Sam's
    assert await world.core.pool.fetchval("SELECT count(*) FROM chat_messages WHERE author_id = $1", SAM) == 0
    await world.say([(RIN, "so, anyone up for a movie?"), (JUNO, "sure")] * 3)
    assert await world.history.chunk_pending() == 1
    texts = "\n".join(c["text"] for c in await chunk_rows(world.core.pool))
    assert "Sam:" not in texts and "Juno: we went hiking" in texts and "Rin: same, I lost ten hours" in texts
    assert second[1].message_id in (await chunk_rows(world.core.pool))[0]["message_ids"]

    # a deleted channel, and a server the bot left
    await world.say(HIKE + HIKE + CHATTER, channel=OTHER_CHANNEL)
    await world.history.chunk_pending()
    assert await chunk_rows(world.core.pool, OTHER_CHANNEL)
    await world.services.forget_channel(CHANNEL)
    assert await chunk_rows(world.core.pool) == [] and await chunk_rows(world.core.pool, OTHER_CHANNEL)
    counts = await world.services.forget_guild(GUILD)
    assert counts["history_chunks"] == 1 and counts["chat_messages"] == 18
    assert await chunk_rows(world.core.pool, OTHER_CHANNEL) == []


async def test_an_edit_racing_the_chunker_waits_and_removes_the_new_chunk(world: World) -> None:
    first = await world.say(HIKE + HIKE + CHATTER)
    async with world.core.pool.acquire() as conn:
        transaction = conn.transaction()
        await transaction.start()
        rows_ = [ChatRow.from_row(row) for row in await history_store.lock_history_rows(conn, CHANNEL, 6, 400)]
        [chunk] = plan_chunks(rows_)
        await history_store.insert_history_chunk(
            conn, guild_id=GUILD, channel_id=CHANNEL, message_ids=[r.message_id for r in chunk],
            author_ids=[r.author_id for r in chunk], started_at=chunk[0].created_at, ended_at=chunk[-1].created_at,
            text="stale text",
        )
        edit = asyncio.create_task(world.pipeline.chat_log.edit(CHANNEL, first[0].message_id, "edited", datetime.now(UTC)))
        await asyncio.sleep(0.3)
        assert not edit.done()  # waits for the chunker's row locks
        await transaction.commit()
    assert await edit
    assert await chunk_rows(world.core.pool) == []  # the chunk made from the old text is gone
    await world.history.chunk_pending()
    [rebuilt] = await chunk_rows(world.core.pool)
    assert rebuilt["text"].startswith("Juno: edited")
