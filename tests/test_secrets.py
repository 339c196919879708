"""No secret (the Discord token, API keys, the database password) in logs, errors, receipts or exports.

The bot runs as `python -m bot` would (`run_bot`, LOG_LEVEL=DEBUG) against the fake Discord, with an
embeddings endpoint and a chat endpoint that answer 401 and quote the API key back, as real
OpenAI-compatible servers and proxies do ("Incorrect API key provided: sk-..."). Everything the run
wrote is then searched for the secret values: every log record (message and traceback), every stored
receipt, every message and file sent to Discord, and the CLI's error output.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from bot.bot import DeskmateBot, run_bot
from bot.config import load_settings
from bot.redact import MASK, Redactor, install, secrets_of
from tests.discord_fakes import BOT_ID, BOT_USER, GENERAL_ID, Call, FakeDiscord, Person, SlashHarness, message_payload
from tests.discord_fakes import user_payload as user
from tests.fakes import LocalEndpoint

ROOT = Path(__file__).resolve().parents[1]
DISCORD_TOKEN = "MTIzNDU2Nzg5.discord-SECRET-token.abcdef"
CHAT_KEY = "sk-chat-SECRET-0123456789"
EMBED_KEY = "sk-embed-SECRET-9876543210"
DB_PASSWORD = "pw-SECRET-hunter2"
SECRETS = (DISCORD_TOKEN, CHAT_KEY, EMBED_KEY, DB_PASSWORD)


class LeakyProviders(LocalEndpoint):
    """An OpenAI-compatible chat and embeddings endpoint that refuse the first calls quoting the key they got."""

    def __init__(self) -> None:
        self.refuse_chat = 1
        self.refuse_embeddings = 2

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/embeddings", self.embeddings)
        return app

    @staticmethod
    def refusal(request: web.Request) -> web.Response:
        key = request.headers.get("Authorization", "").removeprefix("Bearer ")
        body = {"error": {"message": f"Incorrect API key provided: {key}. Check {key} again.", "type": "invalid_request_error",
                          "code": "invalid_api_key"}}
        return web.json_response(body, status=401)

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.refuse_chat > 0:
            self.refuse_chat -= 1
            return self.refusal(request)
        message = {"role": "assistant", "content": "All good now."}
        return web.json_response({"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                                  "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})

    async def embeddings(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.refuse_embeddings > 0:
            self.refuse_embeddings -= 1
            return self.refusal(request)
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        data = [{"object": "embedding", "index": i, "embedding": [1.0, float(len(text) % 7), 0.5]}
                for i, text in enumerate(texts)]
        return web.json_response({"object": "list", "data": data, "model": body["model"]})


@pytest.fixture(autouse=True)
def forget_secrets() -> Iterator[None]:
    yield
    install(load_settings({}, dotenv_path=None))  # later tests log freely again


def with_password(url: str, password: str) -> str:
    scheme, _, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    user_name = credentials.split(":", 1)[0] if at else "postgres"
    return f"{scheme}://{user_name}:{password}@{host}"


def leaks(text: str) -> list[str]:
    return [secret for secret in SECRETS if secret in text]


def test_secrets_of_the_settings_are_found_and_masked() -> None:
    settings = load_settings({"DISCORD_TOKEN": DISCORD_TOKEN, "CHAT_API_KEY": CHAT_KEY, "EMBEDDING_PROVIDER": "openai",
                              "EMBEDDING_MODEL": "m", "EMBEDDING_API_KEY": EMBED_KEY,
                              "DATABASE_URL": f"postgresql://bot:{DB_PASSWORD}@db/x"}, dotenv_path=None)
    assert set(secrets_of(settings)) == set(SECRETS)
    redactor = Redactor(secrets_of(settings))
    assert redactor(f"key {CHAT_KEY}, url postgresql://bot:{DB_PASSWORD}@db/x") == f"key {MASK}, url postgresql://bot:{MASK}@db/x"
    assert Redactor(["pw"]).secrets == ()  # too short to mask without garbling every log line


async def test_no_secret_in_logs_receipts_messages_or_exports(
    db_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG")
    async with LeakyProviders() as providers, FakeDiscord() as fake:
        settings = load_settings({
            "DISCORD_TOKEN": DISCORD_TOKEN, "DATABASE_URL": with_password(db_url, DB_PASSWORD), "LOG_LEVEL": "DEBUG",
            "DATA_DIR": str(tmp_path), "CHAT_BASE_URL": providers.url, "CHAT_API_KEY": CHAT_KEY, "CHAT_MODEL": "fake-model",
            "EMBEDDING_PROVIDER": "openai", "EMBEDDING_BASE_URL": providers.url, "EMBEDDING_API_KEY": EMBED_KEY,
            "EMBEDDING_MODEL": "fake-embed",
        }, dotenv_path=None)
        made: asyncio.Future[DeskmateBot] = asyncio.get_running_loop().create_future()
        running = asyncio.create_task(run_bot(settings, on_start=made.set_result, guild_ready_timeout=0.1))
        try:
            bot = await asyncio.wait_for(made, 60)
            await asyncio.wait_for(bot.wait_until_ready(), 60)
            juno = user(102, "Juno")
            for text in ("hi, do you remember me?", "and now?"):
                start = len(fake.calls)
                await fake.dispatch("MESSAGE_CREATE", message_payload(
                    channel_id=GENERAL_ID, author=juno, content=f"<@{BOT_ID}> {text}", mentions=[BOT_USER]))

                def answered(call: Call) -> bool:
                    return call.method == "POST" and bool((call.body or {}).get("message_reference"))

                await fake.wait_for(answered, 60, after=start)
            harness = SlashHarness(bot, fake)
            person = Person(102, "Juno")
            await harness.run(harness.slash("personal memories add", person, text="Juno keeps bees"))
            command = harness.slash("privacy export-my-data", person)
            await harness.next_call(command, after=await harness.run(command))
            assert bot.services.core is not None
            rows = await bot.services.core.pool.fetch("SELECT receipt::text AS receipt FROM reply_receipts ORDER BY id")
            receipts = [row["receipt"] for row in rows]
        finally:
            if not running.done():
                os.kill(os.getpid(), signal.SIGTERM)
            assert await asyncio.wait_for(running, 30) == 0

    assert len(receipts) == 2 and "Incorrect API key provided" in receipts[0]  # the failure is recorded, masked
    assert MASK in receipts[0] and leaks("\n".join(receipts)) == []
    logged = "\n".join(caplog.text.splitlines())
    assert "Incorrect API key provided" in logged  # the errors were logged ...
    assert leaks(logged) == []  # ... without the keys, and no log line ever held the token or the password
    assert leaks("\n".join(record.getMessage() + (record.exc_text or "") for record in caplog.records)) == []
    sent = [json.dumps(call.body, ensure_ascii=False) for call in fake.calls if call.body is not None]
    files = [raw.decode("utf-8") for call in fake.calls for raw in call.files.values()]
    assert files and leaks("\n".join(sent + files)) == []


def test_the_cli_never_prints_the_database_password(tmp_path: Path) -> None:
    env = {**os.environ, "DATABASE_URL": f"postgresql://bot:{DB_PASSWORD}@127.0.0.1:9/deskmate", "PYTHONPATH": str(ROOT),
           "CHAT_API_KEY": CHAT_KEY}
    result = subprocess.run([sys.executable, "-m", "bot", "check"], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode != 0 and result.stderr.startswith("error:")
    assert leaks(result.stdout + result.stderr) == [] and "Traceback" not in result.stderr
