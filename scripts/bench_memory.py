#!/usr/bin/env python
"""Host memory of a real `fincheck train` run, step by step (bench.memory).

Examples:
  # the demo recipe, 50 steps at a fixed shape (2 x 384 tokens), release on (the default)
  python scripts/bench_memory.py --dataset-dir runs/demo/prepared --steps 50
  # the same run as before the fix: freed memory stays in the process
  python scripts/bench_memory.py --dataset-dir runs/demo/prepared --steps 50 --keep-host-memory
"""

from __future__ import annotations

import sys

from bench import memory
from bench.memory import MemorySettings, format_memory_report, run_memory_bench
from bench.options import Bench

BENCH = Bench(
    MemorySettings, memory.__doc__, run_memory_bench, lambda r: (format_memory_report(r), True)
)


def build_parser():
    return BENCH.parser(__doc__)


def main(argv: list[str] | None = None) -> int:
    return BENCH.main("bench_memory.py", __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
