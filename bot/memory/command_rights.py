"""Who may change which list by command, decided here for every adapter (the Discord commands, the console): the
adapter says who acts (`Actor`), these say yes or refuse in one sentence (docs/memory-rules.md, "Saving and
forgetting", the table). The model's own limits are in `bot.memory.model_rules`.
"""

from __future__ import annotations

from bot.errors import NotAllowed
from bot.memory.lists import ListRef
from bot.memory.models import Memory, MemoryList
from bot.servers.models import Actor
from bot.servers.service import Servers

NEEDS_MANAGE = (
    "only members with Manage Server can {what} (or anyone, for their own memories, when the server turns member teaching on)"
)


async def member_teaching(servers: Servers, ref: ListRef) -> bool:
    return ref.guild_id is not None and (await servers.guild_settings(ref.guild_id)).member_teaching


async def may_add(servers: Servers, ref: ListRef, actor: Actor) -> None:
    """Server lists: Manage Server, or anyone with member teaching on; personal lists: their owner."""
    if ref.list == MemoryList.PERSONAL:
        if actor.user_id != ref.owner_id:
            raise NotAllowed("only its owner can add to a personal list")
        return
    if not actor.can_manage and not await member_teaching(servers, ref):
        raise NotAllowed(NEEDS_MANAGE.format(what="add server memories"))


async def may_change(servers: Servers, ref: ListRef, memory: Memory, actor: Actor, what: str) -> None:
    """A server memory: Manage Server, or member teaching and being its author; a personal one: its owner."""
    if ref.list == MemoryList.PERSONAL:
        if actor.user_id != ref.owner_id:
            raise NotAllowed("only its owner can change a personal memory")
        return
    if actor.can_manage:
        return
    if not await member_teaching(servers, ref):
        raise NotAllowed(NEEDS_MANAGE.format(what=f"{what} server memories"))
    if memory.created_by != actor.user_id:
        raise NotAllowed(f"you can only {what} server memories you added yourself; ask someone with Manage Server")


def may_move_whole_list(ref: ListRef, actor: Actor, what: str) -> None:
    """Import and export move a whole list: a server's needs Manage Server, a personal one its owner."""
    if ref.list == MemoryList.SERVER and not actor.can_manage:
        raise NotAllowed(f"only members with Manage Server can {what} the server's memories")
    if ref.list == MemoryList.PERSONAL and actor.user_id != ref.owner_id:
        raise NotAllowed(f"only its owner can {what} a personal list")
