"""The memory tools the chat model may call, and how each call is run: through the memory service, as the
bot (source `bot`), or refused with a short reason the model reads as the tool result.

A refusal never raises out of `MemoryTools.run`: one bad argument must not stop the reply or the other calls.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any

from bot.chat.arguments import as_bool, as_list_name, as_memory_id, as_user_ref
from bot.chat.messages import IncomingMessage
from bot.chat.notices import UNCHANGED, ChangeKind, MemoryChange, room_changes
from bot.chat.reply_text import without_transcript
from bot.config import Settings
from bot.errors import InvalidInput
from bot.failures import database_sentence
from bot.memory.models import Conversation, MemoryList, NewMemory, SaveResult, Source
from bot.memory.service import MemoryCore
from bot.memory.visibility import shown
from bot.servers.models import GuildSettings
from bot.third_person import first_person, in_third_person, stated, without_request

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
            "description": "server: about this server or community; personal: about the person you answer, from what "
            "they said about themselves.",
        },
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
    """One reply's tool calls: who is talking, what they may touch, and what was done so far."""

    message: IncomingMessage
    participants: set[int]
    conversation: Conversation | None
    shown_ids: set[int]
    search_ok: bool
    offered: set[str]
    lists: set[str]
    changes: list[MemoryChange] = field(default_factory=list)
    names: dict[int, str] = field(default_factory=dict)  # participants' display names, for `about_user` given as a name
    done: dict[str, dict[str, Any]] = field(default_factory=dict)  # each distinct call once: its result
    actions: int = 0  # memory changes tried in this reply
    from_text: int = 0  # calls the model wrote in its text instead of `tool_calls`
    said: list[str] = field(default_factory=list)  # what calls that changed nothing amount to, for a reply of only calls
    remembered: bool = False  # a save found the fact already remembered (a reply saying "I'll remember" is true)


def _memory_id(arguments: dict[str, Any]) -> int:
    memory_id = as_memory_id(arguments.get("memory_id"))
    if memory_id is None:
        raise ToolCallError(f"memory_id must be the number shown with a memory, not {shown(arguments.get('memory_id'))}")
    return memory_id


FIRST_PERSON = re.compile(r"\s*(?:my|i|i['’]m|i['’]ve|i['’]ll|i['’]d)\b", re.IGNORECASE)


def _names(text: str, name: str) -> bool:
    """Whether `text` names the person (their display name as a word: "Juno", "Juno's")."""
    name = " ".join(name.split())
    return len(name) >= 2 and re.search(rf"(?<!\w){re.escape(name)}(?!\w)", text, re.IGNORECASE) is not None


def _other_person_named(text: str, context: ToolContext) -> str | None:
    """Another participant the text names while it does not name the person answered: Qwen2.5-Coder 0.5B saved
    Rin's "I'm Rin, my birthday is on May 3" as a personal memory of Bau, in Bau's turn."""
    author = context.message.author_name
    if _names(text, author):
        return None
    others = (context.names.get(user, "") for user in context.participants if user != context.message.author_id)
    return next((name for name in others if _names(text, name) and not _names(author, name)), None)


def _personal_owner(arguments: dict[str, Any], text: str, context: ToolContext) -> int:
    """Whom a personal memory the model saves is about: the person answered (or `about_user`, which the memory rules
    then refuse when it is someone else), never one whose text names another participant and not them."""
    about = context.message.author_id
    if arguments.get("about_user") not in (None, ""):
        about = _about_user(arguments["about_user"], context)
    other = _other_person_named(text, context) if about == context.message.author_id else None
    if other is not None:
        raise ToolCallError(
            f"the text is about {other}, not about {context.message.author_name}, the person you answer: a "
            "personal memory is only about them"
        )
    return about


_SENTENCE_BREAK = re.compile(r"[.!?;]\s+\S")


def _as_fact_of_author(text: str, name: str) -> str:
    """A save of the author's own words as a fact about them: Qwen2.5-Coder saves what it was told as it was said
    ("My cat is called Mochi.", "Remember that I host game night every Friday at 8pm."), which reads like someone
    else's words in the next prompt and misses the same fact the day-end notes write as "Juno's cat is called
    Mochi." A request to remember goes in every case ("Rin's birthday is on May 3, please remember it." is how 1.5B
    saved it); text the rules cannot rewrite (Spanish, not in the first person) is kept as it is otherwise."""
    said = without_request(text) or text
    if not name.strip() or not first_person(said) or _SENTENCE_BREAK.search(said):  # one sentence: the rules' reach
        return said
    return in_third_person(stated(said), name) or said


def _about_user(value: object, context: ToolContext) -> int:
    """The participant a personal memory is about: an id, a <@id> mention or a display name of a participant."""
    found = as_user_ref(value)
    if isinstance(found, str):
        matches = [user for user, name in context.names.items() if name.casefold() == found.casefold()]
        if len(matches) != 1 or matches[0] not in context.participants:
            raise ToolCallError(f"{shown(found)} is not a person in this conversation; use their user ID")
        return matches[0]
    if found is None:
        raise ToolCallError(f"about_user must be the user ID of a person in this conversation, not {shown(value)}")
    if found not in context.participants:
        raise ToolCallError(f"user {found} is not in this conversation; personal memories are about its participants")
    return found


