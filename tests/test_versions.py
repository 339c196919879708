"""Nothing is lost by a change: every change of a memory's text keeps the text it replaces as a version (when, why,
by whom), viewable and restorable by command, carried by exports and removed by delete-my-data; and the model's
update of a memory with a text about something else is saved beside it instead of over it.

Against the real database and the real built-in embedder; the chat model is the local scripted server.
"""

from __future__ import annotations

import dataclasses
import io
import json
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from bot.config import Settings
from bot.console import run_console
from bot.embeddings.providers import BuiltinEmbedder
from bot.errors import Refusal
from bot.memory.lists import ImportMode
from bot.memory.manage import MemoryManager
from bot.memory.models import Source, VersionVia
from bot.memory.relatedness import same_subject, shares_a_word
from bot.servers.models import Actor
from bot.services import build_services
from tests.fakes import FakeChatServer
from tests.recall_helpers import GUILD, JUNO, SAM, build_world

ADMIN = 1
PAIRS = [json.loads(line) for line in (Path(__file__).parent / "data" / "updates.jsonl").read_text().splitlines()]


async def test_the_guard_applies_no_unrelated_update_of_the_hand_made_pairs(builtin_embedder: BuiltinEmbedder) -> None:
    """UPDATE_MIN_SIMILARITY holds against tests/data/updates.jsonl: no update about something else is applied,
    and the corrections it keeps apart (saved beside the old fact, nothing lost) are few."""
    threshold = Settings().update_min_similarity
    old = await builtin_embedder.embed([pair["old"] for pair in PAIRS])
    new = await builtin_embedder.embed([pair["new"] for pair in PAIRS])
    decided = []
    for pair, a, b in zip(PAIRS, old, new, strict=True):
        cosine = float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b))
        decided.append((pair["same_subject"], same_subject(pair["old"], pair["new"], cosine, threshold)))
    unrelated_applied = sum(1 for truth, applied in decided if applied and not truth)
    related_kept_apart = sum(1 for truth, applied in decided if truth and not applied)
    assert unrelated_applied == 0
    assert related_kept_apart <= 2, related_kept_apart  # of 34: a job change and the Spanish meetup, in other words
    assert sum(1 for truth, _ in decided if truth) >= 30 and sum(1 for truth, _ in decided if not truth) >= 30


async def test_a_declared_correction_is_held_to_a_lower_bar_that_still_applies_no_unrelated_pair(
    builtin_embedder: BuiltinEmbedder,
) -> None:
    """A day-end correction from a line that says it changes something gets CORRECTION_MARGIN off the threshold when it
    shares a content word: even with every pair of the set taken as such a correction, no unrelated one is applied,
    and the Spanish meetup's change (1.5B's English words, 0.50 by the plain rule) replaces the old meetup."""
    threshold = Settings().update_min_similarity
    old = await builtin_embedder.embed([pair["old"] for pair in PAIRS])
    new = await builtin_embedder.embed([pair["new"] for pair in PAIRS])
    applied = {}
    for pair, a, b in zip(PAIRS, old, new, strict=True):
        cosine = float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b))
        applied[pair["new"]] = (pair["same_subject"], same_subject(pair["old"], pair["new"], cosine, threshold,
                                                                   declared_change=True))
    assert [text for text, (truth, done) in applied.items() if done and not truth] == []
    assert applied["Lucía changed the meeting time to Sunday at 18h due to rain."] == (True, True)


def test_server_is_no_content_word() -> None:
    """Every server memory is about the server: sharing the word says nothing (like a person's name in their list)."""
    assert not shares_a_word("The server meetup is planned for July", "The server has a channel for pet photos")
    assert shares_a_word("The server meetup is planned for July", "The server meetup was postponed to September")


def test_without_an_embedding_a_shared_word_decides() -> None:
    assert same_subject("Juno's cat is called Mochi", "Juno's cat is called Luna", None, 0.6)
    assert not same_subject("Juno's cat is called Mochi", "I love playing chess on weekends", None, 0.6)


