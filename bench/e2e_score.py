"""The end-to-end section's scorer: answers against LoCoMo's gold answers, stored memories against its gold facts.

Answers get two scores:
- **token F1** as LoCoMo's own evaluation computes it: lower case, commas, punctuation and the
  words a/an/the/and removed, Porter-stemmed tokens; a multi-hop answer (category 1) is split at
  commas and each gold part takes its best-matching predicted part; an open-domain gold answer
  (category 3) keeps only what comes before its first ';'.
- **a judge's yes/no** (`ANSWER_JUDGE_PROMPT`, below): is the answer the gold answer, in other words?

Stored memories are matched to gold facts by the built-in embedding model: a memory covers a fact
when their cosine similarity is at least `FACT_MATCH_SIMILARITY`. The threshold was chosen on the
hand-checked pairs of `tests/data/e2e_matches.jsonl` (docs/benchmarks.md says how it does there); each run
also asks the judge (`FACT_JUDGE_PROMPT`) about a sample of pairs near the threshold and reports how
often it agrees, so a reader sees how far to trust the rule on that run's own memories.
"""

from __future__ import annotations

import math
import random
import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from nltk.stem import PorterStemmer

FACT_MATCH_SIMILARITY = 0.72
DUPLICATE_SIMILARITY = 0.85  # two memories of one list this close say the same thing
JUDGE_SAMPLE_BAND = (0.60, 0.85)  # pairs whose similarity falls here are the ones worth a second opinion

ANSWER_JUDGE_PROMPT = """You check answers given by a chat bot about past conversations.

Question: {question}
Gold answer: {gold}
Bot's answer: {answer}

Is the bot's answer correct? It is correct when it gives the gold answer or the same thing in other words: \
another wording, a date in another format or a relative date that lands on the same day, or more detail that \
does not contradict the gold answer. It is wrong when it gives something else, leaves out the point asked \
for, says it does not know, or contradicts the gold answer.
Reply with one word: yes or no."""

FACT_JUDGE_PROMPT = """You compare a note a chat bot kept about a person with a fact about that person.

Fact: {fact}
Note: {memory}

Does the note state this fact (possibly in other words, with less or more detail, as long as the main point \
of the fact is there)?
Reply with one word: yes or no."""

