"""`fincheck eval`: run a model (optionally + LoRA adapter) over prepared pairs, keep every output.

For each task: read `DATA/<task>/<split>.jsonl`, skip ids already in
`RUN/predictions/<task>.jsonl` (resume), fit each prompt to the window
(`fincheck.inference.fit_messages`), answer greedily (`answer_batches`: shared prefixes run
once by default, plain left-padded batches with `--no-prefix-reuse`), and append one line per
example, flushed per batch. A task that `reads_p_yes` (QASem) also gets
p_yes = P(Yes)/(P(Yes)+P(No)) at the first generated position.

The model sees `messages[:-1]` (system + user) through the tokenizer's chat template with
`add_generation_prompt=True`, exactly as training rendered the prompt part.
"""

from __future__ import annotations

from pathlib import Path

from fincheck.errors import FincheckError
from fincheck.eval.options import EvalOptions, EvalRun
from fincheck.eval.predictions import (
    PredictionWriter,
    check_eval_config,
    record_generation,
    record_loaded,
)
from fincheck.inference import fit_messages, generate_batch
from fincheck.loading import load_model, local_adapter_dir
from fincheck.pairs import Pair, Prediction, sample
from fincheck.prepared import read_manifest, read_split
from fincheck.runs import ADAPTER_WEIGHTS, adapter_sha256, load_run
from fincheck.shared_prefix import answer_prompts, leaf_batches, walk_order
from fincheck.tasks import get_task


def resolve_base_model(model: str | None, adapter: str | None) -> str:
    """--model, or the base the adapter's run recorded."""
    if model:
        return model
    if adapter:
        return load_run(local_adapter_dir(adapter)).resolve_base()  # a hub id is fetched first
    raise FincheckError(
        "give --model (a base model name or path), or an --adapter that records its base"
    )


def fit_prompt(
    tokenizer, pair: Pair, max_tokens: int | None, template_kwargs: dict | None = None
) -> tuple[str, bool]:
    """The rendered prompt of a pair, its grounding text cut to fit `max_tokens`.
    Returns (prompt, trimmed?). Unlike training, evaluation never drops an example."""
    fit = fit_messages(
        tokenizer,
        pair.prompt_messages,
        pair.meta.get("grounding_span"),
        max_tokens,
        add_generation_prompt=True,
        template_kwargs=template_kwargs,
    )
    if fit.text is None:
        raise FincheckError(
            f"{pair.task}/{pair.id}: the prompt does not fit in {max_tokens} tokens even without "
            "its grounding text; raise --max-input-tokens"
        )
    return fit.text, fit.trimmed


def _adapter_sha256(loaded, adapter: str | None) -> str | None:
    """The evaluated adapter's weights, a fincheck run's or a bare PEFT folder's (a resume into
    the same --out compares them: a folder retrained in place keeps its path, not its weights)."""
    if loaded.run is not None:
        return adapter_sha256(loaded.run.path)
    if adapter and (Path(adapter) / ADAPTER_WEIGHTS).is_file():
        return adapter_sha256(adapter)
    return None


