#!/usr/bin/env python
"""What a lent GPU proves and measures of fincheck's training, in one command.

On one H100, from an installed checkout, with no download, in about 6-8 minutes:
  exact          the `gpu` tests: FlexAttention gives every answer token of a tree pack the loss
                 of its pair alone, and a training step the LoRA gradients of the pairs alone
                 (fp32, within 1e-5; tests/test_tree_packing_gpu.py)
  train          30 steps of `fincheck train` with configs/train/qwen2.5-0.5b-instruct.yaml as
                 shipped (tree packing, FlexAttention, one pack of 8,192 tokens per step), without
                 its DeepSpeed key, on the QASem + FHSumBench mixture, random-init weights
  train-b2       the same with two packs per micro-batch (--per_device_train_batch_size=2)
  train-unpacked the same pairs unpacked (--tree_packing=false, SDPA, 4 pairs per micro-batch):
                 what tree packing and FlexAttention buy, through the trainer itself
  deepspeed      the same as train under `deepspeed --num_gpus 1 train/sft.py`, the recipe's
                 ZeRO-2, with a checkpoint at the last step
Optional (--stages): train-1.5b (the 1.5B recipe, 20 steps). It prints one table (pairs/s in
steady state, the first steps' seconds, the slowest later step against the median, peak GPU
memory) and writes OUT/gpu-check.json; each stage's log is in OUT/logs/.

    fincheck prepare --data-dir ../shared/data --out prepared     # once, on any machine
    fincheck models fetch qwen2.5-coder-0.5b-instruct              # once: its Qwen2.5 tokenizer
    python scripts/gpu_check.py --prepared prepared --out docs/bench/gpu-h100

`--smoke` runs every stage at toy sizes on whatever is here (the tiny model; on a CPU, where
FlexAttention has no backward, the chunked SDPA): what the tests run so the script cannot rot.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.options import options_parser, settings_from_args
from bench.workload import device_name, save_random_model, utc_now
from fincheck.io.config import config_field
from fincheck.io.runs import newest_trainer_state

REPO = Path(__file__).resolve().parents[1]
STAGES = ("exact", "train", "train-b2", "train-unpacked", "deepspeed")
OPTIONAL = ("train-1.5b",)
WARM_STEPS = 5  # steps whose time holds compilation; the steady state is measured after them


@dataclass
class GpuCheckSettings:
    prepared: Path | None = config_field(None, "a `fincheck prepare` output (required)")
    tokenizer: Path | None = config_field(
        None,
        "a Qwen2.5 tokenizer folder (default: the fetched qwen2.5-coder-0.5b-instruct, "
        "~/.cache/fincheck/models)",
    )
    out: Path = config_field(Path("docs/bench/gpu-check"), "where the JSON files and logs go")
    stages: list[str] = config_field(list(STAGES), f"comma list of {', '.join(STAGES + OPTIONAL)}")
    steps: int = config_field(30, "optimizer steps of each training stage")
    smoke: bool = config_field(False, "toy sizes, the tiny model: a check of this script itself")


@dataclass
class Stage:
    name: str
    command: list[str]
    limit: int  # seconds
    reads: Path | None = None  # the run folder it writes


def default_tokenizer() -> Path:
    from fincheck.models.known import model_dir

    return model_dir("qwen2.5-coder-0.5b-instruct")  # fetched before, never downloaded here


def train_stage(name: str, s: GpuCheckSettings, launcher: list[str], recipe: str,
                model: Path, steps: int, *extra: str) -> Stage:  # fmt: skip
    """A training run of `recipe` on `model` with what the check needs: a log line per step,
    a checkpoint at the end (in the scratch folder beside the model), no evaluation, no wandb."""
    run = model.parent / "runs" / name
    args = [f"--model_name_or_path={model}", f"--dataset_dir={s.prepared}",
            "--data_config=configs/data/qasem-fhsumbench.yaml", f"--max_steps={steps}",
            "--logging_steps=1", f"--save_steps={steps}", "--save_total_limit=1", "--eval_steps=0",
            "--report_to=none", f"--output_dir={run}", "--overwrite_output_dir=true", *extra]  # fmt: skip
    if s.smoke:  # the tiny model on whatever device is here: fp32, small windows
        args += ["--precision=fp32", "--torch_dtype=fp32", "--max_length=512"]
    return Stage(name, [*launcher, "--config", recipe, *args], 300, run)


def build_stages(s: GpuCheckSettings, model: Path, big: Path) -> list[Stage]:
    py = sys.executable
    pytest = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu"]
    stages = [Stage("exact", [*pytest, "tests/test_tree_packing_gpu.py"], 240)]
    fincheck = [py, "-c", "from fincheck.commands.cli import console; console()", "train"]
    installed = Path(py).parent / "deepspeed"  # the launcher beside this Python
    port = str(29500 + os.getpid() % 1000)
    deepspeed = [str(installed) if installed.exists() else "deepspeed", "--num_gpus", "1",
                 "--master_port", port, "train/sft.py"]  # fmt: skip
    small = "configs/train/qwen2.5-0.5b-instruct.yaml"
    large = "configs/train/qwen2.5-1.5b-instruct.yaml"
    no_ds, two = "--deepspeed=", "--per_device_train_batch_size=2"
    unpacked = ("--tree_packing=false", "--attn_implementation=sdpa",
                "--per_device_train_batch_size=4")  # fmt: skip
    stages += [
        train_stage("train", s, fincheck, small, model, s.steps, no_ds),
        train_stage("train-b2", s, fincheck, small, model, s.steps, no_ds, two),
        train_stage("train-unpacked", s, fincheck, small, model, s.steps, no_ds, *unpacked),
        train_stage("deepspeed", s, deepspeed, small, model, s.steps),
        train_stage("train-1.5b", s, fincheck, large, big, max(3, s.steps * 2 // 3), no_ds),
    ]
    return [stage for stage in stages if stage.name in s.stages]


def run(stage: Stage, logs: Path) -> dict:
    """Run one stage with its time limit; its output goes to logs/<name>.log."""
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{stage.name}.log"
    start = time.perf_counter()
    with log.open("w") as f:
        try:
            env = {
                **os.environ,
                "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0"),
            }
            rc = subprocess.run(stage.command, cwd=REPO, stdout=f, stderr=subprocess.STDOUT,
                                timeout=stage.limit, env=env).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            rc = "timeout"
        except FileNotFoundError as e:  # a launcher not installed: the other stages still run
            rc, _ = "not found", f.write(f"{e}\n")
    seconds = round(time.perf_counter() - start, 1)
    tail = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
    return {"stage": stage.name, "rc": rc, "seconds": seconds, "last_line": tail[0][:300]}


def training_figures(run: Path) -> dict:
    """Steady-state rates and the step-time profile from a run's last checkpoint."""
    state = newest_trainer_state(run)
    if state is None:
        return {}
    history = [e for e in state["log_history"] if "loss" in e]
    later = [e for e in history if e["step"] > WARM_STEPS and "seconds_per_step" in e]
    first = sum(e.get("seconds_per_step", 0) for e in history if e["step"] <= WARM_STEPS)
    figures = {"steps": len(history), "first_steps_s": round(first, 1),
               "last_loss": history[-1]["loss"], "gpu_peak_gib": history[-1].get("gpu_peak_gib")}  # fmt: skip
    if later:
        step_s = statistics.median(e["seconds_per_step"] for e in later)
        figures |= {
            "pairs_per_s": statistics.median(e["pairs_per_second"] for e in later),
            "tokens_per_s": statistics.median(e["tokens_per_second"] for e in later),
            "median_step_s": step_s,
            "slowest_later_step_ratio": round(max(e["seconds_per_step"] for e in later) / step_s, 2),
            "compile_s": round(max(0.0, first - WARM_STEPS * step_s), 1),  # beyond steady
        }  # fmt: skip
    return figures


