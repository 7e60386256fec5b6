"""Percentile bootstrap confidence intervals over evaluation examples.

Resampling is over examples (a FINAL example, a QASem QA, an FHSumBench summary) with
replacement, n times, seeded; the metric is recomputed on each resample and the interval is the
(alpha/2, 1-alpha/2) percentiles. Resamples where the metric is undefined (NaN, e.g. AUC on a
one-class resample) are skipped; if more than half are, the interval is reported as undefined.
Below `MIN_ITEMS_FOR_CI` items no interval is given: resampling 4 items says little about the
population (an AUC of 1.000 [1.000, 1.000] on 4 QAs is not certainty) and would look precise.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

MIN_ITEMS_FOR_CI = 30


@dataclass(frozen=True)
class Interval:
    low: float
    high: float

    def as_list(self) -> list[float]:
        return [self.low, self.high]


def bootstrap_ci(
    metric: Callable[[Sequence[int]], float],
    n_items: int,
    n_resamples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> Interval | None:
    """Percentile CI of `metric(indices)` where indices are a resample of range(n_items); None
    below MIN_ITEMS_FOR_CI items."""
    if n_items < MIN_ITEMS_FOR_CI or n_resamples <= 0:
        return None
    rng = random.Random(seed)
    values = []
    for _ in range(n_resamples):
        indices = [rng.randrange(n_items) for _ in range(n_items)]
        value = metric(indices)
        if not math.isnan(value):
            values.append(value)
    if len(values) < n_resamples / 2:
        return None
    values.sort()
    alpha = 1 - confidence
    return Interval(percentile(values, alpha / 2), percentile(values, 1 - alpha / 2))


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default 'linear' method)."""
    position = q * (len(sorted_values) - 1)
    lo = math.floor(position)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = position - lo
    return sorted_values[lo] * (1 - frac) + sorted_values[hi] * frac
