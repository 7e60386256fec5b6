"""Binary and multi-class classification metrics, written out so their semantics are explicit.

These are the building blocks of the task scorers (QASem, FHSumBench, binarized FINAL). They
follow scikit-learn's conventions where a choice exists (stated per function) and are checked
against scikit-learn in the tests, but they do not import it: a scorer is a pure function of
lists, cheap to call inside a bootstrap loop.
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
from collections.abc import Hashable, Sequence

_YES_NO = re.compile(r"^\W*(yes|no)\b", re.IGNORECASE)


def parse_yes_no(text: str) -> bool | None:
    """A binary answer read from its first word: 'Yes'/'yes.'/'**No**, because...' ->
    True/False; anything else ('Yesterday', 'Maybe') -> None. The one Yes/No reader."""
    match = _YES_NO.match(text or "")
    return None if match is None else match.group(1).lower() == "yes"


def balanced_accuracy(gold: Sequence[bool], pred: Sequence[bool]) -> float:
    """BAcc = 1/2 (TP/(TP+FN) + TN/(TN+FP)) with True as the positive class.

    When gold holds only one class, the undefined recall is left out and the mean runs over the
    class that is present (scikit-learn's `balanced_accuracy_score` does the same). Empty input
    gives NaN.
    """
    _check_lengths(gold, pred)
    recalls = []
    for cls in (True, False):
        members = [p for g, p in zip(gold, pred, strict=True) if bool(g) is cls]
        if members:
            recalls.append(sum(bool(p) is cls for p in members) / len(members))
    return sum(recalls) / len(recalls) if recalls else math.nan


def threshold_peak(
    scores: Sequence[float], gold: Sequence[bool], at_half: Sequence[bool], middle: float = 0.5
) -> tuple[float, float]:
    """(threshold, BAcc): the threshold that maximises BAcc (both classes present), predicting
    positive iff score >= threshold, placed halfway between two neighbouring scores (ties: the
    one nearest `middle`); `at_half`, the predictions at `middle`, are the start to beat. One
    sweep up the sorted scores: below each candidate lie the examples called negative."""
    _check_lengths(scores, gold)
    ranked = sorted(zip(scores, gold, strict=True))
    positives = sum(g for _, g in ranked)
    negatives = len(ranked) - positives
    best = ((-1.0, -1.0), middle, balanced_accuracy(gold, at_half))
    positive_below = negative_below = 0
    for (score, g), (following, _) in itertools.pairwise(ranked):
        positive_below, negative_below = positive_below + g, negative_below + (not g)
        if following == score:
            continue
        threshold = (score + following) / 2
        bacc = ((positives - positive_below) / positives + negative_below / negatives) / 2
        key = (round(bacc, 12), -abs(threshold - middle))
        if key > best[0]:
            best = key, threshold, bacc
    return best[1], best[2]


def precision_recall(gold: Sequence[bool], pred: Sequence[bool]) -> tuple[float, float]:
    """Precision TP/(TP+FP) and recall TP/(TP+FN) of the positive class True; NaN where the
    divisor is 0 (nothing predicted positive, or no gold positive)."""
    _check_lengths(gold, pred)
    tp = sum(bool(g) and bool(p) for g, p in zip(gold, pred, strict=True))
    n_pred, n_gold = sum(map(bool, pred)), sum(map(bool, gold))
    return (tp / n_pred if n_pred else math.nan), (tp / n_gold if n_gold else math.nan)


def roc_auc(gold: Sequence[bool], scores: Sequence[float]) -> float:
    """Area under the ROC curve of `scores` for the positive class True.

    Computed as the Mann-Whitney statistic: the probability that a random positive scores above
    a random negative, ties counting one half (so constant scores give exactly 0.5). Uses
    average ranks: AUC = (sum of positive ranks - n_pos (n_pos + 1) / 2) / (n_pos n_neg).
    NaN when gold holds a single class (the curve is undefined).
    """
    _check_lengths(gold, scores)
    n_pos = sum(1 for g in gold if g)
    n_neg = len(gold) - n_pos
    if n_pos == 0 or n_neg == 0:
        return math.nan
    ranked = sorted(scores)
    # tied scores share the mean of the 1-based ranks they span: (first + last) / 2
    rank_sum_pos = sum(
        (bisect.bisect_left(ranked, s) + 1 + bisect.bisect_right(ranked, s)) / 2
        for s, g in zip(scores, gold, strict=True)
        if g
    )
    return (rank_sum_pos - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def roc_curve(gold: Sequence[bool], scores: Sequence[float]) -> tuple[list[float], list[float]]:
    """(false-positive rates, true-positive rates) at every distinct threshold, for plotting."""
    _check_lengths(gold, scores)
    n_pos = sum(1 for g in gold if g)
    n_neg = len(gold) - n_pos
    fpr, tpr = [0.0], [0.0]
    tp = fp = 0
    pairs = sorted(zip(scores, gold, strict=True), key=lambda sg: -sg[0])
    for idx, (score, g) in enumerate(pairs):
        tp += bool(g)
        fp += not g
        if idx + 1 == len(pairs) or pairs[idx + 1][0] != score:
            fpr.append(fp / n_neg if n_neg else 0.0)
            tpr.append(tp / n_pos if n_pos else 0.0)
    return fpr, tpr


def macro_precision_recall(
    gold: Sequence[Hashable], pred: Sequence[Hashable]
) -> tuple[float, float, list[Hashable]]:
    """Macro precision and recall over the labels present in gold ∪ pred.

    A label never predicted has precision 0 (0/0 counted as 0, scikit-learn's default
    `zero_division` behaviour); a label never in gold has recall 0. So a label that appears only
    in the predictions (e.g. "invalid") is a class of its own that pulls both means down.
    Returns (macro_p, macro_r, labels in sorted order).
    """
    _check_lengths(gold, pred)
    labels = sorted(set(gold) | set(pred), key=str)
    if not labels:
        return math.nan, math.nan, []
    precisions, recalls = [], []
    for label in labels:
        tp = sum(1 for g, p in zip(gold, pred, strict=True) if g == label and p == label)
        n_pred = sum(1 for p in pred if p == label)
        n_gold = sum(1 for g in gold if g == label)
        precisions.append(tp / n_pred if n_pred else 0.0)
        recalls.append(tp / n_gold if n_gold else 0.0)
    return sum(precisions) / len(labels), sum(recalls) / len(labels), labels


def harmonic_mean(a: float, b: float) -> float:
    """2ab/(a+b); 0 when both are 0 (F of a system that gets nothing right)."""
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return 2 * a * b / (a + b) if a + b > 0 else 0.0


def confusion_matrix(
    gold: Sequence[Hashable], pred: Sequence[Hashable], labels: Sequence[Hashable]
) -> list[list[int]]:
    """counts[i][j] = number of items with gold labels[i] predicted as labels[j]."""
    _check_lengths(gold, pred)
    index = {label: i for i, label in enumerate(labels)}
    counts = [[0] * len(labels) for _ in labels]
    for g, p in zip(gold, pred, strict=True):
        counts[index[g]][index[p]] += 1
    return counts


def _check_lengths(a: Sequence, b: Sequence) -> None:
    if len(a) != len(b):
        raise ValueError(f"length mismatch: {len(a)} gold vs {len(b)} predicted")
