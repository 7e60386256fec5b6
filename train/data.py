"""Prepared pairs -> the training mixture TRL consumes.

Stages, each a small function:
  1. `load_mixture_config`: which tasks, their weights, caps (configs/data/*.yaml).
  2. `fincheck.prepared.read_split`: `<dataset_dir>/<task>/<split>.jsonl`, validated.
  3. `fit_pair`: a pair longer than `max_length` tokens is trimmed on its grounding text
     (`meta["grounding_span"]`, by `fincheck.inference.fit_messages`), never on the
     instructions or the target; a pair that cannot fit is dropped. Both are counted per task.
  4. `mix_pairs`: weights (fractions of each task; > 1 repeats) and caps, shuffled with the seed.
  5. `to_prompt_completion`: TRL's conversational prompt-completion form. TRL tokenizes
     prompt (with the generation prompt) and prompt+completion with the model's chat template
     and trains only on the completion: the target, the EOS that closes the turn, and what the
     template puts after it.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fincheck.config import config_field, load_config
from fincheck.errors import FincheckError
from fincheck.inference import fit_messages
from fincheck.pairs import Pair
from fincheck.prepared import read_manifest, read_split, require_prepared_dir, split_path
from fincheck.tasks import BUILTIN, check_task_names

log = logging.getLogger(__name__)


@dataclass
class DataMixture:
    tasks: list[str] = config_field(
        list(BUILTIN), "tasks to train on (any registered task: final, qasem, fhsumbench)"
    )
    weights: dict[str, float] = config_field(
        {},
        "task -> fraction of its pairs used per epoch (default 1.0; 2.0 repeats each pair twice)",
    )
    max_examples: dict[str, int] = config_field({}, "task -> cap on its pairs after weighting")
    train_split: str = config_field("train", "split trained on")
    eval_split: str = config_field("dev", "split evaluated on during training")
    min_grounding_kept: float = config_field(
        0.5,
        "drop (instead of trimming) a pair when less than this fraction of its grounding text "
        "would remain: a heavily cut document may no longer support the gold label",
    )

    def __post_init__(self) -> None:
        check_task_names([*self.tasks, *self.weights, *self.max_examples], "data mixture")
        if any(w < 0 for w in self.weights.values()):
            raise FincheckError("data mixture: weights must be >= 0")


def load_mixture_config(path: str | Path) -> DataMixture:
    return load_config(DataMixture, path)


@dataclass
class FitStats:
    """Per-task counts of what `fit_pair` did."""

    kept: Counter = field(default_factory=Counter)
    trimmed: Counter = field(default_factory=Counter)
    dropped: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict[str, dict[str, int]]:
        tasks = sorted(set(self.kept) | set(self.trimmed) | set(self.dropped))
        return {
            t: {"kept": self.kept[t], "trimmed": self.trimmed[t], "dropped": self.dropped[t]}
            for t in tasks
        }


def fit_pair(
    pair: Pair, tokenizer: Any, max_length: int, min_grounding_kept: float = 0.0
) -> tuple[Pair | None, str]:
    """Make `pair` fit `max_length` tokens of the chat template by cutting its grounding text.

    Returns (pair, "kept" | "trimmed") or (None, "dropped"): `fincheck.inference.fit_messages`
    on the whole conversation (the cut evaluation and detection use), and a pair that would
    keep less than `min_grounding_kept` of its document is dropped too.
    """
    fit = fit_messages(
        tokenizer,
        pair.messages,
        pair.meta.get("grounding_span"),
        max_length,
        add_generation_prompt=False,
    )
    if fit.status == "dropped" or fit.kept_fraction < min_grounding_kept:
        return None, "dropped"
    if fit.status == "kept":
        return pair, "kept"
    meta = {**pair.meta, "grounding_span": list(fit.span), "trimmed": True}
    return dataclasses.replace(pair, messages=fit.messages, meta=meta), "trimmed"


def mix_pairs(by_task: dict[str, list[Pair]], mixture: DataMixture, seed: int) -> list[Pair]:
    """Weight and cap each task, then shuffle all of them together (deterministic in `seed`)."""
    rng = random.Random(seed)
    mixed: list[Pair] = []
    for task in mixture.tasks:
        pairs = list(by_task.get(task, []))
        rng.shuffle(pairs)
        weight = mixture.weights.get(task, 1.0)
        whole, frac = divmod(weight, 1.0)
        chosen = pairs * int(whole) + pairs[: round(frac * len(pairs))]
        cap = mixture.max_examples.get(task)
        mixed.extend(chosen[:cap] if cap is not None else chosen)
    rng.shuffle(mixed)
    return mixed


def to_prompt_completion(pair: Pair) -> dict[str, Any]:
    """TRL's conversational prompt-completion row (loss on the completion only)."""
    return {
        "id": pair.id,
        "task": pair.task,
        "prompt": pair.prompt_messages,
        "completion": [pair.messages[-1]],
    }


@dataclass
class PreparedData:
    train_rows: list[dict[str, Any]]
    eval_rows: list[dict[str, Any]]
    stats: dict[str, Any]
    manifest: dict[str, Any]


def build_training_data(
    dataset_dir: str | Path,
    mixture: DataMixture,
    tokenizer: Any,
    max_length: int,
    seed: int,
    eval_max_examples: int = 0,
) -> PreparedData:
    """Read, fit, mix: the rows for SFTTrainer plus counts for the log and the run metadata."""
    dataset_dir = require_prepared_dir(dataset_dir)

    # Select first (weights, caps), then fit only what was selected: fitting measures every
    # pair with the chat template, which is the slow part for a large prepared set.
    by_task = {t: read_split(dataset_dir, t, mixture.train_split) for t in mixture.tasks}
    fit_stats = FitStats()
    train: list[Pair] = []
    for pair in mix_pairs(by_task, mixture, seed):
        out, status = fit_pair(pair, tokenizer, max_length, mixture.min_grounding_kept)
        getattr(fit_stats, status)[pair.task] += 1
        if out is not None:
            train.append(out)
    empty = [t for t in mixture.tasks if fit_stats.kept[t] + fit_stats.trimmed[t] == 0]
    if empty and any(mixture.weights.get(t, 1.0) > 0 for t in empty):
        raise FincheckError(
            f"no {mixture.train_split} pair of {empty} fits max_length={max_length}"
        )

    eval_rows: list[dict[str, Any]] = []
    if eval_max_examples > 0:
        candidates = [
            pair
            for task in mixture.tasks
            if split_path(dataset_dir, task, mixture.eval_split).is_file()
            for pair in read_split(dataset_dir, task, mixture.eval_split)
        ]
        random.Random(seed).shuffle(candidates)
        for pair in candidates:
            if len(eval_rows) == eval_max_examples:
                break
            out, _ = fit_pair(pair, tokenizer, max_length, mixture.min_grounding_kept)
            if out is not None:
                eval_rows.append(to_prompt_completion(out))

    stats = {
        "fit": fit_stats.as_dict(),
        "train_examples": dict(Counter(p.task for p in train)),
        "eval_examples": len(eval_rows),
    }
    return PreparedData(
        train_rows=[to_prompt_completion(p) for p in train],
        eval_rows=eval_rows,
        stats=stats,
        manifest=read_manifest(dataset_dir),
    )
