"""The benchmark says so when the bot's CPU per reply rises above the figure recorded in docs/benchmarks.md."""

from __future__ import annotations

from bench import report, throughput

RECORDED = throughput.RECORDED_CPU_MS


def test_a_heavier_reply_is_flagged_with_the_load_average_and_marked_in_the_table() -> None:
    cpu = {"core_path": RECORDED["core_path"], "pipeline": round(RECORDED["pipeline"] * 1.35, 1), "whatif": 1.0}
    warnings = throughput.cpu_warnings(cpu, [3.0, 2.5, 2.0])
    assert list(warnings) == ["pipeline"]
    assert f"above the recorded {RECORDED['pipeline']:.1f} ms (+35%; load average 3, 2.5, 2)" in warnings["pipeline"]
    table = report.table({"machine": "test", "throughput": {"cpu_ms_per_reply": cpu, "cpu_warnings": warnings}})
    assert f"| {RECORDED['core_path']:.1f} / {cpu['pipeline']:.1f} ⚠ / 1.0 |" in table
    assert f"⚠ {warnings['pipeline']}" in table


def test_a_figure_within_the_tolerance_is_not_flagged() -> None:
    cpu = {phase: recorded * (1 + throughput.CPU_TOLERANCE) for phase, recorded in RECORDED.items()}
    assert throughput.cpu_warnings(cpu, [0.5, 0.5, 0.5]) == {}
    table = report.table({"machine": "test", "throughput": {"cpu_ms_per_reply": cpu}})
    assert "⚠" not in table
