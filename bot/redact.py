"""Keep secrets (the Discord token, API keys, the database password wherever it sits in the URL) out of every text the bot writes.

Settings already mask themselves (`Settings.redacted`), but secrets also travel inside other
people's messages: an OpenAI-compatible server may answer 401 with "Incorrect API key provided:
sk-...", asyncpg or aiohttp may print a URL, and any of those can end up in a log line, a
traceback, a stored receipt or an error shown to someone. So the secret *values* are masked where
text leaves the process:

- every log record, from Deskmate and from its libraries, through a log-record factory installed
  by `install` (message, arguments and traceback are rendered and masked once, when created);
- error texts that are stored or shown rather than logged (receipts, search failures, CLI errors)
  pass through `redact`.

Values shorter than `MIN_SECRET_CHARS` are not masked: masking "pw" everywhere would garble the
logs more than it would protect anything. Nor are `PUBLISHED_DEFAULTS`, values printed in this
repository as defaults: masking them hides nothing, and "deskmate" (docker-compose.yml's database
password until it changed) turned every log line naming the bot into "Connected as ***".
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

from bot.config import Settings, url_secrets

MASK = "***"
MIN_SECRET_CHARS = 4
PUBLISHED_DEFAULTS = frozenset({"deskmate"})


def _worth_masking(value: str) -> bool:
    return len(value) >= MIN_SECRET_CHARS and value.casefold() not in PUBLISHED_DEFAULTS


def secrets_of(settings: Settings) -> tuple[str, ...]:
    """The secret values in `settings`: tokens, API keys and the database password (raw and URL-decoded)."""
    found = [settings.discord_token, settings.chat_api_key, settings.embedding_api_key]
    if settings.database_url:  # the password after `user:` and secret query parameters such as ?password=
        found += url_secrets(settings.database_url)
    return tuple(sorted({value for value in found if _worth_masking(value)}, key=len, reverse=True))


class Redactor:
    """Replaces each secret value with MASK (longest first, so one secret inside another is fully masked)."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self.secrets = tuple(sorted({s for s in secrets if _worth_masking(s)}, key=len, reverse=True))

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        return text

    def contains_secret(self, text: str) -> bool:
        return any(secret in text for secret in self.secrets)


_lock = threading.Lock()
_active = Redactor()
_base_factory: Any = None


def redact(text: str) -> str:
    """`text` with every configured secret masked."""
    return _active(text)


def _record_factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
    record: logging.LogRecord = _base_factory(*args, **kwargs)
    redactor = _active
    if not redactor.secrets:
        return record
    try:
        message = record.getMessage()
    except Exception:  # a broken format string: leave it for the handler to report
        return record
    if redactor.contains_secret(message):
        record.msg, record.args = redactor(message), None
    if record.exc_info and record.exc_info[1] is not None:
        rendered = logging.Formatter().formatException(record.exc_info)
        if redactor.contains_secret(rendered):
            record.exc_text = redactor(rendered)  # formatters use exc_text when it is already set
    if record.stack_info and redactor.contains_secret(record.stack_info):
        record.stack_info = redactor(record.stack_info)
    return record


def install(settings: Settings) -> None:
    """Mask `settings`' secrets in every log record from now on (idempotent; a later call replaces the secrets)."""
    global _active, _base_factory
    with _lock:
        _active = Redactor(secrets_of(settings))
        if _base_factory is None:
            _base_factory = logging.getLogRecordFactory()
            logging.setLogRecordFactory(_record_factory)
