"""The chat pipeline's settings: defaults, validation that names the variable, secrets never shown."""

from __future__ import annotations

import pytest

from bot.config import DEFAULT_PERSONA_NAME, ConfigError, load_settings


def test_defaults() -> None:
    settings = load_settings({}, dotenv_path=None)
    assert settings.context_messages == 30
    assert (settings.chat_base_url, settings.chat_model, settings.chat_api_key) == ("", "", "")
    assert settings.chat_temperature == 0.7 and settings.chat_max_output_tokens == 800 and settings.chat_timeout_s == 60
    assert settings.chat_context_tokens == 32_000 and settings.memory_token_budget == 4_000 and settings.max_tool_rounds == 1
    assert settings.max_memory_actions_per_reply == 5 and settings.duplicate_similarity == 0.91
    assert settings.default_persona_name == DEFAULT_PERSONA_NAME and settings.default_persona_prompt
    assert settings.discord_token == "" and settings.dev_guild_id is None


def test_values_are_parsed() -> None:
    settings = load_settings(
        {
            "CHAT_BASE_URL": "http://localhost:11434/v1/",
            "CHAT_MODEL": "llama3.1",
            "CHAT_TEMPERATURE": "0.2",
            "DEV_GUILD_ID": "123456789012345678",
            "DEFAULT_PERSONA_PROMPT": "line one\\nline two",
            "MAX_TOOL_ROUNDS": "0",
        },
        dotenv_path=None,
    )
    assert settings.chat_base_url == "http://localhost:11434/v1"
    assert settings.chat_temperature == 0.2 and settings.max_tool_rounds == 0
    assert settings.dev_guild_id == 123456789012345678
    assert settings.default_persona_prompt == "line one\nline two"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"CHAT_BASE_URL": "localhost:11434"}, "CHAT_BASE_URL must start with http:// or https://"),
        ({"CHAT_TEMPERATURE": "hot"}, "CHAT_TEMPERATURE must be a number from 0.0 to 2.0"),
        ({"CONTEXT_MESSAGES": "0"}, "CONTEXT_MESSAGES must be a whole number from 1 to 200"),
        ({"MAX_TOOL_ROUNDS": "11"}, "MAX_TOOL_ROUNDS must be a whole number from 0 to 10"),
        ({"DEV_GUILD_ID": "my-server"}, "DEV_GUILD_ID must be a Discord id"),
        ({"CHAT_CONTEXT_TOKENS": "4096", "CHAT_MAX_OUTPUT_TOKENS": "4000"}, "CHAT_CONTEXT_TOKENS (4096) must exceed"),
        ({"CHAT_CONTEXT_TOKENS": "8000", "MEMORY_TOKEN_BUDGET": "9000"}, "MEMORY_TOKEN_BUDGET must be at most"),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_settings(env, dotenv_path=None)


def test_secrets_are_redacted() -> None:
    settings = load_settings({"CHAT_API_KEY": "sk-secret", "DISCORD_TOKEN": "discord-secret"}, dotenv_path=None)
    shown = str(settings.redacted())
    assert "sk-secret" not in shown and "discord-secret" not in shown
    assert settings.redacted()["chat_api_key"] == "***"
