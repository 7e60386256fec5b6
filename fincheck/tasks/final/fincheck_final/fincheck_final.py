"""`evaluate` module: FINAL micro precision/recall/F1 from judge matchings, and binarized BAcc.

    import evaluate
    metric = evaluate.load("fincheck/tasks/final/fincheck_final")   # a local path
    metric.compute(predictions=["A. x\\nB. y"], references=["A. z"],
                   matchings=[{"A": "A", "B": None}])

predictions / references: description lists as text ("A. ..." lines, or "None"; a prediction is
read as `fincheck score` reads a model's answer, a reference as the list it is); matchings:
one {predicted letter: gold letter or None} per example, as a judge returned it (needed only
where both lists are non-empty, an error when missing there; an unmatched letter maps to None).
TP = distinct gold letters matched. Wraps fincheck.tasks.final.metrics; the judge itself is
`fincheck score --judge ...`.
"""

import evaluate

from fincheck.metrics.evaluate_info import metric_info
from fincheck.tasks.final.metrics import FinalItem, score_final, true_positives
from fincheck.tasks.final.reader import listed_descriptions, parse_descriptions


class FincheckFinal(evaluate.Metric):
    def _info(self):
        return metric_info(__doc__, "string", "string")

    def _compute(self, predictions, references, matchings=None, n_resamples=1000, seed=0):
        matchings = matchings or [None] * len(predictions)
        items = []
        for i, (pred, ref, matching) in enumerate(
            zip(predictions, references, matchings, strict=True)
        ):
            # the model's answer by the reader (an answer it cannot read: no prediction), the
            # gold list as written
            n_pred, n_gold = len(parse_descriptions(pred)), len(listed_descriptions(ref))
            judged = n_pred > 0 and n_gold > 0  # else no judge call: TP = 0
            if judged and matching is None:
                raise ValueError(f"example {i}: both lists are non-empty, a matching is needed")
            items.append(FinalItem(n_pred, n_gold, true_positives(matching) if judged else 0))
        return score_final(items, n_resamples=n_resamples, seed=seed)
