"""The eval path itself on a real model: naive, batched and prefix-reuse, side by side.

`scripts/bench_eval.py --model smollm2-135m-instruct --prepared-dir prepared` runs
`fincheck eval` (`fincheck.eval.generate.run_eval`, model loading included) once per mode on the
same examples, into a scratch folder, and reports per task:

  naive         batch 1, the plain path: every prompt on its own
  batched       `batch_size` prompts per call, longest first, left padding
  prefix-reuse  QASem only: batched, and the prompts that share their reference and response
                sentence run one forward over the shared prefix and only their QA suffix
                beyond it (the default of `fincheck eval`)

For each mode: wall seconds, examples/s, prompt tokens/s (the fitted prompts' tokens, the same
count in every mode, over the wall time); against naive: the speed-up, the largest |p_yes|
difference on QASem, and the share of identical answers (QASem's Yes/No word, the generating
tasks' whole text).

QASem is sampled by whole (response, sentence) groups (`qasem_groups`), as the full split holds
them (250 groups, 1,556 QAs): a random sample of single QAs would share nothing and hide what
prefix reuse saves. `qasem_groups: 0` takes the whole split.
"""

from __future__ import annotations

import json
import platform
import random
import re
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fincheck.config import config_field
from fincheck.pairs import Pair, write_pairs
from fincheck.prepared import read_split

PATH_MODES = ("naive", "batched", "prefix-reuse")


@dataclass
class EvalPathSettings:
    model: str = config_field("smollm2-135m-instruct", "a real model: name, folder or hub id")
    adapter: str | None = config_field(None, "a fincheck adapter run folder (default: none)")
    prepared_dir: Path = config_field(Path("prepared"), "a `fincheck prepare` output")
    tasks: list[str] = config_field(["qasem"], "comma list of tasks")
    modes: list[str] = config_field(list(PATH_MODES), "comma list of naive, batched, prefix-reuse")
    qasem_groups: int = config_field(16, "QASem (response, sentence) groups sampled; 0: all")
    limit: int = config_field(32, "FINAL / FHSumBench examples sampled; 0: all")
    batch_size: int = config_field(8, "prompts per call in batched and prefix-reuse modes")
    window: int | None = config_field(1024, "tokens the model may see, as `fincheck eval --window`")
    seed: int = config_field(0, "seed of the samples")
    scratch: Path = config_field(Path("runs/bench-eval-paths"), "scratch folder (replaced)")


@dataclass
class PathResult:
    task: str
    mode: str
    examples: int
    seconds: float
    prompt_tokens: int
    examples_per_s: float
    prompt_tokens_per_s: float
    speedup_vs_naive: float | None = None
    max_abs_delta_p_yes: float | None = None  # QASem, against naive
    same_output_share: float | None = None  # identical answers, against naive


@dataclass
class EvalPathReport:
    device: str
    settings: dict
    results: list[PathResult] = field(default_factory=list)

    def to_json(self, command: str) -> dict:
        return {"command": command, **asdict(self)}


def sample_groups(pairs: list[Pair], groups: int, seed: int) -> list[Pair]:
    """Every QA of `groups` seeded (response, sentence) groups, in file order."""
    keys = sorted({(p.meta["response_id"], p.meta["sent_id"]) for p in pairs}, key=str)
    if groups and groups < len(keys):
        keys = random.Random(seed).sample(keys, groups)
    chosen = set(keys)
    return [p for p in pairs if (p.meta["response_id"], p.meta["sent_id"]) in chosen]


def sample_examples(pairs: list[Pair], limit: int, seed: int) -> list[Pair]:
    if not limit or limit >= len(pairs):
        return pairs
    keep = sorted(random.Random(seed).sample(range(len(pairs)), limit))
    return [pairs[i] for i in keep]


def write_subset(s: EvalPathSettings) -> Path:
    """A prepared folder holding only the sampled test pairs (and the source's manifest)."""
    data = s.scratch / "data"
    if s.scratch.exists():
        shutil.rmtree(s.scratch)  # the benchmark's own scratch folder
    for task in s.tasks:
        pairs = read_split(s.prepared_dir, task, "test")
        if task == "qasem":
            pairs = sample_groups(pairs, s.qasem_groups, s.seed)
        else:
            pairs = sample_examples(pairs, s.limit, s.seed)
        write_pairs(data / task / "test.jsonl", pairs)
    manifest = s.prepared_dir / "manifest.json"
    if manifest.is_file():
        shutil.copy(manifest, data / "manifest.json")
    return data


