"""What Discord-compatible servers send that Discord does not: the bot reads what it can, logs one line for what it
cannot, and stays connected. The real `run_bot` against the local fake Discord (tests/discord_fakes.py)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from bot.bot import DeskmateBot, one_line, run_bot
from bot.config import load_settings
from bot.services import build_services
from tests.conftest import MakeCore
from tests.discord_fakes import BOT_ID, BOT_USER, GENERAL_ID, Call, FakeDiscord, message_payload, user_payload
from tests.fakes import FakeChatServer

JUNO = user_payload(102, "Juno")
DM_CHANNEL_ID = 900_000_000_000_000_300


@asynccontextmanager
async def connected_bot(db_url: str, data_dir: Path) -> AsyncIterator[tuple[DeskmateBot, FakeDiscord, FakeChatServer,
                                                                            asyncio.Task[int]]]:
    async with FakeChatServer() as chat, FakeDiscord() as discord_api:
        settings = load_settings(
            {"DISCORD_TOKEN": "fake-token", "DATABASE_URL": db_url, "CHAT_BASE_URL": chat.base_url,
             "CHAT_MODEL": "fake-model", "DATA_DIR": str(data_dir), "SUMMARY_ENABLED": "false"},
            dotenv_path=None,
        )
        made: asyncio.Future[DeskmateBot] = asyncio.get_running_loop().create_future()
        running = asyncio.create_task(run_bot(settings, on_start=made.set_result, guild_ready_timeout=0.1))
        try:
            bot = await asyncio.wait_for(made, 60)
            await asyncio.wait_for(bot.wait_until_ready(), 60)
            yield bot, discord_api, chat, running
        finally:
            if not running.done():
                os.kill(os.getpid(), signal.SIGTERM)
            assert await asyncio.wait_for(running, 60) == 0


def posted_in(channel_id: int) -> object:
    def match(call: Call) -> bool:
        return call.method == "POST" and call.path == f"/channels/{channel_id}/messages"
    return match


async def test_malformed_gateway_events_are_one_log_line_and_the_bot_goes_on(
    db_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="bot.bot")
    async with connected_bot(db_url, tmp_path) as (bot, discord_api, chat, running):
        # a direct message from a Discord-compatible server that says `"guild_id": null`: read as the DM it is
        chat.text("Hi Juno, here in your DMs.")
        start = len(discord_api.calls)
        dm = message_payload(channel_id=DM_CHANNEL_ID, author=JUNO, content="hello from a DM", guild_id=None)
        dm["guild_id"] = None
        await discord_api.dispatch("MESSAGE_CREATE", dm)
        answer = await discord_api.wait_for(posted_in(DM_CHANNEL_ID), 60, after=start)  # type: ignore[arg-type]
        assert answer.content == "Hi Juno, here in your DMs."

        # events nobody can read: a channel id that is no number, a message without an author
        broken = message_payload(channel_id=GENERAL_ID, author=JUNO, content="broken")
        broken["channel_id"] = "not-a-number"
        await discord_api.dispatch("MESSAGE_CREATE", broken)
        no_author = message_payload(channel_id=GENERAL_ID, author=JUNO, content="no author", mentions=[BOT_USER])
        del no_author["author"]
        await discord_api.dispatch("MESSAGE_CREATE", no_author)

        # the bot is still connected and answers the next mention
        chat.text("Still here!")
        start = len(discord_api.calls)
        await discord_api.dispatch("MESSAGE_CREATE", message_payload(
            channel_id=GENERAL_ID, author=JUNO, content=f"<@{BOT_ID}> are you there?", mentions=[BOT_USER]))
        reply = await discord_api.wait_for(posted_in(GENERAL_ID), 60, after=start)  # type: ignore[arg-type]
        assert reply.content == "Still here!"
        assert not running.done() and not bot.is_closed()
    skipped = [record for record in caplog.records if "could not be read" in record.getMessage()]
    assert len(skipped) == 2, [record.getMessage() for record in skipped]
    for record in skipped:
        assert "MESSAGE_CREATE" in record.getMessage() and "\n" not in record.getMessage() and record.exc_info is None


def test_a_long_discord_refusal_is_one_line() -> None:
    """A refused command tree lists every bad field on its own line (43 of them on a Discord-compatible server)."""
    text = "Invalid Form Body\n" + "\n".join(f"In {i}.options.0.name: String value did not match validation regex."
                                             for i in range(43))
    line = one_line(text)
    assert "\n" not in line and len(line) < 340 and line.startswith("Invalid Form Body; In 0.options.0.name")
    assert line.endswith("(44 lines in all)")
    assert one_line("Missing Access") == "Missing Access"


async def test_a_refused_command_tree_is_one_warning_line_per_attempt(
    make_core: MakeCore, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import bot.bot as bot_module

    monkeypatch.setattr(bot_module, "SYNC_RETRY_FIRST_S", 0.05)
    errors = {str(i): {"options": {"0": {"name": {"_errors": [
        {"code": "STRING_TYPE_REGEX", "message": "String value did not match validation regex."}]}}}} for i in range(43)}
    async with FakeDiscord() as fake:
        path = f"/applications/{BOT_ID}/commands"
        refusal = fake.fail("PUT", path, 400, code=50035, message="Invalid Form Body", times=2, errors=errors)
        bot = DeskmateBot(build_services(await make_core()))
        caplog.set_level(logging.WARNING, logger="bot.bot")
        try:
            await bot.login("fake-token")
            for _ in range(200):
                if refusal.hits == 2 and len(fake.find(lambda c: c.method == "PUT" and c.path == path)) == 3:
                    break
                await asyncio.sleep(0.05)
        finally:
            await bot.close()
    lines = [r.getMessage() for r in caplog.records if "Could not sync the slash commands" in r.getMessage()]
    assert len(lines) == 2, lines
    for line in lines:
        assert "\n" not in line and len(line) < 500, line
        assert "Discord answered 400 (code 50035): Invalid Form Body; In 0.options.0.name" in line
        assert "lines in all)" in line and "chat replies go on" in line


async def test_while_the_gateway_is_down_the_heartbeat_stops_and_each_reconnect_is_one_line(
    db_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The Docker health check reads DATA_DIR/heartbeat: it must go stale while the bot cannot reach Discord (it was
    touched all along, so a disconnected bot stayed "healthy"), and start again once the bot is back."""
    caplog.set_level(logging.WARNING)
    heartbeat = tmp_path / "heartbeat"
    async with connected_bot(db_url, tmp_path) as (bot, discord_api, _chat, running):
        for _ in range(200):
            if heartbeat.is_file():
                break
            await asyncio.sleep(0.05)
        assert bot.connected()
        await discord_api.drop_gateway()
        for _ in range(600):
            if not bot.connected():
                break
            await asyncio.sleep(0.05)
        assert not bot.connected()
        os.utime(heartbeat, (1_000_000_000, 1_000_000_000))
        await bot._touch_heartbeat()
        assert heartbeat.stat().st_mtime == 1_000_000_000  # not touched while disconnected
        reconnects = [r for r in caplog.records if r.getMessage().startswith("Attempting a reconnect")]
        for _ in range(600):  # the bot retries with backoff; at least one attempt meets the closed gateway
            reconnects = [r for r in caplog.records if r.getMessage().startswith("Attempting a reconnect")]
            if reconnects:
                break
            await asyncio.sleep(0.05)
        assert reconnects
        for record in reconnects:
            assert record.exc_info is None and record.levelno == logging.WARNING and "\n" not in record.getMessage()

        discord_api.gateway_up = True
        for _ in range(1200):  # back within discord.py's backoff (a minute at most here)
            if bot.connected():
                break
            await asyncio.sleep(0.05)
        assert bot.connected() and not running.done()
        await bot._touch_heartbeat()
        assert heartbeat.stat().st_mtime > 1_000_000_000
