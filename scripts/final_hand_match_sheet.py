#!/usr/bin/env python
"""A worksheet of FINAL items to match by hand, from scored runs: the items where a judge is
needed (the system listed descriptions and the gold has some), a seeded sample drawn evenly
from each run, one JSON object a line in the shape `fincheck score --judge-check` reads:

    {"id", "system", "summary", "predicted": [...], "gold": [...], "expected": {"A": "?", ...}}

Fill `expected` by hand (predicted letter -> the gold letter about the same piece of
information in the summary, or null); a "?" left anywhere makes --judge-check refuse the
sheet, so an unfinished one is never measured as "no match". Then measure a judge on it:

    python scripts/final_hand_match_sheet.py --data prepared --split dev \
        --scored runs/adapter-dev runs/e2e-dev --names adapter,e2e --n 100 --out sheet.jsonl
    fincheck score ... --judge local --judge-model M --judge-check sheet.jsonl

The summary and the article are printed to the terminal with `--show` for reading while
matching; the sheet itself holds the summary only (what the judge sees).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from fincheck.errors import FincheckError
from fincheck.io.jsonl import iter_json_objects
from fincheck.tasks import all_tasks
from fincheck.tasks.final.judge_sanity import UNFILLED
from fincheck.tasks.final.lettering import lettered, letters
from fincheck.tasks.prepared import read_split


def judged_task() -> str:
    """The task whose figures need a matching judge (FINAL), as `fincheck score` finds it."""
    (task,) = [name for name, t in all_tasks().items() if t.judge_prompts]
    return task


def judged_items(scored: Path) -> list[dict]:
    """The scored records of a run where both lists are non-empty."""
    path = scored / "scored" / f"{judged_task()}.jsonl"
    if not path.is_file():
        raise FincheckError(f"{path}: not found (run `fincheck score` on the run first)")
    return [r for _, r in iter_json_objects(path) if r["predicted"] and r["gold"]]


def build_sheet(
    data: Path, split: str, runs: dict[str, Path], n: int, seed: int
) -> tuple[list[dict], dict]:
    """About n items, an even share from each run (seeded), in a shuffled order so that a
    matcher cannot tell the systems apart by position. A summary may come back under another
    system (another predicted list is another matching); the same list for it comes once."""
    pairs = {p.id: p for p in read_split(data, judged_task(), split)}
    rng = random.Random(seed)
    share = -(-n // len(runs))
    chosen: list[dict] = []
    seen: set[tuple[str, ...]] = set()
    for name, folder in runs.items():
        candidates = [r for r in judged_items(folder) if (r["id"], *r["predicted"]) not in seen]
        rng.shuffle(candidates)
        for record in candidates[:share]:
            seen.add((record["id"], *record["predicted"]))
            chosen.append(
                {
                    "id": record["id"],
                    "system": name,
                    "summary": pairs[record["id"]].meta["summary"],
                    "predicted": record["predicted"],
                    "gold": record["gold"],
                    "expected": dict.fromkeys(letters(len(record["predicted"])), UNFILLED),
                }
            )
    rng.shuffle(chosen)
    return chosen, pairs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, required=True, help="the prepared data folder")
    parser.add_argument("--split", default="dev", help="the split the runs were scored on")
    parser.add_argument(
        "--scored", type=Path, nargs="+", required=True, help="`fincheck score --out` folders"
    )
    parser.add_argument("--names", help="comma-separated system names (default: folder names)")
    parser.add_argument("--n", type=int, default=100, help="items in all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out", type=Path, required=True, help="the worksheet (.jsonl); never overwritten"
    )
    parser.add_argument("--show", action="store_true", help="print each item with its article")
    args = parser.parse_args(argv)
    names = args.names.split(",") if args.names else [p.name for p in args.scored]
    if len(names) != len(args.scored):
        parser.error(f"--names gives {len(names)} names for {len(args.scored)} runs")
    if args.out.exists():
        parser.error(
            f"--out {args.out} exists: choose a new file (a filled sheet is never overwritten)"
        )
    try:
        sheet, pairs = build_sheet(
            args.data, args.split, dict(zip(names, args.scored, strict=True)), args.n, args.seed
        )
    except FincheckError as e:
        print(f"final_hand_match_sheet: error: {e}", file=sys.stderr)
        return 1
    args.out.write_text(
        "".join(json.dumps(item, ensure_ascii=False) + "\n" for item in sheet), encoding="utf-8"
    )
    print(f"{len(sheet)} items -> {args.out}")
    if args.show:
        for item in sheet:
            print(f"\n### {item['id']} ({item['system']})\nARTICLE: {pairs[item['id']].grounding}")
            print(
                f"SUMMARY: {item['summary']}\nGOLD:\n{lettered(item['gold'])}\nPREDICTED:\n{lettered(item['predicted'])}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
