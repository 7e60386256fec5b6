"""The trainer and its callbacks: per-step log line, NaN stop, SIGTERM save, complete markers,
wandb run config."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm
from transformers import ProgressCallback, TrainerCallback
from trl import SFTTrainer

from fincheck.errors import FincheckError
from fincheck.train.checkpoints import mark_complete


class NonFiniteLossError(FincheckError):
    def __init__(self, step: int, loss: float) -> None:
        self.step = step
        super().__init__(
            f"loss is {loss} at step {step}: training stopped. Lower learning_rate, check the data, "
            "or resume from an earlier checkpoint (--resume_from_checkpoint=auto)."
        )


def _any_rank(flag: bool, device: Any) -> bool:
    """True if `flag` is set on any process (every process must take the same branch)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


class FincheckSFTTrainer(SFTTrainer):
    """SFTTrainer that stops on a non-finite loss and logs tokens/s."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        import torch

        out = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        loss = out[0] if return_outputs else out
        if model.training and _any_rank(not bool(torch.isfinite(loss.detach()).all()), loss.device):
            raise NonFiniteLossError(
                self.state.global_step + 1, float(loss.detach().float().item())
            )
        return out

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        now = time.perf_counter()
        last = getattr(self, "_tps_last", None)
        tokens = float(getattr(self, "_total_train_tokens", 0))
        if "loss" in logs and last is not None and now > last[0]:
            logs["tokens_per_second"] = round((tokens - last[1]) / (now - last[0]), 1)
        if "loss" in logs or last is None:
            self._tps_last = (now, tokens)
        super().log(logs, start_time)


class QuietProgressCallback(ProgressCallback):
    """transformers' progress bar without its raw dict per training step (StepLogCallback prints
    a readable line instead); eval results and the final summary still print."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs and "eval_loss" not in logs:
            return
        super().on_log(args, state, control, logs=logs, **kwargs)


class StepLogCallback(TrainerCallback):
    """One line per logging step on the main process: step, loss, lr, tokens/s."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or "loss" not in logs:
            return
        tps = logs.get("tokens_per_second")
        line = (
            f"step {state.global_step}/{state.max_steps} | loss {logs['loss']:.4f} | "
            f"lr {logs.get('learning_rate', 0.0):.3g}"
            + (f" | {tps:,.0f} tok/s" if tps is not None else "")
        )
        tqdm.write(line, file=sys.stderr)  # above the progress bar, not glued to it


class CompleteCheckpointCallback(TrainerCallback):
    """After every process has written checkpoint-N, mark it complete (resume only trusts these)."""

    def __init__(self, info: dict[str, Any], recipe_yaml: str) -> None:
        self.info, self.recipe_yaml = info, recipe_yaml

    def on_save(self, args, state, control, **kwargs):
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier()
        if state.is_world_process_zero:
            checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if checkpoint.is_dir():
                mark_complete(
                    checkpoint, {**self.info, "step": state.global_step}, self.recipe_yaml
                )
        if dist.is_available() and dist.is_initialized():
            dist.barrier()


class SigtermCallback(TrainerCallback):
    """On SIGTERM (preemption, `scancel`, `kill`): finish the step, save a checkpoint, stop."""

    def __init__(self) -> None:
        self.requested = False
        self.stopped_at: int | None = None
        self._previous: Any = None

    def _handle(self, signum, frame) -> None:
        self.requested = True

    def on_train_begin(self, args, state, control, **kwargs):
        self._previous = signal.signal(signal.SIGTERM, self._handle)

    def on_train_end(self, args, state, control, **kwargs):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)

    def on_step_end(self, args, state, control, **kwargs):
        import torch

        device = (
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available()
            else "cpu"
        )
        if _any_rank(self.requested, device):
            self.stopped_at = state.global_step
            control.should_save = True
            control.should_training_stop = True
            if state.is_world_process_zero:
                print(
                    f"SIGTERM: saving checkpoint-{state.global_step} and stopping",
                    file=sys.stderr,
                    flush=True,
                )
        return control


class RunConfigCallback(TrainerCallback):
    """Adds the recipe, the data fingerprint and the prompt hashes to the wandb run config."""

    def __init__(self, run_config: dict[str, Any]) -> None:
        self.run_config = run_config

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero or "wandb" not in (args.report_to or []):
            return
        import wandb

        if wandb.run is not None:
            wandb.config.update({"fincheck": self.run_config}, allow_val_change=True)
