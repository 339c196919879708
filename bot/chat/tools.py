"""The memory tools the chat model may call, and how each call is run: through the memory service, as the
bot (source `bot`), or refused with a short reason the model reads as the tool result.

A refusal never raises out of `MemoryTools.run`: one bad argument must not stop the reply or the other calls.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from bot.chat.messages import IncomingMessage
from bot.chat.notices import ChangeKind, MemoryChange
from bot.config import Settings
from bot.errors import InvalidInput
from bot.memory.base import NewMemory
from bot.memory.models import MemoryList, SaveResult, Source
from bot.memory.recall import MemoryCore
from bot.servers.models import GuildSettings

log = logging.getLogger(__name__)


def memory_tools(*, server: bool, personal: bool, max_chars: int) -> list[dict[str, Any]]:
    """The tool definitions offered to the model; empty when the bot may not teach itself here."""
    lists = [name for name, on in (("server", server), ("personal", personal)) if on]
    if not lists:
        return []
    save_properties: dict[str, Any] = {
        "text": {
            "type": "string",
            "description": f"The fact, short and self-contained, in the third person (at most {max_chars} characters).",
        },
        "list": {
            "type": "string",
            "enum": lists,
            "description": "server: about this server or community; personal: about one person.",
        },
    }
    if personal:
        save_properties["about_user"] = {
            "type": "string",
            "description": "Personal memories: the user ID (digits) of the person it is about; defaults to the author.",
        }
        save_properties["global"] = {
            "type": "boolean",
            "description": "Personal memories: true to use it wherever this person talks to you, not only here.",
        }
    id_property = {"type": "integer", "description": "The id shown with the memory."}
    return [
        {
            "type": "function",
            "function": {
                "name": "save_memory",
                "description": "Remember a fact for later conversations.",
                "parameters": {"type": "object", "properties": save_properties, "required": ["text", "list"]},
            },
        },
        {
            "type": "function",
            "function": {
                "name": "update_memory",
                "description": "Replace the text of a memory shown in this conversation.",
                "parameters": {
                    "type": "object",
                    "properties": {"memory_id": id_property, "text": save_properties["text"]},
                    "required": ["memory_id", "text"],
                },
            },
        },
        {
            "type": "function",
            "function": {
                "name": "forget_memory",
                "description": "Delete a memory shown in this conversation that is wrong or that someone asked you to forget.",
                "parameters": {"type": "object", "properties": {"memory_id": id_property}, "required": ["memory_id"]},
            },
        },
    ]


class ToolCallError(InvalidInput):
    """A tool call refused before touching anything; the sentence goes back to the model as the tool result."""


@dataclass
class ToolContext:
    message: IncomingMessage
    participants: set[int]
    shown_ids: set[int]
    search_ok: bool
    offered: set[str]
    lists: set[str]
    changes: list[MemoryChange] = field(default_factory=list)


def _parse_id(value: object, what: str) -> int:
    """An id as the model may write it: 12, "12", or a mention such as "<@12>"."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        digits = value.strip().removeprefix("<@").removeprefix("!").removesuffix(">")
        if digits.isdigit():
            return int(digits)
    raise ToolCallError(f"{what} must be a number, got {value!r}")


def _text_argument(arguments: dict[str, Any], max_chars: int) -> str:
    text = arguments.get("text")
    if not isinstance(text, str) or not text.strip():
        raise ToolCallError("text must be a non-empty string")
    if len(text.strip()) > max_chars:
        raise ToolCallError(f"text has {len(text.strip())} characters; the limit is {max_chars}. Shorten it and try again")
    return text


