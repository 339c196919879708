"""Random histories replayed against the real core and a small in-memory model of the decay rules.

The model is written from the spec, independently of the SQL: if the two ever disagree on a
counter, a state, what was used, recalled or forgotten, hypothesis shrinks the history to the
shortest one that shows it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import date, timedelta

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bot.clock import ManualClock
from bot.config import Settings
from bot.db import create_pool
from bot.embeddings.providers import DeadlineEmbedder
from bot.memory.models import Conversation, MemoryList, NewMemory, Rejection, Source
from bot.services import memory_core
from tests.test_rules import FlakyEmbedder

GUILD, CHANNEL = 10, 20
USERS = [1, 2, 3]
MEMORY_TEXTS = [
    "Juno's cat is called Mochi",
    "Bau prefers green tea over coffee",
    "The server's Minecraft world runs on version 1.20",
    "Caro is learning to play the bass guitar",
    "Movie night is every Friday at nine",
    "Bau lives in Valencia, Spain",
]
MESSAGE_TEXTS = [
    "how is my cat Mochi doing?",
    "should I make green tea or coffee?",
    "which Minecraft version does the server run?",
    "I practiced bass guitar for two hours",
    "the train was late again this morning",
    "it snowed all night here",
    "what are we watching on Friday night?",
    "anyone been to Valencia?",
]
DORMANT_AFTER, MAX_USED, SERVER_LIMIT, PERSONAL_LIMIT = 1, 2, 3, 2


@dataclass
class ModelMemory:
    id: int
    list: str
    owner: int | None
    text: int
    protected: bool
    has_vector: bool
    created: int
    days: int = 0
    last_aged: int = 0
    last_used: int | None = None


@dataclass
class Model:
    """the decay rules for one server, written as plainly as possible."""

    similarity: np.ndarray
    threshold: float
    memories: dict[int, ModelMemory] = field(default_factory=dict)
    today: int = 0
    embedder_up: bool = True

    def dormant(self, memory: ModelMemory) -> bool:
        return memory.days >= DORMANT_AFTER

    def visible(self, participants: list[int]) -> list[ModelMemory]:
        return [m for m in self.memories.values() if m.list == "server" or m.owner in participants]

    def message(self, author: int, others: list[int], text: int) -> tuple[list[int], list[int], list[int]]:
        participants = [author, *others]
        visible = self.visible(participants)
        desk = sorted(
            (m for m in visible if not self.dormant(m)), key=lambda m: (m.list != "server", m.owner or 0, m.id)
        )
        if not self.embedder_up:
            return [m.id for m in desk], [], []
        searchable = [m for m in visible if m.has_vector]
        matches = [m for m in searchable if self.similarity[m.text, text] >= self.threshold]
        used = sorted(matches, key=lambda m: (-self.similarity[m.text, text], m.id))[:MAX_USED]
        recalled = [m.id for m in used if self.dormant(m)]
        for memory in searchable:
            if memory in used:
                memory.days, memory.last_used, memory.last_aged = 0, self.today, self.today
            elif memory.last_aged < self.today:
                memory.days, memory.last_aged = memory.days + 1, self.today
        return [m.id for m in desk], [m.id for m in used], recalled

    def save(self, new_id: int, kind: str, owner: int | None, text: int, via: str) -> tuple[str | None, list[int]]:
        members = [m for m in self.memories.values() if m.list == kind and m.owner == owner]
        same = [m for m in members if m.text == text]
        if same:  # a save that repeats a memory of its list stores nothing; the memory counts as used
            memory = same[0]
            memory.days, memory.last_used, memory.last_aged = 0, self.today, self.today
            return None, []
        forgotten: list[int] = []
        if len(members) >= (SERVER_LIMIT if kind == "server" else PERSONAL_LIMIT):
            if not self.embedder_up:
                return Rejection.SEARCH_UNAVAILABLE.value, []
            candidates = [m for m in members if self.dormant(m) and not m.protected]
            if not candidates:
                return Rejection.LIST_FULL.value, []
            never = sorted((m for m in candidates if m.last_used is None), key=lambda m: (m.created, m.id))
            matched = sorted((m for m in candidates if m.last_used is not None), key=lambda m: (m.last_used, m.created, m.id))
            victim = (never + matched)[0]
            del self.memories[victim.id]
            forgotten = [victim.id]
        self.memories[new_id] = ModelMemory(
            new_id, kind, owner, text, via == "command", self.embedder_up, self.today, last_aged=self.today
        )
        return None, forgotten


SIMILARITY: dict[str, np.ndarray] = {}


@pytest.fixture(scope="module")
def similarity(builtin_embedder: object) -> np.ndarray:
    if "m" not in SIMILARITY:
        memories = builtin_embedder.encode_now(MEMORY_TEXTS)  # type: ignore[attr-defined]
        messages = builtin_embedder.encode_now(MESSAGE_TEXTS)  # type: ignore[attr-defined]
        SIMILARITY["m"] = memories @ messages.T
    return SIMILARITY["m"]


save_step = st.tuples(
    st.just("save"),
    st.sampled_from(["server", "personal"]),
    st.sampled_from(USERS),
    st.integers(0, len(MEMORY_TEXTS) - 1),
    st.sampled_from(["bot", "bot", "command"]),
)
message_step = st.tuples(
    st.just("message"),
    st.sampled_from(USERS),
    st.lists(st.sampled_from(USERS), max_size=2, unique=True),
    st.integers(0, len(MESSAGE_TEXTS) - 1),
)
histories = st.lists(
    st.one_of(
        save_step,
        message_step,
        message_step,
        st.just(("day",)),
        st.just(("day",)),
        st.tuples(st.just("embeddings"), st.booleans()),
        st.just(("reembed",)),
    ),
    min_size=1,
    max_size=50,
)


async def replay(db_url: str, embedder: object, similarity: np.ndarray, history: list[tuple]) -> None:
    base = Settings()
    threshold = base.min_similarity
    close_calls = np.abs(similarity - threshold)
    assert close_calls.min() > 1e-3, "pick texts whose similarities are not within float error of the threshold"
    pool = await create_pool(db_url, max_size=2)
    try:
        await pool.execute("TRUNCATE memories, memory_vectors RESTART IDENTITY CASCADE")
        clock = ManualClock()
        start = date(2026, 6, 1)
        clock.set_date(start)
        flaky = FlakyEmbedder(DeadlineEmbedder(embedder, 60.0))  # type: ignore[arg-type]
        settings_ = base.with_overrides(
            dormant_after_days=DORMANT_AFTER, max_used=MAX_USED, server_memory_limit=SERVER_LIMIT,
            personal_memory_limit=PERSONAL_LIMIT,
        )
        core = memory_core(pool, flaky, settings_, clock)
        model = Model(similarity, threshold)
        for step in history:
            if step[0] == "day":
                model.today += 1
                clock.set_date(start + timedelta(days=model.today))
            elif step[0] == "embeddings":
                flaky.available = model.embedder_up = step[1]
            elif step[0] == "reembed":
                if model.embedder_up:
                    await core.reembed_missing()
                    for memory in model.memories.values():
                        memory.has_vector = True
            elif step[0] == "save":
                _, kind, owner, text, via = step
                result = await core.save(
                    NewMemory(
                        MemoryList(kind), MEMORY_TEXTS[text], by=owner, via=Source(via), guild_id=GUILD,
                        owner_id=owner if kind == "personal" else None, by_can_manage=True,
                    )
                )
                new_id = result.saved.id if result.saved else -1
                rejected, forgotten = model.save(new_id, kind, owner if kind == "personal" else None, text, via)
                assert (result.rejected.value if result.rejected else None) == rejected, step
                assert [m.id for m in result.forgotten] == forgotten, step
            else:
                _, author, others, text = step
                recall = await core.reply_search(
                    Conversation(GUILD, CHANNEL, author, MESSAGE_TEXTS[text], participant_ids=tuple(others))
                )
                desk, used, recalled = model.message(author, [u for u in others if u != author], text)
                assert recall.search_ok == model.embedder_up
                assert [m.id for m in recall.desk] == desk, step
                assert [s.memory.id for s in recall.used] == used, step
                assert [s.memory.id for s in recall.recalled] == recalled, step
            actual = {m.id: (m.days_unused, core.is_dormant(m), m.protected) for m in await core.all_memories()}
            expected = {m.id: (m.days, model.dormant(m), m.protected) for m in model.memories.values()}
            assert actual == expected, step
    finally:
        await pool.close()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(history=histories)
@example(  # the forgetting order: never matched (oldest first), then matched longest ago
    history=[
        ("save", "server", 1, 0, "bot"), ("save", "server", 1, 1, "bot"), ("save", "server", 1, 2, "bot"),
        ("day",), ("message", 2, [], 1), ("day",), ("message", 2, [], 4),
        ("save", "server", 1, 4, "bot"), ("save", "server", 1, 5, "bot"), ("save", "server", 1, 0, "bot"),
    ]
)
def test_random_histories_match_the_reference_model(
    db_url: str, builtin_embedder: object, similarity: np.ndarray, history: list[tuple]
) -> None:
    asyncio.run(replay(db_url, builtin_embedder, similarity, history))
