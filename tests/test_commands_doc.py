"""`python -m bot commands` prints the real slash-command tree, and docs/commands.md is generated from it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from bot.__main__ import main
from bot.tools.commands_doc import command_tree, markdown

DOCS = Path(__file__).resolve().parent.parent / "docs" / "commands.md"


def leaves(command: dict, prefix: str = "") -> dict[str, dict]:
    name = f"{prefix} {command['name']}".strip()
    if "subcommands" not in command:
        return {name: command}
    found: dict[str, dict] = {}
    for child in command["subcommands"]:
        found.update(leaves(child, name))
    return found


def test_cli_prints_every_command_of_the_spec(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["commands"]) == 0
    tree = json.loads(capsys.readouterr().out)
    commands: dict[str, dict] = {}
    for command in tree["commands"]:
        commands.update(leaves(command))
    wanted = (
        [f"memories {name}" for name in ("list", "search", "add", "edit", "delete", "export", "import", "stats")]
        + [f"personal memories {name}" for name in ("list", "search", "add", "edit", "delete", "move", "export", "import")]
        + ["privacy level", "privacy export-my-data", "privacy delete-my-data"]
        + [f"settings {name}" for name in ("show", "notices", "self-teaching", "member-teaching", "personal-memories", "tagging")]
        + [f"settings {group} {name}" for group in ("blocklist", "auto-reply") for name in ("add", "remove", "list")]
        + [f"settings persona {name}" for name in ("show", "name", "prompt", "attribute")]
        + [f"settings lore {name}" for name in ("add", "list", "remove")]
    )
    assert sorted(set(wanted) - set(commands)) == []
    top = {command["name"]: command for command in tree["commands"]}
    assert top["settings"]["default_permissions"] == ["manage_guild"]
    assert top["memories"]["default_permissions"] is None and top["memories"]["contexts"] == ["servers"]
    mode = next(o for o in commands["memories import"]["options"] if o["name"] == "mode")
    assert [c["value"] for c in mode["choices"]] == ["merge", "replace"] and not mode["required"]
    memory = commands["memories edit"]["options"][0]
    assert memory == {"name": "memory", "type": "integer", "description": "The memory to edit: start typing its text",
                      "required": True, "autocomplete": True}


def test_every_text_fits_discord_limits() -> None:
    tree = asyncio.run(command_tree())

    def check(command: dict) -> None:
        assert 1 <= len(command["description"]) <= 100 and not command["description"].endswith("…"), command["name"]
        for option in command.get("options", []):
            assert len(option["description"]) <= 100 and not option["description"].endswith("…"), option["name"]
            assert all(len(choice["name"]) <= 100 for choice in option.get("choices", []))
        for child in command.get("subcommands", []):
            check(child)
        assert len(command.get("options", [])) <= 25 and len(command.get("subcommands", [])) <= 25

    for command in tree["commands"]:
        check(command)


def test_docs_are_generated_from_the_tree() -> None:
    expected = markdown(asyncio.run(command_tree())) + "\n"
    assert DOCS.read_text(encoding="utf-8") == expected, "regenerate: python -m bot commands --markdown > docs/commands.md"
