"""Day-end notes: what a finished chat day taught becomes memories, attributed by speaker tag to the right person,
under every rule of a save, with one notice per day, and never from words that were withdrawn.

Against the real database, the real built-in embedder, and a scripted summary model (a local OpenAI-compatible
server answering what each test scripts): the tests check what the code keeps of the model's answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import pytest

from bot.chat.messages import IncomingMessage
from bot.chat.notices import Notices
from bot.memory.lists import MemoryView, VectorStatus
from bot.memory.models import Memory, MemoryList, Source, VersionVia
from bot.servers.models import Actor, Privacy
from bot.summaries.writer import DAY_INSTRUCTIONS, WEEK_INSTRUCTIONS, echoes, looks_like_json
from tests.fakes import FakeChatServer
from tests.recall_helpers import CHANNEL, GUILD, JUNO, NAMES, RIN, SAM, World, build_world

BAU = 104
NAMES[BAU] = "Bau"
MONDAY = date(2026, 1, 5)


def facts(*items: tuple[str, str, str] | tuple[str, str, str, str], summary: str = "A day of chat.") -> str:
    """A day's answer: (by, about, fact[, replaces]) for each fact."""
    return json.dumps(
        {
            "summary": summary,
            "facts": [
                {"by": by, "about": about, "fact": fact, **({"replaces": extra[0]} if extra else {})}
                for by, about, fact, *extra in items
            ],
        }
    )


@pytest.fixture
async def summarizer() -> AsyncIterator[FakeChatServer]:
    async with FakeChatServer(default_text=facts(), summaries_aside=False) as server:
        yield server


@pytest.fixture
async def world(make_core, clock, chat: FakeChatServer, summarizer: FakeChatServer) -> World:
    return await notes_world(make_core, clock, chat, summarizer)


async def notes_world(make_core, clock, chat: FakeChatServer, summarizer: FakeChatServer, **overrides: object) -> World:
    world = await build_world(  # a generous reply deadline: a loaded machine must not fail a test on time
        make_core, clock, chat.base_url, summary_base_url=summarizer.base_url, summary_model="fake-summary",
        **{"chat_timeout_s": 60.0, **overrides},
    )
    world.services.summaries.notes.listener = Told()
    return world


class Told:
    """The adapter's side of the day's notice: what it was asked to post, and where."""

    def __init__(self) -> None:
        self.notices: list[tuple[int, int | None, Notices]] = []

    async def __call__(self, channel_id: int, guild_id: int | None, notices: Notices) -> None:
        self.notices.append((channel_id, guild_id, notices))


def told(world: World) -> Told:
    listener = world.services.summaries.notes.listener
    assert isinstance(listener, Told)
    return listener


async def say(
    world: World, day: date, lines: Sequence[tuple[int, str]], *, settle: bool = True, **extra: Any
) -> list[IncomingMessage]:
    """Messages of one chat day, handed to the chat service as the cog does (the background work awaited)."""
    world.clock.current = max(world.clock.current, datetime.combine(day, time(10), UTC))
    sent = []
    for author, text in lines:
        world.clock.current += timedelta(minutes=1)
        message = dataclasses.replace(world.message(author, text), **extra)
        await world.services.chat.handle(message)
        if settle:
            await world.services.summaries.settle()
        sent.append(message)
    return sent


async def end_day(world: World, day: date) -> None:
    """The next chat day's first message: the day before is summarised (and noted) in the background."""
    await say(world, day + timedelta(days=1), [(SAM, "good morning")])


def day_request(server: FakeChatServer, day: date, *, last: bool = False) -> str:
    bodies = [r["messages"][1]["content"] for r in server.requests if r["messages"][0]["content"] == DAY_INSTRUCTIONS]
    found = [body for body in bodies if day.isoformat() in body.split("\n", 1)[0]]
    return found[-1] if last else found[0]


async def memories(world: World) -> list[Memory]:
    return await world.core.all_memories()


async def key_details(world: World, day: date) -> list[str]:
    async with world.core.pool.acquire() as conn:
        raw = await conn.fetchval(
            "SELECT key_details FROM channel_summaries WHERE channel_id = $1 AND kind = 'day' AND period_start = $2",
            CHANNEL, day,
        )
    return json.loads(raw) if isinstance(raw, str) else list(raw or [])


