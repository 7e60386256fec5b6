#!/usr/bin/env python
"""Evaluation speed, two ways, picked by --model.

A real model (a `fincheck models` name, a folder or a hub id): the eval path itself
(bench.eval_paths), naive vs batched vs prefix-reuse on the same examples, with the
largest p_yes difference between them:
  # QASem: every QA over 8 sampled reference documents, in every mode (the first is the reference)
  python scripts/bench_eval.py --model smollm2-135m-instruct --prepared-dir prepared \\
      --tasks qasem --qasem-docs 8
  # the whole QASem split, the plain path beside prefix reuse (about an hour on 2 CPU cores)
  python scripts/bench_eval.py --model smollm2-135m-instruct --prepared-dir prepared \\
      --tasks qasem --qasem-docs 0 --modes batched,prefix-reuse --progress
  # FINAL and FHSumBench with an adapter, whole splits, the fast path only
  python scripts/bench_eval.py --model smollm2-135m-instruct --adapter checkpoints/smollm2-135m-cpu \\
      --prepared-dir prepared --tasks final,fhsumbench --limit 0 --modes prefix-reuse

An architecture (configs/models/<name>.json, random-init weights: no download), prefill and
generation speed of that shape (bench.eval_speed):
  # the GPU goal (eval prefill >= 50k prompt tokens/s on one H100):
  python scripts/bench_eval.py --model qwen2.5-1.5b --prepared-dir /data/prepared \\
      --limit 256 --batch-size 32 --json-out bench-eval-h100.json
  # CPU smoke run (seconds): the tiny config, what CI runs
  python scripts/bench_eval.py --model tiny --limit 4 --batch-size 2 --max-input 128
"""

from __future__ import annotations

import sys

from bench import eval_paths, eval_speed
from bench.eval_paths import EvalPathSettings, format_paths_report, run_eval_paths
from bench.eval_speed import EvalBenchSettings, format_eval_report, run_eval_bench
from bench.options import Bench, ModelDispatch

BENCH = ModelDispatch(
    "bench_eval.py",
    __doc__,
    architecture=Bench(
        EvalBenchSettings,
        eval_speed.__doc__,
        run_eval_bench,
        lambda r: (format_eval_report(r), True),
    ),
    model=Bench(
        EvalPathSettings,
        eval_paths.__doc__,
        run_eval_paths,
        lambda r: (format_paths_report(r), True),
    ),
)


def build_parser() -> ModelDispatch:
    return BENCH


def main(argv: list[str] | None = None) -> int:
    return BENCH.main(argv)


if __name__ == "__main__":
    sys.exit(main())
