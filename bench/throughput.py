"""Section 2: the built-in embedder, replies per second through the pipeline, and the bot's peak RSS.

Everything runs in a child process (`python -m bench.throughput`) that looks like the bot: it
imports the Discord layer, loads the built-in embedder, opens the pool the bot opens, and
answers messages through the real `ReplyPipeline` with a local OpenAI-compatible stub as the
chat model (`bench.stub`, its own process, answering at once). Its peak RSS (`ru_maxrss`) is
the footprint figure, so nothing the benchmark driver holds (like the 1M-memory dataset) counts.

Load: 20 servers with their memories re-embedded by the real model (so messages really match
some of them), 3 channels each, 50 replies in flight; each channel answers one message at a
time, as the pipeline's per-channel lock makes the bot do. The figure is completed replies
divided by wall time. The same is measured for the core path alone (embed, search, prompt
build), which shows what the pipeline adds around it, and for the pipeline with every message
embedded ahead of time (what-if), which shows what the bot's Python costs without the local model.
The worker runs on the bot's event loop (`bot.bot.run_event_loop`: uvloop when installed).
`BENCH_PROFILE=tsub` (with yappi installed) prints where the CPU of the pipeline blocks goes
(`BENCH_PROFILE_BLOCKS=whatif` for the what-if blocks).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from bench.synth import BASE_DAY, Dataset, message_text

SERVERS = 20
CHANNELS_PER_SERVER = 3
IN_FLIGHT = 50
BOT_USER_ID = 42
HISTORY_PER_CHANNEL = 12


@dataclass
class ServerInfo:
    guild_id: int
    channel_ids: list[int]
    users: list[int]
    topics: list[int]


def server_sample(dataset: Dataset, seed: int = 21) -> list[ServerInfo]:
    rng = random.Random(seed)
    chosen = rng.sample(dataset.servers, k=min(SERVERS, len(dataset.servers)))
    return [
        ServerInfo(s.guild_id, list(s.channel_ids[:CHANNELS_PER_SERVER]), rng.sample(s.users, k=8), list(s.topics))
        for s in chosen
    ]


def _write_servers(dataset: Dataset) -> Path:
    handle, name = tempfile.mkstemp(prefix="deskmate-bench-servers-", suffix=".json")
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        json.dump([asdict(s) for s in server_sample(dataset)], out)
    return Path(name)


async def run(
    url: str, dataset: Dataset, replies: int, progress: Callable[[str], None], embed_threads: int | None = None
) -> dict[str, Any]:
    """Start the stub and the worker, return the worker's figures.

    `embed_threads` overrides the built-in embedder's BLAS threads (None: what the bot does).
    """
    servers_file = _write_servers(dataset)
    stub = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.stub", stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert stub.stdout is not None
        line = (await asyncio.wait_for(stub.stdout.readline(), 30)).decode()
        if not line.startswith("PORT "):
            raise RuntimeError(f"the chat stub did not start: {line!r}")
        stub_url = f"http://127.0.0.1:{int(line.split()[1])}/v1"
        worker = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.throughput", url, stub_url, str(servers_file), "--replies", str(replies),
            "--stub-pid", str(stub.pid),
            stdout=subprocess.PIPE,
            env={**os.environ, "BENCH_EMBED_THREADS": str(embed_threads or 0)},
        )
        assert worker.stdout is not None
        result: dict[str, Any] = {}
        async for raw in worker.stdout:
            text = raw.decode().rstrip()
            if text.startswith("{"):
                result = json.loads(text)
            elif text:
                progress(text)
        if await worker.wait() != 0 or not result:
            raise RuntimeError("the throughput worker failed (see its output above)")
        return result
    finally:
        if stub.stdin is not None:
            stub.stdin.close()
        try:
            await asyncio.wait_for(stub.wait(), 10)
        except TimeoutError:
            stub.terminate()
            await stub.wait()
        servers_file.unlink(missing_ok=True)


# --- the worker (child process) ------------------------------------------------------------------


def _say(text: str) -> None:
    print(f"  {text}", flush=True)


async def _reembed(pool: Any, embedder: Any, guild_ids: list[int], space: int) -> int:
    """Give the sampled servers' memories real vectors, so replies match them as they would in life."""
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT m.id, m.text FROM memories m WHERE m.guild_id = ANY ($1::bigint[])"
            " OR m.owner_id IN (SELECT DISTINCT owner_id FROM memories WHERE list = 'personal' AND persona_id IN"
            "   (SELECT id FROM personas WHERE guild_id = ANY ($1::bigint[])))",
            guild_ids,
        )
        for start in range(0, len(rows), 64):
            batch = rows[start : start + 64]
            vectors = embedder.encode_now([row["text"] for row in batch])
            await conn.executemany(
                "UPDATE memory_vectors SET embedding = $2 WHERE memory_id = $1 AND space_id = $3",
                [(row["id"], vector, space) for row, vector in zip(batch, vectors, strict=True)],
            )
    return len(rows)


