"""Tail sources: what adds items near the end of the prompt besides recalled memories (older chat of the
channel, document passages, ...), and the budget loop they share.

A source is called once per reply with the memory search's `Recall`, whose `query_vector` is the
reply's one embedding: sources search with it and never embed anything themselves, so a reply costs
one embedding request however many lookups it makes. When that embedding failed (no vector), a
source may fall back to the message's words (PostgreSQL full-text search over the same rows, within
the same budget and rules) and marks what it found that way: `by_text` on each item, `BY_TEXT` in
what people read.

Each source keeps within its own token budget: items are taken best first, an item longer than what
is left is cut to fit (when a useful piece fits), and the budget is never exceeded. Every item is one
JSON object on one line, like memories: data the model reads, never instructions it follows. Each
source also tells the receipt what it did, or why it added nothing. Adding a source means writing one
module with a class like `bot.history.source.ChatHistorySource` and listing it where the services are
wired; neither the reply pipeline nor the receipt changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from bot.chat.messages import IncomingMessage
from bot.memory.models import Recall
from bot.prompt import HeadSummary, TailItem
from bot.tokens import count_tokens, encoding


@dataclass
class TailReport:
    """What a tail source adds, with what the receipt should say about it.

    `source` is the source's name (its key in the receipt); `note` says why it added nothing (None when
    it added something); `detail` is any small JSON-able extra for the receipt.
    """

    source: str
    items: list[TailItem]
    note: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)


class TailSource(Protocol):
    """One source of tail items. `name` keys it in receipts; `title` and `heading` name it for people
    ("chat history" in a receipt line, "Older chat of this channel" over a list); `part` names its share of
    the tail's tokens."""

    name: str
    title: str
    heading: str
    part: str

    async def find(self, message: IncomingMessage, recall: Recall) -> TailReport: ...


class SummarySource(Protocol):
    """What puts a channel's summaries into the prompt head: read once per reply, before the search."""

    async def for_prompt(self, channel_id: int, guild_id: int | None) -> list[HeadSummary]: ...


MIN_CUT_TOKENS = 24  # a cut piece shorter than this says too little to be worth its tokens


def item_tokens(text: str) -> int:
    """What the prompt builder counts for one tail item: its line plus the newline."""
    return count_tokens(text) + 1


def fit(render: Callable[[str], str], body: str, room: int) -> tuple[str, bool] | None:
    """`render(body)` if it fits `room` tokens, else `render` of the longest cut of `body` that fits, else None."""
    whole = render(body)
    if item_tokens(whole) <= room:
        return whole, False
    if room - item_tokens(render("…")) < MIN_CUT_TOKENS:
        return None
    tokens = encoding().encode(body, disallowed_special=())
    keep = min(len(tokens), room)
    while keep >= MIN_CUT_TOKENS:
        text = render(encoding().decode(tokens[:keep]).rstrip() + "…")
        over = item_tokens(text) - room
        if over <= 0:
            return text, True
        keep -= max(over, 1)  # JSON escapes (newlines, quotes) cost tokens too: shrink by what is over
    return None


BY_TEXT = "by text (the embedder was unavailable)"


def search_failed(recall: Recall) -> str:
    return f"the search failed: {recall.failure or 'no query embedding'}"


def nothing_by_text(recall: Recall, what: str) -> str:
    """Why a source's text fallback added nothing: the search failed, and no row shares a word with the message."""
    return f"{search_failed(recall)}; {BY_TEXT}: no {what} shares a word with the message"


def fallback_failed(recall: Recall, exc: Exception) -> str:
    """The text fallback failed too: the reply goes on without the source (the caller logs it)."""
    return f"{search_failed(recall)}; the search {BY_TEXT} failed too: {type(exc).__name__}"


def no_hits_note(
    searched: int, best_below: float | None, nothing_searched: str, what: str, setting: str, threshold: float
) -> str:
    """Why a search added nothing: nothing to search yet, or the best match was under the setting's threshold."""
    if searched == 0:
        return nothing_searched
    return f"nothing relevant: the best {what} scored {best_below:.2f}, under {setting} {threshold:g}"


@dataclass(frozen=True)
class Candidate:
    """One search hit as the budget loop sees it: both sources fill their budget the same way."""

    ident: tuple[str, int]  # ("chunk_id", 12): first in the receipt's meta, and what a skipped entry names
    key: str
    similarity: float
    body: str
    render: Callable[[str], str]  # the item's JSON line around a (possibly cut) body
    lead: dict[str, object] = field(default_factory=dict)  # receipt meta before the similarity
    trail: dict[str, object] = field(default_factory=dict)  # receipt meta after the token count and the cut flag


def fill(report: TailReport, kind: str, budget: int, candidates: list[Candidate], full_note: str) -> TailReport:
    """Add `candidates` (best first) to `report` within `budget` tokens, cutting one to fit where a useful piece does."""
    room = budget
    skipped: list[dict[str, Any]] = []
    for candidate in candidates:
        id_name, id_value = candidate.ident
        similarity = round(candidate.similarity, 4)
        fitted = fit(candidate.render, candidate.body, room)
        if fitted is None:
            skipped.append({id_name: id_value, "similarity": similarity})
            continue
        text, cut = fitted
        tokens = item_tokens(text)
        room -= tokens
        meta = {
            "source": report.source, id_name: id_value, **candidate.lead,
            "similarity": similarity, "tokens": tokens, "cut": cut, **candidate.trail,
        }
        report.items.append(TailItem(kind=kind, key=candidate.key, text=text, score=candidate.similarity, meta=meta))
    report.detail = {"budget": budget, "skipped_for_budget": skipped}
    if any(candidate.trail.get("by_text") for candidate in candidates):
        report.detail["by_text"] = True
    if not report.items:
        report.note = full_note
    return report