async def test_facts_become_memories_of_the_person_who_said_them_and_never_of_someone_else(
    world: World, summarizer: FakeChatServer
) -> None:
    await say(world, MONDAY, [
        (JUNO, "my cat is called Mochi, she is a tabby"),
        (BAU, "my birthday is on March 3, I'm turning 30"),
        (JUNO, "honestly Bau is a cheater who steals from his coworkers"),
        (BAU, "game night is every Friday at 8pm on this server, don't forget"),
    ])
    summarizer.text(facts(
        ("P1", "self", "Juno's cat is called Mochi"),
        ("P1", "self", "Juno's birthday is on March 3"),  # Bau said it: not Juno's
        ("P1", "self", "Bau is a cheater who steals from his coworkers"),  # a claim about another person
        ("P1", "self", "Bau's birthday is on March 3"),  # the wrong tag: Bau's own line decides whose it is
        ("Bau", "server", "Game night is every Friday at 8pm"),  # a name instead of a tag: a hint, as a tag is
        ("BOT", "self", "Deskmate likes everyone"),
        ("Juno", "self", "Juno plays the violin"),  # nobody said it
        ("P7", "self", "Someone plays chess"),
    ))
    await end_day(world, MONDAY)

    sent = day_request(summarizer, MONDAY)
    assert "Speakers: P1 = Juno; P2 = Bau; BOT = the bot" in sent
    assert "P1 [10:01] Juno: my cat is called Mochi" in sent and "P2 [10:02] Bau: my birthday is on March 3" in sent
    found = {(m.list, m.owner_id, m.text, m.source, m.created_by) for m in await memories(world)}
    assert found == {
        (MemoryList.PERSONAL, JUNO, "Juno's cat is called Mochi", Source.NOTES, JUNO),
        (MemoryList.PERSONAL, BAU, "Bau's birthday is on March 3", Source.NOTES, BAU),
        (MemoryList.SERVER, None, "Game night is every Friday at 8pm", Source.NOTES, BAU),
    }
    # the summary's key details follow the same rules: the claim about Bau is not one
    assert await key_details(world, MONDAY) == [
        "Juno's cat is called Mochi", "Bau's birthday is on March 3", "Game night is every Friday at 8pm"
    ]
    checked = world.services.summaries.notes.last[(CHANNEL, MONDAY)]
    reasons = {fact.text: why for fact, why in checked.dropped}
    assert reasons["Juno's birthday is on March 3"] == "names someone else than the person who said it"
    assert reasons["Bau is a cheater who steals from his coworkers"] == "names someone else than the person who said it"
    assert reasons["Deskmate likes everyone"] == "the bot's words are never a source"
    assert reasons["Juno plays the violin"] == reasons["Someone plays chess"] == "not supported by one person's own lines"


async def test_the_bots_lines_are_never_a_source(world: World, summarizer: FakeChatServer) -> None:
    await say(world, MONDAY, [(JUNO, "what do you think of my plans?")])
    await world.services.chat.record(
        dataclasses.replace(world.message(9000, "Juno, I remember you are moving to Rome next month!"), is_bot=True)
    )
    summarizer.text(facts(("P1", "self", "Juno is moving to Rome next month")))
    await end_day(world, MONDAY)
    sent = day_request(summarizer, MONDAY)
    assert re.search(r"^BOT \[\d\d:\d\d\] Deskmate: Juno, I remember you are moving to Rome", sent, re.MULTILINE)
    assert await memories(world) == []  # only the bot said it


async def test_nothing_about_people_with_privacy_or_blocked_and_nothing_when_self_teaching_is_off(
    world: World, summarizer: FakeChatServer
) -> None:
    await world.services.servers.set_privacy(RIN, Privacy.PARTIAL)
    await world.services.servers.set_blocked(GUILD, BAU, True)
    await say(world, MONDAY, [
        (RIN, "I live in Madrid now"),
        (JUNO, "I started a pottery class"),
        (BAU, "I have a dog named Pixel"),
        (JUNO, "Rin told me she loves paella, and Bau's dog Pixel is cute"),
    ])
    summarizer.text(facts(
        ("P1", "self", "Rin lives in Madrid"),
        ("P2", "self", "Juno started a pottery class"),
        ("P2", "server", "Rin loves paella"),
        ("P2", "server", "Bau has a dog named Pixel"),
    ))
    await end_day(world, MONDAY)
    sent = day_request(summarizer, MONDAY)
    assert "Pixel" not in sent.split("\n\n", 1)[1].replace("Bau's dog Pixel", "")  # a blocked person's lines are left out
    assert [(m.owner_id, m.text) for m in await memories(world)] == [(JUNO, "Juno started a pottery class")]
    assert "Rin lives in Madrid" in await key_details(world, MONDAY)  # a summary may say it; a memory may not

    await world.services.servers.update_guild_settings(GUILD, Actor(1, can_manage=True), self_teaching=False)
    tuesday = MONDAY + timedelta(days=1)
    await say(world, tuesday, [(JUNO, "I also adopted a hamster called Bean")])
    summarizer.text(facts(("P2", "self", "Juno adopted a hamster called Bean")))
    await end_day(world, tuesday)
    assert len(await memories(world)) == 1  # self-teaching off: no notes
    assert await key_details(world, tuesday) == ["Juno adopted a hamster called Bean"]


async def test_a_correction_updates_the_memory_keeping_the_old_text_and_an_unrelated_one_is_saved_beside(
    world: World, summarizer: FakeChatServer
) -> None:
    await say(world, MONDAY, [(JUNO, "I live in Berlin, and my cat is called Mochi")])
    summarizer.text(facts(("P1", "self", "Juno lives in Berlin"), ("P1", "self", "Juno's cat is called Mochi")))
    await end_day(world, MONDAY)
    berlin = next(m for m in await memories(world) if "Berlin" in m.text)
    mochi = next(m for m in await memories(world) if "Mochi" in m.text)

    tuesday = MONDAY + timedelta(days=2)
    await say(world, tuesday, [
        (JUNO, "big news: I moved to Lisbon last week"),
        (JUNO, "my cat Mochi hates the new flat, so now I play chess on weekends"),
    ])
    summarizer.responder = respond_with_refs
    await end_day(world, tuesday)
    sent = day_request(summarizer, tuesday)
    assert re.search(r"M\d \(P1\): Juno lives in Berlin", sent) and re.search(r"M\d \(P1\): Juno's cat is called Mochi", sent)

    now = {m.id: m for m in await memories(world)}
    assert now[berlin.id].text == "Juno moved to Lisbon" and now[berlin.id].source == Source.NOTES
    assert now[mochi.id].text == "Juno's cat is called Mochi"  # the chess fact did not erase the cat
    assert any(m.text == "Juno plays chess on weekends" and m.owner_id == JUNO for m in now.values())
    page = await world.services.memories.versions.page(await world.services.memories.personal_list(JUNO, GUILD), berlin.id)
    (version,) = page.versions
    assert (version.text, version.replaced_via, version.replaced_by) == ("Juno lives in Berlin", VersionVia.NOTES, JUNO)
    assert version.reason == f"day-end notes of Wed {tuesday.isoformat()}"
    lines = told(world).notices[-1][2].lines
    assert lines[0] == "🗒️ What I noted from Wed 2026-01-07: 1 new memory, 1 updated"
    assert f"✏️ Updated a personal memory about Juno (#{berlin.id})" in lines


