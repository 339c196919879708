"""Privacy and permissions, table-driven, against the real database and pipeline.

One world holds every combination of the hiding rules: users at each privacy level and one blocked in a
server; a server with personal memories off and one with tagging on; personal memories tied to each
server's persona, to the DM persona, or Global; memories limited to a channel or tagged. For every
conversation (each server and channel, with and without the tag in the conversation, and DMs), an
oracle written from the spec says which memories may be seen, and the test checks exactly those:

- reach the prompt (the desk in the request the chat model receives),
- are searched and used (every memory matches the message, and MAX_USED is large),
- age on a later day (hidden memories never age),
- can be changed by the model (a tool call on a hidden id is refused, with no notice),

then which memories each command shows (lists, search, exports, export-my-data) and which commands
are refused to whom (owner, other member, Manage Server; server vs DM). Personal data is only ever
shown ephemerally or in DMs, and `delete-my-data` leaves no row of the user in any table.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import pytest

from bot.chat.messages import IncomingMessage, UserRef
from bot.chat.model import MAX_CALLS_PER_ANSWER
from bot.chat.notices import ChangeKind
from bot.chat.reply import ReplyOutcome, ReplyPipeline
from bot.clock import ManualClock
from bot.documents.service import DocumentLibrary
from bot.embeddings.providers import DeadlineEmbedder
from bot.history.service import HistoryIndex
from bot.memory.lists import ImportMode, Scope
from bot.memory.manage import MemoryManager
from bot.memory.models import Memory, MemoryList, NewMemory, Source
from bot.memory.service import MemoryCore
from bot.servers.models import Actor, Privacy
from bot.services import build_services
from tests.conftest import MakeCore
from tests.discord_fakes import GUILD_ID, Person, SlashHarness
from tests.fakes import FakeChatServer
from tests.load_world import TopicEmbedder
from tests.test_slash_commands import ADMIN, DM_CHANNEL, JUNO, MAX, core_of, harness  # noqa: F401  (fixture)

TAGGED, NO_PERSONAL, PLAIN = 1, 2, 3  # servers: tagging on / personal memories off / defaults
CHANNELS = {TAGGED: (11, 12), NO_PERSONAL: (21,), PLAIN: (31,)}
BOT = 9000
AUTHOR = 500  # talks to the bot and mentions everyone; has no memories
OPEN, PARTIAL, FULL, BLOCKED = 501, 502, 503, 504  # privacy none / partial / full / none but blocked in TAGGED
USERS = {OPEN: Privacy.NONE, PARTIAL: Privacy.PARTIAL, FULL: Privacy.FULL, BLOCKED: Privacy.NONE}
SCOPES = (TAGGED, NO_PERSONAL, PLAIN, "global", "dm")  # the persona a personal memory is tied to
LIMITS = ("none", "channel", "tag")


@dataclass(frozen=True)
class Spec:
    """A memory of the world, as the oracle sees it."""

    list: str
    scope: int | str  # server memories: their server; personal: a server's persona, "global" or "dm"
    owner: int | None
    channels: tuple[int, ...]
    tags: tuple[str, ...]

    @property
    def text(self) -> str:
        # the tag names stay out of the text: "how are the cats?" must match a memory through its
        # tag (visibility) and the test embedder, not by sharing the word (hybrid scoring)
        who = f"user {self.owner}" if self.owner else "the server"
        return f"fact- about {who}, {self.scope}, channels {self.channels}, {len(self.tags)} tags"


@dataclass(frozen=True)
class Context:
    guild: int | None
    channel: int
    author: int
    mentions: tuple[int, ...]
    text: str
    writers: tuple[int, ...] = ()  # wrote the messages of the context window just before

    @property
    def participants(self) -> tuple[int, ...]:
        """The author and the window's authors; someone only @mentioned takes no part."""
        return (self.author, *self.writers)


def world_specs() -> list[Spec]:
    specs = []
    for guild in (TAGGED, NO_PERSONAL, PLAIN):
        specs += [
            Spec("server", guild, None, (), ()),
            Spec("server", guild, None, (CHANNELS[guild][0],), ()),
            Spec("server", guild, None, (999,), ()),  # limited to a channel the conversations never use
            Spec("server", guild, None, (), ("cats",)),
            Spec("server", guild, None, (), ("dogs",)),
        ]
    for user, scope, limit in itertools.product(USERS, SCOPES, LIMITS):
        channels = (CHANNELS[TAGGED][0],) if limit == "channel" else ()
        specs.append(Spec("personal", scope, user, channels, ("cats",) if limit == "tag" else ()))
    return specs


