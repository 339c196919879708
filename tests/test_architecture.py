"""The layout holds: read from the source (AST), so breaking a rule fails here instead of in review.

- no import cycle between the bot's modules;
- a store (`store.py`, `*_store.py`: the SQL of one family of tables) is imported only by the
  package it belongs to, whose service owns those tables and their transactions;
- the pool is touched only by the services and the wiring;
- Discord is known only to the adapters (the cogs, the bot process, the command reference);
- the memory core imports nothing above it: only its own package, the servers' settings it reads,
  the embeddings service, and the few shared modules below both;
- chat history and documents are services of their own beside the memory core: they reach the
  embedder and the current embedding space through the embeddings service, never through `bot.memory`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bot", "cogs", "bench")

# Benchmarks that measure the search statement itself against a bare top-k, and fill databases with
# hundreds of thousands of synthetic rows; they read the SQL on purpose.
STORE_READERS = {"bench.recall", "bench.synth"}
POOL_HOLDERS = {
    "bot.db", "bot.services", "bot.embeddings.service", "bot.servers.service", "bot.chat.log",
    "bot.history.service", "bot.documents.service",
}
POOL_HOLDER_PACKAGES = ("bot.memory.", "bot.summaries.")
# The reply pipeline's adapters of chat history and documents: they read the search's result (`Recall`).
TAIL_SOURCES = {"bot.history.source", "bot.documents.source"}
DISCORD_ADAPTERS = {"bot.bot", "bot.tools.commands_doc"}
BELOW_THE_CORE = (
    "bot.memory", "bot.servers", "bot.config", "bot.db", "bot.errors", "bot.tokens", "bot.redact", "bot.ids", "bot.failures",
    "bot.embedded", "bot.embeddings", "bot.clock", "bot.lexical", "bot.texts",
)


def modules() -> dict[str, ast.Module]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            found[name] = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return found


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports(tree: ast.Module) -> Iterator[str]:
    """Every module a module imports at run time (also inside functions), not under `if TYPE_CHECKING`."""
    skipped = {id(child) for node in ast.walk(tree) if _type_checking_only(node) for child in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: {target for target in imports(tree) if target in known and target != name} for name, tree in known.items()}


def is_store(module: str) -> bool:
    leaf = module.rsplit(".", 1)[-1]
    return leaf == "store" or leaf.endswith("_store")


def test_there_is_no_import_cycle() -> None:
    edges = graph()
    state: dict[str, str] = {}
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for target in sorted(edges[node]):
            if state.get(target) == "open":
                cycles.append([*path[path.index(target):], target] if target in path else [node, target])
            elif target not in state:
                visit(target, [*path, target])
        state[node] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_each_store_is_imported_only_by_its_own_package() -> None:
    wrong = []
    for module, targets in graph().items():
        for target in targets:
            owner = target.rsplit(".", 1)[0]
            if is_store(target) and not module.startswith(owner + ".") and module not in STORE_READERS:
                wrong.append(f"{module} imports {target}")
    assert wrong == []


def test_only_the_services_touch_the_pool() -> None:
    wrong = []
    for module, tree in modules().items():
        if module in POOL_HOLDERS or module.startswith(POOL_HOLDER_PACKAGES) or module.startswith("bench."):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "pool":
                wrong.append(f"{module}:{node.lineno}")
    assert wrong == []


def test_discord_is_known_only_to_the_adapters() -> None:
    wrong = [
        f"{module} imports {target}"
        for module, tree in modules().items()
        if module.startswith("bot.") and module not in DISCORD_ADAPTERS
        for target in imports(tree)
        if target == "discord" or target.startswith("discord.")
    ]
    assert wrong == []


def test_the_memory_core_imports_nothing_above_it() -> None:
    above = {
        f"{module} imports {target}"
        for module, targets in graph().items()
        if module.startswith(("bot.memory.", "bot.servers."))
        for target in targets
        if not target.startswith(BELOW_THE_CORE)
    }
    servers_on_memory = {
        f"{module} imports {target}"
        for module, targets in graph().items()
        if module.startswith("bot.servers.")
        for target in targets
        if target.startswith("bot.memory")
    }
    assert above | servers_on_memory == set()


def test_history_and_documents_do_not_reach_into_the_memory_core() -> None:
    wrong = {
        f"{module} imports {target}"
        for module, targets in graph().items()
        if module.startswith(("bot.history.", "bot.documents.", "bot.embeddings.")) and module not in TAIL_SOURCES
        for target in targets
        if target == "bot.memory" or target.startswith("bot.memory.")
    }
    assert wrong == set()


# Classes allowed past 300 lines counting the classes of the bot they inherit from, and why. An entry that is
# no longer needed fails the test too.
LONG_CLASSES: dict[str, str] = {}  # none: a class that grows past the limit is split into parts it owns
CLASS_LINES = 300


def class_lines(trees: dict[str, ast.Module]) -> dict[str, int]:
    """Lines of every class of bot/ and cogs/ with those of the bot's own classes it inherits from (its mixins):
    a class built from parts that each stay under the limit is still one class to read."""
    classes: dict[str, tuple[ast.ClassDef, str]] = {}
    for module, tree in trees.items():
        if module.startswith(("bot.", "cogs.")):
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    classes.setdefault(node.name, (node, module))

    def lines(name: str, seen: frozenset[str] = frozenset()) -> int:
        node, _ = classes[name]
        own = (node.end_lineno or 0) - node.lineno + 1
        bases = {ast.unparse(base).rsplit(".", 1)[-1] for base in node.bases}
        return own + sum(lines(base, seen | {name}) for base in bases if base in classes and base not in seen)

    return {f"{module}.{name}": lines(name) for name, (_, module) in classes.items()}


def test_no_module_is_too_long_to_read() -> None:
    """No module above 600 lines and no class above 300 counting its mixins: past that, it is doing several jobs."""
    long_modules = []
    trees = modules()
    for module, tree in trees.items():
        if module.startswith(("bot.", "cogs.")):
            lines = max((getattr(node, "end_lineno", 0) or 0 for node in ast.walk(tree)), default=0)
            if lines > 600:
                long_modules.append(f"{module}: {lines}")
    long_classes = {name for name, lines in class_lines(trees).items() if lines > CLASS_LINES}
    assert long_modules == []
    assert sorted(long_classes - set(LONG_CLASSES)) == []
    assert sorted(set(LONG_CLASSES) - long_classes) == [], "no longer long: take it off LONG_CLASSES"


# Functions allowed past 60 lines, and why. An entry that is no longer needed fails the test too.
LONG_FUNCTIONS = {
    # the list of settings itself: one keyword per setting in the one constructor call
    "bot.config.load_settings": "every setting read in one place",
}
FUNCTION_LINES = 60


def long_functions(tree: ast.AST, prefix: str) -> Iterator[tuple[str, int]]:
    """(qualified name, lines) of every function above FUNCTION_LINES, methods named with their class."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = (node.end_lineno or 0) - node.lineno + 1
            if lines > FUNCTION_LINES:
                yield f"{prefix}.{node.name}", lines
            yield from long_functions(node, f"{prefix}.{node.name}")
        elif isinstance(node, ast.ClassDef):
            yield from long_functions(node, f"{prefix}.{node.name}")


