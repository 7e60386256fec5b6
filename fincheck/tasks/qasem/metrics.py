"""QASemConsistency scoring (the QASem paper, Table 4).

Each QA gets a support score s = P(Yes) / (P(Yes) + P(No)) read at the model's first generated
position; the QA is predicted supported iff s >= 0.5 (no threshold tuning). Reported per
sub-dataset (cliff, factscore, verifiability) and pooled: balanced accuracy of the hard
prediction and ROC-AUC of s, with "supported" as the positive class.

A prediction without p_yes (an API model, another tool) is scored from its text: an answer that
starts with yes -> s = 1, no -> s = 0. An answer that is neither is a parse failure and counts as
wrong: s is set to the opposite of the gold label, so it can only lower BAcc and AUC, never help.
With p_yes, s = p_yes whatever the text says (the paper reads P(Yes) at the answer position);
outputs whose text is neither Yes nor No are counted all the same (`n_text_not_yes_no`), since
a model that answers in prose is scored on a token it did not choose.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from fincheck.metrics.bootstrap import bootstrap_cis, ci95_lists, groups_by
from fincheck.metrics.classification import (
    balanced_accuracy,
    parse_yes_no,
    roc_auc,
    threshold_peak,
)

SUBSETS: tuple[str, ...] = ("cliff", "factscore", "verifiability")
THRESHOLD = 0.5


@dataclass(frozen=True)
class QasemItem:
    """One scored QA: gold label, support score, and whether the score came from a parse failure."""

    subset: str
    gold: bool
    score: float
    parse_failed: bool = False
    from_text: bool = False
    text_not_yes_no: bool = False  # the output text starts with neither Yes nor No

    @property
    def predicted(self) -> bool:
        return self.score >= THRESHOLD


def support_score(output: str, p_yes: float | None, gold: bool) -> tuple[float, bool, bool]:
    """(s, parse_failed, from_text) for one prediction; see the module docstring for the rules."""
    if p_yes is not None and not math.isnan(p_yes):
        return float(p_yes), False, False
    answer = parse_yes_no(output)
    if answer is None:
        return (0.0 if gold else 1.0), True, True
    return (1.0 if answer else 0.0), False, True


def qasem_figures(items: Sequence[QasemItem], threshold: float | None = None) -> dict[str, float]:
    """BAcc (at the paper's 0.5) and AUC, as fractions, of a set of QAs; with a `threshold`
    chosen elsewhere (on dev), also the BAcc at it (`bacc_at_threshold`)."""
    gold = [it.gold for it in items]
    figures = {
        "bacc": balanced_accuracy(gold, [it.predicted for it in items]),
        "auc": roc_auc(gold, [it.score for it in items]),
    }
    if threshold is not None:
        figures["bacc_at_threshold"] = balanced_accuracy(
            gold, [it.score >= threshold for it in items]
        )
    return figures


def best_threshold(items: Sequence[QasemItem]) -> tuple[float, float]:
    """(threshold, BAcc) that maximises BAcc on these QAs, predicting supported iff s >=
    threshold (`fincheck.metrics.classification.best_threshold`). In-sample: choose it on dev,
    then apply it to test."""
    return threshold_peak(
        [it.score for it in items], [it.gold for it in items], [it.predicted for it in items]
    )


def score_qasem(
    items: Sequence[QasemItem],
    n_resamples: int = 1000,
    seed: int = 0,
    threshold: float | None = None,
    units: Sequence[str] | None = None,
) -> dict[str, dict]:
    """Per-subset and pooled ('overall') figures with 95% bootstrap CIs and counts; with a
    `threshold` chosen on dev, each also gets `bacc_at_threshold` (the paper's `bacc` stays at
    0.5). The pooled figures also say which threshold would maximise BAcc on these very QAs
    (`best_threshold`, in-sample: what a dev run hands to the test run). With `units` (each
    QA's source or response), the intervals resample whole units.

    Also 'mean_of_subsets': the unweighted mean of the per-subset BAcc/AUC, the way one averages
    the paper's three columns.
    """
    by_subset: dict[str, list[int]] = {}
    for i, it in enumerate(items):
        by_subset.setdefault(it.subset, []).append(i)
    order = [s for s in SUBSETS if s in by_subset] + sorted(set(by_subset) - set(SUBSETS))
    out: dict[str, dict] = {}
    for name, members in [*((s, by_subset[s]) for s in order), ("overall", range(len(items)))]:
        if not members:
            continue
        group = [items[i] for i in members]
        out[name] = {
            **qasem_figures(group, threshold),
            "n": len(group),
            "n_supported": sum(it.gold for it in group),
            "n_parse_failed": sum(it.parse_failed for it in group),
            "n_scored_from_text": sum(it.from_text for it in group),
            "n_text_not_yes_no": sum(it.text_not_yes_no for it in group),
            **({"n_units": len({units[i] for i in members})} if units else {}),
            "ci95": ci95_lists(
                bootstrap_cis(
                    lambda idx, g=group: qasem_figures([g[i] for i in idx], threshold),
                    len(group),
                    ("bacc", "auc", *(("bacc_at_threshold",) if threshold is not None else ())),
                    n_resamples,
                    seed=seed,
                    groups=groups_by([units[i] for i in members] if units else None),
                )
            ),
        }
        if threshold is not None:
            out[name]["threshold"] = threshold
    if any(it.gold for it in items) and not all(it.gold for it in items):
        chosen, bacc = best_threshold(items)
        out["overall"]["best_threshold"] = {"threshold": round(chosen, 6), "bacc": bacc}
    subset_entries = [out[s] for s in SUBSETS if s in out]
    if subset_entries:
        out["mean_of_subsets"] = {
            m: sum(e[m] for e in subset_entries) / len(subset_entries) for m in ("bacc", "auc")
        }
    return out
