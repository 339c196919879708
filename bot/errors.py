"""The one family of refusals: what the bot declines to do, said in one sentence.

Services raise a `Refusal` (or a subclass naming the kind of request) when someone asks for what
the rules do not allow or what cannot be understood. Each adapter translates the family once: the
Discord cogs in the error hook that `cogs.errors` installs, the console in its command loop, the
tool protocol as the tool result the model reads. Anything else that escapes is a bug: logged, and
answered with a generic apology.
"""

from __future__ import annotations


class Refusal(Exception):
    """A request the bot declines. `sentence` is for people; `reason` is a short machine word for logs and tests."""

    reason: str = "refused"

    def __init__(self, sentence: str, *, reason: str | None = None) -> None:
        super().__init__(sentence)
        self.sentence = sentence
        if reason is not None:
            self.reason = reason


class InvalidInput(Refusal):
    """Input that cannot be understood or is out of bounds (a bad file, a text too long, an unknown option)."""

    reason = "invalid"


class NotAllowed(Refusal):
    """Understood, but the rules or the asker's rights do not allow it."""

    reason = "not_allowed"


class NotFound(Refusal):
    """What the request names does not exist (any more)."""

    reason = "not_found"
