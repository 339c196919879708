"""Discord refusing or failing what the bot sends: 403 missing permissions, 429 rate limits, 5xx outages.

The real `DeskmateBot` and its chat cog run against the local fake Discord (tests/discord_fakes.py),
which answers chosen requests with Discord's own error bodies. Each failure must be logged, retried
no more than discord.py's bounded policy allows (a retry storm would earn the bot a longer ban),
never crash the listener, and leave the bot answering elsewhere. A missing permission is reported
once to the server's log channel, so an admin learns why the bot is silent in a channel.

discord.py sleeps between retries (1-9 s after a 5xx, `retry_after` after a 429); the `fast_sleeps`
fixture shortens those sleeps, and records them, so the policy is checked without waiting for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import discord
import discord.http
import pytest

from bot.bot import MAX_RATELIMIT_WAIT_S, DeskmateBot
from bot.servers.models import Actor
from bot.services import build_services, memory_core
from cogs.chat import Chat
from tests.conftest import MakeCore
from tests.discord_fakes import (
    BOT_ID,
    BOT_USER,
    GENERAL_ID,
    GUILD_ID,
    LOG_CHANNEL_ID,
    OTHER_CHANNEL_ID,
    Call,
    FakeDiscord,
    channel_payload,
    guild_payload,
    message_payload,
    user_payload,
)
from tests.fakes import FakeChatServer

JUNO = user_payload(102, "Juno")
LOCKED_ID = 900_000_000_000_000_203  # @everyone (and so the bot) may not send messages here
SEND_MESSAGES_BIT = 1 << 11
MISSING_PERMISSIONS = 50013


def guild_with_locked_channel() -> dict[str, Any]:
    locked = channel_payload(LOCKED_ID, "announcements")
    locked["permission_overwrites"] = [{"id": str(GUILD_ID), "type": 0, "allow": "0", "deny": str(SEND_MESSAGES_BIT)}]
    return guild_payload(
        channels=[
            channel_payload(GENERAL_ID, "general"),
            channel_payload(OTHER_CHANNEL_ID, "games"),
            channel_payload(LOG_CHANNEL_ID, "bot-log"),
            locked,
        ]
    )


class FastSleeps:
    """Stands in for the `asyncio` module inside discord.http: every sleep is short and recorded."""

    def __init__(self) -> None:
        self.slept: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    async def sleep(self, delay: float, result: Any = None) -> Any:
        self.slept.append(delay)
        await asyncio.sleep(min(delay, 0.01))
        return result


@pytest.fixture
def fast_sleeps(monkeypatch: pytest.MonkeyPatch) -> FastSleeps:
    shim = FastSleeps()
    monkeypatch.setattr(discord.http, "asyncio", shim)
    return shim


@dataclass
class Live:
    bot: DeskmateBot
    fake: FakeDiscord
    chat: FakeChatServer

    @property
    def cog(self) -> Chat:
        cog = self.bot.get_cog("Chat")  # loaded as an extension: its own copy of the class, so no isinstance
        assert cog is not None and type(cog).__name__ == "Chat"
        return cog  # type: ignore[return-value]

    async def say(self, text: str, channel_id: int = GENERAL_ID) -> dict[str, Any]:
        """A member mentions the bot in `channel_id`; returns once the chat cog is done with it."""
        channel = self.bot.get_channel(channel_id)
        data = message_payload(channel_id=channel_id, author=JUNO, content=f"<@{BOT_ID}> {text}", mentions=[BOT_USER])
        message = self.bot._connection.create_message(channel=channel, data=data)  # type: ignore[arg-type]
        await asyncio.wait_for(self.cog.on_message(message), 60)
        return data

    def posts(self, channel_id: int, after: int = 0) -> list[Call]:
        return [c for c in self.fake.calls[after:] if c.method == "POST" and c.path == f"/channels/{channel_id}/messages"]


@pytest.fixture
async def live(make_core: MakeCore) -> AsyncIterator[Live]:
    async with FakeChatServer(default_text="Happy to help!") as chat, FakeDiscord(guilds=[guild_with_locked_channel()]) as fake:
        core = await make_core(chat_base_url=chat.base_url, chat_model="fake-model", chat_timeout_s=5.0)
        services = build_services(core)
        bot = DeskmateBot(services, sync_commands=False)
        await bot.login("fake-token")
        bot._connection._add_guild_from_data(guild_with_locked_channel())  # type: ignore[attr-defined]
        try:
            yield Live(bot, fake, chat)
        finally:
            await bot.close()
            await services.pipeline.model.close()


def handled_failures(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """Tracebacks from the listener's last-resort handler: an HTTP error must never end up there."""
    return [r for r in caplog.records if r.getMessage().startswith("Failed to handle message")]


