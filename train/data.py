"""Prepared pairs -> the training mixture TRL consumes: the mixture file (`load_mixture_config`),
its tasks' pairs weighted, capped and shuffled (`mix_pairs`), each fitted to max_length on its
grounding text, never the instructions or the target (`fit_pair`), and tokenized as evaluation
renders, the loss on the target and its end of turn only (`tokenize_pair`)."""

from __future__ import annotations

import dataclasses
import functools
import logging
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from fincheck.data.pairs import Pair
from fincheck.errors import FincheckError
from fincheck.inference.generation import fit_messages, render_chat
from fincheck.io.config import config_field, load_config
from fincheck.tasks import check_task_names, get_task, prompt_hashes, task_names
from fincheck.tasks.prepared import PreparedFolder

if TYPE_CHECKING:
    from fincheck.train.recipe import SFTRecipe

log = logging.getLogger(__name__)


# A task's weight repeats its pairs: beyond this, one task's copies would fill any memory
MAX_WEIGHT = 1000.0


@dataclass
class DataMixture:
    tasks: list[str] | None = config_field(
        None,
        "tasks to train on (default: every registered task the prepared folder holds, so a new "
        "task's package is trained on without an edit here)",
    )
    weights: dict[str, float] = config_field(
        {},
        "task -> fraction of its pairs used per epoch (default: the task's `train_weight`, 1.0 "
        "for the built-in ones; 2.0 repeats each pair twice)",
    )
    max_examples: dict[str, int] = config_field({}, "task -> cap on its pairs after weighting")
    plan: Literal["default", "demo"] = config_field(
        "default",
        "where a task's weight and cap come from when `weights` and `max_examples` leave it "
        "out: default (its `train_weight`, no cap) or demo (its demo plan, `Task.demo`: the "
        "demo's mixture, which a new task joins with its own)",
    )
    balance_labels: list[str] = config_field(
        [],
        "tasks whose gold labels (meta.label: QASem Yes/No, FHSumBench's three classes) are "
        "balanced after weighting: each label's pairs repeated until it has as many as the "
        "most frequent one (a 66%-Yes task otherwise teaches the prior first)",
    )
    whole_documents: bool = config_field(
        False,
        "fractional weights and caps take whole documents (every pair of one grounding text) "
        "instead of single pairs: a sample keeps what tree packing shares",
    )
    train_split: str = config_field("train", "split trained on")
    eval_split: str = config_field("dev", "split evaluated on during training")
    min_grounding_kept: float = config_field(
        0.5,
        "drop (instead of trimming) a pair when less than this fraction of its grounding text "
        "would remain: a heavily cut document may no longer support the gold label",
        at_least=0,
        at_most=1,
    )

    def __post_init__(self) -> None:
        named = [*(self.tasks or []), *self.weights, *self.max_examples, *self.balance_labels]
        if named or self.tasks is not None:
            check_task_names(named, "data mixture")
        for task, weight in self.weights.items():  # 2.0 repeats each pair twice
            if not 0 <= weight <= MAX_WEIGHT:
                raise FincheckError(f"weights.{task}: {weight} is not in [0, {MAX_WEIGHT}]")
        for task, cap in self.max_examples.items():
            if cap < 0:
                raise FincheckError(f"max_examples.{task}: {cap} is below 0 (0 takes no pair)")

    def weight(self, task: str) -> float:
        if task in self.weights:
            return self.weights[task]
        own = get_task(task)
        return own.demo.train_weight if self.plan == "demo" else own.train_weight

    def cap(self, task: str) -> int | None:
        if task in self.max_examples:
            return self.max_examples[task]
        return get_task(task).demo.train_cap if self.plan == "demo" else None


def load_mixture_config(path: str | Path, prepared: PreparedFolder | None = None) -> DataMixture:
    """The mixture file; with `dataset_dir`, its default task list resolved to every
    registered task that folder holds (the tasks its manifest counts)."""
    mixture = load_config(DataMixture, path)
    if mixture.tasks is None and prepared is not None:
        mixture = dataclasses.replace(mixture, tasks=prepared.tasks())
    return mixture


def fit_pair(
    pair: Pair,
    tokenizer: Any,
    max_length: int,
    min_grounding_kept: float = 0.0,
    template_kwargs: dict[str, Any] | None = None,
) -> tuple[Pair | None, str]:
    """Make `pair` fit `max_length` tokens of the chat template by cutting its grounding text.

    Returns (pair, "kept" | "trimmed") or (None, "dropped"): `fincheck.inference.generation.fit_messages`
    on the whole conversation (the cut evaluation and detection use), and a pair that would
    keep less than `min_grounding_kept` of its document is dropped too.
    """
    fit = fit_messages(
        tokenizer,
        pair.messages,
        pair.meta.get("grounding_span"),
        max_length,
        add_generation_prompt=False,
        template_kwargs=template_kwargs,
    )
    if fit.status == "dropped" or fit.kept_fraction < min_grounding_kept:
        return None, "dropped"
    if fit.status == "kept":
        return pair, "kept"
    meta = {**pair.meta, "grounding_span": list(fit.span), "trimmed": True}
    return dataclasses.replace(pair, messages=fit.messages, meta=meta), "trimmed"


