#!/usr/bin/env python
"""Evaluation speed: prefill (prompt tokens/s) and examples/s per task (fincheck.bench.eval_speed).

Examples:
  # the issue's goal (eval prefill >= 50k prompt tokens/s on one H100):
  python scripts/bench_eval.py --model qwen2.5-1.5b --prepared-dir /data/prepared \\
      --limit 256 --batch-size 32 --json-out bench-eval-h100.json
  # full-length outputs as the harness generates them
  python scripts/bench_eval.py --model qwen2.5-1.5b --prepared-dir /data/prepared \\
      --max-new-tokens final=384,qasem=8,fhsumbench=96
  # CPU smoke run (seconds): the tiny config, what CI runs
  python scripts/bench_eval.py --model tiny --limit 4 --batch-size 2 --max-input 128
"""

from __future__ import annotations

import json
import sys

from fincheck.bench import eval_speed
from fincheck.bench.eval_speed import EvalBenchSettings, format_eval_report, run_eval_bench
from fincheck.bench.options import options_parser, settings_from_args


def build_parser():
    return options_parser(EvalBenchSettings, __doc__ + "\n" + eval_speed.__doc__)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        report = run_eval_bench(settings_from_args(EvalBenchSettings, args))
    except ValueError as e:
        raise SystemExit(str(e)) from None
    print("\n" + format_eval_report(report))
    if args.json_out:
        command = " ".join(["bench_eval.py", *(argv if argv is not None else sys.argv[1:])])
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(report.to_json(command), indent=2) + "\n")
        print(f"wrote {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
