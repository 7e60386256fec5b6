#!/usr/bin/env python
"""LoRA SFT training speed, two ways: a recipe's levers (--recipe), or a model's layouts (--model).

A training recipe (--recipe): its levers on its own packs, interleaved (bench.train_levers):
precision, LoRA in the last layers only, threads, torch.compile, pack size, logits everywhere;
tokens/s and what each trains (per-token losses and gradients against the first variant):
  # the CPU measurement of docs/performance.md (real Qwen2.5-Coder-0.5B weights)
  python scripts/bench_train.py --recipe configs/train/qwen2.5-0.5b-cpu.yaml \\
      --variants fp32,bf16-autocast,bf16,bf16+last12 --packs 4 --json-out levers.json

A model (--model: a `fincheck models` name, a folder, 'tiny-random', or an architecture of
configs/models/ with --layouts, random-init weights of it): the ways to lay the same prepared
pairs out (bench.train_layouts), unpacked vs padding-free vs tree-packed (on a GPU also
FlexAttention, one and several packs per micro-batch), pairs/s and tokens run, with a loss
check that they train the same thing:
  # the CPU measurement of docs/performance.md (SmolLM2-135M, QASem and FHSumBench)
  python scripts/bench_train.py --model smollm2-135m-instruct --prepared-dir prepared \\
      --tasks qasem,fhsumbench --pairs 56 --max-length 1024 --json-out bench-layouts.json
  # on a GPU: random-init Qwen2.5-0.5B weights on the real pairs, bf16 (scripts/gpu_check.py)
  python scripts/bench_train.py --model qwen2.5-0.5b --layouts auto --tokenizer \\
      qwen2.5-coder-0.5b-instruct --prepared-dir prepared --pairs 120 --max-length 2048 \\
      --tree-max-tokens 8192 --batch-size 8 --json-out docs/bench/gpu-layouts-qwen2.5-0.5b.json
"""

from __future__ import annotations

import sys

from bench import train_layouts, train_levers
from bench.options import Bench, RecipeOrModel

BENCH = RecipeOrModel(
    "bench_train.py",
    __doc__,
    recipe=Bench(
        train_levers.LeverSettings,
        train_levers.__doc__,
        train_levers.run_train_levers,
        lambda r: (train_levers.format_levers_report(r), all(x.status == "ok" for x in r.results)),
    ),
    model=Bench(
        train_layouts.TrainLayoutSettings,
        train_layouts.__doc__,
        train_layouts.run_train_layouts,
        lambda r: (train_layouts.format_layouts_report(r), True),
    ),
)


def build_parser() -> RecipeOrModel:
    return BENCH


def main(argv: list[str] | None = None) -> int:
    return BENCH.main(argv)


if __name__ == "__main__":
    sys.exit(main())
