"""A chat message in plain values: what adapters (the Discord cog, the console) hand the chat service."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


def storable(text: str) -> str:
    """`text` without NUL characters, which PostgreSQL's text type cannot hold: a message carrying one (a console
    line, a Discord-compatible server that passes them on) is kept and answered without them, never refused."""
    return text.replace("\x00", "") if "\x00" in text else text


@dataclass(frozen=True)
class UserRef:
    id: int
    name: str
    is_bot: bool = False


@dataclass(frozen=True)
class IncomingMessage:
    """A channel message in plain values.

    `channel_id` keys the context window (a thread has its own); `parent_channel_id` is the channel
    memory channel-limits refer to (a thread's parent). `private_thread`: the thread is private, so what
    is said in it never leaves it (it is summarised on its own, never with its parent, and the model saves no
    server memory there). `mentions` are the users @mentioned in it.
    `where` is a short human description of the place for the prompt, e.g. '#general in "Juno's den"'.
    """

    message_id: int
    channel_id: int
    author_id: int
    author_name: str
    text: str
    created_at: datetime
    guild_id: int | None = None
    parent_channel_id: int | None = None
    private_thread: bool = False
    is_bot: bool = False
    author_can_manage: bool = False  # the author has Manage Server here: what the model may change for them
    reply_to: int | None = None
    mentions: tuple[UserRef, ...] = ()
    where: str = ""

    def __post_init__(self) -> None:
        for name in ("text", "author_name", "where"):
            value = getattr(self, name)
            if "\x00" in value:
                object.__setattr__(self, name, storable(value))
        if any("\x00" in user.name for user in self.mentions):
            object.__setattr__(self, "mentions", tuple(UserRef(u.id, storable(u.name), u.is_bot) for u in self.mentions))

    @property
    def is_dm(self) -> bool:
        return self.guild_id is None

    @property
    def memory_channel_id(self) -> int:
        return self.parent_channel_id or self.channel_id

    @property
    def summary_channel_id(self) -> int:
        """The channel whose summaries hold this message: a public thread's parent, a private thread itself."""
        return self.channel_id if self.private_thread else self.memory_channel_id
