"""Calibrate MIN_SIMILARITY: how well does one cosine threshold separate real matches from chatter?

A memory counts as "used" on a reply when the cosine similarity between the latest message and the
memory text is at least MIN_SIMILARITY. Too low and chatter pulls unrelated
memories back onto the desk (longer, costlier prompts, and nothing ever decays); too high and a
person asking "how is Mochi?" gets no recall. The right value depends on the embedding model, so
it is measured, not guessed: a hand-written set of (memory, message, match) pairs in
tests/data/calibration.jsonl is scored with an embedder and every candidate threshold is judged
by precision, recall and F1, overall and per language (English, Spanish, and mixed pairs where the
memory and the message are in different languages).

Everything here except `run_cli` is a pure function of its arguments (no Discord, no database,
no settings), so tests can feed hand-made scores and the CLI can feed any configured embedder.
The measurement is per pair, ignoring MAX_USED: a threshold that is right pair by pair is the
floor the top-k selection then works above.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np

from bot import shutdown
from bot.config import Settings

DEFAULT_FILE = Path(__file__).resolve().parents[2] / "tests" / "data" / "calibration.jsonl"
LANGS = ("en", "es", "mixed")
KINDS = ("paraphrase", "question", "mention", "offtopic", "near-topic")
MATCH_KINDS = frozenset({"paraphrase", "question", "mention"})
# 0.00 .. 0.90 in steps of 0.01: fine enough that the best threshold is not an artifact of the
# grid, and covers every sensible cosine cut-off of normalized sentence embedders.
DEFAULT_THRESHOLDS: tuple[float, ...] = tuple(round(i / 100, 2) for i in range(91))
# The printed table shows every 0.05 (plus the best and the configured value): 91 rows hide the shape.
TABLE_STEP = 0.05
# Calibration is offline and measures similarity, not latency: a slow provider or a cold
# built-in model must not fail it because of the per-reply EMBEDDING_TIMEOUT_S deadline.
MIN_CALIBRATION_TIMEOUT_S = 120.0

VectorsFn = Callable[[Sequence[str]], np.ndarray]


class CalibrationError(ValueError):
    """The calibration file cannot be used, or the embedder failed; the message says which and why."""


@dataclass(frozen=True)
class Pair:
    """One labelled example: would a person expect `memory` to come back when someone says `message`?"""

    memory: str
    message: str
    match: bool
    lang: str
    kind: str


@dataclass(frozen=True)
class Metrics:
    """Confusion counts of one threshold on one subset of pairs, and the rates derived from them.

    Empty denominators count as perfect (precision 1.0 when nothing was predicted: no false
    positive was made; recall 1.0 when there was nothing to find), so a subset without positive
    pairs does not look broken; F1 uses 2tp / (2tp + fp + fn), which is 0 whenever tp is 0 and
    something was missed or wrongly matched.
    """

    threshold: float
    tp: int
    fp: int
    fn: int
    tn: int

    @property
    def total(self) -> int:
        return self.tp + self.fp + self.fn + self.tn

    @property
    def precision(self) -> float:
        predicted = self.tp + self.fp
        return self.tp / predicted if predicted else 1.0

    @property
    def recall(self) -> float:
        actual = self.tp + self.fn
        return self.tp / actual if actual else 1.0

    @property
    def f1(self) -> float:
        denominator = 2 * self.tp + self.fp + self.fn
        return 2 * self.tp / denominator if denominator else 1.0

    @property
    def accuracy(self) -> float:
        return (self.tp + self.tn) / self.total if self.total else 1.0


@dataclass(frozen=True)
class Report:
    """The result of `evaluate`: per threshold overall, per language and per kind, and the best threshold."""

    thresholds: tuple[float, ...]
    overall: tuple[Metrics, ...]
    by_lang: Mapping[str, tuple[Metrics, ...]]
    by_kind: Mapping[str, tuple[Metrics, ...]]
    best: Metrics
    positives: int
    negatives: int

    def at(self, threshold: float, lang: str | None = None) -> Metrics:
        """The metrics of an evaluated threshold (overall, or of one language)."""
        rows = self.overall if lang is None else self.by_lang[lang]
        for row in rows:
            if abs(row.threshold - threshold) < 1e-6:  # thresholds are stored rounded to 6 decimals
                return row
        raise KeyError(f"threshold {threshold} was not evaluated")


def _field(obj: Mapping[str, object], name: str, kind: type, where: str) -> object:
    value = obj.get(name)
    if not isinstance(value, kind):
        raise CalibrationError(f"{where}: field {name!r} must be a {'boolean' if kind is bool else 'string'}")
    return value


def parse_pairs(lines: Iterable[str], source: str = "input") -> list[Pair]:
    """Parse JSON Lines into pairs, rejecting bad lines with their line number (blank lines are skipped).

    A calibration set with a typo'd label silently skews the threshold, so every field is checked.
    """
    pairs: list[Pair] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{source} line {number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            raise CalibrationError(f"{where}: not valid JSON") from None
        if not isinstance(obj, dict):
            raise CalibrationError(f"{where}: expected a JSON object")
        memory = str(_field(obj, "memory", str, where)).strip()
        message = str(_field(obj, "message", str, where)).strip()
        if not memory or not message:
            raise CalibrationError(f"{where}: memory and message must not be empty")
        match = bool(_field(obj, "match", bool, where))
        lang = str(_field(obj, "lang", str, where))
        kind = str(_field(obj, "kind", str, where))
        if lang not in LANGS:
            raise CalibrationError(f"{where}: lang must be one of {', '.join(LANGS)}, got {lang!r}")
        if kind not in KINDS:
            raise CalibrationError(f"{where}: kind must be one of {', '.join(KINDS)}, got {kind!r}")
        if match != (kind in MATCH_KINDS):
            raise CalibrationError(f"{where}: kind {kind!r} contradicts match={str(match).lower()}")
        pairs.append(Pair(memory, message, match, lang, kind))
    if not pairs:
        raise CalibrationError(f"{source} has no pairs")
    return pairs


def load_pairs(path: str | Path) -> list[Pair]:
    """Read a calibration file (JSON Lines, one pair per line); every problem is a CalibrationError."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CalibrationError(f"cannot read {path}: no such file") from None
    except OSError as exc:
        raise CalibrationError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise CalibrationError(f"{path} is not UTF-8 text") from None
    return parse_pairs(text.splitlines(), str(path))


