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

import functools
import re
from collections import Counter, defaultdict

from tqdm import tqdm

from fincheck.data.pairs import Pair

_NON_ALNUM = re.compile(r"[^0-9a-z]+")


def normalize_words(text: str) -> list[str]:
    return _NON_ALNUM.sub(" ", text.lower()).split()


def shingles(words: list[str], size: int) -> set[str]:
    if len(words) < size:
        return {" ".join(words)} if words else set()
    return {" ".join(words[i : i + size]) for i in range(len(words) - size + 1)}


class EvaluationIndex:
    """Inverted index from shingle to the evaluation documents that contain it."""

    def __init__(self, eval_pairs: list[Pair], shingle_size: int) -> None:
        self.shingle_size = shingle_size
        self.docs: list[tuple[str, str, int]] = []  # (task, its first pair's id, shingle count)
        self.postings: dict[str, list[int]] = defaultdict(list)
        # many QAs / samples share one document: indexed once per task, under its first pair's id
        first: dict[tuple[str, str], str] = {}
        for pair in eval_pairs:
            first.setdefault((pair.task, " ".join(normalize_words(pair.grounding))), pair.id)
        for (task, text), pair_id in first.items():
            grams = shingles(text.split(), shingle_size)
            for gram in grams:
                self.postings[gram].append(len(self.docs))
            self.docs.append((task, pair_id, len(grams)))

    def matches(self, text: str, threshold: float) -> dict[str, tuple[str, float]]:
        """{evaluation task: (pair id, containment)} of the documents `text` overlaps."""
        grams = shingles(normalize_words(text), self.shingle_size)
        hits = Counter(doc for gram in grams for doc in self.postings.get(gram, ()))
        found: dict[str, tuple[str, float]] = {}
        for doc, shared in hits.items():
            task, pair_id, size = self.docs[doc]
            score = shared / max(1, min(len(grams), size))
            if score >= threshold and score > found.get(task, ("", -1.0))[1]:
                found[task] = (pair_id, round(score, 4))
        return found


def drop_contaminated(
    train_pairs: list[Pair],
    eval_pairs: list[Pair],
    threshold: float,
    shingle_size: int,
    progress: bool = True,
) -> tuple[list[Pair], dict]:
    """Training/validation pairs whose document overlaps an evaluation document are removed;
    the manifest's report says how many, per task and per "train_task->eval_task", with the
    first 3 of each."""
    index = EvaluationIndex(eval_pairs, shingle_size)
    matches = functools.cache(lambda text: index.matches(text, threshold))  # documents repeat
    by_task: Counter[str] = Counter()
    dropped: Counter[str] = Counter()
    examples: list[dict] = []
    kept: list[Pair] = []
    for pair in tqdm(train_pairs, desc="contamination check", unit="pair", disable=not progress):
        found = matches(pair.grounding)
        if not found:
            kept.append(pair)
            continue
        by_task[pair.task] += 1
        for eval_task, (eval_id, score) in sorted(found.items()):
            key = f"{pair.task}->{eval_task}"
            dropped[key] += 1
            if dropped[key] <= 3:
                examples.append({"train_id": pair.id, "eval_id": eval_id, "containment": score})
    return kept, {
        "threshold": threshold,
        "shingle_size": shingle_size,
        "dropped": dict(sorted(dropped.items())),
        "dropped_by_task": dict(sorted(by_task.items())),
        "examples": examples,
    }
