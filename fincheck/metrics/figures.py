"""How a figure is written, once for every report, table and one-line summary: three decimals,
"–" for an undefined one (None, NaN), a 95% CI in brackets, or the n when too few items give
none. (The papers' published numbers as table rows: `fincheck.tasks.base.paper_rows`.)"""

from __future__ import annotations

import math

from fincheck.metrics.bootstrap import MIN_ITEMS_FOR_CI


def fmt(value, scale: float = 1.0, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, str):
        return value
    return f"{value * scale:.{digits}f}"


def fmt_ci(entry: dict, metric: str, scale: float = 1.0, digits: int = 3) -> str:
    """The figure with its 95% CI; with too few items, or too few of the units the bootstrap
    resamples whole (`n_units`: documents, sources), the figure and its n."""
    ci = (entry.get("ci95") or {}).get(metric)
    value = fmt(entry.get(metric), scale, digits)
    n, units = entry.get("n"), entry.get("n_units")
    if not ci and isinstance(units, int) and units < MIN_ITEMS_FOR_CI and value != "–":
        return f"{value} (n={n} in {units} resampled units, too few for a CI)"
    if not ci and isinstance(n, int) and n < MIN_ITEMS_FOR_CI and value != "–":
        return f"{value} (n={n}, too few for a CI)"
    if not ci:
        return value
    return f"{value} [{fmt(ci[0], scale, digits)}, {fmt(ci[1], scale, digits)}]"
