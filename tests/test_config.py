"""Settings: defaults, validation messages that name the variable, `.env` files, and no secrets in logs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bot.config import BUILTIN_MODEL, ConfigError, load_settings, redact_url

ROOT = Path(__file__).resolve().parents[1]


def test_defaults_match_the_spec() -> None:
    settings = load_settings({}, dotenv_path=None)
    assert settings.database_url is None and settings.data_dir == Path("./data")
    assert settings.memory_decay_enabled is True
    assert (settings.dormant_after_days, settings.max_used) == (7, 12)  # first written as 3; docs/benchmarks.md says why 12
    assert (settings.server_memory_limit, settings.personal_memory_limit, settings.memory_max_chars) == (100, 100, 1000)
    assert settings.embedding_provider == "builtin" and settings.embedding_model == BUILTIN_MODEL
    assert settings.embedding_timeout_s == 2.0
    assert 0.2 <= settings.min_similarity <= 0.5


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MAX_USED": "three"}, "MAX_USED must be a whole number from 1 to 50, got 'three'"),
        ({"DORMANT_AFTER_DAYS": "0"}, "DORMANT_AFTER_DAYS must be a whole number from 1"),
        ({"MEMORY_DECAY_ENABLED": "maybe"}, "MEMORY_DECAY_ENABLED must be true or false"),
        ({"EMBEDDING_PROVIDER": "cohere"}, "EMBEDDING_PROVIDER must be one of builtin, openai, none, got 'cohere'"),
        ({"EMBEDDING_PROVIDER": "openai"}, "EMBEDDING_MODEL must name a model"),
        ({"MIN_SIMILARITY": "2"}, "MIN_SIMILARITY must be a number from -1.0 to 1.0"),
        ({"EMBEDDING_TIMEOUT_S": "soon"}, "EMBEDDING_TIMEOUT_S must be a number"),
        ({"DATABASE_URL": "mysql://x"}, "DATABASE_URL must start with postgresql://"),
        ({"EMBEDDING_BASE_URL": "localhost:11434"}, "EMBEDDING_BASE_URL must start with http://"),
    ],
)
def test_invalid_values_name_the_variable_and_what_it_accepts(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(env, dotenv_path=None)
    assert message in str(caught.value)


def test_environment_wins_over_dotenv_and_blank_means_default(tmp_path: Path) -> None:
    dotenv = tmp_path / ".env"
    dotenv.write_text("MAX_USED=5\nDORMANT_AFTER_DAYS=3\nSERVER_MEMORY_LIMIT=\n")
    settings = load_settings({"MAX_USED": "4"}, dotenv_path=dotenv)
    assert (settings.max_used, settings.dormant_after_days, settings.server_memory_limit) == (4, 3, 100)


def test_min_similarity_default_depends_on_the_model() -> None:
    builtin = load_settings({}, dotenv_path=None)
    ada = load_settings({"EMBEDDING_PROVIDER": "openai", "EMBEDDING_MODEL": "text-embedding-ada-002"}, dotenv_path=None)
    explicit = load_settings({"EMBEDDING_PROVIDER": "openai", "EMBEDDING_MODEL": "m", "MIN_SIMILARITY": "0.61"}, dotenv_path=None)
    assert builtin.min_similarity != ada.min_similarity
    assert explicit.min_similarity == 0.61


def test_secrets_are_redacted() -> None:
    settings = load_settings(
        {"DATABASE_URL": "postgresql://bot:hunter2@db:5432/deskmate", "EMBEDDING_PROVIDER": "openai",
         "EMBEDDING_MODEL": "m", "EMBEDDING_API_KEY": "sk-live-123"},
        dotenv_path=None,
    )
    shown = str(settings.redacted())
    assert "hunter2" not in shown and "sk-live-123" not in shown
    assert redact_url("postgresql://bot:hunter2@db/x") == "postgresql://bot:***@db/x"
    assert redact_url("postgresql://db/x") == "postgresql://db/x"


def test_the_cli_reports_a_bad_setting_without_a_traceback(tmp_path: Path) -> None:
    env = {**os.environ, "MAX_USED": "lots"}
    result = subprocess.run(
        [sys.executable, "-m", "bot", "simulate", "x.jsonl"], cwd=tmp_path, env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode != 0
    assert "MAX_USED must be a whole number" in result.stderr and "Traceback" not in result.stderr


def test_recall_extensions_default_to_the_spec() -> None:
    settings = load_settings({}, dotenv_path=None)
    assert settings.max_recalled == 10 and settings.desk_refresh == "reply" and settings.lexical_weight == 0.5
    tuned = load_settings({"MAX_RECALLED": "0", "DESK_REFRESH": "Daily", "LEXICAL_WEIGHT": "0"}, dotenv_path=None)
    assert tuned.max_recalled == 0 and tuned.desk_refresh == "daily" and tuned.lexical_weight == 0.0
    with pytest.raises(ConfigError, match="DESK_REFRESH must be one of reply, daily"):
        load_settings({"DESK_REFRESH": "hourly"}, dotenv_path=None)
