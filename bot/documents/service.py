"""Documents: a server's `.txt` / `.md` files, split into passages, found by meaning.

An admin uploads a file (`/documents add`); it is split into passages of about PASSAGE_TOKENS
tokens along its paragraphs and Markdown headings (the heading path becomes the passage's
section), the passages are embedded in the current embedding space, and every reply in that
server searches them with its one query embedding. Documents do not decay and do not depend on
MEMORY_DECAY_ENABLED: they are reference material, searched whenever the embedder works.

Re-adding a file with the same name replaces it in one transaction. Passages that could not be
embedded at once (provider down) are "waiting for vector" and the background task embeds them.
"""

from __future__ import annotations

import hashlib
import logging
import re
import unicodedata
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg
import numpy as np

from bot.clock import Clock
from bot.config import Settings
from bot.db import Connection
from bot.documents import store
from bot.embeddings.providers import EmbeddingError
from bot.embeddings.service import Embeddings, split_at_threshold
from bot.errors import InvalidInput, NotFound
from bot.lexical import lexical_query
from bot.servers.models import Actor
from bot.servers.rules import require_manager
from bot.tokens import count_tokens, encoding

log = logging.getLogger(__name__)

SUFFIXES = (".txt", ".md", ".markdown")
MAX_DOCUMENTS_PER_SERVER = 50
MAX_NAME_CHARS = 100
PASSAGE_TOKENS = 200  # a passage grows by whole paragraphs up to about this size
PASSAGE_MAX_TOKENS = 320  # a longer paragraph is split by sentences, a longer sentence cut
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s+")




def clean_name(filename: str) -> str:
    name = " ".join(filename.replace("/", " ").replace("\\", " ").split())
    if not name.lower().endswith(SUFFIXES):
        raise InvalidInput(f"only .txt and .md files can be added; {name or 'this file'} is neither")
    if len(name) > MAX_NAME_CHARS:
        raise InvalidInput(f"the file name has {len(name)} characters; the limit is {MAX_NAME_CHARS}")
    return name


def decode_document(raw: bytes) -> str:
    """The file as text: UTF-8 (a BOM is fine), no binary content, control characters removed."""
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InvalidInput("the file is not UTF-8 text; save it as UTF-8 and add it again") from None
    if "\x00" in text:
        raise InvalidInput("the file looks binary, not text; add a .txt or .md file")
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = "".join(ch for ch in text if ch in "\n\t" or unicodedata.category(ch) != "Cc")
    if not text.strip():
        raise InvalidInput("the file is empty")
    return text


def _cut_tokens(text: str, limit: int) -> list[str]:
    """A text over `limit` tokens in pieces of at most `limit` tokens (a last resort for one huge sentence)."""
    tokens = encoding().encode(text, disallowed_special=())
    return [encoding().decode(tokens[start : start + limit]).strip() for start in range(0, len(tokens), limit)]


def _split_block(block: str) -> list[str]:
    """A paragraph within PASSAGE_MAX_TOKENS, else its sentences grouped up to PASSAGE_TOKENS."""
    if count_tokens(block) <= PASSAGE_MAX_TOKENS:
        return [block]
    pieces: list[str] = []
    for sentence in SENTENCE_END.split(block):
        pieces += [sentence] if count_tokens(sentence) <= PASSAGE_MAX_TOKENS else _cut_tokens(sentence, PASSAGE_TOKENS)
    grouped: list[str] = []
    for piece in pieces:
        if grouped and count_tokens(grouped[-1] + " " + piece) <= PASSAGE_TOKENS:
            grouped[-1] += " " + piece
        else:
            grouped.append(piece)
    return [piece for piece in grouped if piece.strip()]


def split_passages(text: str) -> list[tuple[str, str]]:
    """(section, text) passages of a document, in order.

    Paragraphs (blank-line separated) are kept whole where they fit; a Markdown heading closes the
    passage before it and names the ones after it ("Rules › Spam" for a `##` under a `#`).
    """
    passages: list[tuple[str, str]] = []
    headings: list[tuple[int, str]] = []
    current: list[str] = []

    def section() -> str:
        return " › ".join(title for _, title in headings)

    def close() -> None:
        if current:
            passages.append((section(), "\n\n".join(current)))
            current.clear()

    blocks: list[str] = []
    for paragraph in re.split(r"\n\s*\n", text):
        lines = paragraph.strip("\n").split("\n")
        buffer: list[str] = []
        for line in lines:  # a heading line is its own block even without blank lines around it
            if HEADING.match(line.strip()):
                if buffer:
                    blocks.append("\n".join(buffer))
                    buffer = []
                blocks.append(line.strip())
            else:
                buffer.append(line.rstrip())
        if buffer:
            blocks.append("\n".join(buffer))

    for block in blocks:
        if not block.strip():
            continue
        heading = HEADING.match(block)
        if heading and "\n" not in block:
            close()
            level = len(heading.group(1))
            headings[:] = [(lvl, title) for lvl, title in headings if lvl < level] + [(level, heading.group(2).strip())]
            continue
        for piece in _split_block(block.strip()):
            if current and count_tokens("\n\n".join([*current, piece])) > PASSAGE_TOKENS:
                close()
            current.append(piece)
    close()
    return passages


@dataclass(frozen=True)
class AddedDocument:
    id: int
    name: str
    passages: int
    embedded: int
    replaced: bool


@dataclass(frozen=True)
class DocumentInfo:
    id: int
    name: str
    size_bytes: int
    passages: int
    embedded: int
    added_by: int | None
    created_at: datetime


@dataclass(frozen=True)
class DocumentHit:
    passage_id: int
    document_id: int
    document: str
    section: str
    text: str
    similarity: float
    by_text: bool = False  # found by its words (the embedder was unavailable): `similarity` is a text rank