def table(record: dict) -> str:
    lines = [f"device: {record['device']}; {record['date']}", "",
             "| stage | rc | seconds | figures |", "| --- | --- | --- | --- |"]  # fmt: skip
    for r in record["stages"]:
        figures = r.get("figures") or {}
        shown = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                          for k, v in figures.items())  # fmt: skip
        lines.append(f"| {r['stage']} | {r['rc']} | {r['seconds']} | {shown or r['last_line']} |")
    return "\n".join(lines)


def build_parser():
    return options_parser(GpuCheckSettings, __doc__)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    s = settings_from_args(GpuCheckSettings, parser.parse_args(argv))
    unknown = [x for x in s.stages if x not in STAGES + OPTIONAL]
    if s.prepared is None or unknown:
        parser.error(f"unknown stages {unknown}" if unknown else "--prepared is required")
    tokenizer = s.tokenizer or default_tokenizer()
    scratch = Path(tempfile.mkdtemp(prefix="gpu-check-"))  # models and runs: removed at the end
    try:
        if s.smoke:
            from fincheck.train.tiny_model import save_tiny_base

            tokenizer = save_tiny_base(scratch / "tiny-tokenizer")
        if not (tokenizer / "tokenizer_config.json").is_file():
            parser.error(f"no tokenizer in {tokenizer}: fetch one (fincheck models fetch "
                         "qwen2.5-coder-0.5b-instruct) or pass --tokenizer")  # fmt: skip
        record = check(s, tokenizer, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print("\n" + table(record))
    return 0 if all(r["rc"] == 0 for r in record["stages"]) else 1


def check(s: GpuCheckSettings, tokenizer: Path, scratch: Path) -> dict:
    """Build the random-init model folders, run the stages, collect their figures."""
    s.out.mkdir(parents=True, exist_ok=True)
    small, big = ("tiny", "tiny") if s.smoke else ("qwen2.5-0.5b", "qwen2.5-1.5b")
    model = save_random_model(small, tokenizer, scratch / small)
    needs_big = "train-1.5b" in s.stages
    big_model = save_random_model(big, tokenizer, scratch / f"{big}-big") if needs_big else model
    settings = {k: str(v) for k, v in vars(s).items()}
    record = {"device": device_name(), "date": utc_now(), "settings": settings, "stages": []}
    for stage in build_stages(s, model, big_model):
        print(f"[{stage.name}] {' '.join(stage.command)}", flush=True)
        result = run(stage, s.out / "logs")
        if stage.reads:
            result["figures"] = training_figures(stage.reads)
        record["stages"].append(result)
        print(f"[{stage.name}] rc={result['rc']} in {result['seconds']} s", flush=True)
        (s.out / "gpu-check.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


if __name__ == "__main__":
    sys.exit(main())
