"""`evaluate` module: QASemConsistency BAcc and ROC-AUC (the QASem paper, Table 4).

    import evaluate
    metric = evaluate.load("eval/evaluate_metrics/fincheck_qasem")   # a local path, no hub
    metric.compute(predictions=[0.9, 0.2], references=[1, 0], subsets=["cliff", "cliff"])

predictions: support scores s = P(Yes)/(P(Yes)+P(No)) in [0, 1]; references: 1 = supported
(gold "Yes"), 0 = not supported. Optional `subsets` (cliff/factscore/verifiability per item)
adds per-subset figures. Supported iff s >= 0.5. Thin wrapper over fincheck.tasks.qasem.metrics.
"""

import datasets
import evaluate

from fincheck.tasks.qasem.metrics import QasemItem, score_qasem

_DESCRIPTION = __doc__


class FincheckQasem(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("float64"), "references": datasets.Value("int32")}
            ),
        )

    def _compute(self, predictions, references, subsets=None, n_resamples=1000, seed=0):
        names = subsets or ["overall"] * len(predictions)
        items = [
            QasemItem(subset, bool(ref), float(score))
            for score, ref, subset in zip(predictions, references, names, strict=True)
        ]
        result = score_qasem(items, n_resamples=n_resamples, seed=seed)
        return result if subsets else result["overall"]