def respond_with_refs(body: dict[str, Any]) -> str:
    """Tuesday's answer: the move replaces the Berlin memory; the chess fact claims to replace the cat (wrongly)."""
    content = body["messages"][1]["content"]
    refs = {text: ref for ref, text in re.findall(r"^(M\d+) \(P\d+\): (.*)$", content, re.MULTILINE)}
    return facts(
        ("P1", "self", "Juno moved to Lisbon", refs.get("Juno lives in Berlin", "")),
        ("P1", "self", "Juno plays chess on weekends", refs.get("Juno's cat is called Mochi", "")),
    )


async def test_a_message_deleted_while_the_day_is_being_read_leaves_no_note_and_a_later_deletion_takes_it_back(
    world: World, summarizer: FakeChatServer
) -> None:
    sent = await say(world, MONDAY, [(JUNO, "I work as a nurse at the city hospital"), (JUNO, "my cat is called Mochi")])
    answer = facts(("P1", "self", "Juno works as a nurse at the city hospital"), ("P1", "self", "Juno's cat is called Mochi"))
    again = facts(("P1", "self", "Juno works as a nurse at the city hospital"), ("P1", "self", "Juno's cat is called Mochi"))
    summarizer.stall(1.5, then_text=answer).text(again)  # the day is read again without the deleted line
    await say(world, MONDAY + timedelta(days=1), [(SAM, "good morning")], settle=False)
    await asyncio.sleep(0.5)  # the summary model is writing
    await world.services.chat.deleted(CHANNEL, [sent[0].message_id])  # Juno takes her job back meanwhile
    await world.services.summaries.settle()
    assert "nurse" not in day_request(summarizer, MONDAY, last=True)
    # nothing was stored from the first answer; the second one's nurse has no line of Juno's behind it any more
    assert [m.text for m in await memories(world)] == ["Juno's cat is called Mochi"]

    await world.services.chat.deleted(CHANNEL, [sent[1].message_id])  # and later the cat: its note goes with it
    assert await memories(world) == []


async def test_delete_my_data_takes_back_every_note_from_the_persons_words(world: World, summarizer: FakeChatServer) -> None:
    await say(world, MONDAY, [(JUNO, "I live in Berlin"), (JUNO, "our book club meets every Monday at 7pm")])
    summarizer.text(facts(("P1", "self", "Juno lives in Berlin"), ("P1", "server", "The book club meets every Monday at 7pm")))
    await end_day(world, MONDAY)
    assert len(await memories(world)) == 2
    await world.services.delete_user_data(JUNO)
    assert await memories(world) == []  # her personal note, and the server note made of her words


async def test_the_days_notice_is_one_and_follows_the_servers_notice_settings(world: World, summarizer: FakeChatServer) -> None:
    await world.services.servers.update_guild_settings(
        GUILD, Actor(1, can_manage=True), notice_verbosity="verbose", notices="log", log_channel_id=777
    )
    await say(world, MONDAY, [(JUNO, "I play the cello"), (JUNO, "the server's movie night is on Saturdays")])
    summarizer.text(facts(("P1", "self", "Juno plays the cello"), ("P1", "server", "Movie night is on Saturdays")))
    await end_day(world, MONDAY)
    ((channel, guild, notices),) = told(world).notices
    assert (channel, guild, notices.destination, notices.log_channel_id) == (CHANNEL, GUILD, "log", 777)
    ids = {m.text: m.id for m in await memories(world)}
    assert notices.lines == (
        "🗒️ What I noted from Mon 2026-01-05: 2 new memories",
        f"📝 Saved a personal memory about Juno (#{ids['Juno plays the cello']})",  # personal text never in a server notice
        f"📝 Saved a server memory (#{ids['Movie night is on Saturdays']}): “Movie night is on Saturdays”",
    )

    await world.services.servers.update_guild_settings(GUILD, Actor(1, can_manage=True), notices="hidden")
    tuesday = MONDAY + timedelta(days=1)
    await say(world, tuesday, [(JUNO, "I also play the piano")])
    summarizer.text(facts(("P2", "self", "Juno plays the piano")))  # Sam's "good morning" opened the day: P1
    await end_day(world, tuesday)
    assert told(world).notices[-1][2].destination == "hidden"  # the adapter posts nothing; the receipt of the day is the log
    wednesday = MONDAY + timedelta(days=2)
    await say(world, wednesday, [(JUNO, "nothing new today")])
    await end_day(world, wednesday)
    assert len(told(world).notices) == 2  # a day that noted nothing says nothing


async def test_a_days_notes_are_written_once_and_never_for_an_older_day(world: World, summarizer: FakeChatServer) -> None:
    await say(world, MONDAY, [(JUNO, "I am learning Japanese")])
    summarizer.text(facts(("P1", "self", "Juno is learning Japanese")))
    await end_day(world, MONDAY)
    assert len(await memories(world)) == 1
    (monday,) = [s for s in await world.services.summaries.overview(CHANNEL) if s.summary and s.period_start == MONDAY]
    assert monday.summary is not None
    await world.services.memories.delete(
        await world.services.memories.personal_list(JUNO, GUILD), (await memories(world))[0].id, actor=Actor(JUNO)
    )
    summarizer.text(facts(("P1", "self", "Juno is learning Japanese")))
    # rewritten: not noted again
    await world.services.summaries.regenerate(CHANNEL, GUILD, monday.summary.id, Actor(1, can_manage=True))
    assert await memories(world) == []


