"""The trainer and its callbacks: per-step log line, NaN stop, SIGTERM save, complete markers,
wandb run config."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm
from transformers import ProgressCallback, TrainerCallback
from trl import SFTTrainer

from fincheck.errors import FincheckError
from fincheck.train.checkpoints import mark_complete, rotate_checkpoints
from fincheck.train.host_memory import release_freed_memory


class NonFiniteLossError(FincheckError):
    def __init__(self, step: int, loss: float, where: str = "") -> None:
        self.step = step
        super().__init__(
            f"loss is {loss} at step {step}{where}: training stopped. Lower learning_rate, check "
            "the data, or resume from an earlier checkpoint (--resume_from_checkpoint=auto)."
        )


def row_key(token_ids: Any) -> tuple[int, ...]:
    """What identifies a training row in a batch: its first and last tokens and its length
    (the trainer drops the `id` column before batching)."""
    ids = [int(t) for t in token_ids]
    return (len(ids), *ids[:48], *ids[-16:])


def batch_pair_ids(inputs: dict[str, Any], ids_by_key: dict[tuple[int, ...], str]) -> list[str]:
    """The pair ids of the rows of a padded or tree-packed batch ("?" for a row not found:
    a padding-free batch)."""
    if "tree_end" in inputs:  # tree packs: padding has tree_end < 0
        real = inputs["tree_end"] >= 0
    elif "attention_mask" in inputs and inputs["attention_mask"].dim() == 2:
        real = inputs["attention_mask"].bool()
    else:
        return []
    return [
        ids_by_key.get(row_key(row[mask].tolist()), "?")
        for row, mask in zip(inputs["input_ids"], real, strict=True)
    ]


def answer_runs(labels: Any) -> Any:
    """Pairs in a batch, padded or tree-packed: each pair's loss targets are one run (its
    answer and end of turn), preceded by a prompt token; a tensor, on the labels' device."""
    import torch

    target = labels != -100
    before = torch.nn.functional.pad(target[:, :-1], (1, 0), value=False)
    return (target & ~before).sum()


