"""`fincheck prepare` subcommand."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from fincheck.io.config import REQUIRED, add_options, config_field, describe_config, read_options

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


@dataclass
class PrepareCommand:
    """The command's own flags; the recipe's keys (`PrepareConfig`) come from --config and
    `--key=value`."""

    out: Path = config_field(REQUIRED, "output folder for the pairs and manifest")
    data_dir: Path | None = config_field(
        None,
        "local folder laid out like ../shared/data (default: $FINCHECK_DATA_DIR, else download "
        "the pinned files)",
    )
    config: Path | None = config_field(None, "YAML recipe (keys listed below)")
    cache_dir: Path | None = config_field(None, "download cache (default: ~/.cache/fincheck/data)")
    skip_invalid: bool = config_field(False, "skip invalid raw records instead of stopping")
    progress: bool = config_field(True, "no progress bars")


def register(subparsers: argparse._SubParsersAction) -> None:
    from fincheck.data_prep.prepare import PrepareConfig

    parser = subparsers.add_parser(
        "prepare",
        help="turn the benchmarks into leakage-free instruction pairs",
        description="Turn FINAL/DeFacto, QASemConsistency and FHSumBench into instruction pairs, "
        "split without leakage, and write them with a manifest.",
        epilog=EXAMPLES + describe_config(PrepareConfig),
    )
    add_options(parser, PrepareCommand)
    parser.set_defaults(func=run, accepts_overrides=True, options=PrepareCommand)


def run(args: argparse.Namespace) -> int:
    from fincheck.data_prep.prepare import PrepareConfig, run_prepare
    from fincheck.io.config import load_config, parse_overrides
    from fincheck.io.sources import default_data_dir

    command = read_options(PrepareCommand, args)
    overrides = parse_overrides(args.overrides)
    if command.skip_invalid:
        overrides["skip_invalid"] = True
    config = load_config(PrepareConfig, command.config, overrides)
    run_prepare(
        config,
        command.data_dir or default_data_dir(),
        command.out,
        cache_dir=command.cache_dir,
        progress=command.progress and os.isatty(2),
    )
    return 0
