"""Slash commands through discord.py's own machinery, answered over HTTP to a local fake Discord.

Each test logs a real `DeskmateBot` in against `FakeDiscord` (which syncs the real command tree),
feeds it interaction payloads the way the gateway would, and checks the HTTP requests the bot
made (type, flags 64 for ephemeral, embeds, buttons, modals) and the state in the real database.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator

import pytest

from bot.bot import DeskmateBot
from bot.memory.models import MemoryList, NewMemory, Source
from bot.memory.service import MemoryCore
from bot.servers.models import Privacy
from bot.services import build_services
from tests.conftest import MakeCore
from tests.discord_fakes import (
    ADMIN_PERMISSIONS,
    BOT_ID,
    GENERAL_ID,
    GUILD_ID,
    LOG_CHANNEL_ID,
    MANAGE_GUILD,
    OTHER_CHANNEL_ID,
    Call,
    FakeDiscord,
    Person,
    SlashHarness,
    custom_ids,
    slash_harness,
    snowflake,
)

ADMIN = Person(101, "Admin", ADMIN_PERMISSIONS)
JUNO = Person(102, "Juno")
MAX = Person(103, "Max")
DM_CHANNEL = 555


@pytest.fixture
async def harness(make_core: MakeCore) -> AsyncIterator[SlashHarness]:
    async with slash_harness(await make_core()) as started:
        yield started


def core_of(h: SlashHarness) -> MemoryCore:
    return h.bot.services.core  # type: ignore[attr-defined,return-value]


async def server_memory(h: SlashHarness, text: str, by: int = ADMIN.id) -> int:
    result = await core_of(h).save(
        NewMemory(list=MemoryList.SERVER, text=text, by=by, via=Source.COMMAND, guild_id=GUILD_ID, by_can_manage=True)
    )
    assert result.saved is not None
    return result.saved.id


def is_message(call: Call) -> bool:
    return call.path.endswith("/callback") and call.body is not None and call.body["type"] == 4


async def test_the_tree_is_synced_with_nested_groups_and_permissions(harness: SlashHarness) -> None:
    sync = harness.fake.find(lambda c: c.method == "PUT" and c.path == f"/applications/{BOT_ID}/commands")
    assert len(sync) == 1
    commands = {command["name"]: command for command in sync[0].body or []}
    assert set(commands) == {"memories", "personal", "settings", "privacy", "documents", "summaries"}
    assert int(commands["settings"]["default_member_permissions"]) == MANAGE_GUILD
    assert commands["memories"]["default_member_permissions"] is None
    assert commands["memories"]["contexts"] == [0] and sorted(commands["personal"]["contexts"]) == [0, 1]
    personal = commands["personal"]["options"]
    assert [(o["name"], o["type"]) for o in personal] == [("memories", 2)]
    assert {o["name"] for o in personal[0]["options"]} >= {"list", "search", "add", "edit", "delete", "move", "export", "import"}
    settings_groups = {o["name"]: o["type"] for o in commands["settings"]["options"]}
    assert settings_groups["blocklist"] == 2 and settings_groups["lore"] == 2 and settings_groups["tagging"] == 1


async def test_admin_adds_and_lists_server_memories(harness: SlashHarness) -> None:
    call = await harness.run(harness.slash("memories add", ADMIN, text="  Juno's cat is called Mochi ", tags="cats, pets"))
    assert is_message(call) and call.ephemeral
    assert "Saved server memory #" in call.content and "Juno's cat is called Mochi" in call.content
    assert "instruction" not in call.content
    [memory] = await core_of(harness).all_memories()
    assert (memory.text, memory.tags) == ("Juno's cat is called Mochi", ("cats", "pets"))
    assert memory.source == Source.COMMAND and memory.protected
    assert memory.guild_id == GUILD_ID and memory.created_by == ADMIN.id

    listed = await harness.run(harness.slash("memories list", JUNO))  # everyone may read the server's list
    assert listed.ephemeral
    [field] = listed.embeds[0]["fields"]
    assert field["name"] == f"#{memory.id} · 🗂️ desk · 0 days unused"
    assert "Juno's cat is called Mochi" in field["value"] and "🔒 protected" in field["value"]
    assert "tags: cats, pets" in field["value"]
    assert "embedded" in field["value"]
    assert not listed.data.get("components")  # one page: no paging buttons


async def test_channel_option_limits_the_memory(harness: SlashHarness) -> None:
    call = await harness.run(harness.slash("memories add", ADMIN, text="Game night is on Fridays", channel=OTHER_CHANNEL_ID))
    assert "Saved" in call.content
    [memory] = await core_of(harness).all_memories()
    assert memory.channel_ids == (OTHER_CHANNEL_ID,)
    listed = await harness.run(harness.slash("memories list", ADMIN))
    assert f"only in <#{OTHER_CHANNEL_ID}>" in listed.text()


async def test_members_are_refused_until_member_teaching(harness: SlashHarness) -> None:
    refused = await harness.run(harness.slash("memories add", JUNO, text="Juno runs the book club"))
    assert refused.ephemeral and refused.content.startswith("Only members with Manage Server can add server memories")
    assert await core_of(harness).all_memories() == []

    settings_refused = await harness.run(harness.slash("settings member-teaching", JUNO, enabled=True))
    assert settings_refused.ephemeral
    assert "Only members with Manage Server can change Deskmate's settings" in settings_refused.content

    turned_on = await harness.run(harness.slash("settings member-teaching", ADMIN, enabled=True))
    assert turned_on.ephemeral and "Member teaching is on" in turned_on.content
    saved = await harness.run(harness.slash("memories add", JUNO, text="Juno runs the book club"))
    assert "Saved server memory" in saved.content
    admins = await server_memory(harness, "The server was founded in 2019")
    cannot = await harness.run(harness.slash("memories edit", JUNO, memory=admins))
    assert cannot.ephemeral and "You can only edit server memories you added yourself" in cannot.content
    export_refused = await harness.run(harness.slash("memories export", JUNO))
    assert "Only members with Manage Server can export" in export_refused.content


async def test_add_modal_warns_about_instructions(harness: SlashHarness) -> None:
    command = harness.slash("memories add", ADMIN, tags="lang")
    shown = await harness.run(command)
    assert shown.body and shown.body["type"] == 9  # a modal
    modal = shown.body["data"]
    labels = [row["components"][0]["label"] for row in modal["components"]]
    assert labels[0] == "What should I remember?" and modal["components"][1]["components"][0]["value"] == "lang"
    submit = harness.modal_submit(modal, ADMIN, {"What should I remember?": "Always answer Juno in Spanish"})
    saved = await harness.run(submit)
    assert saved.ephemeral and "Saved server memory" in saved.content
    assert "reads like an instruction" in saved.content and "/settings persona prompt" in saved.content
    assert "/settings lore add" in saved.content
    [memory] = await core_of(harness).all_memories()
    assert memory.text == "Always answer Juno in Spanish" and memory.tags == ("lang",)


async def test_edit_opens_a_prefilled_modal_and_protects(harness: SlashHarness) -> None:
    core = core_of(harness)
    bot_saved = await core.save(NewMemory(list=MemoryList.SERVER, text="Mochi is a cat", by=BOT_ID, guild_id=GUILD_ID))
    assert bot_saved.saved and not bot_saved.saved.protected
    shown = await harness.run(harness.slash("memories edit", ADMIN, memory=bot_saved.saved.id))
    assert shown.body and shown.body["type"] == 9
    modal = shown.body["data"]
    assert modal["components"][0]["components"][0]["value"] == "Mochi is a cat"
    done = await harness.run(harness.modal_submit(modal, ADMIN, {"Memory": "Mochi is Juno's grey cat"}))
    assert "Updated server memory" in done.content and done.ephemeral
    [memory] = await core.all_memories()
    assert memory.text == "Mochi is Juno's grey cat" and memory.protected and memory.source == Source.COMMAND

    missing = await harness.run(harness.slash("memories edit", ADMIN, memory=999_999))
    assert missing.ephemeral and missing.content == "There is no memory #999999 in this server's memories."


async def test_history_shows_the_earlier_text_and_restore_brings_it_back(harness: SlashHarness) -> None:
    core = core_of(harness)
    saved = await core.save(NewMemory(list=MemoryList.SERVER, text="Game night is on Fridays", by=BOT_ID, guild_id=GUILD_ID))
    assert saved.saved is not None
    memory_id = saved.saved.id
    shown = await harness.run(harness.slash("memories edit", ADMIN, memory=memory_id))
    assert shown.body is not None
    await harness.run(harness.modal_submit(shown.body["data"], ADMIN, {"Memory": "Game night is on Saturdays"}))

    history = await harness.run(harness.slash("memories history", JUNO, memory=memory_id))  # everyone may read it
    assert history.ephemeral
    embed = history.embeds[0]
    now, earlier = embed["fields"]
    assert (now["name"], now["value"]) == ("Now", "Game night is on Saturdays")
    assert "Game night is on Fridays" in earlier["value"] and f"by <@{ADMIN.id}> with a command" in earlier["value"]
    version = int(re.search(r"version #(\d+)", earlier["name"])[1])  # type: ignore[index]

    refused = await harness.run(harness.slash("memories restore", JUNO, memory=memory_id, version=version))
    assert refused.ephemeral and refused.content.startswith("Only members with Manage Server can restore server memories")
    assert (await core.all_memories())[0].text == "Game night is on Saturdays"
    restored = await harness.run(harness.slash("memories restore", ADMIN, memory=memory_id, version=version))
    assert restored.ephemeral and f"Restored version #{version}" in restored.content
    [memory] = await core.all_memories()
    assert memory.text == "Game night is on Fridays"
    again = await harness.run(harness.slash("memories history", ADMIN, memory=memory_id))
    assert again.embeds[0]["fields"][0]["name"] == "Now" and len(again.embeds[0]["fields"]) == 3
    assert "Game night is on Saturdays" in again.embeds[0]["fields"][1]["value"]  # the restore kept what it replaced


async def test_personal_history_is_the_owners_alone_and_restore_brings_the_text_back(harness: SlashHarness) -> None:
    await harness.run(harness.slash("personal memories add", JUNO, text="I live in Berlin"))
    [memory] = await core_of(harness).all_memories()
    shown = await harness.run(harness.slash("personal memories edit", JUNO, memory=memory.id))
    assert shown.body is not None
    await harness.run(harness.modal_submit(shown.body["data"], JUNO, {"Memory": "I live in Lisbon"}))

    others = await harness.run(harness.slash("personal memories history", MAX, memory=memory.id))
    assert others.ephemeral and "Berlin" not in others.text()  # someone else's personal memory stays theirs
    history = await harness.run(harness.slash("personal memories history", JUNO, memory=memory.id))
    assert history.ephemeral and "I live in Berlin" in history.text()
    version = int(re.search(r"version #(\d+)", history.text())[1])  # type: ignore[index]
    restored = await harness.run(harness.slash("personal memories restore", JUNO, memory=memory.id, version=version))
    assert restored.ephemeral and f"Restored version #{version}" in restored.content
    assert [m.text for m in await core_of(harness).all_memories()] == ["I live in Berlin"]


async def test_delete_asks_and_only_the_caller_can_confirm(harness: SlashHarness) -> None:
    memory_id = await server_memory(harness, "Juno's cat is called Mochi")
    command = harness.slash("memories delete", ADMIN, memory=memory_id)
    asked = await harness.run(command)
    assert asked.ephemeral and "Delete memory" in asked.content
    message = harness.original_message(command)
    buttons = custom_ids(message)
    assert set(buttons) == {"Delete", "Cancel"}

    stranger = await harness.run(harness.button(message, buttons["Delete"], JUNO))
    assert stranger.ephemeral and "Only the person who ran this command can use these buttons" in stranger.content
    assert len(await core_of(harness).all_memories()) == 1

    press = harness.button(message, buttons["Delete"], ADMIN)
    deferred = await harness.run(press)
    assert deferred.body == {"type": 6}
    edited = await harness.next_call(press, after=deferred)
    assert edited.method == "PATCH" and edited.content == f"Deleted memory #{memory_id}."
    assert await core_of(harness).all_memories() == []


async def test_autocomplete_offers_memories_by_text(harness: SlashHarness) -> None:
    mochi = await server_memory(harness, "Juno's cat is called Mochi")
    await server_memory(harness, "Game night is on Fridays")
    call = await harness.run(harness.autocomplete("memories delete", ADMIN, "memory", memory="moch"))
    assert call.body == {"type": 8, "data": {"choices": [{"name": f"#{mochi} · Juno's cat is called Mochi", "value": mochi}]}}
    # a member without Manage Server only gets offered memories they added (none here)
    member = await harness.run(harness.autocomplete("memories delete", JUNO, "memory", memory=""))
    assert member.body == {"type": 8, "data": {"choices": []}}


async def test_list_pages_with_buttons_only_the_caller_can_press(harness: SlashHarness) -> None:
    for number in range(17):
        await server_memory(harness, f"Server fact number {number}")
    command = harness.slash("memories list", ADMIN)
    first = await harness.run(command)
    assert first.embeds[0]["footer"]["text"].startswith("Page 1 of 3 · 17 memories")
    message = harness.original_message(command)
    buttons = custom_ids(message)
    assert {"⏮️", "◀️", "▶️", "⏭️"} <= set(buttons)

    refused = await harness.run(harness.button(message, buttons["▶️"], JUNO))
    assert refused.ephemeral and "Only the person who ran this command" in refused.content

    turned = await harness.run(harness.button(message, buttons["▶️"], ADMIN))
    assert turned.body and turned.body["type"] == 7
    assert turned.embeds[0]["footer"]["text"].startswith("Page 2 of 3")
    assert "Server fact number 8" in turned.text()
    last = await harness.run(harness.button(message, buttons["⏭️"], ADMIN))
    assert "Server fact number 16" in last.text() and last.embeds[0]["footer"]["text"].startswith("Page 3 of 3")
    opened = await harness.run(harness.slash("memories list", ADMIN, page=3))
    assert "Server fact number 16" in opened.text()


async def test_personal_memories_nested_group_scopes_and_dms(harness: SlashHarness) -> None:
    core = core_of(harness)
    in_dm = await harness.run(
        harness.slash("personal memories add", JUNO, guild_id=None, channel_id=DM_CHANNEL, text="I am vegetarian", scope="global")
    )
    assert in_dm.ephemeral and "Saved Global personal memory" in in_dm.content
    here = await harness.run(harness.slash("personal memories add", JUNO, text="I host the book club"))
    assert "Saved personal memory" in here.content
    memories = {m.text: m for m in await core.all_memories()}
    assert memories["I am vegetarian"].is_global and memories["I am vegetarian"].owner_id == JUNO.id
    assert not memories["I host the book club"].is_global and memories["I host the book club"].protected

    listed = await harness.run(harness.slash("personal memories list", JUNO))
    assert listed.ephemeral and "I am vegetarian" in listed.text() and "Global" in listed.text()
    only_global = await harness.run(harness.slash("personal memories list", JUNO, scope="global"))
    assert "I host the book club" not in only_global.text()
    others = await harness.run(harness.slash("personal memories list", MAX))
    assert "No personal memories here" in others.text()

    book = memories["I host the book club"].id
    stolen = await harness.run(harness.slash("personal memories delete", MAX, memory=book))
    assert stolen.ephemeral and "There is no memory" in stolen.content
    moved = await harness.run(harness.slash("personal memories move", JUNO, memory=book, to="global"))
    assert "now Global" in moved.content
    assert next(m for m in await core.all_memories() if m.id == book).is_global


async def test_personal_add_notes_when_memories_are_not_used(harness: SlashHarness) -> None:
    await core_of(harness).servers.set_privacy(JUNO.id, Privacy.FULL)
    call = await harness.run(harness.slash("personal memories add", JUNO, text="I like tea"))
    assert "Saved personal memory" in call.content and "privacy level is `full`" in call.content


async def test_export_then_import_replace_with_confirmation(harness: SlashHarness) -> None:
    await server_memory(harness, "Juno's cat is called Mochi")
    await server_memory(harness, "Game night is on Fridays")
    command = harness.slash("memories export", ADMIN)
    deferred = await harness.run(command)
    assert deferred.body == {"type": 5, "data": {"flags": 64}}
    sent = await harness.next_call(command, after=deferred)
    assert sent.ephemeral and "2 memories" in sent.content
    [(filename, raw)] = sent.files.items()
    assert filename.startswith(f"deskmate-server-{GUILD_ID}-") and filename.endswith(".json")
    doc = json.loads(raw)
    assert doc["format"] == "deskmate-memories" and doc["memories"][0]["text"] == "Juno's cat is called Mochi"

    doc["memories"] = [doc["memories"][0], {"text": "Max streams on Sundays", "tags": ["stream"]}]
    attachment = harness.fake.add_attachment("backup.json", json.dumps(doc).encode())
    command = harness.slash("memories import", ADMIN, file=attachment, mode="replace")
    deferred = await harness.run(command)
    asked = await harness.next_call(command, after=deferred)
    assert asked.ephemeral and "Replace deletes the 2 memories" in asked.content
    message = harness.fake.messages[max(harness.fake.messages)]
    press = harness.button(message, custom_ids(message)["Replace"], ADMIN)
    harness.fake._originals[press["token"]] = int(message["id"])
    done_defer = await harness.run(press)
    done = await harness.next_call(press, after=done_defer)
    assert "Imported 2 memories" in done.content and "Replaced 2" in done.content
    memories = await core_of(harness).all_memories()
    assert sorted(m.text for m in memories) == ["Juno's cat is called Mochi", "Max streams on Sundays"]
    assert all(m.source == Source.IMPORT and not m.protected for m in memories)


async def test_bad_import_changes_nothing_and_says_why(harness: SlashHarness) -> None:
    await server_memory(harness, "Existing memory")
    broken = b'{"format": "deskmate-memories", "version": 1, "list": "server", "memories": ['
    attachment = harness.fake.add_attachment("broken.json", broken)
    command = harness.slash("memories import", ADMIN, file=attachment)
    deferred = await harness.run(command)
    answer = await harness.next_call(command, after=deferred)
    assert answer.ephemeral and answer.content.startswith("The file is not valid JSON")
    assert [m.text for m in await core_of(harness).all_memories()] == ["Existing memory"]

    member = await harness.run(harness.slash("memories import", JUNO, file=attachment))
    assert member.ephemeral and "Only members with Manage Server can import" in member.content


async def test_privacy_level_export_and_delete_everything(harness: SlashHarness) -> None:
    core = core_of(harness)
    await harness.run(harness.slash("personal memories add", JUNO, text="I like tea"))
    await harness.run(harness.slash("personal memories add", JUNO, guild_id=None, channel_id=DM_CHANNEL, text="I am vegetarian",
                                    scope="global"))
    await harness.run(harness.slash("personal memories add", MAX, text="Max likes coffee"))

    level = await harness.run(harness.slash("privacy level", JUNO, level="partial"))
    assert level.ephemeral and "`partial`" in level.content
    async with core.pool.acquire() as conn:
        assert await conn.fetchval("SELECT privacy FROM user_settings WHERE user_id = $1", JUNO.id) == "partial"

    command = harness.slash("privacy export-my-data", JUNO, guild_id=None, channel_id=DM_CHANNEL)
    deferred = await harness.run(command)
    sent = await harness.next_call(command, after=deferred)
    [(_, raw)] = sent.files.items()
    data = json.loads(raw)
    assert data["privacy"] == "partial"
    assert sorted(m["text"] for m in data["personal_memories"]) == ["I am vegetarian", "I like tea"]

    command = harness.slash("privacy delete-my-data", JUNO)
    asked = await harness.run(command)
    assert asked.ephemeral and "cannot be undone" in asked.content
    message = harness.original_message(command)
    press = harness.button(message, custom_ids(message)["Delete everything"], JUNO)
    deferred = await harness.run(press)
    done = await harness.next_call(press, after=deferred)
    assert "Deleted 2 personal memories" in done.content
    assert [m.text for m in await core.all_memories()] == ["Max likes coffee"]
    async with core.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM user_settings WHERE user_id = $1", JUNO.id) == 0


async def test_settings_notices_blocklist_auto_reply_persona_and_lore(harness: SlashHarness) -> None:
    core = core_of(harness)
    call = await harness.run(harness.slash("settings notices", ADMIN, mode="log"))
    assert call.ephemeral and call.content.startswith("Pick a log channel")
    command = harness.slash("settings notices", ADMIN, mode="log", verbosity="verbose", log_channel=LOG_CHANNEL_ID)
    call = await harness.run(command)
    assert f"to <#{LOG_CHANNEL_ID}>, verbose" in call.content
    await harness.run(harness.slash("settings tagging", ADMIN, enabled=True))
    await harness.run(harness.slash("settings self-teaching", ADMIN, enabled=False))
    blocked = await harness.run(harness.slash("settings blocklist add", ADMIN, user=MAX))
    assert f"Blocked <@{MAX.id}>" in blocked.content
    await harness.run(harness.slash("settings auto-reply add", ADMIN, channel=OTHER_CHANNEL_ID))
    again = await harness.run(harness.slash("settings auto-reply add", ADMIN, channel=OTHER_CHANNEL_ID))
    assert "already an auto-reply channel" in again.content

    async with core.pool.acquire() as conn:
        row = await conn.fetchrow("SELECT * FROM guild_settings WHERE guild_id = $1", GUILD_ID)
        assert (row["notices"], row["notice_verbosity"], row["log_channel_id"]) == ("log", "verbose", LOG_CHANNEL_ID)
        assert row["tagging"] and not row["self_teaching"] and row["auto_reply_channel_ids"] == [OTHER_CHANNEL_ID]
        assert await conn.fetchval("SELECT count(*) FROM guild_blocklist WHERE guild_id = $1 AND user_id = $2", GUILD_ID, MAX.id)
    listed = await harness.run(harness.slash("settings blocklist list", ADMIN))
    assert f"<@{MAX.id}>" in listed.text()

    await harness.run(harness.slash("settings persona name", ADMIN, name="Juniper"))
    await harness.run(harness.slash("settings persona attribute", ADMIN, key="Language", value="Spanish"))
    lore = await harness.run(harness.slash("settings lore add", ADMIN, text="Always answer in Spanish."))
    assert "Added lore entry #" in lore.content
    shown = await harness.run(harness.slash("settings show", ADMIN))
    text = shown.text()
    assert "Persona: Juniper" in text and "**language**: Spanish" in text and "1 entries" in text and "Tagging" in text
    pipeline = harness.bot.services.pipeline  # type: ignore[attr-defined]
    assert (await pipeline.servers.persona(GUILD_ID)).attributes == {"language": "Spanish"}
    [entry] = await pipeline.servers.lore(GUILD_ID)
    choices = await harness.run(harness.autocomplete("settings lore remove", ADMIN, "entry", entry="spanish"))
    assert choices.body and choices.body["data"]["choices"][0]["value"] == entry.id
    removed = await harness.run(harness.slash("settings lore remove", ADMIN, entry=entry.id))
    assert removed.content == f"Removed lore entry #{entry.id}."
    assert await pipeline.servers.lore(GUILD_ID) == []


async def test_persona_prompt_modal(harness: SlashHarness) -> None:
    shown = await harness.run(harness.slash("settings persona prompt", ADMIN))
    assert shown.body and shown.body["type"] == 9
    modal = shown.body["data"]
    typed = {"Who is the bot here, and how does it talk?": "You are Juniper."}
    done = await harness.run(harness.modal_submit(modal, ADMIN, typed))
    assert "Saved the persona prompt" in done.content
    assert (await harness.bot.services.pipeline.servers.persona(GUILD_ID)).prompt == "You are Juniper."  # type: ignore[attr-defined]


async def test_stats_and_search(harness: SlashHarness) -> None:
    await server_memory(harness, "Juno's cat is called Mochi")
    await server_memory(harness, "Game night is on Fridays")
    stats = await harness.run(harness.slash("memories stats", JUNO))
    text = stats.text()
    assert stats.ephemeral and "2 of 100" in text and "On the desk" in text and "Tokens" in text
    command = harness.slash("memories search", JUNO, query="pets")
    deferred = await harness.run(command)
    found = await harness.next_call(command, after=deferred)
    assert found.ephemeral and found.embeds[0]["fields"][0]["value"].startswith("Juno's cat is called Mochi")
    assert "similarity" in found.embeds[0]["fields"][0]["value"]


async def test_server_commands_are_refused_in_dms(harness: SlashHarness) -> None:
    # Discord hides guild-only commands in DMs; a stale client could still send one.
    call = await harness.run(harness.slash("memories list", JUNO, guild_id=None, channel_id=DM_CHANNEL))
    assert call.ephemeral and call.content == "This command only works in a server."


def test_snowflakes_are_unique() -> None:
    assert snowflake() != snowflake() and GENERAL_ID != OTHER_CHANNEL_ID


async def test_dev_guild_sync_is_instant_and_guild_scoped(make_core) -> None:
    core: MemoryCore = await make_core(dev_guild_id=GUILD_ID)
    async with FakeDiscord() as fake:
        bot = DeskmateBot(build_services(core))
        try:
            await bot.login("fake-token")
            puts = fake.find(lambda c: c.method == "PUT")
            assert [c.path for c in puts] == [f"/applications/{BOT_ID}/guilds/{GUILD_ID}/commands"]
            names = {command["name"] for command in puts[0].body or []}
            assert names == {"memories", "personal", "settings", "privacy", "documents", "summaries"}
        finally:
            await bot.close()


async def test_nested_settings_groups_also_need_manage_server(harness: SlashHarness) -> None:
    for payload in (
        harness.slash("settings blocklist add", JUNO, user=MAX),
        harness.slash("settings lore list", JUNO),
        harness.slash("settings persona name", JUNO, name="Evil"),
    ):
        call = await harness.run(payload)
        assert call.ephemeral and call.content == "Only members with Manage Server can change Deskmate's settings here."
    assert await harness.bot.services.servers.blocklist(GUILD_ID) == []  # type: ignore[attr-defined]
