"""Section 5: end to end with a real chat model — from what people say, to what the bot saves, to what it answers.

Sections 3 and 4 start from LoCoMo's hand-written facts, saved perfectly. This section measures the two
steps before and after them, through the bot's own chat service (`ChatService.handle`: the real prompt,
tools, summaries and day-end work) against any OpenAI-compatible model:

1. **Saving.** Each LoCoMo conversation is a server with one channel; its two speakers are two members.
   Each session is one chat day. Every turn is a message in the channel; a seeded quarter of them
   address the bot (`@Deskmate …`, as members do), the rest it only reads. The bot's answers and its
   visible memory notices are posted back into the channel. At each chat-day rollover the bench does
   what the running bot does: the background upkeep pass, then the day's catch-up (`saw`, then waits
   for it), so the day summaries — and any other day-end work — are written before the next day starts.
   At the end, the stored memories are scored against the replayed sessions' gold facts
   (`bench.e2e_score`).
2. **Answering.** The day after the last replayed session, the first speaker asks the bot each question
   whose evidence lies in the replayed sessions (categories 1–4), one at a time, through the same
   service; each question is deleted from the channel after its answer (so every question sees the
   same channel), and self-teaching is switched off for the questions (so no question teaches the
   bot what the next one asks). Answers get LoCoMo's token F1 and a judge's yes/no.
3. **Baselines**, on the same questions and model: `none` (no memories: context window, summaries and
   chat-history recall), `gold` (LoCoMo's facts saved on their session's day instead of the model's
   saves: the upper bound of saving), `top10` (plain retrieval: no desk, the 10 memories closest to
   the question by cosine, over the same saved memories), and `defaults` (the bot as shipped).

Every model call goes through `bench.e2e_proxy` (temperature 0, a fixed seed, every prompt and answer
recorded under the run's folder), which also makes the section resumable: a re-run answers the calls
it already made from the recording and carries on. Finished baselines are kept in `state.json`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import random
import re
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import asyncpg

from bench import e2e_score as score
from bench.e2e_proxy import ModelProxy
from bench.locomo import DIA, LOCOMO_PATH, QUESTION_CATEGORIES, Sample, load_samples, shared_embedder
from bench.pg import BenchServer
from bot.chat.messages import IncomingMessage, UserRef
from bot.chat.receipts import ReplyStatus
from bot.chat.reply import ReplyOutcome
from bot.clock import ManualClock
from bot.config import Settings
from bot.db import Database, create_pool
from bot.memory.models import Conversation, MemoryList, NewMemory, Recall, Source
from bot.servers.models import Actor
from bot.servers.service import Servers
from bot.services import Services, build_services, memory_core
from bot.summaries.writer import COMBINE_INSTRUCTIONS, DAY_INSTRUCTIONS, WEEK_INSTRUCTIONS

BOT_USER_ID = 990_000_000_000_000_001
BOT_NAME = "Deskmate"
BENCH_ADMIN = Actor(990_000_000_000_000_002, can_manage=True)  # the benchmark runs its servers' settings
ADDRESSED_SHARE = 0.25  # of the turns, the ones that address the bot
SEED = 20_260_101
ASK_SUFFIX = " Answer in a few words."
JUDGE_FACT_SAMPLE = 12
STATE_VERSION = 1


@dataclass(frozen=True)
class Size:
    name: str
    conversations: int | None  # None: all
    sessions: int | None  # the first N sessions of each conversation; None: all
    questions: int | None = None  # at most N questions per conversation (the first by order in the data)


SIZES = {
    "quick": Size("quick", 1, 1, 4),
    "tiny": Size("tiny", 1, 2),
    "small": Size("small", 2, 2),
    "full": Size("full", None, None),
}


@dataclass(frozen=True)
class Baseline:
    name: str
    description: str
    replay: str = "model"  # "model": the chat model saves what it decides; "gold": LoCoMo's facts are saved instead
    recall: str = "defaults"  # "defaults" | "none" | "top10"
    settings: dict[str, Any] = field(default_factory=dict)  # settings of the whole run of this baseline


BASELINES: tuple[Baseline, ...] = (  # in the order they run: the most telling first, should a slow run be cut short
    Baseline("defaults", "the bot as shipped: the model saves through its tools (and day-end work), the default recall"),
    Baseline("gold", "LoCoMo's gold facts saved as personal memories on their session's day instead of the model's"
             " saves (the upper bound of saving), the default recall", replay="gold"),
    Baseline("none", "no long-term memory: the context window, the day summaries and chat-history recall only",
             recall="none"),
    Baseline("top10", "plain retrieval over the same saved memories: no desk, the 10 closest memories by cosine"
             " near the end of the prompt", recall="top10"),
)
if "memory_notes" in {f.name for f in dataclasses.fields(Settings)}:  # day-end notes: measured against the tools alone
    BASELINES += (
        Baseline("tools_only", "MEMORY_NOTES=tools: the model saves through its tools only, no day-end notes; the default"
                 " recall", settings={"memory_notes": "tools"}),
    )


def choose_baselines(names: str | None) -> tuple[Baseline, ...]:
    """The baselines named (comma-separated), in the order they run; all of them for None or ''."""
    if not names:
        return BASELINES
    wanted = [name.strip() for name in names.split(",") if name.strip()]
    known = [b.name for b in BASELINES]
    unknown = [name for name in wanted if name not in known]
    if unknown or not wanted:
        raise ValueError(f"--e2e-baselines takes {', '.join(known)}; got {names!r}")
    return tuple(b for b in BASELINES if b.name in wanted)


# --- the data ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Question:
    key: str
    text: str
    answer: str
    category: int
    gold: tuple[int, ...]  # fact indices


@dataclass
class Plan:
    """What is replayed and asked: the first sessions of the first conversations, and their questions."""

    samples: list[Sample]
    questions: dict[str, list[Question]]
    skipped: int  # questions of the replayed sessions without a gold fact (as section 3 skips them)

    @property
    def question_count(self) -> int:
        return sum(len(q) for q in self.questions.values())

    @property
    def fact_count(self) -> int:
        return sum(len(s.facts) for s in self.samples)

    @property
    def chat_days(self) -> int:
        return sum(len(s.sessions) for s in self.samples)


def plan(size: Size, path: Path = LOCOMO_PATH) -> Plan:
    raw = {entry["sample_id"]: entry for entry in json.loads(path.read_text(encoding="utf-8"))}
    samples = load_samples(path)[: size.conversations]
    kept: list[Sample] = []
    questions: dict[str, list[Question]] = {}
    skipped = 0
    for sample in samples:
        sessions = sample.sessions[: size.sessions]
        replayed = {s.number for s in sessions}
        fact_by_dia = {dia: fact.index for s in sessions for fact in s.facts for dia in fact.dia_ids}
        chosen: list[Question] = []
        for number, qa in enumerate(raw[sample.sample_id]["qa"]):
            if qa.get("category") not in QUESTION_CATEGORIES or "answer" not in qa:
                continue
            dias = {f"D{a}:{b}" for a, b in DIA.findall(" ".join(map(str, qa.get("evidence") or [])))}
            if not dias or any(int(d[1:].split(":")[0]) not in replayed for d in dias):
                continue
            gold = tuple(sorted({fact_by_dia[d] for d in dias if d in fact_by_dia}))
            if not gold:
                skipped += 1
                continue
            chosen.append(Question(f"{sample.sample_id}:{number}", qa["question"], str(qa["answer"]), qa["category"], gold))
        kept.append(dataclasses.replace(sample, sessions=sessions, questions=[]))
        questions[sample.sample_id] = chosen[: size.questions]
    return Plan(kept, questions, skipped)


# --- recall as the baselines want it -----------------------------------------------------------------


def no_memories(recall: Recall) -> Recall:
    """The search ran as usual (chat history and documents share it), but no memory reaches the prompt."""
    return dataclasses.replace(recall, desk=[], used=[], recalled=[], held_back=[], by_text=[], desk_ranks={})


def top_ten(recall: Recall) -> Recall:
    """Classic retrieval: no desk; the best matches (MAX_USED=10, any similarity, cosine) near the end."""
    return dataclasses.replace(recall, desk=[], recalled=list(recall.used), held_back=[], desk_ranks={})


TOP_TEN = {"max_used": 10, "min_similarity": -1.0, "max_recalled": 0, "lexical_weight": 0.0}
RECALLS: dict[str, tuple[Callable[[Recall], Recall] | None, dict[str, Any]]] = {
    "defaults": (None, {}), "none": (no_memories, {}), "top10": (top_ten, TOP_TEN),
}


@contextlib.asynccontextmanager
async def wired(pool: asyncpg.Pool, settings: Settings, clock: ManualClock, recall: str = "defaults") -> AsyncIterator[Services]:
    """The bot's services on the baseline's database, wired by `bot.services` around the baseline's core."""
    shaped, overrides = RECALLS[recall]
    settings = settings.with_overrides(**overrides)
    core = memory_core(pool, shared_embedder(), settings, clock, servers=Servers(pool, settings))
    if shaped is not None:  # the baseline's recall: the core's own search, its outcome reshaped for the prompt
        search = core.reply_search

        async def reply_search(conversation: Conversation) -> Recall:
            return shaped(await search(conversation))

        core.reply_search = reply_search  # type: ignore[method-assign]
    services = build_services(core, Database(url="", pool=pool), bot_user_id=BOT_USER_ID)
    await services.servers.sync_default_persona()
    try:
        yield services
    finally:
        await services.summaries.settle()
        await services.summaries.close()
        await services.model.close()