class PrecomputedEmbedder:
    """What-if: vectors computed ahead of time by the same model, looked up at once (a separate embedding
    service that costs this process nothing). Every message the benchmark sends is one of `texts`."""

    def __init__(self, model: Any, texts: list[str]) -> None:
        self.model = model
        vectors = np.concatenate([model.encode_now(texts[start : start + 64]) for start in range(0, len(texts), 64)])
        self._vectors = dict(zip(texts, vectors, strict=True))

    @property
    def space(self) -> Any:
        return self.model.space

    async def embed(self, texts: Any) -> np.ndarray:
        return np.stack([self._vectors[text] for text in texts])


class _Profiler:
    """BENCH_PROFILE=<sort key> (e.g. tsub, ttot): the CPU time of every thread of the worker during the
    pipeline blocks, by function (yappi, if installed: it sees the embedder's thread and measures CPU,
    not the wall time cProfile would charge to whatever waited for the GIL)."""

    def __init__(self, sort: str) -> None:
        import yappi

        self.yappi = yappi
        self.sort = sort
        yappi.set_clock_type("cpu")

    def start(self) -> None:
        self.yappi.start()

    def stop(self) -> None:
        self.yappi.stop()

    def report(self) -> None:
        stats = self.yappi.get_func_stats()
        stats.sort(self.sort, "desc")
        columns = {0: ("name", 90), 1: ("ncall", 10), 2: ("tsub", 8), 3: ("ttot", 8), 4: ("tavg", 8)}
        stats.print_all(out=sys.stderr, columns=columns)
        self.yappi.get_thread_stats().print_all(out=sys.stderr)


def _profiler() -> _Profiler | None:
    sort = os.environ.get("BENCH_PROFILE")
    return _Profiler(sort) if sort else None


