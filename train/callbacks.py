"""The trainer's callbacks (`fincheck.train.trainer`): per-step log line, token count across a
resume, tree packs' epoch, SIGTERM save, complete markers, wandb run config."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm
from transformers import ProgressCallback, TrainerCallback

from fincheck.io.safe_files import read_regular_bytes, write_text
from fincheck.train.checkpoints import (
    in_turn,
    is_complete,
    mark_complete,
    rotate_checkpoints,
)
from fincheck.train.host_memory import release_freed_memory


def any_rank(flag: bool, device: Any) -> bool:
    """True if `flag` is set on any process (every process must take the same branch)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


class ReleaseHostMemoryCallback(TrainerCallback):
    """At the end of each step, the host memory the step freed goes back to the OS
    (`fincheck.train.host_memory`): resident memory follows the working set."""

    def on_step_end(self, args, state, control, **kwargs):
        release_freed_memory()


class TokenCountCallback(TrainerCallback):
    """TRL counts the tokens trained on (`num_tokens` in the logs) from 0 in each process run;
    after a resume, continue from the count the checkpoint's log history ends with. The logged
    rates start counting here too."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        counts = [e["num_tokens"] for e in state.log_history if "num_tokens" in e]
        if counts and self.trainer.tokens_trained == 0:
            self.trainer.tokens_trained = counts[-1]
        # the first logged rates count from here: the first steps' compilation shows in them
        self.trainer.mark_rates(time.perf_counter())


class PackEpochCallback(TrainerCallback):
    """Tree packs: the epoch reaches the trainer's `pack_sampler` through the dataloader, except
    in the epoch a run of several processes resumes in: accelerate's wrapper that skips the
    trained batches hides the sampler, and the packs would come in epoch 0's order (the
    2-process resume test of tests/test_train_distributed.py then differs by 0.16). Set it at
    the start of each epoch."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def on_epoch_begin(self, args, state, control, **kwargs):
        if self.trainer.pack_sampler is not None:  # state.epoch: whole epochs + the fraction run
            self.trainer.pack_sampler.set_epoch(int(state.epoch or 0))


class QuietProgressCallback(ProgressCallback):
    """transformers' progress bar without its raw dict per training step (StepLogCallback prints
    a readable line instead); eval results and the final summary still print."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and ("loss" in logs or any(k.startswith("eval_") for k in logs)):
            return  # StepLogCallback prints training steps and evaluations
        super().on_log(args, state, control, logs=logs, **kwargs)


class StepLogCallback(TrainerCallback):
    """One line per logging step on the main process (step, loss, lr, tokens/s), and one per
    evaluation (eval loss, dev figures)."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        evaluated = {k[len("eval_") :]: v for k, v in logs.items() if k.startswith("eval_")}
        if evaluated:
            shown = " | ".join(
                f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                for k, v in evaluated.items()
                if not k.endswith(("_per_second", "runtime", "entropy"))
            )
            tqdm.write(f"eval at step {state.global_step} | {shown}", file=sys.stderr)
            return
        if "loss" not in logs:
            return
        tps, pps = logs.get("tokens_per_second"), logs.get("pairs_per_second")
        line = (
            f"step {state.global_step}/{state.max_steps} | loss {logs['loss']:.4f} | "
            f"lr {logs.get('learning_rate', 0.0):.3g}"
            + (f" | {tps:,.0f} tok/s | {pps:,.1f} pairs/s" if tps is not None else "")
        )
        tqdm.write(line, file=sys.stderr)  # above the progress bar, not glued to it


class CompleteCheckpointCallback(TrainerCallback):
    """After every process has written checkpoint-N, mark it complete (resume only trusts these),
    then, and only then, remove the checkpoints beyond save_total_limit (`keep`), never the
    best one. Done by each process that saved (`should_save`: world rank 0, or each node's first
    process with `save_on_each_node`, on its own disk), in turn."""

    def __init__(self, info: dict[str, Any], recipe_yaml: str, keep: int | None) -> None:
        self.info, self.recipe_yaml, self.keep = info, recipe_yaml, keep

    def on_save(self, args, state, control, **kwargs):
        for _ in in_turn(args.should_save):
            self.complete(Path(args.output_dir), state)

    def complete(self, output_dir: Path, state) -> None:
        checkpoint = output_dir / f"checkpoint-{state.global_step}"
        if checkpoint.is_dir() and not is_complete(checkpoint):
            mark_complete(checkpoint, {**self.info, "step": state.global_step}, self.recipe_yaml)
            rotate_checkpoints(output_dir, self.keep, state.best_model_checkpoint)


