#!/usr/bin/env python
"""LoRA SFT training speed: a recipe's levers on its own packs, interleaved (bench.train_levers):
precision, LoRA in the last layers only, threads, torch.compile, pack size, logits everywhere;
tokens/s and what each trains (per-token losses and gradients against the first variant):
  # the CPU measurement of docs/performance.md (real Qwen2.5-Coder-0.5B weights)
  python scripts/bench_train.py --recipe configs/train/qwen2.5-0.5b-cpu.yaml \\
      --set dataset_dir=runs/prepared --variants fp32,bf16,bf16+last12 --packs 5 \\
      --json-out levers.json

How the layouts compare on a GPU (unpacked, tree-packed, FlexAttention, packs per micro-batch)
is measured through `fincheck train` itself: scripts/gpu_check.py.
"""

from __future__ import annotations

import sys

from bench import train_levers
from bench.options import Bench

BENCH = Bench(
    train_levers.LeverSettings,
    train_levers.__doc__,
    train_levers.run_train_levers,
    lambda r: (train_levers.format_levers_report(r), all(x.status == "ok" for x in r.results)),
)


def build_parser():
    return BENCH.parser(__doc__)


def main(argv: list[str] | None = None) -> int:
    return BENCH.main("bench_train.py", __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