def contexts() -> list[Context]:
    everyone = tuple(USERS)
    found = []
    for guild, channels in CHANNELS.items():
        for channel in channels:
            for words in ("fact- check, how are the cats?", "fact- check"):
                found.append(Context(guild, channel, AUTHOR, (), words, writers=everyone))
                found.append(Context(guild, channel, AUTHOR, everyone, words))  # mentioned only: not participants
    for user in USERS:
        found.append(Context(None, 7000 + user, user, (), "fact- check, how are the cats?"))
    return found


def visible(spec: Spec, ctx: Context) -> bool:
    """the hiding rules, written from the spec and independently of the SQL."""
    tagging = ctx.guild == TAGGED
    words = set(re.findall(r"[\w-]+", ctx.text.casefold()))
    if spec.channels and ctx.channel not in spec.channels:
        return False
    if tagging and spec.tags and not set(spec.tags) & words:
        return False
    if spec.list == "server":
        return spec.scope == ctx.guild
    assert spec.owner is not None
    if spec.owner not in ctx.participants or USERS[spec.owner] == Privacy.FULL:
        return False
    if ctx.guild is not None and (ctx.guild == NO_PERSONAL or (ctx.guild == TAGGED and spec.owner == BLOCKED)):
        return False
    return spec.scope == "global" or spec.scope == (ctx.guild if ctx.guild is not None else "dm")


# --- the world in the database ---------------------------------------------------------------------------


@dataclass
class World:
    pipeline: ReplyPipeline
    chat: FakeChatServer
    clock: ManualClock
    ids: dict[Spec, int]

    @property
    def core(self) -> MemoryCore:
        return self.pipeline.core

    def spec_of(self, memory_id: int) -> Spec:
        return next(spec for spec, known in self.ids.items() if known == memory_id)


@pytest.fixture
async def world(make_core: MakeCore) -> AsyncIterator[World]:
    async with FakeChatServer() as chat:
        core = await make_core(
            embedder=DeadlineEmbedder(TopicEmbedder(0), 30.0), chat_base_url=chat.base_url, chat_model="fake-model",
            max_used=500, memory_token_budget=20_000, context_messages=len(USERS) + 1, max_memory_actions_per_reply=10,
            duplicate_similarity=1.01,  # the topic embedder gives every fact the same vector: exact text only
        )
        pipeline = build_services(core, bot_user_id=BOT).pipeline
        await pipeline.servers.sync_default_persona()
        await core.servers.update_guild_settings(TAGGED, Actor(1, can_manage=True), tagging=True)
        await core.servers.update_guild_settings(NO_PERSONAL, Actor(1, can_manage=True), personal_memories=False)
        await core.servers.set_blocked(TAGGED, BLOCKED, True)
        ids = {}
        for spec in world_specs():
            result = await core.save(NewMemory(
                MemoryList(spec.list), spec.text, by=spec.owner or 1, via=Source.COMMAND,
                guild_id=spec.scope if isinstance(spec.scope, int) else None, owner_id=spec.owner,
                is_global=spec.scope == "global", tags=spec.tags, channel_ids=spec.channels, by_can_manage=True,
            ))
            assert result.saved is not None, (spec, result.detail)
            ids[spec] = result.saved.id
        for user, level in USERS.items():  # after the saves: `partial` would not stop a command save anyway
            await core.servers.set_privacy(user, level)
        try:
            yield World(pipeline, chat, core.clock, ids)  # type: ignore[arg-type]
        finally:
            await pipeline.model.close()


_message_ids = itertools.count(1)


def incoming(ctx: Context, world: World, text: str | None = None) -> IncomingMessage:
    return IncomingMessage(
        message_id=next(_message_ids), channel_id=ctx.channel, author_id=ctx.author, author_name=f"user{ctx.author}",
        text=text or ctx.text, created_at=world.clock.now(), guild_id=ctx.guild,
        mentions=tuple(UserRef(user, f"user{user}") for user in ctx.mentions),
    )


