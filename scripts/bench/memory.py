"""Host memory of a real training run, step by step (`scripts/bench_memory.py`).

It runs the `fincheck train` path itself (`train.sft.build_trainer` on a recipe) in one process
and records, at the end of every step, the resident memory (`VmRSS`) and the process's peak so
far (`VmHWM`), both from /proc (Linux). The question it answers: does memory grow with steps?
So it holds the batch shape fixed: with `max_length` below the shortest pair, every pair is
trimmed to the same length and every step sees the same tensors; any growth between step 10
and step 50 is then the process's, not the data's. The goal: peak at step 50 within 10% of the
peak at step 10.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fincheck.config import config_field


def status_mib() -> dict[str, float]:
    """VmRSS (resident now) and VmHWM (peak resident so far) of this process, in MiB."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) / 1024
    return out


@dataclass
class MemorySettings:
    config: Path = config_field(Path("configs/train/smollm2-135m-cpu.yaml"), "training recipe")
    dataset_dir: Path = config_field(Path("prepared"), "prepared data")
    steps: int = config_field(50, "optimizer steps")
    max_length: int = config_field(384, "tokens per pair: below the shortest pair, a fixed shape")
    batch_size: int = config_field(2, "pairs per step")
    keep_host_memory: bool = config_field(
        False, "release_host_memory: false, the behaviour before the fix"
    )
    output_dir: Path = config_field(Path("runs/bench-memory"), "scratch run folder (replaced)")


@dataclass
class MemoryReport:
    settings: dict[str, Any]
    steps: list[dict[str, float]]  # per step: step, seconds, rss_mib, peak_mib, shape

    def to_json(self, command: str) -> dict[str, Any]:
        return {"command": command, "settings": self.settings, "steps": self.steps}


def run_memory_bench(s: MemorySettings) -> MemoryReport:
    import shutil

    from transformers import TrainerCallback

    from fincheck.train.sft import build_trainer, load_training_recipe

    if s.output_dir.exists():
        shutil.rmtree(s.output_dir)  # the benchmark's own scratch folder
    overrides = [
        f"--dataset_dir={s.dataset_dir}",
        f"--output_dir={s.output_dir}",
        f"--max_steps={s.steps}",
        f"--max_length={s.max_length}",
        f"--per_device_train_batch_size={s.batch_size}",
        "--gradient_accumulation_steps=1",
        "--deepspeed=",
        f"--save_steps={s.steps * 10}",
        f"--release_host_memory={str(not s.keep_host_memory).lower()}",
        "--disable_tqdm=true",
        "--logging_steps=1000",
    ]
    run = build_trainer(load_training_recipe(s.config, overrides))
    steps: list[dict[str, float]] = []
    shapes: list[list[int]] = []
    trainer = run.trainer
    original_step = trainer.training_step

    def training_step(model, inputs, *args, **kwargs):
        shapes.append(list(inputs["input_ids"].shape))
        return original_step(model, inputs, *args, **kwargs)

    trainer.training_step = training_step

    class Probe(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            memory = status_mib()
            steps.append(
                {
                    "step": state.global_step,
                    "seconds": round(time.perf_counter() - self.started, 2),
                    "rss_mib": round(memory["VmRSS"], 1),
                    "peak_mib": round(memory["VmHWM"], 1),
                    "shape": shapes[-1] if shapes else None,
                }
            )

    trainer.add_callback(Probe())  # after the release callback: RSS is the resting memory
    trainer.train()
    return MemoryReport(dataclasses.asdict(s) | {"config": str(s.config)}, steps)


def format_memory_report(report: MemoryReport) -> str:
    rows = [
        "| step | s/step | shape | resident MiB | peak so far MiB |",
        "| --- | --- | --- | --- | --- |",
    ]
    last = report.steps[-1]["step"]
    marks = {1, 5, 10, 20, 30, 40, 50, last}
    for s in report.steps:
        if s["step"] in marks:
            shape = "x".join(map(str, s["shape"])) if s["shape"] else "-"
            rows.append(
                f"| {s['step']} | {s['seconds']:.1f} | {shape} | {s['rss_mib']:,.0f} | "
                f"{s['peak_mib']:,.0f} |"
            )
    if last >= 10:
        peaks = {s["step"]: s["peak_mib"] for s in report.steps}
        ratio = peaks[last] / peaks[10]
        rows.append("")
        rows.append(f"peak at step {last} / peak at step 10 = {ratio:.3f} (goal: within 1.10)")
    return "\n".join(rows)
