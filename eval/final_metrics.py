"""FINAL scoring: description lists, judge matchings, micro P/R/F1 and the binarized BAcc.

The protocol (the FINAL paper, §4.2 and appendix C): a judge maps every predicted description
(lettered A, B, C, ...) to the gold description it matches, or to null. True positives are the
*distinct gold items* matched, so a prediction repeated five times counts once while its
repeats still count as predictions (and lower precision). Precision = sum TP / sum #predicted,
recall = sum TP / sum #gold, over the corpus (micro); F1 from those two. When either list is
empty no judge is needed: TP = 0.

Binarized (the paper's Fig. 4): an example is flagged when it has at least one description;
balanced accuracy of flagged-vs-gold-inconsistent, "inconsistent" being the positive class.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fincheck.eval.bootstrap import bootstrap_ci
from fincheck.eval.classification import balanced_accuracy, harmonic_mean

_NONE_ANSWERS = {"none", "none.", "no inconsistencies", "no inconsistencies.", "n/a", ""}
# "A. text", "A) text", "(A) text", "- A. text", "**A.** text", "1. text", "- text"
_ITEM = re.compile(
    r"^\s*(?:[-*•]\s*)?(?:\*\*)?\(?(?:[A-Z]{1,2}|\d{1,3})[.)](?:\*\*)?\s+(?P<lettered>.+)$"
    r"|^\s*[-*•]\s+(?P<bullet>.+)$"
)


def letters(n: int) -> list[str]:
    """Identifiers for n items: A..Z, then AA, AB, ... (the judge prompt's lettering)."""
    out = []
    for i in range(n):
        name, k = "", i
        while True:
            name = chr(ord("A") + k % 26) + name
            k = k // 26 - 1
            if k < 0:
                break
        out.append(name)
    return out


def parse_descriptions(text: str) -> list[str]:
    """A model's answer -> its list of descriptions ([] for 'None').

    Accepts lettered ('A. ...'), parenthesised, numbered and bulleted lines; a line without a
    marker continues the previous item. Text with no markers at all (and not 'None') is one
    description: the model flagged something, in its own format.
    """
    stripped = (text or "").strip()
    if stripped.strip("*").strip().lower() in _NONE_ANSWERS:
        return []
    items: list[str] = []
    loose: list[str] = []
    for line in stripped.splitlines():
        if not line.strip():
            continue
        match = _ITEM.match(line)
        if match:
            items.append((match.group("lettered") or match.group("bullet")).strip())
        elif items:
            items[-1] = f"{items[-1]} {line.strip()}"
        else:
            loose.append(line.strip())
    if not items:
        return [" ".join(loose)] if loose else []
    return items  # a preamble before the first marker ("Here are the issues:") is dropped


def true_positives(matching: Mapping[str, str | None]) -> int:
    """Number of distinct gold letters that some prediction was matched to."""
    return len({gold for gold in matching.values() if gold is not None})


@dataclass(frozen=True)
class FinalItem:
    """One FINAL example after judging. tp is None when the judge failed on it."""

    n_pred: int
    n_gold: int
    tp: int | None

    @property
    def judged(self) -> bool:
        return self.tp is not None


def final_figures(items: Sequence[FinalItem]) -> dict[str, float]:
    """Micro P/R/F1 over judged items and binarized BAcc over all items."""
    judged = [it for it in items if it.judged]
    tp = sum(it.tp for it in judged)  # type: ignore[misc]
    n_pred = sum(it.n_pred for it in judged)
    n_gold = sum(it.n_gold for it in judged)
    precision = tp / n_pred if n_pred else math.nan
    recall = tp / n_gold if n_gold else math.nan
    return {
        "precision": precision,
        "recall": recall,
        "f1": harmonic_mean(precision, recall),
        "binary_bacc": balanced_accuracy(
            [it.n_gold > 0 for it in items], [it.n_pred > 0 for it in items]
        ),
    }


def score_final(items: Sequence[FinalItem], n_resamples: int = 1000, seed: int = 0) -> dict:
    """Headline figures, counts and bootstrap CIs (resampling examples)."""
    figures = final_figures(items)
    flagged_gold = [it.n_gold > 0 for it in items]
    flagged_pred = [it.n_pred > 0 for it in items]
    judged = [it for it in items if it.judged]
    result: dict = {
        **figures,
        "n": len(items),
        "n_judged": len(judged),
        "n_unjudged": len(items) - len(judged),
        "true_positives": sum(it.tp for it in judged),  # type: ignore[misc]
        "n_predicted": sum(it.n_pred for it in judged),
        "n_gold": sum(it.n_gold for it in judged),
        "binary_confusion": {
            "labels": ["consistent", "inconsistent"],
            "counts": [
                [
                    sum(
                        1
                        for g, p in zip(flagged_gold, flagged_pred, strict=True)
                        if g == gv and p == pv
                    )
                    for pv in (False, True)
                ]
                for gv in (False, True)
            ],
        },
        "ci95": {},
    }
    for metric in ("f1", "precision", "recall", "binary_bacc"):
        ci = bootstrap_ci(
            lambda idx, m=metric: final_figures([items[i] for i in idx])[m],
            len(items),
            n_resamples=n_resamples,
            seed=seed,
        )
        result["ci95"][metric] = ci.as_list() if ci else None
    return result
