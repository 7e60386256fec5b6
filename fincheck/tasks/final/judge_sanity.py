"""How far to trust a FINAL judge: its verdicts on a small set of description pairs written from
the matching criteria (FINAL paper, E.4): the same fact of the summary, whatever the reason given
or the wording, is a match; another fact, a vague description, an omission is not; a prediction
matches at most one gold description, and two predictions may match the same one.

`judge_sanity.jsonl` holds one summary per line with its predicted and gold descriptions and the
expected matching (predicted letter -> gold letter or null). Agreement is over predicted
descriptions: the share whose verdict is the expected one. A judge that fails to answer an item
(an error, unreadable JSON) counts as disagreeing on its descriptions, and is counted apart.

A set of real items matched by hand has the same shape (`fincheck score --judge-check PATH`).
Against it the judge's matches are also counted as the FINAL paper counts its judge against
human matching: match precision, the share of the judge's (predicted, gold) pairs that the hand
matching has too, and match recall, the share of the hand matching's pairs the judge found.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fincheck.errors import FincheckError
from fincheck.io.checksums import sha256_file
from fincheck.io.jsonl import iter_json_objects

SANITY_SET = Path(__file__).with_name("judge_sanity.jsonl")
UNFILLED = "?"  # a worksheet's verdict not yet given by hand (scripts/final_hand_match_sheet.py)


def read_sanity_set(path: Path = SANITY_SET) -> list[dict[str, Any]]:
    """The items of a judge-check set, each checked: a summary, predicted and gold lists, and
    an expected matching with one entry per predicted letter (a gold letter or null)."""
    from fincheck.tasks.final.lettering import letters

    if not Path(path).exists():  # (a FIFO there is refused by the reader, as such)
        raise FincheckError(f"judge check set not found: {path}")
    items = []
    for number, item in iter_json_objects(path):  # the one reader: bounded, text checked once
        for key, kind in (
            ("summary", str),
            ("predicted", list),
            ("gold", list),
            ("expected", dict),
        ):
            if not isinstance(item.get(key) if isinstance(item, dict) else None, kind):
                raise FincheckError(f"{path}:{number}: {key}: expected a {kind.__name__}")
        pred, gold = letters(len(item["predicted"])), letters(len(item["gold"]))
        unfilled = [k for k, v in item["expected"].items() if v == UNFILLED]
        if unfilled:
            raise FincheckError(
                f"{path}:{number}: expected: {', '.join(unfilled)} not matched by hand yet "
                f"({UNFILLED!r}): fill in a gold letter or null"
            )
        bad = sorted(set(item["expected"]) ^ set(pred)) or [
            v for v in item["expected"].values() if v is not None and v not in gold
        ]
        if bad:
            raise FincheckError(
                f"{path}:{number}: expected: one entry per predicted letter ({', '.join(pred)}), "
                f"each a gold letter ({', '.join(gold) or 'none'}) or null; not {bad}"
            )
        items.append(item)
    return items


def judge_agreement(judge: Any, concurrency: int = 8, path: Path | None = None) -> dict[str, Any]:
    """`judge.match_many` (a `fincheck.tasks.final.judge.MatchingJudge`) on every item of the set
    at `path` (default: the built-in sanity set), `concurrency` calls in flight (a local judge
    batches them): {set, items, n, agreed, agreement, failed, matches_expected, matches_found,
    match_precision, match_recall}."""
    items = read_sanity_set(path or SANITY_SET)
    n = sum(len(item["expected"]) for item in items)
    expected_matches = sum(v is not None for i in items for v in i["expected"].values())
    requests = [(item["summary"], item["predicted"], item["gold"]) for item in items]
    try:
        results = judge.match_many(requests, concurrency=concurrency, progress=False)
    except FincheckError as e:  # the endpoint stopped answering: the figures stand
        print(f"judge sanity set: stopped ({e})")
        results = []
    agreed = found = both = 0
    failed = n - sum(len(item["expected"]) for item in items[: len(results)])
    for item, result in zip(items, results, strict=False):
        for letter, expected in item["expected"].items():
            if result.status != "ok":
                failed += 1
                continue
            verdict = result.matching.get(letter)
            agreed += verdict == expected
            found += verdict is not None
            both += verdict is not None and verdict == expected
    return {
        "set": Path(path).name if path else "built-in sanity set",
        "set_sha256": sha256_file(Path(path)) if path else None,  # the sheet is edited by hand
        "items": len(items),
        # the judge's (predicted, gold) pairs that the expected matching has, and the other way
        "match_precision": both / found if found else None,
        "match_recall": both / expected_matches if expected_matches else None,
        "n": n,
        "agreed": agreed,
        "agreement": agreed / n if n else None,
        "failed": failed,
        "matches_expected": expected_matches,
        "matches_found": found,
    }
