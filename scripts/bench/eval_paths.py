"""The eval path itself on a real model: naive, batched and prefix-reuse, side by side.

`scripts/bench_eval.py --model smollm2-135m-instruct --prepared-dir prepared` runs
`fincheck eval` (`fincheck.eval.generate.run_eval`, model loading included) once per mode on the
same examples, into a scratch folder, and reports per task:

  naive         batch 1, the plain path: every prompt on its own
  batched       `batch_size` prompts per call, longest first, left padding
  prefix-reuse  the default of `fincheck eval` (`fincheck.shared_prefix`): every prefix that
                prompts share (the task's instructions, a document, a response sentence) runs
                once into a KV cache, each prompt only its own suffix from a copy, batched

For each mode: wall seconds, examples/s, prompt tokens/s (the fitted prompts' tokens, the same
count in every mode, over the wall time), the prompt tokens the model actually ran (fewer with
prefix reuse); against the first mode listed (naive by default; `--modes batched,prefix-reuse`
skips the slowest on a full split): the speed-up, the largest |p_yes| difference on QASem, and
the share of identical answers (QASem's Yes/No word, the generating tasks' whole text).

QASem is sampled by whole reference documents (`qasem_docs`), every QA asked over them, as the
full split holds them (97 documents, 1,556 QAs): a random sample of single QAs would share
nothing and hide what prefix reuse saves. `qasem_docs: 0` takes the whole split. FINAL and
FHSumBench are sampled by example (`limit`), which hides the documents FHSumBench's summaries
share (227 documents for 667 summaries): their full splits show it.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench import workload as wl
from fincheck.checksums import sha256_file
from fincheck.classification import parse_yes_no
from fincheck.config import config_field
from fincheck.pairs import Pair, read_pairs, sample_pairs, write_pairs
from fincheck.prepared import files_fingerprint, read_manifest, read_split
from fincheck.tasks import all_tasks, get_task, task_names

PATH_MODES = ("naive", "batched", "prefix-reuse")


@dataclass
class EvalPathSettings:
    model: str = config_field("smollm2-135m-instruct", "a real model: name, folder or hub id")
    adapter: str | None = config_field(None, "a fincheck adapter run folder (default: none)")
    prepared_dir: Path = config_field(Path("prepared"), "a `fincheck prepare` output")
    tasks: list[str] = config_field(["qasem"], "comma list of tasks")
    modes: list[str] = config_field(list(PATH_MODES), "comma list of naive, batched, prefix-reuse")
    qasem_docs: int = config_field(8, "QASem reference documents sampled (all their QAs); 0: all")
    limit: int = config_field(32, "FINAL / FHSumBench examples sampled; 0: all")
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


def sample_documents(pairs: list[Pair], documents: int, seed: int) -> list[Pair]:
    """Every pair over `documents` seeded reference documents, in file order."""
    keys = sorted({p.grounding for p in pairs})
    if documents and documents < len(keys):
        keys = random.Random(seed).sample(keys, documents)
    chosen = set(keys)
    return [p for p in pairs if p.grounding in chosen]


def write_subset(s: EvalPathSettings) -> Path:
    """A prepared folder holding only the sampled test pairs, with the source's manifest made
    the subset's own: its files and fingerprint are the subset's (every read checks them), the
    source's fingerprint kept as `subset_of`."""
    data = s.scratch / "data"
    if s.scratch.exists():
        shutil.rmtree(s.scratch)  # the benchmark's own scratch folder
    for task in s.tasks:
        pairs = read_split(s.prepared_dir, task, "test")
        if get_task(task).limit_by_document:  # QASem: whole references, each with its QAs
            pairs = sample_documents(pairs, s.qasem_docs, s.seed)
        else:
            pairs = sample_pairs(pairs, s.limit or None, s.seed)
        write_pairs(data / task / "test.jsonl", pairs)
    manifest = read_manifest(s.prepared_dir)
    if manifest:
        files = {
            f"{task}/test.jsonl": {
                "pairs": sum(1 for _ in read_pairs(data / task / "test.jsonl", task_names())),
                "sha256": sha256_file(data / task / "test.jsonl"),
            }
            for task in s.tasks
        }
        subset = {**manifest, "files": files, "fingerprint": files_fingerprint(files)}
        subset["subset_of"] = manifest.get("fingerprint")
        (data / "manifest.json").write_text(json.dumps(subset, indent=2) + "\n")
    return data


def prompt_tokens(s: EvalPathSettings, data: Path) -> dict[str, tuple[int, int]]:
    """Per task: tokens of the prompts as the eval path fits them (the same in every mode), and
    those the prefix-reuse path runs through the model (each shared prefix once)."""
    from fincheck.inference import answer_budgets
    from fincheck.loading import load_model
    from fincheck.prefix_tree import build_prefix_tree, count_prefill_tokens

    loaded = load_model(s.model, s.adapter, window=s.window, dtype=s.dtype)
    budgets = answer_budgets(all_tasks(), loaded.window)
    totals = {}
    for task in s.tasks:
        ids = []
        for pair in read_split(data, task, "test"):
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
    if get_task(task).reads_p_yes:
        word = parse_yes_no(output)
        return output if word is None else ("yes" if word else "no")
    return output


def run_eval_paths(s: EvalPathSettings, log=lambda line: print(line, flush=True)) -> EvalPathReport:
    from fincheck.eval.generate import run_eval
    from fincheck.eval.options import EvalOptions
    from fincheck.eval.predictions import read_predictions

    if bad := [m for m in s.modes if m not in PATH_MODES]:
        raise ValueError(f"unknown modes {bad}; the real-model modes: {', '.join(PATH_MODES)}")
    data = write_subset(s)
    tokens = prompt_tokens(s, data)
    report = EvalPathReport(
        device=wl.device_name(),
        settings={k: str(v) if isinstance(v, Path) else v for k, v in asdict(s).items()},
        reference_mode=s.modes[0],
    )
    for task in s.tasks:
        for mode in s.modes:
            out = s.scratch / f"{task}-{mode}"
            opts = EvalOptions(
                model=s.model,
                adapter=s.adapter,
                data_dir=data,
                out_dir=out,
                tasks=(task,),
                batch_size=1 if mode == "naive" else s.batch_size,
                window=s.window,
                dtype=s.dtype,
                prefix_reuse=mode == "prefix-reuse",
                progress=s.progress,
            )
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
