"""The machine string, the readable table, `bench/results.json`, and the generated block of docs/benchmarks.md."""

from __future__ import annotations

import json
import os
import platform
import re
from pathlib import Path
from typing import Any

import psutil

RESULTS = Path(__file__).resolve().parent / "results.json"
BENCHMARKS_MD = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
START, END = "<!-- bench:results:start -->", "<!-- bench:results:end -->"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(postgres: str) -> str:
    ram = psutil.virtual_memory().total / 2**30
    return (
        f"{cpu_model()}, {os.cpu_count()} cores, {ram:.0f} GB RAM, {platform.system()} {platform.release()},"
        f" Python {platform.python_version()}, {postgres}"
    )


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None or value == "":
        return "–"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _size(key: str) -> str:
    n = int(key)
    return f"{n // 1_000_000}M" if n >= 1_000_000 else f"{n // 1000}k"


def table(results: dict[str, Any]) -> str:
    """Markdown tables: readable on a terminal and pasted as is into docs/benchmarks.md."""
    quick = " (quick run)" if results.get("quick") else ""
    dates = results.get("dates", {})
    when = results.get("date", "")
    if len(set(dates.values())) > 1:
        when = ", ".join(f"{section} {date}" for section, date in sorted(dates.items()))
    lines = [f"Machine: {results['machine']}", f"Date: {when}{quick}", ""]
    lines += [
        "### 1. Per-reply search vs bare top-k (ms; ratio = recall p50 / top-k p50)",
        "",
        "| memories | recall p50 | recall p99 | top-k p50 | ratio | first-of-day p50 / ratio | later p50 / ratio"
        " | core / statement / top-k |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for size, r in results.get("recall", {}).items():
        first, later, parts = r.get("first_of_day", {}), r.get("later", {}), r.get("breakdown", {})
        split = " / ".join(_fmt(parts.get(f"{side}_ms_p50"), 3) for side in ("core", "statement", "topk")) if parts else "–"
        lines.append(
            f"| {_size(size)} | {_fmt(r['recall_ms_p50'], 3)} | {_fmt(r['recall_ms_p99'], 3)} | {_fmt(r['topk_ms_p50'], 3)}"
            f" | **{_fmt(r['ratio_p50'])}** | {_fmt(first.get('recall_ms_p50'), 3)} / {_fmt(first.get('ratio_p50'))}"
            f" | {_fmt(later.get('recall_ms_p50'), 3)} / {_fmt(later.get('ratio_p50'))} | {split} |"
        )
    t = results.get("throughput", {})
    cpu_ms = t.get("cpu_ms_per_reply", {})
    over = t.get("cpu_warnings", {})  # figures above their recorded value (bench.throughput.RECORDED_CPU_MS)
    cpu = " / ".join(_fmt(cpu_ms.get(k), 1) + (" ⚠" if k in over else "") for k in ("core_path", "pipeline", "whatif")) \
        if cpu_ms else "–"
    t1 = results.get("throughput_embed_threads_1", {})
    one_thread = (
        f"{_fmt(t1.get('replies_per_s'), 1)} / {_fmt(t1.get('whatif_replies_per_s'), 1)}, {_fmt(t1.get('embed_ms_p50'), 2)}"
        if t1 else "–"
    )
    lines += [
        "",
        "### 2. Throughput and footprint",
        "",
        "| figure | value | target |",
        "|---|---:|---:|",
        f"| replies/s, whole pipeline with a chat stub, {t.get('in_flight', 50)} in flight, {t.get('servers', 20)} servers"
        f" | **{_fmt(results.get('replies_per_s'), 1)}** | ≥ 300 |",
        f"| replies/s, core path only (embed + search + prompt) | {_fmt(t.get('core_path_replies_per_s'), 1)} | |",
        f"| replies/s, pipeline {t.get('whatif', 'with the three proposed changes')} (what-if)"
        f" | {_fmt(t.get('whatif_replies_per_s'), 1)} | |",
        f"| bot process CPU per reply, core path / pipeline / what-if (ms) | {cpu} | |",
        f"| built-in model: texts per call under the pipeline's load (micro-batching)"
        f" | {_fmt(t.get('texts_per_model_call'), 1)} | |",
        f"| with the embedder on 1 BLAS thread (what-if): pipeline / what-if replies/s, one message p50 ms"
        f" | {one_thread} | |",
        f"| built-in embedder, one message, p50 (ms) | **{_fmt(results.get('embed_ms_p50'), 2)}** | ≤ 5 |",
        f"| built-in embedder, batches of 64 (texts/s) | **{_fmt(results.get('embed_batch_per_s'), 0)}** | |",
        f"| peak RSS of the bot process (MB) | **{_fmt(results.get('rss_mb'), 0)}** | ≤ 400 |",
    ]
    lines += [f"\n⚠ {warning}" for warning in over.values()]
    locomo = results.get("locomo", {})
    lines += ["", "### 3. LoCoMo (every turn a reply; questions of categories 1–4 the day after the last session)", ""]
    if not locomo:
        lines.append(results.get("locomo_note", "not run"))
    else:
        lines += [
            "| variant | gold in prompt | all gold | memory tok/reply | question memory tok | prefix stable | same day"
            " | billed tok/reply | forgotten | rejected | merged (per day) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name, r in locomo.items():
            label = f"{name} *(prototype)*" if r.get("prototype") else name
            cells = [
                _fmt(r["gold_in_prompt"], 3), _fmt(r["all_gold_rate"], 3), _fmt(r["memory_tokens_per_reply"], 0),
                _fmt(r["question_memory_tokens"], 0), _fmt(r["prefix_stable"], 3), _fmt(r["prefix_stable_same_day"], 3),
                _fmt(r["billed_tokens_per_reply"], 0), str(r["forgotten"]), str(r["rejected"]), _merged(r),
            ]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        first = next(iter(locomo.values()))
        scored, skipped = first.get("questions", 0), first.get("skipped_questions", 0)
        lines.append(f"\n{first.get('replies', 0):,} replies, {scored:,} questions scored; {skipped} skipped (no gold fact).")
        if results.get("locomo_note"):
            lines.append(results["locomo_note"])
    lines += crowd_table(results)
    lines += e2e_table(results)
    return "\n".join(lines)


def _merged(r: dict[str, Any]) -> str:
    """Memories joined to make room, and per list owner's chat day ("–" for runs from before merging existed)."""
    if "merged" not in r:
        return "–"
    return f"{r['merged']:,} ({_fmt(r.get('merges_per_day'), 2)})"


def crowd_table(results: dict[str, Any]) -> list[str]:
    """Section 4: each variant with unlimited lists and (`_l100`) the default limit of 100."""
    crowd = results.get("crowd", {})
    lines = ["", "### 4. A crowded server (10 people, one channel, MEMORY_TOKEN_BUDGET 4000; questions the day after)", ""]
    if not crowd:
        return [*lines, results.get("crowd_note") or "not run"]
    lines += [
        "| variant | gold in prompt | all gold | memory tok/reply | billed tok/reply | prefix stable | same day"
        " | desk built / shown | used dropped | recalled dropped | gold by position 0–4 | fairness | fairness, held gold"
        " | gold forgotten / rejected | merged (per day) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for name, r in crowd.items():
        positions = " / ".join(_fmt(value, 2) for value in r["gold_by_position"].values())
        cells = [
            _fmt(r["gold_in_prompt"], 3), _fmt(r["all_gold_rate"], 3), _fmt(r["memory_tokens_per_reply"], 0),
            _fmt(r["billed_tokens_per_reply"], 0), _fmt(r["prefix_stable"], 3), _fmt(r["prefix_stable_same_day"], 3),
            f"{_fmt(r['desk_built_per_reply'], 0)} / {_fmt(r['desk_shown_per_reply'], 0)}",
            _fmt(r["used_dropped_per_reply"], 2), _fmt(r["recalled_dropped_per_reply"], 2), positions,
            _fmt(r["fairness"], 2), _fmt(r.get("fairness_held"), 2),
            f"{_fmt(r['gold_forgotten'], 3)} / {_fmt(r.get('gold_rejected'), 3)}", _merged(r),
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    first = next(iter(crowd.values()))
    lines.append(f"\n{first.get('replies', 0):,} replies, {first.get('questions', 0):,} questions scored per variant;"
                 " used / recalled dropped = per reply, matched memories the budget kept out of the prompt;"
                 " fairness = lowest / highest gold by position; held gold = the same over the gold the lists still held.")
    if results.get("crowd_note"):
        lines.append(results["crowd_note"])
    return lines


CATEGORY_NAMES = {"1": "multi-hop", "2": "temporal", "3": "open-domain", "4": "single-hop"}


def _share(part: float, whole: float) -> str:
    return f"{part / whole:.3f}" if whole else "–"


def e2e_table(results: dict[str, Any]) -> list[str]:
    """Section 5: one block per model and size measured (`e2e_runs`; older results: the one `e2e` run)."""
    lines = ["", "### 5. End to end with a real chat model (saving through the bot, answering the day after)"]
    runs = list((results.get("e2e_runs") or {}).values()) or ([results["e2e"]] if results.get("e2e") else [])
    if not runs:
        return [*lines, "", results.get("e2e_note") or "not run"]
    for e2e in runs:
        lines += e2e_run_table(e2e)
    return lines


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def e2e_run_table(e2e: dict[str, Any]) -> list[str]:
    """One model's run: what it saved (the replays where the model saves), every baseline's answers, and the cost."""
    lines = [""]
    quant = f", {e2e['quantisation']}" if e2e.get("quantisation") else ""
    sessions = e2e.get("sessions_per_conversation") or "all"
    lines.append(
        f"Model {e2e['model']}{quant} at {e2e['endpoint']}; judge {e2e['judge_model']}; size `{e2e['size']}`:"
        f" {_plural(len(e2e['conversations']), 'conversation')} ({', '.join(e2e['conversations'])}), {sessions} sessions"
        f" each, {e2e['chat_days']} chat days, {e2e['facts']} gold facts, {e2e['questions']} questions"
        f" ({e2e['skipped_questions']} without a gold fact skipped); temperature 0, seed {e2e['seed']}."
    )
    baselines = e2e.get("baselines", {})
    savers = {name: b for name, b in baselines.items() if name in ("defaults", "tools_only")}
    if savers:
        lines += ["", "| saving (the model's replay) | " + " | ".join(f"`{name}`" for name in savers) + " |",
                  "|---|" + "---:|" * len(savers)]
        for label, cell in SAVING_ROWS:
            lines.append(f"| {label} | " + " | ".join(cell(b, max(e2e["chat_days"], 1)) for b in savers.values()) + " |")
    lines += [
        "",
        "| baseline | J (judge yes) [95% CI] | F1 [95% CI] | J (F1 when not judged): multi-hop / temporal / open-domain"
        " / single-hop"
        " | gold facts saved | gold in prompt | J when all gold in prompt | prompt tok / question | failed |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for name, b in baselines.items():
        a = b["answering"]
        categories = " / ".join(
            f"{_fmt(a['by_category'][c]['j'] if a.get('j') is not None else a['by_category'][c]['f1'], 2)}"
            f" ({a['by_category'][c]['n']})" if c in a["by_category"] else "–"
            for c in CATEGORY_NAMES
        )
        when = a["all_gold_in_prompt"]
        lines.append(
            f"| {name} | {_judged(a)} | {_fmt(a['f1'], 3)}"
            f" [{a['f1_ci'][0]:.2f}–{a['f1_ci'][1]:.2f}] | {categories} | {_fmt(a['gold_saved'], 3)}"
            f" | {_fmt(a['gold_in_prompt'], 3)} | {_fmt(when['j'], 3)} ({when['n']}) | {a['prompt_tokens']:,} | {a['failed']} |"
        )
    lines += [
        "",
        "| baseline | measured (UTC) | load average start → end | model calls made / answered from the recording"
        " | seconds per call when made: replies / day-end / answers |",
        "|---|---|---|---:|---|",
    ]
    for name, b in baselines.items():
        lines.append(f"| {name} | " + " | ".join(_cost(b)) + " |")
    check = e2e.get("judge_check") or {}
    agreed = (
        f"The judge agreed with the hand-checked judgements of tests/data/e2e_judgements.jsonl"
        f" {check['agree']} / {check['judgements']} times."
        if check else "The judge was not checked against the hand-checked judgements in this run."
    )
    lines.append(
        f"\n{e2e['questions']} questions per baseline; intervals: Wilson (J), seeded bootstrap (F1). {agreed}"
        f" Time waiting for the models: {e2e.get('model_minutes', '–')} min (every recorded call of the run, when it was made)."
        " The load average is the whole machine's (other work may have run at the same time); a baseline measured"
        " before the per-baseline record existed shows –."
    )
    return lines


def _cost(b: dict[str, Any]) -> list[str]:
    """When a baseline was measured, under what load, and what its model calls cost when they were made."""
    measured = b.get("measured") or {}
    when = f"{measured['date']} – {measured['ended'][-9:-4]}" if measured else "–"
    load = f"{measured['load_average']} → {measured['load_average_end']}" if measured else "–"
    calls = b.get("calls", {})
    made = sum(c.get("calls", 0) - c.get("replayed", 0) for c in calls.values())
    replayed = sum(c.get("replayed", 0) for c in calls.values())

    def per_call(phase: str) -> str:
        c = calls.get(phase, {})
        return f"{c['model_seconds'] / c['calls']:.0f} s ({c['calls']})" if c.get("calls") and "model_seconds" in c else "–"

    return [when, load, f"{made} / {replayed}", " / ".join(per_call(p) for p in ("reply", "day-end", "answer"))]


def _covered(b: dict[str, Any], _: int) -> str:
    s = b["saving"]
    low, high = wilson_interval(s["covered"], s["facts"])
    return f"**{s['covered']} / {s['facts']} ({_share(s['covered'], s['facts'])})**, 95% CI {low:.2f}–{high:.2f}"


def _per_day(phase: str, tokens: bool) -> Any:
    def cell(b: dict[str, Any], days: int) -> str:
        c = b.get("calls", {}).get(phase, {})
        value = (c.get("prompt_tokens", 0) + c.get("completion_tokens", 0)) if tokens else c.get("calls", 0)
        return f"{value / days:,.0f}" if tokens else f"{value / days:.1f}"
    return cell


SAVING_ROWS: tuple[tuple[str, Any], ...] = (
    ("gold facts covered by a memory of the right person", _covered),
    ("gold facts covered by any memory (any list, any person)",
     lambda b, _: f"{b['saving']['covered_any']} / {b['saving']['facts']}"),
    ("memories stored (personal / server)",
     lambda b, _: f"{b['saving']['memories']} ({b['saving']['personal']} / {b['saving']['server']})"),
    ("memories by source",
     lambda b, _: ", ".join(f"{k} {v}" for k, v in sorted(b["saving"].get("by_source", {}).items())) or "–"),
    ("share of stored memories that match no gold fact", lambda b, _: _share(b["saving"]["unmatched"], b["saving"]["memories"])),
    ("memories about the wrong person", lambda b, _: str(b["saving"]["wrong_person"])),
    ("duplicates (a memory repeating an earlier one of its list)", lambda b, _: str(b["saving"]["duplicates"])),
    ("replies per chat day (the bot was addressed)", lambda b, days: f"{b['replay']['replies'] / days:.1f}"),
    ("model calls per chat day: replies", _per_day("reply", False)),
    ("model calls per chat day: day-end work", _per_day("day-end", False)),
    ("tokens per chat day (prompt + completion): replies", _per_day("reply", True)),
    ("tokens per chat day (prompt + completion): day-end work", _per_day("day-end", True)),
    ("memory changes made by tool calls", lambda b, _: str(b["replay"]["tool_changes"])),
    ("judge agrees with the matching rule (pairs near the threshold)", lambda b, _: _agreement(b["saving"].get("judge_check"))),
)


def _judged(a: dict[str, Any]) -> str:
    return f"**{_fmt(a['j'], 3)}** [{a['j_ci'][0]:.2f}–{a['j_ci'][1]:.2f}]" if a.get("j") is not None else "not judged"


def _agreement(check: dict[str, Any] | None) -> str:
    return f"{check['agree']} / {check['pairs']}" if check else "not asked in this run"


def wilson_interval(successes: int, total: int) -> tuple[float, float]:
    from bench.e2e_score import wilson

    return wilson(successes, total)


def write_results(results: dict[str, Any]) -> None:
    RESULTS.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def update_benchmarks_md(results: dict[str, Any]) -> bool:
    """Replace the generated block of docs/benchmarks.md with the latest table; False if the markers are missing."""
    if not BENCHMARKS_MD.is_file():
        return False
    text = BENCHMARKS_MD.read_text(encoding="utf-8")
    if START not in text or END not in text:
        return False
    block = f"{START}\n{table(results)}\n{END}"
    updated = re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: block, text, flags=re.S)
    BENCHMARKS_MD.write_text(updated, encoding="utf-8")
    return True
