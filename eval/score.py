"""`fincheck score`: predictions + prepared gold -> results.json, report.md, plots, scored examples.

Stages: read the gold split of each task that has a predictions file, join by id (unknown or
duplicate id = error with file:line; missing ids reported), score each task, write outputs.
FINAL judge failures are recorded per example; above --max-judge-failure-rate the command exits 3.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

from fincheck.errors import FincheckError
from fincheck.eval.options import ScoreOptions
from fincheck.eval.predictions import (
    eval_state,
    join_with_gold,
    read_eval_config,
    read_eval_summary,
    read_predictions,
)
from fincheck.eval.report import render_report
from fincheck.io.jsonl import record_json
from fincheck.io.safe_files import write_text
from fincheck.io.secrets import redact
from fincheck.tasks import get_task, task_names
from fincheck.tasks.base import ScoreSettings
from fincheck.tasks.prepared import read_manifest, read_split, split_path, split_sha256


def run_score(opts: ScoreOptions) -> tuple[dict, int]:
    """Score, write outputs; returns (results, number of judge errors)."""
    tasks = opts.tasks or tuple(
        t for t in task_names() if (opts.predictions_dir / f"{t}.jsonl").exists()
    )
    if not tasks:
        raise FincheckError(
            f"no predictions found in {opts.predictions_dir}: expected <task>.jsonl for a task in "
            f"{task_names()} (see docs/evaluation.md for the format)"
        )
    # the options scoring reads (all but `unit_keys`, set per task), under the same names
    shared = {f.name: getattr(opts, f.name) for f in fields(ScoreSettings) if f.name != "unit_keys"}
    results: dict = {"run": _run_info(opts), "tasks": {}, "counts": {}}
    # each task's inputs (its split file's sha256), checked against those its predictions were
    # made on: `compare` pairs only runs scored on the same
    results["run"]["split_sha256"] = _checked_inputs(opts, tasks)
    # what the intervals resample whole, per task (its coarsest unit)
    results["run"]["resampled"] = {name: get_task(name).resample_units[0] for name in tasks}
    examples: dict[str, list[dict]] = {}
    plot_paths: dict[str, list[str]] = {}
    judge = {"errors": 0, "parse_failed": 0, "asked": 0, "first_error": None}  # over the tasks
    for name in tasks:
        task = get_task(name)
        gold_path = split_path(opts.data_dir, name, opts.split)
        pred_path = opts.predictions_dir / f"{name}.jsonl"
        for path, what in ((gold_path, "gold split"), (pred_path, "predictions file")):
            if not path.exists():
                raise FincheckError(f"{name}: {what} {path} not found")
        state = eval_state(opts.predictions_dir, name)
        gold = read_split(opts.data_dir, name, opts.split)
        joined, missing = join_with_gold(
            gold, read_predictions(pred_path, name), pred_path, gold_path
        )
        if not joined:
            raise FincheckError(f"{name}: {pred_path} holds no predictions")
        units = {pair.id: task.resample_keys(pair) for pair, _ in joined}
        coarsest = [units[pair.id][task.resample_units[0]] for pair, _ in joined]
        score = task.score(joined, ScoreSettings(**shared, unit_keys=coarsest))
        for example in score.examples:  # what `fincheck compare` resamples whole
            example["units"] = units[example["id"]]
        for key in ("errors", "parse_failed", "asked"):
            judge[key] += getattr(score, f"judge_{key}")
        judge["first_error"] = judge["first_error"] or score.judge_first_error
        results["tasks"][name] = score.figures
        results["counts"][name] = {
            "n_gold": len(gold),
            "n_scored": len(joined),
            "n_missing": len(missing),
            "missing_ids_sample": missing[:20],
            "eval": state,
        }
        if state == "unfinished":
            print(
                f"{name}: its eval did not finish (not listed in eval_summary.json): the "
                f"figures are of the {len(joined)} predictions it holds",
                file=sys.stderr,
            )
        examples[name] = score.examples
        (opts.out_dir / "scored").mkdir(parents=True, exist_ok=True)
        scored = "".join(record_json(example) + "\n" for example in score.examples)
        write_text(opts.out_dir / "scored" / f"{name}.jsonl", scored)
        made = task.plots(score, opts.out_dir / "plots", model_label(results["run"]))
        plot_paths[name] = [str(p.relative_to(opts.out_dir)) for p in made]
    if opts.judge is not None:
        results["judge"] = {
            **opts.judge.identity,
            "cache_hits": opts.judge.cache.hits,
            "cache_misses": opts.judge.cache.misses,
            **judge,
        }
    write_text(
        opts.out_dir / "results.json",
        record_json(results, indent=2) + "\n",
    )
    write_text(opts.out_dir / "report.md", redact(render_report(results, plot_paths, examples)))
    return results, judge["errors"]


def model_label(run: dict) -> str | None:
    """What the plots' titles call the evaluated model: the adapter's run folder name (and its
    base), else the model's name."""
    model, adapter = run.get("base") or run.get("model"), run.get("adapter")
    base = Path(model).name if model else None
    combined = f" + word overlap x{run['overlap_weight']:g}" if run.get("overlap_weight") else ""
    if adapter:
        name = f"{Path(adapter).name} (on {base})" if base else Path(adapter).name
        return name + combined
    return base and base + combined