async def converse(world: World, ctx: Context, text: str | None = None) -> ReplyOutcome:
    """The context window (each writer's message, or the author's when nobody else writes), then the reply."""
    for writer in ctx.writers or (ctx.author,) * len(USERS):
        said = dataclasses.replace(ctx, author=writer, mentions=())
        await world.pipeline.chat_log.record(incoming(said, world, "hi"))
    return await world.pipeline.reply(incoming(ctx, world, text))


def shown_ids(content: str) -> set[int]:
    return {json.loads(line)["id"] for line in content.splitlines() if line.startswith('{"id"')}


async def test_exactly_the_visible_memories_reach_the_prompt_the_search_and_the_tools(world: World) -> None:
    """Every conversation of the table: prompt, search and tool calls see exactly what the oracle allows."""
    checked = 0
    for ctx in contexts():
        expected = {known for spec, known in world.ids.items() if visible(spec, ctx)}
        hidden = sorted(set(world.ids.values()) - expected)
        tried = hidden[:MAX_CALLS_PER_ANSWER]
        world.chat.tool_calls(*(("forget_memory", {"memory_id": memory_id}) for memory_id in tried)).text("ok")
        before = len(world.chat.requests)
        outcome = await converse(world, ctx)
        head = world.chat.requests[before]["messages"][0]["content"]
        assert shown_ids(head) == expected, (ctx, sorted(shown_ids(head) ^ expected))
        assert {scored.memory.id for scored in outcome.recall.used} == expected, ctx  # searched and matched
        assert outcome.changes == [] and outcome.notices is None, ctx  # no hidden memory can be changed
        results = world.chat.tool_results(before + 1)
        assert all(not r["ok"] and "no memory #" in r["error"] for r in results) and len(results) == len(tried)
        checked += len(world.ids)
    assert len(await world.core.all_memories()) == len(world.ids) and checked == len(contexts()) * len(world.ids)

    # a later day: only what a conversation can see ages; hidden memories never do
    for ctx in (contexts()[0], contexts()[1], contexts()[-1]):
        ctx = dataclasses.replace(ctx, text=ctx.text.replace("fact- check", "hello there"))  # matches nothing
        world.clock.current += timedelta(days=1)
        before = {m.id: m for m in await world.core.all_memories()}
        await converse(world, ctx)
        aged = {m.id for m in await world.core.all_memories() if m.days_unused == before[m.id].days_unused + 1}
        assert aged == {known for spec, known in world.ids.items() if visible(spec, ctx)}, ctx


async def test_the_model_may_not_save_or_change_what_privacy_and_settings_forbid(world: World) -> None:
    ctx = Context(TAGGED, CHANNELS[TAGGED][0], AUTHOR, (), "fact- check", writers=tuple(USERS))
    open_tagged = world.ids[Spec("personal", TAGGED, OPEN, (), ())]
    partial_global = world.ids[Spec("personal", "global", PARTIAL, (), ())]
    world.chat.tool_calls(
        *(("save_memory", {"text": f"fact- new about {user}", "list": "personal", "about_user": str(user)}) for user in USERS),
        ("update_memory", {"memory_id": partial_global, "text": "fact- changed"}),
        ("update_memory", {"memory_id": open_tagged, "text": "fact- changed by the model"}),
    ).text("ok")
    await world.core.servers.update_guild_settings(TAGGED, Actor(1, can_manage=True), notice_verbosity="verbose")
    outcome = await converse(world, ctx)
    kinds = {(change.kind, change.about_user_id) for change in outcome.changes if change.memory_list == MemoryList.PERSONAL}
    # the model answers AUTHOR: a personal memory about anyone else is never the model's to save, whatever their privacy
    assert kinds == {(ChangeKind.REJECTED, user) for user in USERS}
    assert [c.kind for c in outcome.changes if c.memory_id == partial_global] == [ChangeKind.REJECTED]
    # the model acts for the person it answers: someone else's personal memory is not theirs to change
    assert [c.kind for c in outcome.changes if c.memory_id == open_tagged] == [ChangeKind.REJECTED]
    # verbose notices in a server show no personal text: who and what happened only
    assert outcome.notices is not None and outcome.notices.verbosity == "verbose"
    assert all("fact-" not in line for line in outcome.notices.lines), outcome.notices.lines

    # each person for themselves: open saves; partial and full refuse (privacy); blocked refuses (blocked here)
    for user in USERS:
        world.chat.tool_calls(("save_memory", {"text": f"fact- {user} told me about themselves", "list": "personal"})).text("ok")
        outcome = await converse(world, dataclasses.replace(ctx, author=user))
        [change] = outcome.changes
        assert (change.kind, change.about_user_id) == ((ChangeKind.SAVED if user == OPEN else ChangeKind.REJECTED), user)

    # personal memories off: the model is not even offered the personal list there
    world.chat.tool_calls(("save_memory", {"text": "fact- x", "list": "personal"})).text("ok")
    before = len(world.chat.requests)
    outcome = await world.pipeline.reply(incoming(Context(NO_PERSONAL, 21, OPEN, (), "fact- check"), world))
    assert world.chat.requests[before]["tools"][0]["function"]["parameters"]["properties"]["list"]["enum"] == ["server"]
    assert outcome.changes == []
    # in a DM the notice is the reader's own: verbose, with the text
    world.chat.tool_calls(("save_memory", {"text": "fact- in a DM", "list": "personal"})).text("ok")
    outcome = await world.pipeline.reply(incoming(Context(None, 7000 + OPEN, OPEN, (), "fact- check"), world))
    assert outcome.notices is not None and outcome.notices.lines[0].endswith("“fact- in a DM”")