@pytest.mark.parametrize("mode", ["tools", "daily"])
async def test_memory_notes_chooses_who_writes_memories(make_core, clock, chat: FakeChatServer, summarizer, mode: str) -> None:
    world = await notes_world(make_core, clock, chat, summarizer, memory_notes=mode)
    await say(world, MONDAY, [(JUNO, "I am learning Japanese")])
    summarizer.text(facts(("P1", "self", "Juno is learning Japanese")))
    await end_day(world, MONDAY)
    assert len(await memories(world)) == (0 if mode == "tools" else 1)
    await world.services.chat.handle(world.message(JUNO, "Deskmate, hi"), mentions_bot=True)
    assert bool(chat.requests[-1].get("tools")) == (mode == "tools")  # daily: the reply's tools are not offered


async def test_a_week_folds_the_corrected_facts(world: World, summarizer: FakeChatServer) -> None:
    await say(world, MONDAY, [(JUNO, "I live in Berlin")])
    summarizer.text(facts(("P1", "self", "Juno lives in Berlin")))
    await end_day(world, MONDAY)
    wednesday = MONDAY + timedelta(days=2)
    await say(world, wednesday, [(JUNO, "I moved to Lisbon last week!")])
    summarizer.responder = lambda body: facts(("P1", "self", "Juno moved to Lisbon", "M1"))
    await end_day(world, wednesday)
    assert [m.text for m in await memories(world)] == ["Juno moved to Lisbon"]
    summarizer.responder = None
    await say(world, MONDAY + timedelta(days=7), [(SAM, "a new week")])  # the week of Monday is folded
    week = next(r for r in summarizer.requests if "one week" in r["messages"][0]["content"])["messages"][1]["content"]
    assert "Juno moved to Lisbon" in week and "Juno lives in Berlin" not in week.split("\n\n", 1)[1].split('"summary"')[0]


def every_line_a_fact(body: dict[str, Any]) -> str:
    """A model that notes everything anyone said about themselves (the code decides what may be kept)."""
    lines = body["messages"][1]["content"].split("\n\n", 1)[1].splitlines()
    spoken = [re.match(r"(P\d+) \[[^\]]*\](?: \(in a thread\))? ([^:]+): (.*)", line) for line in lines]
    return facts(*((m[1], "self", f"{m[2]}: {m[3]}") for m in spoken if m))


async def test_nothing_said_in_a_private_thread_becomes_a_memory(world: World, summarizer: FakeChatServer) -> None:
    summarizer.responder = every_line_a_fact
    thread = {"channel_id": 777, "parent_channel_id": CHANNEL, "private_thread": True}
    await say(world, MONDAY, [(JUNO, "my cat is called Mochi")])
    await say(world, MONDAY, [(JUNO, "just between us: I am quitting my job in March")], **thread)
    tuesday = MONDAY + timedelta(days=1)
    await say(world, tuesday, [(JUNO, "morning!")], **thread)  # the thread's own day ends too
    await end_day(world, MONDAY)
    sent = [r["messages"][1]["content"] for r in summarizer.requests]
    assert all("quitting" not in body for body in sent if "Mochi" in body)  # never in the parent's transcript
    assert any("quitting" in body for body in sent)  # the thread's own summary has it, and only there
    assert [m.text for m in await memories(world)] == ["Juno's cat is called Mochi"]


def test_an_echo_of_the_instructions_or_raw_json_is_never_a_summary() -> None:
    assert echoes("The week's main threads in a few sentences.", WEEK_INSTRUCTIONS)
    assert echoes("what was talked about, in a few sentences, naming who said what", DAY_INSTRUCTIONS)
    assert not echoes("Ravi grows tomatoes on his balcony, and Bau plays the cello.", DAY_INSTRUCTIONS)  # an example is no echo
    assert looks_like_json('{"summary": "x"}') and looks_like_json('Summary: "key_details": []')
    assert looks_like_json('["a", "b"]') and not looks_like_json("[10:02] Juno planned a picnic")


async def test_an_echo_is_asked_again_and_a_second_one_leaves_the_day_missing(world: World, summarizer: FakeChatServer) -> None:
    await say(world, MONDAY, [(JUNO, "we planned a picnic for Saturday")])
    summarizer.text(json.dumps({"summary": "what was talked about, in a few sentences, naming who said what", "facts": []}))
    summarizer.text(facts(summary="Juno planned a picnic for Saturday."))
    await end_day(world, MONDAY)
    tuesday = MONDAY + timedelta(days=1)
    await say(world, tuesday, [(JUNO, "rain today")])
    summarizer.text('{"summary": "{\\"summary\\": \\"rain\\"}"}').text('```json\n{"facts": []}\n```')
    await end_day(world, tuesday)
    async with world.core.pool.acquire() as conn:
        found = {row["period_start"]: (row["status"], row["summary"]) for row in await conn.fetch(
            "SELECT period_start, status, summary FROM channel_summaries WHERE channel_id = $1 AND kind = 'day'", CHANNEL)}
    assert found[MONDAY] == ("ready", "Juno planned a picnic for Saturday.")
    assert found[tuesday][0] == "missing"  # retried at a later rollover, never stored as an echo or raw JSON


