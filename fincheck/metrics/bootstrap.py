"""Percentile bootstrap confidence intervals over evaluation examples.

Resampling is over examples (a FINAL example, a QASem QA, an FHSumBench summary) with
replacement, n times, seeded; the metric is recomputed on each resample and the interval is the
(alpha/2, 1-alpha/2) percentiles. Given `groups` (lists of example indices: the QAs of one source
document, the summaries of one article), whole groups are resampled instead, so examples that
share a unit stay together: 1,556 QASem QAs are not 1,556 independent draws when they ask about
49 sources, and an interval over single QAs would be too narrow. Resamples where the metric is undefined (NaN, e.g. AUC on a
one-class resample) are skipped; if more than half are, the interval is reported as undefined.
Below `MIN_ITEMS_FOR_CI` items no interval is given: resampling 4 items says little about the
population (an AUC of 1.000 [1.000, 1.000] on 4 QAs is not certainty) and would look precise.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

MIN_ITEMS_FOR_CI = 30


@dataclass(frozen=True)
class Interval:
    low: float
    high: float


def bootstrap_cis(
    figures: Callable[[Sequence[int]], Mapping[str, float]],
    n_items: int,
    metrics: Sequence[str],
    n_resamples: int = 1000,
    seed: int = 0,
    groups: Sequence[Sequence[int]] | None = None,
) -> dict[str, Interval | None]:
    """Percentile CI of each of `metrics` in `figures(indices)`, where indices are a resample of
    range(n_items), or, with `groups`, the indices of len(groups) groups drawn with replacement;
    every metric is read off the same resamples, drawn once (so each interval is the one
    `bootstrap_ci` gives that metric alone). None below MIN_ITEMS_FOR_CI items (groups)."""
    units = [[i] for i in range(n_items)] if groups is None else [list(g) for g in groups]
    if len(units) < MIN_ITEMS_FOR_CI or n_resamples <= 0:
        return dict.fromkeys(metrics)
    rng = random.Random(seed)
    values: dict[str, list[float]] = {m: [] for m in metrics}
    for _ in range(n_resamples):
        drawn = [rng.randrange(len(units)) for _ in units]
        resampled = figures([i for u in drawn for i in units[u]])
        for m in metrics:
            if not math.isnan(resampled[m]):
                values[m].append(resampled[m])
    alpha = 1 - 0.95  # 95% intervals: results.json's ci95
    intervals: dict[str, Interval | None] = {}
    for m, v in values.items():
        v.sort()
        enough = len(v) >= n_resamples / 2  # else most resamples left it undefined
        intervals[m] = (
            Interval(percentile(v, alpha / 2), percentile(v, 1 - alpha / 2)) if enough else None
        )
    return intervals


def bootstrap_ci(
    metric: Callable[[Sequence[int]], float],
    n_items: int,
    n_resamples: int = 1000,
    seed: int = 0,
    groups: Sequence[Sequence[int]] | None = None,
) -> Interval | None:
    """`bootstrap_cis` of a single figure."""
    cis = bootstrap_cis(lambda idx: {"": metric(idx)}, n_items, [""], n_resamples, seed, groups)
    return cis[""]


def groups_by(keys: Sequence[str] | None) -> list[list[int]] | None:
    """The indices of each distinct key (first seen, first), for `groups`; None without keys
    (then items are resampled one by one)."""
    if keys is None:
        return None
    groups: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def ci95_lists(cis: Mapping[str, Interval | None]) -> dict[str, list[float] | None]:
    """results.json's `ci95`: each metric's [low, high], or None."""
    return {m: [ci.low, ci.high] if ci else None for m, ci in cis.items()}


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default 'linear' method)."""
    position = q * (len(sorted_values) - 1)
    lo = math.floor(position)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = position - lo
    return sorted_values[lo] * (1 - frac) + sorted_values[hi] * frac
