"""The command operations of bot/memory/manage.py against the real database and the built-in embedder."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta

import numpy as np
import pytest

from bot.chat import log_store
from bot.embeddings.providers import EmbeddingError, EmbeddingSpace
from bot.errors import InvalidInput, NotAllowed, NotFound, Refusal
from bot.memory.lists import ImportMode, Scope, VectorStatus, looks_like_instruction, split_tags
from bot.memory.manage import EXPORT_FORMAT, MemoryManager, count_tokens
from bot.memory.models import Conversation, MemoryList, NewMemory, Source
from bot.servers import store as servers_store
from bot.servers.models import Actor, Privacy
from bot.services import build_services, memory_core

GUILD, OTHER_GUILD = 10, 20
ADMIN, JUNO, MAX = 1, 2, 3
AS_ADMIN = Actor(ADMIN, can_manage=True)


class DownEmbedder:
    """Has a space (so vectors exist) but every call fails, like a provider outage."""

    def __init__(self, space: EmbeddingSpace) -> None:
        self._space = space

    @property
    def space(self) -> EmbeddingSpace:
        return self._space

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        raise EmbeddingError("provider down")


async def manager(make_core, **overrides: object) -> MemoryManager:
    return MemoryManager(await make_core(**overrides))


async def add_server(mgr: MemoryManager, text: str, guild: int = GUILD) -> int:
    result = await mgr.add(await mgr.server_list(guild), text, actor=AS_ADMIN)
    assert result.saved is not None, result.detail
    return result.saved.id


def test_instruction_detection() -> None:
    for text in ("Always answer Juno in Spanish", "never ping Max", "Call me Cap", "From now on be brief",
                 "Juno wants you to reply in French", "Please don't use emoji"):
        assert looks_like_instruction(text), text
    for text in ("Juno's cat is called Mochi", "Juno always drinks tea at 5", "Max never finished Elden Ring",
                 "The server was founded in 2019"):
        assert not looks_like_instruction(text), text


def test_tags_and_tokens() -> None:
    assert split_tags("Cats, #games  music") == ("cats", "games", "music")
    with pytest.raises(InvalidInput):
        split_tags("bad!tag")
    assert count_tokens("hello world") == 2


async def test_a_refused_command_change_is_one_refusal_saying_what_did_not_happen(make_core) -> None:
    """Commands see refusals as the one family the adapters translate, never as a result to inspect."""
    mgr = await manager(make_core, server_memory_limit=1, memory_decay_enabled=False)
    ref = await mgr.server_list(GUILD)
    kept = await add_server(mgr, "Game night is on Fridays")
    with pytest.raises(NotAllowed, match=r"^not saved: .*full"):
        await mgr.add(ref, "Juno's cat is called Mochi", actor=AS_ADMIN)
    with pytest.raises(InvalidInput, match=r"^not changed: "):
        await mgr.edit(ref, kept, "   ", actor=AS_ADMIN)
    with pytest.raises(NotFound, match="there is no memory #999999"):
        await mgr.delete(ref, 999_999, actor=AS_ADMIN)
    assert [v.memory.text for v in (await mgr.page(ref, 0)).items] == ["Game night is on Fridays"]


async def test_pages_show_state_and_vector_status(make_core, clock) -> None:
    mgr = await manager(make_core, dormant_after_days=2)
    ids = [await add_server(mgr, f"Fact number {i} about the server") for i in range(12)]
    ref = await mgr.server_list(GUILD)
    first = await mgr.page(ref, 0, size=5)
    assert first.total == 12 and first.pages == 3
    assert [v.memory.id for v in first.items] == ids[:5]
    assert all(v.state == "desk" and v.vector == VectorStatus.EMBEDDED and v.memory.protected for v in first.items)
    last = await mgr.page(ref, 99, size=5)
    assert last.number == 2 and [v.memory.id for v in last.items] == ids[10:]

    # age everything twice with searches on two chat days -> drawer
    for _ in range(3):
        clock.current += timedelta(days=1)
        await mgr.core.reply_search(Conversation(guild_id=GUILD, channel_id=5, author_id=JUNO, text="weather"))
    page = await mgr.page(ref, 0, size=20)
    assert sum(v.state == "drawer" for v in page.items) >= 10
    # a memory waiting for a vector
    async with mgr.core.pool.acquire() as conn:
        await conn.execute("DELETE FROM memory_vectors WHERE memory_id = $1", ids[0])
    page = await mgr.page(ref, 0, size=1)
    assert page.items[0].vector == VectorStatus.WAITING


async def test_search_semantic_then_text_fallback(make_core, builtin_embedder) -> None:
    mgr = await manager(make_core)
    await add_server(mgr, "Juno's cat is called Mochi")
    await add_server(mgr, "The weekly game night is on Fridays")
    ref = await mgr.server_list(GUILD)
    result = await mgr.search(ref, "pets and animals")
    assert result.semantic and result.items[0].memory.text == "Juno's cat is called Mochi"
    assert result.items[0].similarity is not None

    counters_before = [m.days_unused for m in await mgr.core.all_memories()]
    down = MemoryManager(memory_core(mgr.core.pool, DownEmbedder(builtin_embedder.space), mgr.core.settings, mgr.core.clock))
    fallback = await down.search(ref, "MOCHI")
    assert not fallback.semantic and "plain text" in (fallback.note or "")
    assert [v.memory.text for v in fallback.items] == ["Juno's cat is called Mochi"]
    assert [m.days_unused for m in await mgr.core.all_memories()] == counters_before  # searching never ages

    suggestions = await mgr.suggest(ref, "game")
    assert [m.text for m in suggestions] == ["The weekly game night is on Fridays"]
    assert len(await mgr.suggest(ref, "")) == 2


async def test_permissions_and_list_membership(make_core) -> None:
    mgr = await manager(make_core)
    ref = await mgr.server_list(GUILD)
    with pytest.raises(Refusal, match="member teaching"):  # refused before anything is written
        await mgr.add(ref, "Members cannot add this", actor=Actor(JUNO))
    await mgr.core.servers.update_guild_settings(GUILD, Actor(1, can_manage=True), member_teaching=True)
    own = await mgr.add(ref, "Juno added this", actor=Actor(JUNO))
    assert own.saved is not None
    admin_id = await add_server(mgr, "The admin added this")
    with pytest.raises(Refusal, match="you added yourself"):
        await mgr.edit(ref, admin_id, "changed", actor=Actor(JUNO))
    edited = await mgr.edit(ref, own.saved.id, "Juno changed this", actor=Actor(JUNO), tags=["Notes"])
    assert edited.saved is not None and edited.saved.text == "Juno changed this" and edited.saved.tags == ("notes",)

    other = await mgr.server_list(OTHER_GUILD)
    with pytest.raises(Refusal, match="no memory"):  # an admin here cannot reach another server's list by id
        await mgr.delete(other, admin_id, actor=AS_ADMIN)
    personal = await mgr.personal_list(JUNO, GUILD)
    with pytest.raises(Refusal, match="owner"):
        await mgr.add(personal, "About Juno", actor=Actor(MAX))
    deleted = await mgr.delete(ref, admin_id, actor=AS_ADMIN)
    assert deleted.forgotten[0].id == admin_id


async def test_personal_scopes_and_move(make_core) -> None:
    mgr = await manager(make_core, personal_memory_limit=3)
    here = await mgr.personal_list(JUNO, GUILD)
    tied = await mgr.add(here, "Juno likes tea", actor=Actor(JUNO))
    glob = await mgr.add(here, "Juno is vegetarian", actor=Actor(JUNO), is_global=True)
    assert tied.saved and glob.saved and glob.saved.is_global and not tied.saved.is_global
    assert [v.memory.id for v in (await mgr.page(await mgr.personal_list(JUNO, GUILD, Scope.GLOBAL), 0)).items] == [glob.saved.id]
    assert [v.memory.id for v in (await mgr.page(await mgr.personal_list(JUNO, GUILD, Scope.PERSONA), 0)).items] == [
        tied.saved.id
    ]
    elsewhere = await mgr.personal_list(JUNO, OTHER_GUILD)
    assert [v.memory.id for v in (await mgr.page(elsewhere, 0)).items] == [glob.saved.id]
    for text in ("Juno plays chess", "Juno has a dog"):
        assert (await mgr.add(elsewhere, text, actor=Actor(JUNO))).saved
    # other server's list is full (2 tied + 1 Global): making the tea memory Global would overfill it
    with pytest.raises(Refusal, match="more than 3"):
        await mgr.move(here, tied.saved.id, to_global=True, actor=Actor(JUNO))
    moved = await mgr.move(here, glob.saved.id, to_global=False, actor=Actor(JUNO))
    assert moved.persona_id == here.persona_id and moved.protected
    stats = await mgr.stats(here)
    assert stats.total == 2 and stats.limit == 3 and stats.desk == 2 and stats.total_tokens > 0


def export_doc(*texts: str, list_: str = "server", **extra: object) -> bytes:
    return json.dumps({"format": EXPORT_FORMAT, "version": 1, "list": list_, "memories": list(texts), **extra}).encode()


async def test_export_import_roundtrip_merge_and_replace(make_core) -> None:
    mgr = await manager(make_core)
    await add_server(mgr, "Juno's cat is called Mochi")
    await add_server(mgr, "Game night is on Fridays")
    ref = await mgr.server_list(GUILD)
    doc = await mgr.export(ref, AS_ADMIN)
    assert doc["format"] == EXPORT_FORMAT and doc["version"] == 1 and doc["list"] == "server"
    assert doc["memories"][0]["text"] == "Juno's cat is called Mochi" and doc["memories"][0]["state"] == "desk"
    raw = json.dumps(doc).encode()

    other = await mgr.server_list(OTHER_GUILD)
    plan = mgr.parse_import(other, raw)
    result = await mgr.import_memories(other, plan, mode=ImportMode.MERGE, actor=AS_ADMIN)
    assert (result.added, result.removed, result.embedded) == (2, 0, 2)
    imported = (await mgr.page(other, 0)).items
    assert all(v.memory.source == Source.IMPORT and not v.memory.protected for v in imported)
    assert all(v.vector == VectorStatus.EMBEDDED for v in imported)

    again = await mgr.import_memories(other, mgr.parse_import(other, raw), mode=ImportMode.MERGE, actor=AS_ADMIN)
    assert (again.added, again.skipped_duplicates) == (0, 2)

    replace = mgr.parse_import(other, export_doc("Only this one", "only THIS one"))
    assert replace.duplicates_in_file == 1
    replaced = await mgr.import_memories(other, replace, mode=ImportMode.REPLACE, actor=AS_ADMIN)
    assert (replaced.added, replaced.removed) == (1, 2)
    assert [v.memory.text for v in (await mgr.page(other, 0)).items] == ["Only this one"]
    with pytest.raises(Refusal, match="Manage Server"):
        await mgr.import_memories(other, replace, mode=ImportMode.MERGE, actor=Actor(JUNO))


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"\xff\xfe", "UTF-8"),
        (b"{not json", "not valid JSON"),
        (b'{"format": "other"}', "not a Deskmate memory export"),
        (json.dumps({"format": EXPORT_FORMAT, "version": 9, "list": "server", "memories": []}).encode(), "newer Deskmate"),
        (export_doc("x", list_="personal"), "/personal memories import"),
        (export_doc("fine", "   "), "memory 2: the memory text is empty"),
        (export_doc("fine", {"text": "x" * 1001}), "memory 2: the memory text has 1001 characters"),
        (export_doc({"text": "ok", "tags": ["bad tag!"]}), "memory 1: tag"),
        (export_doc({"text": "ok", "channel_ids": ["abc"]}), "memory 1: a channel id must be a whole number .* got 'abc'"),
        (export_doc({"text": "ok", "channel_ids": ["²"]}), "memory 1: a channel id must be a whole number .* got '²'"),
        (export_doc({"text": "ok", "channel_ids": ["9" * 5000]}), "memory 1: a channel id must be a whole number .* got '999"),
        (export_doc(*[f"m{i}" for i in range(101)]), "at most 100"),
        (b" " * 2_000_000, "IMPORT_MAX_BYTES"),
    ],
)
async def test_import_validation_changes_nothing(make_core, raw: bytes, message: str) -> None:
    mgr = await manager(make_core)
    await add_server(mgr, "Existing memory")
    ref = await mgr.server_list(GUILD)
    with pytest.raises(Refusal, match=message.replace("(", r"\(").replace(")", r"\)")):
        mgr.parse_import(ref, raw)
    assert [m.text for m in await mgr.core.all_memories()] == ["Existing memory"]


async def test_import_over_limit_is_refused_in_one_transaction(make_core) -> None:
    mgr = await manager(make_core, server_memory_limit=3)
    await add_server(mgr, "one")
    await add_server(mgr, "two")
    ref = await mgr.server_list(GUILD)
    plan = mgr.parse_import(ref, export_doc("three", "four"))
    with pytest.raises(Refusal, match="would leave 4 server memories; the limit is 3"):
        await mgr.import_memories(ref, plan, mode=ImportMode.MERGE, actor=AS_ADMIN)
    assert sorted(m.text for m in await mgr.core.all_memories()) == ["one", "two"]
    done = await mgr.import_memories(ref, plan, mode=ImportMode.REPLACE, actor=AS_ADMIN)
    assert done.added == 2 and sorted(m.text for m in await mgr.core.all_memories()) == ["four", "three"]


async def test_import_drops_unknown_channels_and_personal_scopes(make_core) -> None:
    mgr = await manager(make_core, personal_memory_limit=2)
    ref = await mgr.server_list(GUILD)
    plan = mgr.parse_import(ref, export_doc({"text": "limited", "channel_ids": ["111", 222]}), known_channel_ids={222})
    assert plan.entries[0].channel_ids == (222,) and plan.dropped_channel_limits == 1

    personal = await mgr.personal_list(JUNO, GUILD)
    raw = export_doc({"text": "g", "scope": "global"}, {"text": "p"}, list_="personal")
    result = await mgr.import_memories(personal, mgr.parse_import(personal, raw), mode=ImportMode.MERGE, actor=Actor(JUNO))
    assert result.added == 2
    memories = {m.text: m for m in await mgr.core.all_memories()}
    assert memories["g"].is_global and memories["p"].persona_id == personal.persona_id and memories["p"].owner_id == JUNO
    assert memories["g"].protected and not memories["p"].protected  # Global memories are always protected
    with pytest.raises(Refusal, match="personal lists"):
        more = export_doc({"text": "another global", "scope": "global"}, list_="personal")
        await mgr.import_memories(personal, mgr.parse_import(personal, more), mode=ImportMode.MERGE, actor=Actor(JUNO))
    with pytest.raises(Refusal, match="owner"):
        await mgr.import_memories(personal, mgr.parse_import(personal, raw), mode=ImportMode.MERGE, actor=Actor(MAX))


async def test_user_data_export_and_delete(make_core) -> None:
    mgr = await manager(make_core)
    core = mgr.core
    await core.servers.update_guild_settings(GUILD, Actor(1, can_manage=True), member_teaching=True)
    await mgr.add(await mgr.server_list(GUILD), "Juno organised the meetup", actor=Actor(JUNO))
    await mgr.add(await mgr.personal_list(JUNO, GUILD), "Juno likes tea", actor=Actor(JUNO))
    await mgr.add(await mgr.personal_list(JUNO, None), "Juno is vegetarian", actor=Actor(JUNO), is_global=True)
    await mgr.add(await mgr.personal_list(MAX, GUILD), "Max likes coffee", actor=Actor(MAX))
    await core.servers.set_privacy(JUNO, Privacy.PARTIAL)
    await core.servers.set_blocked(OTHER_GUILD, JUNO, True)
    async with core.pool.acquire() as conn:
        await log_store.record_chat_message(
            conn, guild_id=GUILD, channel_id=5, message_id=99, author_id=JUNO, author_name="Juno", is_bot=False,
            text="hello", reply_to=None, mention_ids=[], created_at=core.clock.now(),
        )

    data = await build_services(mgr.core).export_user_data(JUNO)
    assert data["format"] == "deskmate-user-data" and data["privacy"] == "partial"
    assert sorted(m["text"] for m in data["personal_memories"]) == ["Juno is vegetarian", "Juno likes tea"]
    assert data["server_memories_added"][0]["text"] == "Juno organised the meetup"
    assert data["blocked_in_servers"] == [str(OTHER_GUILD)] and data["chat_messages"][0]["text"] == "hello"
    json.dumps(data)

    counts = await build_services(mgr.core).delete_user_data(JUNO)
    assert counts == {
        "personal_memories": 2, "authored_server_memories": 1, "settings": 1, "chat_messages": 1, "summaries": 0,
        "memory_versions": 0,
    }
    left = await core.all_memories()
    assert sorted(m.text for m in left) == ["Juno organised the meetup", "Max likes coffee"]
    assert all(m.created_by != JUNO for m in left)
    async with core.pool.acquire() as conn:
        assert await servers_store.get_privacy(conn, JUNO) == Privacy.NONE
        assert await conn.fetchval("SELECT count(*) FROM memory_vectors") == 2
    assert await mgr.core.servers.blocklist(OTHER_GUILD)  # moderation decisions stay


async def test_full_list_add_forgets_like_any_save(make_core, clock) -> None:
    mgr = await manager(make_core, server_memory_limit=1, dormant_after_days=1)
    core = mgr.core
    bot_saved = await core.save(NewMemory(list=MemoryList.SERVER, text="old bot note", by=ADMIN, guild_id=GUILD))
    assert bot_saved.saved
    clock.current += timedelta(days=1)
    await core.reply_search(Conversation(guild_id=GUILD, channel_id=5, author_id=JUNO, text="completely unrelated"))
    result = await mgr.add(await mgr.server_list(GUILD), "new command note", actor=AS_ADMIN)
    assert result.saved and [m.text for m in result.forgotten] == ["old bot note"]
