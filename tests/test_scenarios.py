"""Scenario files replayed through `simulate`, each step checked against its `expect` object.

Our own scenarios live in tests/scenarios/; the reference ones in ../shared/scenarios/ run too
when that folder exists (a fresh clone without it skips them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bot.config import Settings
from bot.tools.simulate import ScenarioError, parse_scenario, ran_with, scenario_settings, simulate
from tests.conftest import SHARED

OWN = sorted((Path(__file__).parent / "scenarios").glob("*.jsonl"))
REFERENCE = sorted((SHARED / "scenarios").glob("*.jsonl")) if (SHARED / "scenarios").is_dir() else []
ROOT = Path(__file__).resolve().parents[1]


def mismatches(expected: Any, actual: Any, path: str = "") -> list[str]:
    """Where `actual` differs from `expected`; dicts compare as subsets, everything else exactly."""
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return [f"{path or 'line'}: expected an object, got {actual!r}"]
        problems: list[str] = []
        for key, value in expected.items():
            if key not in actual:
                problems.append(f"{path}.{key}: missing")
            else:
                problems.extend(mismatches(value, actual[key], f"{path}.{key}"))
        return problems
    return [] if expected == actual else [f"{path}: expected {expected!r}, got {actual!r}"]


async def run_and_check(path: Path, server_url: str, embedder: Any) -> None:
    lines = path.read_text(encoding="utf-8").splitlines()  # noqa: ASYNC240 - a small local file
    steps = [json.loads(line) for line in lines if line.strip()]
    output: list[dict[str, Any]] = []
    await simulate(lines, Settings(database_url=server_url), output.append, builtin=embedder)
    assert len(output) == len(steps)
    problems = []
    for number, (step, line) in enumerate(zip(steps, output, strict=True), start=1):
        assert line["step"] == number and line["op"] == step["op"]
        problems += [f"step {number}{p}" for p in mismatches(step.get("expect", {}), line)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", OWN, ids=[p.name for p in OWN])
async def test_own_scenarios(path: Path, pg_server_url: str, builtin_embedder: Any) -> None:
    await run_and_check(path, pg_server_url, builtin_embedder)


@pytest.mark.skipif(not REFERENCE, reason="../shared/scenarios is not present in this checkout")
@pytest.mark.parametrize("path", REFERENCE, ids=[p.name for p in REFERENCE])
async def test_reference_scenarios(path: Path, pg_server_url: str, builtin_embedder: Any) -> None:
    await run_and_check(path, pg_server_url, builtin_embedder)


def test_every_own_scenario_checks_something() -> None:
    assert len(OWN) >= 2
    for path in OWN:
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        assert any("expect" in line for line in lines), f"{path.name} has no expectations"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"op": "date", "utc": "2026-01-01"}\n{"op": "mesage"}', "line 2: unknown op 'mesage'"),
        ('{"op": "date", "utc": "2026-01-01"\n', "line 1: not valid JSON"),
        ('{"op": "date", "utc": 20260101}', "line 1: field 'utc' must be a string"),
        ('{"op": "delete", "memory": "ghost"}', "line 1: unknown memory label 'ghost'"),
        ('{"op": "date", "utc": "2026-13-01"}', "line 1: utc must be a date"),
        (
            '{"op": "date", "utc": "2026-01-01"}\n{"op": "settings", "max_used": 2}',
            "line 2: a settings step may only be the first",
        ),
        (
            '{"op": "save", "as": "a", "list": "server", "by": "x", "text": "t"}',
            "line 1: a server memory needs the field 'guild'",
        ),
        ('{"op": "message", "author": "x", "text": "hi", "participants": "bau"}', "line 1: field 'participants' must be a list"),
        ('{"op": "settings", "max_used": true}', "line 1: field 'max_used' must be an integer"),
        ('{"op": "privacy", "user": "x", "level": "total"}', "line 1: field 'level' must be one of none, partial, full"),
    ],
)
async def test_invalid_scenarios_name_the_line(content: str, message: str, pg_server_url: str) -> None:
    with pytest.raises(ScenarioError, match=message.replace("(", r"\(")):
        await simulate(content.splitlines(), Settings(database_url=pg_server_url), lambda _: None)


def _run_cli(args: list[str], server_url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": server_url}
    return subprocess.run(
        [sys.executable, "-m", "bot", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def test_cli_invalid_input_exits_2_without_traceback(tmp_path: Path, pg_server_url: str) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"op": "date", "utc": "2026-01-01"}\n{"op": "save", "as": "m"}\n')
    result = _run_cli(["simulate", str(bad)], pg_server_url)
    assert result.returncode == 2
    assert "line 2" in result.stderr and "needs the field" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_cli_prints_one_json_line_per_step(pg_server_url: str) -> None:
    path = OWN[0]
    result = _run_cli(["simulate", str(path)], pg_server_url)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["step"] for line in lines] == list(range(1, len(lines) + 1))
    assert len(lines) == sum(1 for line in path.read_text().splitlines() if line.strip())


SAVE = '{{"op": "save", "as": "{label}", "list": "server", "guild": "g", "by": "x", "text": "{text}"{extra}}}'


async def test_a_rejected_save_does_not_claim_its_label(pg_server_url: str, builtin_embedder: Any) -> None:
    """The list is full of protected memories, so the first save of 'z' is refused; after a delete makes room,
    a save under the same label is a new save, not a second use of the label."""
    lines = [
        '{"op": "settings", "server_memory_limit": 1}',
        SAVE.format(label="a", text="Movie night is on Fridays", extra=', "via": "command"'),
        SAVE.format(label="z", text="The raid is on Thursday", extra=""),
        '{"op": "delete", "memory": "a"}',
        SAVE.format(label="z", text="The raid is on Thursday", extra=""),
    ]
    out: list[dict[str, Any]] = []
    await simulate(lines, Settings(database_url=pg_server_url), out.append, builtin=builtin_embedder)
    assert [line.get("saved") for line in out if line["op"] == "save"] == ["a", None, "z"]
    assert out[2]["rejected"] is not None
    assert list(out[-1]["memories"]) == ["z"]


async def test_a_label_that_stored_a_memory_cannot_be_used_again(pg_server_url: str, builtin_embedder: Any) -> None:
    lines = [SAVE.format(label="a", text="Movie night is on Fridays", extra=""),
             SAVE.format(label="a", text="The raid is on Thursday", extra="")]
    with pytest.raises(ScenarioError, match="line 2: the label 'a' is already used by an earlier save"):
        await simulate(lines, Settings(database_url=pg_server_url), lambda _: None, builtin=builtin_embedder)


def test_simulate_says_the_rule_settings_it_runs_with() -> None:
    """A scenario's results depend on the rule settings; the ones SPEC's values rely on are set in the file."""
    worked = (Path(__file__).parent / "scenarios" / "worked-example.jsonl").read_text().splitlines()
    settings, _ = scenario_settings(Settings(), parse_scenario(worked))
    line = ran_with(settings)
    assert "MAX_USED=3 " in line and "DORMANT_AFTER_DAYS=7 " in line
    assert f"MAX_USED={Settings().max_used} " in ran_with(Settings())