# --- one conversation in its channel -------------------------------------------------------------------


class Channel:
    """One LoCoMo conversation as a server with one channel and two members."""

    def __init__(self, sample: Sample, index: int) -> None:
        self.sample = sample
        self.guild_id = 910_000_000 + index
        self.channel_id = self.guild_id * 10 + 1
        self.users = (self.guild_id * 100 + 1, self.guild_id * 100 + 2)
        self.names = dict(zip(self.users, sample.speakers, strict=True))
        self.next_id = self.guild_id * 1_000_000
        rng = random.Random(f"{SEED}:{sample.sample_id}")
        self.addressed = {
            (s.number, t): rng.random() < ADDRESSED_SHARE for s in sample.sessions for t in range(len(s.turns))
        }

    def owner(self, speaker: int) -> int:
        return self.users[speaker]

    def message(
        self, author: int, text: str, when: datetime, *, addressed: bool = False, reply_to: int | None = None
    ) -> IncomingMessage:
        self.next_id += 1
        is_bot = author == BOT_USER_ID
        return IncomingMessage(
            message_id=self.next_id, channel_id=self.channel_id, author_id=author,
            author_name=BOT_NAME if is_bot else self.names[author], text=f"@{BOT_NAME} {text}" if addressed else text,
            created_at=when, guild_id=self.guild_id, is_bot=is_bot, reply_to=reply_to,
            mentions=(UserRef(BOT_USER_ID, BOT_NAME, True),) if addressed else (), where=f'#chat in "{self.sample.sample_id}"',
        )

    @staticmethod
    def at(day: date, minute: int = 0) -> datetime:
        return datetime(day.year, day.month, day.day, 12, tzinfo=UTC) + timedelta(minutes=minute)

    async def rollover(self, services: Services, clock: ManualClock, proxy: ModelProxy, day: date) -> None:
        """A new chat day: what the running bot does in the background (an upkeep pass, the channel's day catch-up)."""
        clock.current = self.at(day)
        proxy.phase = "day-end"
        await services.upkeep.rebuild()
        services.summaries.saw(self.channel_id, self.guild_id)
        await services.summaries.settle()

    async def replay(
        self, services: Services, clock: ManualClock, proxy: ModelProxy, *, gold: bool,
        transcript: dict[str, list[str]], say: Callable[[str], None],
    ) -> dict[str, Any]:
        """Every session of the conversation, one chat day each; with `gold`, the facts are saved at each day's
        start and the bot's posts are the ones of the model's replay (`transcript`), so the channel reads the same."""
        stats: dict[str, Any] = {"replies": 0, "failed_replies": 0, "tool_changes": 0, "gold_saved": 0}
        if gold:
            await services.servers.update_guild_settings(self.guild_id, BENCH_ADMIN, self_teaching=False)
        for session in self.sample.sessions:
            clock.current = self.at(session.day)
            if gold:  # saved as the bot saves (source `bot`), so self-teaching is on for the moment of the saves
                await services.servers.update_guild_settings(self.guild_id, BENCH_ADMIN, self_teaching=True)
                for fact in session.facts:
                    owner = self.owner(fact.speaker)
                    saved = await services.core.save(NewMemory(
                        list=MemoryList.PERSONAL, text=fact.text, by=owner, via=Source.BOT, guild_id=self.guild_id,
                        owner_id=owner,
                    ))
                    stats["gold_saved"] += saved.saved is not None
                await services.servers.update_guild_settings(self.guild_id, BENCH_ADMIN, self_teaching=False)
            for t, turn in enumerate(session.turns):
                clock.current = self.at(session.day, 2 * t)
                addressed = self.addressed[(session.number, t)]
                incoming = self.message(self.owner(turn.speaker), turn.text, clock.now(), addressed=addressed)
                proxy.phase = "reply"
                began = time.perf_counter()
                outcome = await services.chat.handle(incoming, mentions_bot=addressed)
                key = f"{session.number}:{t}"
                if outcome is None:
                    continue
                if not gold:
                    say(f"    {self.sample.sample_id} {key}: {outcome.status.value}, {len(outcome.changes)} memory changes,"
                        f" {time.perf_counter() - began:.0f} s")
                if gold:
                    posts = transcript.get(key, [])
                else:
                    posts = self.posts(outcome)
                    transcript[key] = posts
                    stats["replies"] += 1
                    stats["failed_replies"] += outcome.status != ReplyStatus.REPLIED
                    stats["tool_changes"] += len(outcome.changes)
                clock.current = self.at(session.day, 2 * t + 1)
                for post in posts:
                    await services.chat.handle(self.message(BOT_USER_ID, post, clock.now(), reply_to=incoming.message_id))
            # The day is over: its day-end work runs now, as on the next morning of a running bot. (The bot starts it
            # with the channel's first message after the rollover, and looks back SUMMARY_BACKFILL_DAYS; LoCoMo's
            # sessions are often weeks apart, so waiting for the next session would leave many days unsummarised.)
            await self.rollover(services, clock, proxy, session.day + timedelta(days=1))
            say(f"    {self.sample.sample_id} session {session.number} ({session.day}): {len(session.turns)} turns")
        return stats

    @property
    def question_day(self) -> date:
        return self.sample.sessions[-1].day + timedelta(days=1)

    @staticmethod
    def posts(outcome: ReplyOutcome) -> list[str]:
        """What the bot posts in the channel for one reply: its answer, then its memory notices when they are shown there."""
        posts = [chunk for chunk in outcome.chunks if chunk.strip()]
        if outcome.notices is not None and outcome.notices.destination == "channel":
            posts += [chunk for chunk in outcome.notices.chunks if chunk.strip()]
        return posts

    async def ask(
        self, services: Services, clock: ManualClock, proxy: ModelProxy, questions: Sequence[Question],
        covering: dict[int, list[int]], say: Callable[[str], None],
    ) -> list[dict[str, Any]]:
        """Each question the day after, by the first speaker, deleted again after its answer."""
        await services.servers.update_guild_settings(self.guild_id, BENCH_ADMIN, self_teaching=False)
        answers = []
        for number, question in enumerate(questions):
            clock.current = self.at(self.question_day, 2 * number)
            incoming = self.message(self.users[0], question.text + ASK_SUFFIX, clock.now(), addressed=True)
            proxy.phase = "answer"
            began = time.perf_counter()
            outcome = await services.chat.handle(incoming, mentions_bot=True)
            say(f"    {question.key}: {time.perf_counter() - began:.0f} s")
            await services.chat.deleted(self.channel_id, [incoming.message_id])
            shown = set(outcome.prompt.shown_memory_ids) if outcome is not None and outcome.prompt is not None else set()
            saved = [f for f in question.gold if covering.get(f)]
            in_prompt = [f for f in saved if shown & set(covering[f])]
            answers.append({
                "key": question.key, "category": question.category, "question": question.text, "gold": question.answer,
                "answer": outcome.text if outcome is not None and outcome.status == ReplyStatus.REPLIED else "",
                "status": outcome.status.value if outcome is not None else "no reply",
                "gold_facts": len(question.gold), "gold_saved": len(saved), "gold_in_prompt": len(in_prompt),
                "prompt_tokens": outcome.prompt.tokens.total if outcome is not None and outcome.prompt is not None else 0,
            })
        return answers


