"""Which weight should QASem's combined system use (`--overlap-weight`)? A dev check.

    python scripts/qasem_combined_dev.py ADAPTER_DEV/scored/qasem.jsonl OVERLAP_DEV/scored/qasem.jsonl

Both files are `fincheck score --split dev` outputs (each QA's score, gold and resample units).
The combined score is `fincheck.tasks.qasem.overlap.with_overlap`: sigmoid(logit(P(Yes)) + beta
* (overlap - 1/2)). The script prints dev ROC-AUC for each beta, and then the best beta's gain
over the overlap alone, with fincheck's paired 95% interval over whole sources (none below its
30-unit minimum). Reading beta off the same QAs makes that gain optimistic: if even it is not
established, the combination is not worth building.
"""

from __future__ import annotations

import argparse
import json

from fincheck.metrics.bootstrap import MIN_ITEMS_FOR_CI, bootstrap_ci, groups_by
from fincheck.metrics.classification import roc_auc
from fincheck.tasks.qasem.overlap import with_overlap

BETAS = [0, 0.5, 1, 2, 3, 4, 6, 8, 12, 16, 32]


def read(path: str) -> dict[str, dict]:
    with open(path, encoding="utf-8") as f:
        return {r["id"]: r for r in map(json.loads, f)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("adapter", help="the adapter's scored/qasem.jsonl (dev)")
    parser.add_argument("overlap", help="the overlap baseline's scored/qasem.jsonl (dev)")
    parser.add_argument("--resamples", type=int, default=2000)
    args = parser.parse_args()
    adapter, overlap = read(args.adapter), read(args.overlap)
    ids = sorted(adapter.keys() & overlap.keys())
    gold = [adapter[i]["gold"] == "Yes" for i in ids]
    p_yes = [adapter[i]["score"] for i in ids]
    words = [overlap[i]["score"] for i in ids]

    def combined(beta: float) -> list[float]:
        return [with_overlap(p, w, beta) for p, w in zip(p_yes, words, strict=True)]

    aucs = {b: roc_auc(gold, combined(b)) for b in BETAS}
    best = max(aucs, key=aucs.get)
    print(f"{len(ids)} dev QAs; overlap alone: AUC {roc_auc(gold, words):.4f}")
    print("AUC by beta (beta 0: the adapter alone):", {b: round(a, 4) for b, a in aucs.items()})

    # the project's grouped bootstrap (whole sources; no interval below MIN_ITEMS_FOR_CI units)
    scores, sources = combined(best), [adapter[i]["units"]["source"] for i in ids]

    def gain(rows) -> float:
        y = [gold[k] for k in rows]
        return roc_auc(y, [scores[k] for k in rows]) - roc_auc(y, [words[k] for k in rows])

    groups = groups_by(sources)
    ci = bootstrap_ci(gain, len(ids), args.resamples, groups=groups)
    interval = (
        f"[{ci.low:+.4f}, {ci.high:+.4f}]" if ci else f"no interval: {MIN_ITEMS_FOR_CI}+ needed"
    )
    print(
        f"beta {best} (read off these QAs) minus overlap: {gain(range(len(ids))):+.4f} "
        f"{interval} ({len(groups)} sources)"
    )


if __name__ == "__main__":
    main()
