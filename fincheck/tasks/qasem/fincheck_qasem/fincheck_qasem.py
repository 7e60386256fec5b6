"""`evaluate` module: QASemConsistency BAcc and ROC-AUC (the QASem paper, Table 4).

    import evaluate
    metric = evaluate.load("fincheck/tasks/qasem/fincheck_qasem")   # a local path, no hub
    metric.compute(predictions=[0.9, 0.2], references=[1, 0], subsets=["cliff", "cliff"])

predictions: support scores s = P(Yes)/(P(Yes)+P(No)) in [0, 1]; references: 1 = supported
(gold "Yes"), 0 = not supported. Optional `subsets` (cliff/factscore/verifiability per item)
adds per-subset figures. Supported iff s >= 0.5. Thin wrapper over fincheck.tasks.qasem.metrics.
"""

import evaluate

from fincheck.metrics.evaluate_info import metric_info
from fincheck.tasks.qasem.metrics import QasemItem, score_qasem


class FincheckQasem(evaluate.Metric):
    def _info(self):
        return metric_info(__doc__, "float64", "int32")

    def _compute(self, predictions, references, subsets=None, n_resamples=1000, seed=0):
        names = subsets or ["overall"] * len(predictions)
        items = [
            QasemItem(subset, bool(ref), float(score))
            for score, ref, subset in zip(predictions, references, names, strict=True)
        ]
        result = score_qasem(items, n_resamples=n_resamples, seed=seed)
        return result if subsets else result["overall"]
