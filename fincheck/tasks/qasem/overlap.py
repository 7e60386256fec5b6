"""Word overlap of a QA's answer with its reference, alone and added to a detector's P(Yes).

The overlap is QASem's floor, a system without a model (`fincheck baseline --method overlap`).
The combined score is a labelled system of its own (`--overlap-weight W` of `fincheck eval` and
`fincheck detect`): the detector's log-odds plus W times the overlap's distance from 1/2,

    s = sigmoid(logit(P(Yes)) + W * (overlap - 1/2))

so W = 0 is the detector alone, a large W ranks by the overlap and breaks its ties by P(Yes),
and s stays a probability-like score that a dev threshold and ROC-AUC read as they read P(Yes).
"""

from __future__ import annotations

import math
import re

WORD = re.compile(r"\w+")
# P(Yes) is clipped to [EPS, 1 - EPS] before its logit: a score of exactly 0 or 1 (fp32
# underflow of the other token) keeps a finite log-odds, so the overlap can still order it
EPS = 1e-6


def word_overlap(answer: str, reference: str) -> float:
    """The share of the answer's words (lowercased \\w+ runs, repeats counted) that occur in
    the reference: 1.0 when every word is there, 0.0 for an answer without words."""
    words = WORD.findall(answer.lower())
    known = set(WORD.findall(reference.lower()))
    return sum(w in known for w in words) / len(words) if words else 0.0


def with_overlap(p_yes: float, overlap: float, weight: float) -> float:
    """The combined score s (module docstring); `weight` 0 returns `p_yes` unchanged."""
    if weight == 0:
        return p_yes
    p = min(max(p_yes, EPS), 1 - EPS)
    z = math.log(p / (1 - p)) + weight * (overlap - 0.5)
    return 1 / (1 + math.exp(-z)) if z >= 0 else math.exp(z) / (1 + math.exp(z))


def reads_qas(task: str) -> bool:
    """Whether a task's inputs are QAs, whose answer the overlap reads (its prompt has an
    answer field): the tasks the overlap baseline and the combined system cover."""
    from fincheck.tasks import load_prompt  # (the registry imports this package's task)

    return "answer" in load_prompt(task).fields


def combined_p_yes(p_yes: float | None, fields: dict[str, str], weight: float) -> float | None:
    """A QA's combined score from its prompt fields (`answer`, `text`); None stays None (no
    score was read), and so does every input of a task without an answer field."""
    if p_yes is None or weight == 0 or "answer" not in fields:
        return p_yes
    return with_overlap(p_yes, word_overlap(fields["answer"], fields["text"]), weight)
