"""`evaluate` module: FHSumBench figures with the reference scorer's semantics.

    import evaluate
    metric = evaluate.load("fincheck/tasks/fhsumbench/fincheck_fhsumbench")   # a local path
    metric.compute(predictions=['{"Faithfulness": false, "Factuality": true}'],
                   references=["factual_hallu"])

predictions: raw model outputs (the JSON judgement, read exactly as the benchmark's reference
scorer reads it; unreadable or faithful+non-factual is the class "invalid"); references: gold labels factual_hallu /
non_factual_hallu / no_hallu. Returns macro P and R over gold ∪ predicted labels, F = their
harmonic mean, FH/NFH/NoH accuracies, parse-failure rate. Wraps fincheck.tasks.fhsumbench.metrics.
"""

import evaluate

from fincheck.metrics.evaluate_info import metric_info
from fincheck.tasks.fhsumbench.metrics import judgement_to_label, score_fhsumbench
from fincheck.tasks.fhsumbench.reference import reference_judgement


class FincheckFhsumbench(evaluate.Metric):
    def _info(self):
        return metric_info(__doc__, "string", "string")

    def _compute(self, predictions, references, n_resamples=1000, seed=0):
        judgements = [reference_judgement(text)[0] for text in predictions]
        labels = [judgement_to_label(j) for j in judgements]
        failed = [j is None for j in judgements]
        return score_fhsumbench(
            list(references), labels, failed, n_resamples=n_resamples, seed=seed
        )
