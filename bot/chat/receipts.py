"""Receipts: for any reply, why each memory was in the prompt (desk, or recalled with its score), what each
tail source added, the token counts, and, when nothing was recalled, why.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from bot.chat.messages import IncomingMessage
from bot.chat.notices import MemoryChange
from bot.chat.sources import BY_TEXT
from bot.memory.models import Recall
from bot.prompt import DESK_SHARE, TAIL_SHARE, Prompt, user_label
from bot.tokens import count_tokens

LEGACY_SOURCES = {"history": "chat history", "documents": "documents"}
RECALLED_PART = "recalled_memories"


class ReplyStatus(StrEnum):
    REPLIED = "replied"
    NO_MODEL = "no_model"  # no chat model configured: the outcome shows what would have been sent
    MODEL_ERROR = "model_error"  # the chat model failed or timed out: an apology
    PROMPT_TOO_LARGE = "prompt_too_large"  # even the fixed parts do not fit CHAT_CONTEXT_TOKENS


def recalled_label(item: dict[str, Any]) -> str:
    """How a receipt shows one recalled memory: its score, and whether it came back to the desk.

    The score is cosine similarity plus the word bonus (LEXICAL_WEIGHT), so it can exceed 1. Only
    the used ones come back; the others (up to MAX_RECALLED) were shown and stay in the drawer.
    Receipts stored before this field existed only held used ones. A memory found by text when the
    embedder was unavailable (`by_text`) says so, with its text rank instead of a score.
    """
    where = "back on the desk" if item.get("back", True) else "shown, stays in the drawer"
    if item.get("by_text"):  # a failed search: found by its words, `similarity` is the text rank
        return f"{BY_TEXT}, text rank {float(item['similarity']):.2f}, {where}"
    return f"score {float(item['similarity']):.2f}, {where}"


@dataclass
class Receipt:
    """Why each memory was in the prompt, the token counts, and whether the head held.

    `sources` holds, per tail source (chat history, documents, ...), the items it put in the prompt (`items`),
    its `title`, and why it added nothing (`note`).
    """

    guild_id: int | None
    channel_id: int
    message_id: int
    persona_id: int
    status: str
    desk_ids: list[int]
    recalled: list[dict[str, float | int]]
    used: list[dict[str, float | int]]
    dropped: list[dict[str, str]]
    search_ok: bool
    search_failure: str | None
    nothing_recalled_because: str | None
    tokens: dict[str, int]
    head_hash: str
    head_same_as_previous: bool | None
    history_messages: int
    tool_rounds: int = 0
    tool_calls_from_text: int = 0  # calls read from the answer's text (the model did not use `tool_calls`)
    quoted_calls: int = 0  # calls not run because their text already stood in the conversation
    reply_problems: list[str] = field(default_factory=list)  # what the reply checks took out or turned down
    asked_again: bool = False  # the first answer could not be posted: the model was asked once more
    model: str | None = None
    changes: list[dict[str, object]] = field(default_factory=list)
    error: str | None = None
    elapsed_ms: int = 0
    desk_detail: list[dict[str, Any]] = field(default_factory=list)  # id, list, days_unused, about (owner), matched
    sources: dict[str, dict[str, Any]] = field(default_factory=dict)  # per tail source: title, items, note, detail
    tail_tokens: dict[str, int] = field(default_factory=dict)  # tail tokens per kind
    nothing_added_because: str | None = None  # nothing recalled at all (memories, history, documents): why
    summaries: list[dict[str, Any]] = field(default_factory=list)  # channel summaries in the head: key, period, tokens
    memories: list[dict[str, Any]] = field(default_factory=list)  # every memory of the reply: where, why, ids
    desk_shares: dict[str, int] = field(default_factory=dict)  # tokens of the desk's share per group ("0" = server)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Receipt:
        """A stored receipt (jsonb), ignoring fields this version does not know; older ones lack the newer fields.

        Receipts stored before sources carried their items kept them in `history` and `documents`.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        sources = {name: dict(report) for name, report in (data.get("sources") or {}).items()}
        for name, title in LEGACY_SOURCES.items():
            if name in data and "items" not in sources.get(name, {}):
                sources.setdefault(name, {"title": title})["items"] = data[name]
        return cls(**{key: value for key, value in data.items() if key in known} | {"sources": sources})

    def items(self, source: str) -> list[dict[str, Any]]:
        """What one tail source put in the prompt (empty when it added nothing, or did not run)."""
        return list((self.sources.get(source) or {}).get("items") or [])

    def render(self) -> str:
        """A few plain lines for people (console, a receipt command)."""
        desk = ", ".join(f"#{i}" for i in self.desk_ids) or "nothing"
        lines = [f"desk: {desk}"]
        if self.recalled:
            shown = ", ".join(f"#{item['id']} ({recalled_label(item)})" for item in self.recalled)
            lines.append(f"recalled from the drawer: {shown}")
        else:
            lines.append(f"recalled: nothing ({self.nothing_recalled_because})")
        for report in self.sources.values():
            title = report.get("title", "?")
            if report.get("items"):
                lines.append(f"{title}: " + ", ".join(tail_item_label(item) for item in report["items"]))
            elif report.get("note"):
                lines.append(f"{title}: nothing ({report['note']})")
        if self.nothing_added_because:
            lines.append(f"nothing was recalled for this reply: {self.nothing_added_because}")
        elif not self.search_ok:  # yet something came: the text fallback
            lines.append(f"the search failed ({self.search_failure}); what says {BY_TEXT} was found by the message's words")
        if self.summaries:
            lines.append("channel summaries: " + ", ".join(f"{s['period']} ({s['tokens']} tokens)" for s in self.summaries))
        for group in self.memories:  # receipts stored before this field existed have none
            if group["where"] != "desk":
                ids = group["ids"]
                more = f" and {len(ids) - 12} more" if len(ids) > 12 else ""
                lines.append(f"{group['where']}: " + ", ".join(f"#{i}" for i in ids[:12]) + f"{more} ({group['why']})")
        # memories left out are said above, with why; older receipts only have this list
        dropped = [item for item in self.dropped if not (self.memories and item["key"].startswith("memory:"))]
        if dropped:
            lines.append("left out: " + ", ".join(f"{item['key']} ({item['reason']})" for item in dropped))
        parts = token_parts(self.tokens)
        if self.tail_tokens:
            parts += " [near the end: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in self.tail_tokens.items()) + "]"
        lines.append(f"tokens: {self.tokens['total']} in total ({parts})")
        if self.reply_problems:
            again = " (asked the model again)" if self.asked_again else ""
            lines.append("reply checks: " + ", ".join(self.reply_problems) + again)
        if self.quoted_calls:
            lines.append(f"tool calls not run: {self.quoted_calls} (quoted from the conversation)")
        if self.head_same_as_previous is not None:
            lines.append(
                "prompt head: " + ("same as the previous reply (cacheable)" if self.head_same_as_previous else "changed")
            )
        return "\n".join(lines)


