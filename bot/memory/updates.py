"""The model's updates: a reply's `update_memory` and the day-end notes' corrections.

A model's update replaces a memory's text only when the new text is about the same subject as the old one
(`bot.memory.relatedness`, UPDATE_MIN_SIMILARITY). Otherwise it is not applied as an update: the new text is
saved as a new memory of the same list (through the same rules as any save), the old memory is kept, and the
result says so, so a small model's mistake cannot erase a fact. The rules are in docs/memory-rules.md
("Versions and day-end notes").
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import asyncpg
import numpy as np

from bot.config import Settings
from bot.embeddings.providers import EmbeddingError
from bot.embeddings.service import Embeddings
from bot.errors import InvalidInput
from bot.memory import notes_store, store, versions_store
from bot.memory.models import Memory, NewMemory, Rejection, SaveResult, Source
from bot.memory.relatedness import asked_to_forget, same_subject
from bot.memory.saves import SaveCheck, _rejected
from bot.memory.visibility import clean_text, context_words
from bot.memory.writes import MemoryWrites
from bot.servers.service import Servers

log = logging.getLogger(__name__)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    norm = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(np.dot(a, b) / norm) if norm else 0.0


class ModelUpdates:
    """The model's updates (applied, or saved beside the memory), and what the day-end notes read: a part of the
    memory service that goes through `writes` for every change."""

    def __init__(
        self, pool: asyncpg.Pool, embeddings: Embeddings, settings: Settings, servers: Servers, writes: MemoryWrites
    ) -> None:
        self.pool = pool
        self.embeddings = embeddings
        self.settings = settings
        self.servers = servers
        self.writes = writes

    async def update_by_model(
        self,
        memory_id: int,
        text: str,
        *,
        by: int,
        guild_id: int | None,
        via: Source = Source.BOT,
        by_can_manage: bool = False,
        reason: str = "",
        search_available: bool = True,
        check: SaveCheck | None = None,
        source_messages: tuple[tuple[int, int, int], ...] = (),
        declared_change: bool = False,
    ) -> SaveResult:
        """Apply the model's new text to a memory, or, when it is about something else, save it as a new memory.

        `guild_id` is where the change happens (None: a DM); a new memory is saved there, in the same list and
        with the same owner, channels and tags as the one kept. `result.kept_apart_from` names the kept memory.
        """
        try:
            cleaned = clean_text(text, self.settings.memory_max_chars)
        except InvalidInput as exc:
            return _rejected(Rejection.INVALID_TEXT, str(exc))
        async with self.pool.acquire() as conn:
            memory = await store.get_memory(conn, memory_id)
            if memory is None:
                return _rejected(Rejection.NOT_ALLOWED, f"there is no memory #{memory_id}")
            refusal = await self.writes.change_refusal(conn, memory, by, via, by_can_manage, deleting=False)
        if refusal is not None:
            return refusal
        if await self.is_same_subject(memory, cleaned, declared_change=declared_change):
            return await self.writes.edit(
                memory_id, cleaned, by=by, via=via, by_can_manage=by_can_manage, reason=reason, check=check,
                source_messages=source_messages,
            )
        beside = NewMemory(
            list=memory.list,
            text=cleaned,
            by=by,
            via=via,
            guild_id=memory.guild_id if memory.guild_id is not None else guild_id,
            owner_id=memory.owner_id,
            tags=memory.tags,
            channel_ids=memory.channel_ids,
            source_messages=source_messages,
        )
        return await self._save_beside(memory, beside, search_available=search_available, check=check)

    async def forget_by_model(self, memory_id: int, asked: str, *, by: int, by_can_manage: bool = False) -> SaveResult:
        """The model's `forget_memory`, asked by the message `asked`: refused when the message is about something
        else than the memory, so a small model's wrong id cannot erase a fact; otherwise a delete like any other."""
        async with self.pool.acquire() as conn:
            memory = await store.get_memory(conn, memory_id)
        if memory is not None and not asked_to_forget(
            memory.text, asked, await self._cosine_to(memory, asked), self.settings.update_min_similarity
        ):
            return _rejected(
                Rejection.INVALID_TEXT,
                f"memory #{memory_id} is \"{memory.text}\", which the message does not ask to forget; nothing was "
                "forgotten. Forget only a memory the message is about",
            )
        return await self.writes.delete(memory_id, by=by, via=Source.BOT, by_can_manage=by_can_manage)

    async def is_same_subject(self, memory: Memory, new_text: str, *, declared_change: bool = False) -> bool:
        """Whether `new_text` may replace `memory`'s text as an update (by its stored vector when it has one)."""
        cosine = await self._cosine_to(memory, new_text)
        return same_subject(
            memory.text, new_text, cosine, self.settings.update_min_similarity, declared_change=declared_change
        )

    async def _cosine_to(self, memory: Memory, new_text: str) -> float | None:
        """How close `new_text` is to the memory, by its stored vector when it has one; None when nothing can be
        embedded now (then the words alone decide)."""
        cosine = None
        space = await self.embeddings.space_id()
        if space is not None:
            try:
                async with self.pool.acquire() as conn:
                    old = await store.vector_of(conn, memory.id, space)
                texts = [new_text] if old is not None else [new_text, memory.text]
                vectors = await self.embeddings.embedder.embed(texts)
                cosine = _cosine(np.asarray(old if old is not None else vectors[1]), np.asarray(vectors[0]))
            except EmbeddingError as exc:
                log.warning("Could not embed a text to compare it with memory #%s, judging by its words: %s", memory.id, exc)
        return cosine

    async def _save_beside(
        self, memory: Memory, request: NewMemory, *, search_available: bool, check: SaveCheck | None
    ) -> SaveResult:
        result = await self.writes.save(request, search_available=search_available, check=check)
        if result.saved is not None:
            result.kept_apart_from = memory.id
            if not result.repeated:
                result.detail = (
                    f"the new text is about something else than memory #{memory.id}, so it was saved as a new memory "
                    f"#{result.saved.id} and #{memory.id} was kept"
                )
        return result

    async def memories_for_notes(
        self, guild_id: int | None, channel_id: int, people: Sequence[int], texts: Sequence[str], limit: int = 2_000
    ) -> list[tuple[Memory, np.ndarray | None]]:
        """What a chat day of `people` in `channel_id` may correct: the memories a reply there could see (the server
        list, their personal lists; hidden ones left out, `texts` deciding tags), each with its vector or None.
        Read-only: no counter moves."""
        space = await self.embeddings.space_id()
        persona = await self.servers.persona_id(guild_id)
        async with self.pool.acquire() as conn:
            rows = await notes_store.visible_memories(
                conn, guild_id=guild_id, persona_id=persona, channel_id=channel_id, people=people,
                context_words=context_words(texts), space=space if space is not None else -1, limit=limit,
            )
        found = []
        for row in rows:
            vector = row["embedding"]
            if vector is not None:
                vector = np.asarray(vector.to_numpy() if hasattr(vector, "to_numpy") else vector, dtype=np.float32)
            found.append((Memory.from_row(row), vector))
        return found

    async def current_texts(self, texts: Sequence[str], guild_id: int | None, owner_ids: Sequence[int]) -> dict[str, str]:
        """Which of `texts` are earlier texts of a memory (this server's, or of `owner_ids`), and that memory's text
        now: a week summary folds the corrected facts, not the ones a later day replaced."""
        if not texts:
            return {}
        async with self.pool.acquire() as conn:
            return await versions_store.current_texts(conn, texts, guild_id, owner_ids)