def _any_rank(flag: bool, device: Any) -> bool:
    """True if `flag` is set on any process (every process must take the same branch)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def warmup_from_the_first_step(schedule, warmup_steps: int):
    """transformers' warmup multiplies the learning rate by step / warmup, so the first step
    trains at lr 0 (a wasted step, and with a ratio rounded up to one warmup step at small step
    counts, the only warmup step). This warmup climbs (step + 1) / (warmup + 1) instead and hands
    over to the schedule unchanged at step == warmup."""

    def multiplier(step: int) -> float:
        return (step + 1) / (warmup_steps + 1) if step < warmup_steps else schedule(step)

    return multiplier


class FincheckSFTTrainer(SFTTrainer):
    """SFTTrainer that stops on a non-finite loss, logs tokens/s and pairs/s, warms up from the
    first step, keeps counting tokens across a resume, and trains tree packs in length-grouped,
    rank-balanced micro-batches (`tree_batches`)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Checkpoints are rotated by CompleteCheckpointCallback alone, once a new one is marked
        # complete: transformers' rotation would delete the last complete checkpoint before the
        # new one is (a kill in between left nothing to resume from), and at the end of a run
        # with save_total_limit 1 and a best checkpoint it deletes every other one, the last
        # too (a rerun would then resume from the best and train past it again).
        self.keep_checkpoints = self.args.save_total_limit
        self.args.save_total_limit = None
        self._total_train_pairs = 0  # pairs trained on, all processes (for pairs/s)
        self._step_rank_tokens: Any = 0.0  # each process's real tokens in this optimizer step

    def create_scheduler(self, num_training_steps, optimizer=None):
        from torch.optim.lr_scheduler import LambdaLR

        scheduler = super().create_scheduler(num_training_steps, optimizer)
        warmup = self.args.get_warmup_steps(num_training_steps)
        if warmup > 0 and isinstance(scheduler, LambdaLR) and not hasattr(scheduler, "_warmup"):
            scheduler.lr_lambdas = [
                warmup_from_the_first_step(f, warmup) for f in scheduler.lr_lambdas
            ]
            scheduler._warmup = warmup
            scheduler._last_lr = [  # the lr of the first step
                base * f(scheduler.last_epoch)
                for base, f in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)
            ]
            for group, lr in zip(scheduler.optimizer.param_groups, scheduler._last_lr, strict=True):
                group["lr"] = lr
        return scheduler

    dev_figures: Any = None  # fincheck.train.dev_eval.DevFigures, set by build_trainer

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
        """The eval loss (transformers), then the tasks' dev figures (`dev_eval`), logged and
        returned together: metric_for_best_model may name either."""
        metrics = super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        if self.dev_figures is None or eval_dataset is not None:
            return metrics
        figures, seconds = self.dev_figures.compute(
            self.model,
            self.args.process_index,
            self.args.world_size,
            # each process answers its share only where it holds the whole model
            sharded=not self.is_fsdp_enabled
            and not (self.is_deepspeed_enabled and self.args.hf_deepspeed_config.is_zero3()),
        )
        figures = {f"{metric_key_prefix}_{k}": v for k, v in figures.items()}
        figures[f"{metric_key_prefix}_figures_seconds"] = round(seconds, 1)
        self.log(figures)
        return {**metrics, **figures}

    pack_sampler: Any = None  # tree packing: the PackBatchSampler of the training data

    def _get_train_sampler(self, train_dataset=None):
        """Tree packs: `tree_batches.PackBatchSampler` (length-grouped, dealt to the ranks by
        tokens, each pack once per epoch); TRL's sampler otherwise."""
        if not getattr(self.args, "tree_packing", False):
            return super()._get_train_sampler(train_dataset)
        from fincheck.train.tree_batches import PackBatchSampler

        dataset = train_dataset if train_dataset is not None else self.train_dataset
        self.pack_sampler = PackBatchSampler(
            [len(ids) for ids in dataset["input_ids"]],
            rows=self.args.per_device_train_batch_size,
            world=self.args.world_size,
            rank=self.args.process_index,
            accumulation=self.args.gradient_accumulation_steps,
            seed=self.args.data_seed,
        )
        return self.pack_sampler

    def _run_epoch(self, *args, **kwargs):
        # The epoch reaches the sampler through the dataloader, except in the epoch a run of
        # several processes resumes in: accelerate's wrapper that skips the trained batches
        # hides the sampler, and the packs would come in epoch 0's order (the 2-process resume
        # test of tests/test_train_distributed.py then differs by 0.16). Set it before each epoch.
        if self.pack_sampler is not None:
            self.pack_sampler.set_epoch(kwargs["epoch"])
        return super()._run_epoch(*args, **kwargs)

    def _set_signature_columns_if_needed(self):
        super()._set_signature_columns_if_needed()
        if getattr(self.args, "tree_packing", False):  # called once per dataloader: add once
            extra = [c for c in ("position_ids", "tree_end") if c not in self._signature_columns]
            self._signature_columns = [*self._signature_columns, *extra]

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        import torch

        if "tree_end" in inputs:
            out = self.tree_loss(model, inputs, return_outputs, num_items_in_batch)
        else:
            out = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            if model.training:
                pairs = self.accelerator.gather(answer_runs(inputs["labels"])[None]).sum()
                self._total_train_pairs += int(pairs)
        loss = out[0] if return_outputs else out
        here = not bool(torch.isfinite(loss.detach()).all())
        if model.training and _any_rank(here, loss.device):
            rank = self.args.process_index
            if here:
                ids = batch_pair_ids(inputs, getattr(self, "pair_ids_by_row", {}))
                where = f" on rank {rank}" + (f", batch of pairs {', '.join(ids)}" if ids else "")
            else:
                where = f" on another rank than {rank}"
            raise NonFiniteLossError(self.state.global_step + 1, loss.item(), where)
        return out

    def tree_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The loss of a tree-packed batch by `tree_packing.tree_forward`, which keeps logits only
        where the next token is a target: TRL's fused LM head scores every position on a CPU
        (its compact path needs Triton); measured 13.1 s -> 9.9 s per 2,025-token SmolLM2 pack.
        The loss is TRL's: the sum over target tokens / num_items_in_batch (every target token
        of the optimizer step), scaled like TRL's under token averaging across processes."""
        from fincheck.train.tree_packing import tree_forward

        loss, outputs, logits, gold, valid = tree_forward(model, inputs, num_items_in_batch)
        if self.args.average_tokens_across_devices and num_items_in_batch is not None:
            loss = loss * self.accelerator.num_processes  # as TRL: DDP averages the gradients
        self._tree_metrics(logits, gold, valid, inputs, model.training)
        return (loss, outputs) if return_outputs else loss

    def _tree_metrics(self, logits, gold, valid, inputs, training: bool) -> None:
        """TRL's logged figures for a tree batch: entropy and accuracy of the target tokens,
        tokens run (real tokens of the packs, padding not counted), and `rank_token_spread`:
        1 - fewest / most real tokens of a process over the optimizer step (0: no rank waits)."""
        import torch

        mode = "train" if training else "eval"
        with torch.no_grad():
            flat = logits.flatten(0, 1)[valid]
            logp = torch.log_softmax(flat, dim=-1)
            entropy = -(logp.exp() * logp).sum(-1).sum()
            correct = (flat.argmax(-1) == gold.flatten()[valid]).sum()
            gathered = self.accelerator.gather_for_metrics(
                torch.stack([valid.sum().float(), entropy, correct.float()])[None]
            ).sum(0)
        n = float(gathered[0])
        self._metrics[mode]["entropy"].append(float(gathered[1]) / n if n else 0.0)
        self._metrics[mode]["mean_token_accuracy"].append(float(gathered[2]) / n if n else 0.0)
        if training:
            counts = torch.stack([(inputs["tree_end"] >= 0).sum(), answer_runs(inputs["labels"])])
            gathered_counts = self.accelerator.gather(counts[None]).float()  # [ranks, 2]
            per_rank = gathered_counts[:, 0]
            self._total_train_tokens += int(per_rank.sum().item())
            pairs = int(gathered_counts[:, 1].sum().item())
            self._total_train_pairs += pairs
            self._step_rank_tokens = per_rank + self._step_rank_tokens
            if self.accelerator.sync_gradients:  # the optimizer step's last micro-batch
                tokens, self._step_rank_tokens = self._step_rank_tokens, 0.0
                spread = 1 - float(tokens.min() / tokens.max()) if tokens.max() > 0 else 0.0
                self._metrics[mode]["rank_token_spread"].append(spread)
        self._metrics[mode]["num_tokens"] = [self._total_train_tokens]

    def mark_rates(self, now: float) -> None:
        """Where the next logged rates start: now, the counts so far, this step."""
        tokens = float(getattr(self, "_total_train_tokens", 0))
        self._tps_last = (now, tokens, float(self._total_train_pairs), self.state.global_step)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Adds the training rates since the last training log (tokens run, pairs: what a
        recipe is compared by) and, on a GPU, the peak memory allocated so far."""
        import torch

        now = time.perf_counter()
        last = getattr(self, "_tps_last", None)
        tokens = float(getattr(self, "_total_train_tokens", 0))
        pairs = float(self._total_train_pairs)
        if "loss" in logs and last is not None and now > last[0]:
            seconds, steps = now - last[0], self.state.global_step - last[3]
            logs["tokens_per_second"] = round((tokens - last[1]) / seconds, 1)
            logs["pairs_per_second"] = round((pairs - last[2]) / seconds, 2)
            logs["seconds_per_step"] = round(seconds / max(1, steps), 4)
        if "loss" in logs or last is None:
            self.mark_rates(now)
        if "loss" in logs and torch.cuda.is_available():
            logs["gpu_peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        super().log(logs, start_time)


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
        if counts and getattr(self.trainer, "_total_train_tokens", 0) == 0:
            self.trainer._total_train_tokens = counts[-1]
        # the first logged rates count from here: the first steps' compilation shows in them
        self.trainer.mark_rates(time.perf_counter())


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
    best one."""

    def __init__(self, info: dict[str, Any], recipe_yaml: str, keep: int | None) -> None:
        self.info, self.recipe_yaml, self.keep = info, recipe_yaml, keep

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
                rotate_checkpoints(Path(args.output_dir), self.keep, state.best_model_checkpoint)
        if dist.is_available() and dist.is_initialized():
            dist.barrier()


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
        if _any_rank(self.requested, args.device):  # the process group's device
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
        os.environ["WANDB_RUN_ID"] = path.read_text(encoding="utf-8").strip()
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
            (Path(args.output_dir) / WANDB_RUN_ID_FILE).write_text(wandb.run.id, encoding="utf-8")
