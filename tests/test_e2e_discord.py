"""End to end: the real bot process logic against a local Discord (REST + gateway) and a local chat model.

`run_bot` starts exactly as `python -m bot` does with DISCORD_TOKEN set: settings from the
environment, the database opened and migrated, the embedder warmed up, cogs loaded, the tree
synced, the gateway connected. A MESSAGE_CREATE that mentions the bot gets a reply posted back
over REST (typing first, a reply reference, pinging only the author), a memory the model saved
gets its notice, and SIGTERM shuts everything down cleanly.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from bot.bot import DeskmateBot, StartupError, run_bot
from bot.config import load_settings
from tests.discord_fakes import BOT_ID, BOT_USER, GENERAL_ID, GUILD_ID, Call, FakeDiscord, message_payload, user_payload
from tests.fakes import FakeChatServer

JUNO = user_payload(102, "Juno")
ROLE_ID = 777


async def test_the_bot_connects_answers_a_mention_and_stops_on_sigterm(db_url: str, tmp_path: Path) -> None:
    async with FakeChatServer() as chat, FakeDiscord() as discord_api:
        settings = load_settings(
            {
                "DISCORD_TOKEN": "fake-token",
                "DATABASE_URL": db_url,
                "CHAT_BASE_URL": chat.base_url,
                "CHAT_MODEL": "fake-model",
                "LOG_LEVEL": "DEBUG",
                "DATA_DIR": str(tmp_path),
            },
            dotenv_path=None,
        )
        made: asyncio.Future[DeskmateBot] = asyncio.get_running_loop().create_future()
        running = asyncio.create_task(run_bot(settings, on_start=made.set_result, guild_ready_timeout=0.1))
        try:
            bot = await asyncio.wait_for(made, 60)
            await asyncio.wait_for(discord_api.identified.wait(), 60)
            await asyncio.wait_for(bot.wait_until_ready(), 30)
            assert [guild.id for guild in bot.guilds] == [GUILD_ID]
            assert discord_api.find(lambda c: c.method == "PUT" and c.path == f"/applications/{BOT_ID}/commands")
            identify = next(frame for frame in discord_api.received if frame["op"] == 2)
            assert identify["d"]["token"] == "fake-token" and identify["d"]["intents"] & (1 << 15)  # message content

            # a message that does not concern the bot: recorded, not answered
            quiet = message_payload(channel_id=GENERAL_ID, author=JUNO, content="my cat Mochi hates Mondays")
            await discord_api.dispatch("MESSAGE_CREATE", quiet)
            assert bot.services.core is not None
            for _ in range(200):  # recorded as it arrives
                async with bot.services.core.pool.acquire() as conn:
                    if await conn.fetchval("SELECT count(*) FROM chat_messages WHERE message_id = $1", int(quiet["id"])):
                        break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the message that did not mention the bot was never recorded")

            chat.tool_calls(("save_memory", {"text": "Juno has a cat called Mochi", "list": "personal"}))
            chat.text("Hi Juno! Mochi sounds lovely. @everyone <@&777> should hear about it.")
            asked = message_payload(
                channel_id=GENERAL_ID, author=JUNO, content=f"<@{BOT_ID}> do you remember my cat?", mentions=[BOT_USER]
            )
            start = len(discord_api.calls)
            await discord_api.dispatch("MESSAGE_CREATE", asked)

            def is_reply(call: Call) -> bool:
                return call.method == "POST" and call.path == f"/channels/{GENERAL_ID}/messages" and bool(
                    (call.body or {}).get("message_reference")
                )

            reply = await discord_api.wait_for(is_reply, 60, after=start)
            assert reply.body is not None
            assert str(reply.body["message_reference"]["message_id"]) == asked["id"]
            assert reply.body["content"].startswith("Hi Juno! Mochi sounds lovely.")
            assert "@everyone" not in reply.body["content"]  # defused, and never allowed to ping anyway
            assert reply.body["allowed_mentions"] == {"parse": [], "users": [int(JUNO["id"])], "replied_user": True}
            typing = discord_api.find(lambda c: c.path == f"/channels/{GENERAL_ID}/typing")
            assert typing and discord_api.calls.index(typing[0]) < discord_api.calls.index(reply)

            def is_notice(call: Call) -> bool:
                return call.method == "POST" and "Saved a personal memory" in ((call.body or {}).get("content") or "")

            notice = await discord_api.wait_for(is_notice, 30, after=start)
            assert notice.body is not None and notice.body["allowed_mentions"] == {"parse": []}
            assert notice.body["content"].startswith("📝 Saved a personal memory about Juno")

            # the model saw the earlier, unanswered message in its context window
            sent = "\n".join(str(m.get("content")) for m in chat.messages(0))
            assert "my cat Mochi hates Mondays" in sent and "do you remember my cat?" in sent
            assert bot.services.core is not None
            memories = await bot.services.core.all_memories()
            assert [(m.text, m.owner_id) for m in memories] == [("Juno has a cat called Mochi", int(JUNO["id"]))]
            # both of Juno's messages and the bot's own reply, once the gateway has echoed it back (which takes a
            # moment after the REST call the test saw: wait for it rather than count right away)
            echoed = next(int(m["id"]) for m in discord_api.messages.values()
                          if m["author"]["id"] == str(BOT_ID) and m["content"].startswith("Hi Juno!"))
            for _ in range(600):
                async with bot.services.core.pool.acquire() as conn:
                    stored = await conn.fetch("SELECT message_id FROM chat_messages WHERE channel_id = $1", GENERAL_ID)
                if echoed in {row["message_id"] for row in stored}:
                    break
                await asyncio.sleep(0.05)
            assert {int(quiet["id"]), int(asked["id"]), echoed} <= {row["message_id"] for row in stored}
            for _ in range(600):  # what the Docker healthcheck reads, written by on_ready in a worker thread
                if (tmp_path / "heartbeat").is_file():
                    break
                await asyncio.sleep(0.05)
            assert (tmp_path / "heartbeat").is_file()
        finally:
            if not running.done():
                assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL, "run_bot must handle SIGTERM"
                os.kill(os.getpid(), signal.SIGTERM)
            status = await asyncio.wait_for(running, 30)
    assert status == 0
    assert bot.is_closed() and bot.services.database.pool.is_closing()  # the services closed after the bot


async def test_a_rejected_token_is_one_clear_sentence(tmp_path: Path) -> None:
    async with FakeDiscord() as discord_api:
        discord_api.token_ok = False
        settings = load_settings({"DISCORD_TOKEN": "wrong", "DATA_DIR": str(tmp_path)}, dotenv_path=None)
        with pytest.raises(StartupError, match="Discord rejected DISCORD_TOKEN"):
            await run_bot(settings)
