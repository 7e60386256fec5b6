#!/usr/bin/env python
"""Token lengths of the prepared pairs through a real tokenizer and its chat template: p50, p90,
p99 and max per task and split, and the share of pairs over given lengths. It is how a recipe's
max_length is chosen (docs/training.md).

Examples:
  python scripts/token_lengths.py --prepared-dir prepared --tokenizer smollm2-135m-instruct
  python scripts/token_lengths.py --prepared-dir prepared --tokenizer qwen3-tokenizer \\
      --chat-template-kwargs '{"enable_thinking": false}' --over 1024,2048
  python scripts/token_lengths.py --prepared-dir prepared --tokenizer llama-3.2-tokenizer \\
      --chat-template train/assets/llama-3.2-instruct.jinja
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.workload import percentiles, prepared_lengths
from fincheck.data.pairs import SPLITS


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--prepared-dir", type=Path, required=True, help="a `fincheck prepare` output")
    p.add_argument("--tokenizer", required=True, help="folder, hub id or a `fincheck models` name")
    p.add_argument("--chat-template", type=Path, help="a .jinja file replacing the tokenizer's")
    p.add_argument("--chat-template-kwargs", type=json.loads, default={}, help="JSON object")
    p.add_argument("--over", default="1024,1536,2048", help="lengths to count pairs over")
    return p


def main(argv: list[str] | None = None) -> int:
    from transformers import AutoTokenizer

    from fincheck.models.loading import resolve_model

    args = build_parser().parse_args(argv)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(args.tokenizer))
    if args.chat_template:
        tokenizer.chat_template = args.chat_template.read_text()
    over = [int(n) for n in args.over.split(",")]
    print(
        f"| task | split | pairs | p50 | p90 | p99 | max | {' | '.join(f'> {n}' for n in over)} |"
    )
    print("| --- " * (7 + len(over)) + "|")
    for split in SPLITS:
        lengths = prepared_lengths(args.prepared_dir, split, tokenizer=tokenizer,
                                   template_kwargs=args.chat_template_kwargs)  # fmt: skip
        for task, values in lengths.items():
            if not values:
                continue
            shares = " | ".join(
                f"{100 * sum(v > n for v in values) / len(values):.1f}%" for n in over
            )
            print(
                f"| {task} | {split} | {len(values)} | {' | '.join(map(str, percentiles(values)))} | {shares} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