class MemoryTools:
    def __init__(self, core: MemoryCore, settings: Settings) -> None:
        self.core = core
        self.settings = settings

    def offered(self, guild: GuildSettings | None) -> list[dict[str, Any]]:
        """No tools where the bot may not teach itself (fewer tokens, no refusals to explain)."""
        if guild is None:  # a DM: only the author's personal memories make sense
            return memory_tools(server=False, personal=True, max_chars=self.settings.memory_max_chars)
        if not guild.self_teaching:
            return []
        return memory_tools(server=True, personal=guild.personal_memories, max_chars=self.settings.memory_max_chars)

    async def run(self, name: str, raw_arguments: str | None, context: ToolContext) -> dict[str, Any]:
        try:
            if name not in context.offered:
                offered = ", ".join(sorted(context.offered)) or "none"
                raise ToolCallError(f"there is no tool named {name!r} here; the tools are: {offered}")
            try:
                arguments = json.loads(raw_arguments or "{}")
            except json.JSONDecodeError as exc:
                raise ToolCallError(f"the arguments are not valid JSON ({exc.msg}); send a JSON object") from None
            if not isinstance(arguments, dict):
                raise ToolCallError("the arguments must be a JSON object")
            if name == "save_memory":
                return await self._tool_save(arguments, context)
            if name == "update_memory":
                return await self._tool_update(arguments, context)
            return await self._tool_forget(arguments, context)
        except ToolCallError as exc:
            log.info("Refused a %s tool call for message %s: %s", name, context.message.message_id, exc)
            return {"ok": False, "error": str(exc)}

    def _shown_id(self, arguments: dict[str, Any], context: ToolContext) -> int:
        memory_id = _parse_id(arguments.get("memory_id"), "memory_id")
        if memory_id not in context.shown_ids:
            raise ToolCallError(f"there is no memory #{memory_id} in this conversation; use an id shown with a memory")
        return memory_id

    def _refused(
        self,
        result: SaveResult,
        context: ToolContext,
        memory_id: int | None,
        memory_list: MemoryList | None,
        text: str,
        about: int | None,
    ) -> dict[str, Any]:
        """A refusal by the core: invalid input is the model's to fix; a rule (full list, privacy) is also a notice."""
        refusal = result.refusal
        assert refusal is not None
        if not isinstance(refusal, InvalidInput):
            context.changes.append(MemoryChange(ChangeKind.REJECTED, memory_id, memory_list, text, about, refusal.sentence))
        return {"ok": False, "error": refusal.sentence}

    async def _tool_save(self, arguments: dict[str, Any], context: ToolContext) -> dict[str, Any]:
        text = _text_argument(arguments, self.settings.memory_max_chars)
        list_name = arguments.get("list")
        if list_name not in context.lists:
            raise ToolCallError(f"list must be one of: {', '.join(sorted(context.lists))}")
        memory_list = MemoryList(list_name)
        is_global = arguments.get("global", False)
        if not isinstance(is_global, bool):
            raise ToolCallError("global must be true or false")
        about: int | None = None
        if memory_list == MemoryList.PERSONAL:
            about = context.message.author_id
            if arguments.get("about_user") not in (None, ""):
                about = _parse_id(arguments["about_user"], "about_user")
            if about not in context.participants:
                raise ToolCallError(f"user {about} is not in this conversation; personal memories are about its participants")
        elif is_global:
            raise ToolCallError("only personal memories can be global")
        result = await self.core.save(
            NewMemory(
                list=memory_list,
                text=text,
                by=context.message.author_id,
                via=Source.BOT,
                guild_id=context.message.guild_id,
                owner_id=about,
                is_global=is_global,
            ),
            search_available=context.search_ok,
        )
        if result.saved is None:
            return self._refused(result, context, None, memory_list, text.strip(), about)
        saved = result.saved
        context.changes.append(MemoryChange(ChangeKind.SAVED, saved.id, saved.list, saved.text, saved.owner_id))
        for gone in result.forgotten:
            context.changes.append(MemoryChange(ChangeKind.MADE_ROOM, gone.id, gone.list, gone.text, gone.owner_id))
            context.shown_ids.discard(gone.id)
        context.shown_ids.add(saved.id)
        return {
            "ok": True,
            "memory_id": saved.id,
            "forgotten_to_make_room": [{"id": gone.id, "text": gone.text} for gone in result.forgotten],
        }

    async def _tool_update(self, arguments: dict[str, Any], context: ToolContext) -> dict[str, Any]:
        memory_id = self._shown_id(arguments, context)
        text = _text_argument(arguments, self.settings.memory_max_chars)
        result = await self.core.edit(memory_id, text, by=context.message.author_id, via=Source.BOT)
        if result.saved is None:
            return self._refused(result, context, memory_id, None, text.strip(), None)
        updated = result.saved
        context.changes.append(MemoryChange(ChangeKind.UPDATED, updated.id, updated.list, updated.text, updated.owner_id))
        return {"ok": True, "memory_id": updated.id}

    async def _tool_forget(self, arguments: dict[str, Any], context: ToolContext) -> dict[str, Any]:
        memory_id = self._shown_id(arguments, context)
        result = await self.core.delete(memory_id, by=context.message.author_id, via=Source.BOT)
        if not result.forgotten:
            return self._refused(result, context, memory_id, None, "", None)
        gone = result.forgotten[0]
        context.changes.append(MemoryChange(ChangeKind.FORGOTTEN, gone.id, gone.list, gone.text, gone.owner_id))
        context.shown_ids.discard(memory_id)
        return {"ok": True, "forgotten": memory_id}