async def worker(url: str, stub_url: str, servers_path: str, replies: int, stub_pid: int = 0) -> dict[str, Any]:
    import bot.bot  # noqa: F401  # the Discord layer, loaded as in the bot (peak RSS)
    from bench.synth import SPACE
    from bot.chat.messages import IncomingMessage
    from bot.chat.receipts import ReplyStatus
    from bot.chat.reply import ReplyPipeline
    from bot.clock import ManualClock
    from bot.config import Settings
    from bot.db import create_pool
    from bot.embeddings.providers import BuiltinEmbedder, create_embedder
    from bot.memory.models import Conversation
    from bot.prompt import Persona, PromptInput, build_prompt
    from bot.services import build_services, memory_core

    servers = [ServerInfo(**raw) for raw in json.loads(Path(servers_path).read_text(encoding="utf-8"))]  # noqa: ASYNC240
    rng = random.Random(5)
    threads = int(os.environ.get("BENCH_EMBED_THREADS", "0")) or None  # unset: what the bot does
    builtin = BuiltinEmbedder(threads=threads)
    builtin.warm_up()
    settings = Settings().with_overrides(chat_base_url=stub_url, chat_model="stub", chat_api_key="bench")
    embedder = create_embedder(settings, builtin=builtin)

    # Embedder: single-message latency through the async path a reply waits on, then batches of 64.
    texts = [message_text(np.random.default_rng(i), i % 30) + f" ({i})" for i in range(300 + 64 * 10)]
    singles = []
    for text in texts[:300]:
        started = time.perf_counter()
        await embedder.embed([text])
        singles.append((time.perf_counter() - started) * 1000)
    started = time.perf_counter()
    for start in range(300, len(texts), 64):
        builtin.encode_now(texts[start : start + 64])
    batch_per_s = (len(texts) - 300) / (time.perf_counter() - started)
    _say(f"embedder: single p50 {statistics.median(singles):.2f} ms, batch-64 {batch_per_s:,.0f} texts/s")

    pool = await create_pool(url, max_size=10)
    clock = ManualClock()
    clock.set_date(BASE_DAY + timedelta(days=6000))
    core = memory_core(pool, embedder, settings, clock)
    space = await core.embeddings.space_id()
    assert embedder.space == SPACE, "the synthetic memories were embedded in the built-in model's space"
    count = await _reembed(pool, builtin, [s.guild_id for s in servers], space or 0)
    _say(f"re-embedded {count:,} memories of {len(servers)} servers with the built-in model")

    channels = [(server, channel) for server in servers for channel in server.channel_ids]
    next_id = iter(range(10**17, 10**18))

    def message(server: ServerInfo, channel: int) -> IncomingMessage:
        author = rng.choice(server.users)
        return IncomingMessage(
            message_id=next(next_id),
            channel_id=channel,
            author_id=author,
            author_name=f"user{author % 10_000}",
            text=message_text(np.random.default_rng(rng.randrange(10**9)), rng.choice(server.topics)),
            created_at=clock.now(),
            guild_id=server.guild_id,
        )

    stub_process = psutil.Process(stub_pid) if stub_pid else None

    def stub_cpu() -> float:
        if stub_process is None:
            return 0.0
        times = stub_process.cpu_times()
        return times.user + times.system

    async def drive(one: Callable[[ServerInfo, int], Any], count: int) -> dict[str, Any]:
        """`count` calls of `one`, IN_FLIGHT at a time, one at a time per channel: wall time, CPU, latencies."""
        locks = {channel: asyncio.Lock() for _, channel in channels}
        gate = asyncio.Semaphore(IN_FLIGHT)
        latencies: list[float] = []
        day_every = max(count // 2, 1)  # a new chat day now and then: some replies are a server's first of the day

        async def task(index: int) -> None:
            server, channel = channels[index % len(channels)]
            async with gate, locks[channel]:
                if index % day_every == 0:
                    clock.set_date(clock.now().date() + timedelta(days=1))
                began = time.perf_counter()
                await one(server, channel)
                latencies.append((time.perf_counter() - began) * 1000)

        began, cpu, stub = time.perf_counter(), time.process_time(), stub_cpu()
        await asyncio.gather(*(task(i) for i in range(count)))
        return {
            "seconds": time.perf_counter() - began,
            "cpu": time.process_time() - cpu,
            "stub_cpu": stub_cpu() - stub,
            "count": count,
            "latencies": latencies,
        }

    def summarize(label: str, blocks: list[dict[str, Any]]) -> dict[str, float]:
        count = sum(b["count"] for b in blocks)
        figures = {
            "per_s": count / sum(b["seconds"] for b in blocks),
            "latency_ms_p50": statistics.median(x for b in blocks for x in b["latencies"]),
            "cpu_ms": 1000 * sum(b["cpu"] for b in blocks) / count,
            "stub_cpu_ms": 1000 * sum(b["stub_cpu"] for b in blocks) / count,
        }
        _say(
            f"{label}: {figures['per_s']:,.0f} replies/s, latency p50 {figures['latency_ms_p50']:.0f} ms,"
            f" bot process CPU {figures['cpu_ms']:.1f} ms/reply"
            + (f", stub CPU {figures['stub_cpu_ms']:.1f} ms/reply" if stub_process else "")
        )
        return figures

    persona = Persona(settings.default_persona_name, settings.default_persona_prompt)

    failed_searches = {"core path": 0, "pipeline": 0}

    async def core_path(server: ServerInfo, channel: int) -> None:
        incoming = message(server, channel)
        recall = await core.reply_search(
            Conversation(server.guild_id, channel, incoming.author_id, incoming.text, tuple(rng.sample(server.users, 2)))
        )
        failed_searches["core path"] += not recall.search_ok
        build_prompt(
            PromptInput(persona=persona, lore=[], desk=recall.desk, user_names={}, history=[], tail=[],
                        answered=_line(incoming), now=clock.now())
        )

    await drive(core_path, min(replies, 300))  # warm-up: caches, prepared statements, generic plans
    core_figures = summarize("core path: embed + search + prompt", [await drive(core_path, replies)])

    failures: list[str] = []

    # The pipeline as the bot runs it (built-in model micro-batched, chat call without the SDK's request
    # transform, token counts cached: all in the bot's code now), and a what-if that shows what is left
    # without the local model: the same pipeline with every message's vector computed ahead of time, as
    # if a separate embedding service answered at once. The two alternate in blocks so that load from
    # other processes hits both alike.
    from bench.synth import MESSAGE_TEMPLATES, TOPIC_NAMES, TOPICS
    from bot.embeddings.providers import DeadlineEmbedder, MicroBatchingEmbedder

    distinct = [template.format(thing=thing) for name in TOPIC_NAMES for thing in TOPICS[name] for template in MESSAGE_TEMPLATES]
    ahead = PrecomputedEmbedder(builtin, distinct)
    batcher = embedder.inner
    assert isinstance(batcher, MicroBatchingEmbedder), "the bot wraps its built-in model in a MicroBatchingEmbedder"
    # wired as the bot wires them: chat-history recall and documents as tail sources
    wired = {
        "pipeline": build_services(core, bot_user_id=BOT_USER_ID),
        "whatif": build_services(
            memory_core(pool, DeadlineEmbedder(ahead, settings.embedding_timeout_s), settings, clock), bot_user_id=BOT_USER_ID
        ),
    }
    pipelines = {name: services.pipeline for name, services in wired.items()}
    await wired["pipeline"].servers.sync_default_persona()
    for server, channel in channels:  # a context window to start from, as a live channel has
        await wired["pipeline"].chat_log.record_backfill([message(server, channel) for _ in range(HISTORY_PER_CHANNEL)])

    def full_reply(pipeline: ReplyPipeline) -> Callable[[ServerInfo, int], Any]:
        async def one(server: ServerInfo, channel: int) -> None:
            outcome = await pipeline.reply(message(server, channel))
            failed_searches["pipeline"] += not (outcome.recall and outcome.recall.search_ok)
            if outcome.status != ReplyStatus.REPLIED:
                failures.append(f"{outcome.status}: {outcome.error}")

        return one

    await drive(full_reply(pipelines["pipeline"]), min(replies // 4, 150))  # warm-up of the pipeline's statements
    profiler = _profiler()
    profiled = os.environ.get("BENCH_PROFILE_BLOCKS", "pipeline")  # or "whatif": the pipeline without the local model
    blocks: dict[str, list[dict[str, Any]]] = {name: [] for name in pipelines}
    calls_before, texts_before = batcher.calls, batcher.texts
    rounds = 4
    for _ in range(rounds):
        for name, pipeline in pipelines.items():
            if profiler is not None and name == profiled:
                profiler.start()
            blocks[name].append(await drive(full_reply(pipeline), max(replies // rounds, 1)))
            if profiler is not None and name == profiled:
                profiler.stop()
    if profiler is not None:
        profiler.report()
    pipeline_figures = summarize("pipeline with the chat stub", blocks["pipeline"])
    batched = (batcher.texts - texts_before) / max(batcher.calls - calls_before, 1)
    _say(f"  built-in model calls during the pipeline blocks: {batcher.calls - calls_before:,}, {batched:.1f} texts per call")
    lean_figures = summarize("pipeline, what-if (every message embedded ahead of time)", blocks["whatif"])
    for services in wired.values():
        await services.model.close()
    await pool.close()
    if failures:
        _say(f"{len(failures)} replies did not complete, e.g. {failures[0]}")
    if any(failed_searches.values()):
        _say(f"searches that failed (embedding over EMBEDDING_TIMEOUT_S): {failed_searches}")
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "replies_per_s": round(pipeline_figures["per_s"], 1),
        "reply_latency_ms_p50": round(pipeline_figures["latency_ms_p50"], 2),
        "core_path_replies_per_s": round(core_figures["per_s"], 1),
        "whatif_replies_per_s": round(lean_figures["per_s"], 1),
        "whatif": "with every message embedded ahead of time, no local model in the reply path",
        "cpu_ms_per_reply": {
            "core_path": round(core_figures["cpu_ms"], 2),
            "pipeline": round(pipeline_figures["cpu_ms"], 2),
            "whatif": round(lean_figures["cpu_ms"], 2),
            "stub": round(pipeline_figures["stub_cpu_ms"], 2),
        },
        "texts_per_model_call": round(batched, 2),
        "failed_replies": len(failures),
        "failed_searches": failed_searches["pipeline"],
        "embed_threads": threads or os.cpu_count(),
        "embed_ms_p50": round(statistics.median(singles), 3),
        "embed_batch_per_s": round(batch_per_s, 1),
        "rss_mb": round(rss_mb, 1),
        "in_flight": IN_FLIGHT,
        "servers": len(servers),
        "channels": len(channels),
    }


def _line(incoming: Any) -> Any:
    from bot.prompt import ChatLine

    return ChatLine(incoming.message_id, incoming.author_id, incoming.author_name, incoming.text)


def main() -> None:
    parser = argparse.ArgumentParser(description="Throughput worker (started by python -m bench).")
    parser.add_argument("url")
    parser.add_argument("stub_url")
    parser.add_argument("servers")
    parser.add_argument("--replies", type=int, default=1000)
    parser.add_argument("--stub-pid", type=int, default=0)
    args = parser.parse_args()
    from bot.bot import run_event_loop  # the bot's event loop (uvloop when installed)

    result = run_event_loop(worker(args.url, args.stub_url, args.servers, args.replies, args.stub_pid))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
