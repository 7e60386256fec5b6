#!/usr/bin/env python
"""LoRA SFT training speed, every variant side by side in one run (fincheck.bench.train_variants).

Examples:
  # the issue's goal: one H100, Qwen2.5-1.5B, sequences up to 2,048 tokens, bf16
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

import json
import sys

from fincheck.bench import train_variants
from fincheck.bench.options import options_parser, settings_from_args
from fincheck.bench.train_variants import TrainBenchSettings, format_train_report, run_train_bench


def build_parser():
    return options_parser(TrainBenchSettings, __doc__ + "\n" + train_variants.__doc__)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        report = run_train_bench(settings_from_args(TrainBenchSettings, args))
    except ValueError as e:
        raise SystemExit(str(e)) from None
    print("\n" + format_train_report(report))
    if args.json_out:
        command = " ".join(["bench_train.py", *(argv if argv is not None else sys.argv[1:])])
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(report.to_json(command), indent=2) + "\n")
        print(f"wrote {args.json_out}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
