"""Passages of this server's documents that match the message being answered."""

from __future__ import annotations

from bot.chat.messages import IncomingMessage
from bot.chat.sources import Candidate, TailReport, fill, no_hits_note, search_failed
from bot.documents.service import DocumentHit, DocumentLibrary
from bot.memory.models import Recall
from bot.prompt import quoted

KIND = "document_passage"


def _passage_candidate(hit: DocumentHit) -> Candidate:
    def render(body: str) -> str:
        shown: dict[str, object] = {"document": hit.document}
        if hit.section:
            shown["section"] = hit.section
        shown["text"] = body
        return quoted(shown)

    return Candidate(
        ("passage_id", hit.passage_id), f"passage:{hit.passage_id}", hit.similarity, hit.text, render,
        lead={"document": hit.document, "section": hit.section},
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
            report.note = search_failed(recall)
            return report
        found = await self.documents.search(message.guild_id, recall.query_vector)
        if not found.hits:
            report.note = no_hits_note(
                found.searched, found.best_below, "this server has no embedded documents",
                "passage", "DOCUMENT_MIN_SIMILARITY", settings.document_min_similarity,
            )
            return report
        candidates = [_passage_candidate(hit) for hit in found.hits]
        return fill(report, KIND, budget, candidates, f"the document budget was full (DOCUMENT_TOKEN_BUDGET {budget})")
