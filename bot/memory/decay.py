"""Whether memories decay, and what follows from it: which memories are dormant, and the tail's share of the budget."""

from __future__ import annotations

from bot.config import Settings
from bot.embeddings.service import Embeddings
from bot.memory.models import Memory


class Decay:
    """Decay needs the switch on (MEMORY_DECAY_ENABLED) and an embedding model; otherwise every memory stays active."""

    def __init__(self, settings: Settings, embeddings: Embeddings) -> None:
        self.settings = settings
        self.embeddings = embeddings

    @property
    def active(self) -> bool:
        return self.settings.memory_decay_enabled and self.embeddings.space is not None

    @property
    def tail_reserve(self) -> float:
        """The share of MEMORY_TOKEN_BUDGET kept for this reply's matches (TAIL_RESERVE). With decay off nothing is
        matched or recalled, so none is kept and the desk may take the whole budget."""
        return self.settings.tail_reserve if self.active else 0.0

    def is_dormant(self, memory: Memory) -> bool:
        return self.active and memory.days_unused >= self.settings.dormant_after_days
