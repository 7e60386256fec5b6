"""Training throughput (tokens/s) of a recipe, launched the way users launch it
(`scripts/bench_train_throughput.py`).

Runs `deepspeed --num_gpus N train/sft.py --config RECIPE --max_steps=S` (or torchrun) into a
scratch folder and reads the per-step `tokens_per_second` (non-padding tokens of all processes /
wall time between log lines) from the last checkpoint's trainer_state.json. Reports the median
over the steps after the first (which pays for warm-up) and the token-weighted overall rate.
"""

from __future__ import annotations

import itertools
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.workload import REPO_ROOT
from fincheck.config import config_field


@dataclass
class LaunchSettings:
    dataset_dir: Path = config_field(Path("prepared"), "a `fincheck prepare` output")
    config: str = config_field("configs/train/tiny-cpu.yaml", "the training recipe")
    nproc: int = config_field(2, "processes (GPUs, or CPU processes)")
    steps: int = config_field(30, "optimizer steps")
    launcher: str = config_field("deepspeed", "deepspeed or torchrun")
    overrides: list[str] = config_field([], "extra recipe overrides, comma separated key=value")


@dataclass
class LaunchReport:
    config: str
    processes: int
    launcher: str
    steps: int
    tokens_total: int | None
    tokens_per_second_overall: float | None
    tokens_per_second_median: float
    tokens_per_second_p10_p90: list[float]
    output_dir: str


def measure_launch(s: LaunchSettings) -> LaunchReport:
    from fincheck.train.sft import free_port  # torch and TRL: not for --help

    out = Path(tempfile.mkdtemp(prefix="bench-train-"))
    launcher = Path(sys.executable).parent / s.launcher
    nproc_flag = "--num_gpus" if s.launcher == "deepspeed" else "--nproc_per_node"
    cmd = [
        str(launcher) if launcher.exists() else s.launcher,
        nproc_flag,
        str(s.nproc),
        "--master_port",
        str(free_port()),
        "train/sft.py",
        "--config",
        s.config,
        f"--dataset_dir={s.dataset_dir}",
        f"--output_dir={out}",
        f"--max_steps={s.steps}",
        f"--save_steps={s.steps}",
        "--logging_steps=1",
        "--report_to=none",
        *(f"--{item}" for item in s.overrides),
    ]
    print(" ".join(cmd), file=sys.stderr)
    subprocess.run(  # sft.py shares the cores between CPU processes itself
        cmd, cwd=REPO_ROOT, check=True, stdout=subprocess.DEVNULL
    )
    state = json.loads((out / f"checkpoint-{s.steps}" / "trainer_state.json").read_text())
    logged = [e for e in state["log_history"] if "num_tokens" in e]
    per_step = [e["tokens_per_second"] for e in logged if "tokens_per_second" in e]
    tokens = [e["num_tokens"] for e in logged]
    # Overall rate over steps 2..N: their tokens / the wall time they took (sum of step times).
    step_tokens = [b - a for a, b in itertools.pairwise(tokens)]
    seconds = sum(n / r for n, r in zip(step_tokens, per_step, strict=False) if r > 0)
    return LaunchReport(
        config=s.config,
        processes=s.nproc,
        launcher=s.launcher,
        steps=s.steps,
        tokens_total=tokens[-1] if tokens else None,
        tokens_per_second_overall=round(sum(step_tokens) / seconds, 1) if seconds else None,
        tokens_per_second_median=round(statistics.median(per_step), 1),
        tokens_per_second_p10_p90=[round(q, 1) for q in statistics.quantiles(per_step, n=10)[::8]],
        output_dir=str(out),
    )