def test_lists_and_receipts_say_a_memory_came_from_the_day_end_notes() -> None:
    from cogs.receipts import _memory_line
    from cogs.ui import memory_meta

    now = datetime(2026, 1, 6, tzinfo=UTC)
    note = Memory(
        id=7, list=MemoryList.SERVER, guild_id=GUILD, owner_id=None, persona_id=1, text="Game night is on Fridays",
        tags=(), channel_ids=(), source=Source.NOTES, protected=False, days_unused=0, last_aged_on=now.date(),
        last_used_at=None, created_by=JUNO, created_at=now, updated_at=now,
    )
    assert "from day-end notes" in _memory_line(note, 7, JUNO, "on the desk")
    view = MemoryView(note, dormant=False, vector=VectorStatus.EMBEDDED)
    assert "from day-end notes" in memory_meta(view)


def week_with_a_claim(body: dict[str, Any]) -> str:
    """Days: the facts the transcript holds. The week: a model that folds in a claim the days' checks dropped."""
    if body["messages"][0]["content"] == WEEK_INSTRUCTIONS:
        return json.dumps({"summary": "Juno talked about her cat.", "key_details": [
            "Juno's cat is called Mochi", "Bau is a cheater who steals from his coworkers"]})
    if "Bau is a cheater" not in body["messages"][1]["content"]:
        return facts()
    return facts(("P1", "self", "Juno's cat is called Mochi"), ("P1", "self", "Bau is a cheater who steals from his coworkers"))


async def test_a_claim_about_someone_else_is_never_a_key_detail_of_the_week(world: World, summarizer: FakeChatServer) -> None:
    summarizer.responder = week_with_a_claim
    await say(world, MONDAY, [(JUNO, "my cat is called Mochi"), (JUNO, "honestly Bau is a cheater who steals from his coworkers"),
                              (BAU, "that is not true")])
    await end_day(world, MONDAY)
    assert await key_details(world, MONDAY) == ["Juno's cat is called Mochi"]
    await say(world, MONDAY + timedelta(days=7), [(SAM, "a new week")])  # the week of Monday is folded
    week = next(r for r in summarizer.requests if r["messages"][0]["content"] == WEEK_INSTRUCTIONS)["messages"][1]["content"]
    assert "cheater" not in week  # the days hand the week only their checked facts
    async with world.core.pool.acquire() as conn:
        raw = await conn.fetchval(
            "SELECT key_details FROM channel_summaries WHERE channel_id = $1 AND kind = 'week' AND period_start = $2",
            CHANNEL, MONDAY,
        )
    assert (json.loads(raw) if isinstance(raw, str) else list(raw)) == ["Juno's cat is called Mochi"]
    assert [(m.owner_id, m.text) for m in await memories(world)] == [(JUNO, "Juno's cat is called Mochi")]


async def test_nothing_is_noted_from_a_person_whose_privacy_is_full(world: World, summarizer: FakeChatServer) -> None:
    await world.services.servers.set_privacy(RIN, Privacy.FULL)
    summarizer.responder = every_line_a_fact
    await say(world, MONDAY, [(RIN, "I live in Madrid now"), (JUNO, "I started a pottery class")])
    await end_day(world, MONDAY)
    assert "Madrid" not in day_request(summarizer, MONDAY)  # a fully private person's lines never reach the model
    assert [(m.owner_id, m.text) for m in await memories(world)] == [(JUNO, "Juno started a pottery class")]


async def test_questions_and_small_talk_copied_from_the_lines_are_not_facts(world: World, summarizer: FakeChatServer) -> None:
    await say(world, MONDAY, [
        (JUNO, "big news: I moved to Lisbon last week, new job there"),
        (BAU, "yes, looks great"),
        (RIN, "gracias! la ciudad es preciosa"),
        (JUNO, "lol nice. anyone seen the new Zelda trailer?"),
        (BAU, "game night is every Friday at 8pm on this server"),
        (BAU, "the group exam is on May 12, room B4"),
    ])
    summarizer.text(facts(  # what Qwen2.5-Coder 1.5B answered: the lines copied, each behind its speaker's name
        ("P1", "self", "Juno: big news: I moved to Lisbon last week, new job there"),
        ("P2", "self", "Bau: yes, looks great"),
        ("P3", "self", "Rin: gracias! la ciudad es preciosa"),
        ("P3", "self", "Rin thanks! la ciudad es preciosa"),  # copied with a word translated
        ("P1", "self", "Juno: lol nice. anyone seen the new Zelda trailer?"),
        ("P2", "server", "game night is every Friday at 8pm on this server"),
        ("P2", "self", "the group exam is on May 12, room B4"),  # a plan copied as "self": still the group's
        ("P2", "self", "Bau asks about the game night schedule."),  # what someone asked is no fact about them
    ))
    await end_day(world, MONDAY)
    assert sorted((m.list, m.text) for m in await memories(world)) == [
        (MemoryList.PERSONAL, "Juno moved to Lisbon last week, new job there"),
        (MemoryList.SERVER, "game night is every Friday at 8pm on this server"),
        (MemoryList.SERVER, "the group exam is on May 12, room B4"),
    ]
    reasons = {fact.text: why for fact, why in world.services.summaries.notes.last[(CHANNEL, MONDAY)].dropped}
    assert reasons == {
        "Bau: yes, looks great": "small talk copied from a line, not a fact",
        "Rin: gracias! la ciudad es preciosa": "small talk copied from a line, not a fact",
        "Rin thanks! la ciudad es preciosa": "small talk copied from a line, not a fact",
        "Juno: lol nice. anyone seen the new Zelda trailer?": "a question, not a fact",
        "Bau asks about the game night schedule.": "a question, not a fact",
    }


