"""Turn joined (gold pair, prediction) lists into the task figures of SPEC.md.

One function per task; each returns `TaskScore`: the figures (as in results.json) and one
record per example (gold, parsed prediction, score, judge outcome) for `scored/<task>.jsonl`,
the report's examples and the plots.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from fincheck.errors import FincheckError
from fincheck.eval.fhsumbench_metrics import (
    judgement_to_label,
    parse_judgement,
    score_fhsumbench,
)
from fincheck.eval.final_metrics import FinalItem, parse_descriptions, score_final, true_positives
from fincheck.eval.judge import MatchingJudge
from fincheck.eval.predictions import Prediction
from fincheck.eval.qasem_metrics import QasemItem, gold_supported, score_qasem, support_score
from fincheck.pairs import Pair

Joined = Sequence[tuple[Pair, Prediction]]

# Where the prepared pairs keep what scoring needs (data-prep's `meta`); first key found wins.
QASEM_SUBSET_KEYS = ("dataset", "subset", "sub_dataset")


@dataclass
class TaskScore:
    figures: dict
    examples: list[dict] = field(default_factory=list)
    judge_errors: int = 0
    judge_parse_failed: int = 0


def qasem_subset(pair: Pair) -> str:
    for key in QASEM_SUBSET_KEYS:
        if isinstance(pair.meta.get(key), str):
            return pair.meta[key]
    return "unknown"


def score_qasem_task(joined: Joined, n_resamples: int = 1000, seed: int = 0) -> TaskScore:
    items, examples = [], []
    for pair, pred in joined:
        gold = gold_supported(pair.target)
        s, failed, from_text = support_score(pred.output, pred.p_yes, gold)
        item = QasemItem(qasem_subset(pair), gold, s, failed, from_text)
        items.append(item)
        examples.append(
            {
                "id": pair.id,
                "subset": item.subset,
                "gold": "Yes" if gold else "No",
                "output": pred.output,
                "score": s,
                "predicted": "Yes" if item.predicted else "No",
                "parse_failed": failed,
            }
        )
    return TaskScore(score_qasem(items, n_resamples=n_resamples, seed=seed), examples)


def fhsumbench_gold_label(pair: Pair) -> str:
    label = pair.meta.get("label")
    if isinstance(label, str):
        return label
    return judgement_to_label(parse_judgement(pair.target))


def score_fhsumbench_task(joined: Joined, n_resamples: int = 1000, seed: int = 0) -> TaskScore:
    gold, pred, failed, examples = [], [], [], []
    for pair, prediction in joined:
        judgement = parse_judgement(prediction.output)
        label = judgement_to_label(judgement)
        gold.append(fhsumbench_gold_label(pair))
        pred.append(label)
        failed.append(judgement is None)
        examples.append(
            {
                "id": pair.id,
                "gold": gold[-1],
                "output": prediction.output,
                "predicted": label,
                "parse_failed": judgement is None,
            }
        )
    return TaskScore(
        score_fhsumbench(gold, pred, failed, n_resamples=n_resamples, seed=seed), examples
    )


def final_summary(pair: Pair) -> str:
    """The summary the descriptions are about, for the judge (data-prep keeps it in `meta`)."""
    summary = pair.meta.get("summary")
    if not isinstance(summary, str):
        raise FincheckError(
            f"{pair.id}: the gold pair has no meta.summary; re-run `fincheck prepare` "
            "(this fincheck version stores it for the FINAL judge)"
        )
    return summary


def score_final_task(
    joined: Joined,
    judge: MatchingJudge | None,
    concurrency: int = 8,
    n_resamples: int = 1000,
    seed: int = 0,
    progress: bool = True,
) -> TaskScore:
    """FINAL with the judge; without one, only examples with an empty list get P/R counts
    (they need no judge) and the rest are left unjudged: the binarized BAcc is still exact."""
    parsed = [
        (pair, pred, parse_descriptions(pred.output), parse_descriptions(pair.target))
        for pair, pred in joined
    ]
    needs_judge = [i for i, (_, _, p, g) in enumerate(parsed) if p and g]
    results: dict[int, object] = {}
    if judge is not None and needs_judge:
        requests = [(final_summary(parsed[i][0]), parsed[i][2], parsed[i][3]) for i in needs_judge]
        for i, result in zip(
            needs_judge, judge.match_many(requests, concurrency, progress), strict=True
        ):
            results[i] = result
    items, examples = [], []
    errors = parse_failed = 0
    judge_set = set(needs_judge)
    for i, (pair, pred, predicted, gold) in enumerate(parsed):
        record = {
            "id": pair.id,
            "gold": gold,
            "predicted": predicted,
            "output": pred.output,
        }
        if i not in judge_set:
            tp: int | None = 0
            record["judge"] = "skipped"
        elif i in results:
            result = results[i]
            record["judge"] = result.status
            record["matching"] = result.matching
            if result.status == "ok":
                tp = true_positives(result.matching)
            else:
                tp = None
                record["judge_raw"] = result.raw
                record["judge_error"] = result.error
                errors += result.status == "error"
                parse_failed += result.status == "parse_failed"
        else:
            tp = None
            record["judge"] = "no_judge"
        record["true_positives"] = tp
        items.append(FinalItem(len(predicted), len(gold), tp))
        examples.append(record)
    figures = score_final(items, n_resamples=n_resamples, seed=seed)
    if judge is None and needs_judge:
        # P/R over only the examples that need no judge would be 0 by construction: not a figure
        for metric in ("precision", "recall", "f1"):
            figures[metric] = math.nan
            figures["ci95"][metric] = None
    figures["judge_errors"] = errors
    figures["judge_parse_failed"] = parse_failed
    figures["judge_parse_failure_rate"] = parse_failed / len(needs_judge) if needs_judge else 0.0
    figures["n_needing_judge"] = len(needs_judge)
    # FINAL release items vs DeFacto-derived silver descriptions: the paper's numbers are on the former
    origins: dict[str, int] = {}
    for pair, *_ in parsed:
        origin = str(pair.meta.get("origin", "unknown"))
        origins[origin] = origins.get(origin, 0) + 1
    figures["gold_origin"] = origins
    figures["judged_with"] = (
        {**judge.client.identity, "prompt_version": judge.prompt.version} if judge else None
    )
    return TaskScore(figures, examples, errors, parse_failed)
