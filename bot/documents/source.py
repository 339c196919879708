"""Passages of this server's documents that match the message being answered."""

from __future__ import annotations

import logging

from bot.chat.messages import IncomingMessage
from bot.chat.sources import Candidate, TailReport, fallback_failed, fill, no_hits_note, nothing_by_text
from bot.documents.service import DocumentHit, DocumentLibrary
from bot.memory.models import Recall
from bot.prompt import quoted

KIND = "document_passage"

log = logging.getLogger(__name__)


def _passage_candidate(hit: DocumentHit) -> Candidate:
    def render(body: str) -> str:
        shown: dict[str, object] = {"document": hit.document}
        if hit.section:
            shown["section"] = hit.section
        shown["text"] = body
        return quoted(shown)

    return Candidate(
        ("passage_id", hit.passage_id), f"passage:{hit.passage_id}", hit.similarity, hit.text, render,
        lead={"document": hit.document, "section": hit.section}, trail={"by_text": True} if hit.by_text else {},
    )


class DocumentSource:
    name = "documents"
    title = "documents"
    heading = "Document passages"
    part = "documents"

    def __init__(self, documents: DocumentLibrary) -> None:
        self.documents = documents

    async def find(self, message: IncomingMessage, recall: Recall) -> TailReport:
        settings = self.documents.settings
        report = TailReport(self.name, [])
        budget = settings.document_token_budget
        if message.guild_id is None:
            report.note = "documents belong to servers; there are none in direct messages"
            return report
        if budget <= 0:
            report.note = "documents are off (DOCUMENT_TOKEN_BUDGET is 0)"
            return report
        if recall.query_vector is None:
            return await self._by_text(message.guild_id, message, recall, report, budget)
        found = await self.documents.search(message.guild_id, recall.query_vector)
        if not found.hits:
            report.note = no_hits_note(
                found.searched, found.best_below, "this server has no embedded documents",
                "passage", "DOCUMENT_MIN_SIMILARITY", settings.document_min_similarity,
            )
            return report
        candidates = [_passage_candidate(hit) for hit in found.hits]
        return fill(report, KIND, budget, candidates, f"the document budget was full (DOCUMENT_TOKEN_BUDGET {budget})")

    async def _by_text(
        self, guild_id: int, message: IncomingMessage, recall: Recall, report: TailReport, budget: int
    ) -> TailReport:
        """The message could not be embedded: passages sharing its words, within the same budget.

        A failure here is logged and only this source goes without: the fallback must never cost the reply.
        """
        try:
            found = await self.documents.search_by_text(guild_id, message.text)
        except Exception as exc:
            log.exception("The text fallback for documents failed for message %s", message.message_id)
            report.note = fallback_failed(recall, exc)
            return report
        if not found.hits:
            report.note = nothing_by_text(recall, "document passage of this server")
            return report
        candidates = [_passage_candidate(hit) for hit in found.hits]
        return fill(report, KIND, budget, candidates, f"the document budget was full (DOCUMENT_TOKEN_BUDGET {budget})")
