"""The trainer: TRL's SFTTrainer with a warmup from the first step, the dev figures at each
evaluation, tree-packed batches (their sampler, loss and logged figures), token and pair rates,
and a stop on a non-finite loss."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from trl import SFTTrainer

from fincheck.errors import FincheckError
from fincheck.io.safe_files import fresh_folder
from fincheck.train.callbacks import PackEpochCallback, any_rank
from fincheck.train.checkpoints import write_training_output_mark
from fincheck.train.dev_eval import write_dev_predictions

DEV_PREDICTIONS = "dev-predictions"  # in the run folder: step-<N>/<task>.jsonl, one an evaluation


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


class FincheckSFTTrainer(SFTTrainer):
    """SFTTrainer that stops on a non-finite loss, logs tokens/s and pairs/s, warms up from the
    first step, keeps counting tokens across a resume, and trains tree packs in length-grouped,
    rank-balanced micro-batches (`tree_batches`)."""

    def create_model_card(self, *args: Any, **kwargs: Any) -> None:
        """No README.md in the run folder at each checkpoint (TRL writes one with a plain
        open("w"), through a link planted there): a run's card is `fincheck publish`'s, built
        from the run's record and written through fincheck's one write path."""
        return None

    def _save_checkpoint(self, model, trial) -> None:
        """checkpoint-N made a fresh, empty folder of the run's own before the libraries save
        into it (transformers, PEFT and DeepSpeed open their files by name, following links):
        a leftover of a kill, or a link planted there or inside it after the claim, is removed,
        never written through. The mark of a training output is written first, so a copy made
        before its record is refused wherever it goes. The processes that save wait for the
        folder to exist."""
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        run_dir = Path(self._get_output_dir(trial=trial))
        if self.args.should_save:
            name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            fresh_folder(run_dir / name, "a checkpoint")
            write_training_output_mark(run_dir / name)
        self.accelerator.wait_for_everyone()
        super()._save_checkpoint(model, trial)

    def __init__(
        self,
        *args,
        dev_figures: Any = None,
        pair_ids_by_row: dict[tuple[int, ...], str] | None = None,
        **kwargs,
    ) -> None:
        """`dev_figures`: the tasks' figures computed at each evaluation (`dev_eval.DevFigures`);
        `pair_ids_by_row`: the pair ids of each training row (`row_key`), named when a batch's
        loss is not finite."""
        super().__init__(*args, **kwargs)
        self.dev_figures = dev_figures
        self.pair_ids_by_row = pair_ids_by_row or {}
        # PEFT's save_pretrained writes its template README.md (the base named by this machine's
        # cache path) into every checkpoint and the final save: a run's card is `fincheck
        # publish`'s, as with TRL's card above.
        if hasattr(self.model, "create_or_update_model_card"):
            self.model.create_or_update_model_card = lambda *args, **kwargs: None
        # Checkpoints are rotated by CompleteCheckpointCallback alone, once a new one is marked
        # complete: transformers' rotation would delete the last complete checkpoint before the
        # new one is (a kill in between left nothing to resume from), and at the end of a run
        # with save_total_limit 1 and a best checkpoint it deletes every other one, the last
        # too (a rerun would then resume from the best and train past it again).
        self.keep_checkpoints = self.args.save_total_limit
        self.args.save_total_limit = None
        self.pairs_trained = 0  # pairs trained on, all processes (for pairs/s)
        # where the next logged rates start: (time, tokens, pairs, step), set by `mark_rates`
        self.rates_from: tuple[float, float, float, int] | None = None
        self.step_rank_tokens: Any = 0.0  # each process's real tokens in this optimizer step
        # TRL's figures of the tree batches, per mode, averaged into the next log (`log`)
        self.tree_figures = {mode: defaultdict(list) for mode in ("train", "eval")}
        if self.args.tree_packing:
            self.add_callback(PackEpochCallback(self))

    def create_scheduler(self, num_training_steps, optimizer=None):
        from torch.optim.lr_scheduler import LambdaLR

        built = self.lr_scheduler is not None  # already built (and warmed up from step 0)
        scheduler = super().create_scheduler(num_training_steps, optimizer)
        warmup = self.args.get_warmup_steps(num_training_steps)
        if not built and warmup > 0 and isinstance(scheduler, LambdaLR):
            # transformers' warmup (step / warmup) trains the first step at lr 0, the only warmup
            # step when a small run rounds its ratio up to one: the same schedule on the same
            # optimizer, warmed up by (step + 1) / (warmup + 1) instead, unchanged from `warmup` on
            self.lr_scheduler = scheduler = LambdaLR(
                scheduler.optimizer,
                [
                    lambda s, f=f: (s + 1) / (warmup + 1) if s < warmup else f(s)
                    for f in scheduler.lr_lambdas
                ],
            )
        return scheduler

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
        if self.args.process_index == 0:  # the answers behind the figures, to score and pair
            step = f"{DEV_PREDICTIONS}/step-{self.state.global_step}"
            write_dev_predictions(Path(self.args.output_dir) / step, self.dev_figures.answers)
        figures = {f"{metric_key_prefix}_{k}": v for k, v in figures.items()}
        figures[f"{metric_key_prefix}_figures_seconds"] = round(seconds, 1)
        self.log(figures)
        return {**metrics, **figures}

    pack_sampler: Any = None  # tree packing: the PackBatchSampler of the training data

    # transformers takes a custom sampler only from this method (the public get_train_dataloader
    # would have to repeat its private _get_dataloader): no public hook serves
    def _get_train_sampler(self, train_dataset=None):
        """Tree packs: `tree_batches.PackBatchSampler` (length-grouped, dealt to the ranks by
        tokens, each pack once per epoch, its epoch set by `PackEpochCallback`); TRL's sampler
        otherwise."""
        if not self.args.tree_packing:
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

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        import torch

        if "tree_end" in inputs:
            out = self.tree_loss(model, inputs, return_outputs, num_items_in_batch)
        else:
            out = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            if model.training:
                pairs = self.accelerator.gather(answer_runs(inputs["labels"])[None]).sum()
                self.pairs_trained += int(pairs)
        loss = out[0] if return_outputs else out
        here = not bool(torch.isfinite(loss.detach()).all())
        if model.training and any_rank(here, loss.device):
            rank = self.args.process_index
            if here:
                ids = batch_pair_ids(inputs, self.pair_ids_by_row)
                where = f" on rank {rank}" + (f", batch of pairs {', '.join(ids)}" if ids else "")
            else:
                where = f" on another rank than {rank}"
            raise NonFiniteLossError(self.state.global_step + 1, loss.item(), where)
        return out

    def tree_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The loss of a tree-packed batch by `tree_attention.tree_forward`, which keeps logits only
        where the next token is a target: TRL's fused LM head scores every position on a CPU
        (its compact path needs Triton); measured 13.1 s -> 9.9 s per 2,025-token SmolLM2 pack.
        The loss is TRL's: the sum over target tokens / num_items_in_batch (every target token
        of the optimizer step), scaled like TRL's under token averaging across processes."""
        from fincheck.train.tree_attention import tree_forward

        loss, outputs, logits, gold, valid = tree_forward(model, inputs, num_items_in_batch)
        if self.args.average_tokens_across_devices and num_items_in_batch is not None:
            loss = loss * self.accelerator.num_processes  # as TRL: DDP averages the gradients
        self.record_tree_figures(logits, gold, valid, inputs, model.training)
        return (loss, outputs) if return_outputs else loss

    def record_tree_figures(self, logits, gold, valid, inputs, training: bool) -> None:
        """TRL's logged figures for a tree batch: entropy and accuracy of the target tokens,
        tokens run (real tokens of the packs, padding not counted), and `rank_token_spread`:
        1 - fewest / most real tokens of a process over the optimizer step (0: no rank waits)."""
        import torch

        figures = self.tree_figures["train" if training else "eval"]
        with torch.no_grad():
            flat = logits.flatten(0, 1)[valid]
            logp = torch.log_softmax(flat, dim=-1)
            entropy = -(logp.exp() * logp).sum(-1).sum()
            correct = (flat.argmax(-1) == gold.flatten()[valid]).sum()
            gathered = self.accelerator.gather_for_metrics(
                torch.stack([valid.sum().float(), entropy, correct.float()])[None]
            ).sum(0)
        n = float(gathered[0])
        figures["entropy"].append(float(gathered[1]) / n if n else 0.0)
        figures["mean_token_accuracy"].append(float(gathered[2]) / n if n else 0.0)
        if training:
            counts = torch.stack([(inputs["tree_end"] >= 0).sum(), answer_runs(inputs["labels"])])
            gathered_counts = self.accelerator.gather(counts[None]).float()  # [ranks, 2]
            per_rank = gathered_counts[:, 0]
            self.tokens_trained += int(per_rank.sum().item())
            self.pairs_trained += int(gathered_counts[:, 1].sum().item())
            self.step_rank_tokens = per_rank + self.step_rank_tokens
            if self.accelerator.sync_gradients:  # the optimizer step's last micro-batch
                tokens, self.step_rank_tokens = self.step_rank_tokens, 0.0
                spread = 1 - float(tokens.min() / tokens.max()) if tokens.max() > 0 else 0.0
                figures["rank_token_spread"].append(spread)
        figures["num_tokens"] = [self.tokens_trained]

    @property
    def tokens_trained(self) -> int:
        """Tokens trained on, all processes: TRL's count (`num_tokens` in the logs), which tree
        batches and a resume (`TokenCountCallback`) advance too."""
        # TRL keeps it in a private field: no public getter or setter (transformers' public
        # num_input_tokens_seen counts otherwise: pad-valued tokens dropped, another log key)
        return self._total_train_tokens

    @tokens_trained.setter
    def tokens_trained(self, value: int) -> None:
        self._total_train_tokens = value  # TRL's counter: no public setter (see the getter)

    def mark_rates(self, now: float) -> None:
        """Where the next logged rates start: now, the counts so far, this step."""
        tokens = float(self.tokens_trained)
        self.rates_from = (now, tokens, float(self.pairs_trained), self.state.global_step)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Adds the training rates since the last training log (tokens run, pairs: what a
        recipe is compared by), on a GPU the peak memory allocated so far, and the figures of
        the tree batches since the last log (averaged, as TRL does its own)."""
        import torch

        now = time.perf_counter()
        last = self.rates_from
        tokens = float(self.tokens_trained)
        pairs = float(self.pairs_trained)
        if "loss" in logs and last is not None and now > last[0]:
            seconds, steps = now - last[0], self.state.global_step - last[3]
            logs["tokens_per_second"] = round((tokens - last[1]) / seconds, 1)
            logs["pairs_per_second"] = round((pairs - last[2]) / seconds, 2)
            logs["seconds_per_step"] = round(seconds / max(1, steps), 4)
        if "loss" in logs or last is None:
            self.mark_rates(now)
        if "loss" in logs and torch.cuda.is_available():
            logs["gpu_peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        mode = "train" if self.model.training else "eval"  # as TRL merges its own figures
        prefix = "" if mode == "train" else "eval_"
        figures = self.tree_figures[mode]
        logs.update({prefix + k: sum(v) / len(v) for k, v in figures.items()})
        figures.clear()
        super().log(logs, start_time)
