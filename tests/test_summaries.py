"""Channel summaries: chat days summarised at the rollover, weeks folded, carried in the prompt head, and kept
clean (privacy, edits, delete-my-data, failures). The summary model is a local OpenAI-compatible server that
answers from what it is sent, so the tests can see exactly what reached it."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import pytest

from bot.chat.messages import IncomingMessage
from bot.errors import NotAllowed
from bot.servers.models import Actor, Privacy
from bot.summaries.models import Status
from bot.summaries.writer import read_answer
from tests.fakes import FakeChatServer
from tests.recall_helpers import CHANNEL, GUILD, JUNO, OTHER_CHANNEL, RIN, SAM, World, build_world

MONDAY = date(2026, 1, 5)
ADMIN = Actor(JUNO, can_manage=True)
THREAD = 777


def summary_answer(body: dict[str, Any]) -> str:
    """What the fake summary model answers: a day is the list of what was said, a week the list of its days."""
    system, user = body["messages"][0]["content"], body["messages"][1]["content"]
    lines = user.split("\n\n", 1)[1].splitlines()
    if system.startswith("You summarise one day"):
        said = [line.split("] ", 1)[1] for line in lines]
        tags = [line.split(" ", 1)[0] for line in lines]
        facts = [{"by": tag, "about": "self", "fact": s} for tag, s in zip(tags, said, strict=True) if "promise" in s]
        return json.dumps({"summary": " | ".join(said), "facts": facts})
    parts = [json.loads(line) for line in lines]
    prefix = "week: " if "one week" in system else "day: "
    return "```json\n" + json.dumps({
        "summary": prefix + " / ".join(part["summary"] for part in parts),
        "key_details": [detail for part in parts for detail in part["key_details"]],
    }) + "\n```"


@pytest.fixture
async def summarizer() -> AsyncIterator[FakeChatServer]:
    async with FakeChatServer(responder=summary_answer, summaries_aside=False) as server:
        yield server


@pytest.fixture
async def world(make_core, clock, chat: FakeChatServer, summarizer: FakeChatServer) -> World:
    return await summary_world(make_core, clock, chat, summarizer)


async def summary_world(make_core, clock, chat: FakeChatServer, summarizer: FakeChatServer, **overrides: object) -> World:
    return await build_world(
        make_core, clock, chat.base_url, summary_base_url=summarizer.base_url, summary_model="fake-summary", **overrides
    )


async def chat_day(
    world: World, day: date, lines: Sequence[tuple[int, str]], *, channel: int = CHANNEL, thread_of: int | None = None
) -> list[IncomingMessage]:
    """Messages of one chat day, each handed to the chat service as the cog does, then the background work awaited."""
    world.clock.current = max(world.clock.current, datetime.combine(day, time(10), UTC))
    sent = []
    for author, text in lines:
        world.clock.current += timedelta(minutes=1)
        message = dataclasses.replace(world.message(author, text, channel=channel), parent_channel_id=thread_of)
        await world.services.chat.handle(message)
        await world.services.summaries.settle()
        sent.append(message)
    return sent


async def rows(world: World, channel: int = CHANNEL) -> list[dict[str, Any]]:
    async with world.core.pool.acquire() as conn:
        found = await conn.fetch(
            "SELECT id, kind, period_start, status, summary, key_details, author_ids, folded_into, stale, edited_by, retry_on"
            " FROM channel_summaries WHERE channel_id = $1 ORDER BY kind, period_start", channel,
        )
    return [dict(row) for row in found]


def day_rows(found: list[dict[str, Any]]) -> dict[date, dict[str, Any]]:
    return {row["period_start"]: row for row in found if row["kind"] == "day"}


def sent_texts(server: FakeChatServer) -> str:
    return "\n".join(m["content"] or "" for request in server.requests for m in request["messages"])


async def test_a_week_in_two_channels_gives_day_summaries_then_a_week_summary_carried_in_the_head(
    world: World, chat: FakeChatServer
) -> None:
    for offset in range(7):
        day = MONDAY + timedelta(days=offset)
        await chat_day(world, day, [(JUNO, f"hiking plan number {offset}"), (SAM, f"sounds good {offset}")])
        await chat_day(world, day, [(RIN, f"the game patch {offset} is out")], channel=OTHER_CHANNEL)
    next_monday = MONDAY + timedelta(days=7)
    await chat_day(world, next_monday, [(JUNO, "a new week of hikes")])
    await chat_day(world, next_monday, [(RIN, "a new week of games")], channel=OTHER_CHANNEL)

    for channel, own, other in ((CHANNEL, "hiking plan", "game patch"), (OTHER_CHANNEL, "game patch", "hiking plan")):
        found = await rows(world, channel)
        weeks = [row for row in found if row["kind"] == "week"]
        days = day_rows(found)
        assert len(weeks) == 1 and weeks[0]["period_start"] == MONDAY and weeks[0]["status"] == "ready"
        assert sorted(days) == [MONDAY + timedelta(days=i) for i in range(7)]  # today (next Monday) is not over yet
        assert all(row["folded_into"] == weeks[0]["id"] for row in days.values())
        assert own in weeks[0]["summary"] and other not in weeks[0]["summary"]  # summaries never leave their channel

    # Tuesday: Monday is summarised; the head carries the week, then Monday, after the desk and before the chat
    tuesday = next_monday + timedelta(days=1)
    await chat_day(world, tuesday, [(SAM, "morning all")])
    replies = []
    for text in ("Deskmate, what did we plan?", "Deskmate, and after that?"):
        world.clock.current += timedelta(minutes=5)
        replies.append(await world.services.chat.handle(world.message(JUNO, text), mentions_bot=True))
    heads = [request["messages"][0]["content"] for request in chat.requests[-2:]]
    assert heads[0] == heads[1]  # byte-identical across the replies of one day: the provider's cache holds
    head = heads[0]
    assert head.index("## Personal memories") < head.index("## Earlier in this channel") < head.index("hiking plan number 0")
    assert head.index("week: ") < head.index("a new week of hikes")
    assert "game patch" not in head and "morning all" not in head  # the other channel's days; today's chat is in the window
    receipt = replies[0].receipt if replies[0] else None
    assert receipt is not None and [s["period"] for s in receipt.summaries] == [
        "week 2026-01-05 – 2026-01-11", "Mon 2026-01-12"
    ]
    assert all(s["tokens"] > 0 for s in receipt.summaries) and receipt.tokens["summaries"] > 0


async def test_a_reply_never_waits_for_a_summary(world: World, summarizer: FakeChatServer) -> None:
    await chat_day(world, MONDAY, [(JUNO, "we adopted a kitten")])
    summarizer.stall(30)
    world.clock.current = datetime.combine(MONDAY + timedelta(days=1), time(10), UTC)
    outcome = await world.services.chat.handle(world.message(JUNO, "Deskmate, hello"), mentions_bot=True)
    assert outcome is not None and outcome.text == "ok"
    assert world.services.summaries.work._tasks  # still summarising Monday in the background
    await world.services.summaries.close()


async def test_a_failing_summary_model_leaves_a_missing_day_that_a_later_rollover_fills(
    world: World, summarizer: FakeChatServer
) -> None:
    await chat_day(world, MONDAY, [(JUNO, "I promise to bring the tent")])
    summarizer.error(500)
    await chat_day(world, MONDAY + timedelta(days=1), [(SAM, "tuesday")])
    monday = day_rows(await rows(world))[MONDAY]
    assert monday["status"] == "missing" and monday["retry_on"] == MONDAY + timedelta(days=2)
    entries = await world.services.summaries.overview(CHANNEL)
    assert any(e.period_start == MONDAY and e.state.startswith("missing") for e in entries)

    await chat_day(world, MONDAY + timedelta(days=2), [(SAM, "wednesday")])
    filled = day_rows(await rows(world))
    assert filled[MONDAY]["status"] == "ready" and "bring the tent" in filled[MONDAY]["summary"]
    assert json.loads(filled[MONDAY]["key_details"]) == ["Juno promises to bring the tent"]
    assert filled[MONDAY + timedelta(days=1)]["status"] == "ready"


async def test_a_day_followed_by_weeks_of_silence_is_summarised_when_the_channel_speaks_again(
    world: World, summarizer: FakeChatServer
) -> None:
    await chat_day(world, MONDAY, [(JUNO, "I promise to bring the tent")])
    assert world.services.settings.summary_backfill_days < 30
    await chat_day(world, MONDAY + timedelta(days=30), [(SAM, "anyone here?")])
    monday = day_rows(await rows(world))[MONDAY]
    assert monday["status"] == "ready" and "bring the tent" in monday["summary"]
    async with world.core.pool.acquire() as conn:
        noted = await conn.fetchval("SELECT count(*) FROM memories WHERE owner_id = $1 AND text LIKE '%tent%'", JUNO)
    assert noted == 1  # the day's notes were written too


async def test_an_answer_that_is_not_json_is_asked_again_then_kept_as_text(world: World, summarizer: FakeChatServer) -> None:
    await chat_day(world, MONDAY, [(JUNO, "first day")])
    summarizer.text("Sure! Here is a summary of the day.").text('{"summary": "Juno opened the channel", "key_details": []}')
    await chat_day(world, MONDAY + timedelta(days=1), [(JUNO, "second day")])
    summarizer.text("Juno talked about the second day.").text("Juno talked about the second day, again.")
    await chat_day(world, MONDAY + timedelta(days=2), [(JUNO, "third day")])
    days = day_rows(await rows(world))
    assert days[MONDAY]["summary"] == "Juno opened the channel"
    assert days[MONDAY + timedelta(days=1)]["summary"] == "Juno talked about the second day, again."
    assert json.loads(days[MONDAY + timedelta(days=1)]["key_details"]) == []


async def test_blocked_and_fully_private_people_never_reach_the_summary_model(
    world: World, summarizer: FakeChatServer
) -> None:
    await world.services.servers.set_blocked(GUILD, RIN, True)
    await world.services.servers.set_privacy(SAM, Privacy.FULL)
    await chat_day(world, MONDAY, [(JUNO, "my birthday is in May"), (SAM, "my secret diary entry"), (RIN, "spam spam spam")])
    await chat_day(world, MONDAY + timedelta(days=1), [(JUNO, "next day")])
    sent = sent_texts(summarizer)
    assert "my birthday is in May" in sent
    assert "secret diary" not in sent and "spam spam" not in sent
    assert day_rows(await rows(world))[MONDAY]["author_ids"] == [JUNO]


async def test_delete_my_data_removes_a_person_from_every_summary(world: World, summarizer: FakeChatServer) -> None:
    for offset in range(7):
        await chat_day(world, MONDAY + timedelta(days=offset), [(JUNO, f"juno's words {offset}"), (SAM, f"sam's words {offset}")])
    await chat_day(world, MONDAY + timedelta(days=7), [(SAM, "a new week")])
    assert any(row["kind"] == "week" for row in await rows(world))

    counts = await world.services.delete_user_data(JUNO)
    assert counts["summaries"] == 8  # seven days and their week
    assert all(JUNO not in row["author_ids"] and "juno" not in row["summary"] for row in await rows(world))

    summarizer.requests.clear()
    await chat_day(world, MONDAY + timedelta(days=8), [(SAM, "tuesday")])  # the next rollover writes them again, without Juno
    found = await rows(world)
    assert "juno" not in sent_texts(summarizer) and summarizer.requests
    assert len([row for row in found if row["kind"] == "day" and row["status"] == "ready"]) == 8
    assert all(row["author_ids"] == [SAM] for row in found if row["status"] == "ready")
    assert any(row["kind"] == "week" and "sam's words 3" in row["summary"] for row in found)


async def test_an_edited_message_withdraws_its_day_at_once_and_it_is_written_again(world: World, summarizer) -> None:
    sent = await chat_day(world, MONDAY, [(JUNO, "the meeting is at 5pm")])
    await chat_day(world, MONDAY + timedelta(days=1), [(SAM, "ok")])
    assert "5pm" in day_rows(await rows(world))[MONDAY]["summary"]
    summarizer.hold()  # the rewrite waits for the model: meanwhile the old words are nowhere
    await world.services.chat.edited(CHANNEL, sent[0].message_id, "the meeting is at 6pm", world.clock.now())
    assert MONDAY not in day_rows(await rows(world))
    assert "5pm" not in json.dumps(await world.services.summaries.for_prompt(CHANNEL, GUILD), default=str)
    await summarizer.wait_held()
    summarizer.release()
    await world.services.summaries.settle()
    monday = day_rows(await rows(world))[MONDAY]
    assert monday["stale"] is False and "6pm" in monday["summary"] and "5pm" not in monday["summary"]


async def test_an_edited_summary_survives_regeneration_and_stale_days(world: World) -> None:
    sent = await chat_day(world, MONDAY, [(JUNO, "we meet at the lake")])
    await chat_day(world, MONDAY + timedelta(days=1), [(SAM, "ok")])
    summaries = world.services.summaries
    monday = day_rows(await rows(world))[MONDAY]
    await summaries.edit(CHANNEL, monday["id"], "The group meets at the lake on Saturday.", ["Saturday at the lake"], ADMIN)
    with pytest.raises(NotAllowed, match="edited by hand"):
        await summaries.regenerate(CHANNEL, GUILD, monday["id"], ADMIN)
    await world.services.chat.deleted(CHANNEL, [sent[0].message_id])
    await chat_day(world, MONDAY + timedelta(days=2), [(SAM, "wednesday")])
    kept = day_rows(await rows(world))[MONDAY]
    assert kept["summary"] == "The group meets at the lake on Saturday." and kept["edited_by"] == JUNO

    await summaries.delete(CHANNEL, monday["id"], ADMIN)  # deleted: out of the prompt, not written again by itself
    await chat_day(world, MONDAY + timedelta(days=3), [(SAM, "thursday")])
    assert day_rows(await rows(world))[MONDAY]["status"] == "deleted"
    again = await summaries.regenerate(CHANNEL, GUILD, monday["id"], ADMIN)  # asked for: written from what is left
    assert again.status == Status.EMPTY and "lake" not in again.summary  # its one message was deleted


async def test_a_long_day_is_summarised_in_parts_then_combined(make_core, clock, chat, summarizer) -> None:
    world = await summary_world(make_core, clock, chat, summarizer, summary_part_tokens=60)
    long_day = [(JUNO if i % 2 else SAM, f"message number {i} about the long trip we planned") for i in range(12)]
    await chat_day(world, MONDAY, long_day)
    await chat_day(world, MONDAY + timedelta(days=1), [(JUNO, "next")])
    monday_requests = [r for r in summarizer.requests if "2026-01-05" in r["messages"][1]["content"]]
    assert len(monday_requests) >= 3 and "parts of one day" in monday_requests[-1]["messages"][0]["content"]
    summary = day_rows(await rows(world))[MONDAY]["summary"]
    assert "message number 0" in summary and "message number 11" in summary


async def test_a_thread_is_summarised_with_its_parent_and_deleting_the_channel_deletes_its_summaries(world: World) -> None:
    await chat_day(world, MONDAY, [(JUNO, "main channel talk")])
    await chat_day(world, MONDAY, [(SAM, "thread talk about tents")], channel=THREAD, thread_of=CHANNEL)
    await chat_day(world, MONDAY + timedelta(days=1), [(SAM, "next day")], channel=THREAD, thread_of=CHANNEL)
    summary = day_rows(await rows(world))[MONDAY]["summary"]
    assert "main channel talk" in summary and "thread talk about tents" in summary
    assert await rows(world, THREAD) == []
    await world.services.forget_channel(CHANNEL)
    assert await rows(world) == []


async def test_the_summary_budget_drops_the_oldest_and_the_receipt_says_so(make_core, clock, chat, summarizer) -> None:
    world = await summary_world(make_core, clock, chat, summarizer, summary_token_budget=70)
    for offset in range(3):
        await chat_day(world, MONDAY + timedelta(days=offset), [(JUNO, f"distinct topic {offset} " + "word " * 10)])
    outcome = await world.services.chat.handle(world.message(JUNO, "Deskmate?"), mentions_bot=True)
    assert outcome is not None
    receipt = outcome.receipt
    assert [s["period"] for s in receipt.summaries] == ["Tue 2026-01-06"]
    dropped = {d["key"]: d["reason"] for d in receipt.dropped}
    assert list(dropped.values()).count("summary budget") == 1
    assert "channel summaries: Tue 2026-01-06" in receipt.render()


async def test_summaries_switched_off_for_a_channel_are_neither_written_nor_shown(world: World, chat: FakeChatServer) -> None:
    await chat_day(world, MONDAY, [(JUNO, "day one")])
    await chat_day(world, MONDAY + timedelta(days=1), [(JUNO, "day two")])
    await world.services.summaries.set_enabled(CHANNEL, GUILD, False)
    await chat_day(world, MONDAY + timedelta(days=2), [(JUNO, "day three")])
    assert sorted(day_rows(await rows(world))) == [MONDAY]
    await world.services.chat.handle(world.message(JUNO, "Deskmate?"), mentions_bot=True)
    assert "## Earlier in this channel" not in chat.requests[-1]["messages"][0]["content"]


@pytest.mark.parametrize(
    ("answer", "summary", "details"),
    [
        ('{"summary": "Juno planned a hike", "key_details": ["Hike on Saturday"]}', "Juno planned a hike", ("Hike on Saturday",)),
        ('Here you go:\n```json\n{"summary": "A quiet day", "key_details": []}\n```\nAnything else?', "A quiet day", ()),
        ('{"summary": "Sam moved", "key_details": "Sam lives in Lyon now"}', "Sam moved", ("Sam lives in Lyon now",)),
        ('{"summary": "Rin", "key_details": [" spaced   out ", "", 3]}', "Rin", ("spaced out", "3")),
        ('{"summary": "A hike", "key_details": ["Hike on Saturday", "Bring wa', "A hike", ("Hike on Saturday",)),  # cut short
    ],
)
def test_a_summary_is_read_from_what_small_models_really_write(answer: str, summary: str, details: tuple[str, ...]) -> None:
    written = read_answer(answer)
    assert written is not None and (written.summary, written.key_details) == (summary, details)


def test_the_facts_of_an_answer_with_broken_json_are_read() -> None:
    # what Qwen2.5-Coder 0.5B answered for a day (its last fact closed with `"]}]`); asked again, it wrote the same
    answer = (
        '{"summary": "P1 and P2 talked about their shifts.", "facts": [{"by": "P1", "about": "self", "fact": "P1 worked as a '
        'nurse at the children\'s hospital, night shifts mostly"}, {"by": "P2", "about": "self", "fact": "P2 moved here, I '
        'live in Berlin now"}, {"by": "BOT", "about": "self", "fact": "P1 and P2 talked about their shifts."]}]'
    )
    written = read_answer(answer)
    assert written is not None and written.summary == "P1 and P2 talked about their shifts."
    assert [(f.by, f.text) for f in written.facts] == [
        ("P1", "P1 worked as a nurse at the children's hospital, night shifts mostly"),
        ("P2", "P2 moved here, I live in Berlin now"),
    ]


@pytest.mark.parametrize(
    "answer", ["The day was quiet.", '{"summary": ""}', '{"text": "x"}', "{not json}", "[1, 2]", '{"summary": "cut sh']
)
def test_an_answer_without_the_asked_json_is_not_taken_for_a_summary(answer: str) -> None:
    assert read_answer(answer) is None
