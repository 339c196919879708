"""docs/configuration.md is generated from the code, describes every setting, and says what the loader does."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from bot.__main__ import main
from bot.config import Settings, load_settings
from bot.config_help import ACCEPTS, SECTIONS, SHOWN_DEFAULTS
from bot.tools.config_doc import COMMAND, accepted, described_names, markdown, setting_names, shown_value

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "configuration.md"
EXAMPLE = ROOT / ".env.example"


def test_the_page_is_generated_from_the_code() -> None:
    assert DOCS.read_text(encoding="utf-8") == markdown() + "\n", f"regenerate: {COMMAND}"


def test_every_setting_is_described_once_and_nothing_else_is() -> None:
    described = described_names()
    assert sorted({name for name in described if described.count(name) > 1}) == []
    missing = sorted(set(setting_names()) - set(described))
    assert missing == [], f"describe these settings in bot/config_help.py, then run {COMMAND}"
    assert sorted(set(described) - set(setting_names())) == [], "bot/config_help.py describes settings the bot does not read"
    assert sorted((set(SHOWN_DEFAULTS) | set(ACCEPTS)) - set(setting_names())) == []


def test_a_variable_read_only_to_be_folded_into_another_is_a_setting_too() -> None:
    names = setting_names()
    assert len(names) >= 60 and "MAX_USED" in names and "DATABASE_PASSWORD" in names
    assert "DATABASE_PASSWORD" in DOCS.read_text(encoding="utf-8")


def test_the_default_of_a_settings_value_is_the_loaders() -> None:
    """Tests and the simulator build `Settings()`; the bot runs `load_settings`: both must mean the same defaults."""
    built, loaded = Settings(), load_settings({}, dotenv_path=None)
    names = [field.name for field in dataclasses.fields(Settings)]
    differing = [name for name in names if getattr(built, name) != getattr(loaded, name)]
    assert differing == []


def test_a_default_written_in_words_still_names_the_real_value() -> None:
    defaults = load_settings({}, dotenv_path=None)
    for name, words in SHOWN_DEFAULTS.items():
        value = getattr(defaults, name.lower())
        if isinstance(value, float):
            assert f"{value:.2f}" in words, name
        elif value not in (None, ""):
            assert str(value) in words, name


def test_cells_stay_short_and_speak_for_themselves() -> None:
    for section in SECTIONS:
        for name, about in section.settings.items():
            assert len(about) <= 200, f"{name}: one or two sentences; the details go to the page the section links to"
            assert about.endswith((".", ")")), name
            assert not re.search(r"\bSPEC\b|\bissue \d|\.\./shared", about), name


def test_accepted_values_come_from_the_loader() -> None:
    kinds = {field.name.upper(): str(field.type) for field in dataclasses.fields(Settings)}
    assert accepted("MAX_USED") == "1 to 50"
    assert accepted("TAIL_RESERVE") == "0 to 0.9"
    assert accepted("MEMORY_DECAY_ENABLED") == "`true`, `false`"
    assert accepted("EMBEDDING_PROVIDER") == "`builtin`, `openai`, `none`"
    for name, kind in kinds.items():
        if kind in ("int", "float", "bool", "int | None"):
            assert accepted(name) != "text", f"{name}: the loader's refusal no longer says what it accepts"


def test_defaults_are_written_as_in_env_files() -> None:
    assert [shown_value(value) for value in (None, "", True, 60.0, 0.91, (0, 2), Path("./data"), "a\nb")] == [
        "*(unset)*", "*(unset)*", "`true`", "`60`", "`0.91`", "`0,2`", "`data`", "`a\\nb`"
    ]


def test_env_example_lists_every_setting_and_changes_no_default(tmp_path: Path) -> None:
    """Copying .env.example to .env, as the README says, must give exactly the defaults."""
    example = EXAMPLE.read_text(encoding="utf-8")
    missing = [name for name in setting_names() if not re.search(rf"^#? ?{name}=", example, re.MULTILINE)]
    assert missing == [], "add these settings to .env.example"
    copied = tmp_path / ".env"
    copied.write_text(example, encoding="utf-8")
    assert load_settings({}, dotenv_path=copied) == load_settings({}, dotenv_path=None)


def test_the_command_prints_the_settings_in_effect_with_secrets_masked(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)  # no .env of the developer's
    monkeypatch.setenv("DISCORD_TOKEN", "very-secret-token")
    monkeypatch.setenv("MAX_USED", "4")
    monkeypatch.setenv("SHARD_COUNT", "4")
    monkeypatch.setenv("SHARD_IDS", "0-1")
    assert main(["config"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert [line.split("=", 1)[0] for line in printed] == [field.name.upper() for field in dataclasses.fields(Settings)]
    assert "DISCORD_TOKEN=***" in printed and "MAX_USED=4" in printed and "SHARD_IDS=0,1" in printed
    assert "very-secret-token" not in "\n".join(printed)


def test_the_command_refuses_a_bad_setting_in_one_sentence(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MAX_USED", "lots")
    assert main(["config"]) == 1
    assert capsys.readouterr().err.strip() == "error: invalid setting: MAX_USED must be a whole number from 1 to 50, got 'lots'"


def test_the_markdown_needs_no_environment(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAX_USED", "lots")
    assert main(["config", "--markdown"]) == 0
    assert capsys.readouterr().out == markdown() + "\n"
