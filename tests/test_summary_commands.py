"""`/summaries ...` and `/settings summaries` through discord.py's own machinery, answered over HTTP to a local
fake Discord, with the summary model a local OpenAI-compatible server and the summaries in the real database."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from datetime import UTC, date, datetime, time, timedelta

import pytest

from bot.clock import ManualClock
from bot.summaries.models import Status
from bot.summaries.service import ChannelSummaries
from tests.conftest import MakeCore
from tests.discord_fakes import (
    ADMIN_PERMISSIONS,
    GENERAL_ID,
    GUILD_ID,
    OTHER_CHANNEL_ID,
    Call,
    Person,
    SlashHarness,
    custom_ids,
    slash_harness,
)
from tests.fakes import FakeChatServer
from tests.recall_helpers import message
from tests.test_summaries import summary_answer

ADMIN = Person(101, "Admin", ADMIN_PERMISSIONS)
JUNO = Person(102, "Juno")
MONDAY = date(2026, 1, 5)
FRIDAY_NOON = datetime(2026, 1, 9, 12, tzinfo=UTC)


@pytest.fixture
async def summarizer() -> AsyncIterator[FakeChatServer]:
    async with FakeChatServer(responder=summary_answer, summaries_aside=False) as server:
        yield server


@pytest.fixture
async def harness(make_core: MakeCore, clock: ManualClock, summarizer: FakeChatServer) -> AsyncIterator[SlashHarness]:
    clock.current = FRIDAY_NOON
    core = await make_core(summary_base_url=summarizer.base_url, summary_model="fake-summary")
    async with slash_harness(core) as started:
        yield started


def summaries_of(h: SlashHarness) -> ChannelSummaries:
    return h.bot.services.summaries  # type: ignore[attr-defined,no-any-return]


async def chat_on(h: SlashHarness, clock: ManualClock, days: Sequence[date], channel: int = GENERAL_ID) -> None:
    """Two messages (Juno and Sam) on each chat day, recorded as the chat cog records what it reads."""
    for day in days:
        at = datetime.combine(day, time(10), UTC)
        for offset, (author, text) in enumerate(((101, f"the plan for {day:%A}"), (102, f"I promise to come on {day:%A}"))):
            recorded = message(author, text, clock=clock, at=at + timedelta(minutes=offset), channel=channel, guild=GUILD_ID)
            await h.bot.services.chat_log.record(recorded)  # type: ignore[attr-defined]


def never_pings(call: Call) -> bool:
    return call.data.get("allowed_mentions") == {"parse": []}


async def answer(h: SlashHarness, payload: dict, *, first: Call) -> Call:
    """The message a deferred command ends with (its followup or the edit of its original response)."""
    return await h.next_call(payload, after=first)


async def test_list_and_show_for_everyone_and_changes_refused_to_members(harness: SlashHarness, clock: ManualClock) -> None:
    await chat_on(harness, clock, [MONDAY, MONDAY + timedelta(days=1)])
    await summaries_of(harness).catch_up(GENERAL_ID, GUILD_ID)
    await chat_on(harness, clock, [MONDAY + timedelta(days=2)])  # Wednesday: not summarised yet

    listed = await harness.run(harness.slash("summaries list", JUNO))
    assert listed.ephemeral and never_pings(listed)
    text = listed.text()
    assert "Mon 2026-01-05" in text and "Tue 2026-01-06" in text
    assert "Wed 2026-01-07** · ⚠️ missing (not summarised yet)" in text
    assert text.index("Mon 2026-01-05") < text.index("Wed 2026-01-07")
    assert "1 missing: `/summaries backfill` writes them" in text

    choices = await harness.run(harness.autocomplete("summaries show", JUNO, "summary", summary="tue"))
    assert choices.body is not None and choices.body["type"] == 8
    [choice] = choices.body["data"]["choices"]
    assert choice["name"].startswith("#") and "Tue 2026-01-06" in choice["name"]

    shown = await harness.run(harness.slash("summaries show", JUNO, summary=choice["value"]))
    assert shown.ephemeral and never_pings(shown)
    [embed] = shown.embeds
    assert embed["title"] == f"Day summary #{choice['value']} · Tue 2026-01-06"
    assert "the plan for Tuesday" in embed["description"]
    fields = {item["name"]: item["value"] for item in embed["fields"]}
    assert "Sam promises to come on Tuesday" in fields["Key details"] and fields["Status"].startswith("ready")

    for command in ("edit", "delete", "regenerate"):
        refused = await harness.run(harness.slash(f"summaries {command}", JUNO, summary=choice["value"]))
        assert refused.ephemeral and refused.content == f"Only members with Manage Server can {command} summaries."
    refused = await harness.run(harness.slash("summaries backfill", JUNO))
    assert refused.content == "Only members with Manage Server can backfill summaries."
    assert (await summaries_of(harness).get(GENERAL_ID, choice["value"])).status == Status.READY

    elsewhere = await harness.run(harness.slash("summaries show", JUNO, channel_id=OTHER_CHANNEL_ID, summary=choice["value"]))
    assert elsewhere.content == f"There is no summary #{choice['value']} in this channel."


async def test_an_edited_summary_is_kept_by_regenerate_and_a_delete_asks_first(
    harness: SlashHarness, clock: ManualClock, summarizer: FakeChatServer
) -> None:
    await chat_on(harness, clock, [MONDAY, MONDAY + timedelta(days=1)])
    await summaries_of(harness).catch_up(GENERAL_ID, GUILD_ID)
    monday, tuesday = [e.summary.id for e in await summaries_of(harness).overview(GENERAL_ID) if e.summary]

    opened = await harness.run(harness.slash("summaries edit", ADMIN, summary=monday))
    assert opened.body is not None and opened.body["type"] == 9  # a form, filled with the summary
    modal = opened.body["data"]
    inputs = [row["components"][0] for row in modal["components"]]
    assert [i["label"] for i in inputs] == ["Summary", "Key details, one per line"]
    assert "the plan for Monday" in inputs[0]["value"] and inputs[1]["value"] == "Sam promises to come on Monday"
    saved = await harness.run(harness.modal_submit(modal, ADMIN, {
        "Summary": "Admin and Juno planned Monday's hike.", "Key details, one per line": "Hike on Monday\n\n  Juno brings tea ",
    }))
    assert saved.ephemeral and never_pings(saved)
    assert f"Saved summary #{monday} (Mon 2026-01-05) as you wrote it, with 2 key details" in saved.content
    assert "never overwritten" in saved.content
    edited = await summaries_of(harness).get(GENERAL_ID, monday)
    assert edited.summary == "Admin and Juno planned Monday's hike."
    assert edited.key_details == ("Hike on Monday", "Juno brings tea")
    assert edited.edited_by == ADMIN.id

    command = harness.slash("summaries regenerate", ADMIN, summary=monday)
    deferred = await harness.run(command)
    assert deferred.body == {"type": 5, "data": {"flags": 64}}
    kept = await answer(harness, command, first=deferred)
    assert "was edited by hand, so it is never overwritten; delete it first" in kept.content
    assert (await summaries_of(harness).get(GENERAL_ID, monday)).summary == "Admin and Juno planned Monday's hike."

    summarizer.error(500)
    command = harness.slash("summaries regenerate", ADMIN, summary=tuesday)
    failed = await answer(harness, command, first=await harness.run(command))
    assert failed.content.startswith(f"The summary model failed, so summary #{tuesday} (Tue 2026-01-06) keeps its earlier text")
    assert "the model is on fire" in failed.content
    command = harness.slash("summaries regenerate", ADMIN, summary=tuesday)
    again = await answer(harness, command, first=await harness.run(command))
    assert again.content.startswith(f"Wrote summary #{tuesday} (Tue 2026-01-06) again:")
    assert "the plan for Tuesday" in again.content

    command = harness.slash("summaries delete", ADMIN, summary=monday)
    asked = await harness.run(command)
    assert asked.ephemeral and asked.content.startswith(f"Delete summary #{monday} (Mon 2026-01-05)?")
    assert (await summaries_of(harness).get(GENERAL_ID, monday)).status == Status.READY  # nothing yet
    pressed = harness.button(harness.original_message(command), custom_ids(harness.original_message(command))["Delete"], ADMIN)
    done = await harness.next_call(pressed, after=await harness.run(pressed))
    assert f"Deleted summary #{monday} (Mon 2026-01-05): it is out of the prompt" in done.content
    assert (await summaries_of(harness).get(GENERAL_ID, monday)).status == Status.DELETED


async def test_backfill_shows_progress_after_each_day_stops_and_resumes(
    harness: SlashHarness, clock: ManualClock, summarizer: FakeChatServer
) -> None:
    await chat_on(harness, clock, [MONDAY + timedelta(days=i) for i in range(4)])
    summarizer.stall(1.5, then_text='{"summary": "a slow Monday", "key_details": []}')
    command = harness.slash("summaries backfill", ADMIN, days=7)
    deferred = await harness.run(command)
    assert deferred.body == {"type": 5, "data": {"flags": 64}}
    started = await harness.fake.wait_for(lambda call: command["token"] in call.path and call.method == "PATCH")
    assert "Backfilling the summaries of" in started.content and "days 0/4" in started.content and never_pings(started)
    stop = custom_ids(harness.original_message(command))["Stop"]
    pressed = await harness.run(harness.button(harness.original_message(command), stop, ADMIN))
    assert pressed.body is not None and pressed.body["type"] == 7
    stopped = await harness.fake.wait_for(
        lambda call: command["token"] in call.path and call.method == "PATCH" and "stopped" in call.content
    )
    assert "days 1/4 · 1 written" in stopped.content and "Running it again resumes" in stopped.content
    assert not harness.original_message(command).get("components")  # the Stop button is gone

    summarizer.error(500)  # Tuesday fails this time
    command = harness.slash("summaries backfill", ADMIN)
    await harness.run(command)
    done = await harness.fake.wait_for(
        lambda call: command["token"] in call.path and call.method == "PATCH" and "done" in call.content, within=30
    )
    edits = harness.fake.find(lambda call: command["token"] in call.path and call.method == "PATCH")
    assert [e.content.split("· ")[1].split(" ")[1] for e in edits[:4]] == ["0/3", "1/3", "2/3", "3/3"]
    assert "Wrote 2 day summaries" in done.content and "failed on 1 days; they stay missing" in done.content
    assert "Tue 2026-01-06: the summary model failed" in done.content and "Running it again resumes" in done.content
    states = {e.period_start: e.summary.status for e in await summaries_of(harness).overview(GENERAL_ID) if e.summary}
    assert states[MONDAY] == Status.READY and states[MONDAY + timedelta(days=1)] == Status.MISSING


async def test_settings_summaries_switches_a_server_or_a_channel(harness: SlashHarness, clock: ManualClock) -> None:
    refused = await harness.run(harness.slash("settings summaries", JUNO, enabled=False))
    assert "Only members with Manage Server" in refused.content
    off = await harness.run(harness.slash("settings summaries", ADMIN, enabled=False))
    assert off.ephemeral and off.content.startswith("Summaries are off in this whole server")
    assert not await summaries_of(harness).is_enabled(GENERAL_ID, GUILD_ID)
    listed = await harness.run(harness.slash("summaries list", JUNO))
    assert listed.content == (
        f"Summaries are off in <#{GENERAL_ID}>, so none are written or shown there; "
        "`/settings summaries enabled:true` turns them on."
    )
    on = await harness.run(harness.slash("settings summaries", ADMIN, enabled=True, channel=OTHER_CHANNEL_ID))
    assert on.content.startswith(f"Summaries are on in <#{OTHER_CHANNEL_ID}>")
    assert await summaries_of(harness).is_enabled(OTHER_CHANNEL_ID, GUILD_ID)
    assert not await summaries_of(harness).is_enabled(GENERAL_ID, GUILD_ID)
    shown = await harness.run(harness.slash("settings show", ADMIN))
    assert f"off in this server; on in <#{OTHER_CHANNEL_ID}>" in shown.text()


async def test_without_a_summary_model_every_command_says_so(make_core: MakeCore) -> None:
    async with slash_harness(await make_core()) as h:
        for command, values in (("summaries list", {}), ("summaries show", {"summary": 1}), ("summaries backfill", {})):
            said = await h.run(h.slash(command, ADMIN, **values))
            assert said.ephemeral and said.content.startswith("No summary model is configured (SUMMARY_MODEL"), command


async def test_a_thread_uses_its_parent_channels_summaries(harness: SlashHarness, clock: ManualClock) -> None:
    await chat_on(harness, clock, [MONDAY])
    await summaries_of(harness).catch_up(GENERAL_ID, GUILD_ID)
    payload = harness.slash("summaries list", JUNO, channel_id=777)
    payload["channel"].update(type=11, parent_id=str(GENERAL_ID), owner_id=str(JUNO.id), name="a thread", message_count=1,
                              member_count=1, total_message_sent=1,
                              thread_metadata={"archived": False, "auto_archive_duration": 1440,
                                               "archive_timestamp": FRIDAY_NOON.isoformat(), "locked": False})
    listed = await harness.run(payload)
    assert f"Summaries of <#{GENERAL_ID}>" in listed.text() and "Mon 2026-01-05" in listed.text()
