"""Recompute a scored run's QASem and FHSumBench figures with scikit-learn, independently of
fincheck.eval (own parsing, sklearn metrics), and compare with RUN/results.json.

    python scripts/crosscheck_scores.py --data prepared --run runs/tiny

Exit status 1 when a figure differs by more than 1e-9. FINAL is not recomputed: its figures
depend on the judge's matchings (see RUN/scored/final.jsonl).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from sklearn.metrics import balanced_accuracy_score, precision_score, recall_score, roc_auc_score


def read_jsonl(path: Path) -> list[dict]:
    return [
        json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
    ]


def qasem_rows(data: Path, run: Path) -> dict[str, tuple[list[bool], list[float]]]:
    gold = {r["id"]: r for r in read_jsonl(data / "qasem" / "test.jsonl")}
    groups: dict[str, tuple[list[bool], list[float]]] = {}
    for pred in read_jsonl(run / "predictions" / "qasem.jsonl"):
        pair = gold[pred["id"]]
        supported = pair["messages"][-1]["content"].strip() == "Yes"
        if pred.get("p_yes") is not None:
            score = pred["p_yes"]
        else:
            word = re.match(r"\W*(yes|no)\b", pred["output"], re.IGNORECASE)
            score = (word.group(1).lower() == "yes") if word else (not supported)
        for name in (pair["meta"].get("dataset", "unknown"), "overall"):
            y, s = groups.setdefault(name, ([], []))
            y.append(supported)
            s.append(float(score))
    return groups


def fhsumbench_labels(data: Path, run: Path) -> tuple[list[int], list[int]]:
    """0 factual, 1 non-factual, 2 no hallucination, -1 invalid: the reference scorer's codes."""
    codes = {"factual_hallu": 0, "non_factual_hallu": 1, "no_hallu": 2}
    gold = {r["id"]: r for r in read_jsonl(data / "fhsumbench" / "test.jsonl")}
    y_true, y_pred = [], []
    for pred in read_jsonl(run / "predictions" / "fhsumbench.jsonl"):
        y_true.append(codes[gold[pred["id"]]["meta"]["label"]])
        text = pred["output"].replace("`", "").replace("json", "")
        text = text.replace("True", "true").replace("False", "false")
        found = re.search(r"\{.*?\}", text, re.DOTALL)
        code = -1
        try:
            obj = {k.lower(): v for k, v in json.loads(found.group(0)).items()} if found else {}
            faithful, factual = obj["faithfulness"], obj["factuality"]
            if isinstance(faithful, bool) and isinstance(factual, bool):
                code = {(False, True): 0, (False, False): 1, (True, True): 2}.get(
                    (faithful, factual), -1
                )
        except (json.JSONDecodeError, KeyError, AttributeError):
            pass
        y_pred.append(code)
    return y_true, y_pred


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, required=True, help="prepared data directory")
    parser.add_argument("--run", type=Path, required=True, help="run directory with results.json")
    args = parser.parse_args()
    results = json.loads((args.run / "results.json").read_text())["tasks"]
    checks: list[tuple[str, float, float]] = []
    if "qasem" in results:
        for name, (y, s) in qasem_rows(args.data, args.run).items():
            ours = results["qasem"][name]
            if len(set(y)) == 2:
                checks.append((f"qasem/{name}/auc", roc_auc_score(y, s), ours["auc"]))
            checks.append(
                (
                    f"qasem/{name}/bacc",
                    balanced_accuracy_score(y, [v >= 0.5 for v in s]),
                    ours["bacc"],
                )
            )
    if "fhsumbench" in results:
        y_true, y_pred = fhsumbench_labels(args.data, args.run)
        p = precision_score(y_true, y_pred, average="macro", zero_division=0)
        r = recall_score(y_true, y_pred, average="macro", zero_division=0)
        ours = results["fhsumbench"]
        checks += [
            ("fhsumbench/precision", p, ours["precision"]),
            ("fhsumbench/recall", r, ours["recall"]),
            ("fhsumbench/f", 2 * p * r / (p + r) if p + r else 0.0, ours["f"]),
        ]
    bad = 0
    for name, theirs, ours in checks:
        ok = ours is not None and abs(theirs - ours) <= 1e-9
        bad += not ok
        print(f"{'ok  ' if ok else 'DIFF'} {name:32s} sklearn {theirs:.6f}  fincheck {ours}")
    print(f"{len(checks) - bad}/{len(checks)} figures agree")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
