"""Training throughput (tokens/s) of a recipe, launched the way users launch it.

    python scripts/bench_train_throughput.py --dataset_dir /tmp/prepared            # tiny-cpu, 2 procs
    python scripts/bench_train_throughput.py --config configs/train/qwen2.5-0.5b-instruct.yaml \
        --nproc 1 --dataset_dir prepared --steps 30 -- --deepspeed=

Runs `deepspeed --num_gpus N train/sft.py --config RECIPE --max_steps=S` into a scratch folder and
reads the per-step `tokens_per_second` (non-padding tokens of all processes / wall time between
log lines) from the last checkpoint's trainer_state.json. Reports the median over the steps after
the first (which pays for warm-up) and the token-weighted mean.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default="configs/train/tiny-cpu.yaml")
    parser.add_argument("--dataset_dir", required=True)
    parser.add_argument("--nproc", type=int, default=2, help="processes (GPUs, or CPU processes)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--launcher", choices=["deepspeed", "torchrun"], default="deepspeed")
    parser.add_argument(
        "overrides", nargs="*", help="extra --key=value recipe overrides (after --)"
    )
    args = parser.parse_args()

    out = Path(tempfile.mkdtemp(prefix="bench-train-"))
    launcher = Path(sys.executable).parent / args.launcher
    nproc_flag = "--num_gpus" if args.launcher == "deepspeed" else "--nproc_per_node"
    cmd = [
        str(launcher) if launcher.exists() else args.launcher,
        nproc_flag,
        str(args.nproc),
        "--master_port",
        str(free_port()),
        "train/sft.py",
        "--config",
        args.config,
        f"--dataset_dir={args.dataset_dir}",
        f"--output_dir={out}",
        f"--max_steps={args.steps}",
        f"--save_steps={args.steps}",
        "--logging_steps=1",
        "--report_to=none",
        *args.overrides,
    ]
    print(" ".join(cmd), file=sys.stderr)
    env = dict(os.environ)  # sft.py shares the cores between CPU processes itself
    subprocess.run(
        cmd, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    state = json.loads((out / f"checkpoint-{args.steps}" / "trainer_state.json").read_text())
    logged = [e for e in state["log_history"] if "num_tokens" in e]
    per_step = [e["tokens_per_second"] for e in logged if "tokens_per_second" in e]
    tokens = [e["num_tokens"] for e in logged]
    # Overall rate over steps 2..N: their tokens / the wall time they took (sum of step times).
    step_tokens = [b - a for a, b in itertools.pairwise(tokens)]
    seconds = sum(n / r for n, r in zip(step_tokens, per_step, strict=False) if r > 0)
    print(
        json.dumps(
            {
                "config": args.config,
                "processes": args.nproc,
                "launcher": args.launcher,
                "steps": args.steps,
                "tokens_total": tokens[-1] if tokens else None,
                "tokens_per_second_overall": round(sum(step_tokens) / seconds, 1)
                if seconds
                else None,
                "tokens_per_second_median": round(statistics.median(per_step), 1),
                "tokens_per_second_p10_p90": [
                    round(q, 1) for q in statistics.quantiles(per_step, n=10)[::8]
                ],
                "output_dir": str(out),
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
