"""FHSumBench scoring, with the semantics of the benchmark's reference scorer (method/score.py);
how that scorer reads an output is `fincheck.tasks.fhsumbench.reference`.

A judgement {"Faithfulness": bool, "Factuality": bool} maps to a label:
  faithful + factual        -> no_hallu
  unfaithful + factual      -> factual_hallu
  unfaithful + non-factual  -> non_factual_hallu
  faithful + non-factual, or an output that does not parse -> invalid
Figures: per-class accuracy (FH-Acc, NFH-Acc, NoH-Acc: the fraction of each gold class predicted
as that class), overall accuracy, macro precision and macro recall over the labels present in
gold ∪ predictions (so "invalid" is a fourth class whenever it is predicted: precision 0,
recall 0), and F = the harmonic mean of macro-P and macro-R (not the mean of per-class F1s).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from fincheck.io import jsonl
from fincheck.metrics.bootstrap import bootstrap_cis, ci95_lists, groups_by
from fincheck.metrics.classification import (
    balanced_accuracy,
    confusion_matrix,
    harmonic_mean,
    macro_precision_recall,
)

FACTUAL = "factual_hallu"
NON_FACTUAL = "non_factual_hallu"
NO_HALLU = "no_hallu"
INVALID = "invalid"
LABELS: tuple[str, ...] = (FACTUAL, NON_FACTUAL, NO_HALLU)
ACCURACY_NAMES = {FACTUAL: "fh_acc", NON_FACTUAL: "nfh_acc", NO_HALLU: "noh_acc"}
# label -> the (Faithfulness, Factuality) judgement the model answers with
JUDGEMENTS = {NO_HALLU: (True, True), FACTUAL: (False, True), NON_FACTUAL: (False, False)}
LABEL_OF = {judgement: label for label, judgement in JUDGEMENTS.items()}

_FENCE = re.compile(r"```(?:json|JSON)?")
_OBJECT = re.compile(r"\{[^{}]*\}", re.DOTALL)
_FIELD = r"[\"']?{name}[\"']?\s*[:=]\s*[\"']?(true|false)\b"


def lenient_judgement(text: str) -> tuple[bool, bool] | None:
    """fincheck's lenient reading, a second figure labelled "lenient parse" (the headline uses
    the reference's, `reference.reference_judgement`): (faithfulness, factuality) or
    None.

    Tolerates code fences, prose before and after the object, Python-style True/False, quoted
    "true"/"false" values, and key case; takes the first object that has both keys. As a last
    resort (a truncated or unbalanced object) reads `Faithfulness: x ... Factuality: y`. The
    reference scorer reads some of these differently (lowercase keys, single quotes and
    `Faithfulness: x` lines are invalid there; "yes"/"no" and 0/1 values valid).
    """
    cleaned = _FENCE.sub(" ", text)
    for candidate in _OBJECT.findall(cleaned):
        normalized = re.sub(r"\bTrue\b", "true", re.sub(r"\bFalse\b", "false", candidate))
        try:
            obj = jsonl.loads(normalized)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            lowered = {str(k).strip().lower(): v for k, v in obj.items()}
            values = [lowered.get(key) for key in ("faithfulness", "factuality")]  # missing: None
            words = {"true": True, "false": False}
            values = [words.get(v.strip().lower(), v) if isinstance(v, str) else v for v in values]
            if all(isinstance(v, bool) for v in values):
                return values[0], values[1]
    faith = re.search(_FIELD.format(name="faithfulness"), cleaned, re.IGNORECASE)
    fact = re.search(_FIELD.format(name="factuality"), cleaned, re.IGNORECASE)
    if faith and fact:
        return faith.group(1).lower() == "true", fact.group(1).lower() == "true"
    return None


def judgement_to_label(judgement: tuple[bool, bool] | None) -> str:
    """(faithful, factual) -> one of LABELS, or INVALID (see the module docstring)."""
    return LABEL_OF.get(tuple(judgement), INVALID) if judgement is not None else INVALID


def fhsumbench_figures(gold: Sequence[str], pred: Sequence[str]) -> dict[str, float]:
    """Accuracy, per-class accuracies, macro P/R and their harmonic mean F."""
    macro_p, macro_r, _ = macro_precision_recall(gold, pred)
    figures = {
        "precision": macro_p,
        "recall": macro_r,
        "f": harmonic_mean(macro_p, macro_r),
        "accuracy": sum(g == p for g, p in zip(gold, pred, strict=True)) / len(gold)
        if gold
        else float("nan"),
    }
    for label, name in ACCURACY_NAMES.items():
        members = [p for g, p in zip(gold, pred, strict=True) if g == label]
        figures[name] = sum(p == label for p in members) / len(members) if members else float("nan")
    # Not in the paper: faithful or not (no_hallu vs either hallucination), the binary question
    # faithfulness metrics such as FIZZ answer; balanced over the two classes.
    figures["faithfulness_bacc"] = balanced_accuracy(
        [g == NO_HALLU for g in gold], [p == NO_HALLU for p in pred]
    )
    # Not in the paper either: non-factual hallucination or not (the benchmark's second
    # question, whether what the summary adds is wrong in the world), balanced the same way.
    figures["factuality_bacc"] = balanced_accuracy(
        [g == NON_FACTUAL for g in gold], [p == NON_FACTUAL for p in pred]
    )
    return figures


def score_fhsumbench(
    gold: Sequence[str],
    pred: Sequence[str],
    parse_failed: Sequence[bool],
    n_resamples: int = 1000,
    seed: int = 0,
    units: Sequence[str] | None = None,
) -> dict:
    """The reference figures plus CIs (whole `units`, each summary's source, resampled when
    given), the confusion matrix and the parse-failure rate."""
    for label in gold:
        if label not in LABELS:
            raise ValueError(f"gold FHSumBench label {label!r} not in {LABELS}")
    matrix_labels = [*LABELS, INVALID]
    return {
        **fhsumbench_figures(gold, pred),
        "n": len(gold),
        **({"n_units": len(set(units))} if units else {}),
        "n_parse_failed": sum(parse_failed),
        "parse_failure_rate": sum(parse_failed) / len(gold) if gold else float("nan"),
        "n_invalid": sum(p == INVALID for p in pred),
        "confusion": {
            "labels": matrix_labels,
            "counts": confusion_matrix(gold, pred, matrix_labels),
        },
        "ci95": ci95_lists(
            bootstrap_cis(
                lambda idx: fhsumbench_figures([gold[i] for i in idx], [pred[i] for i in idx]),
                len(gold),
                ("f", "precision", "recall", "faithfulness_bacc", "factuality_bacc"),
                n_resamples,
                seed=seed,
                groups=groups_by(units),
            )
        ),
    }