class SigtermCallback(TrainerCallback):
    """On SIGTERM (preemption, `scancel`, `kill`), or when the launcher above this rank is gone
    (`kill` of the deepspeed runner leaves the ranks behind): finish the step, save a
    checkpoint, stop."""

    def __init__(self) -> None:
        self.requested = False
        self.stopped_at: int | None = None
        self.reason = "SIGTERM"
        self._previous: Any = None

    def _handle(self, signum, frame) -> None:
        self.requested = True

    def _launcher_gone(self, process) -> None:
        from fincheck.train.launcher_watch import LAUNCHER_MARKS

        words = process.command.split()
        word = next((w for w in words if any(m in w for m in LAUNCHER_MARKS)), process.command)
        self.reason = f"its launcher exiting (pid {process.pid}, {Path(word).name})"
        print(f"{self.reason}: stopping after this step", file=sys.stderr, flush=True)
        self.requested = True

    def on_train_begin(self, args, state, control, **kwargs):
        from fincheck.train.launcher_watch import watch_launchers

        self._previous = signal.signal(signal.SIGTERM, self._handle)
        watch_launchers(self._launcher_gone)

    def on_train_end(self, args, state, control, **kwargs):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)

    def on_step_end(self, args, state, control, **kwargs):
        if any_rank(self.requested, args.device):  # the process group's device
            self.stopped_at = state.global_step
            control.should_save = True
            control.should_training_stop = True
            if state.is_world_process_zero:
                print(
                    f"{self.reason}: saving checkpoint-{state.global_step} and stopping",
                    file=sys.stderr,
                    flush=True,
                )
        return control


WANDB_RUN_ID_FILE = "wandb_run_id"  # in the run folder: a resume continues the same wandb run


def continue_wandb_run(output_dir: Path) -> None:
    """Before a resumed run starts wandb: point it at the run the first attempt created (unless
    the user chose one with WANDB_RUN_ID), so one training run stays one wandb run."""
    path = output_dir / WANDB_RUN_ID_FILE
    if "WANDB_RUN_ID" not in os.environ and path.is_file():
        os.environ["WANDB_RUN_ID"] = read_regular_bytes(path).decode("utf-8").strip()
        os.environ.setdefault("WANDB_RESUME", "allow")


class RunConfigCallback(TrainerCallback):
    """Adds the recipe, the data fingerprint and the prompt hashes to the wandb run config, and
    records the wandb run id in the run folder for a resume."""

    def __init__(self, run_config: dict[str, Any]) -> None:
        self.run_config = run_config

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero or "wandb" not in (args.report_to or []):
            return
        import wandb

        if wandb.run is not None:
            wandb.config.update({"fincheck": self.run_config}, allow_val_change=True)
            Path(args.output_dir).mkdir(parents=True, exist_ok=True)
            write_text(Path(args.output_dir) / WANDB_RUN_ID_FILE, wandb.run.id)


def install(
    trainer: Any, recipe: Any, metadata: dict[str, Any], recipe_yaml: str
) -> SigtermCallback:
    """The run's callbacks on `trainer`: the quiet progress bar and step lines, token counts,
    host memory release (CPU), complete checkpoints, SIGTERM, the run config for the loggers.
    Returns the SIGTERM callback, which says whether the run stopped early."""
    sigterm = SigtermCallback()
    if not recipe.disable_tqdm:
        trainer.remove_callback(ProgressCallback)
        trainer.add_callback(QuietProgressCallback())
    trainer.add_callback(StepLogCallback())
    trainer.add_callback(TokenCountCallback(trainer))
    if recipe.release_host_memory and recipe.use_cpu:
        trainer.add_callback(ReleaseHostMemoryCallback())
    trainer.add_callback(
        CompleteCheckpointCallback(metadata, recipe_yaml, trainer.keep_checkpoints)
    )
    trainer.add_callback(sigterm)
    trainer.add_callback(RunConfigCallback({"recipe": recipe_yaml, **metadata}))
    return sigterm