async def test_each_command_shows_only_its_own_list(world: World) -> None:
    manager = MemoryManager(world.core)
    by_id = {known: spec for spec, known in world.ids.items()}

    def specs(memories: list[Memory]) -> set[Spec]:
        return {by_id[m.id] for m in memories if m.id in by_id}

    for guild in CHANNELS:
        ref = await manager.server_list(guild)
        page = await manager.page(ref, 0, 100)
        wanted = {spec for spec in world.ids if spec.list == "server" and spec.scope == guild}
        assert specs([view.memory for view in page.items]) == wanted  # the whole list: channel limits and tags included
        exported = (await manager.export(ref, Actor(1, can_manage=True)))["memories"]
        assert {entry["text"] for entry in exported} == {spec.text for spec in wanted}
        found = await manager.search(ref, "fact- about")
        assert specs([view.memory for view in found.items]) <= wanted

    for user, where in itertools.product(USERS, (TAGGED, PLAIN, None)):
        ref = await manager.personal_list(user, where, Scope.ALL)
        persona = "dm" if where is None else where
        wanted = {spec for spec in world.ids if spec.owner == user and spec.scope in ("global", persona)}
        assert specs([view.memory for view in (await manager.page(ref, 0, 100)).items]) == wanted, (user, where)
        assert {entry["text"] for entry in (await manager.export(ref, Actor(user)))["memories"]} == {spec.text for spec in wanted}
        assert specs([view.memory for view in (await manager.search(ref, "fact- about")).items]) <= wanted
        everything = await build_services(manager.core).export_user_data(user)
        mine = {spec.text for spec in world.ids if spec.owner == user}
        assert {entry["text"] for entry in everything["personal_memories"]} == mine  # every scope, nobody else's
        assert not any(str(other) in json.dumps(everything) for other in USERS if other != user)

    # nobody reaches someone else's memory by its id
    for spec, known in world.ids.items():
        if spec.owner is None:
            continue
        other = next(user for user in USERS if user != spec.owner)
        with pytest.raises(Exception, match="no memory"):
            await manager.get(await manager.personal_list(other, TAGGED), known)
        assert (await world.core.delete(known, by=other, via=Source.COMMAND)).rejected is not None
        assert (await world.core.edit(known, "fact- stolen", by=other, via=Source.COMMAND, by_can_manage=True)).rejected


# --- commands: who is refused what, and where answers are shown ---------------------------------------------

MANAGER = ADMIN  # has Manage Server
OWNER = JUNO  # adds server memories under member teaching, owns personal memories
OTHER = MAX