async def test_a_missing_permission_is_logged_and_reported_once_to_the_log_channel(
    live: Live, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    assert live.bot.services.core is not None
    await live.bot.services.core.servers.update_guild_settings(GUILD_ID, Actor(1, can_manage=True),
        notices="log", log_channel_id=LOG_CHANNEL_ID)
    refusal = live.fake.fail("POST", f"/channels/{LOCKED_ID}/messages", 403, code=MISSING_PERMISSIONS,
                             message="Missing Permissions")

    for attempt in range(3):
        await live.say(f"are you there? ({attempt})", LOCKED_ID)
    assert refusal.hits == 3  # one try per reply: a 403 is never retried
    [report] = live.posts(LOG_CHANNEL_ID)
    assert report.body is not None and report.body["allowed_mentions"] == {"parse": []}
    assert f"<#{LOCKED_ID}>" in report.content and "Send Messages" in report.content  # names what is missing
    assert "Read Message History" not in report.content  # the bot has that one
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "missing permissions" in r.getMessage()]
    assert len(warnings) == 1 and str(LOCKED_ID) in warnings[0].getMessage()  # later refusals are logged at INFO
    assert handled_failures(caplog) == []

    # the rest of the server is unaffected
    before = len(live.fake.calls)
    await live.say("hello in general")
    assert [c.content for c in live.posts(GENERAL_ID, before)] == ["Happy to help!"]

    # once the bot could answer there again, a new refusal is worth a new report
    live.fake.failures.remove(refusal)
    await live.say("and now?", LOCKED_ID)
    live.fake.fail("POST", f"/channels/{LOCKED_ID}/messages", 403, code=MISSING_PERMISSIONS, message="Missing Permissions")
    await live.say("still there?", LOCKED_ID)
    assert len(live.posts(LOG_CHANNEL_ID)) == 2