def run_eval(opts: EvalOptions) -> dict[str, dict[str, int]]:
    """Generate predictions for every task; returns per-task counts (done before, new, trimmed)."""
    from tqdm.auto import tqdm

    opts.model = resolve_base_model(opts.model, opts.adapter)
    opts.resolve_tasks()
    check_eval_config(
        opts.predictions_dir,
        {
            "model": opts.model,
            "adapter": opts.adapter,
            "split": opts.split,
            "limit": opts.limit,
            "sample_seed": opts.sample_seed,
            "max_input_tokens": opts.max_input_tokens,
            "requested_window": opts.window,  # the loaded model's own is recorded as "window"
            "tasks": list(opts.tasks),
            "sample_by": sample_by(opts.tasks),
            "data_fingerprint": read_manifest(opts.data_dir).get("fingerprint"),
            "requested_max_new_tokens": dict(opts.max_new_tokens),
            "dtype": opts.dtype,
            "requested_template_kwargs": opts.template_kwargs,
            "prefix_reuse": opts.prefix_reuse,
        },
    )
    task_pairs = {
        task: sample_task(read_split(opts.data_dir, task, opts.split), task, opts)
        for task in opts.tasks
    }
    loaded = load_model(
        opts.model,
        opts.adapter,
        dtype=opts.dtype,
        device=opts.device,
        template_kwargs=opts.template_kwargs,
        trust_remote_code=opts.trust_remote_code,
        window=opts.window,
    )
    record_loaded(
        opts.predictions_dir,
        chat_template_hash=loaded.check_template(),
        chat_template_kwargs=loaded.template_kwargs,
        adapter_sha256=_adapter_sha256(loaded, opts.adapter),
        max_new_tokens={t: opts.answer_budget(t, loaded) for t in opts.tasks},
        window=loaded.window,
        adapter_merged=loaded.adapter_merged,
        prefix_reuse=opts.prefix_reuse,
    )
    summary: dict[str, dict[str, int]] = {}
    for task, pairs in task_pairs.items():
        writer = PredictionWriter(opts.predictions_dir / f"{task}.jsonl", task)
        todo = [p for p in pairs if p.id not in writer.done]
        budget = loaded.prompt_budget(opts.answer_budget(task, loaded), opts.max_input_tokens)
        prompts, n_trimmed = {}, 0
        for pair in pairs:  # all of them: a resumed run counts the trimmed prompts it skips
            prompt, trimmed = fit_prompt(loaded.tokenizer, pair, budget, loaded.template_kwargs)
            if pair.id not in writer.done:
                prompts[pair.id] = prompt
            n_trimmed += trimmed
        bar = tqdm(
            total=len(pairs),
            initial=len(pairs) - len(todo),
            desc=f"eval {task}",
            unit="ex",
            disable=not opts.progress,
            # batches come in a seeded random order (`walk_order`): the mean rate gives the ETA
            smoothing=0.0,
        )
        try:
            for batch, texts, p_yes, cut in answer_batches(loaded, task, todo, prompts, opts):
                p_yes, cut = p_yes or [None] * len(batch), cut or [False] * len(batch)
                rows = zip(batch, texts, p_yes, cut, strict=True)
                writer.write_batch(
                    [
                        Prediction(p.id, task, t, y, cut="answer" if c else None)
                        for p, t, y, c in rows
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


def answer_batches(loaded, task: str, todo: list[Pair], prompts: dict[str, str], opts: EvalOptions):
    """(pairs, texts, p_yes or None, cut or None) batch by batch, each batch written before the
    next; `cut` says which answers hit the answer budget (the plain path does not tell).

    The fast path (default): `fincheck.shared_prefix.answer_prompts` runs each prefix that
    prompts share once (the task's instructions, a document several prompts are about) and
    every prompt's own suffix from a copy of its KV cache; P(Yes) for a task that reads it
    (QASem) from the first answer position, its text decoded only past a first token that is
    not Yes or No. `--no-prefix-reuse` takes the plain path: length-sorted batches, left
    padding, greedy `generate`, P(Yes) from the same first position. Both run the longest batch
    first (an out-of-memory shows at once) and the rest in a seeded random order (`walk_order`),
    which keeps the progress bar's rate steady and its ETA right.
    """
    budget = opts.answer_budget(task, loaded)
    reads_p_yes = get_task(task).reads_p_yes
    if opts.prefix_reuse:
        for answers in answer_prompts(
            loaded.model,
            loaded.tokenizer,
            [prompts[p.id] for p in todo],
            budget,
            batch_size=opts.batch_size,
            want_p_yes=reads_p_yes,
        ):
            yield [todo[i] for i in answers.indices], answers.texts, answers.p_yes, answers.cut
        return
    for positions in walk_order(
        leaf_batches([len(prompts[p.id]) for p in todo], opts.batch_size), []
    ):
        batch = [todo[k] for k in positions]
        texts, p_yes = generate_batch(
            loaded.model, loaded.tokenizer, [prompts[p.id] for p in batch], budget, reads_p_yes
        )
        yield batch, texts, p_yes, None


def sample_by(tasks) -> dict[str, str]:
    """How --limit samples each task: whole documents where the task says so (QASem), else
    pairs."""
    return {t: "documents" if get_task(t).limit_by_document else "pairs" for t in tasks}


def sample_task(pairs: list[Pair], task: str, run: EvalRun) -> list[Pair]:
    """The run's sample of a task's pairs: `--limit` of them drawn with `--sample-seed`, as
    whole documents for a task that shares them (QASem: a sample keeps the tree's speed)."""
    return sample(pairs, run.limit_for(task), run.sample_seed, get_task(task).limit_by_document)
