"""What the model may do with memories beyond acting with the rights of the person it answers
(docs/memory-rules.md, "Saving and forgetting"): it saves personal memories only about that person and never a
Global one (Global memories are protected forever, so making one is the person's own choice, by command), nothing
said in a private thread becomes a server memory, and no text it writes names someone whose privacy is `partial`
or `full`. Each refusal is one sentence the model reads as its tool result.
"""

from __future__ import annotations

from bot.db import Connection
from bot.memory.models import MemoryList, NewMemory, Rejection, SaveResult
from bot.servers.service import Servers


def _rejected(reason: Rejection, detail: str) -> SaveResult:
    return SaveResult(saved=None, forgotten=[], rejected=reason, detail=detail)


async def model_save_refusal(servers: Servers, conn: Connection, request: NewMemory) -> SaveResult | None:
    """Why the model may not make this save, or None."""
    if request.is_global:
        return _rejected(
            Rejection.NOT_ALLOWED,
            "only the person can make a Global memory (with /personal memories add, scope Global); "
            "save it without global instead",
        )
    if request.list == MemoryList.PERSONAL and request.owner_id != request.by:
        return _rejected(
            Rejection.NOT_ALLOWED,
            "a personal memory can only be about the person you answer; what others said about someone is not "
            "that person's memory",
        )
    if request.list == MemoryList.SERVER and request.conversation is not None and request.conversation.private_thread:
        return _rejected(
            Rejection.NOT_ALLOWED, "what is said in a private thread stays there: it cannot become a server memory"
        )
    return await model_text_refusal(servers, conn, request.text)


async def model_text_refusal(servers: Servers, conn: Connection, text: str) -> SaveResult | None:
    """Why the model may not write `text` into a memory (a save or an update), or None."""
    if await servers.private_people_named(text, conn):
        return _rejected(
            Rejection.PRIVACY,
            "the text names someone whose privacy setting does not let the bot save or change memories about them",
        )
    return None