def score_pairs(vectors_fn: VectorsFn, pairs: Sequence[Pair]) -> list[tuple[Pair, float]]:
    """The cosine similarity of every pair, embedding each distinct text once in a single call.

    One call keeps a remote provider to as few requests as it allows and makes the built-in model
    batch; vectors are re-normalized so a provider that returns non-unit vectors still yields cosines.
    """
    texts = list(dict.fromkeys(text for pair in pairs for text in (pair.memory, pair.message)))
    if not texts:
        return []
    vectors = np.asarray(vectors_fn(texts), dtype=np.float64)
    if vectors.ndim != 2 or vectors.shape[0] != len(texts):
        raise CalibrationError(f"the embedder returned shape {vectors.shape} for {len(texts)} texts")
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    if not np.isfinite(vectors).all() or (norms < 1e-12).any():
        raise CalibrationError("the embedder returned zero or non-finite vectors")
    vectors = vectors / norms
    index = {text: row for row, text in enumerate(texts)}
    return [(pair, float(vectors[index[pair.memory]] @ vectors[index[pair.message]])) for pair in pairs]


def _metrics(scored: Sequence[tuple[Pair, float]], threshold: float) -> Metrics:
    tp = fp = fn = tn = 0
    for pair, score in scored:
        predicted = score >= threshold  # the same comparison as the reply search (`similarity >= $min`)
        if pair.match and predicted:
            tp += 1
        elif pair.match:
            fn += 1
        elif predicted:
            fp += 1
        else:
            tn += 1
    return Metrics(threshold, tp, fp, fn, tn)


