"""Withdrawal wins: a deletion, an edit, delete-my-data, a block or privacy `full` removes a person's words from the
channel summaries, also while a summary is being written (the model answers only when the test lets it), and the
bots' replies to them go with them; a private thread never feeds its parent's summaries.

Real database, real summary pipeline; the summary model is a local server that summarises what it is sent
(tests/test_summaries.py `summary_answer`), so whatever reached it shows in the stored text.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable
from datetime import UTC, date, datetime, time, timedelta

import pytest

from bot.chat.messages import IncomingMessage
from bot.servers.models import Actor, Privacy
from tests.fakes import FakeChatServer
from tests.recall_helpers import BOT, CHANNEL, GUILD, JUNO, SAM, World
from tests.test_summaries import chat_day, day_rows, rows, summarizer, summary_world  # noqa: F401  (fixture)

MONDAY = date(2026, 1, 5)
PRIVATE_THREAD = 778


@pytest.fixture
async def world(make_core, clock, chat: FakeChatServer, summarizer: FakeChatServer) -> World:  # noqa: F811
    return await summary_world(make_core, clock, chat, summarizer)


def bot_reply(world: World, answered: IncomingMessage, text: str) -> IncomingMessage:
    world.clock.current += timedelta(seconds=20)
    return dataclasses.replace(world.message(BOT, text, channel=answered.channel_id), reply_to=answered.message_id)


async def monday_with_replies(world: World) -> list[IncomingMessage]:
    """Monday: Juno and Sam talk, and the bot answers each of them repeating their words."""
    sent = await chat_day(world, MONDAY, [(JUNO, "juno's secret plan"), (SAM, "sam's plain news")])
    for answered, repeat in ((sent[0], "about juno's secret plan"), (sent[1], "about sam's plain news")):
        await world.services.chat.record(bot_reply(world, answered, repeat))
    return sent


async def start_tuesday(world: World) -> None:
    """The first message of Tuesday starts Monday's summary in the background (not awaited)."""
    world.clock.current = datetime.combine(MONDAY + timedelta(days=1), time(9), UTC)
    await world.services.chat.handle(world.message(SAM, "tuesday morning"))


async def texts_of(world: World) -> str:
    return json.dumps([{k: str(v) for k, v in row.items()} for row in await rows(world)])


async def test_a_summary_written_while_someone_deletes_their_data_does_not_bring_it_back(
    world: World, summarizer: FakeChatServer  # noqa: F811
) -> None:
    await monday_with_replies(world)
    summarizer.hold()
    await start_tuesday(world)
    await summarizer.wait_held()  # the model has Juno's words and is "thinking"
    await world.services.delete_user_data(JUNO)
    summarizer.release()
    await world.services.summaries.settle()
    monday = day_rows(await rows(world))[MONDAY]
    assert "juno" not in (await texts_of(world)) and JUNO not in monday["author_ids"]
    assert monday["status"] == "ready" and "sam's plain news" in monday["summary"]  # written again from what is left
    assert len(summarizer.requests) == 2  # the first answer was discarded
    # the bot's reply to Juno went with her data: from the log, so from every later context window
    async with world.core.pool.acquire() as conn:
        left = await conn.fetch("SELECT text FROM chat_messages WHERE channel_id = $1", CHANNEL)
    assert not [row for row in left if "juno" in row["text"]] and any("sam's" in row["text"] for row in left)


@pytest.mark.parametrize("withdrawal", ["delete", "edit", "block", "privacy full"])
async def test_a_withdrawal_while_the_day_is_summarised_wins(
    world: World, summarizer: FakeChatServer, withdrawal: str  # noqa: F811
) -> None:
    sent = await monday_with_replies(world)
    summarizer.hold()
    await start_tuesday(world)
    await summarizer.wait_held()
    actions: dict[str, Callable[[], Awaitable[object]]] = {
        "delete": lambda: world.services.chat.deleted(CHANNEL, [sent[0].message_id]),
        "edit": lambda: world.services.chat.edited(CHANNEL, sent[0].message_id, "never mind", world.clock.now()),
        "block": lambda: world.services.set_blocked(GUILD, JUNO, True, Actor(1, can_manage=True)),
        "privacy full": lambda: world.services.set_privacy(JUNO, Privacy.FULL),
    }
    await actions[withdrawal]()
    summarizer.release()
    await world.services.summaries.settle()
    monday = day_rows(await rows(world))[MONDAY]
    assert "secret plan" not in await texts_of(world)  # neither Juno's line nor the bot's reply repeating it
    assert monday["status"] == "ready" and "sam's plain news" in monday["summary"]
    if withdrawal in ("block", "privacy full"):
        assert JUNO not in monday["author_ids"]