async def test_who_may_run_which_command(harness: SlashHarness) -> None:  # noqa: F811
    core = core_of(harness)
    admins = (await harness.run(harness.slash("memories add", MANAGER, text="Admin fact"))).content
    assert admins.startswith("Saved")
    admin_memory = next(m.id for m in await core.all_memories() if m.text == "Admin fact")

    table: list[tuple[str, Person, dict[str, Any], bool, str | None]] = [
        # (command, who, options, member teaching on, refusal expected (None = allowed))
        ("memories add", OTHER, {"text": "x"}, False, "Only members with Manage Server can add server memories"),
        ("memories list", OTHER, {}, False, None),
        ("memories stats", OTHER, {}, False, None),
        ("memories export", OTHER, {}, False, "Only members with Manage Server can export"),
        ("memories delete", OTHER, {"memory": admin_memory}, False, "Only members with Manage Server"),
        ("memories add", OWNER, {"text": "Owner fact"}, True, None),
        ("memories delete", OTHER, {"memory": admin_memory}, True, "You can only delete server memories you added yourself"),
        ("memories edit", OTHER, {"memory": admin_memory}, True, "You can only edit server memories you added yourself"),
        ("memories delete", MANAGER, {"memory": admin_memory}, False, None),
        ("settings self-teaching", OTHER, {"enabled": False}, False,
         "Only members with Manage Server can change Deskmate's settings"),
        ("settings blocklist list", OWNER, {}, True, "Only members with Manage Server can change Deskmate's settings"),
        ("settings show", MANAGER, {}, False, None),
        ("personal memories list", OTHER, {}, False, None),
        ("privacy level", OTHER, {}, False, None),
    ]
    for command, person, options, member_teaching, refusal in table:
        await core.servers.update_guild_settings(GUILD_ID, Actor(1, can_manage=True), member_teaching=member_teaching)
        call = await harness.run(harness.slash(command, person, **options))
        assert call.ephemeral, command  # every command answer in a server is ephemeral
        text = call.content or call.text()
        if refusal is None:
            assert not text.startswith(("Only", "You can only", "You need", "This command")), (command, person.name, text)
        else:
            assert text.startswith(refusal), (command, person.name, text)
    assert "Admin fact" in [m.text for m in await core.all_memories()]  # refused deletes changed nothing

    # in DMs: server commands are refused, personal and privacy ones work
    for command, refusal in (("memories list", "This command only works in a server."), ("personal memories list", None),
                             ("privacy level", None)):
        call = await harness.run(harness.slash(command, OWNER, guild_id=None, channel_id=DM_CHANNEL))
        assert call.ephemeral and ((call.content == refusal) if refusal else not (call.content or "").startswith("This"))


async def test_personal_data_is_only_shown_ephemerally_or_in_dms(harness: SlashHarness) -> None:  # noqa: F811
    secret = "Juno's medical appointment is on Tuesday"
    await harness.run(harness.slash("personal memories add", JUNO, text=secret))
    await harness.run(harness.slash("personal memories add", JUNO, text=secret + " (global)", scope="global"))
    start = len(harness.fake.calls)
    for path, values in (("personal memories list", {}), ("personal memories stats", {}), ("personal memories export", {}),
                         ("personal memories search", {"query": "medical"}), ("privacy export-my-data", {}),
                         ("privacy level", {}), ("personal memories list", {"scope": "global"})):
        command = harness.slash(path, JUNO, **values)
        first = await harness.run(command)
        if first.body and first.body.get("type") == 5:  # deferred: the answer is a followup
            await harness.next_call(command, after=first)
    shown = [c for c in harness.fake.calls[start:] if c.method in ("POST", "PATCH") and isinstance(c.body, dict)
             and (secret in json.dumps(c.body, ensure_ascii=False) or c.files)]
    assert len(shown) >= 5
    assert all(call.ephemeral for call in shown), [call.path for call in shown if not call.ephemeral]


# --- delete-my-data: no row of the user anywhere ------------------------------------------------------------

GONE = 424_242_424_242_424_242  # the user who deletes their data: an id no other number in the database contains
STAYS = 313_131_313_131_313_131
MARKER = "zebrafinch"  # a word only the deleting user's data contains
NAME = "Quillon"


async def rows_mentioning(pool: asyncpg.Pool, pattern: str) -> dict[str, int]:
    """Every table of the schema whose rows, as text, match `pattern` (information_schema: new tables included)."""
    tables = await pool.fetch(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' AND table_type = 'BASE TABLE'"
        " ORDER BY table_name"
    )
    found = {}
    for row in tables:
        name = row["table_name"]
        count = await pool.fetchval(f'SELECT count(*) FROM "{name}" t WHERE t::text ~* $1', pattern)
        if count:
            found[name] = count
    return found


