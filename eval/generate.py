"""`fincheck eval`: run a model (optionally + LoRA adapter) over prepared pairs, keep every output.

For each task: read `DATA/<task>/<split>.jsonl`, skip ids already in
`RUN/predictions/<task>.jsonl` (resume), fit each prompt to the window
(`fincheck.inference.fit_messages`), sort by prompt length (longest first, so an out-of-memory
shows up in the first batch, and batches hold similar lengths), generate greedily with left
padding (`fincheck.inference.generate_batch`), and append one line per example, flushed per
batch. A task that `reads_p_yes` (QASem) also gets p_yes = P(Yes)/(P(Yes)+P(No)) at the first
generated position.

The model sees `messages[:-1]` (system + user) through the tokenizer's chat template with
`add_generation_prompt=True`, exactly as training rendered the prompt part.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from fincheck.errors import FincheckError
from fincheck.eval.predictions import (
    Prediction,
    PredictionWriter,
    check_eval_config,
    record_generation,
)
from fincheck.inference import LoadedModel, fit_messages, generate_batch, load_model
from fincheck.pairs import Pair
from fincheck.prepared import read_split
from fincheck.tasks import get_task, task_names


@dataclass
class EvalOptions:
    model: str
    data_dir: Path
    out_dir: Path
    adapter: str | None = None
    tasks: tuple[str, ...] = field(default_factory=task_names)
    split: str = "test"
    limit: int | None = None
    sample_seed: int = 0
    batch_size: int = 8
    max_new_tokens: dict[str, int] = field(default_factory=dict)  # task -> N; default: the task's
    max_input_tokens: int | None = None
    device: str | None = None
    dtype: str = "auto"
    progress: bool = True

    @property
    def predictions_dir(self) -> Path:
        return self.out_dir / "predictions"

    def answer_budget(self, task: str) -> int:
        return self.max_new_tokens.get(task, get_task(task).max_new_tokens)


def resolve_base_model(model: str | None, adapter: str | None) -> str:
    """--model, or the base the adapter's run recorded."""
    if model:
        return model
    if adapter:
        from fincheck.runs import load_run

        return load_run(adapter).resolve_base()
    raise FincheckError(
        "give --model (a base model name or path), or an --adapter that records its base"
    )


def fit_prompt(tokenizer, pair: Pair, max_tokens: int | None) -> tuple[str, bool]:
    """The rendered prompt of a pair, its grounding text cut to fit `max_tokens`.
    Returns (prompt, trimmed?). Unlike training, evaluation never drops an example."""
    fit = fit_messages(
        tokenizer,
        pair.prompt_messages,
        pair.meta.get("grounding_span"),
        max_tokens,
        add_generation_prompt=True,
    )
    if fit.text is None:
        raise FincheckError(
            f"{pair.task}/{pair.id}: the prompt does not fit in {max_tokens} tokens even without "
            "its grounding text; raise --max-input-tokens"
        )
    return fit.text, fit.trimmed


def run_eval(opts: EvalOptions) -> dict[str, dict[str, int]]:
    """Generate predictions for every task; returns per-task counts (done before, new, trimmed)."""
    from tqdm.auto import tqdm

    check_eval_config(
        opts.predictions_dir,
        {
            "model": opts.model,
            "adapter": opts.adapter,
            "split": opts.split,
            "limit": opts.limit,
            "sample_seed": opts.sample_seed,
            "max_new_tokens": {t: opts.answer_budget(t) for t in opts.tasks},
            "max_input_tokens": opts.max_input_tokens,
            "tasks": list(opts.tasks),
        },
    )
    task_pairs = {
        task: sample_pairs(
            read_split(opts.data_dir, task, opts.split), opts.limit, opts.sample_seed
        )
        for task in opts.tasks
    }
    loaded = load_model(opts.model, opts.adapter, dtype=opts.dtype, device=opts.device)
    max_input = opts.max_input_tokens or _model_window(loaded, opts)
    summary: dict[str, dict[str, int]] = {}
    for task, pairs in task_pairs.items():
        writer = PredictionWriter(opts.predictions_dir / f"{task}.jsonl", task)
        todo = [p for p in pairs if p.id not in writer.done]
        prompts, n_trimmed = {}, 0
        for pair in todo:
            prompts[pair.id], trimmed = fit_prompt(loaded.tokenizer, pair, max_input)
            n_trimmed += trimmed
        todo.sort(key=lambda p: -len(prompts[p.id]))
        bar = tqdm(
            total=len(pairs),
            initial=len(pairs) - len(todo),
            desc=f"eval {task}",
            unit="ex",
            disable=not opts.progress,
        )
        reads_p_yes = get_task(task).reads_p_yes
        try:
            for start in range(0, len(todo), opts.batch_size):
                batch = todo[start : start + opts.batch_size]
                texts, p_yes = generate_batch(
                    loaded.model,
                    loaded.tokenizer,
                    [prompts[p.id] for p in batch],
                    opts.answer_budget(task),
                    reads_p_yes,
                )
                writer.write_batch(
                    [
                        Prediction(p.id, task, text, p_yes[i] if p_yes else None)
                        for i, (p, text) in enumerate(zip(batch, texts, strict=True))
                    ]
                )
                bar.update(len(batch))
        finally:
            bar.close()
            writer.close()
        summary[task] = {
            "total": len(pairs),
            "resumed": len(pairs) - len(todo),
            "generated": len(todo),
            "trimmed": n_trimmed,
        }
        record_generation(opts.predictions_dir, task, summary[task])
    return summary


def sample_pairs(pairs: list[Pair], limit: int | None, seed: int) -> list[Pair]:
    """A seeded random sample of `limit` pairs, in file order (all pairs when limit is None).

    Random rather than the first N because prepared files are grouped (the first QASem pairs
    are all CLIFF); seeded so that a rerun selects the same ids and resumes.
    """
    if limit is None or limit >= len(pairs):
        return pairs
    keep = sorted(random.Random(seed).sample(range(len(pairs)), limit))
    return [pairs[i] for i in keep]


def _model_window(loaded: LoadedModel, opts: EvalOptions) -> int | None:
    window = loaded.position_limit
    if not window:
        return None
    return window - max(opts.answer_budget(t) for t in opts.tasks)
