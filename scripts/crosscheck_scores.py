"""Recompute a scored run's QASem and FHSumBench figures with scikit-learn, independently of
fincheck's metric code, and compare with RUN/results.json. QASem outputs are read by this
script's own Yes/No rule; FHSumBench outputs by the reference scorer's semantics
(`fincheck.tasks.fhsumbench.reference`, checked against the reference on its own), so what is
cross-checked is the arithmetic: the macro averages over gold ∪ predicted labels and F.

    python scripts/crosscheck_scores.py --data prepared --run runs/tiny   # needs pip install -e ".[dev]"

Exit status 1 when a figure differs by more than 1e-9. FINAL is not recomputed: its figures
depend on the judge's matchings (see RUN/scored/final.jsonl).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from sklearn.metrics import (
    accuracy_score,
    balanced_accuracy_score,
    precision_score,
    recall_score,
    roc_auc_score,
)

from fincheck.io.jsonl import iter_json_objects
from fincheck.tasks.fhsumbench.reference import reference_judgement


def qasem_rows(data: Path, predictions: Path) -> dict[str, tuple[list[bool], list[float]]]:
    gold = {r["id"]: r for _, r in iter_json_objects(data / "qasem" / "test.jsonl")}
    groups: dict[str, tuple[list[bool], list[float]]] = {}
    for _, pred in iter_json_objects(predictions / "qasem.jsonl"):
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


def fhsumbench_labels(data: Path, predictions: Path) -> tuple[list[int], list[int]]:
    """0 factual, 1 non-factual, 2 no hallucination, -1 invalid: the reference scorer's codes."""
    codes = {"factual_hallu": 0, "non_factual_hallu": 1, "no_hallu": 2}
    gold = {r["id"]: r for _, r in iter_json_objects(data / "fhsumbench" / "test.jsonl")}
    y_true, y_pred = [], []
    for _, pred in iter_json_objects(predictions / "fhsumbench.jsonl"):
        y_true.append(codes[gold[pred["id"]]["meta"]["label"]])
        judgement, _ = reference_judgement(pred["output"])
        y_pred.append({(False, True): 0, (False, False): 1, (True, True): 2}.get(judgement, -1))
    return y_true, y_pred


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, required=True, help="prepared data directory")
    parser.add_argument(
        "--run", type=Path, required=True, help="a `fincheck score --out` folder (results.json)"
    )
    parser.add_argument(
        "--predictions",
        type=Path,
        help="the predictions folder that was scored (default: the one results.json names)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not (args.run / "results.json").is_file():
        raise SystemExit(f"{args.run}: no results.json; --run is a `fincheck score --out` folder")
    scored = json.loads((args.run / "results.json").read_text())
    results = scored["tasks"]
    predictions = args.predictions or Path(
        scored["run"].get("predictions_dir") or args.run / "predictions"
    )
    for task in ("qasem", "fhsumbench"):
        if task in results and not (predictions / f"{task}.jsonl").is_file():
            raise SystemExit(f"{predictions / task}.jsonl not found: pass --predictions DIR")
    checks: list[tuple[str, float, float]] = []
    if "qasem" in results:
        for name, (y, s) in qasem_rows(args.data, predictions).items():
            ours = results["qasem"][name]
            if len(set(y)) == 2:
                checks.append((f"qasem/{name}/auc", roc_auc_score(y, s), ours["auc"]))
            bacc = balanced_accuracy_score(y, [v >= 0.5 for v in s])
            checks.append((f"qasem/{name}/bacc", bacc, ours["bacc"]))
    if "fhsumbench" in results:
        y_true, y_pred = fhsumbench_labels(args.data, predictions)
        p = precision_score(y_true, y_pred, average="macro", zero_division=0)
        r = recall_score(y_true, y_pred, average="macro", zero_division=0)
        ours = results["fhsumbench"]
        checks += [
            ("fhsumbench/precision", p, ours["precision"]),
            ("fhsumbench/recall", r, ours["recall"]),
            ("fhsumbench/f", 2 * p * r / (p + r) if p + r else 0.0, ours["f"]),
            ("fhsumbench/accuracy", accuracy_score(y_true, y_pred), ours["accuracy"]),
        ]
        for code, name in ((0, "fh_acc"), (1, "nfh_acc"), (2, "noh_acc")):
            rows = [(t, q) for t, q in zip(y_true, y_pred, strict=True) if t == code]
            if rows:  # the reference: accuracy_score over the rows of that gold class
                value = accuracy_score([t for t, _ in rows], [q for _, q in rows])
                checks.append((f"fhsumbench/{name}", value, ours[name]))
    bad = 0
    for name, theirs, ours in checks:
        ok = ours is not None and abs(theirs - ours) <= 1e-9
        bad += not ok
        print(f"{'ok  ' if ok else 'DIFF'} {name:32s} sklearn {theirs:.6f}  fincheck {ours}")
    print(f"{len(checks) - bad}/{len(checks)} figures agree")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
