#!/usr/bin/env python
"""LoRA SFT training speed, two ways, picked by --model.

A real model (a `fincheck models` name, a folder, or 'tiny-random'): the ways to lay the same
prepared pairs out (fincheck.bench.train_layouts), unpacked vs padding-free vs tree-packed,
pairs/s and tokens run, with a loss check that they train the same thing:
  # the CPU measurement of docs/performance.md (SmolLM2-135M, QASem and FHSumBench)
  python scripts/bench_train.py --model smollm2-135m-instruct --prepared-dir prepared \\
      --tasks qasem,fhsumbench --pairs 56 --max-length 1024 --json-out bench-layouts.json
  # seconds: the tiny random-init test model (with weights), what the tests run
  python scripts/bench_train.py --model tiny-random --prepared-dir prepared --pairs 8 --max-length 1024

An architecture (configs/models/<name>.json, random-init weights: no download), the kernel and
memory variants side by side on batches shaped like the data (fincheck.bench.train_variants):
  # one H100, Qwen2.5-1.5B, sequences up to 2,048 tokens, bf16
  python scripts/bench_train.py --model qwen2.5-1.5b --prepared-dir /data/prepared \\
      --max-len 2048 --batch-size 8 --steps 20 --warmup 5 --json-out bench-train-h100.json
  # the fast variants with more tokens per step
  python scripts/bench_train.py --model qwen2.5-1.5b --prepared-dir /data/prepared \\
      --max-len 2048 --batch-size 16 --variants packed-flash,packed-flex,packed-flash-liger
  # where the time goes in one variant (torch profiler op table + chrome trace)
  python scripts/bench_train.py --model qwen2.5-1.5b --prepared-dir /data/prepared \\
      --max-len 2048 --batch-size 8 --steps 3 --variants packed-flash-liger --profile
  # CPU smoke run (seconds): the tiny config, what CI runs
  python scripts/bench_train.py --model tiny --max-len 256 --batch-size 4 --steps 2 --warmup 1
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fincheck.bench import train_layouts, train_variants
from fincheck.bench.options import options_parser, settings_from_args
from fincheck.bench.train_layouts import (
    TrainLayoutSettings,
    format_layouts_report,
    run_train_layouts,
)
from fincheck.bench.train_variants import TrainBenchSettings, format_train_report, run_train_bench
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
    probe.add_argument("--model", default=TrainBenchSettings.model)
    return probe.parse_known_args(argv)[0].model


def parser_for(model: str) -> argparse.ArgumentParser:
    if is_architecture(model):
        return options_parser(TrainBenchSettings, __doc__ + "\n" + train_variants.__doc__)
    return options_parser(TrainLayoutSettings, __doc__ + "\n" + train_layouts.__doc__)


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
            report = run_train_bench(settings_from_args(TrainBenchSettings, args))
            text, ok = format_train_report(report), report.ok
        else:
            report = run_train_layouts(settings_from_args(TrainLayoutSettings, args))
            text, ok = format_layouts_report(report), True
    except ValueError as e:
        raise SystemExit(str(e)) from None
    print("\n" + text)
    if args.json_out:
        command = " ".join(["bench_train.py", *argv])
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(report.to_json(command), indent=2) + "\n")
        print(f"wrote {args.json_out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