# --- one run -----------------------------------------------------------------------------------------------


@dataclass
class Endpoint:
    base_url: str
    model: str
    api_key: str

    @property
    def host(self) -> str:
        return urlparse(self.base_url).netloc or self.base_url


def endpoints(env: dict[str, str] | None = None) -> tuple[Endpoint, Endpoint] | None:
    """(chat, judge) from BENCH_CHAT_* and BENCH_JUDGE_* (the judge defaults to the chat model); None if unset."""
    env = dict(os.environ if env is None else env)
    base, model = env.get("BENCH_CHAT_BASE_URL", "").strip(), env.get("BENCH_CHAT_MODEL", "").strip()
    if not base or not model:
        return None
    chat = Endpoint(base.rstrip("/"), model, env.get("BENCH_CHAT_API_KEY", "").strip())
    judge_base = env.get("BENCH_JUDGE_BASE_URL", "").strip().rstrip("/")
    judge = Endpoint(
        judge_base or chat.base_url, env.get("BENCH_JUDGE_MODEL", "").strip() or chat.model,
        env.get("BENCH_JUDGE_API_KEY", "").strip() or (chat.api_key if not judge_base or judge_base == chat.base_url else ""),
    )
    return chat, judge


def run_folder(chat: Endpoint, judge: Endpoint, size: Size, base: Path) -> Path:
    identity = json.dumps([STATE_VERSION, chat.base_url, chat.model, judge.base_url, judge.model, dataclasses.asdict(size), SEED])
    slug = re.sub(r"[^a-zA-Z0-9.]+", "-", chat.model).strip("-")[:40] or "model"
    return base / f"{slug}-{size.name}-{hashlib.sha256(identity.encode()).hexdigest()[:10]}"


