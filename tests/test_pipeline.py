"""The reply pipeline against the real database, the real built-in embedder and the real `openai`
client talking to a local OpenAI-compatible server (tests/fakes.py) that records every request."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta

import asyncpg
import pytest

from bot.chat.messages import IncomingMessage
from bot.chat.notices import ChangeKind
from bot.chat.receipts import ReplyStatus
from bot.chat.reply import APOLOGY, TOO_LARGE, ReplyPipeline
from bot.chat.service import ChatService
from bot.chat.sources import TailReport
from bot.chat.triggers import Trigger
from bot.clock import ManualClock
from bot.memory.models import MemoryList, NewMemory, Recall, Source
from bot.memory.service import MemoryCore
from bot.outgoing import ZERO_WIDTH_SPACE
from bot.prompt import TailItem
from bot.servers.models import Actor, Privacy
from bot.services import build_services
from bot.tokens import count_tokens, message_tokens
from tests.conftest import MakeCore
from tests.fakes import FakeChatServer
from tests.recall_helpers import BOT, CHANNEL, GUILD, JUNO, OTHER_CHANNEL, RIN, SAM, message

LOG_CHANNEL = 699

MakePipeline = Callable[..., Awaitable[ReplyPipeline]]


@pytest.fixture
async def make_pipeline(make_core: MakeCore, chat: FakeChatServer) -> AsyncIterator[MakePipeline]:
    built: list[ReplyPipeline] = []

    async def build(**overrides: object) -> ReplyPipeline:
        settings = {"chat_base_url": chat.base_url, "chat_model": "fake-model", "chat_timeout_s": 5.0, **overrides}
        pipeline = build_services(await make_core(**settings), bot_user_id=BOT).pipeline
        await pipeline.servers.sync_default_persona()
        built.append(pipeline)
        return pipeline

    yield build
    for pipeline in built:
        await pipeline.model.close()


async def save(
    core: MemoryCore, text: str, *, owner: int | None = None, guild: int | None = GUILD, via: Source = Source.BOT
) -> int:
    result = await core.save(
        NewMemory(
            list=MemoryList.PERSONAL if owner else MemoryList.SERVER,
            text=text,
            by=owner or JUNO,
            via=via,
            guild_id=guild,
            owner_id=owner,
            by_can_manage=True,
        )
    )
    assert result.saved is not None, result.detail
    return result.saved.id


async def memory_texts(pool: asyncpg.Pool) -> dict[int, str]:
    return {row["id"]: row["text"] for row in await pool.fetch("SELECT id, text FROM memories")}


async def test_prompt_order_and_what_the_model_receives(
    make_pipeline: MakePipeline, chat: FakeChatServer, clock: ManualClock
) -> None:
    pipeline = await make_pipeline()
    core = pipeline.core
    server_fact = await save(core, "The book club meets on Fridays")
    juno_fact = await save(core, "Juno is learning the cello", owner=JUNO, via=Source.COMMAND)
    sam_fact = await save(core, "Sam works night shifts", owner=SAM, via=Source.COMMAND)
    await pipeline.servers.add_lore(GUILD, Actor(JUNO, can_manage=True), "The server's mascot is a grey heron.")
    await pipeline.servers.update_persona(GUILD, Actor(1, can_manage=True),
        prompt="You speak like a librarian.", attributes={"tone": "warm"})

    await pipeline.chat_log.record(message(SAM, "evening all", clock=clock))
    await pipeline.chat_log.record(message(BOT, "Good evening, Sam.", clock=clock))
    outcome = await pipeline.reply(message(JUNO, "when does the book club meet?", clock=clock, mentions=(BOT,)))

    assert outcome.status == ReplyStatus.REPLIED and outcome.chunks == ["ok"]
    request = chat.requests[0]
    assert request["model"] == "fake-model" and request["max_tokens"] == 800
    assert {tool["function"]["name"] for tool in request["tools"]} == {"save_memory", "update_memory", "forget_memory"}
    messages = request["messages"]
    head = messages[0]["content"]
    markers = [
        "## Persona",
        "librarian",
        '"tone": "warm"',
        "grey heron",
        "## Server memories",
        "book club meets",
        "## Personal memories",
    ]
    positions = [head.index(marker) for marker in markers]
    assert positions == sorted(positions)
    assert head.index("### About Juno (user 101)") < head.index("cello")
    assert head.index("### About Sam (user 102)") < head.index("night shifts")
    assert [m["role"] for m in messages[1:]] == ["user", "assistant", "user"]
    assert messages[1]["content"] == "Sam (user 102): evening all"
    assert messages[2]["content"] == "Good evening, Sam."
    assert messages[3]["content"].endswith("Juno (user 101): when does the book club meet?")
    assert outcome.receipt.desk_ids == [server_fact, juno_fact, sam_fact]
    assert outcome.receipt.tokens["total"] > 0 and outcome.receipt.head_same_as_previous is None
    stored = await pipeline.chat_log.receipt(message_id=outcome.receipt.message_id)
    assert stored is not None and stored["desk_ids"] == [server_fact, juno_fact, sam_fact]


async def test_head_is_byte_identical_until_a_memory_moves_between_desk_and_drawer(
    make_pipeline: MakePipeline, chat: FakeChatServer, clock: ManualClock
) -> None:
    pipeline = await make_pipeline(dormant_after_days=2)
    pixel = await save(pipeline.core, "Rin's dog is called Pixel")

    async def ask(text: str, author: int = RIN) -> tuple[str, bool | None]:
        outcome = await pipeline.reply(message(author, text, clock=clock))
        assert outcome.status == ReplyStatus.REPLIED
        return chat.messages()[0]["content"], outcome.receipt.head_same_as_previous

    first, _ = await ask("who wants to play chess this evening?")
    second, same = await ask("haha true")
    assert second == first and same is True
    clock.current += timedelta(days=1)
    third, same = await ask("the new RPG patch broke my save file")  # Pixel ages to 1
    assert third == first and same is True
    clock.current += timedelta(days=1)
    fourth, same = await ask("I need a new mechanical keyboard", SAM)  # Pixel ages to 2: dormant from now on
    assert fourth == first and same is True
    assert "Pixel" in fourth

    fifth, same = await ask("haha true")  # the first reply after the move: the head changes once
    assert fifth != first and same is False and "Pixel" not in fifth
    clock.current += timedelta(days=1)
    outcome = await pipeline.reply(message(RIN, "do you remember the name of my dog?", clock=clock))
    messages = chat.messages()
    assert messages[0]["content"] == fifth and outcome.receipt.head_same_as_previous is True
    assert [item["id"] for item in outcome.receipt.recalled] == [pixel]
    assert "Pixel" in messages[-1]["content"] and "Pixel" not in "".join(m["content"] for m in messages[:-1])
    assert messages[-1]["content"].index("Pixel") < messages[-1]["content"].index("[Message to answer")

    back, same = await ask("ok back to chess then", SAM)  # Pixel is on the desk again
    assert "Pixel" in back and same is False


async def test_tool_calls_save_and_forget_with_notices(
    make_pipeline: MakePipeline, chat: FakeChatServer, clock: ManualClock, pool: asyncpg.Pool
) -> None:
    pipeline = await make_pipeline()
    old = await save(pipeline.core, "Movie night used to be on Fridays")  # the message is about it: it may go
    chat.tool_calls(
        ("save_memory", {"text": "Juno's cat is called Mochi", "list": "personal"}),
        ("save_memory", {"text": "Movie night is on Saturdays", "list": "server"}),
        ("forget_memory", {"memory_id": old}),
    ).text("Got it!")
    asked = message(JUNO, "my cat is Mochi; movie night moved to Saturdays", clock=clock)
    outcome = await pipeline.reply(dataclasses.replace(asked, author_can_manage=True))  # she may forget server memories

    assert outcome.chunks == ["Got it!"] and outcome.receipt.tool_rounds == 1
    texts = await memory_texts(pool)
    assert sorted(texts.values()) == ["Juno's cat is called Mochi", "Movie night is on Saturdays"]
    assert [change.kind for change in outcome.changes] == [ChangeKind.SAVED, ChangeKind.SAVED, ChangeKind.FORGOTTEN]
    results = chat.tool_results()
    assert [result["ok"] for result in results] == [True, True, True]
    mochi = results[0]["memory_id"]
    row = await pool.fetchrow("SELECT owner_id, source, protected FROM memories WHERE id = $1", mochi)
    assert dict(row) == {"owner_id": JUNO, "source": "bot", "protected": False}
    assert outcome.notices is not None and outcome.notices.destination == "channel"
    assert outcome.notices.lines == (
        f"📝 Saved a personal memory about Juno (#{mochi})",
        f"📝 Saved a server memory (#{results[1]['memory_id']})",
        f"🗑️ Forgot a server memory (#{old})",
    )
    # the model's second request carries its calls and their results, after the unchanged prompt
    first, second = chat.requests
    assert second["messages"][: len(first["messages"])] == first["messages"]
    assert second["messages"][len(first["messages"])]["tool_calls"][0]["function"]["name"] == "save_memory"

    # verbose notices to a log channel show the text of server memories, never of personal ones
    await pipeline.servers.update_guild_settings(GUILD, Actor(1, can_manage=True),
        notices="log", notice_verbosity="verbose", log_channel_id=LOG_CHANNEL)
    chat.tool_calls(("update_memory", {"memory_id": mochi, "text": "Juno's cats are Mochi and Tofu"})).text("Updated.")
    outcome = await pipeline.reply(message(JUNO, "I adopted Tofu too", clock=clock))
    assert outcome.notices is not None
    assert (outcome.notices.destination, outcome.notices.log_channel_id) == ("log", LOG_CHANNEL)
    assert outcome.notices.lines == (f"✏️ Updated a personal memory about Juno (#{mochi})",)


async def test_full_list_forgets_a_dormant_memory_to_make_room(
    make_pipeline: MakePipeline, chat: FakeChatServer, clock: ManualClock, pool: asyncpg.Pool
) -> None:
    pipeline = await make_pipeline(server_memory_limit=3, merge_max_chars=0)  # merging off: the forgetting alone
    await pipeline.core.servers.update_guild_settings(GUILD, Actor(1, can_manage=True), notice_verbosity="verbose")
    # three facts that belong nowhere together, so nothing can be merged: one of them has to go
    texts = ("The wiki lives on Notion", "Bau won the 2024 chess cup", "The mascot is a grey heron")
    ids = [await save(pipeline.core, text) for text in texts]
    await pool.execute("UPDATE memories SET days_unused = 30")  # all three in the drawer, never matched
    chat.tool_calls(("save_memory", {"text": "The raid is on Thursday", "list": "server"})).text("Saved.")
    outcome = await pipeline.reply(message(JUNO, "raid moved to Thursday", clock=clock))

    kinds = [change.kind for change in outcome.changes]
    assert kinds == [ChangeKind.SAVED, ChangeKind.MADE_ROOM]
    assert outcome.changes[1].memory_id == ids[0]
    assert outcome.notices is not None
    assert outcome.notices.lines[1] == f"📦 Forgot a server memory (#{ids[0]}) to make room: “{texts[0]}”"
    assert chat.tool_results()[0]["forgotten_to_make_room"] == [{"id": ids[0], "text": texts[0]}]
    assert sorted((await memory_texts(pool)).values()) == sorted([*texts[1:], "The raid is on Thursday"])

    # full again, nothing dormant: rejected with a reason, nothing deleted
    await pool.execute("UPDATE memories SET days_unused = 0")
    chat.tool_calls(("save_memory", {"text": "One more fact", "list": "server"})).text("Hm.")
    outcome = await pipeline.reply(message(JUNO, "remember one more", clock=clock))
    assert [change.kind for change in outcome.changes] == [ChangeKind.REJECTED]
    assert outcome.notices is not None and "the list is full" in outcome.notices.lines[0]
    assert chat.tool_results()[0]["ok"] is False
    assert len(await memory_texts(pool)) == 3


async def test_full_list_joins_two_related_memories_before_it_forgets(
    make_pipeline: MakePipeline, chat: FakeChatServer, clock: ManualClock, pool: asyncpg.Pool
) -> None:
    pipeline = await make_pipeline(server_memory_limit=3)
    await pipeline.core.servers.update_guild_settings(GUILD, Actor(1, can_manage=True), notice_verbosity="verbose")
    ids = [await save(pipeline.core, text) for text in
           ("Game night is on Fridays", "Game night starts at 8pm", "The server has a pottery channel")]
    await pool.execute("UPDATE memories SET days_unused = 30")  # all in the drawer: each could be forgotten
    chat.tool_calls(("save_memory", {"text": "The raid is on Thursday", "list": "server"})).text("Saved.")
    outcome = await pipeline.reply(message(JUNO, "raid moved to Thursday", clock=clock))

    assert [change.kind for change in outcome.changes] == [ChangeKind.SAVED, ChangeKind.MERGED]
    merged = "Game night is on Fridays. Game night starts at 8pm"
    assert outcome.notices is not None
    assert outcome.notices.lines[1] == (
        f"🧩 To make room, joined #{ids[1]} into a server memory (#{ids[0]}), which now holds both: “{merged}”"
    )
    assert chat.tool_results()[0]["merged_to_make_room"] == [{"id": ids[0], "absorbed": ids[1], "text": merged}]
    assert "forgotten_to_make_room" not in chat.tool_results()[0]  # nothing forgotten: no empty field to turn into prose
    assert sorted((await memory_texts(pool)).values()) == [merged, "The raid is on Thursday",
                                                             "The server has a pottery channel"]


async def test_malformed_tool_calls_change_nothing(
    make_pipeline: MakePipeline, chat: FakeChatServer, clock: ManualClock, pool: asyncpg.Pool
) -> None:
    pipeline = await make_pipeline(memory_max_chars=50)
    kept = await save(pipeline.core, "The server was founded in 2019")
    other_guild_memory = await save(pipeline.core, "A fact from another server", guild=GUILD + 1)
    chat.tool_calls(
        ("save_memory", '{"text": "unterminated'),
        ("save_memory", "[1, 2]"),
        ("launch_rockets", {"count": 3}),
        ("forget_memory", {"memory_id": 424242}),
        ("forget_memory", {"memory_id": other_guild_memory}),
        ("update_memory", {"memory_id": kept, "text": "x" * 51}),
        ("update_memory", {"memory_id": "abc", "text": "fine"}),
        ("save_memory", {"text": "", "list": "server"}),
        ("save_memory", {"text": "ok text", "list": "everyone"}),
        ("save_memory", {"text": "about a stranger", "list": "personal", "about_user": "777"}),
        ("save_memory", {"text": "server facts are not global", "list": "server", "global": True}),
    ).text("Sorry, my tools misbehaved.")
    before = await memory_texts(pool)
    outcome = await pipeline.reply(message(JUNO, "please remember stuff", clock=clock))

    assert outcome.status == ReplyStatus.REPLIED
    assert await memory_texts(pool) == before
    assert outcome.changes == [] and outcome.notices is None
    results = chat.tool_results()
    assert len(results) == 11 and not any(result["ok"] for result in results)
    errors = [result["error"] for result in results]
    assert "not valid JSON" in errors[0] and "JSON object" in errors[1] and "launch_rockets" in errors[2]
    assert "no memory #424242" in errors[3] and f"no memory #{other_guild_memory}" in errors[4]
    assert "limit is 50" in errors[5] and "must be the number shown" in errors[6] and "non-empty" in errors[7]
    assert "list must be one of" in errors[8] and "not in this conversation" in errors[9] and "global" in errors[10]


async def test_tool_rounds_are_bounded(make_pipeline: MakePipeline, chat: FakeChatServer, clock: ManualClock) -> None:
    pipeline = await make_pipeline(max_tool_rounds=2)
    for number in range(5):
        chat.tool_calls(("save_memory", {"text": f"Fact number {number}", "list": "server"}))
    outcome = await pipeline.reply(message(JUNO, "save everything", clock=clock))
    assert outcome.receipt.tool_rounds == 2 and len(chat.requests) == 4  # two rounds, the answer asked for twice
    # the answer is asked for with no tools at all: a model that still sees them writes another call
    assert "tools" not in chat.requests[-1] and "tool_choice" not in chat.requests[-1]
    assert all("tools" in request for request in chat.requests[:2])
    assert [change.kind for change in outcome.changes] == [ChangeKind.SAVED, ChangeKind.SAVED]


async def test_self_teaching_off_and_privacy_are_respected(
    make_pipeline: MakePipeline, chat: FakeChatServer, clock: ManualClock, pool: asyncpg.Pool
) -> None:
    pipeline = await make_pipeline()
    await pipeline.core.servers.set_privacy(JUNO, Privacy.PARTIAL)
    chat.tool_calls(("save_memory", {"text": "Juno hates mornings", "list": "personal"})).text("ok")
    outcome = await pipeline.reply(message(JUNO, "I hate mornings", clock=clock))
    assert [change.kind for change in outcome.changes] == [ChangeKind.REJECTED]
    assert outcome.notices is not None and "privacy" in outcome.notices.lines[0]
    assert await memory_texts(pool) == {}

    await pipeline.core.servers.update_guild_settings(GUILD, Actor(1, can_manage=True), self_teaching=False)
    await pipeline.reply(message(SAM, "hello", clock=clock))
    assert "tools" not in chat.requests[-1]


async def test_chat_model_error_or_timeout_gives_an_apology_and_changes_nothing(
    make_pipeline: MakePipeline, chat: FakeChatServer, clock: ManualClock, pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    pipeline = await make_pipeline(chat_timeout_s=1.0)
    await save(pipeline.core, "The server was founded in 2019")
    before = await memory_texts(pool)
    chat.error(500)
    outcome = await pipeline.reply(message(JUNO, "hello?", clock=clock))
    assert outcome.status == ReplyStatus.MODEL_ERROR and outcome.chunks == [APOLOGY]
    assert outcome.error is not None and "Chat model fake-model failed" in caplog.text
    assert await memory_texts(pool) == before and outcome.notices is None

    chat.stall(10)
    started = asyncio.get_running_loop().time()
    outcome = await pipeline.reply(message(JUNO, "still there?", clock=clock))
    assert outcome.status == ReplyStatus.MODEL_ERROR and outcome.chunks == [APOLOGY]
    assert asyncio.get_running_loop().time() - started < 5
    chat.raw("this is not json")
    outcome = await pipeline.reply(message(JUNO, "and now?", clock=clock))
    assert outcome.status == ReplyStatus.MODEL_ERROR
    assert await memory_texts(pool) == before

    outcome = await pipeline.reply(message(JUNO, "back?", clock=clock))  # one bad reply never breaks the next
    assert outcome.status == ReplyStatus.REPLIED


async def test_long_replies_are_split_and_never_broadcast(
    make_pipeline: MakePipeline, chat: FakeChatServer, clock: ManualClock
) -> None:
    pipeline = await make_pipeline()
    long_text = " ".join(f"Sentence number {i} says something useful." for i in range(200)) + " @everyone"
    chat.text(long_text)
    outcome = await pipeline.reply(message(JUNO, "tell me a lot", clock=clock))
    assert len(outcome.chunks) >= 4 and all(len(chunk) <= 2000 for chunk in outcome.chunks)
    assert all(chunk.endswith(".") for chunk in outcome.chunks[:-1])
    assert "@everyone" not in outcome.text and f"@{ZERO_WIDTH_SPACE}everyone" in outcome.text


async def test_memory_text_with_mentions_never_pings_in_notices(
    make_pipeline: MakePipeline, chat: FakeChatServer, clock: ManualClock
) -> None:
    pipeline = await make_pipeline()
    await pipeline.core.servers.update_guild_settings(GUILD, Actor(1, can_manage=True), notice_verbosity="verbose")
    chat.tool_calls(("save_memory", {"text": "Party at 8, tell @everyone and <@&42> and <@103>", "list": "server"})).text("ok")
    outcome = await pipeline.reply(message(JUNO, "party at 8!", clock=clock))
    assert outcome.notices is not None
    line = outcome.notices.lines[0]
    for ping in ("@everyone", "<@&42>", "<@103>"):
        assert ping not in line
    assert line.replace(ZERO_WIDTH_SPACE, "").endswith("“Party at 8, tell @everyone and <@&42> and <@103>”")
    # in the prompt it is just quoted data
    chat.text("ok")
    await pipeline.reply(message(JUNO, "what's up?", clock=clock))
    assert '"text": "Party at 8, tell @everyone and <@&42> and <@103>"' in chat.messages()[0]["content"]


async def test_budgets_drop_oldest_history_first_and_never_the_answered_message(
    make_pipeline: MakePipeline, chat: FakeChatServer, clock: ManualClock
) -> None:
    pipeline = await make_pipeline(chat_context_tokens=2400, chat_max_output_tokens=200, context_messages=30)
    for number in range(25):
        await pipeline.chat_log.record(
            message(SAM if number % 2 else RIN, f"chatter {number} " + "lorem ipsum " * 25, clock=clock)
        )
    answered = message(JUNO, "what were we talking about? " + "really " * 40, clock=clock)
    outcome = await pipeline.reply(answered)
    messages = chat.messages()
    history = [m["content"] for m in messages[1:-1]]
    assert 0 < len(history) < 25
    assert history[-1].startswith("Sam (user 102): chatter 24") or history[-1].startswith("Rin (user 103): chatter 24")
    first_kept = int(history[0].split("chatter ")[1].split()[0])
    assert [int(text.split("chatter ")[1].split()[0]) for text in history] == list(range(first_kept, 25))
    assert messages[-1]["content"].endswith(answered.text)
    dropped = [item["key"] for item in outcome.receipt.dropped]
    assert len(dropped) == first_kept and all(key.startswith("history:") for key in dropped)
    assert outcome.receipt.tokens["total"] + 200 <= 2400

    # tool rounds grow the request; the oldest history makes room again
    chat.tool_calls(("save_memory", {"text": "A long fact. " * 70, "list": "server"})).text("saved")
    outcome = await pipeline.reply(message(JUNO, "remember this long fact", clock=clock))
    assert outcome.status == ReplyStatus.REPLIED and outcome.changes[0].kind == ChangeKind.SAVED
    first, second = chat.requests[-2:]
    tools = count_tokens(json.dumps(first["tools"]))  # the answer's request has none, yet is budgeted as if it had
    for request in (first, second):
        assert sum(message_tokens(m) for m in request["messages"]) + tools + 3 + 200 <= 2400
    assert second["messages"][-2]["tool_calls"] and second["messages"][-1]["role"] == "tool"
    assert len([m for m in second["messages"] if "chatter" in (m["content"] or "")]) < len(
        [m for m in first["messages"] if "chatter" in (m["content"] or "")]
    )


async def test_openai_itself_gets_max_completion_tokens(make_pipeline: MakePipeline) -> None:
    pipeline = await make_pipeline(chat_base_url="", chat_api_key="sk-test")
    assert pipeline.model.configured
    assert pipeline.model._completion_kwargs() == {"model": "fake-model", "temperature": 0.7, "max_completion_tokens": 800}
    pipeline = await make_pipeline(chat_base_url="https://api.openai.com/v1")
    assert "max_completion_tokens" in pipeline.model._completion_kwargs()
    assert not (await make_pipeline(chat_base_url="", chat_api_key="")).model.configured


async def test_no_chat_model_shows_what_would_have_been_sent(
    make_pipeline: MakePipeline, chat: FakeChatServer, clock: ManualClock
) -> None:
    pipeline = await make_pipeline(chat_base_url="", chat_model="", dormant_after_days=1)
    pixel = await save(pipeline.core, "Rin's dog is called Pixel")
    await save(pipeline.core, "The server meets on Fridays @everyone")
    clock.current += timedelta(days=1)
    await pipeline.reply(message(RIN, "who wants to play chess this evening?", clock=clock))  # both age into the drawer
    clock.current += timedelta(days=1)
    outcome = await pipeline.reply(message(RIN, "do you remember the name of my dog?", clock=clock))
    assert outcome.status == ReplyStatus.NO_MODEL and chat.requests == []
    text = outcome.text
    assert "no chat model configured" in text and "CHAT_MODEL" in text
    assert "Desk: 0 active memories." in text
    assert f"#{pixel} (score" in text and "back on the desk" in text and "Rin's dog is called Pixel" in text
    assert "Tokens:" in text

    outcome = await pipeline.reply(message(RIN, "speedrunning Celeste is so hard", clock=clock))
    text = outcome.text
    assert "Rin's dog is called Pixel" in text and "Recalled: nothing, because nothing relevant" in text
    assert "@everyone" not in text  # a dry run quotes memories: defused like notices


async def test_one_reply_at_a_time_per_channel(make_pipeline: MakePipeline, chat: FakeChatServer, clock: ManualClock) -> None:
    pipeline = await make_pipeline()
    # each answer waits for a second request in flight, which must not come while one for this channel is
    chat.stall(0.5, "first", until_in_flight=2).stall(0.5, "second", until_in_flight=2)
    same = await asyncio.gather(
        pipeline.reply(message(JUNO, "one", clock=clock)), pipeline.reply(message(SAM, "two", clock=clock))
    )
    assert [outcome.chunks for outcome in same] == [["first"], ["second"]]
    assert chat.max_in_flight == 1
    # the second reply saw the first message in its context window
    assert any("one" in m["content"] for m in chat.messages()[1:-1])
    chat.stall(60, "a", until_in_flight=2).stall(60, "b", until_in_flight=2)  # two channels: they meet, however slow
    await asyncio.gather(
        pipeline.reply(message(JUNO, "three", clock=clock)),
        pipeline.reply(message(SAM, "four", clock=clock, channel=OTHER_CHANNEL)),
    )
    assert chat.max_in_flight == 2


async def test_participants_are_the_author_and_the_window_authors_never_the_mentioned(
    make_pipeline: MakePipeline, chat: FakeChatServer, clock: ManualClock
) -> None:
    pipeline = await make_pipeline()
    await save(pipeline.core, "Sam works night shifts", owner=SAM, via=Source.COMMAND)
    await save(pipeline.core, "Rin plays the drums", owner=RIN, via=Source.COMMAND)
    await save(pipeline.core, "Juno is learning the cello", owner=JUNO, via=Source.COMMAND)
    outcome = await pipeline.reply(message(JUNO, "hi", clock=clock))
    assert "night shifts" not in chat.messages()[0]["content"] and len(outcome.receipt.desk_ids) == 1
    await pipeline.chat_log.record(message(SAM, "hey", clock=clock))
    # Rin is only mentioned: her memories stay out, and the model may not save about her
    chat.tool_calls(("save_memory", {"text": "Rin has a gig on Sunday", "list": "personal", "about_user": f"<@{RIN}>"}))
    outcome = await pipeline.reply(message(JUNO, "ask Rin about it", clock=clock, mentions=(RIN, BOT)))
    head = chat.messages()[0]["content"]
    assert "night shifts" in head and "cello" in head and "drums" not in head
    assert outcome.changes == [] and "not in this conversation" in chat.tool_results(-1)[0]["error"]
    # once Rin writes in the channel she takes part: her memories count; still, what Juno says about her is not
    # Rin's memory to be saved in Juno's reply (the model saves personal memories only about the person it answers)
    await pipeline.chat_log.record(message(RIN, "I'm here", clock=clock))
    chat.tool_calls(("save_memory", {"text": "Rin has a gig on Sunday", "list": "personal", "about_user": f"<@{RIN}>"}))
    outcome = await pipeline.reply(message(JUNO, "Rin has a gig sunday", clock=clock, mentions=(RIN,)))
    assert "drums" in chat.messages()[0]["content"]
    assert outcome.changes[0].kind == ChangeKind.REJECTED and outcome.changes[0].about_user_id == RIN
    chat.tool_calls(("save_memory", {"text": "Rin has a gig on Sunday", "list": "personal", "about_user": f"<@{RIN}>"}))
    outcome = await pipeline.reply(message(RIN, "I have a gig sunday", clock=clock))  # Rin's own reply: hers
    assert outcome.changes[0].kind == ChangeKind.SAVED and outcome.changes[0].about_user_id == RIN


async def test_dm_offers_only_personal_memories(make_pipeline: MakePipeline, chat: FakeChatServer, clock: ManualClock) -> None:
    pipeline = await make_pipeline()
    chat.tool_calls(("save_memory", {"text": "Juno prefers tea", "list": "personal"})).text("noted")
    outcome = await pipeline.reply(message(JUNO, "I prefer tea", clock=clock, guild=None, channel=777))
    tools = chat.requests[0]["tools"]
    assert tools[0]["function"]["parameters"]["properties"]["list"]["enum"] == ["personal"]
    assert outcome.notices is not None and outcome.notices.verbosity == "verbose"
    assert outcome.notices.lines[0].endswith("“Juno prefers tea”")
    assert "Name: Deskmate" in chat.messages(0)[0]["content"]


async def test_trigger_uses_persona_name_auto_reply_channels_and_blocklist(
    make_pipeline: MakePipeline, clock: ManualClock
) -> None:
    pipeline = await make_pipeline()
    chat = ChatService(pipeline, pipeline.chat_log, pipeline.servers, pipeline.settings)
    await pipeline.servers.update_persona(GUILD, Actor(1, can_manage=True), name="Heron")
    assert await chat.trigger(message(JUNO, "hey heron, what's up", clock=clock)) == Trigger.NAME
    assert await chat.trigger(message(JUNO, "nothing to see", clock=clock)) is None
    assert await chat.trigger(message(JUNO, "x", clock=clock), mentions_bot=True) == Trigger.MENTION
    assert await chat.trigger(message(JUNO, "x", clock=clock, guild=None)) == Trigger.DM
    assert await chat.trigger(message(BOT, "heron", clock=clock), mentions_bot=True) is None
    await pipeline.core.servers.update_guild_settings(GUILD, Actor(1, can_manage=True), auto_reply_channel_ids=[CHANNEL])
    assert await chat.trigger(message(SAM, "anything", clock=clock)) == Trigger.AUTO_REPLY
    thread = dataclasses.replace(message(SAM, "in a thread", clock=clock, channel=4242), parent_channel_id=CHANNEL)
    assert await chat.trigger(thread) == Trigger.AUTO_REPLY
    await pipeline.core.servers.set_blocked(GUILD, SAM, True)
    assert await chat.trigger(message(SAM, "heron!", clock=clock), mentions_bot=True) is None


async def test_context_window_records_edits_deletes_and_backfill(
    make_pipeline: MakePipeline, chat: FakeChatServer, clock: ManualClock
) -> None:
    pipeline = await make_pipeline(context_messages=3)
    assert await pipeline.chat_log.is_empty(CHANNEL)
    older = [message(SAM, f"old {i}", clock=clock) for i in range(5)]
    assert await pipeline.chat_log.record_backfill(older) == 5
    assert await pipeline.chat_log.record_backfill(older) == 0
    assert not await pipeline.chat_log.is_empty(CHANNEL)
    await pipeline.chat_log.edit(CHANNEL, older[4].message_id, "old 4 (edited)", clock.now())
    await pipeline.chat_log.delete(CHANNEL, [older[3].message_id])
    await pipeline.reply(message(JUNO, "hi", clock=clock))
    history = [m["content"] for m in chat.messages()[1:-1]]
    assert history == ["Sam (user 102): old 2", "Sam (user 102): old 4 (edited)"]
    assert (await build_services(pipeline.core).delete_user_data(SAM))["chat_messages"] == 4


async def test_a_persona_too_large_for_the_context_is_an_apology_not_a_request(
    make_pipeline: MakePipeline, chat: FakeChatServer, clock: ManualClock
) -> None:
    pipeline = await make_pipeline(chat_context_tokens=2048, chat_max_output_tokens=1000)
    await pipeline.servers.update_persona(GUILD, Actor(1, can_manage=True), prompt="Be very detailed. " * 220)
    outcome = await pipeline.reply(message(JUNO, "hi", clock=clock))
    assert outcome.status == ReplyStatus.PROMPT_TOO_LARGE and outcome.chunks == [TOO_LARGE]
    assert outcome.error is not None and "CHAT_CONTEXT_TOKENS is 2048" in outcome.error
    assert chat.requests == []


async def test_a_new_tail_source_plugs_in_reuses_the_one_embedding_and_goes_near_the_end(
    make_pipeline: MakePipeline, chat: FakeChatServer, clock: ManualClock
) -> None:
    """A third source is one class with a name and `find`: the pipeline and the receipt need no change for it."""
    pipeline = await make_pipeline()
    seen: list[object] = []

    class Rules:
        name, title, heading, part = "rules", "server rules", "Rules of this server", "rules"

        async def find(self, incoming: IncomingMessage, recall: Recall) -> TailReport:
            seen.append(recall.query_vector)
            item = TailItem("server_rule", "rule:1", '"Rule 1: be kind"', 0.8, meta={"source": self.name, "rule": 1})
            return TailReport(self.name, [item])

    class Broken:
        name, title, heading, part = "broken", "broken index", "Broken index", "broken"

        async def find(self, incoming: IncomingMessage, recall: Recall) -> TailReport:
            raise RuntimeError("index offline")

    pipeline.sources += [Broken(), Rules()]
    outcome = await pipeline.reply(message(JUNO, "what are the rules?", clock=clock))
    assert outcome.status == ReplyStatus.REPLIED
    assert len(seen) == 1 and seen[0] is outcome.recall.query_vector and seen[0] is not None
    final = chat.messages()[-1]["content"]
    assert final.index("Rule 1: be kind") < final.index("[Message to answer")
    assert "Rule 1" not in chat.messages()[0]["content"]
    assert outcome.receipt.items("rules") == [{"rule": 1}]
    assert outcome.receipt.tail_tokens["rules"] > 0
    assert outcome.receipt.sources["broken"]["note"] == "failed: RuntimeError"
    assert "server rules: " in outcome.receipt.render()


async def test_the_receipt_tells_a_memory_that_came_back_from_one_only_shown(
    make_pipeline: MakePipeline, clock: ManualClock
) -> None:
    pipeline = await make_pipeline(chat_base_url="", chat_model="", dormant_after_days=1, max_used=1, max_recalled=2)
    dog = await save(pipeline.core, "Rin's dog is called Pixel")
    walks = await save(pipeline.core, "Rin walks the dog every evening")
    clock.current += timedelta(days=1)
    await pipeline.reply(message(RIN, "the train was late again", clock=clock))  # both age into the drawer
    clock.current += timedelta(days=1)
    outcome = await pipeline.reply(message(RIN, "tell me about my dog Pixel and our walks", clock=clock))
    assert [s.memory.id for s in outcome.recall.used] == [dog]
    assert f"#{dog} (score" in outcome.text and f"#{walks} (score" in outcome.text
    lines = {line.split(")")[0] for line in outcome.text.splitlines() if line.strip().startswith("#")}
    assert any(line.strip().startswith(f"#{dog} ") and "back on the desk" in line for line in lines)
    assert any(line.strip().startswith(f"#{walks} ") and "stays in the drawer" in line for line in lines)


# A full disk, raised by PostgreSQL itself (SQLSTATE 53100) on every memory written, as a disk with no room left would.
DISK_FULL_SQL = """
CREATE FUNCTION test_disk_full() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'could not extend file "base/1/2": No space left on device' USING ERRCODE = 'disk_full'; END $$;
CREATE TRIGGER test_disk_full BEFORE INSERT OR UPDATE ON memories FOR EACH ROW EXECUTE FUNCTION test_disk_full();
"""


async def test_a_full_disk_during_a_save_is_one_clear_sentence(
    make_pipeline: MakePipeline, chat: FakeChatServer, clock: ManualClock, pool: asyncpg.Pool
) -> None:
    from bot.failures import DISK_FULL, database_sentence
    from cogs.ui import error_sentence

    pipeline = await make_pipeline()
    await pool.execute(DISK_FULL_SQL)
    chat.tool_calls(("save_memory", {"text": "The raid is on Thursday", "list": "server"})).text("I could not save that.")
    outcome = await pipeline.reply(message(JUNO, "raid moved to Thursday", clock=clock))
    assert outcome.text == "I could not save that."  # the reply still goes out
    assert chat.tool_results()[0] == {"ok": False, "error": DISK_FULL}
    assert await memory_texts(pool) == {}

    with pytest.raises(asyncpg.exceptions.DiskFullError) as raised:  # a command's save meets the same error
        await save(pipeline.core, "Movie night is on Saturdays")
    assert database_sentence(raised.value) == DISK_FULL
    assert error_sentence(raised.value) is not None and "disk is full" in (error_sentence(raised.value) or "")