def _canonical(raw: str | None) -> str:
    """The arguments as one text whatever their spacing and key order, to tell a repeated call."""
    try:
        return json.dumps(json.loads(raw or "{}"), sort_keys=True)
    except (ValueError, RecursionError, TypeError):
        return raw or ""


def _arguments(raw: str | None) -> dict[str, Any]:
    """The call's arguments as an object; anything else is refused in a sentence, whatever the model sent."""
    try:
        arguments = json.loads(raw or "{}")
    except json.JSONDecodeError as exc:
        raise ToolCallError(f"the arguments are not valid JSON ({exc.msg}); send a JSON object") from None
    except (ValueError, RecursionError):  # a number of thousands of digits, or arrays nested thousands deep
        raise ToolCallError("the arguments are not a usable JSON object (absurdly long numbers or deep nesting)") from None
    if not isinstance(arguments, dict):
        raise ToolCallError("the arguments must be a JSON object")
    return arguments


def _text_argument(arguments: dict[str, Any], max_chars: int, context: ToolContext) -> str:
    """The memory text, without what the model copied of the transcript (labels, user ids): see `without_transcript`."""
    text = arguments.get("text")
    if isinstance(text, str):
        text = without_transcript(text, context.names)
    if not isinstance(text, str) or not text.strip():
        raise ToolCallError("text is missing: give the fact to remember as a non-empty string")
    if len(text.strip()) > max_chars:
        raise ToolCallError(f"text has {len(text.strip())} characters; the limit is {max_chars}. Shorten it and try again")
    return text


