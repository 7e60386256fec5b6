#!/usr/bin/env python
"""Evaluation speed: `fincheck eval` itself on a model (a `fincheck models` name, a folder or a
hub id; a random-init architecture saved as a folder measures a GPU shape), naive vs batched vs
prefix-reuse on the same examples, with the largest p_yes difference between them
(bench.eval_paths):
  # QASem: whole reference documents, about 100 QAs, in every mode (the first is the reference)
  python scripts/bench_eval.py --model smollm2-135m-instruct --prepared-dir prepared \\
      --tasks qasem --limit 100
  # the whole QASem split, the plain path beside prefix reuse (about an hour on 2 CPU cores)
  python scripts/bench_eval.py --model smollm2-135m-instruct --prepared-dir prepared \\
      --tasks qasem --limit 0 --modes batched,prefix-reuse --progress
  # FINAL and FHSumBench with an adapter, whole splits, the fast path only
  python scripts/bench_eval.py --model smollm2-135m-instruct --adapter checkpoints/smollm2-135m-cpu \\
      --prepared-dir prepared --tasks final,fhsumbench --limit 0 --modes prefix-reuse
"""

from __future__ import annotations

import sys

from bench import eval_paths
from bench.options import Bench

BENCH = Bench(
    eval_paths.EvalPathSettings,
    eval_paths.__doc__,
    eval_paths.run_eval_paths,
    lambda r: (eval_paths.format_paths_report(r), True),
)


def build_parser():
    return BENCH.parser(__doc__)


def main(argv: list[str] | None = None) -> int:
    return BENCH.main("bench_eval.py", __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