async def test_without_a_log_channel_a_missing_permission_is_only_logged(
    live: Live, caplog: pytest.LogCaptureFixture
) -> None:
    live.fake.fail("POST", f"/channels/{GENERAL_ID}/messages", 403, code=MISSING_PERMISSIONS, message="Missing Permissions")
    await live.say("hi")
    assert live.posts(LOG_CHANNEL_ID) == [] and handled_failures(caplog) == []
    assert any("missing permissions" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


async def test_rate_limits_are_waited_out_a_bounded_number_of_times(
    live: Live, fast_sleeps: FastSleeps, caplog: pytest.LogCaptureFixture
) -> None:
    path = f"/channels/{GENERAL_ID}/messages"
    brief = live.fake.fail("POST", path, 429, retry_after=0.5, times=2)
    await live.say("hi")
    assert brief.hits == 2 and [c.content for c in live.posts(GENERAL_ID)] == ["Happy to help!"] * 3  # 2 refused, 1 sent
    assert fast_sleeps.slept.count(0.5) == 2  # waited exactly what Discord asked, before each retry

    endless = live.fake.fail("POST", path, 429, retry_after=0.5)
    before = len(live.fake.calls)
    await live.say("and again")
    assert endless.hits == 5 and len(live.posts(GENERAL_ID, before)) == 5  # discord.py's limit, then it gives up
    live.fake.failures.remove(endless)

    # a wait longer than MAX_RATELIMIT_WAIT_S fails that send at once instead of stalling the listener for an hour
    long_wait = live.fake.fail("POST", path, 429, retry_after=3600)
    before = len(live.fake.calls)
    await live.say("one more")
    assert long_wait.hits == 1 and len(live.posts(GENERAL_ID, before)) == 1
    assert 3600 not in fast_sleeps.slept and MAX_RATELIMIT_WAIT_S < 3600
    assert live.posts(LOG_CHANNEL_ID) == [] and handled_failures(caplog) == []

    live.fake.failures.remove(long_wait)
    before = len(live.fake.calls)
    await live.say("back to normal?")
    assert [c.content for c in live.posts(GENERAL_ID, before)] == ["Happy to help!"]


async def test_server_errors_are_retried_a_bounded_number_of_times_then_logged(
    live: Live, fast_sleeps: FastSleeps, caplog: pytest.LogCaptureFixture
) -> None:
    path = f"/channels/{GENERAL_ID}/messages"
    outage = live.fake.fail("POST", path, 500, message="Internal Server Error")
    await live.say("hi")
    assert outage.hits == 5  # discord.py's 5 tries with growing pauses, then the reply is given up
    assert [delay for delay in fast_sleeps.slept if delay >= 1] == [1, 3, 5, 7, 9]
    assert any(r.levelno == logging.WARNING and "Could not reply" in r.getMessage() for r in caplog.records)
    assert handled_failures(caplog) == []

    unavailable = live.fake.fail("POST", f"/channels/{OTHER_CHANNEL_ID}/messages", 503, message="Service Unavailable")
    await live.say("and here?", OTHER_CHANNEL_ID)
    assert unavailable.hits == 1  # 503 is not retried by discord.py

    live.fake.failures.clear()
    before = len(live.fake.calls)
    await live.say("better now?")
    assert [c.content for c in live.posts(GENERAL_ID, before)] == ["Happy to help!"]


async def test_a_failing_typing_indicator_never_holds_up_the_reply(live: Live, fast_sleeps: FastSleeps) -> None:
    typing = live.fake.fail("POST", f"/channels/{GENERAL_ID}/typing", 500)
    await live.say("hi")
    assert [c.content for c in live.posts(GENERAL_ID)] == ["Happy to help!"]
    await asyncio.sleep(0.2)  # the typing side task gives up on its own, within discord.py's 5 tries
    assert 1 <= typing.hits <= 5


async def test_notices_that_cannot_be_posted_are_logged_not_raised(live: Live, caplog: pytest.LogCaptureFixture) -> None:
    assert live.bot.services.core is not None
    await live.bot.services.core.servers.update_guild_settings(GUILD_ID, Actor(1, can_manage=True),
        notices="log", log_channel_id=LOG_CHANNEL_ID)
    live.fake.fail("POST", f"/channels/{LOG_CHANNEL_ID}/messages", 403, code=MISSING_PERMISSIONS, message="Missing Permissions")
    live.chat.tool_calls(("save_memory", {"text": "The server's mascot is a heron", "list": "server"})).text("Noted.")
    await live.say("our mascot is a heron")
    assert [c.content for c in live.posts(GENERAL_ID)] == ["Noted."]
    assert len(live.posts(LOG_CHANNEL_ID)) == 1  # the notice was tried once; no report about the log channel to itself
    assert handled_failures(caplog) == []
    assert [m.text for m in await live.bot.services.core.all_memories()] == ["The server's mascot is a heron"]


async def test_shard_settings_reach_the_sharded_client(make_core: MakeCore) -> None:
    from bot.config import load_settings

    core = await make_core()

    def bot_with(env: dict[str, str]) -> DeskmateBot:
        settings = load_settings(env, dotenv_path=None)
        services = build_services(memory_core(core.pool, core.embeddings.embedder, settings, core.clock))
        return DeskmateBot(services, sync_commands=False)

    bot = bot_with({"SHARD_COUNT": "4", "SHARD_IDS": "2-3"})
    assert bot.shard_count == 4 and bot.shard_ids == [2, 3]
    assert bot_with({}).shard_ids is None
    assert isinstance(bot, discord.AutoShardedClient)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SHARD_IDS": "0"}, "SHARD_IDS needs SHARD_COUNT"),
        ({"SHARD_COUNT": "2", "SHARD_IDS": "2"}, "SHARD_IDS must be from 0 to SHARD_COUNT - 1 (1); 2 is outside"),
        ({"SHARD_COUNT": "4", "SHARD_IDS": "0-5"}, "4, 5 are outside"),
        ({"SHARD_COUNT": "4", "SHARD_IDS": "1,1"}, "SHARD_IDS lists shard 1 twice"),
        ({"SHARD_COUNT": "4", "SHARD_IDS": "3-1"}, "the range 3-1 goes backwards"),
        ({"SHARD_COUNT": "4", "SHARD_IDS": "one"}, "SHARD_IDS must be shard numbers or ranges"),
        ({"SHARD_COUNT": "0"}, "SHARD_COUNT must be a whole number from 1 to 65535"),
    ],
)
def test_bad_shard_settings_name_the_variable(env: dict[str, str], message: str) -> None:
    from bot.config import ConfigError, load_settings

    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_settings(env, dotenv_path=None)
    assert load_settings({"SHARD_COUNT": "8", "SHARD_IDS": "0-3, 6"}, dotenv_path=None).shard_ids == (0, 1, 2, 3, 6)