def tail_item_label(item: dict[str, Any]) -> str:
    """A history chunk or document passage of a receipt, in a few words."""
    if "chunk_id" in item:
        what = f"chunk #{item['chunk_id']} ({item.get('when', '?')}, {item.get('messages', '?')} messages"
    else:
        section = f" › {item['section']}" if item.get("section") else ""
        what = f"“{item.get('document', '?')}”{section} (passage #{item.get('passage_id')}"
    cut = ", cut to fit" if item.get("cut") else ""
    if item.get("by_text"):  # a failed search: found by its words, `similarity` is the text rank
        return f"{what}, {BY_TEXT}, {item.get('tokens', 0)} tokens{cut})"
    return f"{what}, similarity {item.get('similarity', 0):.2f}, {item.get('tokens', 0)} tokens{cut})"


def token_parts(tokens: dict[str, int]) -> str:
    """Token counts in prompt order (a receipt read back from jsonb has its keys reordered)."""
    order = ("system", "server_memories", "personal_memories", "summaries", "history", "tail", "answered", "tools")
    return ", ".join(f"{name.replace('_', ' ')} {tokens[name]}" for name in order if name in tokens)


def _nothing_recalled_because(recall: Recall, *, decay_active: bool, min_similarity: float) -> str:
    if not recall.search_ok:
        return f"the search failed: {recall.failure}" + (
            f"; the memories found {BY_TEXT} did not fit the memory budget" if recall.by_text else ""
        )
    if recall.recalled:
        return "the memory budget was full"
    if recall.used:
        return "the best matches were already on the desk"
    if not decay_active:
        return "memory decay is off, so every memory is on the desk"
    return f"nothing relevant: no memory in the drawer reached MIN_SIMILARITY {min_similarity:g}"


