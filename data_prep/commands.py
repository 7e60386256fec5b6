"""`fincheck prepare` subcommand."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from fincheck.config import describe_config

EXAMPLES = """\
examples:
  fincheck prepare --data-dir ../shared/data --out prepared/
  fincheck prepare --config configs/prepare/paper-eval.yaml --out prepared-paper/
  fincheck prepare --out prepared/ --max_pair_tokens=2048 --tokenizer=Qwen/Qwen2.5-1.5B-Instruct
  fincheck prepare --out prepared/ --final_file=FINAL_test.jsonl     # your copy of the FINAL release

Without --data-dir (and without FINCHECK_DATA_DIR) the pinned sources are downloaded once to
~/.cache/fincheck/data ($FINCHECK_CACHE_DIR/data) and checked against their sha256.

output: OUT/<task>/<split>.jsonl (task: final, qasem, fhsumbench; split: train, dev, test) and
OUT/manifest.json (input checksums, config, prompt hashes, counts, contamination report).

recipe keys (YAML via --config, or --key=value):
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    from fincheck.data_prep.prepare import PrepareConfig

    parser = subparsers.add_parser(
        "prepare",
        help="turn the benchmarks into leakage-free instruction pairs",
        description="Turn FINAL/DeFacto, QASemConsistency and FHSumBench into instruction pairs, "
        "split without leakage, and write them with a manifest.",
        epilog=EXAMPLES + describe_config(PrepareConfig),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="local folder laid out like ../shared/data (default: $FINCHECK_DATA_DIR, "
        "else download the pinned files)",
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="output folder for the pairs and manifest"
    )
    parser.add_argument("--config", type=Path, default=None, help="YAML recipe (keys listed below)")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="download cache (default ~/.cache/fincheck/data)",
    )
    parser.add_argument(
        "--skip-invalid", action="store_true", help="skip invalid raw records instead of stopping"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.set_defaults(func=run, accepts_overrides=True)


def run(args: argparse.Namespace) -> int:
    from fincheck.config import load_config, parse_overrides
    from fincheck.data_prep.prepare import PrepareConfig, run_prepare
    from fincheck.sources import default_data_dir

    overrides = parse_overrides(args.overrides)
    if args.skip_invalid:
        overrides["skip_invalid"] = True
    config = load_config(PrepareConfig, args.config, overrides)
    data_dir = args.data_dir or default_data_dir()
    run_prepare(
        config,
        data_dir,
        args.out,
        cache_dir=args.cache_dir,
        progress=not args.no_progress and os.isatty(2),
    )
    return 0