@pytest.mark.parametrize("withdrawal", ["block", "privacy full"])
async def test_a_block_or_privacy_full_after_the_fact_removes_days_and_weeks_holding_their_words(
    world: World, summarizer: FakeChatServer, withdrawal: str  # noqa: F811
) -> None:
    for offset in range(7):
        day = MONDAY + timedelta(days=offset)
        answered = await chat_day(world, day, [(JUNO, f"juno's words {offset}"), (SAM, f"sam's words {offset}")])
        await world.services.chat.record(bot_reply(world, answered[0], f"so juno's words {offset}"))
    await chat_day(world, MONDAY + timedelta(days=7), [(SAM, "a new week")])
    assert any(row["kind"] == "week" and "juno's words" in row["summary"] for row in await rows(world))

    summarizer.hold()
    if withdrawal == "block":
        await world.services.set_blocked(GUILD, JUNO, True, Actor(1, can_manage=True))
    else:
        await world.services.set_privacy(JUNO, Privacy.FULL)
    assert "juno" not in await texts_of(world)  # at once, before anything is written again
    assert "juno" not in json.dumps(await world.services.summaries.for_prompt(CHANNEL, GUILD), default=str)
    summarizer.release()
    await world.services.summaries.settle()
    found = await rows(world)
    assert "juno" not in await texts_of(world)
    weeks = [row for row in found if row["kind"] == "week"]
    assert len(weeks) == 1 and "sam's words 3" in weeks[0]["summary"]  # the week folded again, without her
    assert all(JUNO not in row["author_ids"] for row in found)


async def test_the_bots_replies_to_someone_left_out_are_left_out_too(world: World, summarizer: FakeChatServer) -> None:  # noqa: F811
    await world.services.set_privacy(JUNO, Privacy.FULL)
    sent = await monday_with_replies(world)
    deleted_reply = bot_reply(world, sent[1], "about sam's deleted words")
    await world.services.chat.record(deleted_reply)
    await world.services.chat.deleted(CHANNEL, [sent[1].message_id])  # a reply to a deleted message goes too
    await chat_day(world, MONDAY + timedelta(days=1), [(SAM, "tuesday")])
    sent_to_model = "\n".join(m["content"] for r in summarizer.requests for m in r["messages"])
    assert "secret plan" not in sent_to_model and "deleted words" not in sent_to_model
    assert "sam's plain news" not in sent_to_model  # deleted before the day was summarised
    assert day_rows(await rows(world))[MONDAY]["status"] == "empty"  # nothing of anyone who may be summarised is left


async def test_a_week_being_folded_while_one_of_its_days_is_withdrawn_is_not_stored(
    world: World, summarizer: FakeChatServer  # noqa: F811
) -> None:
    sent = []
    for offset in range(7):
        sent += await chat_day(world, MONDAY + timedelta(days=offset), [(SAM, f"sam's words {offset}")])
    summarizer.hold()
    world.clock.current = datetime.combine(MONDAY + timedelta(days=7), time(9), UTC)
    await world.services.chat.handle(world.message(SAM, "a new week"))
    await summarizer.wait_held()  # Sunday's summary: let it through, then hold the week
    summarizer.release()
    summarizer.hold()
    await summarizer.wait_held()
    assert "one week" in summarizer.requests[-1]["messages"][0]["content"]
    await world.services.chat.deleted(CHANNEL, [sent[2].message_id])  # Wednesday's only message
    summarizer.release()
    await world.services.summaries.settle()
    assert "sam's words 2" not in await texts_of(world)