_ARTICLES = re.compile(r"\b(a|an|the|and)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
_STEMMER = PorterStemmer()
_VERDICT = re.compile(r"\b(yes|no|correct|incorrect|wrong|true|false)\b")


def normalize_answer(text: str) -> str:
    """LoCoMo's normalisation: no commas, lower case, no punctuation, no a/an/the/and, single spaces."""
    text = str(text).replace(",", "").lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _tokens(text: str) -> list[str]:
    return [_STEMMER.stem(word) for word in normalize_answer(text).split()]


def token_f1(prediction: str, truth: str) -> float:
    predicted, gold = _tokens(prediction), _tokens(truth)
    common = sum((Counter(predicted) & Counter(gold)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def locomo_f1(prediction: str, answer: object, category: int) -> float:
    """The F1 of one answer as LoCoMo scores its category."""
    truth = str(answer)
    if category == 3:
        truth = truth.split(";")[0].strip()
    if category == 1:
        predictions = [part.strip() for part in prediction.split(",")]
        truths = [part.strip() for part in truth.split(",")]
        return float(np.mean([max(token_f1(p, t) for p in predictions) for t in truths]))
    return token_f1(prediction, truth)


def verdict(text: str) -> bool | None:
    """A judge's answer as yes (True) / no (False); None when it says neither."""
    cleaned = re.sub(r"[*_`#>]", " ", text or "").lower()
    found = _VERDICT.search(cleaned)
    if found is None:
        return None
    return found.group(1) in ("yes", "correct", "true")


def answer_judge_messages(question: str, gold: object, answer: str) -> list[dict[str, str]]:
    shown = " ".join(answer.split()) or "(no answer)"
    return [{"role": "user", "content": ANSWER_JUDGE_PROMPT.format(question=question, gold=gold, answer=shown)}]


def fact_judge_messages(fact: str, memory: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": FACT_JUDGE_PROMPT.format(fact=fact, memory=memory)}]


# --- memories against gold facts -------------------------------------------------------------------


@dataclass(frozen=True)
class GoldFact:
    key: str
    owner: int  # the user the fact is about (the speaker who said it)
    text: str


@dataclass(frozen=True)
class StoredMemory:
    id: int
    owner: int | None  # None: a server memory
    text: str


@dataclass
class SavingScore:
    facts: int
    covered: int  # by a personal memory of the right person
    covered_any: int  # by any stored memory (another person's list, the server list)
    memories: int
    personal: int
    server: int
    unmatched: int  # memories that match no gold fact
    wrong_person: int  # personal memories that match only facts about somebody else
    duplicates: int  # memories that repeat an earlier memory of the same list
    covering: dict[str, list[int]]  # fact key -> memories of the right person that cover it
    pairs: list[tuple[str, int, float]]  # (fact key, memory id, similarity) for every pair above JUDGE_SAMPLE_BAND's floor

    def as_dict(self) -> dict[str, object]:
        return {
            "facts": self.facts, "covered": self.covered, "covered_any": self.covered_any, "memories": self.memories,
            "personal": self.personal, "server": self.server, "unmatched": self.unmatched,
            "wrong_person": self.wrong_person, "duplicates": self.duplicates,
        }


def score_saving(
    facts: Sequence[GoldFact], memories: Sequence[StoredMemory], fact_vectors: np.ndarray, memory_vectors: np.ndarray,
    *, threshold: float = FACT_MATCH_SIMILARITY, duplicate: float = DUPLICATE_SIMILARITY,
) -> SavingScore:
    """Which gold facts the stored memories cover, and what else was stored (vectors are unit length)."""
    similarity = fact_vectors @ memory_vectors.T if len(facts) and len(memories) else np.zeros((len(facts), len(memories)))
    match = similarity >= threshold
    covering: dict[str, list[int]] = {}
    covered_any = 0
    for i, fact in enumerate(facts):
        covering[fact.key] = [m.id for j, m in enumerate(memories) if match[i, j] and m.owner == fact.owner]
        covered_any += bool(match[i].any())
    unmatched = wrong_person = duplicates = 0
    for j, memory in enumerate(memories):
        matched = [facts[i] for i in range(len(facts)) if match[i, j]]
        if not matched:
            unmatched += 1
        elif memory.owner is not None and all(fact.owner != memory.owner for fact in matched):
            wrong_person += 1
        earlier = [k for k in range(j) if memories[k].owner == memory.owner]
        if earlier and float(max(memory_vectors[k] @ memory_vectors[j] for k in earlier)) >= duplicate:
            duplicates += 1
    floor = JUDGE_SAMPLE_BAND[0]
    pairs = [
        (facts[i].key, memories[j].id, float(similarity[i, j]))
        for i in range(len(facts)) for j in range(len(memories)) if similarity[i, j] >= floor
    ]
    return SavingScore(
        facts=len(facts), covered=sum(1 for ids in covering.values() if ids), covered_any=covered_any,
        memories=len(memories), personal=sum(1 for m in memories if m.owner is not None),
        server=sum(1 for m in memories if m.owner is None), unmatched=unmatched, wrong_person=wrong_person,
        duplicates=duplicates, covering=covering, pairs=pairs,
    )


def judge_sample(pairs: Sequence[tuple[str, int, float]], size: int, seed: int) -> list[tuple[str, int, float]]:
    """A seeded sample of the pairs near the threshold (JUDGE_SAMPLE_BAND), half on each side where possible."""
    low, high = JUDGE_SAMPLE_BAND
    below = sorted(p for p in pairs if low <= p[2] < FACT_MATCH_SIMILARITY)
    above = sorted(p for p in pairs if FACT_MATCH_SIMILARITY <= p[2] < high)
    rng = random.Random(seed)
    take_above = min(len(above), max(size // 2, size - len(below)))
    chosen = rng.sample(above, take_above) + rng.sample(below, min(len(below), size - take_above))
    return sorted(chosen, key=lambda p: (p[0], p[1]))


# --- uncertainty -------------------------------------------------------------------------------------


def wilson(successes: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion (95% by default); (0, 0) for no trials."""
    if total == 0:
        return (0.0, 0.0)
    p = successes / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    spread = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return (max(0.0, centre - spread), min(1.0, centre + spread))


def bootstrap_mean(values: Sequence[float], *, seed: int = 0, rounds: int = 2000) -> tuple[float, float]:
    """A percentile bootstrap 95% interval of a mean (seeded, so the same values give the same interval)."""
    if not values:
        return (0.0, 0.0)
    data = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, len(data), size=(rounds, len(data)))].mean(axis=1)
    return (float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5)))