def evaluate(scored: Sequence[tuple[Pair, float]], thresholds: Iterable[float] = DEFAULT_THRESHOLDS) -> Report:
    """Precision, recall, F1 and accuracy for every threshold, overall, per language and per kind.

    The best threshold maximizes overall F1: a missed recall and a wrongly recalled memory both
    cost, and F1 weighs them without letting the many easy negatives (accuracy) dominate. Ties go
    to the higher threshold, because it recalls fewer memories into the prompt for the same quality.
    """
    ordered = tuple(sorted({round(float(t), 6) for t in thresholds}))
    if not ordered:
        raise ValueError("evaluate needs at least one threshold")
    if not scored:
        raise ValueError("evaluate needs at least one scored pair")
    overall = tuple(_metrics(scored, t) for t in ordered)
    by_lang = {
        lang: tuple(_metrics(subset, t) for t in ordered)
        for lang in LANGS
        if (subset := [item for item in scored if item[0].lang == lang])
    }
    by_kind = {
        kind: tuple(_metrics(subset, t) for t in ordered)
        for kind in KINDS
        if (subset := [item for item in scored if item[0].kind == kind])
    }
    best = max(overall, key=lambda row: (round(row.f1, 12), row.threshold))
    positives = sum(1 for pair, _ in scored if pair.match)
    return Report(ordered, overall, by_lang, by_kind, best, positives, len(scored) - positives)


def _fmt(threshold: float) -> str:
    """Two decimals like the grid, more for a hand-set value between grid points (0.305 must not print as 0.30)."""
    return f"{threshold:.2f}" if abs(threshold * 100 - round(threshold * 100)) < 1e-6 else f"{threshold:.6g}"


def _table_thresholds(report: Report, configured: float | None) -> list[float]:
    step = round(TABLE_STEP * 100)
    shown = {t for t in report.thresholds if abs(t * 100 - round(t * 100)) < 1e-6 and round(t * 100) % step == 0}
    # Above the first threshold that matches nothing every row is the same: keep only that one.
    empty = [row.threshold for row in report.overall if row.tp + row.fp == 0]
    if empty:
        shown = {t for t in shown if t <= empty[0]} | {empty[0]}
    shown.add(report.best.threshold)
    if configured is not None and any(abs(t - configured) < 1e-6 for t in report.thresholds):
        shown.add(round(configured, 6))
    return sorted(shown)


def _hardest_pairs(scored: Sequence[tuple[Pair, float]]) -> list[str]:
    matches = sorted((item for item in scored if item[0].match), key=lambda item: item[1])[:5]
    others = sorted((item for item in scored if not item[0].match), key=lambda item: -item[1])[:5]
    lines = ["", "lowest-scoring matches:"]
    lines += [f"  {score:6.3f}  [{p.lang}/{p.kind}] {p.memory!r} <- {p.message!r}" for p, score in matches]
    lines += ["highest-scoring non-matches:"]
    lines += [f"  {score:6.3f}  [{p.lang}/{p.kind}] {p.memory!r} <- {p.message!r}" for p, score in others]
    return lines


def _suggestion(report: Report, configured: float | None) -> list[str]:
    best = report.best
    lines = [
        "",
        f"suggested MIN_SIMILARITY={_fmt(best.threshold)} (best F1 {best.f1:.3f}: precision {best.precision:.3f},"
        f" recall {best.recall:.3f}; ties go to the higher threshold)",
    ]
    if configured is not None:
        try:
            current = report.at(configured)
        except KeyError:
            lines.append(f"configured MIN_SIMILARITY={_fmt(configured)} (not on the evaluated grid)")
        else:
            lines.append(
                f"configured MIN_SIMILARITY={_fmt(configured)}: F1 {current.f1:.3f}, precision {current.precision:.3f},"
                f" recall {current.recall:.3f}"
            )
    return lines