async def test_a_private_thread_never_feeds_its_parents_summaries(world: World, summarizer: FakeChatServer) -> None:  # noqa: F811
    await chat_day(world, MONDAY, [(JUNO, "public talk in the channel")])
    world.clock.current += timedelta(minutes=1)
    private = dataclasses.replace(
        world.message(SAM, "private thread talk", channel=PRIVATE_THREAD), parent_channel_id=CHANNEL, private_thread=True
    )
    await world.services.chat.handle(private)
    await chat_day(world, MONDAY + timedelta(days=1), [(JUNO, "next day")])
    await world.services.chat.handle(dataclasses.replace(
        world.message(SAM, "next day in private", channel=PRIVATE_THREAD), parent_channel_id=CHANNEL, private_thread=True
    ))
    await world.services.summaries.settle()
    parent = day_rows(await rows(world))[MONDAY]["summary"]
    assert "public talk" in parent and "private thread talk" not in parent
    assert "private thread talk" in day_rows(await rows(world, PRIVATE_THREAD))[MONDAY]["summary"]  # its own summary

    # a thread stored before the bot knew it was private: its messages leave the parent's summary when it finds out
    later = MONDAY + timedelta(days=2)
    await chat_day(world, later, [(JUNO, "wednesday in public")])
    await chat_day(world, later, [(SAM, "wednesday private words")], channel=PRIVATE_THREAD + 1, thread_of=CHANNEL)
    await chat_day(world, later + timedelta(days=1), [(JUNO, "thursday")])
    assert "wednesday private words" in day_rows(await rows(world))[later]["summary"]
    await world.services.chat.handle(dataclasses.replace(
        world.message(SAM, "now known private", channel=PRIVATE_THREAD + 1), parent_channel_id=CHANNEL, private_thread=True
    ))
    await world.services.summaries.settle()
    assert "wednesday private words" not in await texts_of(world)
    assert "wednesday in public" in day_rows(await rows(world))[later]["summary"]


@pytest.mark.parametrize("withdrawal", ["block", "privacy full"])
async def test_older_chat_holding_someone_blocked_or_fully_private_is_never_recalled(
    make_core, clock, chat: FakeChatServer, withdrawal: str
) -> None:
    from tests.recall_helpers import CHATTER, GAMES, HIKE, build_world

    world = await build_world(make_core, clock, chat.base_url, context_messages=6)
    hike = await world.say(HIKE + HIKE)  # one chunk, with Juno's words; and the bot answers Sam there, not Juno
    await world.say([*GAMES[:5], (SAM, "what did juno see on the trail?")])
    await world.services.chat.record(dataclasses.replace(  # in GAMES' chunk: the bot retelling Juno's hike to Sam
        world.message(BOT, "Juno saw tons of marmots on the hike"), reply_to=hike[4].message_id))
    await world.say(GAMES + CHATTER)
    await world.history.chunk_pending()
    await world.upkeep.rebuild()
    vector = (await world.core.embeddings.embedder.embed(["how long was that hike with the marmots?"]))[0]

    async def recalled() -> str:
        latest = (await world.core.pool.fetchval("SELECT max(message_id) FROM chat_messages WHERE channel_id = $1", CHANNEL))
        found = await world.history.search(channel_id=CHANNEL, answered_message_id=latest, query_vector=vector)
        return "\n".join(hit.text for hit in found.hits)

    assert "marmots" in await recalled()
    if withdrawal == "block":
        await world.services.set_blocked(GUILD, JUNO, True, Actor(1, can_manage=True))
    else:
        await world.services.set_privacy(JUNO, Privacy.FULL)
    assert "marmots" not in await recalled() and "Juno" not in await recalled()
    await (world.services.set_blocked(GUILD, JUNO, False, Actor(1, can_manage=True)) if withdrawal == "block"
           else world.services.set_privacy(JUNO, Privacy.NONE))
    assert "marmots" in await recalled()  # hidden, not deleted: undoing the block or the level brings them back
