"""The console chat: the memory core in a terminal, for trying Deskmate without Discord.

You talk as a user in a local server. Lines starting with `/` are commands; anything else is a
message the bot answers (with no chat model yet it shows what it would have used). It reads
standard input, so it can be scripted: `printf 'hello\\n' | python -m bot console`.
"""

from __future__ import annotations

import sys
from datetime import timedelta

from bot.config import Settings
from bot.db import Database
from bot.memory.embeddings import BuiltinEmbedder, create_embedder
from bot.memory.models import Conversation, MemoryList, Source
from bot.memory.recall import ManualClock, MemoryCore, NewMemory

HELP = """Commands:
  /remember TEXT   save a server memory (as a command: protected)
  /me TEXT         save a personal memory about you
  /as NAME         talk as another user
  /day             advance the simulated UTC day by one
  /memories        list every memory with its state
  /help            this text;  /quit  leave"""
GUILD_ID, CHANNEL_ID = 1, 1


async def run_console(settings: Settings) -> int:
    print("Deskmate console. No DISCORD_TOKEN is set, so you are chatting locally.")
    print("To connect to Discord, put DISCORD_TOKEN=... in .env (see README). Type /help for commands.")
    database = await Database.open(settings)
    builtin = None
    if settings.embedding_provider == "builtin":
        builtin = BuiltinEmbedder()
        builtin.warm_up()
    clock = ManualClock()
    core = MemoryCore(database.pool, create_embedder(settings, builtin), settings, clock)
    users: dict[str, int] = {"you": 100}
    speaker = "you"
    try:
        for raw in sys.stdin:
            line = raw.strip()
            if not line:
                continue
            command, _, rest = line.partition(" ")
            if command == "/quit":
                break
            if command == "/help":
                print(HELP)
            elif command == "/as" and rest:
                speaker = rest.strip()
                users.setdefault(speaker, 100 + len(users))
                print(f"(you are now {speaker})")
            elif command == "/day":
                clock.current += timedelta(days=1)
                print(f"(it is now {clock.current.date().isoformat()} UTC)")
            elif command in ("/remember", "/me"):
                result = await core.save(
                    NewMemory(
                        list=MemoryList.SERVER if command == "/remember" else MemoryList.PERSONAL,
                        text=rest,
                        by=users[speaker],
                        via=Source.COMMAND,
                        guild_id=GUILD_ID,
                        owner_id=users[speaker] if command == "/me" else None,
                        by_can_manage=True,
                    )
                )
                if result.saved:
                    print(f"saved #{result.saved.id}: {result.saved.text}")
                    for forgotten in result.forgotten:
                        print(f"forgotten to make room: #{forgotten.id} {forgotten.text}")
                else:
                    print(f"not saved: {result.detail}")
            elif command == "/memories":
                for memory in await core.all_memories():
                    state = "drawer" if core.is_dormant(memory) else "desk"
                    print(f"#{memory.id} [{memory.list}, {state}, {memory.days_unused} days unused] {memory.text}")
            elif command.startswith("/"):
                print(f"unknown command {command}; /help lists them")
            else:
                recall = await core.reply_search(
                    Conversation(guild_id=GUILD_ID, channel_id=CHANNEL_ID, author_id=users[speaker], text=line)
                )
                print("deskmate: (no chat model is configured; this is what the reply would use)")
                print(f"  desk: {[m.text for m in recall.desk]}")
                if not recall.search_ok:
                    print(f"  search failed: {recall.failure}")
                for scored in recall.recalled:
                    print(f"  recalled ({scored.similarity:.2f}): {scored.memory.text}")
    finally:
        await database.close()
    return 0
