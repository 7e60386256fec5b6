"""fincheck's detector as a Ragas metric (a single-turn metric of `ragas.evaluate`).

    from ragas import EvaluationDataset, evaluate
    from fincheck.detector import Detector
    from fincheck.serve.rag_metrics.ragas_metric import FincheckSupport
    metric = FincheckSupport(detector=Detector.from_pretrained(adapter="checkpoints/my-run"))
    evaluate(EvaluationDataset.from_list([{"response": a, "retrieved_contexts": [...]}]), [metric])

The score of each sample: the probability that `response` states nothing its
`retrieved_contexts` do not support (1 - `fincheck detect`'s FINAL flag score). Ragas keeps a
number per sample; the descriptions of the last sample scored are `last.descriptions`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fincheck.detector import Detector
from fincheck.errors import FincheckError
from fincheck.serve.rag_metrics.support import Support, grounding_text, judge_support

try:
    from ragas.metrics.base import MetricType, SingleTurnMetric
except ImportError:  # pragma: no cover - the optional extra is missing
    raise FincheckError("the Ragas metric needs ragas: pip install 'fincheck[rag]'") from None


@dataclass
class FincheckSupport(SingleTurnMetric):
    """A local or served fincheck detector, scoring a response's support in its contexts."""

    detector: Detector | None = None
    name: str = "fincheck_support"
    _required_columns: dict[MetricType, set[str]] = field(
        default_factory=lambda: {MetricType.SINGLE_TURN: {"response", "retrieved_contexts"}}
    )
    last: Support | None = None

    def init(self, run_config: Any) -> None:
        if self.detector is None:
            raise FincheckError("FincheckSupport needs a detector: FincheckSupport(detector=...)")

    async def _single_turn_ascore(self, sample: Any, callbacks: Any) -> float:
        text = grounding_text(
            sample.retrieved_contexts,
            "FincheckSupport",
            "SingleTurnSample(retrieved_contexts=[...])",
        )
        if not isinstance(sample.response, str):
            raise FincheckError("FincheckSupport needs the answer as text: response")
        self.last = judge_support(self.detector, text, sample.response)
        return self.last.score
