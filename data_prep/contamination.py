"""Document-level contamination guard: no training pair may share its grounding document with
any evaluation pair of any task.

DeFacto, FHSumBench and QASem-CLIFF all draw on XSum, in different shapes (full article,
shortened source, re-tokenized text), and FINAL items are DeFacto items. So documents are
compared after normalization (lower case, letters and digits only) by the
*containment* of word n-gram shingles: |A ∩ B| / min(|A|, |B|), which is 1.0 for an exact match and
stays high when one document is a cut-down copy of the other (documents shorter than one shingle
compare whole). Pairs at or above the threshold are dropped before writing.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from tqdm import tqdm

from fincheck.pairs import Pair

_NON_ALNUM = re.compile(r"[^0-9a-z]+")


def normalize_words(text: str) -> list[str]:
    return _NON_ALNUM.sub(" ", text.lower()).split()


def shingles(words: list[str], size: int) -> set[str]:
    if len(words) < size:
        return {" ".join(words)} if words else set()
    return {" ".join(words[i : i + size]) for i in range(len(words) - size + 1)}


@dataclass
class ContaminationReport:
    threshold: float
    shingle_size: int
    dropped: dict[str, int] = field(default_factory=dict)  # "train_task->eval_task": count
    dropped_by_task: dict[str, int] = field(default_factory=dict)
    examples: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "threshold": self.threshold,
            "shingle_size": self.shingle_size,
            "dropped": dict(sorted(self.dropped.items())),
            "dropped_by_task": dict(sorted(self.dropped_by_task.items())),
            "examples": self.examples,
        }


class EvaluationIndex:
    """Inverted index from shingle to the evaluation documents that contain it."""

    def __init__(self, eval_pairs: list[Pair], shingle_size: int) -> None:
        self.shingle_size = shingle_size
        self.docs: list[tuple[str, str]] = []  # (task, pair id of the first pair with this doc)
        self.sizes: list[int] = []
        self.postings: dict[str, list[int]] = defaultdict(list)
        seen: set[tuple[str, str]] = set()
        for pair in eval_pairs:
            words = normalize_words(pair.grounding)
            key = (pair.task, " ".join(words))
            if key in seen:  # many QAs / samples share one document: index it once per task
                continue
            seen.add(key)
            doc = len(self.docs)
            self.docs.append((pair.task, pair.id))
            grams = shingles(words, shingle_size)
            self.sizes.append(len(grams))
            for gram in grams:
                self.postings[gram].append(doc)

    def matches(self, text: str, threshold: float) -> dict[str, tuple[str, float]]:
        """{evaluation task: (pair id, containment)} of the documents `text` overlaps."""
        words = normalize_words(text)
        grams = shingles(words, self.shingle_size)
        hits: Counter[int] = Counter()
        for gram in grams:
            for doc in self.postings.get(gram, ()):
                hits[doc] += 1
        found: dict[str, tuple[str, float]] = {}
        for doc, shared in hits.items():
            score = shared / max(1, min(len(grams), self.sizes[doc]))
            task, pair_id = self.docs[doc]
            if score >= threshold and score > found.get(task, ("", -1.0))[1]:
                found[task] = (pair_id, round(score, 4))
        return found


def drop_contaminated(
    train_pairs: list[Pair],
    eval_pairs: list[Pair],
    threshold: float,
    shingle_size: int,
    examples_per_key: int = 3,
    progress: bool = True,
) -> tuple[list[Pair], ContaminationReport]:
    """Training/validation pairs whose document overlaps an evaluation document are removed."""
    index = EvaluationIndex(eval_pairs, shingle_size)
    report = ContaminationReport(threshold=threshold, shingle_size=shingle_size)
    kept: list[Pair] = []
    cache: dict[str, dict[str, tuple[str, float]]] = {}
    for pair in tqdm(train_pairs, desc="contamination check", unit="pair", disable=not progress):
        grounding = pair.grounding
        if grounding not in cache:
            cache[grounding] = index.matches(grounding, threshold)
        found = cache[grounding]
        if not found:
            kept.append(pair)
            continue
        report.dropped_by_task[pair.task] = report.dropped_by_task.get(pair.task, 0) + 1
        for eval_task, (eval_id, score) in sorted(found.items()):
            key = f"{pair.task}->{eval_task}"
            report.dropped[key] = report.dropped.get(key, 0) + 1
            if report.dropped[key] <= examples_per_key:
                report.examples.append(
                    {"train_id": pair.id, "eval_id": eval_id, "containment": score}
                )
    return kept, report
