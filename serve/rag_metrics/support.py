"""The one reading both RAG metrics share: an answer against its grounding text, as FINAL's
detector reads a summary against its document (`fincheck detect`, task final)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fincheck.detector import Detector
from fincheck.errors import FincheckError

NO_CONTEXT = (
    "{metric} needs a grounding text: the retrieved context the answer should rest on "
    "({fields}); this test case has none"
)


@dataclass(frozen=True)
class Support:
    """A metric's result: `score` = 1 - the flag score (higher: better supported), the
    descriptions of what the context does not support, and the reason a report shows."""

    score: float
    descriptions: list[str]
    reason: str


def grounding_text(contexts: Sequence[str] | None, metric: str, fields: str) -> str:
    """The retrieved passages as one document, in their order (a blank line between them)."""
    passages = [c for c in contexts or () if isinstance(c, str) and c.strip()]
    if not passages:
        raise FincheckError(NO_CONTEXT.format(metric=metric, fields=fields))
    return "\n\n".join(passages)


def judge_support(detector: Detector, text: str, answer: str) -> Support:
    """`fincheck detect`'s FINAL record for (text, answer), read as a support score."""
    record = detector.detect("final", [{"text": text, "summary": answer}])[0]
    flag = record.get("flag_score")
    if flag is None:  # a local model always reads it; a served one raises without logprobs
        raise FincheckError("the detector gave no flag score for this answer")
    descriptions = list(record["descriptions"])
    if descriptions:
        reason = "not supported by the context: " + "; ".join(descriptions)
    elif record.get("consistent") is None:
        reason = f"no verdict ({record.get('warning', 'unreadable answer')})"
    else:
        reason = "the context supports everything the answer states"
    return Support(1.0 - float(flag), descriptions, reason)
