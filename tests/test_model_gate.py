"""Replies go first on a model server shared with background work (day summaries and notes): a summary never starts
while a reply is in flight, and one in progress is stopped when a reply comes and made again after it.

Real pipeline, database and `openai` client; the model is a scripted local server answering one request at a time
in the order the test says, as a one-slot llama.cpp server would.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from bot.chat.model import replies_first
from bot.config import Settings
from bot.services import Services, build_services
from tests.conftest import MakeCore
from tests.fakes import FakeChatServer, is_summary_request
from tests.recall_helpers import BOT, JUNO, message

SUMMARY = json.dumps({"summary": "Juno and Rin planned game night.", "key_details": []})


@pytest.fixture
async def shared() -> AsyncIterator[FakeChatServer]:
    """One server for replies and summaries, every request answered from the script (none aside)."""
    async with FakeChatServer(summaries_aside=False) as server:
        yield server


@pytest.fixture
async def services(make_core: MakeCore, shared: FakeChatServer) -> AsyncIterator[Services]:
    core = await make_core(chat_base_url=shared.base_url, chat_model="fake-model", chat_timeout_s=10.0, summary_timeout_s=10.0)
    built = build_services(core, bot_user_id=BOT)
    await built.pipeline.servers.sync_default_persona()
    yield built
    await built.pipeline.model.close()
    await built.summaries.close()


async def wait_for(condition: object, seconds: float = 10.0) -> None:
    """Until `condition()` holds (at most `seconds`): the fake server counts requests in flight, it has no event."""
    async with asyncio.timeout(seconds):
        while not condition():  # type: ignore[operator]  # noqa: ASYNC110
            await asyncio.sleep(0.01)


async def test_a_summary_in_progress_is_stopped_for_a_reply_and_made_again_after(
    services: Services, shared: FakeChatServer, clock: object
) -> None:
    assert services.model.gate.enabled  # the summaries use the chat model's own server, on this machine
    shared.stall(30, SUMMARY)  # the summary holds the server...
    shared.text("Friday at 8.")  # ...until the reply comes: stopped, the reply is answered...
    shared.text(SUMMARY)  # ...and the summary is asked for again
    summary = asyncio.create_task(services.summaries.writer.day("Chat of Tue 2026-11-03", ["Juno: game night?"]))
    await wait_for(lambda: shared.in_flight == 1)

    async with asyncio.timeout(8):  # far less than the summary's 30 s: the reply did not wait for it
        outcome = await services.pipeline.reply(message(JUNO, "when is game night?", clock=clock))  # type: ignore[arg-type]
    assert outcome.chunks == ["Friday at 8."]
    written = await summary
    assert written.summary == "Juno and Rin planned game night."
    assert [is_summary_request(body) for body in shared.requests] == [True, False, True]
    assert services.model.gate.stopped == 1


async def test_a_summary_waits_while_a_reply_is_in_flight(services: Services, shared: FakeChatServer, clock: object) -> None:
    shared.hold()
    reply = asyncio.create_task(services.pipeline.reply(message(JUNO, "hello?", clock=clock)))  # type: ignore[arg-type]
    await shared.wait_held(1)
    summary = asyncio.create_task(services.summaries.writer.day("Chat of Tue 2026-11-03", ["Juno: hello?"]))
    for _ in range(20):  # the summary has every chance to go out; it must not while the reply is unanswered
        await asyncio.sleep(0.01)
    assert len(shared.requests) == 1 and services.model.gate.replies_waiting == 1
    shared.text("hi!").text(SUMMARY)
    shared.release()
    assert (await reply).chunks == ["hi!"]
    assert (await summary).summary == "Juno and Rin planned game night."
    assert [is_summary_request(body) for body in shared.requests] == [False, True]
    assert services.model.gate.stopped == 0


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"chat_base_url": "http://127.0.0.1:8080/v1"}, True),
        ({"chat_base_url": "http://llama:8080/v1"}, True),  # a compose service
        ({"chat_base_url": "http://192.168.1.20:11434/v1"}, True),
        ({"chat_base_url": "https://api.openai.com/v1"}, False),  # many slots: nothing to wait for
        ({"chat_base_url": "http://127.0.0.1:8080/v1", "summary_base_url": "http://127.0.0.1:8081/v1"}, False),
        ({"chat_base_url": "https://api.openai.com/v1", "replies_first": "on"}, True),
        ({"chat_base_url": "http://127.0.0.1:8080/v1", "replies_first": "off"}, False),
    ],
)
def test_replies_first_is_on_where_a_shared_local_server_needs_it(values: dict[str, str], expected: bool) -> None:
    assert replies_first(Settings(chat_model="m").with_overrides(**values)) is expected


async def _services(make_core: MakeCore, server: FakeChatServer, **values: object) -> Services:
    core = await make_core(chat_base_url=server.base_url, chat_model="fake-model", chat_timeout_s=10.0,
                           summary_timeout_s=10.0, **values)
    built = build_services(core, bot_user_id=BOT)
    await built.pipeline.servers.sync_default_persona()
    return built


async def test_after_a_summary_the_chats_prompt_is_cached_again_with_a_one_token_request(
    services: Services, shared: FakeChatServer, clock: object
) -> None:
    """A one-slot server keeps one prompt: the day's summary evicts the chat's, so the next reply would read it whole.
    Once the background work is done, the last reply's request goes out again for one token."""
    shared.text("Friday at 8.")
    await services.pipeline.reply(message(JUNO, "when is game night?", clock=clock))  # type: ignore[arg-type]
    [reply_request] = shared.requests
    shared.text(SUMMARY).text(".")
    await services.summaries.writer.day("Chat of Tue 2026-11-03", ["Juno: when is game night?"])
    await wait_for(lambda: services.model.gate.warmed == 1)
    assert [is_summary_request(body) for body in shared.requests] == [False, True, False]
    warm = shared.requests[-1]
    assert warm["messages"] == reply_request["messages"] and warm["tools"] == reply_request["tools"]
    assert warm["max_tokens"] == 1


