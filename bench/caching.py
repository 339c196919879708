"""An embedder wrapper that embeds each distinct text once, for replays that repeat texts across variants.

The LoCoMo replay sends the same ~10k texts through every variant; embedding them once up front
in batches (`prefill`) and serving the cached vectors keeps the replay about the memory rules
rather than the model. Vectors are the built-in model's, bit for bit, so results are unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np

from bot.embeddings.providers import BuiltinEmbedder, EmbeddingSpace


class CachingEmbedder:
    def __init__(self, inner: BuiltinEmbedder) -> None:
        self.inner = inner
        self._vectors: dict[str, np.ndarray] = {}

    @property
    def space(self) -> EmbeddingSpace:
        return self.inner.space

    def prefill(self, texts: Iterable[str], batch: int = 64, progress: Callable[[int, int], None] | None = None) -> None:
        """Embed every text not cached yet, in batches (the model is much faster per text in a batch)."""
        missing = list(dict.fromkeys(text for text in texts if text not in self._vectors))
        for start in range(0, len(missing), batch):
            chunk = missing[start : start + batch]
            for text, vector in zip(chunk, self.inner.encode_now(chunk), strict=True):
                self._vectors[text] = vector
            if progress is not None:
                progress(min(start + batch, len(missing)), len(missing))

    def vector(self, text: str) -> np.ndarray:
        if text not in self._vectors:
            self.prefill([text])
        return self._vectors[text]

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([self.vector(text) for text in texts]) if texts else np.zeros((0, 512), dtype=np.float32)