def test_no_function_is_too_long_to_read() -> None:
    """No function above 60 lines in bot/ and cogs/ but the few named in LONG_FUNCTIONS."""
    found = {
        name: lines
        for module, tree in modules().items()
        if module.startswith(("bot.", "cogs."))
        for name, lines in long_functions(tree, module)
    }
    assert sorted(set(found) - set(LONG_FUNCTIONS)) == []
    assert sorted(set(LONG_FUNCTIONS) - set(found)) == [], "no longer long: take it off LONG_FUNCTIONS"


def test_the_rules_catch_what_they_say() -> None:
    """The checks above can fail: each one flags a module written to break it."""
    bad = ast.parse("import discord\nfrom bot.chat import log_store\nx = services.pool\n")
    assert "discord" in set(imports(bad)) and is_store("bot.chat.log_store")
    assert any(isinstance(n, ast.Attribute) and n.attr == "pool" for n in ast.walk(bad))
    long = ast.parse("class A:\n    def f(self):\n" + "        x = 1\n" * FUNCTION_LINES)
    assert list(long_functions(long, "m")) == [("m.A.f", FUNCTION_LINES + 1)]
    stacked = ast.parse("class A:\n" + "    x = 1\n" * 200 + "class B(A):\n" + "    y = 1\n" * 200)
    assert class_lines({"bot.m": stacked}) == {"bot.m.A": 201, "bot.m.B": 402}
    hidden = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import discord\n")
    assert "discord" not in set(imports(hidden))