class Run:
    def __init__(
        self, server: BenchServer, the_plan: Plan, chat: ModelProxy, judge: ModelProxy, folder: Path,
        say: Callable[[str], None], *, context_tokens: int,
    ) -> None:
        self.server, self.plan, self.chat, self.judge, self.folder, self.say = server, the_plan, chat, judge, folder, say
        self.context_tokens = context_tokens
        self.judging = True
        self.state_path = folder / "state.json"
        self.state: dict[str, Any] = {"version": STATE_VERSION, "baselines": {}, "transcripts": {}}
        if self.state_path.is_file():
            self.state = json.loads(self.state_path.read_text(encoding="utf-8"))

    def save_state(self) -> None:
        temporary = self.state_path.with_suffix(".tmp")
        temporary.write_text(json.dumps(self.state, indent=1, ensure_ascii=False), encoding="utf-8")
        temporary.replace(self.state_path)

    def settings(self, baseline: Baseline, *, replay: bool) -> Settings:
        chat_model = "" if (replay and baseline.replay == "gold") else self.chat.model  # gold: the bot's posts are replayed
        return Settings().with_overrides(
            chat_base_url=self.chat.url, chat_model=chat_model, chat_api_key="", chat_temperature=0.0,
            summary_model=self.chat.model, summary_base_url=self.chat.url,
            chat_timeout_s=600.0, summary_timeout_s=1800.0, chat_context_tokens=self.context_tokens,
            **baseline.settings,
        )

    async def baseline(self, baseline: Baseline) -> dict[str, Any]:
        done = self.state["baselines"].get(baseline.name)
        if done is not None:
            self.say(f"  {baseline.name}: already measured in {self.state_path} (kept)")
            return done
        started = time.perf_counter()
        began = {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "load_average": _load()}
        before = {phase: dict(c) for phase, c in self.chat.totals().items()}
        async with self.server.database(f"e2e_{baseline.name}") as url:
            pool = await create_pool(url, max_size=4)
            try:
                result = await self._baseline(pool, baseline)
            finally:
                await pool.close()
        result["calls"] = _difference(self.chat.totals(), before)
        result["seconds"] = round(time.perf_counter() - started)
        result["description"] = baseline.description
        # when and under what load this baseline was measured: a resumed run's own start and end say nothing about it
        result["measured"] = {**began, "ended": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                              "load_average_end": _load()}
        self.state["baselines"][baseline.name] = result
        self.save_state()
        return result

    async def _baseline(self, pool: asyncpg.Pool, baseline: Baseline) -> dict[str, Any]:
        clock = ManualClock()
        channels = [Channel(sample, i) for i, sample in enumerate(self.plan.samples)]
        gold = baseline.replay == "gold"
        if gold and not all(c.sample.sample_id in self.state["transcripts"] for c in channels):
            raise RuntimeError("the gold baseline replays the bot's posts of the `defaults` replay: run `defaults` first")
        replay: dict[str, Any] = {"replies": 0, "failed_replies": 0, "tool_changes": 0, "gold_saved": 0}
        self.say(f"  {baseline.name}: replaying {len(channels)} conversations ({'gold facts' if gold else 'the model saves'})")
        async with wired(pool, self.settings(baseline, replay=True), clock) as services:
            for channel in channels:
                # only the `defaults` replay writes the posts `gold` replays: another baseline's (tools_only) differ
                transcript = self.state["transcripts"].setdefault(channel.sample.sample_id, {}) \
                    if gold or baseline.name == "defaults" else {}
                stats = await channel.replay(services, clock, self.chat, gold=gold, transcript=transcript, say=self.say)
                for key in replay:
                    replay[key] += stats[key]
        if not gold:
            self.save_state()
        async with wired(pool, self.settings(baseline, replay=False), clock, baseline.recall) as services:
            saving, covering = await self.saving(services, channels, gold=gold)
            answers = []
            for channel in channels:
                questions = self.plan.questions[channel.sample.sample_id]
                self.say(f"    asking {len(questions)} questions of {channel.sample.sample_id}")
                answers += await channel.ask(services, clock, self.chat, questions, covering, self.say)
        await self.judge_answers(answers)
        (self.folder / f"answers-{baseline.name}.jsonl").write_text(
            "".join(json.dumps(a, ensure_ascii=False) + "\n" for a in answers), encoding="utf-8"
        )
        return {"replay": replay, "saving": saving, "answering": summarise_answers(answers)}

    async def saving(
        self, services: Services, channels: Sequence[Channel], *, gold: bool
    ) -> tuple[dict[str, Any], dict[int, list[int]]]:
        """The stored memories against the gold facts; and, per fact index, the memories that cover it."""
        memories = await services.core.all_memories()
        embedder = shared_embedder()
        totals: dict[str, Any] = {}
        covering: dict[int, list[int]] = {}
        judged: list[dict[str, Any]] = []
        texts: dict[str, str] = {}
        sources: dict[str, int] = {}
        for channel in channels:
            facts = [score.GoldFact(str(f.index), channel.owner(f.speaker), f.text) for f in channel.sample.facts]
            mine = [
                score.StoredMemory(m.id, m.owner_id if m.list == MemoryList.PERSONAL else None, m.text)
                for m in sorted(memories, key=lambda m: m.id)
                if (m.list == MemoryList.PERSONAL and m.owner_id in channel.users)
                or (m.list == MemoryList.SERVER and m.guild_id == channel.guild_id)
            ]
            for m in memories:
                if m.id in {stored.id for stored in mine}:
                    sources[m.source.value] = sources.get(m.source.value, 0) + 1
            fact_vectors = await embedder.embed([f.text for f in facts])
            memory_vectors = await embedder.embed([m.text for m in mine])
            result = score.score_saving(facts, mine, fact_vectors, memory_vectors)
            for key, value in result.as_dict().items():
                totals[key] = totals.get(key, 0) + value
            covering |= {int(key): ids for key, ids in result.covering.items()}
            texts |= {f"f{f.key}": f.text for f in facts} | {f"m{m.id}": m.text for m in mine}
            judged += [{"fact": key, "memory": memory, "similarity": round(sim, 3)} for key, memory, sim in result.pairs]
        if not gold:  # judged once every baseline has its answers (a slow judge must not hold the answers back)
            totals["judge_pairs"] = {"pairs": judged, "texts": texts}
        totals["chat_days"] = self.plan.chat_days
        totals["by_source"] = sources
        return totals, covering

    async def judge_facts(self, pairs: list[dict[str, Any]], texts: dict[str, str]) -> dict[str, Any]:
        """The judge on a sample of pairs near the matching threshold: how often it agrees with the rule."""
        sample = score.judge_sample([(p["fact"], p["memory"], p["similarity"]) for p in pairs], JUDGE_FACT_SAMPLE, SEED)
        self.judge.phase = "judge-facts"
        agree = 0
        checked = []
        for fact, memory, similarity in sample:
            said = score.verdict(await self.judge.complete(score.fact_judge_messages(texts[f"f{fact}"], texts[f"m{memory}"])))
            rule = similarity >= score.FACT_MATCH_SIMILARITY
            agree += said is not None and said == rule
            checked.append({"similarity": similarity, "rule": rule, "judge": said})
        return {"pairs": len(sample), "agree": agree, "checked": checked}

    async def judge_answers(self, answers: list[dict[str, Any]]) -> None:
        self.judge.phase = "judge-answers"
        for answer in answers:
            answer["f1"] = round(score.locomo_f1(answer["answer"], answer["gold"], answer["category"]), 4)
            if not self.judging:
                answer["judge"] = None
                continue
            if not answer["answer"].strip():
                answer["judge"] = False
                continue
            said = await self.judge.complete(score.answer_judge_messages(answer["question"], answer["gold"], answer["answer"]))
            answer["judge"] = bool(score.verdict(said))
            answer["judge_said"] = said.strip()[:40]

    async def judge_check(self, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """The judge on the hand-checked judgements of the scorer's tests: its agreement with a person."""
        if "judge_check" in self.state:
            return self.state["judge_check"]
        self.judge.phase = "judge-check"
        agree = 0
        for row in rows:
            messages = score.answer_judge_messages(row["question"], row["gold"], row["answer"])
            agree += score.verdict(await self.judge.complete(messages)) == row["correct"]
        self.state["judge_check"] = {"judgements": len(rows), "agree": agree}
        self.save_state()
        return self.state["judge_check"]


def day_end_call(body: dict[str, Any]) -> str | None:
    """"day-end" for a summary's call (a day, its parts, a week), whenever it comes; None: the phase of the moment."""
    messages = body.get("messages") or [{}]
    return "day-end" if messages[0].get("content") in (DAY_INSTRUCTIONS, COMBINE_INSTRUCTIONS, WEEK_INSTRUCTIONS) else None


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _difference(after: dict[str, dict[str, Any]], before: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        phase: {key: round(value - before.get(phase, {}).get(key, 0), 1) for key, value in counts.items()}
        for phase, counts in after.items()
        if counts["calls"] != before.get(phase, {}).get("calls", 0)
    }


HAND_CHECKED = Path(__file__).resolve().parents[1] / "tests/data/e2e_judgements.jsonl"


def hand_checked_judgements() -> list[dict[str, Any]]:
    """The scorer tests' hand-checked judgements (absent from an installed copy without tests: then none)."""
    if not HAND_CHECKED.is_file():
        return []
    return [json.loads(line) for line in HAND_CHECKED.read_text(encoding="utf-8").splitlines() if line.strip()]


def recorded_seconds(folder: Path) -> float:
    """The time every recorded call of the run's folder took when it was made (all attempts of an interrupted run)."""
    total = 0.0
    for name in ("chat-calls.jsonl", "judge-calls.jsonl"):
        path = folder / name
        if path.is_file():
            for line in path.read_text(encoding="utf-8").splitlines():
                with contextlib.suppress(ValueError):
                    total += float(json.loads(line).get("seconds") or 0.0)
    return total


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _exists(path: Path) -> bool:
    return path.is_file()


def summarise_answers(answers: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """J (judge yes), F1, both with 95% intervals; per category; and where the gold facts were."""

    def figures(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
        judged = [r for r in rows if r["judge"] is not None]
        yes = sum(1 for r in judged if r["judge"])
        f1s = [r["f1"] for r in rows]
        low, high = score.wilson(yes, len(judged))
        f1_low, f1_high = score.bootstrap_mean(f1s, seed=SEED)
        return {
            "n": len(rows), "j": round(yes / len(judged), 4) if judged else None, "j_ci": [round(low, 3), round(high, 3)],
            "f1": round(sum(f1s) / len(f1s), 4) if rows else 0.0, "f1_ci": [round(f1_low, 3), round(f1_high, 3)],
        }

    all_saved = [r for r in answers if r["gold_saved"] == r["gold_facts"]]
    in_prompt = [r for r in answers if r["gold_in_prompt"] == r["gold_facts"]]
    return {
        **figures(answers),
        "by_category": {str(c): figures([r for r in answers if r["category"] == c]) for c in QUESTION_CATEGORIES
                        if any(r["category"] == c for r in answers)},
        "gold_saved": round(sum(r["gold_saved"] / r["gold_facts"] for r in answers) / max(len(answers), 1), 4),
        "gold_in_prompt": round(sum(r["gold_in_prompt"] / r["gold_facts"] for r in answers) / max(len(answers), 1), 4),
        "all_gold_in_prompt": figures(in_prompt),
        "all_gold_saved": len(all_saved),
        "prompt_tokens": round(sum(r["prompt_tokens"] for r in answers) / max(len(answers), 1)),
        "failed": sum(1 for r in answers if r["status"] != ReplyStatus.REPLIED.value),
    }


async def run(
    server: BenchServer, say: Callable[[str], None], *, size: Size, baselines: Sequence[Baseline] = BASELINES,
    path: Path = LOCOMO_PATH, env: dict[str, str] | None = None, folder: Path | None = None, fresh: bool = False,
    checks: bool = True, judging: bool = True,
) -> dict[str, Any]:
    """Every baseline on the plan of `size`; {} with a note when the data or the model is missing.

    `judging`: False leaves the answers unjudged (J is not reported; F1 only). `checks`: also ask the judge about
    the matching rule's pairs and the hand-checked judgements (when they are not in the state yet); without, the
    report says what is missing."""
    if not _exists(path):
        say(f"End to end skipped: {path} is missing (its license forbids copying it into the repository).")
        return {}
    found = endpoints(env)
    if found is None:
        say("End to end skipped: set BENCH_CHAT_BASE_URL and BENCH_CHAT_MODEL (an OpenAI-compatible chat model).")
        return {}
    chat, judge = found
    environment = dict(os.environ if env is None else env)
    the_plan = plan(size, path)
    base = folder or Path(environment.get("BENCH_E2E_DIR") or Path(environment.get("DATA_DIR") or "data") / "bench-e2e")
    run_dir = run_folder(chat, judge, size, base)
    if fresh and run_dir.exists():
        for leftover in run_dir.iterdir():
            leftover.unlink()
    run_dir.mkdir(parents=True, exist_ok=True)
    say(f"  {the_plan.question_count} questions, {the_plan.fact_count} gold facts, {the_plan.chat_days} chat days"
        f" ({len(the_plan.samples)} conversations); model {chat.model} at {chat.host}, judge {judge.model} at {judge.host};"
        f" run folder {run_dir}")
    shared_embedder().prefill(
        [t.text for s in the_plan.samples for session in s.sessions for t in session.turns]
        + [f.text for s in the_plan.samples for f in s.facts]
    )
    started = time.perf_counter()
    context_tokens = int(environment.get("BENCH_CHAT_CONTEXT_TOKENS") or 32_000)
    load_start = _load()
    async with (
        ModelProxy(chat.base_url, chat.api_key, chat.model, run_dir / "chat-calls.jsonl", seed=SEED,
                   phase_of=day_end_call) as chat_proxy,
        ModelProxy(judge.base_url, judge.api_key, judge.model, run_dir / "judge-calls.jsonl", seed=SEED) as judge_proxy,
    ):
        the_run = Run(server, the_plan, chat_proxy, judge_proxy, run_dir, say, context_tokens=context_tokens)
        the_run.judging = judging
        results: dict[str, Any] = {}
        for baseline in baselines:
            results[baseline.name] = await the_run.baseline(baseline)
            answering = results[baseline.name]["answering"]
            say(f"  {baseline.name}: J {answering['j']} {answering['j_ci']}, F1 {answering['f1']:.3f},"
                f" gold in prompt {answering['gold_in_prompt']:.3f} ({results[baseline.name]['seconds']} s)")
        for result in results.values():
            pairs = result["saving"].get("judge_pairs")
            if checks and pairs is not None and "judge_check" not in result["saving"]:
                result["saving"]["judge_check"] = await the_run.judge_facts(pairs["pairs"], pairs["texts"])
                the_run.save_state()
        judge_check = await the_run.judge_check(hand_checked_judgements()) if checks else the_run.state.get("judge_check", {})
    for name, result in results.items():
        result["saving"].pop("judge_pairs", None)
        if not judging:  # one rule for the whole table: a baseline judged by an earlier run is shown unjudged too
            answers = [json.loads(line) for line in _lines(run_dir / f"answers-{name}.jsonl")]
            result["answering"] = summarise_answers([{**answer, "judge": None} for answer in answers])
    return {
        "model": chat.model, "endpoint": chat.host, "quantisation": environment.get("BENCH_CHAT_QUANTISATION", ""),
        "judge_model": judge.model, "judge_endpoint": judge.host, "size": size.name,
        "conversations": [s.sample_id for s in the_plan.samples], "sessions_per_conversation": size.sessions,
        "chat_days": the_plan.chat_days, "facts": the_plan.fact_count, "questions": the_plan.question_count,
        "skipped_questions": the_plan.skipped, "seed": SEED, "addressed_share": ADDRESSED_SHARE,
        "settings": {"chat_context_tokens": context_tokens, "temperature": 0,
                     "fact_match_similarity": score.FACT_MATCH_SIMILARITY},
        "baselines": results, "judge_check": judge_check, "wall_seconds": round(time.perf_counter() - started),
        "model_minutes": round(recorded_seconds(run_dir) / 60),
        "load_average": {"start": load_start, "end": _load()},
        "run_folder": str(run_dir),
    }
