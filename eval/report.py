"""report.md: what was run, our figures with 95% CIs beside the papers', plots, failure counts,
and a few example outputs per task. Readable on its own.

The sections come from the task registry: each task writes its own table (`Task.report_section`)
and says when its figures compare with the papers' (`Task.comparability`).
"""

from __future__ import annotations

from pathlib import Path

from fincheck.metrics.bootstrap import MIN_ITEMS_FOR_CI
from fincheck.tasks import all_tasks
from fincheck.tasks.base import Task


def render_report(
    results: dict, plots: dict[str, list[str]], examples: dict[str, list[dict]]
) -> str:
    run = results["run"]
    lines = ["# fincheck evaluation report", "", "## What was run", ""]
    for key in (
        "model",
        "base",
        "adapter",
        "method",
        "method_source",
        "backend",
        "llm_calls_per_example",
        "split",
        "data_dir",
        "data_fingerprint",
        "predictions_dir",
        "created",
    ):
        if run.get(key) is not None:
            lines.append(f"- **{key}**: `{run[key]}`")
    if run.get("overlap_weight"):
        lines.append(
            f"- **overlap_weight**: `{run['overlap_weight']}` (QASem's figures are the combined "
            "system's: sigmoid(logit P(Yes) + W (word overlap - 1/2)), not the detector's alone)"
        )
    if run.get("prompts_trimmed"):
        trimmed = ", ".join(f"{t} {n}" for t, n in run["prompts_trimmed"].items())
        lines.append(
            f"- **prompts with a trimmed grounding text** (too long for the model): {trimmed}"
        )
    if run.get("prompt_hashes"):
        hashes = ", ".join(f"{t} `{h}`" for t, h in run["prompt_hashes"].items())
        lines.append(f"- **prompt hashes**: {hashes}")
    resampled = run.get("resampled") or {}
    units = ", ".join(f"{t}: whole {u}s" for t, u in resampled.items()) or "examples one by one"
    lines.append(
        f"- **confidence intervals**: 95% percentile bootstrap, resampling {units}; "
        f"{run.get('bootstrap_resamples')} resamples; none below {MIN_ITEMS_FOR_CI} examples "
        "or units"
    )
    lines.append("")
    scored = [task for name, task in all_tasks().items() if name in results["tasks"]]
    for task in scored:
        counts = results["counts"][task.name]
        lines += [f"## {task.name}", ""]
        missing = f" ({counts['n_missing']} without a prediction)" if counts["n_missing"] else ""
        lines += [
            f"{counts['n_scored']} examples scored of {counts['n_gold']} in the gold split{missing}.",
            "",
        ]
        lines += task.report_section(results["tasks"][task.name])
        for plot in plots.get(task.name, []):
            lines += [f"![{Path(plot).stem}]({plot})", ""]
        lines += _examples(task, examples.get(task.name, []))
    lines += ["## Comparability", ""]
    lines += [f"- {task.title}: {task.comparability}" for task in scored if task.comparability]
    lines.append("")
    return "\n".join(lines)


def _examples(task: Task, examples: list[dict], n: int = 3) -> list[str]:
    """A few outputs, errors first (what a reader wants to look at)."""
    if not examples:
        return []
    wrong = [ex for ex in examples if not task.is_right(ex)]
    right = [ex for ex in examples if task.is_right(ex)]
    chosen = wrong[: n - 1] + right[:1]
    chosen += [ex for ex in examples if ex not in chosen][: n - len(chosen)]
    out = ["<details><summary>Example outputs</summary>", ""]
    for ex in chosen:
        verdict = "right" if task.is_right(ex) else "wrong"
        out.append(
            f"- `{ex['id']}` ({verdict}) gold: `{_clip(str(ex.get('gold')))}` → output: "
            f"`{_clip(ex['output'])}`"
        )
    out += ["", "</details>", ""]
    return out


def _clip(text: str, limit: int = 200) -> str:
    text = text.replace("\n", " ⏎ ").replace("`", "'")
    return text if len(text) <= limit else text[: limit - 1] + "…"
