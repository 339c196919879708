"""The per-reply search: one embedding of the latest message, then one statement that reads, scores and ages.

SQL lives in `search_store`; the rules are in docs/memory-rules.md ("The search on every reply").
"""

from __future__ import annotations

import logging

import asyncpg

from bot.clock import Clock, utc_now
from bot.config import Settings
from bot.embeddings.service import Embeddings
from bot.lexical import lexical_query
from bot.memory import search_store
from bot.memory.decay import Decay
from bot.memory.desk_ranks import DeskRanks
from bot.memory.models import Conversation, Memory, MemoryList, Recall, ScoredMemory
from bot.memory.visibility import context_words
from bot.servers.service import Servers

log = logging.getLogger(__name__)

NEVER = 2**31 - 1  # "days_unused below this" = every memory, for the desk when nothing decays


def prompt_order(memory: Memory) -> tuple[bool, int, int]:
    """Prompt order of the desk: server memories by id, then personal memories grouped by user, each by id."""
    return (memory.list != MemoryList.SERVER, memory.owner_id or 0, memory.id)


def desk_order(memories: list[Memory]) -> list[Memory]:
    return sorted(memories, key=prompt_order)


def best_first(items: list[ScoredMemory]) -> list[ScoredMemory]:
    return sorted(items, key=lambda s: (-s.similarity, s.memory.id))


class ReplySearch:
    """The search every reply runs, and the desk's day-frozen ranks."""

    def __init__(
        self, pool: asyncpg.Pool, embeddings: Embeddings, settings: Settings, clock: Clock, servers: Servers, decay: Decay
    ) -> None:
        self.pool = pool
        self.embeddings = embeddings
        self.settings = settings
        self.clock = clock
        self.servers = servers
        self.decay = decay
        # which desk memories the prompt keeps first when the desk outgrows its budget (frozen per chat day)
        self.desk_ranks = DeskRanks()

    async def reply_search(self, conversation: Conversation) -> Recall:
        """One embedding of the latest message, then one statement that reads, scores and ages."""
        persona = await self.servers.persona_id(conversation.guild_id)
        space = await self.embeddings.space_id()
        vector, failure = await self.embeddings.embed_one(conversation.text)
        now, today = utc_now(self.clock)
        decays = self.decay.active
        daily = decays and self.settings.desk_refresh == "daily"
        dormant_after = self.settings.dormant_after_days
        async with self.pool.acquire() as conn:
            rows = await search_store.reply_search(
                conn,
                guild_id=conversation.guild_id,
                persona_id=persona,
                channel_id=conversation.channel_id,
                participants=conversation.participants,
                context_words=context_words((*conversation.context_texts, conversation.text)),
                query_vector=vector if decays else None,
                space=space,
                min_similarity=self.settings.min_similarity,
                max_used=self.settings.max_used,
                now=now,
                today=today,
                # daily: a memory that went dormant today stays on today's desk
                desk_below_days=(dormant_after + 1 if daily else dormant_after) if decays else NEVER,
                max_recalled=self.settings.max_recalled,
                dormant_after=dormant_after,
                lexical=lexical_query(conversation.text) if decays and self.settings.lexical_weight > 0 else None,
                lexical_weight=self.settings.lexical_weight,
            )
        desk, used, recalled, held_back = self._sort_out(rows, daily=daily)
        by_text: list[ScoredMemory] = []
        if vector is None and decays:  # the search failed: the drawer can still be read by its words
            shown = [m.id for m in desk] + [s.memory.id for s in held_back]
            by_text = await self._found_by_text(conversation, persona, shown)
        desk = desk_order(desk)
        return Recall(
            search_ok=vector is not None,
            failure=failure,
            persona_id=persona,
            desk=desk,
            used=best_first(used),
            recalled=best_first(recalled),
            query_vector=vector,
            held_back=best_first(held_back),
            by_text=by_text,
            desk_ranks=self.desk_ranks.ranks(conversation.guild_id, persona, desk, today),
        )

    def _sort_out(
        self, rows: list[asyncpg.Record], *, daily: bool
    ) -> tuple[list[Memory], list[ScoredMemory], list[ScoredMemory], list[ScoredMemory]]:
        """The snapshot's memories as the desk, the used ones, the recalled ones and (DESK_REFRESH=daily) those
        held back: active, but not on the desk this morning."""
        desk: list[Memory] = []
        used: list[ScoredMemory] = []
        recalled: list[ScoredMemory] = []
        held_back: list[ScoredMemory] = []
        for row in rows:
            memory = Memory.from_row(row)
            dormant = self.decay.is_dormant(memory)
            match = row["match_similarity"]
            scored = ScoredMemory(memory, float(match) if match is not None else 0.0)
            if row["on_desk_this_morning"] if daily else not dormant:
                desk.append(memory)
            elif match is not None and dormant:
                recalled.append(scored)
            elif not dormant:
                held_back.append(scored)
            if row["used_similarity"] is not None:
                used.append(scored)
        return desk, used, recalled, held_back

    async def _found_by_text(self, conversation: Conversation, persona: int, shown: list[int]) -> list[ScoredMemory]:
        """The text fallback of a failed search: dormant memories sharing a word with the message, read-only.

        As many as a search would recall (MAX_RECALLED, or MAX_USED when that is 0), under the search's
        own visibility rules. A failure here is logged and the reply goes on without them: the fallback
        only adds to a reply, it must never be the reason one fails.
        """
        words = lexical_query(conversation.text).words
        if not words:
            return []
        try:
            async with self.pool.acquire() as conn:
                rows = await search_store.text_search(
                    conn,
                    guild_id=conversation.guild_id,
                    persona_id=persona,
                    channel_id=conversation.channel_id,
                    participants=conversation.participants,
                    context_words=context_words((*conversation.context_texts, conversation.text)),
                    words=words,
                    dormant_after=self.settings.dormant_after_days,
                    limit=self.settings.max_recalled or self.settings.max_used,
                    exclude_ids=shown,
                )
        except Exception:
            log.exception("The text fallback for memories failed; the reply goes on without it")
            return []
        return [ScoredMemory(Memory.from_row(row), float(row["rank"])) for row in rows]
