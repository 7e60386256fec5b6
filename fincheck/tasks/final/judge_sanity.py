"""How far to trust a FINAL judge: its verdicts on a small set of description pairs written from
the matching criteria (FINAL paper, E.4): the same fact of the summary, whatever the reason given
or the wording, is a match; another fact, a vague description, an omission is not; a prediction
matches at most one gold description, and two predictions may match the same one.

`judge_sanity.jsonl` holds one summary per line with its predicted and gold descriptions and the
expected matching (predicted letter -> gold letter or null). Agreement is over predicted
descriptions: the share whose verdict is the expected one. A judge that fails to answer an item
(an error, unreadable JSON) counts as disagreeing on its descriptions, and is counted apart.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fincheck.errors import FincheckError

SANITY_SET = Path(__file__).with_name("judge_sanity.jsonl")


def read_sanity_set(path: Path = SANITY_SET) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def judge_agreement(judge: Any, concurrency: int = 8) -> dict[str, Any]:
    """`judge.match_many` (a `fincheck.tasks.final.judge.MatchingJudge`) on every item, `concurrency`
    calls in flight (a local judge batches them): {n, agreed, agreement, failed,
    matches_expected, matches_found}."""
    items = read_sanity_set()
    n = sum(len(item["expected"]) for item in items)
    expected_matches = sum(v is not None for i in items for v in i["expected"].values())
    requests = [(item["summary"], item["predicted"], item["gold"]) for item in items]
    try:
        results = judge.match_many(requests, concurrency=concurrency, progress=False)
    except FincheckError as e:  # the endpoint stopped answering: the figures stand
        print(f"judge sanity set: stopped ({e})")
        results = []
    agreed = found = 0
    failed = n - sum(len(item["expected"]) for item in items[: len(results)])
    for item, result in zip(items, results, strict=False):
        for letter, expected in item["expected"].items():
            if result.status != "ok":
                failed += 1
                continue
            verdict = result.matching.get(letter)
            agreed += verdict == expected
            found += verdict is not None
    return {
        "n": n,
        "agreed": agreed,
        "agreement": agreed / n if n else None,
        "failed": failed,
        "matches_expected": expected_matches,
        "matches_found": found,
    }
