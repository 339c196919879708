"""The reply pipeline's tail sources of issue 4: recalled chat history and document passages (SPEC §5 part 5).

Each source is called once per reply with the core's `Recall`, whose `query_vector` is the reply's
one embedding: the sources search with it and never embed anything themselves, so a reply costs one
embedding request however many lookups it makes. A failed search (no vector) adds nothing.

Each source keeps within its own token budget (HISTORY_TOKEN_BUDGET, DOCUMENT_TOKEN_BUDGET): items
are taken best first, an item longer than what is left is cut to fit (when a useful piece fits), and
the budget is never exceeded. Every item is one JSON object on one line, like memories: data the
model reads, never instructions it follows. Each source also tells the receipt what it did, or why
it added nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from bot.memory.documents import DocumentHit, DocumentLibrary
from bot.memory.history import HistoryHit, HistoryIndex
from bot.memory.models import Recall
from bot.pipeline import DOCUMENT_KIND, HISTORY_KIND, IncomingMessage, TailReport, TailSource
from bot.prompt import TailItem, count_tokens, encoding, quoted

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


def _when(start: datetime, end: datetime) -> str:
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    if start.date() == end.date():
        return f"{start:%Y-%m-%d %H:%M}–{end:%H:%M} UTC"
    return f"{start:%Y-%m-%d %H:%M} – {end:%Y-%m-%d %H:%M} UTC"


def _search_failed(recall: Recall) -> str:
    return f"the search failed: {recall.failure or 'no query embedding'}"


def _no_hits_note(
    searched: int, best_below: float | None, nothing_searched: str, what: str, setting: str, threshold: float
) -> str:
    """Why a search added nothing: nothing to search yet, or the best match was under the setting's threshold."""
    if searched == 0:
        return nothing_searched
    return f"nothing relevant: the best {what} scored {best_below:.2f}, under {setting} {threshold:g}"


@dataclass(frozen=True)
class _Candidate:
    """One search hit as the budget loop sees it: both sources fill their budget the same way."""

    ident: tuple[str, int]  # ("chunk_id", 12): first in the receipt's meta, and what a skipped entry names
    key: str
    similarity: float
    body: str
    render: Callable[[str], str]  # the item's JSON line around a (possibly cut) body
    lead: dict[str, object] = field(default_factory=dict)  # receipt meta before the similarity
    trail: dict[str, object] = field(default_factory=dict)  # receipt meta after the token count and the cut flag


def _fill(report: TailReport, kind: str, budget: int, candidates: list[_Candidate], full_note: str) -> TailReport:
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
        meta = {id_name: id_value, **candidate.lead, "similarity": similarity, "tokens": tokens, "cut": cut, **candidate.trail}
        report.items.append(TailItem(kind=kind, key=candidate.key, text=text, score=candidate.similarity, meta=meta))
    report.detail = {"budget": budget, "skipped_for_budget": skipped}
    if not report.items:
        report.note = full_note
    return report


def _chat_candidate(hit: HistoryHit) -> _Candidate:
    when = _when(hit.started_at, hit.ended_at)

    def render(body: str) -> str:
        return quoted({"when": when, "messages": hit.messages, "chat": body})

    return _Candidate(
        ("chunk_id", hit.chunk_id), f"history:{hit.chunk_id}", hit.similarity, hit.text, render,
        trail={"when": when, "messages": hit.messages},
    )


def _passage_candidate(hit: DocumentHit) -> _Candidate:
    def render(body: str) -> str:
        shown: dict[str, object] = {"document": hit.document}
        if hit.section:
            shown["section"] = hit.section
        shown["text"] = body
        return quoted(shown)

    return _Candidate(
        ("passage_id", hit.passage_id), f"passage:{hit.passage_id}", hit.similarity, hit.text, render,
        lead={"document": hit.document, "section": hit.section},
    )


def history_source(history: HistoryIndex) -> TailSource:
    """Older messages of this channel (outside the context window) that match the message being answered."""

    async def recalled_chat_history(message: IncomingMessage, recall: Recall) -> TailReport:
        settings = history.settings
        report = TailReport("history", [])
        budget = settings.history_token_budget
        if budget <= 0:
            report.note = "history recall is off (HISTORY_TOKEN_BUDGET is 0)"
            return report
        if recall.query_vector is None:
            report.note = _search_failed(recall)
            return report
        found = await history.search(
            channel_id=message.channel_id,
            answered_message_id=message.message_id,
            query_vector=recall.query_vector,
            parent_channel_id=message.parent_channel_id,
        )
        if not found.enabled:
            report.note = "history recall is off in this channel; its messages are still stored"
            return report
        if not found.hits:
            report.note = _no_hits_note(
                found.searched, found.best_below, "no older chat of this channel is chunked and embedded yet",
                "older chat", "HISTORY_MIN_SIMILARITY", settings.history_min_similarity,
            )
            return report
        candidates = [_chat_candidate(hit) for hit in found.hits]
        return _fill(report, HISTORY_KIND, budget, candidates, f"the history budget was full (HISTORY_TOKEN_BUDGET {budget})")

    recalled_chat_history.section = "history"  # type: ignore[attr-defined]  # the receipt's name for it, also on failure
    return recalled_chat_history


def document_source(documents: DocumentLibrary) -> TailSource:
    """Passages of this server's documents that match the message being answered."""

    async def document_passages(message: IncomingMessage, recall: Recall) -> TailReport:
        settings = documents.settings
        report = TailReport("documents", [])
        budget = settings.document_token_budget
        if message.guild_id is None:
            report.note = "documents belong to servers; there are none in direct messages"
            return report
        if budget <= 0:
            report.note = "documents are off (DOCUMENT_TOKEN_BUDGET is 0)"
            return report
        if recall.query_vector is None:
            report.note = _search_failed(recall)
            return report
        found = await documents.search(message.guild_id, recall.query_vector)
        if not found.hits:
            report.note = _no_hits_note(
                found.searched, found.best_below, "this server has no embedded documents",
                "passage", "DOCUMENT_MIN_SIMILARITY", settings.document_min_similarity,
            )
            return report
        candidates = [_passage_candidate(hit) for hit in found.hits]
        return _fill(report, DOCUMENT_KIND, budget, candidates, f"the document budget was full (DOCUMENT_TOKEN_BUDGET {budget})")

    document_passages.section = "documents"  # type: ignore[attr-defined]
    return document_passages


def install(pipeline_sources: list[TailSource], history: HistoryIndex, documents: DocumentLibrary) -> None:
    """Register both sources on a pipeline's `tail_sources` (the bot and the console do the same)."""
    pipeline_sources.extend([history_source(history), document_source(documents)])