@pytest.mark.parametrize(
    ("status", "retry_after", "said"),
    [(400, None, "Discord answered 400 (code 50035)"), (429, 120.0, "Discord rate-limited it for 120 s")],
)
async def test_a_refused_command_sync_is_one_line_and_retried_while_the_bot_goes_on(
    make_core: MakeCore, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
    status: int, retry_after: float | None, said: str,
) -> None:
    """A Discord-compatible server refused some option fields (400, 50035) and the bot used to exit from
    setup_hook with a traceback; a sync can also meet a long 429. Now: one warning, the bot stays up, and the
    sync is tried again with backoff until it goes through."""
    import bot.bot as bot_module

    monkeypatch.setattr(bot_module, "SYNC_RETRY_FIRST_S", 0.05)
    async with FakeDiscord() as fake:
        path = f"/applications/{BOT_ID}/commands"
        refusal = fake.fail("PUT", path, status, code=50035 if status == 400 else 0, message="Invalid Form Body",
                            retry_after=retry_after, times=2)
        services = build_services(await make_core())
        bot = DeskmateBot(services)
        caplog.set_level(logging.WARNING, logger="bot.bot")
        try:
            await bot.login("fake-token")  # runs setup_hook: the first sync fails here
            assert not bot.is_closed() and bot.get_cog("Chat") is not None
            for _ in range(200):  # two refusals, then the one that goes through
                puts = [c for c in fake.calls if c.method == "PUT" and c.path.endswith(path)]
                if refusal.hits == 2 and len(puts) == 3:
                    break
                await asyncio.sleep(0.05)
            assert refusal.hits == 2 and len(puts) == 3, "the sync was never tried again"
        finally:
            await bot.close()
    lines = [r.getMessage() for r in caplog.records if "Could not sync the slash commands" in r.getMessage()]
    assert len(lines) == 2 and all(said in line and "chat replies go on" in line for line in lines), lines
    assert "retrying in 0.05 s" in lines[0] and "retrying in 0.1 s" in lines[1]
    assert not [r for r in caplog.records if r.exc_info]  # no traceback
