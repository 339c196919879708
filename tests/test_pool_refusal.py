"""When PostgreSQL refuses new connections (its max_connections, or here a role's CONNECTION LIMIT, is reached),
requests wait for one of the pool's connections instead of failing: the real server, a real role limit, the real
pipeline with a scripted chat model."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from bot.chat.receipts import ReplyStatus
from bot.clock import ManualClock
from bot.config import Settings
from bot.db import create_pool
from bot.embeddings.providers import BuiltinEmbedder, DeadlineEmbedder
from bot.services import build_services, memory_core
from tests.fakes import FakeChatServer
from tests.recall_helpers import BOT, GUILD, JUNO, message

ROLE_LIMIT = 3


@pytest.fixture
async def limited_url(db_url: str) -> AsyncIterator[str]:
    """The test database reached as a role that may hold at most ROLE_LIMIT connections."""
    role = f"limited_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(db_url)
    try:
        database = await admin.fetchval("SELECT current_database()")
        await admin.execute(f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT {ROLE_LIMIT}')
        await admin.execute(f'GRANT ALL ON DATABASE "{database}" TO "{role}"; GRANT ALL ON SCHEMA public TO "{role}";'
                            f' GRANT ALL ON ALL TABLES IN SCHEMA public TO "{role}";'
                            f' GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO "{role}"')
        scheme, rest = db_url.split("://", 1)
        authority = rest.split("@", 1)[-1]
        yield f"{scheme}://{role}@{authority}"
    finally:
        await admin.execute(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'")
        await admin.execute(f'REASSIGN OWNED BY "{role}" TO CURRENT_USER; DROP OWNED BY "{role}"; DROP ROLE "{role}"')
        await admin.close()


async def test_a_plain_pool_fails_where_the_patient_one_waits(limited_url: str) -> None:
    async def busy(pool: asyncpg.Pool) -> None:
        async with pool.acquire() as conn:
            await conn.execute("SELECT pg_sleep(0.05)")

    plain = await asyncpg.create_pool(limited_url, min_size=1, max_size=10)
    try:
        outcomes = await asyncio.gather(*(busy(plain) for _ in range(20)), return_exceptions=True)
        refused = [o for o in outcomes if isinstance(o, asyncpg.TooManyConnectionsError)]
        assert refused  # what asyncpg alone does: the server says no, the request fails
    finally:
        await plain.close()

    patient = await create_pool(limited_url, max_size=10, refused_wait_s=30)
    try:
        outcomes = await asyncio.gather(*(busy(patient) for _ in range(20)), return_exceptions=True)
        assert [o for o in outcomes if o is not None] == []
        assert patient.refusals > 0  # it really was refused, and waited
    finally:
        await patient.close()


async def test_concurrent_replies_wait_for_a_pooled_connection(limited_url: str, builtin_embedder: BuiltinEmbedder) -> None:
    pool = await create_pool(limited_url, max_size=10, refused_wait_s=60)
    async with FakeChatServer() as chat:
        settings = Settings().with_overrides(chat_base_url=chat.base_url, chat_model="fake-model", chat_timeout_s=30.0)
        clock = ManualClock()
        core = memory_core(pool, DeadlineEmbedder(builtin_embedder, 30.0), settings, clock)
        pipeline = build_services(core, bot_user_id=BOT).pipeline
        await pipeline.servers.sync_default_persona()
        channels = itertools.count(7_000)
        try:
            outcomes = await asyncio.gather(
                *(pipeline.reply(message(JUNO, f"hello number {n}", clock=clock, channel=next(channels), guild=GUILD))
                  for n in range(20)),
                return_exceptions=True,
            )
        finally:
            await pipeline.model.close()
            await pool.close()
    failed = [o for o in outcomes if isinstance(o, BaseException)]
    assert failed == []
    assert all(o.status == ReplyStatus.REPLIED for o in outcomes)  # type: ignore[union-attr]
    assert pool.refusals > 0  # type: ignore[attr-defined]