async def test_every_command_edit_keeps_the_old_text_and_a_restore_brings_it_back(make_core, clock) -> None:
    mgr = MemoryManager(await make_core())
    ref = await mgr.server_list(GUILD)
    first = await mgr.add(ref, "Game night is on Fridays", actor=Actor(ADMIN, can_manage=True))
    assert first.saved is not None
    memory_id = first.saved.id
    saved_at = clock.now()
    clock.current += timedelta(hours=2)
    await mgr.edit(ref, memory_id, "Game night is on Saturdays", actor=Actor(ADMIN, can_manage=True))
    clock.current += timedelta(hours=2)
    await mgr.edit(ref, memory_id, "Game night is on Saturdays", actor=Actor(ADMIN, can_manage=True), tags=["games"])  # same text
    await mgr.edit(ref, memory_id, "Game night is on Sundays at 8pm", actor=Actor(ADMIN, can_manage=True))

    page = await mgr.versions.page(ref, memory_id)
    assert page.memory.text == "Game night is on Sundays at 8pm" and page.total == 2  # a tags-only change is no version
    newest, oldest = page.versions
    assert (oldest.text, newest.text) == ("Game night is on Fridays", "Game night is on Saturdays")
    assert oldest.written_by == ADMIN and oldest.written_at == saved_at and oldest.source == Source.COMMAND
    assert oldest.replaced_by == ADMIN and oldest.replaced_via == VersionVia.COMMAND
    assert oldest.replaced_at == saved_at + timedelta(hours=2) and oldest.reason == "edited with a command"
    assert newest.written_at == oldest.replaced_at  # each text's life: from the change that wrote it to the next

    restored = await mgr.versions.restore(ref, memory_id, oldest.id, actor=Actor(ADMIN, can_manage=True))
    assert restored.saved is not None and restored.saved.text == "Game night is on Fridays" and restored.saved.protected
    page = await mgr.versions.page(ref, memory_id)
    assert page.total == 3 and page.versions[0].text == "Game night is on Sundays at 8pm"
    assert page.versions[0].reason == f"restored version #{oldest.id}"  # a restore can itself be undone
    with pytest.raises(Refusal, match="already has"):
        await mgr.versions.restore(ref, memory_id, oldest.id, actor=Actor(ADMIN, can_manage=True))
    with pytest.raises(Refusal, match="no version"):
        await mgr.versions.restore(ref, memory_id, 999_999, actor=Actor(ADMIN, can_manage=True))
    # paginated: five to a page, newest first; another list's memory is "not there"
    for number in range(7):
        await mgr.edit(ref, memory_id, f"Game night is on Fridays, room {number}", actor=Actor(ADMIN, can_manage=True))
    second = await mgr.versions.page(ref, memory_id, 1)
    assert (second.total, second.pages, len(second.versions)) == (10, 2, 5)
    with pytest.raises(Refusal, match="no memory"):
        await mgr.versions.page(await mgr.personal_list(JUNO, GUILD), memory_id)


async def test_a_member_may_not_restore_what_they_may_not_edit(make_core) -> None:
    mgr = MemoryManager(await make_core())
    ref = await mgr.server_list(GUILD)
    saved = await mgr.add(ref, "Rule 1: be kind", actor=Actor(ADMIN, can_manage=True))
    assert saved.saved is not None
    await mgr.edit(ref, saved.saved.id, "Rule 1: be kind to everyone", actor=Actor(ADMIN, can_manage=True))
    version = (await mgr.versions.page(ref, saved.saved.id)).versions[0]
    with pytest.raises(Refusal, match="Manage Server"):
        await mgr.versions.restore(ref, saved.saved.id, version.id, actor=Actor(SAM))
    assert (await mgr.get(ref, saved.saved.id)).text == "Rule 1: be kind to everyone"


async def test_the_models_unrelated_update_is_saved_beside_the_memory_it_would_have_erased(make_core, clock) -> None:
    async with FakeChatServer() as chat:
        world = await build_world(make_core, clock, chat.base_url, chat_timeout_s=60.0)
        core, mgr = world.core, world.services.memories
        cat = await mgr.add(await mgr.personal_list(JUNO, GUILD), "Juno's cat is called Mochi", actor=Actor(JUNO))
        assert cat.saved is not None
        await _unprotect(world, cat.saved.id)
        chat.tool_calls(
            ("update_memory", {"memory_id": cat.saved.id, "text": "I love playing chess on weekends, and I'm learning Spanish."})
        ).text("Noted!")
        asked = world.message(JUNO, "Do you remember my cat? I love chess too")
        outcome = await world.services.chat.handle(asked, mentions_bot=True)
        assert outcome is not None
        texts = sorted(m.text for m in await core.all_memories())
        assert texts == ["I love playing chess on weekends, and I'm learning Spanish.", "Juno's cat is called Mochi"]
        result = chat.tool_results()[0]
        assert result["ok"] and result["kept"] == cat.saved.id and "something else" in result["note"]
        assert (await mgr.versions.page(await mgr.personal_list(JUNO, GUILD), cat.saved.id)).total == 0

        # a real correction is applied as an update, and the old text is kept as the model's version
        chat.tool_calls(("update_memory", {"memory_id": cat.saved.id, "text": "Juno's cat is called Luna"})).text("Updated!")
        await world.services.chat.handle(world.message(JUNO, "Actually my cat is called Luna"), mentions_bot=True)
        page = await mgr.versions.page(await mgr.personal_list(JUNO, GUILD), cat.saved.id)
        assert page.memory.text == "Juno's cat is called Luna" and page.total == 1
        version = page.versions[0]
        assert (version.text, version.replaced_via, version.replaced_by) == ("Juno's cat is called Mochi", VersionVia.BOT, JUNO)
        assert version.reason == "updated by the model in a reply to Juno"


async def _unprotect(world, memory_id: int) -> None:
    """A bot-saved memory, as if the model had saved it (command-made ones are protected from the model)."""
    async with world.core.pool.acquire() as conn:
        await conn.execute("UPDATE memories SET source = 'bot', protected = false WHERE id = $1", memory_id)