def tokenize_pair(
    pair: Pair, tokenizer: Any, template_kwargs: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The training row of a pair: token ids and labels, the loss on the answer and the token
    that ends the turn, nothing else.

    The prompt is rendered exactly as evaluation renders it (the generation prompt included)
    and tokenized alone, so the model learns to answer the very token sequence it will see;
    the answer is the rest of the whole conversation's render. Labels are -100 for the prompt
    and for whatever the template writes after the end-of-turn token (ChatML's newline).
    """
    prompt = render_chat(tokenizer, pair.prompt_messages, True, template_kwargs)
    full = render_chat(tokenizer, pair.messages, False, template_kwargs)
    where = f"{pair.task}/{pair.id}"
    if not full.startswith(prompt):
        raise FincheckError(
            f"{where}: the chat template renders the prompt differently with and without the "
            "answer, so the model could not be trained on what it sees at inference"
        )
    completion = full[len(prompt) :]
    if not completion.startswith(pair.target):
        extra = completion[: completion.find(pair.target)] if pair.target in completion else "?"
        raise FincheckError(
            f"{where}: the chat template writes {extra!r} between the generation prompt and the "
            "answer (Qwen3's empty think block: set chat_template_kwargs: {enable_thinking: "
            "false}, which moves it into the prompt)"
        )
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
    if tokenizer.eos_token_id not in completion_ids:
        raise FincheckError(
            f"{where}: the chat template does not end the answer with the tokenizer's EOS "
            f"{tokenizer.eos_token!r}; set eos_token to the template's end-of-turn token"
        )
    end = completion_ids.index(tokenizer.eos_token_id) + 1  # the answer and its end of turn
    labels = [-100] * len(prompt_ids) + completion_ids[:end] + [-100] * (len(completion_ids) - end)
    return {
        "id": pair.id,
        "task": pair.task,
        "input_ids": prompt_ids + completion_ids,
        "labels": labels,
    }


def training_row(
    pair: Pair,
    tokenizer: Any,
    max_length: int,
    min_grounding_kept: float = 0.0,
    template_kwargs: dict[str, Any] | None = None,
) -> tuple[dict[str, Any] | None, str]:
    """(row, "kept" | "trimmed") or (None, "dropped"): the pair fitted, then tokenized. The row
    is tokenized in two parts, which can be a token longer than the whole render that was
    fitted: then it is fitted again, shorter."""
    budget = max_length
    for _ in range(4):
        fitted, status = fit_pair(pair, tokenizer, budget, min_grounding_kept, template_kwargs)
        if fitted is None:
            return None, "dropped"
        row = tokenize_pair(fitted, tokenizer, template_kwargs)
        excess = len(row["input_ids"]) - max_length
        if excess <= 0:
            return row, status
        budget -= excess
    return None, "dropped"


def mix_pairs(by_task: dict[str, list[Pair]], mixture: DataMixture, seed: int) -> list[Pair]:
    """Weight, balance and cap each task, then shuffle all of them together (deterministic in
    `seed`).

    Per task: the pairs in a seeded order (whole documents together when `whole_documents`);
    weight w takes them int(w) times plus the first fraction of them; `max_examples` keeps the
    first N (in the seeded order, whole documents when `whole_documents`); then
    `balance_labels` repeats each label's pairs until it matches the most frequent label (so a
    balanced task may end above its cap)."""
    rng = random.Random(seed)
    mixed: list[Pair] = []
    tasks = (
        mixture.tasks if mixture.tasks is not None else [t for t in task_names() if t in by_task]
    )
    for task in tasks:
        pairs = seeded_order(by_task.get(task, []), rng, mixture.whole_documents)
        whole, frac = divmod(mixture.weight(task), 1.0)
        chosen = pairs * int(whole) + take(pairs, round(frac * len(pairs)), mixture)
        cap = mixture.cap(task)
        if cap is not None:
            chosen = take(chosen, cap, mixture)
        if task in mixture.balance_labels:  # after the cap, which would otherwise cut repeats
            chosen = balance_labels(chosen, task)
        mixed.extend(chosen)
    rng.shuffle(mixed)
    return mixed


def seeded_order(pairs: list[Pair], rng: random.Random, whole_documents: bool) -> list[Pair]:
    """The pairs shuffled; with `whole_documents`, the documents shuffled and each document's
    pairs kept together (in file order)."""
    if not whole_documents:
        pairs = list(pairs)
        rng.shuffle(pairs)
        return pairs
    by_document: dict[str, list[Pair]] = {}
    for pair in pairs:
        by_document.setdefault(pair.document_key, []).append(pair)
    keys = sorted(by_document)
    rng.shuffle(keys)
    return [pair for key in keys for pair in by_document[key]]


def take(pairs: list[Pair], n: int, mixture: DataMixture) -> list[Pair]:
    """The first n pairs; with `whole_documents`, the first documents while fewer than n pairs
    are taken (a document is never cut)."""
    if n <= 0:
        return []
    if not mixture.whole_documents or n >= len(pairs):
        return pairs[:n]
    out: list[Pair] = []
    for k, pair in enumerate(pairs):
        if len(out) >= n and k > 0 and pair.document_key != pairs[k - 1].document_key:
            break
        out.append(pair)
    return out


def balance_labels(pairs: list[Pair], task: str) -> list[Pair]:
    """Each gold label (`meta.label`) repeated, cycling through its pairs in order, until it
    has as many pairs as the most frequent label."""
    by_label: dict[str, list[Pair]] = {}
    for pair in pairs:
        label = pair.meta.get("label")
        if not isinstance(label, str):
            raise FincheckError(
                f"data mixture: balance_labels names {task}, but {task}/{pair.id} has no "
                "meta.label (only tasks with one gold label per pair can be balanced)"
            )
        by_label.setdefault(label, []).append(pair)
    most = max(len(group) for group in by_label.values())
    out = list(pairs)
    for group in by_label.values():
        out += [group[k % len(group)] for k in range(most - len(group))]
    return out


def build_training_data(
    recipe: SFTRecipe, mixture: DataMixture, tokenizer: Any, prepared: PreparedFolder
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """Read, fit, mix, tokenize: (the rows for SFTTrainer, dev rows for the eval loss when the
    recipe evaluates, counts for the log and the run metadata)."""
    eval_max_examples = recipe.eval_max_examples if recipe.eval_steps else 0
    row_of = functools.partial(
        training_row,
        tokenizer=tokenizer,
        max_length=recipe.max_length,
        min_grounding_kept=mixture.min_grounding_kept,
        template_kwargs=recipe.chat_template_kwargs,
    )

    # Select first (weights, caps), then fit only what was selected: fitting measures every
    # pair with the chat template, which is the slow part for a large prepared set.
    by_task = {t: prepared.split(t, mixture.train_split) for t in mixture.tasks}
    fit: Counter = Counter()  # (task, "kept" | "trimmed" | "dropped") -> pairs
    train_rows: list[dict[str, Any]] = []
    for pair in mix_pairs(by_task, mixture, recipe.seed):
        row, status = row_of(pair)
        fit[pair.task, status] += 1
        if row is not None:
            train_rows.append(row)
    empty = [t for t in mixture.tasks if fit[t, "kept"] + fit[t, "trimmed"] == 0]
    if empty and any(mixture.weight(t) > 0 for t in empty):
        raise FincheckError(
            f"no {mixture.train_split} pair of {empty} fits max_length={recipe.max_length}"
        )

    eval_rows: list[dict[str, Any]] = []
    if eval_max_examples > 0:
        candidates = [
            pair
            for task in mixture.tasks
            if prepared.has(task, mixture.eval_split)
            for pair in prepared.split(task, mixture.eval_split)
        ]
        random.Random(recipe.seed).shuffle(candidates)
        for pair in candidates:
            if len(eval_rows) == eval_max_examples:
                break
            row, _ = row_of(pair)
            if row is not None:
                eval_rows.append(row)

    stats = {
        "fit": {
            t: {s: fit[t, s] for s in ("kept", "trimmed", "dropped")}
            for t in sorted({t for t, _ in fit})
        },
        "train_examples": dict(Counter(row["task"] for row in train_rows)),
        "eval_examples": len(eval_rows),
    }
    return train_rows, eval_rows, stats


def check_prompt_hashes(manifest: dict[str, Any], tasks: list[str]) -> None:
    """Warn when the pairs were rendered with other prompt files than the ones installed now:
    evaluation renders with the installed ones, so the model would be tested on other wording."""
    recorded = manifest.get("prompt_hashes") or {}
    current = prompt_hashes([t for t in tasks if t in recorded])
    stale = [t for t in current if recorded[t] != current[t]]
    if stale:
        log.warning("prompts changed since `fincheck prepare` for %s: re-run prepare", stale)
