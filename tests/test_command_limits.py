"""Every command option at and beyond its limits, and mentions in memory texts, at the Discord HTTP boundary.

Commands run through discord.py's own dispatch against the fake Discord (tests/discord_fakes.py), which
refuses with HTTP 400, as Discord does, any message over Discord's limits (2,000 characters of content,
1,024 per embed field, 6,000 per embed...). Each option gets: empty, whitespace, invisible characters,
exactly the limit, one past it, newlines, Markdown and code blocks. The answer is a clear refusal or a
correct result, and it always fits.

Mentions: memory texts with @everyone, @here, role and user mentions go through replies, notices, lists,
search, exports and the permission report; every body the bot sends must carry allowed_mentions that
ping nobody (a chat reply may ping its author, and only them).
"""

from __future__ import annotations

import json
from typing import Any

from bot.memory.models import MemoryList, NewMemory, Source
from bot.memory.service import MemoryCore
from bot.servers.models import Actor
from tests.discord_fakes import (
    GENERAL_ID,
    GUILD_ID,
    LOG_CHANNEL_ID,
    Call,
    FakeDiscord,
    SlashHarness,
)
from tests.test_discord_faults import Live, live  # noqa: F401  (fixture)
from tests.test_slash_commands import ADMIN, JUNO, core_of, harness  # noqa: F401  (fixture)

LIMIT = 1000
MENTIONS = "Party at 8 @everyone @here <@&42> <@103> <@!104>"
MARKDOWN = "**bold** _it_ ~~gone~~ ||secret|| # not a heading\n> quoted"


def answer_of(call: Call) -> str:
    return call.content or call.text()


def assert_fits(fake: FakeDiscord) -> None:
    assert fake.refused == [], [problems for _, problems in fake.refused]


async def texts(h: SlashHarness) -> list[str]:
    return [m.text for m in await core_of(h).all_memories()]


async def test_memory_text_at_and_past_its_limits(harness: SlashHarness) -> None:  # noqa: F811
    refused = {
        "": "the memory text is empty",
        "   ": "the memory text is empty",
        "\n\n\t": "the memory text is empty",
        "\u200b\u200f\u2060": "the memory text is empty",  # only invisible marks
        "z" * (LIMIT + 1): f"the memory text has {LIMIT + 1} characters; the limit is {LIMIT}",
        "  " + "w" * (LIMIT + 1) + "  ": f"has {LIMIT + 1} characters",
    }
    for text, reason in refused.items():
        call = await harness.run(harness.slash("memories add", ADMIN, text=text))
        assert call.ephemeral and answer_of(call).startswith("Not saved:") and reason in answer_of(call), (text, call.content)
    assert await texts(harness) == []

    saved = {
        "x" * LIMIT: "x" * LIMIT,
        "  " + "y" * LIMIT + "\n": "y" * LIMIT,  # the limit counts after trimming
        "a\n\n" * 333 + "a": "a\n\n" * 333 + "a",  # 1,000 characters, 667 lines: the confirmation still fits
        MARKDOWN: MARKDOWN,
        "```py\nprint('hi')\n```": "```py\nprint('hi')\n```",
        "שלום \u200fעולם, RTL text": "שלום \u200fעולם, RTL text",
        "bell\x07 and escape\x1b[31m": "bell and escape[31m",  # control characters are dropped, the rest kept
        MENTIONS: MENTIONS,
    }
    for text, stored in saved.items():
        call = await harness.run(harness.slash("memories add", ADMIN, text=text))
        assert answer_of(call).startswith("Saved server memory #"), (text, call.content)
        assert len(call.content) <= 2000 and (await texts(harness))[-1] == stored
        assert call.data["allowed_mentions"] == {"parse": []}
    assert_fits(harness.fake)

    # the list and a search show them all, 1,000-character texts included, within Discord's embed limits
    listed = await harness.run(harness.slash("memories list", ADMIN))
    assert listed.embeds and "print('hi')" in listed.text()
    command = harness.slash("memories search", ADMIN, query="x" * 200)
    found = await harness.next_call(command, after=await harness.run(command))
    assert found.embeds or found.content
    assert_fits(harness.fake)


