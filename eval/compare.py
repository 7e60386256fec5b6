"""`fincheck compare`: scored runs side by side, per task, with the papers' numbers.

Each run is a `fincheck score` output folder (results.json + scored/<task>.jsonl). For every
task the runs share, the table shows each run's figures with their 95% CIs and n, how many of
its outputs were in no readable form, and, for every run after the first, its difference from
the first run with a **paired** bootstrap CI: the same resampled examples for both runs, so
the interval is that of the difference itself (two overlapping marginal CIs can still hide a
clear difference). A run "beats" the first only when that interval lies above 0.

The bootstrap resamples whole units, not single examples: each task names the units its
examples are drawn in (`Task.resample_units`: QASem's sources or responses, FHSumBench's source
documents, FINAL's documents) and `fincheck score` records each example's (`units`). QASem's
1,556 test QAs ask about 49 sources; resampling QAs one by one treats them as 1,556 independent
draws and gives intervals too narrow. The report names the unit and how many there are.

Figures are comparable with each other when the runs were scored on the same examples (the
table says how many ids they share) and with the papers' rows when the task's comparability
note says so.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fincheck.errors import FincheckError
from fincheck.io.config import REQUIRED, add_options, config_field, read_options
from fincheck.io.jsonl import (
    check_shape,
    iter_json_objects,
    read_json_object,
    read_json_record,
    strict_json,
)
from fincheck.io.messages import library_errors_as_one_line
from fincheck.io.safe_files import one_writer, read_regular_bytes, write_text
from fincheck.metrics.bootstrap import (
    MIN_ITEMS_FOR_CI,
    Interval,
    bootstrap_ci,
    bootstrap_cis,
    ci95_lists,
    groups_by,
)
from fincheck.metrics.figures import fmt
from fincheck.tasks import all_tasks, get_task, per_task_values
from fincheck.tasks.base import Task


def interval(ci: Interval | None) -> str:
    return f" [{fmt(ci.low)}, {fmt(ci.high)}]" if ci else ""


def md(name: str) -> str:
    """A run's name as markdown text: one line, its "|" no table's column."""
    return " ".join(name.split()).replace("|", "\\|")


@dataclass
class ScoredRun:
    name: str
    path: Path
    results: dict
    examples: dict[str, list[dict]] = field(default_factory=dict)  # task -> scored records


def load_scored_run(path: str | Path, name: str | None = None) -> ScoredRun:
    """A `fincheck score --out` folder: results.json and the scored example records."""
    path = Path(path)
    results = read_json_record(path / "results.json", RESULTS_SHAPE)
    if results is None:
        raise FincheckError(f"{path}: no results.json (run `fincheck score --out {path}` first)")
    run = ScoredRun(name or path.name, path, results)
    for task in results.get("tasks", {}):
        scored = path / "scored" / f"{task}.jsonl"
        if scored.is_file():
            run.examples[task] = []
            seen: set = set()
            for line_no, record in iter_json_objects(scored):
                check_shape(record, SCORED_SHAPE, f"{scored}:{line_no}")
                if record["id"] in seen:
                    raise FincheckError(f"{scored}:{line_no}: id {record['id']!r} again")
                seen.add(record["id"])
                run.examples[task].append(record)
            n_scored = results.get("counts", {}).get(task, {}).get("n_scored")
            if n_scored is not None and n_scored != len(seen):
                raise FincheckError(
                    f"{scored}: {len(seen)} scored examples, where results.json counts "
                    f"{n_scored} (the folder was edited): score it again"
                )
    return run


# What compare reads of results.json beside each task's figures
RESULTS_SHAPE = {
    "tasks": {str: dict},
    "counts": {str: {"n_scored": int}},
    "run": {"split_sha256": {str: (str, type(None))}},
}
# What every task's scored record holds for compare to pair and group it (its figures' own
# fields are read by the task: a record of another shape there is one line, `compare_command`)
SCORED_SHAPE = {
    "id": (str, int),
    "units": {str: (str, int, float, type(None))},
    "score": (int, float, type(None)),
}


@dataclass(frozen=True)
class Difference:
    metric: str
    delta: float  # other - first, on the shared ids
    ci95: Interval | None
    n: int  # shared ids
    unit: str = "example"  # what the bootstrap resampled whole
    n_units: int = 0  # how many of them the shared ids fall in

    @property
    def verdict(self) -> str:
        if self.ci95 is None:  # the bootstrap's floor counts the units it resamples
            if self.n_units < MIN_ITEMS_FOR_CI:
                return f"too few shared {self.unit}s to tell"
            return "undefined"
        if self.ci95.low > 0:
            return "better"
        if self.ci95.high < 0:
            return "worse"
        return "no clear difference"


def unit_groups(examples: Sequence[dict], unit: str) -> tuple[str, list[list[int]] | None]:
    """(the unit resampled, the example indices of each of its values): `unit` when every
    scored record names its value (`units`, written by `fincheck score`), else "example" and
    None (records scored before units were recorded, or written by hand)."""
    keys = [(ex.get("units") or {}).get(unit) for ex in examples]
    if not examples or any(k is None for k in keys):
        return "example", None
    return unit, groups_by([str(k) for k in keys])


def paired_difference(
    task: str,
    first: Sequence[dict],
    other: Sequence[dict],
    metric: str,
    n_resamples: int = 1000,
    seed: int = 0,
    unit: str | None = None,
) -> Difference:
    """metric(other) - metric(first) over the examples both runs scored, with a paired
    percentile bootstrap CI: whole `unit`s (default: the task's coarsest) resampled, the same
    ones for both runs; resamples where either figure is undefined are skipped."""
    by_id = {ex["id"]: ex for ex in first}
    shared = [(by_id[ex["id"]], ex) for ex in other if ex["id"] in by_id]
    figures = get_task(task).example_figures

    def delta(rows: Sequence[tuple[dict, dict]]) -> float:
        return figures([r[1] for r in rows])[metric] - figures([r[0] for r in rows])[metric]

    if not shared:
        return Difference(metric, math.nan, None, 0)
    unit = unit or get_task(task).resample_units[0]
    resampled, groups = unit_groups([r[0] for r in shared], unit)
    ci = bootstrap_ci(
        lambda idx: delta([shared[i] for i in idx]), len(shared), n_resamples, seed, groups
    )
    return Difference(metric, delta(shared), ci, len(shared), resampled, len(groups or shared))


def unit_intervals(
    task: Task, examples: Sequence[dict], metrics: list[str], unit: str, n: int, seed: int
) -> tuple[dict, dict[str, list[float] | None]]:
    """({unit, how many}, each metric's 95% interval) of one run's scored examples, whole units
    resampled as the paired differences resample them."""
    resampled, groups = unit_groups(examples, unit)
    figures = task.example_figures
    cis = bootstrap_cis(
        lambda idx: figures([examples[i] for i in idx]), len(examples), metrics, n, seed, groups
    )
    return {"unit": resampled, "n": len(groups or examples)}, ci95_lists(cis)


def shuffle_floor(
    task: str, examples: Sequence[dict], metric: str, n_shuffles: int = 1000, seed: int = 0
) -> tuple[float, Interval] | None:
    """The figure a run would get with its own answers dealt to its examples at random: the
    mean and the middle 95% over `n_shuffles` seeded shuffles of the `predicted` field. Macro
    P/R/F reward any spread of answers over the classes; this is the floor of that spread."""
    import random

    if len(examples) < MIN_ITEMS_FOR_CI:
        return None
    figures = get_task(task).example_figures
    answers = [ex["predicted"] for ex in examples]
    rng = random.Random(seed)
    values = []
    for _ in range(n_shuffles):
        rng.shuffle(answers)
        value = figures([{**ex, "predicted": a} for ex, a in zip(examples, answers, strict=True)])
        if not math.isnan(value[metric]):
            values.append(value[metric])
    if not values:
        return None
    values.sort()
    low, high = values[int(0.025 * (len(values) - 1))], values[int(0.975 * (len(values) - 1))]
    return sum(values) / len(values), Interval(low, high)


def compare_runs(
    runs: Sequence[ScoredRun],
    n_resamples: int = 1000,
    seed: int = 0,
    units: dict[str, str] | None = None,
) -> tuple[str, dict]:
    """(markdown, data): one section per task that two runs or more scored, with those runs
    (a baseline that covers one task, like the word-overlap floor of QASem, stands beside the
    detector in that task's section alone); differences against the first of them. Intervals
    resample the task's `units` (default: its coarsest, `Task.resample_units[0]`)."""
    if len(runs) < 2:
        raise FincheckError("compare needs at least two scored runs")
    scoring = {t: [run for run in runs if t in run.results.get("tasks", {})] for t in all_tasks()}
    tasks = [t for t in all_tasks() if len(scoring[t]) >= 2]
    if not tasks:
        raise FincheckError("no task is scored by two of the runs")
    lines = ["# fincheck comparison", ""]
    lines += [f"- **{md(run.name)}**: `{run.path}`" for run in runs]
    lines += [
        "",
        f"Differences are against the first run listed in each task's table, on the example ids "
        f"both runs scored, with a paired 95% bootstrap CI ({n_resamples} resamples of whole "
        "units, named in each section); 'better' or 'worse' only when the interval excludes 0.",
        "",
    ]
    data: dict = {"runs": [run.name for run in runs], "tasks": {}}
    for name in tasks:
        scored = scoring[name]  # the runs that scored this task, in the order given
        check_same_inputs(name, scored)
        task = get_task(name)
        metrics = [  # a figure no run recorded (a subset none scored) gets no column
            (key, label)
            for key, label in task.compare_metrics
            if any(
                task.compare_figure(run.results["tasks"][name], key)[0] is not None
                for run in scored
            )
        ]
        unit = (units or {}).get(name) or task.resample_units[0]
        lines += [f"## {task.title}", ""]
        header = "| run | n | " + " | ".join(label for _, label in metrics) + " | unreadable |"
        lines += [header, "|" + " --- |" * (len(metrics) + 3)]
        data["tasks"][name] = {"runs": {}, "differences": {}}
        resampled: dict[str, dict] = {}  # run -> {unit its intervals drew, how many}
        for run in scored:
            figures = run.results["tasks"][name]
            n_bad, n, _ = task.unreadable_outputs(figures)
            values = {key: task.compare_figure(figures, key) for key, _ in metrics}
            if examples := run.examples.get(name):  # figures and intervals by unit, from them
                resampled[run.name], cis = unit_intervals(
                    task, examples, list(values), unit, n_resamples, seed
                )
                recomputed = task.example_figures(examples)
                values = {k: (recomputed.get(k), cis[k]) for k in values}
            cells = [fmt(value) + interval(ci and Interval(*ci)) for value, ci in values.values()]
            lines.append(f"| {md(run.name)} | {n} | " + " | ".join(cells) + f" | {n_bad} of {n} |")
            data["tasks"][name]["runs"][run.name] = {
                "n": n,
                "unreadable": n_bad,
                **{key: v for key, (v, _) in values.items()},
                "ci95": {key: ci for key, (_, ci) in values.items()},
                "resampled": resampled.get(run.name),  # None: results.json's intervals
            }
        missing = [run.name for run in runs if run not in scored]
        if missing:
            lines += ["", f"Not scored on this task: {', '.join(map(md, missing))}."]
        lines += ["", resampling_note(unit, resampled)]
        what = task.unreadable_outputs(scored[0].results["tasks"][name])[2]
        lines += ["", f"Unreadable: {what}.", ""]
        lines += shuffle_floor_lines(name, scored, data["tasks"][name], n_resamples, seed)
        for run in scored[1:]:
            if name not in run.examples or name not in scored[0].examples:
                lines.append(f"- {md(run.name)}: no scored examples to pair (scored/{name}.jsonl)")
                continue
            diffs = [
                paired_difference(
                    name,
                    scored[0].examples[name],
                    run.examples[name],
                    key,
                    n_resamples,
                    seed,
                    unit,
                )
                for key, _ in metrics
            ]
            parts = [
                f"{label}: {d.verdict}"  # an undefined delta: e.g. FINAL F1 scored without a judge
                if math.isnan(d.delta)
                else f"{label} {d.delta:+.3f}{interval(d.ci95)}: {d.verdict}"
                for (_, label), d in zip(metrics, diffs, strict=True)
            ]
            shared = f"{diffs[0].n} shared, {diffs[0].n_units} {diffs[0].unit}s" if diffs else "0"
            lines.append(
                f"- **{md(run.name)}** vs {md(scored[0].name)} ({shared}): " + "; ".join(parts)
            )
            data["tasks"][name]["differences"][run.name] = {
                d.metric: {k: v for k, v in vars(d).items() if k != "metric"}
                | {"ci95": d.ci95 and [d.ci95.low, d.ci95.high], "verdict": d.verdict}
                for d in diffs
            }
        if task.comparability:
            lines += ["", f"With the papers: {task.comparability}"]
        lines.append("")
    return "\n".join(lines), data


def check_same_inputs(task: str, runs: Sequence[ScoredRun]) -> None:
    """Paired figures need the runs to have answered the same inputs: those whose results.json
    records its task's split file (by sha256) must agree."""
    inputs = {
        run.name: sha
        for run in runs
        if (sha := run.results.get("run", {}).get("split_sha256", {}).get(task))
    }
    if len(set(inputs.values())) > 1:
        named = ", ".join(f"{name}: {sha[:12]}" for name, sha in inputs.items())
        raise FincheckError(
            f"{task}: the runs were scored on different inputs ({named}; a folder prepared "
            "again, trimmed or split anew): pair runs made on the same prepared split"
        )


def resampling_note(unit: str, resampled: dict[str, dict]) -> str:
    """One sentence under a task's table: what its intervals resampled whole, and how many."""
    counts = sorted({r["n"] for r in resampled.values() if r["unit"] == unit})
    by_example = [run for run, r in resampled.items() if r["unit"] != unit]
    note = f"95% intervals resample whole {unit}s ({' or '.join(map(str, counts)) or 'none'})"
    if by_example:
        note += (
            f"; {', '.join(by_example)}: examples one by one (the scored records name no "
            f"{unit}: `fincheck score` records it)"
        )
    return note + "."


def shuffle_floor_lines(
    task: str, scored: Sequence[ScoredRun], data: dict, n_shuffles: int, seed: int
) -> list[str]:
    """Per run, its `shuffle_floor` beside its figure (recorded in `data`), for the task's
    `shuffle_floor_metrics`."""
    labels = dict(get_task(task).compare_metrics)
    lines = []
    for metric in get_task(task).shuffle_floor_metrics:
        parts = []
        for run in scored:
            floor = shuffle_floor(task, run.examples.get(task, []), metric, n_shuffles, seed)
            if floor is None:
                continue
            mean, band = floor
            figure = data["runs"][run.name].get(metric)
            verdict = "above" if figure > band.high else "within or below"
            parts.append(f"{md(run.name)} {fmt(figure)} vs {fmt(mean)}{interval(band)}: {verdict}")
            data["runs"][run.name][f"{metric}_shuffle_floor"] = [mean, band.low, band.high]
        if parts:
            lines += [
                f"Shuffle floor of {labels.get(metric, metric)}: each run's own answers dealt "
                f"to its examples at random ({n_shuffles} shuffles; mean [middle 95%]): "
                + "; ".join(parts)
                + ".",
                "",
            ]
    return lines


def unit_of(task: Task, unit: str) -> str:
    """One of the units the task's examples are drawn in (`--unit qasem=response`)."""
    if unit not in task.resample_units:
        raise FincheckError(f"{task.name} resamples one of {', '.join(task.resample_units)}")
    return unit


@dataclass
class CompareOptions:
    runs: list[Path] = config_field(REQUIRED, "`fincheck score --out` folders", positional=True)
    names: list[str] | None = config_field(
        None, "comma-separated run names (default: the folder names)"
    )
    out: Path | None = config_field(None, "write the markdown here (and NAME.json beside it)")
    bootstrap: int = config_field(1000, "resamples of the paired differences", at_least=0)
    unit: dict[str, str] = config_field(
        {},
        "what the intervals resample whole, per task: task=unit,... (default: each task's "
        "coarsest: "
        + ", ".join(f"{t.name}={'|'.join(t.resample_units)}" for t in all_tasks().values())
        + ")",
        parse=lambda text: per_task_values(text, "--unit", unit_of),
    )
    seed: int = config_field(0, "bootstrap seed")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "compare",
        help="put scored runs side by side per task, with paired differences to the first",
        description=__doc__,
        epilog="example:\n  fincheck compare runs/base runs/tiny --names base,tuned --out "
        "runs/compare.md",
    )
    add_options(p, CompareOptions)
    p.set_defaults(func=compare_command, options=CompareOptions)


def compare_command(args: argparse.Namespace) -> int:
    args = read_options(CompareOptions, args)
    if args.out and args.out.suffix == ".json":
        raise FincheckError(
            f"--out {args.out}: name the markdown file (.md); the JSON goes beside it"
        )
    names = args.names or [None] * len(args.runs)
    if len(names) != len(args.runs):
        raise FincheckError(f"--names gives {len(names)} names for {len(args.runs)} runs")
    if not args.out:
        print(compared(args, names)[0])
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with one_writer(args.out, "--out"):  # from the check to the second write: one pair
        check_replaceable(args.out)  # before the runs are read and bootstrapped
        markdown, data = compared(args, names)
        print(markdown)
        data = {**data, MARKDOWN_SHA256: hashlib.sha256(markdown.encode("utf-8")).hexdigest()}
        # The JSON first: it claims the pair (it holds the markdown's sha256), so a compare cut
        # short before its markdown (a full disk) is taken up again by the rerun.
        write_text(args.out.with_suffix(".json"), json.dumps(strict_json(data), indent=2), "--out")
        write_text(args.out, markdown, "--out")
    return 0


def compared(args: argparse.Namespace, names: list[str | None]) -> tuple[str, dict]:
    """The runs read and compared; a figure or field of another shape than `fincheck score`
    writes, met anywhere in them, is one line naming the runs."""
    scored = f"the scored runs {', '.join(map(str, args.runs))}"
    redo = "each must be a `fincheck score --out` folder as it wrote it: score it again"
    with library_errors_as_one_line(scored, redo):
        runs = [load_scored_run(path, name) for path, name in zip(args.runs, names, strict=True)]
        taken = [run.name for run in runs]
        if again := sorted({name for name in taken if taken.count(name) > 1}):
            raise FincheckError(
                f"two runs are named {again[0]!r} (their folders' names): each run needs its own "
                "name for its row and its figures; give --names"
            )
        return compare_runs(runs, args.bootstrap, args.seed, args.unit)


# Recorded in NAME.json: the markdown beside it is compare's own, unedited, when this matches.
MARKDOWN_SHA256 = "markdown_sha256"


def check_replaceable(markdown_path: Path) -> None:
    """--out and the JSON beside it are new, or an earlier compare's pair (the JSON records the
    markdown's sha256, re-checked here), or an earlier compare's JSON whose markdown was never
    written (it stopped between the two): an allow-list, so a user's notes.md or a README that
    happens to share the name is never overwritten."""
    json_path = markdown_path.with_suffix(".json")
    present = [p for p in (markdown_path, json_path) if p.exists()]
    if not present:
        return
    recorded = None
    with contextlib.suppress(OSError, FincheckError):  # no JSON object: not compare's own
        recorded = read_json_object(json_path).get(MARKDOWN_SHA256)
    if recorded is not None and present == [json_path]:
        return
    with contextlib.suppress(OSError, FincheckError):  # a FIFO or a folder: not an earlier output
        if recorded == hashlib.sha256(read_regular_bytes(markdown_path)).hexdigest():
            return
    raise FincheckError(
        f"--out {markdown_path}: {' and '.join(str(p) for p in present)} exist and are not an "
        "earlier `fincheck compare` output, unedited: choose a new file name (nothing is "
        "overwritten)"
    )