def prompt_tokens(s: EvalPathSettings, data: Path) -> dict[str, int]:
    """Tokens of the prompts as the eval path fits them (the same in every mode)."""
    from fincheck.eval.generate import resolve_base_model
    from fincheck.inference import load_model
    from fincheck.tasks import get_task

    loaded = load_model(resolve_base_model(s.model, s.adapter), s.adapter, window=s.window)
    totals = {}
    for task in s.tasks:
        budget = loaded.prompt_budget(loaded.answer_budget(get_task(task).max_new_tokens))
        total = 0
        for pair in read_split(data, task, "test"):
            fit = loaded.fit_prompt(pair.messages[:-1], pair.meta.get("grounding_span"), budget)
            total += len(loaded.tokenizer(fit.text, add_special_tokens=False)["input_ids"])
        totals[task] = total
    return totals


def answer_of(task: str, output: str) -> str:
    """What is compared between modes: QASem's Yes/No word (prefix reuse decodes only the
    answer's first token where the plain path writes on, `No.` vs `No, because ...`); the
    whole text for the generating tasks."""
    if task == "qasem":
        word = re.match(r"\W*(yes|no)\b", output, re.IGNORECASE)
        return word.group(1).lower() if word else output
    return output


def read_predictions(path: Path) -> dict[str, dict]:
    with path.open(encoding="utf-8") as f:
        return {r["id"]: r for r in map(json.loads, f)}


def run_eval_paths(s: EvalPathSettings, log=lambda line: print(line, flush=True)) -> EvalPathReport:
    from fincheck.eval.generate import EvalOptions, resolve_base_model, run_eval

    if bad := [m for m in s.modes if m not in PATH_MODES]:
        raise ValueError(f"unknown modes {bad}; the real-model modes: {', '.join(PATH_MODES)}")
    data = write_subset(s)
    tokens = prompt_tokens(s, data)
    import os

    import torch

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    report = EvalPathReport(
        device=f"{device} ({platform.machine()}, {os.cpu_count()} cores)",
        settings={k: str(v) if isinstance(v, Path) else v for k, v in asdict(s).items()},
    )
    outputs: dict[tuple[str, str], dict[str, dict]] = {}
    for task in s.tasks:
        for mode in s.modes:
            if mode == "prefix-reuse" and task != "qasem":
                continue  # the other tasks have one prompt per document
            out = s.scratch / f"{task}-{mode}"
            opts = EvalOptions(
                model=resolve_base_model(s.model, s.adapter),
                adapter=s.adapter,
                data_dir=data,
                out_dir=out,
                tasks=(task,),
                batch_size=1 if mode == "naive" else s.batch_size,
                window=s.window,
                prefix_reuse=mode == "prefix-reuse",
                progress=False,
            )
            log(f"[{task} / {mode}] ...")
            start = time.perf_counter()
            run_eval(opts)
            seconds = time.perf_counter() - start
            predictions = read_predictions(out / "predictions" / f"{task}.jsonl")
            outputs[task, mode] = predictions
            n = len(predictions)
            result = PathResult(
                task, mode, n, seconds, tokens[task], n / seconds, tokens[task] / seconds
            )
            naive = outputs.get((task, "naive"))
            if naive is not None and mode != "naive":
                base = next(r for r in report.results if r.task == task and r.mode == "naive")
                result.speedup_vs_naive = base.seconds / seconds
                same = sum(
                    answer_of(task, naive[i]["output"]) == answer_of(task, predictions[i]["output"])
                    for i in predictions
                )
                result.same_output_share = same / n
                if task == "qasem":
                    result.max_abs_delta_p_yes = max(
                        abs(naive[i]["p_yes"] - predictions[i]["p_yes"]) for i in predictions
                    )
            report.results.append(result)
            log(f"[{task} / {mode}] {n} examples in {seconds:.1f}s ({n / seconds:.2f} ex/s)")
    return report


def format_paths_report(report: EvalPathReport) -> str:
    def num(value, spec):
        return "-" if value is None else format(value, spec)

    rows = [
        "| task | mode | examples | seconds | ex/s | prompt tok/s | x naive | max abs dp_yes | "
        "same answers |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in report.results:
        rows.append(
            f"| {r.task} | {r.mode} | {r.examples} | {r.seconds:.1f} | {r.examples_per_s:.2f} | "
            f"{r.prompt_tokens_per_s:,.0f} | {num(r.speedup_vs_naive, '.1f')} | "
            f"{num(r.max_abs_delta_p_yes, '.1e')} | {num(r.same_output_share, '.0%')} |"
        )
    return "\n".join(rows)
