"""fincheck's detector as a DeepEval metric (`deepeval.metrics.BaseMetric`).

    from fincheck.detector import Detector
    from fincheck.serve.rag_metrics.deepeval_metric import FincheckMetric
    metric = FincheckMetric(Detector.from_pretrained(adapter="checkpoints/my-run"))
    deepeval.evaluate([LLMTestCase(input=q, actual_output=a, retrieval_context=[...])], [metric])

score: the probability that `actual_output` states nothing its `retrieval_context` (else its
`context`) does not support, 1 - `fincheck detect`'s FINAL flag score; success: score >=
threshold; reason: the description list.
"""

from __future__ import annotations

from typing import Any

from fincheck.detector import Detector
from fincheck.errors import FincheckError
from fincheck.serve.rag_metrics.support import grounding_text, judge_support

try:
    from deepeval.metrics import BaseMetric
except ImportError:  # pragma: no cover - the optional extra is missing
    raise FincheckError("the DeepEval metric needs deepeval: pip install 'fincheck[rag]'") from None


class FincheckMetric(BaseMetric):
    """A local or served fincheck detector, scoring an answer's support in its context."""

    def __init__(self, detector: Detector, threshold: float = 0.5) -> None:
        self.detector = detector
        self.threshold = threshold
        self.include_reason = True
        self.async_mode = False  # the detector runs here (or waits on its server) in order
        self.strict_mode = False
        self.evaluation_model = "fincheck detector"
        self.descriptions: list[str] = []

    def measure(self, test_case: Any, *args: Any, **kwargs: Any) -> float:
        contexts = getattr(test_case, "retrieval_context", None) or getattr(
            test_case, "context", None
        )
        text = grounding_text(contexts, "FincheckMetric", "LLMTestCase(retrieval_context=[...])")
        if not isinstance(test_case.actual_output, str):
            raise FincheckError("FincheckMetric needs the answer as text: actual_output")
        support = judge_support(self.detector, text, test_case.actual_output)
        self.score, self.reason = support.score, support.reason
        self.descriptions = support.descriptions
        self.success = self.score >= self.threshold
        return self.score

    async def a_measure(self, test_case: Any, *args: Any, **kwargs: Any) -> float:
        return self.measure(test_case)

    def is_successful(self) -> bool:
        return bool(self.success)

    @property
    def __name__(self) -> str:  # DeepEval's reports name a metric by this property
        return "fincheck support"