async def test_a_correction_the_model_did_not_mark_still_replaces_the_fact_it_corrects(
    world: World, summarizer: FakeChatServer
) -> None:
    await say(world, MONDAY, [(JUNO, "my cat is called Mochi"), (JUNO, "I work as a nurse")])
    summarizer.text(facts(("P1", "self", "Juno's cat is called Mochi"), ("P1", "self", "Juno works as a nurse")))
    await end_day(world, MONDAY)
    mochi = next(m for m in await memories(world) if "Mochi" in m.text)
    tuesday = MONDAY + timedelta(days=2)
    await say(world, tuesday, [
        (JUNO, "correction: my cat is actually called Luna, Mochi was my sister's cat"),
        (JUNO, "and I adopted a second cat yesterday, Pip"),  # news, not a correction: saved beside
    ])
    summarizer.text(facts(("P1", "self", "Juno's cat is called Luna"), ("P1", "self", "Juno adopted a second cat called Pip")))
    await end_day(world, tuesday)
    now = {m.id: m.text for m in await memories(world)}
    assert now[mochi.id] == "Juno's cat is called Luna"
    assert sorted(now.values()) == ["Juno adopted a second cat called Pip", "Juno works as a nurse", "Juno's cat is called Luna"]
    page = await world.services.memories.versions.page(await world.services.memories.personal_list(JUNO, GUILD), mochi.id)
    assert [v.text for v in page.versions] == ["Juno's cat is called Mochi"]


async def test_a_correction_the_model_left_out_is_noted_from_its_line_and_replaces_what_it_corrects(
    world: World, summarizer: FakeChatServer
) -> None:
    await say(world, MONDAY, [
        (JUNO, "my cat is called Mochi, she just knocked my coffee over"), (JUNO, "I work as a nurse, night shifts mostly"),
        (BAU, "game night is every Friday at 8pm"),
    ])
    summarizer.text(facts(
        ("P1", "self", "Juno's cat is called Mochi"), ("P1", "self", "Juno works as a nurse, night shifts mostly"),
        ("P2", "server", "Game night is every Friday at 8pm"),
    ))
    await end_day(world, MONDAY)
    before = {m.text: m.id for m in await memories(world)}
    assert len(before) == 3
    tuesday = MONDAY + timedelta(days=2)
    await say(world, tuesday, [
        (JUNO, "Deskmate, correction: my cat is actually called Luna, Mochi was my sister's cat"),
        (JUNO, "actually I'm so tired after my shift"),  # says "actually", changes nothing remembered
        (BAU, "update: game night moved to Saturday at 8pm"),  # a server fact, from someone without Manage Server
        (RIN, "Juno actually moved her cat's bed to the kitchen"),  # about someone else
    ])
    # what Qwen2.5-Coder 1.5B answered: every line but the correction, a remembered fact in its place
    summarizer.text(facts(("P1", "self", "Juno works as a nurse, night shifts mostly")))
    await end_day(world, tuesday)
    now = {m.id: m for m in await memories(world)}
    cat = now[before["Juno's cat is called Mochi"]]
    luna = "Juno's cat is actually called Luna, Mochi was their sister's cat"
    assert (cat.owner_id, cat.text, cat.source) == (JUNO, luna, Source.NOTES)
    assert sorted(m.text for m in now.values()) == [
        "Game night is every Friday at 8pm", "Juno works as a nurse, night shifts mostly",
        luna,
    ]
    page = await world.services.memories.versions.page(await world.services.memories.personal_list(JUNO, GUILD), cat.id)
    assert [v.text for v in page.versions] == ["Juno's cat is called Mochi"]
    assert told(world).notices[-1][2].lines[0] == f"🗒️ What I noted from Wed {tuesday.isoformat()}: 0 new memories, 1 updated"
    dropped = world.services.summaries.notes.last[(CHANNEL, tuesday)].dropped
    assert [(fact.text, why) for fact, why in dropped] == [
        ("Juno works as a nurse, night shifts mostly", "a remembered fact, unchanged")
    ]

    wednesday = tuesday + timedelta(days=2)
    await say(world, wednesday, [(BAU, "update: game night moved to Saturday at 8pm")], author_can_manage=True)
    summarizer.text(facts())  # the model noted nothing; Bau may change the server's facts now
    await end_day(world, wednesday)
    assert now[before["Game night is every Friday at 8pm"]].id in {m.id for m in await memories(world)}
    texts = sorted(m.text for m in await memories(world))
    assert "game night moved to Saturday at 8pm" in texts and "Game night is every Friday at 8pm" not in texts


async def test_a_fact_joining_what_two_people_said_is_cut_and_each_part_goes_to_the_person_who_said_it(
    world: World, summarizer: FakeChatServer
) -> None:
    await say(world, MONDAY, [
        (RIN, "respect. I just moved here, I live in Berlin now"),
        (BAU, "nice! Deskmate, my birthday is on March 3, don't forget it"),
    ])
    summarizer.text(facts(("Bau", "self", "I moved here and have a birthday on March 3")))  # what the 1.5B model wrote
    await end_day(world, MONDAY)
    assert sorted((m.owner_id, m.text) for m in await memories(world)) == [
        (RIN, "Rin moved here"), (BAU, "Bau: have a birthday on March 3")
    ]