def _checked_inputs(opts: ScoreOptions, tasks: Sequence[str]) -> dict[str, str | None]:
    """Each task's split file in --data, by sha256, refused in one line when the eval recorded
    another for it (a folder prepared again: trimmed, split anew); predictions from before the
    eval recorded them are checked by the whole folder's fingerprint, with a note."""
    manifest, config = read_manifest(opts.data_dir), read_eval_config(opts.predictions_dir)
    inputs = {task: split_sha256(manifest, task, opts.split) for task in tasks}
    made_on = config.get("split_sha256") or {}
    for task, sha in inputs.items():
        if made_on.get(task) and sha and made_on[task] != sha:
            raise FincheckError(
                f"{opts.predictions_dir}: its {task} predictions were made on inputs "
                f"{made_on[task][:12]}, but {split_path(opts.data_dir, task, opts.split)} is "
                f"{sha[:12]} (prepared again since, or another folder): score them with the "
                "--data they were made on, or run the eval again on this one"
            )
    fingerprint = config.get("data_fingerprint")
    if not made_on and fingerprint and fingerprint != manifest.get("fingerprint"):
        print(
            f"note: {opts.predictions_dir} was made on other prepared data ({fingerprint[:12]}) "
            "and does not record its split files, so they could not be checked against --data",
            file=sys.stderr,
        )
    return inputs


def _run_info(opts: ScoreOptions) -> dict:
    info: dict = {
        "data_dir": str(opts.data_dir),
        "predictions_dir": str(opts.predictions_dir),
        "split": opts.split,
        "bootstrap_resamples": opts.bootstrap_resamples,
        **({"thresholds": opts.thresholds} if opts.thresholds else {}),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    manifest = read_manifest(opts.data_dir)
    if manifest:
        info["data_fingerprint"] = manifest.get("fingerprint")
        info["prompt_hashes"] = manifest.get("prompt_hashes")
    config = read_eval_config(opts.predictions_dir)  # written by `fincheck eval`; else {}
    for key in ("model", "base", "adapter", "adapter_sha256", "chat_template_hash"):
        if config.get(key) is not None:
            info[key] = config[key]
    counts = read_eval_summary(opts.predictions_dir)
    if counts:
        info["prompts_trimmed"] = {task: c.get("trimmed", 0) for task, c in counts.items()}
        calls = {t: c["calls_per_example"] for t, c in counts.items() if "calls_per_example" in c}
        if calls:
            info["llm_calls_per_example"] = calls
    for key in ("method", "method_source", "backend", "client", "served_models"):
        if config.get(key) is not None:
            info[key] = config[key]
    if config.get("overlap_weight"):  # QASem's combined system, named as such
        info["overlap_weight"] = config["overlap_weight"]
    return info
