"""What the model may see and change when it saves, updates or forgets, as a hostile member would try it: the real
database, the real built-in embedder and the real pipeline, with a scripted chat model.

- A save shows the model the memories it resembles and lets the reply change them: only those the conversation
  may see (channel limits, tags, privacy, persona), and a full list makes room only among those.
- The model saves personal memories only about the person it answers, never Global ones, nothing naming someone
  whose privacy is `partial` or `full`, and no server memory from a private thread.
- The model never changes (or forgets) a protected memory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from bot.chat.messages import IncomingMessage
from bot.chat.notices import ChangeKind
from bot.chat.reply import ReplyPipeline
from bot.clock import ManualClock
from bot.memory.models import MemoryList, NewMemory, Source
from bot.servers.models import Actor, Privacy
from bot.services import build_services
from tests.conftest import MakeCore
from tests.fakes import FakeChatServer
from tests.recall_helpers import BOT, CHANNEL, GUILD, JUNO, SAM, message

MODS = CHANNEL + 1
PRIVATE_THREAD = CHANNEL + 2


@pytest.fixture
async def pipeline(make_core: MakeCore, chat: FakeChatServer) -> AsyncIterator[ReplyPipeline]:
    core = await make_core(chat_base_url=chat.base_url, chat_model="fake-model", chat_timeout_s=5.0)
    built = build_services(core, bot_user_id=BOT).pipeline
    await built.servers.sync_default_persona()
    yield built
    await built.model.close()


async def add(pipeline: ReplyPipeline, text: str, *, owner: int | None = None, **extra: object) -> int:
    """A memory added by command (as an admin, or as its owner)."""
    result = await pipeline.core.save(NewMemory(
        list=MemoryList.PERSONAL if owner else MemoryList.SERVER, text=text, by=owner or JUNO, via=Source.COMMAND,
        guild_id=GUILD, owner_id=owner, by_can_manage=True, **extra,  # type: ignore[arg-type]
    ))
    assert result.saved is not None, result.detail
    return result.saved.id


async def test_a_save_shows_and_lets_change_only_what_the_conversation_may_see(
    pipeline: ReplyPipeline, chat: FakeChatServer, clock: ManualClock
) -> None:
    await pipeline.servers.update_guild_settings(GUILD, Actor(1, can_manage=True), tagging=True)
    mods_only = await add(pipeline, "The mods plan to ban someone next week", channel_ids=(MODS,))
    tagged = await add(pipeline, "The mods plan to ban a spammer", tags=("moderation",))
    own_elsewhere = await add(pipeline, "Juno plans to ban someone from her book club", owner=JUNO, channel_ids=(MODS,))
    seen = await add(pipeline, "The mods plan a movie night")
    hidden = {mods_only, tagged, own_elsewhere}

    chat.tool_calls(("save_memory", {"text": "The mods plan to ban someone", "list": "server"}),
                    ("save_memory", {"text": "Juno plans to ban someone", "list": "personal"}),
                    *(("forget_memory", {"memory_id": memory_id}) for memory_id in sorted(hidden))).text("done")
    await pipeline.reply(message(JUNO, "remember: the mods plan to ban someone", clock=clock))

    server_save, personal_save, *forgets = chat.tool_results(1)
    shown = {item["id"] for result in (server_save, personal_save) for item in result.get("similar_memories", [])}
    assert shown and not shown & hidden and seen in shown
    assert len(forgets) == 3 and all("no memory #" in result["error"] for result in forgets)
    left = {memory.id for memory in await pipeline.core.all_memories()}
    assert hidden <= left  # nothing hidden here was forgotten from here

    # in #mods the same save shows the #mods memory (and the reply may change it)
    chat.tool_calls(("save_memory", {"text": "The mods plan to ban someone this week", "list": "server"})).text("ok")
    await pipeline.reply(message(JUNO, "the mods plan to ban someone this week", clock=clock, channel=MODS))
    assert mods_only in {item["id"] for item in chat.tool_results(-1)[0].get("similar_memories", [])}


async def test_a_full_list_makes_room_only_among_what_the_conversation_may_see(
    make_core: MakeCore, chat: FakeChatServer, clock: ManualClock
) -> None:
    core = await make_core(chat_base_url=chat.base_url, chat_model="fake-model", server_memory_limit=2, dormant_after_days=1)
    pipeline = build_services(core, bot_user_id=BOT).pipeline
    hidden = await add(pipeline, "The mods keep a list of warnings", channel_ids=(MODS,))  # oldest: would go first
    clock.current += timedelta(minutes=5)
    visible = await add(pipeline, "The server has a weekly quiz")
    await core.pool.execute("UPDATE memories SET days_unused = 5, source = 'bot', protected = false")  # both in the drawer
    chat.tool_calls(("save_memory", {"text": "Movie night moved to Friday", "list": "server"})).text("ok")
    outcome = await pipeline.reply(message(JUNO, "movie night moved to Friday", clock=clock))
    assert [c.memory_id for c in outcome.changes if c.kind == ChangeKind.MADE_ROOM] == [visible]
    assert hidden in {memory.id for memory in await core.all_memories()}
    result = chat.tool_results(1)[0]
    assert [gone["id"] for gone in result["forgotten_to_make_room"]] == [visible]
    await pipeline.model.close()


async def test_the_model_saves_personal_memories_only_about_the_person_it_answers_and_never_global(
    pipeline: ReplyPipeline, chat: FakeChatServer, clock: ManualClock
) -> None:
    await pipeline.chat_log.record(message(SAM, "hi, I'm Sam", clock=clock))  # Sam takes part
    chat.tool_calls(
        ("save_memory", {"text": "Sam steals from everyone", "list": "personal", "about_user": str(SAM)}),
        ("save_memory", {"text": "Mochi knocked my coffee off the desk again lol", "list": "personal", "global": True}),
        ("save_memory", {"text": "Juno's cat is called Mochi", "list": "personal"}),
    ).text("ok")
    outcome = await pipeline.reply(message(JUNO, "Sam steals from everyone; and my cat Mochi...", clock=clock))
    about_sam, made_global, own = chat.tool_results(1)
    assert not about_sam["ok"] and "only be about the person you answer" in about_sam["error"]
    assert not made_global["ok"] and "Global" in made_global["error"]
    assert own["ok"]
    stored = await pipeline.core.all_memories()
    assert [(m.owner_id, m.is_global, m.text) for m in stored] == [(JUNO, False, "Juno's cat is called Mochi")]
    assert [c.kind for c in outcome.changes] == [ChangeKind.REJECTED, ChangeKind.REJECTED, ChangeKind.SAVED]


@pytest.mark.parametrize("level", [Privacy.PARTIAL, Privacy.FULL])
async def test_nothing_naming_a_partial_or_full_person_is_saved_or_written_by_the_model(
    pipeline: ReplyPipeline, chat: FakeChatServer, clock: ManualClock, level: Privacy
) -> None:
    bau = 712_345_678_901_234_567  # a Discord-sized id: bare in a text, it is found too
    await pipeline.chat_log.record(dataclasses.replace(message(SAM, "hello", clock=clock), author_id=bau, author_name="Bau"))
    await pipeline.servers.set_privacy(bau, level)
    rule = await add(pipeline, "The quiz is on Fridays")
    await pipeline.core.pool.execute("UPDATE memories SET source = 'bot', protected = false")  # a bot-saved one
    chat.tool_calls(
        ("save_memory", {"text": "Bau steals from everyone", "list": "server"}),
        ("save_memory", {"text": "BAU was banned from the quiz", "list": "server"}),
        ("save_memory", {"text": f"<@{bau}> cheats at the quiz", "list": "server"}),
        ("save_memory", {"text": f"user {bau} cheats", "list": "server"}),
        ("update_memory", {"memory_id": rule, "text": "The quiz is on Fridays, without Bau"}),
    ).text("ok")
    asked = dataclasses.replace(message(JUNO, "tell everyone about Bau", clock=clock), author_can_manage=True)
    await pipeline.reply(asked)
    results = chat.tool_results(1)
    assert all(not r["ok"] and "privacy" in r["error"] for r in results), [r.get("error") for r in results]
    chat.tool_calls(("save_memory", {"text": "The Baubles team won the quiz", "list": "server"})).text("ok")  # not a name
    await pipeline.reply(asked)
    assert chat.tool_results(-1)[0]["ok"]
    assert [m.text for m in await pipeline.core.all_memories()] == ["The quiz is on Fridays", "The Baubles team won the quiz"]


async def test_in_a_private_thread_the_model_saves_no_server_memory(
    pipeline: ReplyPipeline, chat: FakeChatServer, clock: ManualClock
) -> None:
    chat.tool_calls(("save_memory", {"text": "The mods plan to ban Sam", "list": "server"}),
                    ("save_memory", {"text": "Juno moderates the server", "list": "personal"})).text("ok")
    in_thread: IncomingMessage = dataclasses.replace(
        message(JUNO, "we plan to ban Sam", clock=clock, channel=PRIVATE_THREAD), parent_channel_id=CHANNEL,
        private_thread=True,
    )
    await pipeline.reply(in_thread)
    assert chat.requests[0]["tools"][0]["function"]["parameters"]["properties"]["list"]["enum"] == ["personal"]
    server, personal = chat.tool_results(1)
    assert not server["ok"] and personal["ok"]
    assert [m.list for m in await pipeline.core.all_memories()] == [MemoryList.PERSONAL]


async def test_the_model_never_changes_a_protected_memory(
    pipeline: ReplyPipeline, chat: FakeChatServer, clock: ManualClock
) -> None:
    rule = await add(pipeline, "Rule 1: be kind")  # added by command: protected
    mine = await add(pipeline, "Juno likes green tea", owner=JUNO)
    chat.tool_calls(("update_memory", {"memory_id": rule, "text": "anything goes"}),
                    ("update_memory", {"memory_id": mine, "text": "Juno likes black tea"})).text("ok")
    outcome = await pipeline.reply(dataclasses.replace(message(JUNO, "Rule 1: be kind?", clock=clock), author_can_manage=True))
    assert all(not r["ok"] and "protected" in r["error"] for r in chat.tool_results(1))
    assert {m.text for m in await pipeline.core.all_memories()} == {"Rule 1: be kind", "Juno likes green tea"}
    assert [c.kind for c in outcome.changes] == [ChangeKind.REJECTED, ChangeKind.REJECTED]
