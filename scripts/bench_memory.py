#!/usr/bin/env python
"""Host memory of a real `fincheck train` run, step by step (fincheck.bench.memory).

Examples:
  # the demo recipe, 50 steps at a fixed shape (2 x 384 tokens), release on (the default)
  python scripts/bench_memory.py --dataset-dir runs/demo/prepared --steps 50
  # the same run as before the fix: freed memory stays in the process
  python scripts/bench_memory.py --dataset-dir runs/demo/prepared --steps 50 --keep-host-memory
"""

from __future__ import annotations

import sys

from fincheck.bench import memory
from fincheck.bench.memory import (
    MemorySettings,
    format_memory_report,
    report_json,
    run_memory_bench,
)
from fincheck.bench.options import options_parser, settings_from_args


def main(argv: list[str] | None = None) -> int:
    args = options_parser(MemorySettings, __doc__ + "\n" + memory.__doc__).parse_args(argv)
    settings = settings_from_args(MemorySettings, args)
    report = run_memory_bench(settings)
    print("\n" + format_memory_report(report))
    if args.json_out:
        command = " ".join(["bench_memory.py", *(argv if argv is not None else sys.argv[1:])])
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(report_json(report, command))
        print(f"wrote {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
