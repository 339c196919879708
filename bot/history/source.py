"""Older messages of the channel (outside the context window) that match the message being answered."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from bot.chat.messages import IncomingMessage
from bot.chat.sources import Candidate, TailReport, fallback_failed, fill, no_hits_note, nothing_by_text
from bot.history.service import HistoryHit, HistoryIndex
from bot.memory.models import Recall
from bot.prompt import quoted

KIND = "recalled_chat_history"
OFF_HERE = "history recall is off in this channel; its messages are still stored"

log = logging.getLogger(__name__)


def _when(start: datetime, end: datetime) -> str:
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    if start.date() == end.date():
        return f"{start:%Y-%m-%d %H:%M}–{end:%H:%M} UTC"
    return f"{start:%Y-%m-%d %H:%M} – {end:%Y-%m-%d %H:%M} UTC"


def _chat_candidate(hit: HistoryHit) -> Candidate:
    when = _when(hit.started_at, hit.ended_at)

    def render(body: str) -> str:
        return quoted({"when": when, "messages": hit.messages, "chat": body})

    return Candidate(
        ("chunk_id", hit.chunk_id), f"history:{hit.chunk_id}", hit.similarity, hit.text, render,
        trail={"when": when, "messages": hit.messages, **({"by_text": True} if hit.by_text else {})},
    )


class ChatHistorySource:
    name = "history"
    title = "chat history"
    heading = "Older chat of this channel"
    part = "chat_history"

    def __init__(self, history: HistoryIndex) -> None:
        self.history = history

    async def find(self, message: IncomingMessage, recall: Recall) -> TailReport:
        settings = self.history.settings
        report = TailReport(self.name, [])
        budget = settings.history_token_budget
        if budget <= 0:
            report.note = "history recall is off (HISTORY_TOKEN_BUDGET is 0)"
            return report
        if recall.query_vector is None:
            return await self._by_text(message, recall, report, budget)
        found = await self.history.search(
            channel_id=message.channel_id,
            answered_message_id=message.message_id,
            query_vector=recall.query_vector,
            parent_channel_id=message.parent_channel_id,
        )
        if not found.enabled:
            report.note = OFF_HERE
            return report
        if not found.hits:
            report.note = no_hits_note(
                found.searched, found.best_below, "no older chat of this channel is chunked and embedded yet",
                "older chat", "HISTORY_MIN_SIMILARITY", settings.history_min_similarity,
            )
            return report
        candidates = [_chat_candidate(hit) for hit in found.hits]
        return fill(report, KIND, budget, candidates, f"the history budget was full (HISTORY_TOKEN_BUDGET {budget})")

    async def _by_text(self, message: IncomingMessage, recall: Recall, report: TailReport, budget: int) -> TailReport:
        """The message could not be embedded: older chat sharing its words, within the same budget and rules.

        A failure here is logged and only this source goes without: the fallback must never cost the reply.
        """
        try:
            found = await self.history.search_by_text(
                channel_id=message.channel_id,
                answered_message_id=message.message_id,
                text=message.text,
                parent_channel_id=message.parent_channel_id,
            )
        except Exception as exc:
            log.exception("The text fallback for chat history failed for message %s", message.message_id)
            report.note = fallback_failed(recall, exc)
            return report
        if not found.enabled:
            report.note = OFF_HERE
            return report
        if not found.hits:
            report.note = nothing_by_text(recall, "older chat of this channel")
            return report
        candidates = [_chat_candidate(hit) for hit in found.hits]
        return fill(report, KIND, budget, candidates, f"the history budget was full (HISTORY_TOKEN_BUDGET {budget})")
