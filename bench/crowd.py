"""Section 4: memory under a budget in a crowded server, replayed through the real core and prompt builder.

The two-person replay (`bench.locomo`) measures the memory rules with budgets large enough that
nothing is cut. Decay exists for the opposite regime: a busy server, many people in the context
window, full lists, and a MEMORY_TOKEN_BUDGET the memories do not fit in. This section builds it
from the same data:

- LoCoMo's 10 conversations are merged five at a time into 2 servers of 10 people, one channel
  each. A conversation's *position* in its server (0–4) orders its speakers' user ids: position 0
  has the lowest ids (on Discord, the oldest accounts);
- every conversation's sessions are spread over one shared calendar of as many chat days as the
  longest conversation has sessions, so every conversation ends on the same last day;
- on each day the facts of that day's sessions are saved first (personal memories of their
  speakers), then the sessions' turns are interleaved round-robin in blocks of 4; every turn is a
  reply whose participants are its author and the authors of the channel's previous 30 messages;
- the day after the last day, each conversation's questions are asked by its first speaker, the
  conversations taking turns, with the channel's last 30 messages as the window.

Prompts are built as the pipeline builds them, with the bot's default budgets
(MEMORY_TOKEN_BUDGET, CHAT_CONTEXT_TOKENS). Each variant runs with list limits large enough to hold
every fact and again with the default limits of 100.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

from bench.locomo import (
    CONTEXT_MESSAGES,
    SPEC_RULES,
    UNLIMITED,
    VARIANTS,
    FactMemories,
    PromptMeter,
    Question,
    Sample,
    Tally,
    Variant,
    cached_token_counts,
    data_missing,
    load_samples,
    prefill,
    reply_prompt,
    variant_core,
)
from bench.pg import BenchServer
from bot.clock import ManualClock
from bot.config import Settings
from bot.memory.models import Conversation
from bot.memory.service import MemoryCore
from bot.prompt import ChatLine, Persona

CONVERSATIONS_PER_SERVER = 5
BLOCK = 4  # turns a conversation says before the next one takes its turn
FIRST_DAY = date(2026, 1, 5)
LIMITS = {"unlimited": UNLIMITED, "limit100": 100}

_BY_NAME = {variant.name: variant for variant in VARIANTS}
CROWD_VARIANTS: tuple[Variant, ...] = (
    Variant("decay", "the defaults"),
    Variant("decay_spec", "SPEC §2 as written: LEXICAL_WEIGHT=0, MAX_RECALLED=0, MAX_USED=3", SPEC_RULES),
    _BY_NAME["all_active"],
    _BY_NAME["topk10_hybrid"],
    _BY_NAME["decay_daily"],
    Variant("decay_prefix", "the older desk cut: DESK_FIT=prefix, TAIL_RESERVE=0 (the desk in prompt order, then the tail)",
            {"desk_fit": "prefix", "tail_reserve": 0.0}),
    Variant("decay_used3", "MAX_USED=3 (SPEC's value)", {"max_used": 3}),
    Variant("decay_r25", "TAIL_RESERVE=0.25", {"tail_reserve": 0.25}),
    Variant("decay_nomerge", "merging off (MERGE_MAX_CHARS=0): a full list forgets at once", {"merge_max_chars": 0}),
)
# tried during development (`--crowd-variants`), each at the values it names; docs/benchmarks.md has their figures
EXTRA_VARIANTS: tuple[Variant, ...] = (
    Variant("decay_used6", "MAX_USED=6", {"max_used": 6}),
    Variant("decay_used10", "MAX_USED=10", {"max_used": 10}),
    Variant("decay_used10_r40", "MAX_USED=10, TAIL_RESERVE=0.4", {"max_used": 10, "tail_reserve": 0.4}),
    Variant("decay_used10_r15", "MAX_USED=10, TAIL_RESERVE=0.15", {"max_used": 10, "tail_reserve": 0.15}),
    Variant("decay_used10_r50", "MAX_USED=10, TAIL_RESERVE=0.5", {"max_used": 10, "tail_reserve": 0.5}),
    Variant("decay_used12_r50", "MAX_USED=12, TAIL_RESERVE=0.5", {"max_used": 12, "tail_reserve": 0.5}),
    Variant("decay_used15_r50", "MAX_USED=15, TAIL_RESERVE=0.5", {"max_used": 15, "tail_reserve": 0.5}),
    Variant("decay_used6_r40", "MAX_USED=6, TAIL_RESERVE=0.4", {"max_used": 6, "tail_reserve": 0.4}),
    Variant("decay_used10_r40_rec5", "MAX_USED=10, TAIL_RESERVE=0.4, MAX_RECALLED=5",
            {"max_used": 10, "tail_reserve": 0.4, "max_recalled": 5}),
    Variant("decay_used10_r40_rec20", "MAX_USED=10, TAIL_RESERVE=0.4, MAX_RECALLED=20",
            {"max_used": 10, "tail_reserve": 0.4, "max_recalled": 20}),
    Variant("decay_used10_r40_prefix", "MAX_USED=10, TAIL_RESERVE=0.4, DESK_FIT=prefix",
            {"max_used": 10, "tail_reserve": 0.4, "desk_fit": "prefix"}),
)


@dataclass
class CrowdTally(Tally):
    """The two-person figures plus what the budget did and whom it served."""

    desk_built: int = 0
    desk_shown: int = 0
    used: int = 0
    used_dropped: int = 0
    recalled_matches: int = 0
    recalled_dropped: int = 0
    gold_forgotten: float = 0.0
    by_position: dict[int, list[float]] = field(default_factory=dict)
    forgotten_by_position: dict[int, list[float]] = field(default_factory=dict)
    gold_rejected: float = 0.0
    held_by_position: dict[int, list[float]] = field(default_factory=dict)  # gold in prompt among the gold still held

    def result(self) -> dict[str, Any]:
        replies, questions = max(self.replies, 1), max(self.questions, 1)
        figures: dict[str, Any] = dict(super().result())
        positions = _means(self.by_position)
        lowest, highest = min(positions.values(), default=0.0), max(positions.values(), default=0.0)
        held = _means(self.held_by_position)
        figures |= {
            "desk_built_per_reply": round(self.desk_built / replies, 1),
            "desk_shown_per_reply": round(self.desk_shown / replies, 1),
            "used_per_reply": round(self.used / replies, 3),
            "used_dropped_per_reply": round(self.used_dropped / replies, 3),
            "recalled_per_reply": round(self.recalled_matches / replies, 3),
            "recalled_dropped_per_reply": round(self.recalled_dropped / replies, 3),
            "gold_by_position": positions,
            "fairness": round(lowest / highest, 4) if highest else 0.0,
            "gold_forgotten": round(self.gold_forgotten / questions, 4),
            "gold_forgotten_by_position": _means(self.forgotten_by_position),
            "gold_rejected": round(self.gold_rejected / questions, 4),
            "held_gold_by_position": held,
            "fairness_held": round(min(held.values()) / max(held.values()), 4) if held and max(held.values()) else 0.0,
        }
        return figures


def _means(values: dict[int, list[float]]) -> dict[str, float]:
    return {str(key): round(sum(v) / max(len(v), 1), 4) for key, v in sorted(values.items())}


def calendar(samples: Sequence[Sample]) -> list[list[date]]:
    """Each conversation's session days on one shared calendar: spread evenly, every one ending on its last day."""
    days = max(len(sample.sessions) for sample in samples)
    spread = []
    for sample in samples:
        count = len(sample.sessions)
        spread.append([FIRST_DAY + timedelta(days=(i + 1) * days // count - 1) for i in range(count)])
    return spread


@dataclass
class _Voice:
    """One conversation of a crowded server: its position, its speakers' ids and where its facts went."""

    position: int
    sample: Sample
    users: tuple[int, int]
    days: dict[date, int]  # chat day -> session index
    facts: FactMemories


class CrowdedServer:
    """One server of five conversations in one channel, replayed day by day."""

    def __init__(
        self, core: MemoryCore, clock: ManualClock, variant: Variant, samples: Sequence[Sample],
        days: Sequence[list[date]], index: int, tally: CrowdTally,
    ) -> None:
        self.core, self.clock, self.variant, self.tally = core, clock, variant, tally
        self.guild_id = 8_000_000 + index
        self.channel_id = self.guild_id * 10 + 1
        self.voices: list[_Voice] = []
        self.names: dict[int, str] = {}
        for position, (sample, session_days) in enumerate(zip(samples, days, strict=True)):
            users = (self.guild_id * 100 + 2 * position + 1, self.guild_id * 100 + 2 * position + 2)
            self.names |= dict(zip(users, sample.speakers, strict=True))
            self.voices.append(
                _Voice(position, sample, users, {day: i for i, day in enumerate(session_days)}, FactMemories(core, tally))
            )
        self.history: list[ChatLine] = []
        self.meter = PromptMeter(tally)
        self.persona = Persona(core.settings.default_persona_name, core.settings.default_persona_prompt)
        self.next_message = 1

    async def day(self, today: date) -> None:
        """Save the facts of today's sessions, then their turns in round-robin blocks."""
        talking = [(voice, voice.sample.sessions[voice.days[today]]) for voice in self.voices if today in voice.days]
        for voice, session in talking:
            for fact in session.facts:
                await voice.facts.save(fact.index, fact.text, voice.users[fact.speaker], self.guild_id)
        queues = [(voice, list(session.turns)) for voice, session in talking]
        while any(turns for _, turns in queues):
            for voice, turns in queues:
                for turn in turns[:BLOCK]:
                    await self.reply(voice, voice.users[turn.speaker], turn.text, None)
                del turns[:BLOCK]

    async def questions(self) -> None:
        """Every conversation's questions, asked by its first speaker, the conversations taking turns."""
        queues = [(voice, list(voice.sample.questions)) for voice in self.voices]
        while any(questions for _, questions in queues):
            for voice, questions in queues:
                if questions:
                    await self.reply(voice, voice.users[0], questions[0].text, questions.pop(0))
        self.tally.skipped_questions += sum(voice.sample.skipped_questions for voice in self.voices)

    async def reply(self, voice: _Voice, author: int, text: str, question: Question | None) -> None:
        tally, today = self.tally, self.clock.now().date()
        window = self.history[-CONTEXT_MESSAGES:]
        others = tuple(dict.fromkeys(line.author_id for line in reversed(window) if line.author_id != author))
        recall = await self.core.reply_search(
            Conversation(self.guild_id, self.channel_id, author, text, others, tuple(line.text for line in window))
        )
        answered = ChatLine(self.next_message, author, self.names[author], text)
        self.next_message += 1
        prompt = reply_prompt(recall, self.variant, self.core, self.persona, self.names, window, answered, self.clock.now())
        shown = prompt.shown_memory_ids
        tally.desk_built += 0 if self.variant.retrieval else len(recall.desk)
        tally.desk_shown += len(prompt.desk_ids)
        tally.used += len(recall.used)
        tally.used_dropped += sum(1 for s in recall.used if s.memory.id not in shown)
        tally.recalled_matches += len(recall.recalled)
        tally.recalled_dropped += sum(1 for s in recall.recalled if s.memory.id not in shown)
        gold = self.meter.measure(prompt, today, question, voice.facts.memory_of_fact)
        if question is None:
            self.history.append(answered)
            return
        tally.by_position.setdefault(voice.position, []).append(gold)
        facts = voice.facts
        forgotten = sum(1 for f in question.gold if f in facts.forgotten_facts) / len(question.gold)
        tally.gold_forgotten += forgotten
        tally.forgotten_by_position.setdefault(voice.position, []).append(forgotten)
        tally.gold_rejected += sum(1 for f in question.gold if f in facts.rejected_facts) / len(question.gold)
        held = [f for f in question.gold if f in facts.memory_of_fact]
        if held:  # the budget's fairness alone: of the gold the lists still hold, the share in the prompt
            present = sum(1 for f in held if facts.memory_of_fact[f] in shown)
            tally.held_by_position.setdefault(voice.position, []).append(present / len(held))


async def run_variant(
    server: BenchServer, samples: Sequence[Sample], variant: Variant, limit: str, say: Callable[[str], None]
) -> dict[str, Any]:
    started = time.perf_counter()
    tally = CrowdTally()
    size = LIMITS[limit]
    settings = Settings().with_overrides(**{"personal_memory_limit": size, "server_memory_limit": size, **variant.overrides})
    servers = [samples[i : i + CONVERSATIONS_PER_SERVER] for i in range(0, len(samples), CONVERSATIONS_PER_SERVER)]
    days = calendar(samples)
    async with variant_core(server, f"crowd_{variant.name}_{limit}", settings) as (core, clock):
        replays = [
            CrowdedServer(core, clock, variant, group, days[i * CONVERSATIONS_PER_SERVER : (i + 1) * CONVERSATIONS_PER_SERVER],
                          i, tally)
            for i, group in enumerate(servers)
        ]
        chat_days = sorted({day for spread in days for day in spread})
        for number, today in enumerate(chat_days, 1):
            clock.set_date(today)
            tally.chat_days += len(replays)
            for replay in replays:
                await replay.day(today)
            if number % 10 == 0:
                say(f"  {variant.name} ({limit}): day {number}/{len(chat_days)}, {tally.replies:,} replies,"
                    f" {time.perf_counter() - started:.0f} s")
        clock.set_date(chat_days[-1] + timedelta(days=1))
        for replay in replays:
            await replay.questions()
    result = tally.result()
    result["seconds"] = round(time.perf_counter() - started, 1)
    result["description"] = variant.description
    result["settings"] = {key: getattr(settings, key) for key in (
        "max_used", "max_recalled", "lexical_weight", "desk_refresh", "memory_token_budget", "tail_reserve", "desk_fit",
        "personal_memory_limit",
    )}
    return result


async def run(
    server: BenchServer, say: Callable[[str], None], *, quick: bool = False, variants: Sequence[Variant] | None = None,
    limits: Sequence[str] = tuple(LIMITS),
) -> dict[str, Any]:
    """Every variant at both list limits; `quick`: one server (five conversations). {} when the data is missing."""
    if data_missing(say, "The crowded-server section"):
        return {}
    samples = load_samples()[: CONVERSATIONS_PER_SERVER if quick else None]
    prefill(samples, say, "Crowded server")
    results: dict[str, Any] = {}
    with cached_token_counts():
        for variant in variants or CROWD_VARIANTS:
            for limit in limits:
                name = variant.name + ("" if limit == "unlimited" else "_l100")
                results[name] = await run_variant(server, samples, variant, limit, say)
                r = results[name]
                say(f"  {name}: gold {r['gold_in_prompt']:.3f}, billed {r['billed_tokens_per_reply']:,.0f},"
                    f" same-day stable {r['prefix_stable_same_day']:.3f}, fairness {r['fairness']:.2f},"
                    f" dropped used/recalled {r['used_dropped_per_reply']:.2f}/{r['recalled_dropped_per_reply']:.2f}")
    return results