@dataclass(frozen=True)
class DocumentSearch:
    hits: list[DocumentHit]
    searched: int  # passages scored (0: this server has no embedded passage)
    best_below: float | None  # best similarity under DOCUMENT_MIN_SIMILARITY


def _hit(row: Any, *, by_text: bool = False) -> DocumentHit:
    return DocumentHit(
        passage_id=row["id"],
        document_id=row["document_id"],
        document=row["document"],
        section=row["section"],
        text=row["text"],
        similarity=float(row["similarity"]),
        by_text=by_text,
    )


class DocumentLibrary:
    """Add, list, delete and search a server's documents."""

    def __init__(self, pool: asyncpg.Pool, embeddings: Embeddings, settings: Settings, clock: Clock) -> None:
        self.pool = pool
        self.embeddings = embeddings  # the current embedding space (passages' vectors are its own)
        self.settings = settings
        self.clock = clock

    def check_upload(self, actor: Actor, size: int) -> None:
        """Before a file is read (adapters read at most DOCUMENT_MAX_BYTES + 1 bytes of it): Manage Server, and the size."""
        require_manager(actor, "only members with Manage Server can add documents")
        limit = self.settings.document_max_bytes
        if size > limit:
            raise InvalidInput(f"the file has {size:,} bytes; documents are limited to {limit:,} (DOCUMENT_MAX_BYTES)")

    async def add(self, guild_id: int, filename: str, raw: bytes, actor: Actor) -> AddedDocument:
        """Check, split, store (replacing a document of the same name) and embed what can be embedded now."""
        name = clean_name(filename)
        self.check_upload(actor, len(raw))
        passages = split_passages(decode_document(raw))
        if not passages:
            raise InvalidInput("the file has no text to search")
        async with self.pool.acquire() as conn, conn.transaction():
            await store.lock_documents(conn, guild_id)
            existing = await store.documents_of_guild(conn, guild_id, None)
            if len(existing) >= MAX_DOCUMENTS_PER_SERVER and name not in {row["name"] for row in existing}:
                raise InvalidInput(f"a server can have at most {MAX_DOCUMENTS_PER_SERVER} documents; delete one first")
            document_id, replaced = await store.insert_document(
                conn,
                guild_id=guild_id,
                name=name,
                size_bytes=len(raw),
                sha256=hashlib.sha256(raw).hexdigest(),
                added_by=actor.user_id,
                created_at=self.clock.now().astimezone(UTC),
                passages=passages,
            )
        embedded = await self._embed_document(document_id)
        return AddedDocument(document_id, name, len(passages), embedded, replaced)

    async def _embed_document(self, document_id: int) -> int:
        """Embed a new document's passages in batches; stop at the first failure (the background task goes on later)."""
        space = await self.embeddings.space_id()
        if space is None:
            return 0
        done = 0

        async def count(stored: int) -> None:
            nonlocal done
            done += stored

        try:
            await self.embeddings.fill(self.embeddings.passages_of(document_id), space, count)
        except EmbeddingError as exc:
            log.warning("Document %s: embedding paused after %d passages: %s", document_id, done, exc)
            self.embeddings.want_vectors()
        return done

    async def list(self, guild_id: int) -> list[DocumentInfo]:
        space = await self.embeddings.space_id()
        async with self.pool.acquire() as conn:
            rows = await store.documents_of_guild(conn, guild_id, space)
        return [
            DocumentInfo(
                id=row["id"],
                name=row["name"],
                size_bytes=row["size_bytes"],
                passages=row["passages"],
                embedded=row["embedded"],
                added_by=row["added_by"],
                created_at=row["created_at"],
            )
            for row in rows
        ]

    async def delete(self, guild_id: int, document_id: int, actor: Actor) -> str:
        require_manager(actor, "only members with Manage Server can delete documents")
        async with self.pool.acquire() as conn:
            name = await store.delete_document(conn, guild_id, document_id)
        if name is None:
            raise NotFound(f"there is no document #{document_id} in this server")
        return name

    async def search(self, guild_id: int, query_vector: np.ndarray) -> DocumentSearch:
        """The passages of this server's documents that match the reply's query embedding (never embeds itself)."""
        space = await self.embeddings.space_id()
        if space is None:
            return DocumentSearch([], 0, None)
        async with self.pool.acquire() as conn:
            rows = await store.search_passages(
                conn, guild_id=guild_id, space=space, vector=query_vector, limit=self.settings.document_max_results + 1
            )
        kept, best_below = split_at_threshold(rows, self.settings.document_min_similarity, self.settings.document_max_results)
        return DocumentSearch([_hit(row) for row in kept], len(rows), best_below)

    async def search_by_text(self, guild_id: int, text: str) -> DocumentSearch:
        """The text fallback, for a reply whose message could not be embedded: passages sharing a word with it.

        Read-only like `search`, this server's documents only, at most DOCUMENT_MAX_RESULTS, best
        `ts_rank` first (any shared word will do: a text rank is no similarity to hold a threshold
        against). `searched` counts the passages that share a word.
        """
        words = lexical_query(text).words
        if not words:
            return DocumentSearch([], 0, None)
        async with self.pool.acquire() as conn:
            rows = await store.search_passages_by_text(
                conn, guild_id=guild_id, words=words, limit=self.settings.document_max_results
            )
        return DocumentSearch([_hit(row, by_text=True) for row in rows], len(rows), None)

    async def forget_user(self, conn: Connection, user_id: int) -> dict[str, int]:
        """A user's part of delete-my-data: documents stay with their server, no longer naming the uploader."""
        await store.forget_document_uploader(conn, user_id)
        return {}


def describe_size(size: int) -> str:
    return f"{size / 1024:.1f} KiB" if size >= 1024 else f"{size} bytes"
