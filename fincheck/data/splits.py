"""Seeded splits that keep a group (a QASem response, an FHSumBench source document) together."""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable

from fincheck.data.pairs import Pair


def split_by_group(
    pairs: Iterable[Pair], fractions: dict[str, float], seed: int
) -> dict[str, list[Pair]]:
    """Assign whole groups to splits so each split gets about its fraction of the *pairs*.

    Groups are shuffled by a seeded hash, then dealt in order: a group goes to the first split
    whose pair quota (fraction x total) is not yet filled. The same seed and inputs always give
    the same assignment, whatever the input order.
    """
    if abs(sum(fractions.values()) - 1.0) > 1e-6:
        raise ValueError(f"split fractions must sum to 1, got {fractions}")
    groups: dict[str, list[Pair]] = defaultdict(list)
    for pair in pairs:
        groups[pair.meta["group"]].append(pair)
    total = sum(len(g) for g in groups.values())
    quotas = {name: fraction * total for name, fraction in fractions.items()}
    out: dict[str, list[Pair]] = {name: [] for name in fractions}
    names = [name for name in fractions if fractions[name] > 0]
    # a seeded, platform-independent shuffle (Python's hash() is salted per process)
    for group in sorted(groups, key=lambda g: hashlib.sha256(f"{seed}:{g}".encode()).hexdigest()):
        members = groups[group]
        # the split furthest below its quota (relative to it) takes the group; ties: the first
        target = min(names, key=lambda n: len(out[n]) / quotas[n])
        for pair in members:
            pair.split = target
        out[target].extend(members)
    return out
