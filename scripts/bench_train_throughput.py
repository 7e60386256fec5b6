"""Training throughput (tokens/s) of a recipe, launched the way users launch it
(bench.train_launch).

    python scripts/bench_train_throughput.py --dataset-dir /tmp/prepared            # tiny-cpu, 2 procs
    python scripts/bench_train_throughput.py --config configs/train/qwen2.5-0.5b-instruct.yaml \
        --nproc 1 --dataset-dir prepared --steps 30 --overrides deepspeed=
"""

from __future__ import annotations

import dataclasses
import json
import sys

from bench import train_launch
from bench.options import options_parser, settings_from_args
from bench.train_launch import LaunchSettings, measure_launch


def build_parser():
    return options_parser(LaunchSettings, __doc__ + "\n" + train_launch.__doc__)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    report = measure_launch(settings_from_args(LaunchSettings, args))
    print(json.dumps(dataclasses.asdict(report), indent=2))
    if args.json_out:
        args.json_out.write_text(json.dumps(dataclasses.asdict(report), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