async def test_delete_my_data_leaves_no_row_of_the_user_in_any_table(make_core: MakeCore) -> None:
    async with FakeChatServer() as chat:
        core = await make_core(chat_base_url=chat.base_url, chat_model="fake-model", context_messages=5)
        pipeline = build_services(core, bot_user_id=BOT).pipeline
        await pipeline.servers.sync_default_persona()
        manager = MemoryManager(core)
        try:
            await core.servers.update_guild_settings(PLAIN, Actor(1, can_manage=True),
                member_teaching=True, notice_verbosity="verbose")
            here = await manager.personal_list(GONE, PLAIN)
            for text, is_global in ((f"{NAME} keeps a {MARKER} called Pip", False), (f"{NAME} is allergic to {MARKER}s", True)):
                assert (await manager.add(here, text, actor=Actor(GONE), is_global=is_global)).saved
            assert (await manager.add(await manager.personal_list(GONE, None), f"{MARKER} diary", actor=Actor(GONE))).saved
            raw = json.dumps({"format": "deskmate-memories", "version": 1, "list": "personal",
                              "memories": [{"text": f"imported {MARKER}", "scope": "global"}]}).encode()
            await manager.import_memories(here, manager.parse_import(here, raw), mode=ImportMode.MERGE, actor=Actor(GONE))
            server = await manager.server_list(PLAIN)
            assert (await manager.add(server, f"the {MARKER} club meets Fridays", actor=Actor(GONE))).saved
            await core.servers.set_privacy(GONE, Privacy.PARTIAL)
            await core.servers.set_privacy(STAYS, Privacy.NONE)
            await core.servers.set_blocked(TAGGED, GONE, True)  # a server's moderation decision: kept (see below)

            def said(author: int, name: str, text: str, mentions: tuple[int, ...] = ()) -> IncomingMessage:
                return IncomingMessage(next(_message_ids), 31, author, name, text, core.clock.now(), guild_id=PLAIN,
                                       mentions=tuple(UserRef(user, NAME if user == GONE else "Sam") for user in mentions))

            await core.servers.set_privacy(GONE, Privacy.NONE)
            chat.tool_calls(("save_memory", {"text": f"{NAME} loves {MARKER} songs", "list": "personal"})).text("noted")
            await pipeline.reply(said(GONE, NAME, f"I love {MARKER} songs"))  # message, receipt with the saved text
            chat.tool_calls(("save_memory", {"text": f"Sam likes {NAME}'s {MARKER}", "list": "personal",
                                             "about_user": str(GONE)})).text("ok")
            await pipeline.reply(said(STAYS, "Sam", "hi there", mentions=(GONE,)))  # about GONE, in Sam's reply
            await pipeline.reply(said(STAYS, "Sam", "what's new?"))
            await pipeline.chat_log.record(said(GONE, NAME, f"another {MARKER} message"))
            for number in range(14):  # older history, chunked for chat-history recall
                if number == 7:
                    core.clock.current += timedelta(hours=1)  # a pause closes the first chunk
                author, name = (GONE, NAME) if number % 2 else (STAYS, "Sam")
                await pipeline.chat_log.record(said(author, name, f"chatter {number} {MARKER if author == GONE else ''}"))
            assert await HistoryIndex(core.pool, core.embeddings, core.settings).chunk_pending() > 0
            library = DocumentLibrary(core.pool, core.embeddings, core.settings, core.clock)
            await library.add(PLAIN, "rules.md", b"# Rules\nBe kind to each other.\n", Actor(GONE, can_manage=True))
            ids_before = [m.id for m in await core.all_memories() if m.owner_id == GONE]
            assert len(ids_before) >= 5

            pattern = rf"(^|[^0-9]){GONE}([^0-9]|$)|{MARKER}|{NAME}"
            before = await rows_mentioning(core.pool, pattern)  # the data really is spread over these tables
            assert set(before) >= {"memories", "chat_messages", "chat_users", "user_settings", "reply_receipts",
                                   "guild_blocklist"}
            counts = await build_services(manager.core).delete_user_data(GONE)
            assert counts["personal_memories"] == len(ids_before)

            left = await rows_mentioning(core.pool, rf"(^|[^0-9]){GONE}([^0-9]|$)")
            # the blocklist entry is the server's moderation decision, not the user's data: erasing it would let
            # anyone unblock themselves (docs/commands.md: /privacy)
            assert left == {"guild_blocklist": 1}, left
            marker_left = await rows_mentioning(core.pool, f"{MARKER}|{NAME}")
            # a server memory the user added stays with its server, no longer naming its author
            assert marker_left == {"memories": 1}, marker_left
            [kept] = [m for m in await core.all_memories() if MARKER in m.text]
            assert kept.list == MemoryList.SERVER and kept.created_by is None
            assert await core.pool.fetchval("SELECT count(*) FROM memory_vectors WHERE memory_id = ANY ($1::bigint[])",
                                            ids_before) == 0
            assert await core.pool.fetchval("SELECT count(*) FROM chat_messages WHERE author_id = $1", STAYS) == 9  # Sam's stay
        finally:
            await pipeline.model.close()



