"""`python -m bench [--quick]`: every benchmark, a table on stdout, `bench/results.json`.

Full run: recall at 10k, 100k and 1M memories, throughput on the 100k data, LoCoMo (all variants),
the crowded server under the memory budget (section 4), end to end with a real chat model (section 5,
only when BENCH_CHAT_BASE_URL and BENCH_CHAT_MODEL are set), and the generated block of docs/benchmarks.md is
refreshed. `--quick`: 10k and 100k, fewer replies,
two LoCoMo conversations, docs/benchmarks.md left alone. The benchmark starts its own PostgreSQL in a
temporary directory (or uses BENCH_DATABASE_URL) and drops every database it creates.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import traceback
from datetime import UTC, datetime
from typing import Any

from bench import crowd, e2e, locomo, recall, report, synth, throughput
from bench.pg import bench_server

FULL_SIZES = (10_000, 100_000, 1_000_000)
QUICK_SIZES = (10_000, 100_000)
THROUGHPUT_SIZE = 100_000
SECTIONS = ("recall", "throughput", "locomo", "crowd", "e2e")


def say(text: str) -> None:
    print(text, flush=True)


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


async def main(args: argparse.Namespace) -> int:
    quick = args.quick
    sizes = tuple(int(s) for s in args.sizes.split(",")) if args.sizes else (QUICK_SIZES if quick else FULL_SIZES)
    replies = args.replies or (800 if quick else 2000)
    results: dict[str, Any] = {
        "machine": "",
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "quick": quick,
        "recall": {},
        "replies_per_s": None,
        "embed_ms_p50": None,
        "embed_batch_per_s": None,
        "rss_mb": None,
        "locomo": {},
        "load_average": {"start": load_average()},
    }
    sections = set(args.sections.split(",")) if args.sections else set(SECTIONS)
    if not sections <= set(SECTIONS):
        raise SystemExit(f"--sections takes {', '.join(SECTIONS)}; got {args.sections}")
    merged = sections != set(SECTIONS)
    if merged and report.RESULTS.is_file():  # re-run some sections, keep the others of the last run
        previous = json.loads(report.RESULTS.read_text(encoding="utf-8"))
        results = {**previous, "load_average": {"start": load_average()}, "quick": quick}
        if "recall" in sections:
            results["recall"] = {}
        first = {section: previous.get("date", "") for section in ("recall", "throughput", "locomo") if section in previous}
        results["dates"] = {**first, **previous.get("dates", {})}
    results.setdefault("dates", {})
    for section in sections:
        results["dates"][section] = results["date"] if not merged else datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    errors: list[str] = []
    started = time.perf_counter()
    async with bench_server() as server:
        results["machine"] = report.machine(await server.version())
        say(f"Deskmate benchmarks on {results['machine']}\n")
        throughput_size = THROUGHPUT_SIZE if THROUGHPUT_SIZE in sizes else min(sizes)
        if "recall" not in sections:  # the throughput section still needs its data set
            sizes = (throughput_size,) if "throughput" in sections else ()
        for size in sizes:
            say(f"== 1. recall at {size:,} memories")
            try:
                async with server.database(f"recall_{size}") as url:
                    dataset = await synth.load(url, size, progress=say)
                    if "recall" in sections:
                        timings = await recall.measure(url, dataset, replies, progress=say)
                        entry = timings.report()
                        entry["breakdown"] = await recall.breakdown(url, dataset, max(replies // 3, 200))
                        entry["servers"] = len(dataset.servers)
                        entry["load_average"] = load_average()
                        results["recall"][str(size)] = entry
                        say(f"  recall p50 {entry['recall_ms_p50']} ms, p99 {entry['recall_ms_p99']} ms,"
                            f" top-k p50 {entry['topk_ms_p50']} ms, ratio {entry['ratio_p50']}; breakdown {entry['breakdown']}")
                    if args.explain:
                        say(await recall.explain(url, dataset, first_of_day=True))
                        say(await recall.explain(url, dataset, first_of_day=False))
                    if size == throughput_size and "throughput" in sections and not args.skip_throughput:
                        say("== 2. throughput, embedder and footprint")
                        count = args.throughput_replies or (600 if quick else 2000)
                        figures = await throughput.run(url, dataset, count, say)
                        figures["load_average"] = load_average()
                        figures["cpu_warnings"] = throughput.cpu_warnings(figures["cpu_ms_per_reply"], figures["load_average"])
                        for warning in figures["cpu_warnings"].values():
                            say(f"  WARNING: {warning}")
                        results["throughput"] = figures
                        for key in ("replies_per_s", "embed_ms_p50", "embed_batch_per_s", "rss_mb"):
                            results[key] = figures[key]
                        if figures.get("embed_threads") != 1:
                            say("   again with the built-in embedder on one BLAS thread (what-if)")
                            one = await throughput.run(url, dataset, count, say, embed_threads=1)
                            one["load_average"] = load_average()
                            results["throughput_embed_threads_1"] = one
            except Exception as exc:  # keep going: one failed section should not cost the others
                errors.append(f"recall/throughput at {size:,}: {type(exc).__name__}: {exc}")
                traceback.print_exc()
        if args.skip_locomo or "locomo" not in sections:
            if "locomo" in sections:
                results["locomo_note"] = "LoCoMo skipped (--skip-locomo)."
        else:
            results.pop("locomo_note", None)
            say("== 3. LoCoMo")
            try:
                chosen_locomo = [v for v in locomo.VARIANTS if v.name in args.locomo_variants.split(",")] \
                    if args.locomo_variants else None
                found_locomo = await locomo.run(server, say, quick=quick, conversations=args.locomo_conversations,
                                                variants=chosen_locomo)
                # a subset of the variants refreshes those and keeps the others' figures
                results["locomo"] = {**results.get("locomo", {}), **found_locomo} if chosen_locomo else found_locomo
                if not results["locomo"]:
                    results["locomo_note"] = f"LoCoMo skipped: {locomo.LOCOMO_PATH} is missing."
                elif quick or args.locomo_conversations:
                    results["locomo_note"] = "LoCoMo on a subset of the conversations (quick run): not comparable to full runs."
            except Exception as exc:
                errors.append(f"LoCoMo: {type(exc).__name__}: {exc}")
                traceback.print_exc()
        if "crowd" in sections:
            say("== 4. A crowded server under the memory budget")
            try:
                chosen = [v for v in (*crowd.CROWD_VARIANTS, *crowd.EXTRA_VARIANTS) if v.name in args.crowd_variants.split(",")] \
                    if args.crowd_variants else None
                limits = args.crowd_limits.split(",") if args.crowd_limits else tuple(crowd.LIMITS)
                found_crowd = await crowd.run(server, say, quick=quick, variants=chosen, limits=limits)
                partial = chosen is not None or args.crowd_limits
                results["crowd"] = {**results.get("crowd", {}), **found_crowd} if partial else found_crowd
                results["crowd_note"] = "quick run: one server of five conversations" if quick else ""
            except Exception as exc:
                errors.append(f"crowded server: {type(exc).__name__}: {exc}")
                traceback.print_exc()
        if "e2e" in sections:
            say("== 5. End to end with a real chat model")
            try:
                size = e2e.SIZES[args.e2e_size or ("quick" if quick else "small")]
                chosen_baselines = e2e.choose_baselines(args.e2e_baselines)
                found = await e2e.run(server, say, size=size, baselines=chosen_baselines, fresh=args.e2e_fresh,
                                      checks=not args.e2e_skip_checks and not args.e2e_no_judge,
                                      judging=not args.e2e_no_judge)
                if found:
                    # one table per model and size: a run of another model keeps the earlier model's figures beside it
                    results.pop("e2e", None)  # results from before one table per model: superseded by this run
                    results.setdefault("e2e_runs", {})[f"{found['model']} {found['size']}"] = found
                else:
                    results.setdefault("e2e_note", "not run: BENCH_CHAT_BASE_URL / BENCH_CHAT_MODEL unset or LoCoMo missing")
            except Exception as exc:
                errors.append(f"end to end: {type(exc).__name__}: {exc}")
                traceback.print_exc()
    results["load_average"]["end"] = load_average()
    results["seconds"] = round(time.perf_counter() - started)
    if errors:
        results["errors"] = errors
    report.write_results(results)
    say("\n" + report.table(results))
    say(f"\nWrote {report.RESULTS} ({results['seconds']} s).")
    if not results.get("quick") and not args.no_md and not args.sizes and report.update_benchmarks_md(results):
        say(f"Updated the generated block of {report.BENCHMARKS_MD}.")
    for error in errors:
        say(f"ERROR {error}")
    return 1 if errors else 0


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer replies (a laptop run)")
    parser.add_argument("--sizes", help="comma-separated dataset sizes instead of the defaults (development)")
    parser.add_argument("--replies", type=int, help="timed replies per size in section 1")
    parser.add_argument("--throughput-replies", type=int, help="replies per phase in section 2")
    parser.add_argument("--locomo-conversations", type=int, help="only the first N LoCoMo conversations")
    parser.add_argument(
        "--sections",
        help="comma-separated subset of recall,throughput,locomo,crowd,e2e; the others are kept from bench/results.json",
    )
    parser.add_argument("--locomo-variants", help="comma-separated subset of the LoCoMo variants (development)")
    parser.add_argument("--crowd-variants", help="comma-separated subset of the crowded-server variants (development)")
    parser.add_argument("--crowd-limits", help="unlimited and/or limit100 (development; both by default)")
    parser.add_argument("--e2e-size", choices=tuple(e2e.SIZES),
                        help="section 5: quick (1 session, 4 questions), tiny (2 sessions of 1 conversation),"
                        " small (2 sessions of 2 conversations; the default), full (every LoCoMo conversation)")
    parser.add_argument("--e2e-baselines",
                        help=f"section 5: comma-separated subset of {','.join(b.name for b in e2e.BASELINES)}"
                        " (run in that order; gold needs defaults)")
    parser.add_argument("--e2e-no-judge", action="store_true",
                        help="section 5: score answers by token F1 only (no judge calls; for a judge too small to trust)")
    parser.add_argument("--e2e-skip-checks", action="store_true",
                        help="section 5: report without asking the judge to check the matching rule and itself (a run cut short)")
    parser.add_argument("--e2e-fresh", action="store_true",
                        help="section 5: forget the run's state and recorded model calls and start again")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-locomo", action="store_true")
    parser.add_argument("--explain", action="store_true", help="print EXPLAIN ANALYZE of the search at each size")
    parser.add_argument("--no-md", action="store_true", help="do not refresh the generated block of docs/benchmarks.md")
    args = parser.parse_args(argv)
    try:  # a misspelt baseline is refused before anything starts, not measured as "nothing"
        e2e.choose_baselines(args.e2e_baselines)
    except ValueError as exc:
        parser.error(str(exc))
    return args


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(main(parse(sys.argv[1:]))))
    except asyncio.CancelledError:  # SIGTERM or SIGHUP (bench.pg): the temporary server is already stopped and deleted
        say("Stopped by a signal; the benchmark's PostgreSQL was stopped and its folder deleted.")
        sys.exit(143)