async def test_a_speaker_tag_in_a_facts_text_is_written_as_the_persons_name(world: World, summarizer: FakeChatServer) -> None:
    await say(world, MONDAY, [
        (JUNO, "Deskmate, I work as a nurse at the children's hospital"), (RIN, "respect"),
        (JUNO, "also I'm allergic to penicillin, learned that the hard way lol"),
    ])
    summarizer.text(facts(  # as Qwen2.5-Coder 0.5B writes, the second with Rin's tag: Juno's line decides
        ("P1", "self", "P1 works as a nurse at the children's hospital"),
        ("P2", "self", "P2 is allergic to penicillin, learned that the hard way lol"),
    ))
    await end_day(world, MONDAY)
    assert [(m.owner_id, m.text) for m in await memories(world)] == [
        (JUNO, "Juno works as a nurse at the children's hospital"),
        (JUNO, "Juno is allergic to penicillin, learned that the hard way lol"),
    ]


async def test_a_part_that_says_something_about_someone_else_is_left_out_and_the_rest_kept(
    world: World, summarizer: FakeChatServer
) -> None:
    await say(world, MONDAY, [
        (SAM, "Juno always arrives late to everything"),
        (RIN, "I'm training for the Madrid marathon in April"),
        (JUNO, "correction: now I have three cats, we adopted Nube yesterday"),
        (RIN, "ooh another cat"),
        (RIN, "the exam is on May 12, room B4"),
        (SAM, "the picnic changed to Sunday at 6pm, due to the rain"),
    ])
    summarizer.text(facts(  # what Qwen2.5-Coder 1.5B wrote of such a day (in Spanish)
        ("P1", "self", "Juno arrives late to the meetings, and Rin is training for the Madrid marathon in April."),
        ("P3", "self", "Juno adopted three new cats and Rin mentioned another."),
        ("P1", "self", "Juno's exam is on May 12, room B4"),  # what is left without Juno ("room B4") is no fact
        ("P3", "self", "Juno adopted three new cats, due to the rain"),  # Sam's "due to the rain" is no fact either
    ))
    await end_day(world, MONDAY)
    assert sorted((m.owner_id or 0, m.text) for m in await memories(world)) == [
        (JUNO, "Juno adopted three new cats"), (RIN, "Rin is training for the Madrid marathon in April."),
    ]
    dropped = {(fact.text, why) for fact, why in world.services.summaries.notes.last[(CHANNEL, MONDAY)].dropped}
    assert ("Rin mentioned another.", "names someone else than the person who said it") in dropped
    assert ("due to the rain", "part of a fact said by someone else") in dropped
    assert not any("late" in m.text for m in await memories(world))  # Sam's claim about Juno is nobody's memory


@pytest.mark.parametrize(
    ("said", "noted", "change", "changed"),
    [
        pytest.param(
            "the meetup is on Saturday at 6pm in the park", "The server's meetup is on Saturday at 6pm in the park",
            "update: the meetup changed to Sunday at 6pm, due to rain", "Juno changed the meetup to Sunday at 6pm due to rain.",
            id="same words",
        ),
        pytest.param(  # what Qwen2.5-Coder 1.5B wrote of the Spanish meetup: close only by the lower bar of a declared
            # change, which both the note's check and the update itself apply
            "la quedada del servidor es el sábado a las 18h en el parque del Retiro",
            "The server's meeting is on Saturday at 6 PM in the park of the Retiro.",
            "la quedada se cambia al domingo a las 18h, por la lluvia",
            "Juno changed the meeting time to Sunday at 18:00 due to rain.",
            id="other words",
        ),
    ],
)
async def test_a_change_of_the_groups_plans_named_after_its_speaker_corrects_the_server_fact(
    world: World, summarizer: FakeChatServer, said: str, noted: str, change: str, changed: str
) -> None:
    await say(world, MONDAY, [(JUNO, said)], author_can_manage=True)
    summarizer.text(facts(("P1", "server", noted)))
    await end_day(world, MONDAY)
    [meetup] = await memories(world)
    later = MONDAY + timedelta(days=2)
    await say(world, later, [(JUNO, change)], author_can_manage=True)
    summarizer.text(facts(("P1", "self", changed)))
    await end_day(world, later)
    [now] = await memories(world)
    assert (now.id, now.list, now.owner_id, now.text) == (meetup.id, MemoryList.SERVER, None, changed)


@pytest.mark.parametrize(
    ("said", "noted", "change", "changed", "kept"),
    [
        pytest.param(  # the model's text lost the word both share: the speaker's own line, as a fact, makes the change
            "I always play the healer, so don't pull without me", "Juno always plays the healer, so don't pull without them",
            "Deskmate, I switched mains, I play tank now instead of healer", "Juno switched mains to tank",
            "Juno switched mains, they play tank now instead of healer", id="the line decides",
        ),
        pytest.param(  # a move shares no word with where one lived but the words of living somewhere
            "respect. I live in Berlin now", "Juno lives in Berlin now",
            "big news: I moved to Lisbon last week, new job there", "Juno moved to Lisbon last week, new job there",
            "Juno moved to Lisbon last week, new job there", id="a move",
        ),
    ],
)
async def test_a_declared_change_of_a_persons_fact_replaces_it_and_keeps_the_old_text_as_a_version(
    world: World, summarizer: FakeChatServer, said: str, noted: str, change: str, changed: str, kept: str
) -> None:
    """What Qwen2.5-Coder 1.5B wrote of Leo's and Rin's changes in the notes benchmark (names made Juno's here)."""
    await say(world, MONDAY, [(JUNO, said)])
    summarizer.text(facts(("P1", "self", noted)))
    await end_day(world, MONDAY)
    [before] = await memories(world)
    later = MONDAY + timedelta(days=2)
    await say(world, later, [(JUNO, change)])
    summarizer.text(facts(("P1", "self", changed)))
    await end_day(world, later)
    [now] = await memories(world)
    assert (now.id, now.owner_id, now.text) == (before.id, JUNO, kept)
    page = await world.services.memories.versions.page(await world.services.memories.personal_list(JUNO, GUILD), now.id)
    assert [v.text for v in page.versions] == [noted]


