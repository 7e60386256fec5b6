"""`fincheck eval`: a detector over prepared pairs, every output kept. One path, two backends
(`fincheck.eval.backends`): the model loaded here, or served behind an OpenAI-compatible
endpoint.

    the run's identity checked against the folder's (a resume under other settings stops)
 -> the backend: the model loaded (or the endpoint's client and the tokenizer that fits for it)
 -> each task's answer budget, once (`answer_budgets`: --max-new-tokens, else the task's
    default fitted to the window)
 -> per task: the sample (`--limit`), each prompt fitted (`LoadedModel.fit_for_answer`: its
    grounding text cut to the window less the answer budget), the ids already predicted
    skipped (resume), the rest answered and appended, flushed per batch.

The model sees `messages[:-1]` (system + user) through the chat template with the generation
prompt, exactly as training rendered the prompt part. A task that `reads_p_yes` (QASem) also
gets p_yes = P(Yes)/(P(Yes)+P(No)) at the first answer position.
"""

from __future__ import annotations

from typing import Any

from fincheck.detector import answer_budgets
from fincheck.eval.backends import BACKENDS, AnsweredBatch
from fincheck.eval.options import EvalOptions
from fincheck.eval.predictions import (
    PredictionWriter,
    check_eval_config,
    record_generation,
    record_loaded,
)
from fincheck.inference import Fit, LoadedModel
from fincheck.pairs import Pair, Prediction
from fincheck.prepared import read_manifest


def run_eval(opts: EvalOptions) -> dict[str, dict[str, Any]]:
    """Predictions for every task; returns per-task counts (total, resumed, generated,
    trimmed, failed)."""
    opts.resolve_tasks()
    backend_class = BACKENDS[opts.backend]
    check_eval_config(
        opts.predictions_dir,
        {
            "model": opts.model,
            "split": opts.split,
            "limit": opts.limit,
            "sample_seed": opts.sample_seed,
            "max_input_tokens": opts.max_input_tokens,
            "requested_window": opts.window,  # the one the model turns out to have: "window"
            "tasks": list(opts.tasks),
            "sample_by": opts.sample_by(opts.tasks),
            "data_fingerprint": read_manifest(opts.data_dir).get("fingerprint"),
            "requested_max_new_tokens": dict(opts.max_new_tokens),
            **backend_class.requested(opts),
        },
    )
    task_pairs = {task: opts.sample(task) for task in opts.tasks}
    backend = backend_class(opts)
    fitter = backend.fitter
    window = fitter and fitter.window
    budgets = answer_budgets(window, opts.max_new_tokens)
    budgets = {task: budgets[task] for task in opts.tasks}
    record_loaded(opts.predictions_dir, max_new_tokens=budgets, window=window, **backend.loaded())
    summary: dict[str, dict[str, Any]] = {}
    for task, pairs in task_pairs.items():
        summary[task] = eval_task(backend, task, pairs, budgets[task], opts)
        record_generation(opts.predictions_dir, task, summary[task])
    if hasattr(backend, "served_models"):
        record_loaded(opts.predictions_dir, served_models=backend.served_models())
    return summary


def eval_task(backend, task: str, pairs: list[Pair], budget: int, opts: EvalOptions) -> dict:
    """One task: its prompts fitted, those not predicted yet answered and appended."""
    from tqdm.auto import tqdm

    writer = PredictionWriter(opts.predictions_dir / f"{task}.jsonl", task)
    todo = [p for p in pairs if p.id not in writer.done]
    # all of them: a resumed run counts the trimmed prompts it skips
    fits = {p.id: fit_pair(backend.fitter, p, budget, opts.max_input_tokens) for p in pairs}
    bar = tqdm(
        total=len(pairs),
        initial=len(pairs) - len(todo),
        desc=f"eval {task}",
        unit="ex",
        disable=not opts.progress,
        smoothing=0.0,  # batches come in a seeded random order: the mean rate gives the ETA
    )

    def write(batch: AnsweredBatch) -> None:
        n = len(batch.pairs)
        p_yes, cut = batch.p_yes or [None] * n, batch.cut or [None] * n
        rows = zip(batch.pairs, batch.texts, p_yes, cut, strict=True)
        writer.write_batch(
            [Prediction(p.id, task, t, y, cut="answer" if c else None) for p, t, y, c in rows]
        )
        bar.update(n)

    try:
        failed = backend.answer(task, todo, fits, budget, write)
    finally:
        bar.close()
        writer.close()
    return {
        "total": len(pairs),
        "resumed": len(pairs) - len(todo),
        "generated": len(todo) - len(failed),
        "trimmed": sum(fit.trimmed for fit in fits.values()),
        "failed": failed,
    }


def fit_pair(fitter: LoadedModel | None, pair: Pair, budget: int, max_input: int | None) -> Fit:
    """A pair's prompt fitted to the window less its answer budget; without a fitter (a served
    model whose tokenizer is not given) the prompt goes whole. Unlike training, evaluation
    never drops an example: one that cannot fit stops the run (`PromptDoesNotFit`)."""
    span = pair.meta.get("grounding_span")
    if fitter is None:
        return Fit(list(pair.prompt_messages), "kept", 1.0, span=span and tuple(span))
    what = f"{pair.task}/{pair.id}"
    return fitter.fit_for_answer(pair.prompt_messages, span, budget, max_input, what)