async def test_the_model_never_changes_a_protected_memory(make_core, clock) -> None:
    async with FakeChatServer() as chat:
        world = await build_world(make_core, clock, chat.base_url, chat_timeout_s=60.0)
        mgr = world.services.memories
        rule = await mgr.add(await mgr.server_list(GUILD), "Rule 1: be kind", actor=Actor(ADMIN, can_manage=True))
        assert rule.saved is not None
        chat.tool_calls(("update_memory", {"memory_id": rule.saved.id, "text": "Rule 1: anything goes"})).text("ok")
        asked = dataclasses.replace(world.message(SAM, "change rule 1 to anything goes"), author_can_manage=True)
        await world.services.chat.handle(asked, mentions_bot=True)
        assert not chat.tool_results()[0]["ok"] and "protected" in chat.tool_results()[0]["error"]
        assert [m.text for m in await world.core.all_memories()] == ["Rule 1: be kind"]


async def test_exports_carry_versions_and_imports_take_them(make_core) -> None:
    mgr = MemoryManager(await make_core())
    ref = await mgr.personal_list(JUNO, GUILD)
    saved = await mgr.add(ref, "Juno lives in Berlin", actor=Actor(JUNO))
    assert saved.saved is not None
    await mgr.edit(ref, saved.saved.id, "Juno lives in Lisbon", actor=Actor(JUNO))
    doc = await mgr.export(ref, Actor(JUNO))
    (entry,) = doc["memories"]
    assert entry["text"] == "Juno lives in Lisbon"
    assert [(v["text"], v["replaced_via"], v["reason"]) for v in entry["versions"]] == [
        ("Juno lives in Berlin", "command", "edited with a command")
    ]
    other = await mgr.personal_list(SAM, GUILD)
    plan = mgr.parse_import(other, json.dumps(doc).encode())
    result = await mgr.import_memories(other, plan, mode=ImportMode.MERGE, actor=Actor(SAM))
    assert result.added == 1
    user_data = await build_services(mgr.core).export_user_data(JUNO)
    assert user_data["personal_memories"][0]["versions"][0]["text"] == "Juno lives in Berlin"


async def test_delete_my_data_removes_the_persons_versions(make_core) -> None:
    mgr = MemoryManager(await make_core())
    core = mgr.core
    await core.servers.update_guild_settings(GUILD, Actor(1, can_manage=True), member_teaching=True)
    server = await mgr.server_list(GUILD)
    juno_fact = await mgr.add(server, "Juno runs the book club", actor=Actor(JUNO))  # her words, in a server memory
    assert juno_fact.saved is not None
    await mgr.edit(server, juno_fact.saved.id, "The book club meets on Mondays", actor=Actor(ADMIN, can_manage=True))
    admin_fact = await mgr.add(server, "Movie night is on Fridays", actor=Actor(ADMIN, can_manage=True))
    assert admin_fact.saved is not None
    # she (with Manage Server) replaced the admin's words
    await mgr.edit(server, admin_fact.saved.id, "Movie night is on Thursdays", actor=Actor(JUNO, can_manage=True))
    own = await mgr.add(await mgr.personal_list(JUNO, GUILD), "Juno lives in Berlin", actor=Actor(JUNO))
    assert own.saved is not None
    await mgr.edit(await mgr.personal_list(JUNO, GUILD), own.saved.id, "Juno lives in Lisbon", actor=Actor(JUNO))

    counts = await build_services(core).delete_user_data(JUNO)
    assert counts["memory_versions"] == 2  # the texts she wrote: "Juno runs the book club", "Juno lives in Berlin"
    async with core.pool.acquire() as conn:
        left = await conn.fetch("SELECT memory_id, text, written_by, replaced_by FROM memory_versions ORDER BY id")
    # her own memory's history went with it, her words left the book club's, her name left the movie night's
    assert [dict(row) for row in left] == [
        {"memory_id": admin_fact.saved.id, "text": "Movie night is on Fridays", "written_by": ADMIN, "replaced_by": None}
    ]


async def test_the_console_shows_a_memorys_history_and_restores_a_version(
    db_url: str, tmp_path: Path, builtin_embedder: BuiltinEmbedder
) -> None:
    settings = Settings(database_url=db_url, data_dir=tmp_path)
    script = "\n".join(
        [
            "/as Juno",
            "/remember Game night is on Fridays",
            "/edit 1 Game night is on Saturdays",
            "/history 1",
            "/history",
            "/restore 1 1",
            "/history 1 1",
            "/history 2",
            "/restore 1 x",
        ]
    )
    out = io.StringIO()
    assert await run_console(settings, stdin=io.StringIO(script + "\n"), out=out, builtin=builtin_embedder) == 0
    text = out.getvalue()
    assert "#1 now: Game night is on Saturdays\n  1 earlier text (page 1 of 1)" in text
    assert "  version #1 · written " in text and ": Game night is on Fridays\n    replaced " in text
    assert "by Juno with a command: edited with a command" in text
    assert "history recall on here" in text  # without an id, /history is still the chat-history switch
    assert "restored #1: Game night is on Fridays" in text
    assert "#1 now: Game night is on Fridays\n  2 earlier texts" in text and "restored version #1" in text
    assert "error: there is no memory #2 that you can change here" in text
    assert "usage: /restore ID VERSION" in text
