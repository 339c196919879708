"""Every limit and permission is decided by the services, the same for every adapter: the console reaches the same
refusals as the Discord commands (lore size and count, auto-reply channels, persona prompt, server settings' values,
who may edit or delete a server memory), and the documents and summaries keep their limits. Real database; the
console runs in-process."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from bot.config import Settings
from bot.console import run_console
from bot.embeddings.providers import BuiltinEmbedder
from bot.errors import InvalidInput, NotAllowed
from bot.memory.manage import MemoryManager
from bot.memory.service import MemoryCore
from bot.prompt import HeadSummary, _fit_summaries
from bot.servers.models import Actor
from bot.servers.rules import LORE_MAX_CHARS, MAX_AUTO_REPLY_CHANNELS, MAX_LORE_ENTRIES, PERSONA_PROMPT_MAX_CHARS
from bot.summaries.writer import MAX_DETAIL_CHARS, read_answer
from tests.conftest import MakeCore

GUILD = 10
ADMIN, JUNO, SAM = Actor(1, can_manage=True), Actor(2), Actor(3)


async def console(db_url: str, tmp_path: Path, builtin: BuiltinEmbedder, lines: list[str]) -> str:
    out = io.StringIO()
    settings = Settings(database_url=db_url, data_dir=tmp_path)
    assert await run_console(settings, stdin=io.StringIO("\n".join(lines) + "\n"), out=out, builtin=builtin) == 0
    return out.getvalue()


async def test_the_console_meets_the_same_limits_as_the_discord_commands(
    db_url: str, tmp_path: Path, builtin_embedder: BuiltinEmbedder
) -> None:
    too_long = "L" * (LORE_MAX_CHARS + 1)
    lines = [f"/lore add {too_long}", *(f"/lore add rule {n}" for n in range(MAX_LORE_ENTRIES + 1))]
    lines += [f"/persona prompt {'P' * (PERSONA_PROMPT_MAX_CHARS + 1)}"]
    for n in range(MAX_AUTO_REPLY_CHANNELS + 1):
        lines += [f"/channel room{n}", "/settings auto-reply on"]
    text = await console(db_url, tmp_path, builtin_embedder, lines)
    assert f"error: a lore entry has {LORE_MAX_CHARS + 1} characters; the limit is {LORE_MAX_CHARS}" in text
    assert text.count("lore #") == MAX_LORE_ENTRIES and "at most 25 lore entries" in text
    assert f"the persona prompt has {PERSONA_PROMPT_MAX_CHARS + 1} characters" in text
    assert f"at most {MAX_AUTO_REPLY_CHANNELS} auto-reply channels" in text


async def test_server_settings_check_values_and_who_changes_them(make_core: MakeCore) -> None:
    core = await make_core()
    servers = core.servers
    for bad, sentence in (({"notices": "loud"}, "notices must be one of"), ({"self_teaching": "yes"}, "must be on or off"),
                          ({"log_channel_id": "#general"}, "log channel"), ({"notices": "log"}, "pick a log channel"),
                          ({"auto_reply_channel_ids": list(range(1, 30))}, "at most 25"), ({"colour": "red"}, "unknown")):
        with pytest.raises(InvalidInput, match=sentence):
            await servers.update_guild_settings(GUILD, ADMIN, **bad)
    with pytest.raises(NotAllowed, match="Manage Server"):
        await servers.update_guild_settings(GUILD, JUNO, tagging=True)
    with pytest.raises(NotAllowed):
        await servers.add_lore(GUILD, JUNO, "members cannot add lore")
    with pytest.raises(NotAllowed):
        await servers.update_persona(GUILD, JUNO, prompt="members cannot change the persona")
    assert (await servers.guild_settings(GUILD)).notices == "visible" and await servers.lore(GUILD) == []
    changed = await servers.update_guild_settings(GUILD, ADMIN, notices="log", log_channel_id="555")
    assert (changed.notices, changed.log_channel_id) == ("log", 555)


async def test_who_may_edit_or_delete_a_server_memory_is_decided_by_the_service(make_core: MakeCore) -> None:
    core: MemoryCore = await make_core()
    manager = MemoryManager(core)
    ref = await manager.server_list(GUILD)
    admin_fact = (await manager.add(ref, "The admins wrote this", actor=ADMIN)).saved
    assert admin_fact is not None
    with pytest.raises(NotAllowed, match="member teaching"):
        await manager.add(ref, "A member's fact", actor=JUNO)
    await core.servers.update_guild_settings(GUILD, ADMIN, member_teaching=True)
    own = (await manager.add(ref, "Juno's own fact", actor=JUNO)).saved
    assert own is not None
    with pytest.raises(NotAllowed, match="you can only edit server memories you added yourself"):
        await manager.changeable(ref, admin_fact.id, JUNO, "edit")
    with pytest.raises(NotAllowed, match="you can only delete"):
        await manager.delete(ref, own.id, actor=SAM)
    assert (await manager.edit(ref, own.id, "Juno's own fact, edited", actor=JUNO)).saved is not None
    with pytest.raises(NotAllowed, match="Manage Server"):
        await manager.export(ref, JUNO)
    assert {m.text for m in await core.all_memories()} == {"The admins wrote this", "Juno's own fact, edited"}


def make_sparse(path: Path, size: int) -> None:
    with path.open("wb") as file:
        file.truncate(size)


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero here")
async def test_documents_refuse_too_large_files_before_reading_them(
    db_url: str, tmp_path: Path, builtin_embedder: BuiltinEmbedder
) -> None:
    big = tmp_path / "big.md"
    make_sparse(big, 5 * 1024 * 1024)  # says 5 MB without taking the disk
    text = await console(db_url, tmp_path, builtin_embedder, ["/documents add /dev/zero", f"/documents add {big}"])
    assert text.count("is larger than") == 2 and "added document" not in text


def test_a_summary_over_the_budget_is_skipped_not_the_end_of_the_older_ones() -> None:
    small = [HeadSummary(key=f"summary:{n}", period=f"day {n}", line=f'{{"day": "{n}", "summary": "short"}}') for n in range(3)]
    huge = HeadSummary(key="summary:9", period="day 9", line='{"summary": "' + "word " * 2000 + '"}')
    kept, cut = _fit_summaries([*small, huge], budget=200)
    assert [s.key for s in kept] == [s.key for s in small] and cut == [huge]


def test_key_details_are_capped() -> None:
    answer = '{"summary": "a day", "key_details": ["' + "x" * 5_000_000 + '", "a short fact"]}'
    written = read_answer(answer)
    assert written is not None and len(written.key_details[0]) == MAX_DETAIL_CHARS
    assert written.key_details[1] == "a short fact"