async def test_personal_text_and_tag_limits(harness: SlashHarness) -> None:  # noqa: F811
    ok = await harness.run(harness.slash("personal memories add", JUNO, text="p" * LIMIT, scope="global"))
    assert answer_of(ok).startswith("Saved Global personal memory")
    over = await harness.run(harness.slash("personal memories add", JUNO, text="q" * (LIMIT + 1)))
    assert "the limit is 1000" in answer_of(over) and over.ephemeral

    tag_cases = {
        "a" * 32: ("saved", ("a" * 32,)),
        "#Cats, GAMES  music": ("saved", ("cats", "games", "music")),
        " ".join(f"t{n}" for n in range(10)): ("saved", tuple(f"t{n}" for n in range(10))),
        "b" * 33: ("refused", "at most 32"),
        " ".join(f"t{n}" for n in range(11)): ("refused", "at most 10 tags"),
        "bad!tag": ("refused", "must be one word"),
        " ".join("c" * 2 for _ in range(100)): ("saved", ("cc",)),  # 299 characters, one tag repeated
    }
    for number, (raw, (outcome, expected)) in enumerate(tag_cases.items()):
        call = await harness.run(harness.slash("memories add", ADMIN, text=f"Tagged fact {number}", tags=raw))
        if outcome == "saved":
            assert answer_of(call).startswith("Saved"), (raw, call.content)
            memory = next(m for m in await core_of(harness).all_memories() if m.text == f"Tagged fact {number}")
            assert memory.tags == expected
        else:
            assert expected in answer_of(call) and call.ephemeral, (raw, call.content)
            assert f"Tagged fact {number}" not in await texts(harness)
    assert_fits(harness.fake)


async def test_search_list_and_settings_options_at_their_limits(harness: SlashHarness) -> None:  # noqa: F811
    command = harness.slash("memories search", ADMIN, query="   ")
    blank = await harness.next_call(command, after=await harness.run(command))
    assert answer_of(blank) == "Type something to search for."
    for query in ("%", "_", "\\", "' OR 1=1 --", "q" * 200, "\u200b"):
        command = harness.slash("memories search", ADMIN, query=query)
        answer = await harness.next_call(command, after=await harness.run(command))
        assert answer.ephemeral and "Something went wrong" not in answer_of(answer), query
    far = await harness.run(harness.slash("memories list", ADMIN, page=10_000))
    assert "No server memories" in far.text() or far.embeds

    name_cases = {"   ": "The persona's name is empty.", "a\nb   c": "**a b c**", "N" * 80: "N" * 80}
    for raw, expected in name_cases.items():
        call = await harness.run(harness.slash("settings persona name", ADMIN, name=raw))
        assert expected in call.content, (raw, call.content)
    lore_cases = {"l" * 1000: "Added lore entry", "   ": "empty", "\u200b": "empty"}
    for raw, expected in lore_cases.items():
        call = await harness.run(harness.slash("settings lore add", ADMIN, text=raw))
        assert expected in call.content, (raw, call.content)
    attribute = await harness.run(harness.slash("settings persona attribute", ADMIN, key="k" * 40, value="v" * 200))
    assert attribute.content.startswith("Set **" + "k" * 40 + "**")
    assert_fits(harness.fake)


async def test_views_that_grow_with_the_data_always_fit(harness: SlashHarness) -> None:  # noqa: F811
    """Eight 1,000-character memories with ten 32-character tags and 30 channel limits each, 25 lore entries
    of 1,000 characters, a 4,000-character persona prompt and 25 long attributes: Discord would refuse every
    one of these views (400) if it were sent as built."""
    core = core_of(harness)
    for number in range(10):
        result = await core.save(NewMemory(
            MemoryList.SERVER, f"{number} " + "long memory text " * 58, by=ADMIN.id, via=Source.COMMAND, guild_id=GUILD_ID,
            tags=tuple(f"{chr(97 + t)}" * 31 + str(number % 10) for t in range(10)),
            channel_ids=tuple(GENERAL_ID + c for c in range(30)), by_can_manage=True,
        ))
        assert result.saved is not None, result.detail
    pipeline = harness.bot.services.pipeline  # type: ignore[attr-defined]
    for number in range(25):
        await pipeline.servers.add_lore(GUILD_ID, Actor(ADMIN.id, can_manage=True), f"Lore {number}: " + "l" * 990)
    attributes = {f"key{n:02d}" + "k" * 35: "v" * 200 for n in range(25)}
    await pipeline.servers.update_persona(GUILD_ID, Actor(1, can_manage=True), prompt="P" * 4000, attributes=attributes)

    for path in ("memories list", "settings lore list", "settings persona show", "settings show", "memories stats"):
        call = await harness.run(harness.slash(path, ADMIN))
        assert call.embeds, path
    command = harness.slash("memories search", ADMIN, query="long memory")
    found = await harness.next_call(command, after=await harness.run(command))
    assert len(found.embeds[0]["fields"]) >= 8  # shortened, not dropped, when it can
    listed = harness.fake.find(lambda c: c.method == "POST" and "long memory text" in c.text())
    assert listed and "and 25 more" in listed[0].text()  # 30 channel limits: 5 shown
    assert_fits(harness.fake)


