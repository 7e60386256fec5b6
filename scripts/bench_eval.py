#!/usr/bin/env python
"""Evaluation speed, two ways, picked by --model.

A real model (a `fincheck models` name, a folder or a hub id): the eval path itself
(fincheck.bench.eval_paths), naive vs batched vs prefix-reuse on the same examples, with the
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
generation speed of that shape (fincheck.bench.eval_speed):
  # the GPU goal (eval prefill >= 50k prompt tokens/s on one H100):
  python scripts/bench_eval.py --model qwen2.5-1.5b --prepared-dir /data/prepared \\
      --limit 256 --batch-size 32 --json-out bench-eval-h100.json
  # CPU smoke run (seconds): the tiny config, what CI runs
  python scripts/bench_eval.py --model tiny --limit 4 --batch-size 2 --max-input 128
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fincheck.bench import eval_paths, eval_speed
from fincheck.bench.eval_paths import EvalPathSettings, format_paths_report, run_eval_paths
from fincheck.bench.eval_speed import EvalBenchSettings, format_eval_report, run_eval_bench
from fincheck.bench.options import options_parser, settings_from_args
from fincheck.bench.workload import model_config_path
from fincheck.errors import FincheckError


def is_architecture(model: str) -> bool:
    try:
        model_config_path(model)
    except FincheckError:
        return False
    return True


def model_of(argv: list[str]) -> str:
    probe = argparse.ArgumentParser(add_help=False)
    probe.add_argument("--model", default=EvalBenchSettings.model)
    return probe.parse_known_args(argv)[0].model


def parser_for(model: str) -> argparse.ArgumentParser:
    if is_architecture(model):
        return options_parser(EvalBenchSettings, __doc__ + "\n" + eval_speed.__doc__)
    return options_parser(EvalPathSettings, __doc__ + "\n" + eval_paths.__doc__)


class ModelDispatchParser:
    """The options of the benchmark that --model selects (an architecture or a real model)."""

    def parse_args(self, argv: list[str] | None = None) -> argparse.Namespace:
        argv = sys.argv[1:] if argv is None else argv
        return parser_for(model_of(argv)).parse_args(argv)


def build_parser() -> ModelDispatchParser:
    return ModelDispatchParser()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    architecture = is_architecture(model_of(argv))
    args = build_parser().parse_args(argv)
    try:
        if architecture:
            report = run_eval_bench(settings_from_args(EvalBenchSettings, args))
            text = format_eval_report(report)
        else:
            report = run_eval_paths(settings_from_args(EvalPathSettings, args))
            text = format_paths_report(report)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    print("\n" + text)
    if args.json_out:
        command = " ".join(["bench_eval.py", *argv])
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(report.to_json(command), indent=2) + "\n")
        print(f"wrote {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
