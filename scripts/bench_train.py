#!/usr/bin/env python
"""LoRA SFT training speed, three ways: a recipe's levers (--recipe), or picked by --model.

A training recipe (--recipe): its levers on its own packs, interleaved (bench.train_levers):
precision, LoRA in the last layers only, threads, torch.compile, pack size, logits everywhere;
tokens/s and what each trains (per-token losses and gradients against the first variant):
  # the CPU measurement of docs/performance.md (real Qwen2.5-Coder-0.5B weights)
  python scripts/bench_train.py --recipe configs/train/qwen2.5-0.5b-cpu.yaml \\
      --variants fp32,bf16-autocast,bf16,bf16+last12 --packs 4 --json-out levers.json

A real model (a `fincheck models` name, a folder, or 'tiny-random'), or an architecture with
--layouts: the ways to lay the same prepared pairs out (bench.train_layouts), unpacked
vs padding-free vs tree-packed (on a GPU also FlexAttention, one and several packs per
micro-batch), pairs/s and tokens run, with a loss check that they train the same thing:
  # the CPU measurement of docs/performance.md (SmolLM2-135M, QASem and FHSumBench)
  python scripts/bench_train.py --model smollm2-135m-instruct --prepared-dir prepared \\
      --tasks qasem,fhsumbench --pairs 56 --max-length 1024 --json-out bench-layouts.json
  # seconds: the tiny random-init test model (with weights), what the tests run
  python scripts/bench_train.py --model tiny-random --prepared-dir prepared --pairs 8 --max-length 1024
  # on a GPU: random-init Qwen2.5-0.5B weights (an architecture with --layouts) on the real pairs,
  # unpacked vs unpacked-keep vs tree (chunked SDPA) vs tree-flex vs tree-flex-batch, bf16
  python scripts/bench_train.py --model qwen2.5-0.5b --layouts auto --tokenizer \\
      qwen2.5-coder-0.5b-instruct --prepared-dir prepared --pairs 120 --max-length 2048 \\
      --tree-max-tokens 8192 --batch-size 8 --json-out docs/bench/gpu-layouts-qwen2.5-0.5b.json

An architecture (configs/models/<name>.json, random-init weights: no download), the kernel and
memory variants side by side on batches shaped like the data (bench.train_variants):
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

import sys

from bench import train_layouts, train_levers, train_variants
from bench.options import Bench, ModelDispatch
from bench.train_layouts import (
    TrainLayoutSettings,
    format_layouts_report,
    run_train_layouts,
)
from bench.train_variants import TrainBenchSettings, format_train_report, run_train_bench

BENCH = ModelDispatch(
    "bench_train.py",
    __doc__,
    architecture=Bench(
        TrainBenchSettings,
        train_variants.__doc__,
        run_train_bench,
        lambda r: (format_train_report(r), r.ok),
    ),
    model=Bench(
        TrainLayoutSettings,
        train_layouts.__doc__,
        run_train_layouts,
        lambda r: (format_layouts_report(r), True),
    ),
    recipe=Bench(
        train_levers.LeverSettings,
        train_levers.__doc__,
        train_levers.run_train_levers,
        lambda r: (train_levers.format_levers_report(r), all(x.status == "ok" for x in r.results)),
    ),
)


def build_parser() -> ModelDispatch:
    return BENCH


def main(argv: list[str] | None = None) -> int:
    return BENCH.main(argv)


if __name__ == "__main__":
    sys.exit(main())
