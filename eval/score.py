"""`fincheck score`: predictions + prepared gold -> results.json, report.md, plots, scored examples.

Stages: read the gold split of each task that has a predictions file, join by id (unknown or
duplicate id = error with file:line; missing ids reported), score each task, write outputs.
A FINAL judge failure is recorded per example and makes the command exit non-zero.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

from fincheck.errors import FincheckError
from fincheck.eval import plots
from fincheck.eval.classification import roc_curve
from fincheck.eval.judge import MatchingJudge
from fincheck.eval.predictions import join_with_gold, read_predictions
from fincheck.eval.report import render_report
from fincheck.eval.scoring import (
    TaskScore,
    score_fhsumbench_task,
    score_final_task,
    score_qasem_task,
)
from fincheck.pairs import TASKS, read_pairs


@dataclass
class ScoreOptions:
    data_dir: Path
    predictions_dir: Path
    out_dir: Path
    split: str = "test"
    tasks: tuple[str, ...] | None = None  # None = every task with a predictions file
    judge: MatchingJudge | None = None
    judge_concurrency: int = 8
    bootstrap_resamples: int = 1000
    seed: int = 0
    progress: bool = True


def run_score(opts: ScoreOptions) -> tuple[dict, int]:
    """Score, write outputs; returns (results, number of judge errors)."""
    tasks = opts.tasks or tuple(t for t in TASKS if (opts.predictions_dir / f"{t}.jsonl").exists())
    if not tasks:
        raise FincheckError(
            f"no predictions found in {opts.predictions_dir}: expected <task>.jsonl for a task in "
            f"{TASKS} (see docs/evaluation.md for the format)"
        )
    results: dict = {"run": _run_info(opts), "tasks": {}, "counts": {}}
    examples: dict[str, list[dict]] = {}
    plot_paths: dict[str, list[str]] = {}
    judge_errors = 0
    for task in tasks:
        gold_path = opts.data_dir / task / f"{opts.split}.jsonl"
        pred_path = opts.predictions_dir / f"{task}.jsonl"
        for path, what in ((gold_path, "gold split"), (pred_path, "predictions file")):
            if not path.exists():
                raise FincheckError(f"{task}: {what} {path} not found")
        gold = list(read_pairs(gold_path))
        joined, missing = join_with_gold(
            gold, read_predictions(pred_path, task), pred_path, gold_path
        )
        if not joined:
            raise FincheckError(f"{task}: {pred_path} holds no predictions")
        score = _score_task(task, joined, opts)
        judge_errors += score.judge_errors
        results["tasks"][task] = score.figures
        results["counts"][task] = {
            "n_gold": len(gold),
            "n_scored": len(joined),
            "n_missing": len(missing),
            "missing_ids_sample": missing[:20],
        }
        examples[task] = score.examples
        _write_jsonl(opts.out_dir / "scored" / f"{task}.jsonl", score.examples)
        plot_paths[task] = _plots(task, score, opts.out_dir)
    if opts.judge is not None:
        results["judge"] = {
            **opts.judge.client.identity,
            "prompt_version": opts.judge.prompt.version,
            "cache_hits": opts.judge.cache.hits,
            "cache_misses": opts.judge.cache.misses,
            "errors": judge_errors,
        }
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    (opts.out_dir / "results.json").write_text(
        json.dumps(_json_safe(results), indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    (opts.out_dir / "report.md").write_text(
        render_report(results, plot_paths, examples), encoding="utf-8"
    )
    return results, judge_errors


def _score_task(task: str, joined, opts: ScoreOptions) -> TaskScore:
    if task == "qasem":
        return score_qasem_task(joined, opts.bootstrap_resamples, opts.seed)
    if task == "fhsumbench":
        return score_fhsumbench_task(joined, opts.bootstrap_resamples, opts.seed)
    return score_final_task(
        joined,
        opts.judge,
        opts.judge_concurrency,
        opts.bootstrap_resamples,
        opts.seed,
        opts.progress,
    )


# task -> (figures key of its confusion matrix, plot title, file name)
CONFUSION_PLOTS = {
    "fhsumbench": ("confusion", "FHSumBench", "fhsumbench_confusion.png"),
    "final": ("binary_confusion", "FINAL (binarized)", "final_binary_confusion.png"),
}


def _plots(task: str, score: TaskScore, out_dir: Path) -> list[str]:
    """Write the task's PNGs; return their paths relative to out_dir (for report.md links)."""
    made: list[Path] = []
    plot_dir = out_dir / "plots"
    f = score.figures
    if task in CONFUSION_PLOTS:
        key, title, filename = CONFUSION_PLOTS[task]
        made.append(
            plots.plot_confusion(f[key]["counts"], f[key]["labels"], title, plot_dir / filename)
        )
    elif task == "qasem":
        curves = {}
        groups: dict[str, list[dict]] = {}
        for ex in score.examples:
            groups.setdefault(ex["subset"], []).append(ex)
        groups["overall"] = score.examples
        for name, group in groups.items():
            gold = [ex["gold"] == "Yes" for ex in group]
            if all(gold) or not any(gold):
                continue
            fpr, tpr = roc_curve(gold, [ex["score"] for ex in group])
            curves[name] = (fpr, tpr, f[name]["auc"])
        if curves:
            made.append(
                plots.plot_roc(
                    curves, "QASem ROC (positive = supported)", plot_dir / "qasem_roc.png"
                )
            )
        gold_all = [ex["gold"] for ex in score.examples]
        pred_all = [ex["predicted"] for ex in score.examples]
        counts = [
            [
                sum(1 for g, p in zip(gold_all, pred_all, strict=True) if g == gv and p == pv)
                for pv in ("Yes", "No")
            ]
            for gv in ("Yes", "No")
        ]
        made.append(
            plots.plot_confusion(
                counts, ["Yes", "No"], "QASem (s >= 0.5)", plot_dir / "qasem_confusion.png"
            )
        )
    return [str(p.relative_to(out_dir)) for p in made]


def _run_info(opts: ScoreOptions) -> dict:
    info: dict = {
        "data_dir": str(opts.data_dir),
        "predictions_dir": str(opts.predictions_dir),
        "split": opts.split,
        "bootstrap_resamples": opts.bootstrap_resamples,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    manifest_path = opts.data_dir / "manifest.json"
    if manifest_path.exists():
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        info["data_fingerprint"] = manifest.get("fingerprint")
        info["prompt_hashes"] = manifest.get("prompt_hashes")
    eval_config = opts.predictions_dir / "eval_config.json"  # written by `fincheck eval`
    if eval_config.exists():
        config = json.loads(eval_config.read_text(encoding="utf-8"))
        info["model"] = config.get("model")
        info["adapter"] = config.get("adapter")
    eval_summary = opts.predictions_dir / "eval_summary.json"
    if eval_summary.exists():
        counts = json.loads(eval_summary.read_text(encoding="utf-8"))
        info["prompts_trimmed"] = {task: c.get("trimmed", 0) for task, c in counts.items()}
    return info


def _write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(_json_safe(record), ensure_ascii=False) + "\n")


def _json_safe(value):
    """NaN (an undefined figure) -> null, so results.json is strict JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value
