"""`fincheck eval`: a detector over prepared pairs, every output kept. One path, two backends:
the model loaded here (`LocalBackend`), or served behind an OpenAI-compatible endpoint (vLLM,
llama.cpp, `transformers serve`: `EndpointBackend`).

The model sees `messages[:-1]` (system + user) through the chat template with the generation
prompt, exactly as training rendered the prompt part. A task with a `first_word_share` also gets
its p_yes at the first answer position: QASem P(Yes)/(P(Yes)+P(No)), FINAL P(a list opens)
against P("None").
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fincheck.data.pairs import Pair, Prediction
from fincheck.errors import UsageError
from fincheck.eval.options import EvalOptions
from fincheck.eval.predictions import PredictionWriter, path_identity
from fincheck.eval.runner import Answerer, answer_tasks
from fincheck.inference.generation import (
    Fit,
    LoadedModel,
    answer_budgets,
    generate_batch,
    template_fingerprint,
)
from fincheck.inference.llm import CachedLLM, RequestCache, run_concurrently
from fincheck.inference.shared_prefix import answer_prompts, leaf_batches, walk_order
from fincheck.io.checksums import folder_sha256
from fincheck.io.runs import ADAPTER_WEIGHTS, adapter_sha256
from fincheck.io.secrets import public_url
from fincheck.models.llm_clients import METHOD, build_client, endpoint_url
from fincheck.models.loading import load_model, load_prompt_fitter, resolve_model
from fincheck.tasks import all_tasks, get_task, load_prompt
from fincheck.tasks.qasem.overlap import combined_p_yes, reads_qas


def run_eval(opts: EvalOptions) -> dict[str, dict[str, Any]]:
    """Predictions for every task; returns per-task counts (total, resumed, generated,
    trimmed, failed)."""
    tasks = list(opts.resolve_tasks())
    if opts.overlap_weight and not any(map(reads_qas, tasks)):
        raise UsageError(
            f"--overlap-weight combines a QA's P(Yes) with its answer's word overlap: none of "
            f"this run's tasks ({', '.join(tasks)}) has QAs; add qasem to --tasks, or leave it out"
        )
    backend_class = BACKENDS[opts.backend]
    identity = {
        "model": opts.model,
        "max_input_tokens": opts.max_input_tokens,
        "requested_max_new_tokens": dict(opts.max_new_tokens),
        "overlap_weight": opts.overlap_weight,  # QASem's combined system when not 0
        **backend_class.requested(opts),
    }
    return answer_tasks(opts, identity, tasks, lambda: DetectorPrompt(backend_class(opts), opts))


class DetectorPrompt(Answerer):
    """fincheck's own task prompt on a backend: each task's answer budget fixed once
    (`answer_budgets`: --max-new-tokens, else the task's default fitted to the window), each
    prompt fitted to the window less it, the rest answered batch by batch."""

    def __init__(self, backend: Backend, opts: EvalOptions) -> None:
        self.backend, self.opts = backend, opts
        self.llm = backend.llm
        self.window = backend.fitter and backend.fitter.window
        self.budgets = answer_budgets(all_tasks(), self.window, opts.max_new_tokens)

    def loaded(self) -> dict[str, Any]:
        budgets = {task: self.budgets[task] for task in self.opts.tasks}
        return {"max_new_tokens": budgets, "window": self.window, **self.backend.loaded()}

    def answer_task(
        self, task: str, pairs: list[Pair], todo: list[Pair], writer: PredictionWriter
    ) -> dict[str, Any]:
        from tqdm.auto import tqdm

        budget, opts = self.budgets[task], self.opts
        prompt, weight = load_prompt(task), opts.overlap_weight
        combine = weight != 0 and reads_qas(task)

        def fields(pair: Pair) -> dict[str, str]:
            return prompt.fields_of(pair.user_content, pair.meta.get("grounding_span"))

        # all of them: a resumed run counts the trimmed prompts it skips
        fits = {
            p.id: fit_pair(self.backend.fitter, p, budget, opts.max_input_tokens) for p in pairs
        }
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
            if combine:  # the combined system: the model's P(Yes) with the answer's overlap
                p_yes = [
                    combined_p_yes(y, fields(p), weight)
                    for p, y in zip(batch.pairs, p_yes, strict=True)
                ]
            rows = zip(batch.pairs, batch.texts, p_yes, cut, strict=True)
            writer.write_batch(
                [Prediction(p.id, task, t, y, cut="answer" if c else None) for p, t, y, c in rows]
            )
            bar.update(n)

        try:
            failed = self.backend.answer(task, todo, fits, budget, write)
        finally:
            bar.close()
        return {"trimmed": sum(fit.trimmed for fit in fits.values()), "failed": failed}


def fit_pair(fitter: LoadedModel | None, pair: Pair, budget: int, max_input: int | None) -> Fit:
    """A pair's prompt fitted to the window less its answer budget; without a fitter (a served
    model whose tokenizer is not given) the prompt goes whole. Unlike training, evaluation
    never drops an example: one that cannot fit stops the run (`PromptDoesNotFit`)."""
    span = pair.meta.get("grounding_span")
    if fitter is None:
        return Fit(list(pair.prompt_messages), "kept", 1.0, span=span and tuple(span))
    what = f"{pair.task}/{pair.id}"
    return fitter.fit_for_answer(pair.prompt_messages, span, budget, max_input, what)


# ---------------------------------------------------------------------- the two backends


@dataclass
class AnsweredBatch:
    """A batch of answers, in the order of `pairs`; `cut`: which hit the answer budget (None:
    the backend cannot tell)."""

    pairs: list[Pair]
    texts: list[str]
    p_yes: list[float | None] | None = None
    cut: list[bool | None] | None = None


Write = Callable[[AnsweredBatch], None]


class Backend(ABC):
    """Where the detector runs, as `DetectorPrompt` uses it."""

    fitter: LoadedModel | None  # fits its prompts: the model, the served one's tokenizer, or none
    llm: CachedLLM | None = None  # an endpoint's client and cache (None: the model is here)

    @staticmethod
    @abstractmethod
    def requested(opts: EvalOptions) -> dict[str, Any]:
        """What identifies the backend before it starts (checked against the folder's)."""

    @abstractmethod
    def loaded(self) -> dict[str, Any]:
        """What the backend turned out to be (recorded beside the predictions)."""

    @abstractmethod
    def answer(
        self, task: str, todo: list[Pair], fits: dict[str, Fit], budget: int, write: Write
    ) -> list[str]:
        """Answer `todo`, handing each batch to `write`; returns the failed examples."""


class LocalBackend(Backend):
    """The model (and its adapter) loaded here; prompts answered with every shared prefix run
    once (`--no-prefix-reuse`: plain left-padded batches)."""

    def __init__(self, opts: EvalOptions) -> None:
        self.opts = opts
        self.fitter: LoadedModel = load_model(opts.model, opts.adapter, opts)

    @staticmethod
    def requested(opts: EvalOptions) -> dict[str, Any]:
        return {
            "adapter": opts.adapter,
            "dtype": opts.dtype,
            "requested_template_kwargs": opts.template_kwargs,
            "prefix_reuse": opts.prefix_reuse,
        }

    def loaded(self) -> dict[str, Any]:
        return {
            "base": self.fitter.base,
            "chat_template_hash": self.fitter.check_template(),
            "chat_template_kwargs": self.fitter.template_kwargs,
            "adapter_sha256": self._adapter_sha256(),
            "adapter_content": folder_sha256(self.fitter.run.path) if self.fitter.run else None,
            "base_content": folder_sha256(resolve_model(self.fitter.base, log=lambda _: None)),
            "adapter_merged": self.fitter.adapter_merged,
        }

    def _adapter_sha256(self) -> str | None:
        """The evaluated adapter's weights, a fincheck run's or a bare PEFT folder's (a resume
        compares them: a folder retrained in place keeps its path, not its weights)."""
        if self.fitter.run is not None:
            return adapter_sha256(self.fitter.run.path)
        adapter = self.opts.adapter
        if adapter and (Path(adapter) / ADAPTER_WEIGHTS).is_file():
            return adapter_sha256(adapter)
        return None

    def answer(self, task: str, todo: list[Pair], fits: dict[str, Fit], budget: int, write: Write):
        """Batch by batch, each written before the next. The fast path answers each prefix the
        prompts share once (the task's instructions, a document several prompts are about),
        P(Yes) for a task that reads it from the first answer position. The plain path:
        length-sorted batches, greedy `generate`. Both run the longest batch first (an
        out-of-memory shows at once), the rest in a seeded random order (a steady ETA)."""
        model, tokenizer = self.fitter.model, self.fitter.tokenizer
        share, size = get_task(task).first_word_share, self.opts.batch_size
        prompts = [fits[p.id].text for p in todo]
        if self.opts.prefix_reuse:
            for a in answer_prompts(
                model, tokenizer, prompts, budget, batch_size=size, share=share
            ):
                write(AnsweredBatch([todo[i] for i in a.indices], a.texts, a.p_yes, a.cut))
            return []
        for positions in walk_order(leaf_batches([len(p) for p in prompts], size), []):
            batch = [prompts[k] for k in positions]
            texts, p_yes = generate_batch(model, tokenizer, batch, budget, share)
            write(AnsweredBatch([todo[k] for k in positions], texts, p_yes))
        return []


class EndpointBackend(Backend):
    """A served detector: fincheck's task prompts sent to the endpoint's --model, `concurrency`
    at a time behind a request cache (`OUT/llm_cache.jsonl`: a rerun asks nothing twice);
    P(Yes) from its logprobs when it returns them. `--tokenizer` fits the prompts as a local
    eval of the same model does (an adapter's run folder: its tokenizer, training length and
    template kwargs); without one they go whole, and the answers get the tasks' defaults."""

    def __init__(self, opts: EvalOptions) -> None:
        self.opts = opts
        self.client = build_client(opts, "openai", opts.model, METHOD)
        self.llm = CachedLLM(
            self.client, RequestCache(opts.out_dir / "llm_cache.jsonl"), {"temperature": 0.0}
        )
        self.fitter = load_prompt_fitter(opts.tokenizer, opts.window) if opts.tokenizer else None

    @staticmethod
    def requested(opts: EvalOptions) -> dict[str, Any]:
        url = endpoint_url(opts.base_url, METHOD)  # checked before it is recorded
        return {"base_url": public_url(url), "tokenizer": path_identity(opts.tokenizer)}

    def loaded(self) -> dict[str, Any]:
        return {
            "client": self.client.identity,
            "tokenizer_fingerprint": self.fitter and tokenizer_identity(self.fitter),
        }

    def answer(self, task: str, todo: list[Pair], fits: dict[str, Fit], budget: int, write: Write):
        """Each prompt answered as its own call, written as it comes; a call that fails for
        good fails its example (returned "id: reason"; a rerun asks again)."""
        version = f"fincheck-{task}-{load_prompt(task).hash}"
        share = get_task(task).first_word_share

        def ask(pair: Pair) -> AnsweredBatch:
            self.llm.start_example()
            messages = fits[pair.id].messages
            p_yes = self.llm.p_yes(messages, version, share=share) if share else None
            text = self.llm.ask(messages, version, max_tokens=budget)
            return AnsweredBatch([pair], [text], [p_yes], [self.llm.last_cut])

        return run_concurrently(
            todo,
            ask,
            self.opts.concurrency,
            lambda pair, answers: write(answers),
            progress=False,  # the eval's own bar counts what is written
            desc=task,
        )


def tokenizer_identity(fitter: LoadedModel) -> str:
    """What fits a served detector's prompts, by content: the tokenizer (a folder updated in
    place keeps its path), its chat template with the run's kwargs, the positions it allows."""
    tokenizer = fitter.tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", None)
    vocab = (
        backend.to_str()
        if backend is not None
        else json.dumps(tokenizer.get_vocab(), sort_keys=True)
    )
    parts = [
        vocab,
        template_fingerprint(tokenizer, fitter.template_kwargs),
        str(fitter.position_limit),
    ]
    return hashlib.sha256("\n".join(parts).encode("utf-8")).hexdigest()[:16]


BACKENDS: dict[str, type[Backend]] = {"local": LocalBackend, "openai": EndpointBackend}