async def test_a_reply_that_comes_during_the_rewarm_stops_it_and_it_is_not_made_again(
    services: Services, shared: FakeChatServer, clock: object
) -> None:
    shared.text("Friday at 8.")
    await services.pipeline.reply(message(JUNO, "when is game night?", clock=clock))  # type: ignore[arg-type]
    shared.text(SUMMARY).stall(30, ".")  # the re-warm holds the server...
    await services.summaries.writer.day("Chat of Tue 2026-11-03", ["Juno: when is game night?"])
    await wait_for(lambda: shared.in_flight == 1)
    shared.text("Still Friday at 8.")
    async with asyncio.timeout(8):  # ...until a reply comes: it does not wait for the re-warm
        outcome = await services.pipeline.reply(message(JUNO, "and again?", clock=clock))  # type: ignore[arg-type]
    assert outcome.chunks == ["Still Friday at 8."]
    for _ in range(20):
        await asyncio.sleep(0.01)
    assert len(shared.requests) == 4 and services.model.gate.warmed == 0
    assert services.model.gate.stopped == 0  # no background work was stopped: nothing to make again


@pytest.mark.parametrize(
    "values",
    [{"chat_rewarm": False}, {"replies_first": "off"}],
    ids=["CHAT_REWARM=false", "no-shared-one-slot-server"],
)
async def test_no_rewarm_when_it_is_off_or_the_server_is_not_shared(
    make_core: MakeCore, shared: FakeChatServer, clock: object, values: dict[str, object]
) -> None:
    built = await _services(make_core, shared, **values)
    try:
        shared.text("Friday at 8.")
        await built.pipeline.reply(message(JUNO, "when is game night?", clock=clock))  # type: ignore[arg-type]
        shared.text(SUMMARY)
        await built.summaries.writer.day("Chat of Tue 2026-11-03", ["Juno: when is game night?"])
        for _ in range(20):  # the re-warm has every chance to go out; it must not
            await asyncio.sleep(0.01)
        assert [is_summary_request(body) for body in shared.requests] == [False, True]
        assert built.model.gate.warmed == 0
    finally:
        await built.pipeline.model.close()
        await built.summaries.close()
