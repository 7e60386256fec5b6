"""The eval path itself on a real model: naive, batched and prefix-reuse, side by side.

`scripts/bench_eval.py --model smollm2-135m-instruct --prepared-dir prepared` runs
`fincheck eval` (`fincheck.eval.generate.run_eval`, model loading included) once per mode on the
same examples, into a scratch folder, and reports per task:

  naive         batch 1, the plain path: every prompt on its own
  batched       `batch_size` prompts per call, longest first, left padding
  prefix-reuse  the default of `fincheck eval` (`fincheck.inference.shared_prefix`): every prefix that
                prompts share (the task's instructions, a document, a response sentence) runs
                once into a KV cache, each prompt only its own suffix from a copy, batched

For each mode: wall seconds, examples/s, prompt tokens/s (the fitted prompts' tokens, the same
count in every mode, over the wall time), the prompt tokens the model actually ran (fewer with
prefix reuse); against the first mode listed (naive by default; `--modes batched,prefix-reuse`
skips the slowest on a full split): the speed-up, the largest |p_yes| difference on QASem, and
the share of identical answers (QASem's Yes/No word, the generating tasks' whole text).

The examples are `fincheck eval`'s own sample (`--limit`, `--sample-seed`): QASem by whole
reference documents, about N QAs, every QA asked over them as the full split holds them (97
documents, 1,556 QAs; a sample of single QAs would share nothing and hide what prefix reuse
saves); FINAL and FHSumBench by example, which hides the documents FHSumBench's summaries share
(227 documents for 667 summaries): their full splits show it. `--limit 0`: every example.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench import workload as wl
from fincheck.eval.options import EvalRun
from fincheck.io.config import config_field
from fincheck.metrics.classification import parse_yes_no
from fincheck.tasks import all_tasks, get_task, per_task_numbers

PATH_MODES = ("naive", "batched", "prefix-reuse")


@dataclass
class EvalPathSettings:
    model: str = config_field("smollm2-135m-instruct", "a real model: name, folder or hub id")
    adapter: str | None = config_field(None, "a fincheck adapter run folder (default: none)")
    prepared_dir: Path = config_field(Path("prepared"), "a `fincheck prepare` output")
    tasks: list[str] = config_field(["qasem"], "comma list of tasks")
    modes: list[str] = config_field(list(PATH_MODES), "comma list of naive, batched, prefix-reuse")
    limit: int | dict[str, int] = config_field(
        {"qasem": 100, "final": 32, "fhsumbench": 32},
        "examples per task as `fincheck eval --limit` samples them: N, or task=N,... (QASem: "
        "whole documents, about N QAs); 0: all",
        parse=lambda text: 0 if text.strip() == "0" else per_task_numbers(text),
    )
    batch_size: int = config_field(8, "prompts per call in batched and prefix-reuse modes")
    window: int | None = config_field(1024, "tokens the model may see, as `fincheck eval --window`")
    dtype: str = config_field(
        "auto", "weights' dtype, as `fincheck eval --dtype` (auto: fp32 on a CPU)"
    )
    seed: int = config_field(0, "seed of the samples")
    scratch: Path = config_field(Path("runs/bench-eval-paths"), "scratch folder (replaced)")
    progress: bool = config_field(False, "show the eval's progress bars (rate and ETA) on stderr")


@dataclass
class PathResult:
    task: str
    mode: str
    examples: int
    seconds: float
    prompt_tokens: int
    examples_per_s: float
    prompt_tokens_per_s: float
    tokens_run: int | None = None  # prompt tokens through the model (prefix reuse: fewer)
    # against the reference mode (the first of `modes`):
    speedup: float | None = None
    max_abs_delta_p_yes: float | None = None  # QASem only
    same_output_share: float | None = None  # identical answers


@dataclass
class EvalPathReport:
    device: str
    settings: dict
    reference_mode: str
    results: list[PathResult] = field(default_factory=list)

    def to_json(self, command: str) -> dict:
        return {"command": command, **asdict(self)}


def prompt_tokens(s: EvalPathSettings, sample: EvalRun) -> dict[str, tuple[int, int]]:
    """Per task: tokens of the prompts as the eval path fits them (the same in every mode), and
    those the prefix-reuse path runs through the model (each shared prefix once)."""
    from fincheck.inference.generation import answer_budgets
    from fincheck.inference.prefix_tree import build_prefix_tree, count_prefill_tokens
    from fincheck.models.loading import load_model

    loaded = load_model(s.model, s.adapter, window=s.window, dtype=s.dtype)
    budgets = answer_budgets(all_tasks(), loaded.window)
    totals = {}
    for task in s.tasks:
        ids = []
        for pair in sample.sample(task):
            fit = loaded.fit_for_answer(
                pair.prompt_messages, pair.meta.get("grounding_span"), budgets[task]
            )
            ids.append(loaded.tokenizer(fit.text, add_special_tokens=False)["input_ids"])
        totals[task] = (sum(map(len, ids)), count_prefill_tokens(ids, build_prefix_tree(ids)))
    return totals


def answer_of(task: str, output: str) -> str:
    """What is compared between modes: QASem's Yes/No word (prefix reuse decodes only the
    answer's first token where the plain path writes on, `No.` vs `No, because ...`); the
    whole text for the generating tasks."""
    if get_task(task).answers_yes_no:
        word = parse_yes_no(output)
        return output if word is None else ("yes" if word else "no")
    return output


def run_eval_paths(s: EvalPathSettings, log=lambda line: print(line, flush=True)) -> EvalPathReport:
    from fincheck.eval.generate import run_eval
    from fincheck.eval.options import EvalOptions
    from fincheck.eval.predictions import read_predictions

    if bad := [m for m in s.modes if m not in PATH_MODES]:
        raise ValueError(f"unknown modes {bad}; the real-model modes: {', '.join(PATH_MODES)}")
    if s.scratch.exists():
        shutil.rmtree(s.scratch)  # the benchmark's own scratch folder
    base = EvalOptions(
        model=s.model, adapter=s.adapter, data_dir=s.prepared_dir, out_dir=s.scratch,
        limit=s.limit or None,  # 0: every example
        sample_seed=s.seed, batch_size=s.batch_size, window=s.window, dtype=s.dtype,
        progress=s.progress,
    )  # fmt: skip
    tokens = prompt_tokens(s, base)
    report = EvalPathReport(
        device=wl.device_name(),
        settings={k: str(v) if isinstance(v, Path) else v for k, v in asdict(s).items()},
        reference_mode=s.modes[0],
    )
    for task in s.tasks:
        for mode in s.modes:
            out = s.scratch / f"{task}-{mode}"
            opts = dataclasses.replace(
                base, out_dir=out, tasks=(task,), prefix_reuse=mode == "prefix-reuse",
                batch_size=1 if mode == "naive" else s.batch_size,
            )  # fmt: skip
            log(f"[{task} / {mode}] ...")
            start = time.perf_counter()
            run_eval(opts)
            seconds = time.perf_counter() - start
            predictions = {p.id: p for p in read_predictions(out / "predictions" / f"{task}.jsonl")}
            n = len(predictions)
            total, reused = tokens[task]
            result = PathResult(task, mode, n, seconds, total, n / seconds, total / seconds)
            result.tokens_run = reused if mode == "prefix-reuse" else total
            if mode == report.reference_mode:  # the first of s.modes: run before the others
                ref, ref_seconds = predictions, seconds
            else:
                result.speedup = ref_seconds / seconds
                same = sum(
                    answer_of(task, ref[i].output) == answer_of(task, predictions[i].output)
                    for i in predictions
                )
                result.same_output_share = same / n
                if get_task(task).reads_p_yes:
                    result.max_abs_delta_p_yes = max(
                        abs(ref[i].p_yes - predictions[i].p_yes) for i in predictions
                    )
            report.results.append(result)
            log(f"[{task} / {mode}] {n} examples in {seconds:.1f}s ({n / seconds:.2f} ex/s)")
    return report


def format_paths_report(report: EvalPathReport) -> str:
    def num(value, spec):
        return "-" if value is None else format(value, spec)

    rows = [
        f"| task | mode | examples | seconds | ex/s | prompt tok/s | tokens run | "
        f"x {report.reference_mode} | max abs dp_yes | same answers |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in report.results:
        rows.append(
            f"| {r.task} | {r.mode} | {r.examples} | {r.seconds:.1f} | {r.examples_per_s:.2f} | "
            f"{r.prompt_tokens_per_s:,.0f} | {num(r.tokens_run, ',')} | "
            f"{num(r.speedup, '.1f')} | "
            f"{num(r.max_abs_delta_p_yes, '.1e')} | {num(r.same_output_share, '.0%')} |"
        )
    return "\n".join(rows)