# --- withdrawals: summaries and the bots' replies (docs/memory-rules.md §9) ----------------------------------


@dataclass(frozen=True)
class Withdrawn:
    """What a withdrawal of Juno's words leaves, as the rules' table says."""

    her_words_summarised: bool  # in the day summary written again afterwards
    reply_summarised: bool  # the bot's reply repeating her words, in that summary
    reply_in_log: bool  # the bot's reply, in the stored chat (so in later context windows)
    her_message_in_log: bool  # her words as she wrote them


WITHDRAWAL_TABLE = {
    "nothing": Withdrawn(True, True, True, True),
    "message deleted": Withdrawn(False, False, True, False),
    "message edited": Withdrawn(False, False, True, False),  # the new text stands, the old words are gone
    "delete-my-data": Withdrawn(False, False, False, False),
    "blocked": Withdrawn(False, False, True, True),
    "privacy partial": Withdrawn(True, True, True, True),
    "privacy full": Withdrawn(False, False, True, True),
}


@pytest.mark.parametrize("withdrawal", list(WITHDRAWAL_TABLE))
async def test_each_withdrawal_removes_her_words_from_summaries_and_the_bots_replies(
    make_core: MakeCore, clock: ManualClock, withdrawal: str
) -> None:
    from tests.recall_helpers import BOT as HELPER_BOT
    from tests.recall_helpers import CHANNEL, GUILD, SAM
    from tests.recall_helpers import JUNO as HER
    from tests.test_summaries import chat_day, day_rows, rows, summary_answer, summary_world

    monday = datetime(2026, 1, 5).date()
    async with FakeChatServer() as chat, FakeChatServer(responder=summary_answer, summaries_aside=False) as summarizer:
        world = await summary_world(make_core, clock, chat, summarizer)
        sent = await chat_day(world, monday, [(HER, "her zebrafinch secret"), (SAM, "sam's plain news")])
        world.clock.current += timedelta(minutes=1)
        reply = dataclasses.replace(world.message(HELPER_BOT, "about her zebrafinch secret"), reply_to=sent[0].message_id)
        await world.services.chat.record(reply)
        await chat_day(world, monday + timedelta(days=1), [(SAM, "tuesday")])
        assert "zebrafinch" in day_rows(await rows(world))[monday]["summary"]  # before: her words and the reply are in it

        services, admin = world.services, Actor(1, can_manage=True)
        actions = {
            "nothing": lambda: asyncio.sleep(0),
            "message deleted": lambda: services.chat.deleted(CHANNEL, [sent[0].message_id]),
            "message edited": lambda: services.chat.edited(CHANNEL, sent[0].message_id, "never mind", world.clock.now()),
            "delete-my-data": lambda: services.delete_user_data(HER),
            "blocked": lambda: services.set_blocked(GUILD, HER, True, admin),
            "privacy partial": lambda: services.set_privacy(HER, Privacy.PARTIAL),
            "privacy full": lambda: services.set_privacy(HER, Privacy.FULL),
        }
        await actions[withdrawal]()
        await services.summaries.settle()
        expected = WITHDRAWAL_TABLE[withdrawal]
        summary = day_rows(await rows(world))[monday]["summary"]
        log_texts = [r["text"] for r in await world.core.pool.fetch("SELECT text FROM chat_messages")]
        assert ("Juno: her zebrafinch secret" in summary) == expected.her_words_summarised, summary
        assert ("about her zebrafinch secret" in summary) == expected.reply_summarised, summary
        assert ("about her zebrafinch secret" in log_texts) == expected.reply_in_log
        assert ("her zebrafinch secret" in log_texts) == expected.her_message_in_log
        assert "sam's plain news" in summary  # the rest of the day stays summarised
