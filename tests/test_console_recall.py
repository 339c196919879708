"""Issue 4 in the console: documents, chat history, the receipt after each turn, the memory viewer and rebuild."""

from __future__ import annotations

import io
from pathlib import Path

from PIL import Image

from bot.config import Settings
from bot.console import run_console
from bot.embeddings.providers import BuiltinEmbedder
from tests.fakes import FakeChatServer


async def test_console_documents_history_receipts_stats_and_rebuild(
    db_url: str, tmp_path: Path, builtin_embedder: BuiltinEmbedder
) -> None:
    handbook = tmp_path / "handbook.md"
    handbook.write_text("# Game nights\nWe play every Friday at 8pm UTC in the voice channel.\n", encoding="utf-8")
    hike = [
        "we went hiking at Mount Rainier last weekend", "nice! how long was the trail?",
        "about 12 miles, the views from the ridge were amazing", "did you see any marmots on the trail?",
        "tons of marmots, and a black bear far away", "a bear! were you scared on the hike?",
    ]
    async with FakeChatServer(default_text="Sure!") as chat:
        settings = Settings(
            database_url=db_url, data_dir=tmp_path / "data", chat_base_url=chat.base_url, chat_model="fake-model",
            context_messages=6,
        )
        script = [
            f"/documents add {handbook}",
            "/documents",
            "/remember The game night channel is called The Tavern",
            *[f"/say {line}" for line in hike + hike],
            *["/say lol", "/say brb", "/say back", "/say ok", "/say hm", "/say yes"],
            "/rebuild",
            "/history",
            "/receipts on",
            "what time is game night?",
            "how long was the hike with the marmots?",
            "/why",
            "/history off",
            "how long was the hike with the marmots?",
            "/stats",
            "/documents delete 1",
            "/documents",
        ]
        out = io.StringIO()
        assert await run_console(settings, stdin=io.StringIO("\n".join(script) + "\n"), out=out, builtin=builtin_embedder) == 0
    text = out.getvalue()
    assert "added document #1 handbook.md: 1 passages, 1 embedded" in text
    assert "#1 handbook.md: 68 bytes, 1 passages, 1 embedded" in text
    assert "rebuild done: memories 0/0 · chat chunks 1/1 · document passages 0/0; 1 new chunks" in text
    assert "history recall on here; 1 chunks (1 embedded), 6 messages in no chunk yet" in text

    game, hiking, off = text.split("Deskmate: Sure!")[1:4]
    assert "documents: “handbook.md” › Game nights" in game and "receipt: desk: #1" in game
    assert "chat history: chunk #1 (" in hiking and "12 messages" in hiking
    assert hiking.count("chat history: chunk #1 (") == 2  # the receipt after the turn, then /why
    assert "chat history: nothing (history recall is off in this channel" in off
    assert "nothing was recalled for this reply: nothing relevant" in off
    assert "Game nights" in chat.messages(0)[-1]["content"] and "Mount Rainier" in chat.messages(1)[-1]["content"]

    assert "this server's memories: 1 of 100; desk 1, drawer 0" in text and "0 days unused | # 1 (desk)" in text
    chart = tmp_path / "data" / "days-unused.png"
    assert f"chart: {chart}" in text and Image.open(chart).size == (640, 300)
    assert "deleted document #1 handbook.md" in text and "documents: none" in text
