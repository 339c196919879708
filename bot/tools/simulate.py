"""`python -m bot simulate FILE.jsonl`: replay a scenario through the real memory core.

The format is specified in docs/scenarios.md. Every run
gets an empty database of its own on the configured server and drops it afterwards. The whole
file is checked before anything runs, so a typo on line 40 costs nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date
from typing import Any

import numpy as np

from bot.clock import ManualClock
from bot.config import Settings
from bot.db import (
    throwaway_database,
)
from bot.embeddings.providers import BuiltinEmbedder, DeadlineEmbedder, EmbeddingError, EmbeddingSpace, NoEmbedder
from bot.memory.models import Conversation, Memory, MemoryList, NewMemory, Source
from bot.memory.service import MemoryCore
from bot.servers.models import Actor, Privacy
from bot.services import open_services


class ScenarioError(ValueError):
    """Invalid scenario input; the message names the line."""


# op -> {field: (type or tuple of types, required)}
STR, BOOL, INT, NUM = str, bool, int, (int, float)
STR_LIST = "list[str]"
SCHEMA: dict[str, dict[str, tuple[Any, bool]]] = {
    "settings": {
        "decay_enabled": (BOOL, False),
        "dormant_after_days": (INT, False),
        "max_used": (INT, False),
        "max_recalled": (INT, False),
        "min_similarity": (NUM, False),
        "lexical_weight": (NUM, False),
        "server_memory_limit": (INT, False),
        "personal_memory_limit": (INT, False),
        "embedder": (STR, False),
    },
    "date": {"utc": (STR, True)},
    "save": {
        "as": (STR, True),
        "list": (STR, True),
        "guild": (STR, False),
        "by": (STR, True),
        "text": (STR, True),
        "owner": (STR, False),
        "global": (BOOL, False),
        "via": (STR, False),
        "tags": (STR_LIST, False),
        "channels": (STR_LIST, False),
    },
    "edit": {"memory": (STR, True), "text": (STR, True), "via": (STR, False)},
    "delete": {"memory": (STR, True)},
    "message": {
        "guild": (STR, False),
        "channel": (STR, False),
        "author": (STR, True),
        "text": (STR, True),
        "participants": (STR_LIST, False),
        "context": (STR_LIST, False),
    },
    "embeddings": {"available": (BOOL, True)},
    "privacy": {"user": (STR, True), "level": (STR, True)},
    "block": {"guild": (STR, True), "user": (STR, True), "blocked": (BOOL, True)},
    "server": {"guild": (STR, True), "tagging": (BOOL, False), "personal_memories": (BOOL, False)},
}
CHOICES = {
    ("save", "list"): ("server", "personal"),
    ("save", "via"): ("bot", "command", "import"),
    ("edit", "via"): ("command", "bot"),
    ("privacy", "level"): ("none", "partial", "full"),
    ("settings", "embedder"): ("builtin", "none"),
}
SETTING_FIELDS = {
    "decay_enabled": "memory_decay_enabled",
    "dormant_after_days": "dormant_after_days",
    "max_used": "max_used",
    "max_recalled": "max_recalled",
    "min_similarity": "min_similarity",
    "lexical_weight": "lexical_weight",
    "server_memory_limit": "server_memory_limit",
    "personal_memory_limit": "personal_memory_limit",
}


def _type_ok(value: Any, expected: Any) -> bool:
    if expected == STR_LIST:
        return isinstance(value, list) and all(isinstance(item, str) for item in value)
    if (expected is INT or expected == NUM) and isinstance(value, bool):
        return False
    return isinstance(value, expected)


def _type_name(expected: Any) -> str:
    return {STR: "a string", BOOL: "true or false", INT: "an integer", NUM: "a number", STR_LIST: "a list of strings"}[
        expected
    ]


def parse_scenario(lines: Iterable[str]) -> list[tuple[int, dict[str, Any]]]:
    """(line number, step) pairs, or ScenarioError naming the first bad line."""
    steps: list[tuple[int, dict[str, Any]]] = []
    labels: set[str] = set()
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        where = f"line {number}"
        try:
            step = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ScenarioError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(step, dict):
            raise ScenarioError(f"{where}: each line must be a JSON object")
        op = step.get("op")
        if op not in SCHEMA:
            raise ScenarioError(f"{where}: unknown op {op!r}; expected one of {', '.join(SCHEMA)}")
        if op == "settings" and steps:
            raise ScenarioError(f"{where}: a settings step may only be the first step")
        fields = SCHEMA[op]
        for name, value in step.items():
            if name in ("op", "expect"):
                continue
            if name not in fields:
                raise ScenarioError(f"{where}: op {op!r} has no field {name!r}; its fields are {', '.join(fields)}")
            expected, _ = fields[name]
            if not _type_ok(value, expected):
                raise ScenarioError(f"{where}: field {name!r} must be {_type_name(expected)}, got {json.dumps(value)}")
            allowed = CHOICES.get((op, name))
            if allowed and value not in allowed:
                raise ScenarioError(f"{where}: field {name!r} must be one of {', '.join(allowed)}, got {value!r}")
        for name, (_, required) in fields.items():
            if required and name not in step:
                raise ScenarioError(f"{where}: op {op!r} needs the field {name!r}")
        if op == "date":
            try:
                date.fromisoformat(step["utc"])
            except ValueError:
                raise ScenarioError(f"{where}: utc must be a date like 2026-03-02, got {step['utc']!r}") from None
        if op == "save":  # a label used twice is checked while running: only a save that stored a memory claims it
            if step["list"] == "server" and "guild" not in step:
                raise ScenarioError(f"{where}: a server memory needs the field 'guild'")
            if step["list"] == "personal" and "owner" not in step:
                raise ScenarioError(f"{where}: a personal memory needs the field 'owner'")
            labels.add(step["as"])
        if op in ("edit", "delete") and step["memory"] not in labels:
            raise ScenarioError(f"{where}: unknown memory label {step['memory']!r}")
        if op == "settings":
            for name in ("dormant_after_days", "max_used", "server_memory_limit", "personal_memory_limit"):
                if name in step and step[name] < 1:
                    raise ScenarioError(f"{where}: {name} must be at least 1")
            for name in ("max_recalled", "lexical_weight"):
                if name in step and step[name] < 0:
                    raise ScenarioError(f"{where}: {name} must be 0 or more")
        steps.append((number, step))
    return steps


class SwitchableEmbedder:
    """The scenario's embedder, which an `embeddings` step can make fail on purpose."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.available = True

    @property
    def space(self) -> EmbeddingSpace | None:
        space: EmbeddingSpace | None = self.inner.space
        return space

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not self.available:
            raise EmbeddingError("the embedding provider is unavailable (scenario)")
        vectors: np.ndarray = await self.inner.embed(texts)
        return vectors