class MemoryTools:
    def __init__(self, core: MemoryCore, settings: Settings) -> None:
        self.core = core
        self.settings = settings

    def offered(self, guild: GuildSettings | None, *, private_thread: bool = False) -> list[dict[str, Any]]:
        """No tools where the bot may not teach itself (fewer tokens, no refusals to explain), nor with
        MEMORY_NOTES=daily (only the day-end notes write memories then). In a private thread no server list: what is
        said there stays there."""
        if self.settings.memory_notes == "daily":
            return []
        if guild is None:  # a DM: only the author's personal memories make sense
            return memory_tools(server=False, personal=True, max_chars=self.settings.memory_max_chars)
        if not guild.self_teaching:
            return []
        server = not private_thread
        return memory_tools(server=server, personal=guild.personal_memories, max_chars=self.settings.memory_max_chars)

    async def run(self, name: str, raw_arguments: str | None, context: ToolContext) -> dict[str, Any]:
        """Run one call, or say why not. Never raises: one bad call must not stop the reply or the other calls.

        The same call twice in one reply runs once (the second gets the first's result), and at most
        MAX_MEMORY_ACTIONS_PER_REPLY calls may change memories.
        """
        key = f"{name}\0{_canonical(raw_arguments)}"
        if key in context.done:
            return context.done[key]
        try:
            result = await self._run(name, raw_arguments, context)
        except ToolCallError as exc:
            log.info("Refused a %s tool call for message %s: %s", shown(name), context.message.message_id, exc)
            result = {"ok": False, "error": exc.sentence}
            context.said.append(UNCHANGED)
        except Exception as exc:  # a bug or a database failure: this call failed, the reply goes on
            explained = database_sentence(exc)  # a full disk: one sentence, for the model and the log
            if explained is not None:
                log.error("A %s tool call for message %s failed: %s", shown(name), context.message.message_id, explained)
            else:
                log.exception("A %s tool call for message %s failed", shown(name), context.message.message_id)
            result = {"ok": False, "error": explained or f"this call failed ({type(exc).__name__}); nothing was changed by it"}
        context.done[key] = result
        return result

    async def _run(self, name: str, raw_arguments: str | None, context: ToolContext) -> dict[str, Any]:
        if name not in context.offered:
            offered = ", ".join(sorted(context.offered)) or "none"
            raise ToolCallError(f"there is no tool named {shown(name)} here; the tools are: {offered}")
        arguments = _arguments(raw_arguments)
        if name == "save_memory":
            return await self._tool_save(arguments, context)
        if name == "update_memory":
            return await self._tool_update(arguments, context)
        return await self._tool_forget(arguments, context)

    def _spend_action(self, context: ToolContext) -> None:
        """Counted when a call reaches the memory service: at most MAX_MEMORY_ACTIONS_PER_REPLY per reply."""
        if context.actions >= self.settings.max_memory_actions_per_reply:
            raise ToolCallError(
                f"at most {self.settings.max_memory_actions_per_reply} memory changes per reply; answer the person now"
            )
        context.actions += 1

    def _shown_id(self, arguments: dict[str, Any], context: ToolContext) -> int:
        memory_id = _memory_id(arguments)
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
        text = _text_argument(arguments, self.settings.memory_max_chars, context)
        raw_list = arguments.get("list")
        list_name = as_list_name(raw_list)
        if (raw_list in (None, "") or (isinstance(raw_list, list) and "personal" in raw_list)) and list_name is None:
            list_name = "personal"  # no list, or ["server", "personal"]: the narrower reach, never the server's by a guess
        if list_name == "server" and "personal" in context.lists and (
            arguments.get("about_user") not in (None, "") or FIRST_PERSON.match(text) or _names(text, context.message.author_name)
        ):  # a fact about one named person, in the speaker's own words ("My cat is called Mochi") or naming the person
            list_name = "personal"  # answered ("Mochi is Juno's cat"), is personal
        if list_name not in context.lists:
            raise ToolCallError(f"list must be one of: {', '.join(sorted(context.lists))}")
        memory_list = MemoryList(list_name)
        is_global = as_bool(arguments.get("global", False))
        if is_global is None:
            raise ToolCallError("global must be true or false")
        about = _personal_owner(arguments, text, context) if memory_list == MemoryList.PERSONAL else None
        if about == context.message.author_id:
            text = _as_fact_of_author(text, context.message.author_name)
        if memory_list == MemoryList.SERVER and is_global:
            raise ToolCallError("only personal memories can be global, and only the person makes them, by command")
        self._spend_action(context)
        result = await self.core.save(
            NewMemory(
                list=memory_list,
                text=text,
                by=context.message.author_id,
                via=Source.BOT,
                guild_id=context.message.guild_id,
                owner_id=about,
                is_global=is_global,
                conversation=context.conversation,
            ),
            search_available=context.search_ok,
        )
        if result.saved is None:
            return self._refused(result, context, None, memory_list, text.strip(), about)
        saved = result.saved
        context.shown_ids.add(saved.id)
        if result.repeated:  # nothing new: the memory it repeats counted as used
            context.said.append(f"📝 I already remember that: {saved.text.rstrip('.')}.")
            context.remembered = True
            return {"ok": True, "already_remembered_as": saved.id, "text": saved.text, "note": result.detail}
        context.changes.append(MemoryChange(ChangeKind.SAVED, saved.id, saved.list, saved.text, saved.owner_id))
        context.changes += room_changes(result)
        context.shown_ids.difference_update([gone.id for gone in result.forgotten] + [m.absorbed.id for m in result.merged])
        context.shown_ids.update(memory.id for memory in result.similar)  # so the model may update one of them
        answer: dict[str, Any] = {"ok": True, "memory_id": saved.id}
        if result.forgotten:  # only when something went: an empty field's name is what small models turned into prose
            answer["forgotten_to_make_room"] = [{"id": gone.id, "text": gone.text} for gone in result.forgotten]
        if result.merged:
            answer["merged_to_make_room"] = [
                {"id": m.kept.id, "absorbed": m.absorbed.id, "text": m.kept.text} for m in result.merged
            ]
        if result.similar:
            answer["similar_memories"] = [{"id": memory.id, "text": memory.text} for memory in result.similar]
            answer["hint"] = "if the new fact replaces one of these, update that memory and forget the new one"
        return answer

    async def _tool_update(self, arguments: dict[str, Any], context: ToolContext) -> dict[str, Any]:
        memory_id = self._shown_id(arguments, context)
        text = _text_argument(arguments, self.settings.memory_max_chars, context)
        self._spend_action(context)
        result = await self.core.update_by_model(
            memory_id,
            text,
            by=context.message.author_id,
            guild_id=context.message.guild_id,
            by_can_manage=context.message.author_can_manage,
            reason=f"updated by the model in a reply to {context.message.author_name}",
            search_available=context.search_ok,
        )
        if result.saved is None:
            return self._refused(result, context, memory_id, None, text.strip(), None)
        saved = result.saved
        if result.kept_apart_from is not None:  # about something else: saved beside the memory, which was kept
            context.shown_ids.add(saved.id)
            if not result.repeated:
                context.changes.append(MemoryChange(ChangeKind.SAVED, saved.id, saved.list, saved.text, saved.owner_id))
                context.changes += room_changes(result)
            return {
                "ok": True,
                "memory_id": saved.id,
                "kept": memory_id,
                "note": result.detail + "; if the old memory is now wrong, forget it with forget_memory",
            }
        context.changes.append(
            MemoryChange(ChangeKind.UPDATED, saved.id, saved.list, saved.text, saved.owner_id, old_text=result.replaced_text)
        )
        return {"ok": True, "memory_id": saved.id}

    async def _tool_forget(self, arguments: dict[str, Any], context: ToolContext) -> dict[str, Any]:
        memory_id = self._shown_id(arguments, context)
        self._spend_action(context)
        result = await self.core.forget_by_model(
            memory_id, context.message.text, by=context.message.author_id, by_can_manage=context.message.author_can_manage
        )
        if not result.forgotten:
            return self._refused(result, context, memory_id, None, "", None)
        gone = result.forgotten[0]
        context.changes.append(MemoryChange(ChangeKind.FORGOTTEN, gone.id, gone.list, gone.text, gone.owner_id))
        context.shown_ids.discard(memory_id)
        return {"ok": True, "forgotten": memory_id}
