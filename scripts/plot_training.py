#!/usr/bin/env python
"""The curves of a training run: train loss per logged step, and at every evaluation the eval
loss and the dev figures (`dev_figures` of the recipe: QASem AUC/BAcc, FHSumBench macro F, ...),
read from the run's newest checkpoint (trainer_state.json keeps the whole log history).

    python scripts/plot_training.py checkpoints/smollm2-135m-learn-cpu --out curve.png
    python scripts/plot_training.py RUN --out curve.png --json-out curve.json   # the points too

Figures are on their own axis (0-1), the losses on another; the best checkpoint by
metric_for_best_model is marked.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fincheck.errors import FincheckError
from fincheck.io.runs import newest_trainer_state

FIGURES = (
    "eval_qasem_auc",
    "eval_qasem_bacc",
    "eval_fhsumbench_f",
    "eval_final_binary_bacc",
    "eval_final_flag_auc",  # FINAL's figure for choosing a checkpoint
)


def newest_state(run: Path) -> dict:
    """trainer_state.json of the run's highest checkpoint (or the run folder's own)."""
    state = newest_trainer_state(run)
    if state is None:
        raise FincheckError(f"{run}: no checkpoint-*/trainer_state.json (is it a training run?)")
    return state


def curves(state: dict) -> dict[str, list[tuple[int, float]]]:
    """{name: [(step, value)]} for the train loss, the eval loss and every dev figure logged."""
    out: dict[str, list[tuple[int, float]]] = {}
    for entry in state["log_history"]:
        step = entry.get("step")
        for key in ("loss", "eval_loss", *FIGURES):
            if key in entry and step is not None:
                out.setdefault(key, []).append((step, float(entry[key])))
    return out


def plot(data: dict[str, list[tuple[int, float]]], state: dict, out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (losses, figures) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    for key, style in (("loss", "-"), ("eval_loss", "o-")):
        if key in data:
            steps, values = zip(*data[key], strict=True)
            losses.plot(steps, values, style, label=key.replace("_", " "), markersize=4)
    losses.set_ylabel("loss")
    losses.legend()
    losses.set_title(title)
    for key in FIGURES:
        if key in data:
            steps, values = zip(*data[key], strict=True)
            figures.plot(steps, values, "o-", label=key.removeprefix("eval_").replace("_", " "))
    best = state.get("best_model_checkpoint")
    if best:
        step = int(Path(best).name.split("-")[1])
        figures.axvline(step, color="grey", linestyle=":", label=f"best: step {step}")
    figures.set_ylim(0, 1)
    figures.set_ylabel("dev figure")
    figures.set_xlabel("optimizer step")
    figures.grid(alpha=0.3)
    figures.legend(loc="lower right")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run", type=Path, help="a training run folder (output_dir)")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    parser.add_argument("--json-out", type=Path, help="also write the points as JSON here")
    parser.add_argument("--title", default=None, help="plot title (default: the run's name)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        state = newest_state(args.run)
    except FincheckError as e:
        print(f"plot_training.py: error: {e}", file=sys.stderr)
        return 1
    data = curves(state)
    plot(data, state, args.out, args.title or args.run.name)
    if args.json_out:
        record = {"best_model_checkpoint": state.get("best_model_checkpoint"), "curves": data}
        args.json_out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