@dataclass
class Names:
    """Free names in the scenario mapped to stable numeric ids, one namespace per kind."""

    ids: dict[tuple[str, str], int] = field(default_factory=dict)

    def __call__(self, kind: str, name: str) -> int:
        key = (kind, name)
        if key not in self.ids:
            self.ids[key] = 1000 * (1 + ("guild", "channel", "user").index(kind)) + len(self.ids) + 1
        return self.ids[key]


def _state(core: MemoryCore, memory: Memory) -> dict[str, Any]:
    return {
        "days_unused": memory.days_unused,
        "state": "dormant" if core.is_dormant(memory) else "active",
        "protected": memory.protected,
    }


@dataclass
class ScenarioRun:
    """One scenario's steps against a core: each op a method, each step's result line emitted after it."""

    core: MemoryCore
    clock: ManualClock
    embedder: SwitchableEmbedder
    names: Names = field(default_factory=Names)
    label_of: dict[int, str] = field(default_factory=dict)
    id_of: dict[str, int] = field(default_factory=dict)
    claimed: set[str] = field(default_factory=set)  # labels of saves that stored a memory (a rejected save leaves its label free)

    async def step(self, number: int, step: dict[str, Any], out: dict[str, Any]) -> None:
        op = step["op"]
        names, core = self.names, self.core
        if op == "date":
            self.clock.set_date(date.fromisoformat(step["utc"]))
        elif op == "embeddings":
            self.embedder.available = step["available"]
        elif op == "save":
            await self.save(number, step, out)
        elif op in ("edit", "delete"):
            await self.change(number, step, out)
        elif op == "message":
            await self.message(step, out)
        elif op == "privacy":
            await core.servers.set_privacy(names("user", step["user"]), Privacy(step["level"]))
        elif op == "block":
            await core.servers.set_blocked(names("guild", step["guild"]), names("user", step["user"]), step["blocked"])
        elif op == "server":
            changes = {key: step[key] for key in ("tagging", "personal_memories") if key in step}
            if changes:
                admin = Actor(names("user", "admin"), can_manage=True)  # the scenario's author runs its servers
                await core.servers.update_guild_settings(names("guild", step["guild"]), admin, **changes)

    async def save(self, number: int, step: dict[str, Any], out: dict[str, Any]) -> None:
        names = self.names
        if step["as"] in self.claimed:
            raise ScenarioError(f"line {number}: the label {step['as']!r} is already used by an earlier save")
        memory_list = MemoryList(step["list"])
        result = await self.core.save(
            NewMemory(
                list=memory_list,
                text=step["text"],
                by=names("user", step["by"]),
                via=Source(step.get("via", "bot")),
                guild_id=names("guild", step["guild"]) if "guild" in step else None,
                owner_id=names("user", step["owner"]) if memory_list == MemoryList.PERSONAL else None,
                is_global=step.get("global", False),
                tags=tuple(step.get("tags", ())),
                channel_ids=tuple(names("channel", channel) for channel in step.get("channels", ())),
                by_can_manage=True,  # scenarios have no roles: people act as the server's admins
            )
        )
        if result.saved is not None:
            self.claimed.add(step["as"])
            self.label_of[result.saved.id] = step["as"]
            self.id_of[step["as"]] = result.saved.id
        forgotten = [self.label_of.get(memory.id) for memory in result.forgotten]
        out |= {
            "saved": step["as"] if result.saved else None,
            "forgotten": forgotten[0] if forgotten else None,
            "rejected": result.rejected.value if result.rejected else None,
        }
        for merge in result.merged:  # the absorbed label is gone; its text lives on in the kept memory
            absorbed = self.label_of.pop(merge.absorbed.id, None)
            self.id_of.pop(absorbed or "", None)
            out.setdefault("merged", []).append([absorbed, self.label_of.get(merge.kept.id)])

    async def change(self, number: int, step: dict[str, Any], out: dict[str, Any]) -> None:
        label = step["memory"]
        if label not in self.id_of:
            raise ScenarioError(f"line {number}: memory {label!r} does not exist (it was never saved, or was forgotten)")
        memory_id = self.id_of[label]
        if step["op"] == "edit":
            via = Source(step.get("via", "command"))
            result = await self.core.edit(memory_id, step["text"], by=0, via=via, by_can_manage=True)
        else:
            result = await self.core.delete(memory_id, by=0, via=Source.COMMAND, by_can_manage=True)
        if result.rejected is not None:
            raise ScenarioError(f"line {number}: {step['op']} of {label!r} was refused: {result.detail}")
        out["rejected"] = None

    async def message(self, step: dict[str, Any], out: dict[str, Any]) -> None:
        names = self.names
        guild = names("guild", step["guild"]) if "guild" in step else None
        author = names("user", step["author"])
        channel = names("channel", step.get("channel", "general" if guild else f"dm:{step['author']}"))
        if self.embedder.available:  # what the background re-embedder would have done by now
            await self.core.reembed_missing()
        recall = await self.core.reply_search(
            Conversation(
                guild_id=guild,
                channel_id=channel,
                author_id=author,
                text=step["text"],
                participant_ids=tuple(names("user", user) for user in step.get("participants", ())),
                context_texts=tuple(step.get("context", ())),
            )
        )
        out |= {
            "search": "ok" if recall.search_ok else "failed",
            "used": [self.label_of.get(s.memory.id) for s in recall.used],
            "recalled": [self.label_of.get(s.memory.id) for s in recall.recalled],
            "desk": [self.label_of.get(m.id) for m in recall.desk],
        }

    async def memories(self) -> dict[str, Any]:
        """Every labelled memory's state after a step; labels of memories gone since are freed."""
        memories = await self.core.all_memories()
        existing = {memory.id for memory in memories}
        for memory_id in [i for i in self.id_of.values() if i not in existing]:
            del self.id_of[self.label_of.pop(memory_id)]
        return {self.label_of[m.id]: _state(self.core, m) for m in memories if m.id in self.label_of}