def build_receipt(
    message: IncomingMessage,
    recall: Recall,
    prompt: Prompt | None,
    previous_head: str | None,
    status: ReplyStatus,
    rounds: int,
    changes: Sequence[MemoryChange],
    error: str | None,
    sources: dict[str, dict[str, Any]] | None = None,
    *,
    decay_active: bool,
    min_similarity: float,
    model: str | None,
) -> Receipt:
    kept_tail = {item.memory_id for item in prompt.tail} if prompt else set()
    used = {s.memory.id for s in recall.used}
    recalled = [  # "back": used, so on the desk from the next reply on; else only shown (MAX_RECALLED)
        {"id": s.memory.id, "similarity": round(s.similarity, 4), "back": s.memory.id in used}
        for s in recall.recalled
        if s.memory.id in kept_tail
    ] + [  # a failed search: found by text, read-only
        {"id": s.memory.id, "similarity": round(s.similarity, 4), "back": False, "by_text": True}
        for s in recall.by_text
        if s.memory.id in kept_tail
    ]
    why = None if recalled else _nothing_recalled_because(recall, decay_active=decay_active, min_similarity=min_similarity)
    head = prompt.head_hash if prompt else ""
    return Receipt(
        guild_id=message.guild_id,
        channel_id=message.channel_id,
        message_id=message.message_id,
        persona_id=recall.persona_id,
        status=status.value,
        desk_ids=list(prompt.desk_ids) if prompt else [m.id for m in recall.desk],
        recalled=recalled,
        used=[{"id": s.memory.id, "similarity": round(s.similarity, 4)} for s in recall.used],
        dropped=[{"key": d.key, "reason": d.reason} for d in prompt.dropped] if prompt else [],
        search_ok=recall.search_ok,
        search_failure=recall.failure,
        nothing_recalled_because=why,
        tokens=prompt.tokens.as_dict() if prompt else {"total": 0},
        head_hash=head,
        head_same_as_previous=None if previous_head is None or not head else previous_head == head,
        history_messages=len(prompt.history_ids) if prompt else 0,
        tool_rounds=rounds,
        model=model,
        changes=[change.as_dict() for change in changes],
        error=error,
        summaries=[{"key": s.key, "period": s.period, "tokens": tokens} for s, tokens in prompt.summaries] if prompt else [],
        **_receipt_tail(recall, prompt, recalled, dict(sources or {})),
    )