def format_report(
    report: Report,
    scored: Sequence[tuple[Pair, float]] | None = None,
    configured: float | None = None,
    title: str = "",
) -> str:
    """A plain-text table for people: overall and per-language precision/recall/F1 per threshold.

    Also lists the hardest pairs (lowest-scoring matches, highest-scoring non-matches), because
    those, not the averages, show what a threshold change would gain or break.
    """
    langs = [lang for lang in LANGS if lang in report.by_lang]
    lines: list[str] = []
    if title:
        lines.append(title)
    lines.append(f"{report.positives + report.negatives} pairs: {report.positives} match, {report.negatives} do not")
    lines.append("")
    head = f"{'threshold':>9} | {'precision':>9} {'recall':>6} {'F1':>5} {'acc':>5}"
    sub = f"{'':>9} | {'all':^29}"
    for lang in langs:
        head += f" | {'P':>5} {'R':>5} {'F1':>5}"
        sub += f" | {lang:^17}"
    lines += [sub, head, "-" * len(head)]
    for threshold in _table_thresholds(report, configured):
        row = report.at(threshold)
        text = f"{_fmt(threshold):>9} | {row.precision:>9.3f} {row.recall:>6.3f} {row.f1:>5.3f} {row.accuracy:>5.3f}"
        for lang in langs:
            part = report.at(threshold, lang)
            text += f" | {part.precision:>5.3f} {part.recall:>5.3f} {part.f1:>5.3f}"
        marks = []
        if threshold == report.best.threshold:
            marks.append("best F1")
        if configured is not None and abs(threshold - configured) < 1e-6:
            marks.append("configured")
        lines.append(text + (f"  <- {', '.join(marks)}" if marks else ""))
    if scored:
        lines += _hardest_pairs(scored)
    focus = report.best.threshold if configured is None else configured
    kinds = [
        f"{kind} {row.tp + row.fp}/{row.total}"
        for kind, rows in report.by_kind.items()
        for row in rows
        if abs(row.threshold - focus) < 1e-6
    ]
    if kinds:
        lines += ["", f"pairs at or above {_fmt(focus)}, by kind: " + ", ".join(kinds)]
    return "\n".join(lines + _suggestion(report, configured))


def run_cli(path: str | Path | None, settings: Settings, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """`python -m bot calibrate`: score the file (default: DEFAULT_FILE) with the configured embedder, print the table.

    Returns the exit status: 0, or 2 with one `error:` line on stderr when the file is unusable or
    the embedder is unavailable (a calibration run must never end in a traceback).
    """
    from bot.embeddings.providers import EmbeddingError, create_embedder

    out = out or sys.stdout
    err = err or sys.stderr
    path = DEFAULT_FILE if path is None else path
    try:
        pairs = load_pairs(path)
    except CalibrationError as exc:
        print(f"error: {exc}", file=err)
        return 2
    relaxed = settings.with_overrides(embedding_timeout_s=max(settings.embedding_timeout_s, MIN_CALIBRATION_TIMEOUT_S))
    try:
        embedder = create_embedder(relaxed)
    except Exception as exc:  # e.g. the built-in model's package missing: report it, do not crash
        print(f"error: cannot start the embedder ({settings.embedding_provider}): {type(exc).__name__}: {exc}", file=err)
        return 2
    batch = max(1, settings.embedding_batch_size)

    async def embed_all(texts: Sequence[str]) -> np.ndarray:
        try:
            parts = [await embedder.embed(texts[start : start + batch]) for start in range(0, len(texts), batch)]
        finally:
            close = getattr(embedder.inner, "close", None)
            if close is not None:
                await close()
        return np.concatenate(parts, axis=0)

    try:
        scored = score_pairs(lambda texts: shutdown.run(embed_all(texts)), pairs)
    except (EmbeddingError, CalibrationError) as exc:
        print(f"error: the embedder is unavailable: {exc}", file=err)
        return 2
    report = evaluate(scored, (*DEFAULT_THRESHOLDS, settings.min_similarity))  # the configured value always gets a row
    space = embedder.space
    title = f"MIN_SIMILARITY calibration of {space} on {path}"
    print(format_report(report, scored, configured=settings.min_similarity, title=title), file=out)
    return 0