async def run_steps(
    steps: list[tuple[int, dict[str, Any]]],
    core: MemoryCore,
    clock: ManualClock,
    embedder: SwitchableEmbedder,
    emit: Callable[[dict[str, Any]], None],
) -> None:
    run = ScenarioRun(core, clock, embedder)
    for index, (number, step) in enumerate(steps, start=1):
        out: dict[str, Any] = {"step": index, "op": step["op"]}
        await run.step(number, step, out)
        out["memories"] = await run.memories()
        emit(out)


RULE_SETTINGS = ("dormant_after_days", "max_used", "max_recalled", "lexical_weight", "min_similarity", "desk_refresh",
                 "server_memory_limit", "personal_memory_limit")


def ran_with(settings: Settings) -> str:
    """The settings of the memory rules a run used, as environment variables: a scenario's results depend on them,
    and a scenario that relies on a default should say it with a `settings` step."""
    return "settings " + " ".join(f"{name.upper()}={getattr(settings, name)}" for name in RULE_SETTINGS)


def scenario_settings(base: Settings, steps: list[tuple[int, dict[str, Any]]]) -> tuple[Settings, str]:
    """The run's settings and embedder name after the optional first `settings` step."""
    if not steps or steps[0][1]["op"] != "settings":
        return base, "builtin"
    step = steps[0][1]
    overrides = {SETTING_FIELDS[key]: value for key, value in step.items() if key in SETTING_FIELDS}
    return base.with_overrides(**overrides), step.get("embedder", "builtin")


async def simulate(
    lines: Iterable[str],
    base_settings: Settings,
    emit: Callable[[dict[str, Any]], None],
    builtin: BuiltinEmbedder | None = None,
) -> None:
    """Check the scenario, then run it on a throwaway database; raises ScenarioError or DatabaseError."""
    steps = parse_scenario(lines)
    settings, embedder_name = scenario_settings(base_settings, steps)
    inner = (builtin or BuiltinEmbedder()) if embedder_name == "builtin" else NoEmbedder()
    embedder = SwitchableEmbedder(DeadlineEmbedder(inner, max(settings.embedding_timeout_s, 30.0)))
    clock = ManualClock()
    async with (
        throwaway_database(settings, "simulation") as database,
        open_services(settings, database=database, embedder=embedder, clock=clock) as services,
    ):
        await run_steps(steps, services.core, clock, embedder, emit)
