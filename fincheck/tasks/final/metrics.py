"""FINAL scoring: description lists, judge matchings, micro P/R/F1 and the binarized BAcc.

The protocol (the FINAL paper, §4.2 and appendix C): a judge maps every predicted description
(lettered A, B, C, ...) to the gold description it matches, or to null. True positives are the
*distinct gold items* matched, so a prediction repeated five times counts once while its
repeats still count as predictions (and lower precision). Precision = sum TP / sum #predicted,
recall = sum TP / sum #gold, over the corpus (micro); F1 from those two. When either list is
empty no judge is needed: TP = 0.

Binarized: an example is flagged when it has at least one description. The paper's Fig. 4
reports its precision, recall and F1 with "inconsistent" as the positive class; fincheck adds
the balanced accuracy of flagged vs gold-inconsistent (its own figure, not in the paper: it
does not reward flagging everything).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fincheck.metrics.bootstrap import bootstrap_cis, ci95_lists, groups_by
from fincheck.metrics.classification import (
    balanced_accuracy,
    confusion_matrix,
    harmonic_mean,
    precision_recall,
    roc_auc,
    threshold_peak,
)

BINARY_METRICS = ("binary_precision", "binary_recall", "binary_f1", "binary_bacc")


def true_positives(matching: Mapping[str, str | None]) -> int:
    """Number of distinct gold letters that some prediction was matched to."""
    return len({gold for gold in matching.values() if gold is not None})


@dataclass(frozen=True)
class FinalItem:
    """One FINAL example after judging: its numbers of predicted and gold descriptions and the
    true positives, None when unknown (`judge_failed`: the judge was asked and failed; else no
    judge was configured)."""

    n_pred: int
    n_gold: int
    tp: int | None
    judge_failed: bool = False
    flag_score: float | None = None  # the prediction's p_yes: P(a list opens) against "None"

    @property
    def tp_known(self) -> bool:
        return self.tp is not None


def final_figures(items: Sequence[FinalItem], judge_failures: str = "miss") -> dict[str, float]:
    """Micro P/R/F1, and over all items the binarized P/R/F1 (the paper's Fig. 4) and BAcc.

    judge_failures="miss" (the headline, as the paper, which excludes nothing): an example the
    judge failed on counts its descriptions with no true positive. "exclude": it is left out
    of P and R (a second figure, beside it). Examples without a judge are always left out.
    """
    counted = [it for it in items if it.tp_known or (it.judge_failed and judge_failures == "miss")]
    tp = sum(it.tp or 0 for it in counted)
    n_pred = sum(it.n_pred for it in counted)
    n_gold = sum(it.n_gold for it in counted)
    precision = tp / n_pred if n_pred else math.nan
    recall = tp / n_gold if n_gold else math.nan
    gold_flagged = [it.n_gold > 0 for it in items]  # inconsistent: the positive class
    flagged = [it.n_pred > 0 for it in items]
    binary_precision, binary_recall = precision_recall(gold_flagged, flagged)
    return {
        "precision": precision,
        "recall": recall,
        "f1": harmonic_mean(precision, recall),
        "binary_precision": binary_precision,
        "binary_recall": binary_recall,
        "binary_f1": harmonic_mean(binary_precision, binary_recall),
        "binary_bacc": balanced_accuracy(gold_flagged, flagged),
        "flag_auc": flag_auc(items),
    }


def flag_auc(items: Sequence[FinalItem]) -> float:
    """ROC-AUC of the flag score (p_yes) for telling inconsistent summaries from consistent
    ones: how well the detector ranks before any threshold; NaN unless every item has one."""
    if not items or any(it.flag_score is None for it in items):
        return math.nan
    return roc_auc([it.n_gold > 0 for it in items], [float(it.flag_score) for it in items])


def score_final(
    items: Sequence[FinalItem],
    n_resamples: int = 1000,
    seed: int = 0,
    units: Sequence[str] | None = None,
) -> dict:
    """Headline figures (judge failures counted as misses), the variant that excludes them,
    counts named for what they count, and bootstrap CIs (resampling examples, or whole
    `units`: each example's document)."""
    figures = final_figures(items)
    excluded = final_figures(items, judge_failures="exclude")
    flagged_gold = [it.n_gold > 0 for it in items]
    flagged_pred = [it.n_pred > 0 for it in items]
    counted = [it for it in items if it.tp_known or it.judge_failed]
    best = {}
    if items and not math.isnan(figures["flag_auc"]) and 0 < sum(flagged_gold) < len(items):
        # in-sample, as QASem's: the flag threshold a dev run hands to the test run
        chosen, bacc = threshold_peak(
            [float(it.flag_score or 0) for it in items], flagged_gold, flagged_pred
        )
        best = {"best_threshold": {"threshold": round(chosen, 6), "bacc": bacc}}
    return {
        **figures,
        **best,
        "excluding_judge_failures": {k: excluded[k] for k in ("precision", "recall", "f1")},
        "n": len(items),
        **({"n_units": len(set(units))} if units else {}),
        "n_tp_known": sum(it.tp_known for it in items),  # judged, or needing no judge
        "n_judge_failed": sum(it.judge_failed for it in items),  # counted as misses above
        "n_without_judge": sum(not it.tp_known and not it.judge_failed for it in items),
        "true_positives": sum(it.tp or 0 for it in counted),
        "predicted_descriptions": sum(it.n_pred for it in counted),  # the precision's divisor
        "gold_descriptions": sum(it.n_gold for it in counted),  # the recall's divisor
        "binary_confusion": {
            "labels": ["consistent", "inconsistent"],
            "counts": confusion_matrix(flagged_gold, flagged_pred, [False, True]),
        },
        "ci95": ci95_lists(
            bootstrap_cis(
                lambda idx: final_figures([items[i] for i in idx]),
                len(items),
                ("f1", "precision", "recall", *BINARY_METRICS, "flag_auc"),
                n_resamples,
                seed=seed,
                groups=groups_by(units),
            )
        ),
    }
