"""Where `fincheck eval`'s detector runs: here (a model and its adapter, `LocalBackend`) or
behind an OpenAI-compatible endpoint (vLLM, llama.cpp, `transformers serve`: `EndpointBackend`).

A backend says what identifies it before it starts (`requested`: a resume under other values is
refused before a model loads), what it turned out to be (`loaded`), which `LoadedModel` fits
its prompts (`fitter`: the model itself, the served model's tokenizer, or None: prompts sent
whole), and answers fitted prompts. Everything else, each task's budget, the fitting, the
predictions, resume, cut marking and the counts, is the one path of `fincheck.eval.generate`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fincheck.eval.llm import CachedLLM, RequestCache, run_concurrently
from fincheck.eval.llm_backends import METHOD, build_client
from fincheck.eval.options import EvalOptions
from fincheck.inference import (
    Fit,
    LoadedModel,
    generate_batch,
    load_model,
    load_prompt_fitter,
    template_fingerprint,
)
from fincheck.pairs import Pair
from fincheck.prompting import load_prompt
from fincheck.runs import ADAPTER_WEIGHTS, adapter_sha256
from fincheck.shared_prefix import answer_prompts, leaf_batches, walk_order
from fincheck.tasks import get_task


@dataclass
class AnsweredBatch:
    """A batch of answers, in the order of `pairs`; `cut`: which hit the answer budget (None:
    the backend cannot tell)."""

    pairs: list[Pair]
    texts: list[str]
    p_yes: list[float | None] | None = None
    cut: list[bool | None] | None = None


Write = Callable[[AnsweredBatch], None]


class LocalBackend:
    """The model (and its adapter) loaded here; prompts answered with every shared prefix run
    once (`--no-prefix-reuse`: plain left-padded batches)."""

    def __init__(self, opts: EvalOptions) -> None:
        self.opts = opts
        self.fitter: LoadedModel = load_model(
            opts.model,
            opts.adapter,
            dtype=opts.dtype,
            device=opts.device,
            template_kwargs=opts.template_kwargs,
            trust_remote_code=opts.trust_remote_code,
            window=opts.window,
        )

    @staticmethod
    def requested(opts: EvalOptions) -> dict[str, Any]:
        return {
            "adapter": opts.adapter,
            "dtype": opts.dtype,
            "requested_template_kwargs": opts.template_kwargs,
            "prefix_reuse": opts.prefix_reuse,
        }

    def loaded(self) -> dict[str, Any]:
        loaded = self.fitter
        return {
            "base": loaded.base,
            "chat_template_hash": loaded.check_template(),
            "chat_template_kwargs": loaded.template_kwargs,
            "adapter_sha256": self._adapter_sha256(),
            "adapter_merged": loaded.adapter_merged,
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
        reads_p_yes, size = get_task(task).reads_p_yes, self.opts.batch_size
        prompts = [fits[p.id].text for p in todo]
        if self.opts.prefix_reuse:
            for a in answer_prompts(
                model, tokenizer, prompts, budget, batch_size=size, want_p_yes=reads_p_yes
            ):
                write(AnsweredBatch([todo[i] for i in a.indices], a.texts, a.p_yes, a.cut))
            return []
        for positions in walk_order(leaf_batches([len(p) for p in prompts], size), []):
            batch = [prompts[k] for k in positions]
            texts, p_yes = generate_batch(model, tokenizer, batch, budget, reads_p_yes)
            write(AnsweredBatch([todo[k] for k in positions], texts, p_yes))
        return []


class EndpointBackend:
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
        tokenizer = opts.tokenizer
        if tokenizer and Path(tokenizer).exists():
            tokenizer = str(Path(tokenizer).resolve())
        return {"backend": "openai", "base_url": opts.base_url, "tokenizer": tokenizer}

    def loaded(self) -> dict[str, Any]:
        fitter = self.fitter
        return {
            "client": self.client.identity,
            "tokenizer_fingerprint": fitter and tokenizer_identity(fitter),
        }

    def answer(self, task: str, todo: list[Pair], fits: dict[str, Fit], budget: int, write: Write):
        """Each prompt answered as its own call, written as it comes; a call that fails for
        good fails its example (returned "id: reason"; a rerun asks again)."""
        version = f"fincheck-{task}-{load_prompt(task).hash}"
        reads_p_yes = get_task(task).reads_p_yes

        def ask(pair: Pair) -> AnsweredBatch:
            self.llm.start_example()
            messages = fits[pair.id].messages
            p_yes = self.llm.p_yes(messages, version) if reads_p_yes else None
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

    def served_models(self) -> list[str]:
        """The model names the replies carried (a router may serve another than the one asked)."""
        return sorted(self.client.served_models)


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


BACKENDS = {"local": LocalBackend, "openai": EndpointBackend}