# --- mentions at the HTTP boundary ----------------------------------------------------------------------


def message_bodies(fake: FakeDiscord) -> list[tuple[Call, dict[str, Any]]]:
    """Every message the bot sent or edited (channel messages, interaction answers, followups)."""
    found = []
    for call in fake.calls:
        if call.method not in ("POST", "PATCH") or call.body is None or "/typing" in call.path:
            continue
        data = call.data
        if data.get("content") is not None or data.get("embeds"):
            found.append((call, data))
    return found


async def test_memory_mentions_never_ping_in_replies_notices_lists_or_exports(live: Live) -> None:  # noqa: F811
    from bot.outgoing import ZERO_WIDTH_SPACE

    core: MemoryCore = live.bot.services.core  # type: ignore[assignment]
    h = SlashHarness(live.bot, live.fake)
    admin, juno = ADMIN, JUNO
    await core.servers.update_guild_settings(GUILD_ID, Actor(1, can_manage=True), notices="visible", notice_verbosity="verbose")
    assert (await h.run(h.slash("memories add", admin, text=MENTIONS))).content.startswith("Saved")
    assert (await h.run(h.slash("personal memories add", juno, text="Juno says hi to " + MENTIONS))).content.startswith("Saved")

    # the model saves a memory with mentions and repeats it in its answer
    live.chat.tool_calls(("save_memory", {"text": "Reminder for " + MENTIONS, "list": "server"}))
    live.chat.text("Sure! " + MENTIONS)
    await live.say("remember the party")
    for path, person in (("memories list", admin), ("personal memories list", juno)):
        await h.run(h.slash(path, person))
    for path, person, values in (("memories search", admin, {"query": "party"}), ("memories export", admin, {}),
                                 ("personal memories export", juno, {}), ("privacy export-my-data", juno, {})):
        command = h.slash(path, person, **values)
        await h.next_call(command, after=await h.run(command))
    # and the permission report in a log channel
    await core.servers.update_guild_settings(GUILD_ID, Actor(1, can_manage=True), notices="log", log_channel_id=LOG_CHANNEL_ID)
    live.fake.fail("POST", f"/channels/{GENERAL_ID}/messages", 403, code=50013, message="Missing Permissions")
    await live.say("are you there?")

    bodies = message_bodies(live.fake)
    assert len(bodies) >= 10
    shown = [data for _, data in bodies if "Party at 8" in json.dumps(data, ensure_ascii=False)]
    assert len(shown) >= 6  # replies, notices, lists, search: the texts really went out
    for call, data in bodies:
        allowed = data.get("allowed_mentions")
        assert allowed is not None and allowed.get("parse") == [] and not allowed.get("roles"), (call.path, allowed)
        assert set(allowed.get("users") or []) <= {juno.id}, (call.path, allowed)  # a reply may ping its author only
    in_channel = [data["content"] for call, data in bodies if call.path == f"/channels/{GENERAL_ID}/messages"]
    assert in_channel and all("@everyone" not in text and "@here" not in text for text in in_channel)
    assert any(f"@{ZERO_WIDTH_SPACE}everyone" in text for text in in_channel)  # shown, defused
    exported = [raw for call in live.fake.calls for raw in call.files.values()]
    assert len(exported) == 3 and all(MENTIONS in raw.decode() for raw in exported)  # files keep the text: they never ping


async def test_unknown_memory_ids_are_a_clear_refusal(harness: SlashHarness) -> None:  # noqa: F811
    """Autocomplete fills in the id, but a person can type any integer Discord accepts (±2^53) instead."""
    for path in ("memories delete", "memories edit", "personal memories delete", "personal memories edit"):
        for value in (0, -1, 2**53 - 1, -(2**53) + 1):
            call = await harness.run(harness.slash(path, ADMIN, memory=value))
            assert call.ephemeral and call.content.startswith(f"There is no memory #{value} in"), (path, value, call.content)