def _receipt_tail(
    recall: Recall,
    prompt: Prompt | None,
    recalled: list[dict[str, float | int]],
    sources: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """Why each desk memory was there, what each tail source put into the prompt, tokens per tail part, and,
    when nothing at all was recalled, why. `sources` are the sources' reports; each item of the prompt's tail
    names its source in `meta["source"]`."""
    kept = list(prompt.tail) if prompt else []
    in_prompt = set(prompt.desk_ids) if prompt else {m.id for m in recall.desk}
    matched = {s.memory.id: round(s.similarity, 4) for s in recall.used}
    desk_detail = [
        {"id": m.id, "list": m.list.value, "days_unused": m.days_unused, "about": m.owner_id, "matched": matched.get(m.id)}
        for m in recall.desk
        if m.id in in_prompt
    ]
    tail_tokens: dict[str, int] = {}
    added: dict[str, list[dict[str, Any]]] = {}
    for item in kept:
        source = (item.meta or {}).get("source")
        part = sources[source].get("part", source) if source in sources else RECALLED_PART
        tail_tokens[part] = tail_tokens.get(part, 0) + count_tokens(item.text) + 1
        if source in sources:
            added.setdefault(source, []).append({k: v for k, v in (item.meta or {}).items() if k != "source"})
    for name, report in sources.items():
        report["items"] = added.get(name, [])
        if report.get("added") and not report["items"]:
            report["note"] = "the context budget was full (CHAT_CONTEXT_TOKENS), so they were left out"
    # the one-line answer to "why was nothing recalled?"; each part's own note says more
    full = (["memories"] if recall.recalled or recall.by_text else []) + [
        name for name, report in sources.items() if "budget" in str(report.get("note") or "")
    ]
    if recalled or added:
        overall = None
    elif not recall.search_ok:
        overall = f"the search failed ({recall.failure})"
    elif full:
        overall = f"the budget was full ({', '.join(full)})"
    else:
        overall = "nothing relevant"
    return {
        "memories": memory_reasons(recall, prompt),
        "desk_shares": {str(group): tokens for group, tokens in prompt.desk_shares.items()} if prompt else {},
        "desk_detail": desk_detail,
        "sources": sources,
        "tail_tokens": tail_tokens,
        "nothing_added_because": overall,
    }


def memory_reasons(recall: Recall, prompt: Prompt | None) -> list[dict[str, Any]]:
    """Every memory the reply's search gave the prompt (desk, recalled, today's comebacks), grouped by where it
    went (`desk`, `tail`, `left out`) and why, including the budget share that cut it: `[{where, why, ids}]`."""
    if prompt is None:
        return []
    on_desk, in_tail = set(prompt.desk_ids), {item.memory_id for item in prompt.tail}
    moved, used = set(prompt.moved_ids), {s.memory.id for s in recall.used}
    cut = {d.key: d.reason for d in prompt.dropped}
    groups: dict[tuple[str, str], list[int]] = {}

    def left_out(memory_id: int) -> tuple[str, str]:
        reason = cut.get(f"memory:{memory_id}", "")
        if reason == DESK_SHARE:
            why = "cut by the budget: its group's part of the desk's share of MEMORY_TOKEN_BUDGET was full (less recently used)"
        elif reason == TAIL_SHARE:
            why = "cut by the budget: the tail's share of MEMORY_TOKEN_BUDGET was full (lower score)"
        else:
            why = "cut by CHAT_CONTEXT_TOKENS" if reason else "not in the prompt"
        return "left out", why

    for memory in recall.desk:
        if memory.id in on_desk:
            key = ("desk", "on the desk, matched this message" if memory.id in used else "on the desk")
        elif memory.id in moved:
            key = ("tail", "matched this message; the desk's share of MEMORY_TOKEN_BUDGET could not hold it")
        else:
            key = left_out(memory.id)
        groups.setdefault(key, []).append(memory.id)
    comebacks = {s.memory.id for s in recall.held_back}
    for scored in (*recall.recalled, *recall.held_back):
        memory_id = scored.memory.id
        if memory_id not in in_tail:
            key = left_out(memory_id)
        elif memory_id in comebacks:
            key = ("tail", "joined the desk today (DESK_REFRESH=daily), shown near the end until the next chat day")
        else:
            key = ("tail", "recalled from the drawer: it matches this message")
        groups.setdefault(key, []).append(memory_id)
    return [{"where": where, "why": why, "ids": ids} for (where, why), ids in groups.items()]


def dry_run_text(recall: Recall, receipt: Receipt, names: dict[int, str]) -> str:
    """What an unconfigured bot says: plainly that no model is set, and what it would have sent."""
    lines = [
        "I have no chat model configured, so I can't answer yet. Set CHAT_MODEL plus CHAT_BASE_URL "
        "(any OpenAI-compatible server) or CHAT_API_KEY (OpenAI). This is what I would have sent:",
    ]
    in_prompt = set(receipt.desk_ids)
    desk = [m for m in recall.desk if m.id in in_prompt]
    lines.append(f"Desk: {len(desk)} active {'memory' if len(desk) == 1 else 'memories'}" + (":" if desk else "."))
    for memory in desk:
        about = f" about {user_label(memory.owner_id, names)}" if memory.owner_id else ""
        lines.append(f"  #{memory.id} [{memory.list.value}{about}, {memory.days_unused} days unused] {memory.text}")
    items = {item["id"]: item for item in receipt.recalled}
    recalled = [s.memory for s in (*recall.recalled, *recall.by_text) if s.memory.id in items]
    if recalled:
        lines.append("Recalled from the drawer (dormant, but they match this message):")
        lines += [f"  #{m.id} ({recalled_label(items[m.id])}) {m.text}" for m in recalled]
    else:
        lines.append(f"Recalled: nothing, because {receipt.nothing_recalled_because}.")
    for report in receipt.sources.values():
        if report.get("items"):
            heading = report.get("heading", report.get("title"))
            lines.append(f"{heading}: " + ", ".join(tail_item_label(item) for item in report["items"]) + ".")
    parts = token_parts(receipt.tokens)
    lines.append(f"Tokens: {receipt.tokens['total']} ({parts}).")
    return "\n".join(lines)