async def test_an_unmarked_correction_of_a_server_fact_changes_it_only_for_a_speaker_who_may(
    world: World, summarizer: FakeChatServer
) -> None:
    await say(world, MONDAY, [(JUNO, "the group exam is on May 12, room B4")], author_can_manage=True)
    summarizer.text(facts(("P1", "server", "The group exam is on May 12 in room B4")))
    await end_day(world, MONDAY)
    assert len(await memories(world)) == 1
    tuesday = MONDAY + timedelta(days=1)
    await say(world, tuesday, [(RIN, "heads up: the group exam moved to May 19, same room")])  # no Manage Server
    summarizer.text(facts(("P2", "server", "The group exam is on May 19")))
    await end_day(world, tuesday)
    texts = sorted(m.text for m in await memories(world))
    assert texts == ["The group exam is on May 12 in room B4", "The group exam is on May 19"]  # saved beside, not refused
    assert told(world).notices[-1][2].lines[0] == f"🗒️ What I noted from Tue {tuesday.isoformat()}: 1 new memory"

    wednesday = MONDAY + timedelta(days=2)
    await say(world, wednesday, [(JUNO, "update: the group exam moved to May 26")], author_can_manage=True)
    summarizer.text(facts(("P2", "server", "The group exam is on May 26")))
    await end_day(world, wednesday)
    assert told(world).notices[-1][2].lines[0] == f"🗒️ What I noted from Wed {wednesday.isoformat()}: 0 new memories, 1 updated"
    texts = sorted(m.text for m in await memories(world))
    assert "The group exam is on May 26" in texts and len(texts) == 2  # the closest of the two was corrected


async def test_a_question_that_also_tells_a_fact_in_the_first_person_is_kept(world: World, summarizer: FakeChatServer) -> None:
    await say(world, MONDAY, [(JUNO, "my birthday is on June 9, will you remember it?")])
    summarizer.text(facts(("P1", "self", "my birthday is on June 9, will you remember it?")))
    await end_day(world, MONDAY)
    assert [m.text for m in await memories(world)] == ["Juno's birthday is on June 9, will you remember it?"]


async def test_a_personal_fact_needs_a_line_in_the_first_person(world: World, summarizer: FakeChatServer) -> None:
    await say(world, MONDAY, [(JUNO, "my dog Taco turned five today!"), (SAM, "happy birthday Taco")])
    summarizer.text(facts(("P1", "self", "Juno's dog Taco turned five today"), ("P2", "self", "Sam is happy birthday to Taco")))
    await end_day(world, MONDAY)  # what Qwen2.5-Coder 1.5B made of Sam's wishes
    assert [(m.owner_id, m.text) for m in await memories(world)] == [(JUNO, "Juno's dog Taco turned five today")]


async def test_a_request_to_remember_that_the_model_left_out_is_noted_from_its_line(
    world: World, summarizer: FakeChatServer
) -> None:
    """Qwen2.5-Coder 0.5B made no call for Juno's request and wrote no facts for the day: the request was lost."""
    await world.services.servers.set_privacy(RIN, Privacy.PARTIAL)
    await say(world, MONDAY, [
        (JUNO, "Hi! I'm Juno. Please remember that my cat is called Mochi."),
        (BAU, "My birthday is on May 3, please remember it."),
        (RIN, "please remember that I live in Madrid"),  # privacy partial: nothing about Rin
        (BAU, "Please remember that Juno is a cheater."),  # about someone else: never Juno's memory, nor Bau's
        (JUNO, "Can you remember when game night is?"),  # a question
    ])
    summarizer.text(facts())
    await end_day(world, MONDAY)
    assert sorted((m.owner_id, m.text) for m in await memories(world)) == sorted(
        [(JUNO, "Juno's cat is called Mochi."), (BAU, "Bau's birthday is on May 3.")]
    )
    assert "Juno's cat is called Mochi." in await key_details(world, MONDAY)

    tuesday = MONDAY + timedelta(days=2)
    await say(world, tuesday, [(JUNO, "Please remember that my cat is called Mochi.")])
    summarizer.text(facts(("P1", "self", "Juno's cat is called Mochi")))  # the model's note of the line: no second
    await end_day(world, tuesday)
    assert len(await memories(world)) == 2


async def test_a_request_to_remember_is_kept_when_the_days_summary_fails(world: World, summarizer: FakeChatServer) -> None:
    """Qwen2.5-Coder 0.5B echoed its instructions for the day, twice: the summary failed, and with it the notes."""
    summarizer.responder = lambda body: DAY_INSTRUCTIONS
    thread = {"channel_id": 777, "parent_channel_id": CHANNEL, "private_thread": True}
    await say(world, MONDAY, [(JUNO, "Please remember that my cat is called Mochi.")])
    await say(world, MONDAY, [(RIN, "please remember that I am quitting my job in March")], **thread)
    await end_day(world, MONDAY)
    await say(world, MONDAY + timedelta(days=1), [(RIN, "morning!")], **thread)
    await world.services.summaries.settle()
    assert [(m.owner_id, m.text) for m in await memories(world)] == [(JUNO, "Juno's cat is called Mochi.")]

    summarizer.responder = lambda body: facts(("P1", "self", "Juno's cat is called Mochi"))  # the retry succeeds
    await say(world, MONDAY + timedelta(days=3), [(SAM, "hello again")])
    await world.services.summaries.settle()
    assert [m.text for m in await memories(world)] == ["Juno's cat is called Mochi."]  # not noted twice
