"""Tree packs -> the micro-batches each process trains: which packs go together, on which rank,
and how they are padded.

`pack_rows` (`fincheck.train.tree_layout`) fills each pack close to the token budget, so packs
differ in length mostly at the end of a split. Two things then decide the GPU's speed:

  - **Shapes.** FlexAttention and `torch.compile` compile a kernel per input shape; a pack
    length never seen before costs a recompilation (7 s on an H100 for Qwen2.5-0.5B, at a
    random step of the run). With `length` set (flex_attention runs), every row is padded to
    the budget rounded up to FlexAttention's 128-token block, and every micro-batch to the same
    number of rows: one shape for the whole run, compiled once. The padding costs little: a
    pack holds 99% of the budget on the prepared mixture (Qwen2.5 tokens: 0.75M in 92 packs of
    8,192, the shortest 6,604).
  - **Ranks.** With data parallelism every process waits for the slowest at each gradient
    reduction. `plan_steps` cuts the packs, sorted by length, into optimizer steps of
    neighbours (little padding within a micro-batch) and deals each step's packs to the ranks
    longest first, each to the rank with the fewest tokens so far (LPT): each rank's tokens per
    step agree closely (on the prepared mixture within 1.5%, Qwen2.5 tokens, 2 ranks). The
    steps are shuffled per epoch (seed + epoch); every pack is trained exactly once per epoch:
    the last step holds the shortest packs and the remainder (fewer micro-batches, padding rows
    where a rank has fewer packs, or none), never a pack repeated to fill it.

The loss is unchanged by either: the trainer divides the summed loss over target tokens by the
target tokens of the whole optimizer step on all ranks (`num_items_in_batch`), so a padding row
or a shorter last step weighs nothing.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from transformers.trainer_pt_utils import BatchRebalanceSampler

from fincheck.errors import FincheckError
from fincheck.train.tree_layout import IGNORE, PAD_END, logit_positions


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


# ------------------------------------------------------------------------------ collation


@dataclass
class TreeCollator:
    """Packs -> a right-padded batch: input_ids, labels, position_ids, tree_end (the trainer
    turns tree_end into the attention mask on the model's device: `tree_attention_mask`), and
    `logit_positions`: the positions whose next token is a loss target in some row, computed
    here on the CPU so the GPU never waits on a `nonzero` before the forward pass.

    `length`: every row exactly this long (one shape per run: no recompilation); else rows are
    padded to the longest (to a multiple of `pad_to_multiple_of`). `rows`: at least this many
    rows, the missing ones all padding (a rank's last micro-batch may hold fewer packs, or none).
    """

    pad_token_id: int
    pad_to_multiple_of: int | None = None
    length: int | None = None
    rows: int = 1

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        longest = max((len(e["input_ids"]) for e in examples), default=1)
        if self.length is not None:
            if longest > self.length:
                raise FincheckError(
                    f"a pack of {longest} tokens exceeds the row length {self.length}"
                )
            n = self.length
        else:
            n = round_up(longest, self.pad_to_multiple_of or 1)
        fill = {
            "input_ids": self.pad_token_id,
            "labels": IGNORE,
            "position_ids": 0,
            "tree_end": PAD_END,
        }
        count = max(len(examples), self.rows)
        batch = {
            key: torch.full((count, n), value, dtype=torch.long) for key, value in fill.items()
        }
        for r, example in enumerate(examples):
            for key in fill:
                values = example[key]
                batch[key][r, : len(values)] = torch.as_tensor(values, dtype=torch.long)
        batch["logit_positions"] = logit_positions(batch["labels"])
        return batch


# ------------------------------------------------------------------------------ ranks and steps


def plan_steps(
    lengths: Sequence[int],
    rows: int,
    world: int,
    accumulation: int,
    seed: int,
    epoch: int,
) -> list[list[list[list[int]]]]:
    """One epoch: per optimizer step, per micro-step, per rank, the packs (indices into
    `lengths`) of that rank's micro-batch (at most `rows`; empty where a rank has none left).

    Sorted longest first, the packs are cut into steps of world x accumulation x rows packs;
    the last step takes the rest, with as few micro-steps as hold it. In a step, each pack
    (longest first) goes to the rank with the fewest tokens among those with room; a rank's
    packs, longest first, fill its micro-batches in turn, so micro-step k is alike on every
    rank. The steps are shuffled by (seed, epoch), all but the one of the shortest packs, which
    stays last: it holds the remainder (the trainer groups micro-batches into optimizer steps by
    count, so only the epoch's last may be short), and its ranks may differ most."""
    per_step = world * accumulation * rows
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    chunks = [order[k : k + per_step] for k in range(0, len(order), per_step)]
    steps = [_deal(chunk, lengths, rows, world) for chunk in chunks]
    steps, last = steps[:-1], steps[-1:]  # last: the shortest packs and the remainder
    random.Random(seed * 1_000_003 + epoch).shuffle(steps)
    return steps + last


def _deal(chunk: list[int], lengths: Sequence[int], rows: int, world: int) -> list[list[list[int]]]:
    """One step's packs (longest first) -> [micro-step][rank] -> packs (see `plan_steps`)."""
    micro_steps = math.ceil(len(chunk) / (world * rows))
    room = micro_steps * rows
    held: list[list[int]] = [[] for _ in range(world)]
    tokens = [0] * world
    for i in chunk:
        rank = min((r for r in range(world) if len(held[r]) < room), key=lambda r: tokens[r])
        held[rank].append(i)
        tokens[rank] += lengths[i]
    return [[held[r][m * rows : (m + 1) * rows] for r in range(world)] for m in range(micro_steps)]


def rank_token_spread(step: list[list[list[int]]], lengths: Sequence[int]) -> float:
    """1 - (fewest tokens of a rank) / (most tokens of a rank) over one optimizer step: 0 when
    every rank trains as many tokens, 0.1 when one waits for a tenth of the step."""
    world = len(step[0])
    tokens = [sum(lengths[i] for micro in step for i in micro[r]) for r in range(world)]
    return 1 - min(tokens) / max(tokens) if max(tokens) else 0.0


class PackBatchSampler(BatchRebalanceSampler):
    """The micro-batches of one rank, epoch by epoch, from `plan_steps`.

    A subclass of transformers' rank-aware batch sampler only so that the Trainer treats it as
    one: it is passed to the DataLoader as its batch sampler, and accelerate's sharding, which
    would deal whole micro-batches round-robin and repeat packs to even out the last step, is
    turned off for it. Every rank builds the same plan (same lengths, seed and epoch) and takes
    its own column, with no communication."""

    def __init__(
        self,
        lengths: Sequence[int],
        rows: int,
        world: int,
        rank: int,
        accumulation: int,
        seed: int,
    ) -> None:  # not BatchRebalanceSampler's: none of its state is used
        self.lengths, self.rows, self.world, self.rank = list(lengths), rows, world, rank
        self.accumulation, self.seed, self.epoch = accumulation, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        for step in plan_steps(
            self.lengths, self.rows, self.world, self.accumulation, self.seed, self.epoch
        ):
            for micro in step:
                yield micro[self.rank]

    def __len__(self) -> int:
        """Micro-batches per epoch, the same on every rank."""
        per_step = self.world * self.accumulation * self.rows
        full, rest = divmod(len(self.lengths), per_step)
        return full * self.accumulation + math.ceil(rest / (self.world * self.rows))


def tree_collator(recipe: Any, pad_token_id: int, attention: str) -> TreeCollator:
    """Tree packs -> batches. FlexAttention: one shape per run, every row the budget long
    (rounded up to its block) and every micro-batch `per_device_train_batch_size` rows, the
    eval loss's batches too, so it compiles once for training and once for evaluation; other
    kernels: rows padded to the longest, as TRL pads (none on a CPU)."""
    from fincheck.train.tree_attention import FLEX_BLOCK

    if attention == "flex_attention":
        length = round_up(recipe.tree_budget, FLEX_BLOCK)
        # the eval loss's batches take the same shape: no new compilation mid-run
        recipe.per_device_eval_batch_size = recipe.per_device_train_batch_size
        return TreeCollator(pad_token_id, length=length, rows=recipe.per_device_train_batch_size)
    multiple = recipe.pad_to_multiple_of  # TRL's "auto": none on a CPU, as TRL decides
    return TreeCollator(pad_token_id, multiple if isinstance(multiple, int) else None)
