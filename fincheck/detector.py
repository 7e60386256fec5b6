"""`Detector`: a trained adapter as a Python object with one method per task.

    detector = Detector.from_pretrained(adapter="checkpoints/tiny-cpu")
    detector.describe(text, summary)                     # FINAL: ["...", ...], [] = consistent
    detector.support(text, sentence, question, answer)   # QASem: p(Yes) in [0, 1]
    detector.classify(text, summary)                     # FHSumBench: no_hallu | factual_hallu |
                                                         #   non_factual_hallu | invalid
    detector.detect("qasem", [{"text": ..., "sentence": ..., "question": ..., "answer": ...}])
    # QASem's combined system: P(Yes) with the answer's word overlap (`fincheck.tasks.qasem.overlap`)
    Detector.from_pretrained(adapter=..., overlap_weight=0.5)

    # the same detector served (`fincheck export --gguf`, then llama.cpp's server on a CPU)
    served = Detector.from_endpoint("http://127.0.0.1:8080/v1", "served",
                                    tokenizer="checkpoints/tiny-cpu")

Every input goes through the path training and evaluation use, so the model sees what it was
trained on: the task's prompt file (`fincheck.data.prompting`) -> messages + grounding span ->
`fincheck.inference.generation.fit_messages` (a document too long for the window is cut at the end of its
grounding text, with a warning) -> `fincheck.inference.shared_prefix.answer_in_order` (greedy, every
prefix the inputs share run once, p(Yes) at the first answer position) -> the task's own reading
of the output (`Task.detect_output`). A served detector fits each prompt with the adapter's own
tokenizer and window the same way, and sends the fitted messages to the server instead (greedy;
p(Yes) and FINAL's flag score from its top logprobs, which it must return).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fincheck.errors import FincheckError
from fincheck.inference.generation import Fit, LoadedModel, answer_budgets
from fincheck.inference.llm import ChatClient, LLMCallError
from fincheck.inference.shared_prefix import answer_in_order
from fincheck.model_options import ModelOptions
from fincheck.models.loading import load_model, load_prompt_fitter
from fincheck.tasks import all_tasks, get_task, load_prompt
from fincheck.tasks.qasem.overlap import combined_p_yes

log = logging.getLogger(__name__)
DETECT_REMEDY = "lower --max-new-tokens, or raise --max-input-tokens up to the model's positions"


@dataclass
class RawOutput:
    """What the model produced for one input, before the task reads it."""

    text: str
    p_yes: float | None
    trimmed: bool


class Detector:
    def __init__(
        self,
        loaded: LoadedModel,
        max_input_tokens: int | None = None,
        batch_size: int = 4,
        max_new_tokens: dict[str, int] | None = None,
        thresholds: dict[str, float] | None = None,
        client: ChatClient | None = None,
        overlap_weight: float = 0.0,
    ) -> None:
        self.loaded = loaded
        self.client = client  # a served detector's endpoint (`from_endpoint`); None: local
        self.batch_size = batch_size
        # task -> a decision threshold on p_yes chosen on dev (QASem: supported at or above
        # it, not 0.5; FINAL: a list whose flag score is below it is held back)
        self.thresholds = dict(thresholds or {})
        # QASem's combined system (`fincheck.tasks.qasem.overlap`): 0, the detector alone
        self.overlap_weight = overlap_weight
        self.max_new_tokens = answer_budgets(all_tasks(), loaded.window, max_new_tokens)
        self.max_input_tokens = max_input_tokens  # prompt tokens at most (default: the window's)
        loaded.check_template()
        origin = str((loaded.run.metadata if loaded.run else {}).get("base_origin", ""))
        if origin.startswith("random-init"):
            log.warning(
                "this adapter sits on a random-init toy base (%s): its answers carry no meaning",
                loaded.base,
            )

    @property
    def window(self) -> int | None:
        return self.loaded.window

    @property
    def model(self):
        return self.loaded.model

    @property
    def tokenizer(self):
        return self.loaded.tokenizer

    @property
    def run(self):
        """The adapter's run folder (`fincheck.io.runs.RunArtifacts`), None for a bare base."""
        return self.loaded.run

    @classmethod
    def from_pretrained(
        cls,
        base: str | None = None,
        adapter: str | Path | None = None,
        options: ModelOptions | None = None,
        *,
        thresholds: dict[str, float] | None = None,
        **settings: Any,
    ) -> Detector:
        """Load `base` (default: the adapter's own base) plus the LoRA `adapter`, as `options`
        say (`fincheck detect`'s, whole), or the defaults with `settings` (its fields by name:
        device, dtype, window, batch_size, max_new_tokens, ...; a batch of 4 by default).

        `adapter` is a run folder, an adapter folder or a hub repo id. Weights are read from
        safetensors only; the base's own Python code runs only with trust_remote_code=True.
        `dtype`: auto | bf16 | fp16 | fp32 (default auto: bf16 on GPU, fp32 on CPU).
        """
        if adapter is None and base is None:
            raise FincheckError("give an adapter (run folder or hub id), a base model, or both")
        options = replace(options or ModelOptions(batch_size=4), **settings)
        loaded = load_model(base, adapter, options)
        budgets = options.max_new_tokens or None
        return cls(
            loaded,
            options.max_input_tokens,
            options.batch_size,
            budgets,
            thresholds,
            overlap_weight=options.overlap_weight,
        )

    @classmethod
    def from_endpoint(
        cls,
        base_url: str,
        model: str,
        tokenizer: str | Path,
        *,
        api_key_env: str | None = None,
        timeout_s: float | None = None,
        max_retries: int | None = None,
        window: int | None = None,
        **kwargs: Any,
    ) -> Detector:
        """A served detector: `model` at the OpenAI-compatible `base_url` (llama.cpp's server
        on a `fincheck export --gguf` file, or vLLM), its prompts fitted by `tokenizer`, the
        adapter's run folder (its tokenizer, training window and chat template kwargs), so the
        server sees what the local detector would run. The endpoint options are `fincheck
        eval --backend openai`'s (key from $OPENAI_API_KEY or `api_key_env`; a local server
        needs none)."""
        from fincheck.models import llm_clients

        loaded = load_prompt_fitter(str(tokenizer), window)
        settings = {"api_key_env": api_key_env, "timeout_s": timeout_s, "max_retries": max_retries}
        client = llm_clients.OpenAIChatClient(
            model,
            base_url,
            caller=llm_clients.SERVED_DETECTOR,
            **{k: v for k, v in settings.items() if v is not None},
        )
        return cls(loaded, client=client, **kwargs)

    # -- the three tasks ---------------------------------------------------------------------

    def describe(self, text: str, summary: str) -> list[str]:
        """FINAL: one description per unsupported piece of `summary`; [] when consistent."""
        return self.describe_batch([(text, summary)])[0]

    def describe_batch(self, items: Sequence[tuple[str, str]]) -> list[list[str]]:
        return [r["descriptions"] for r in self.detect("final", _records("final", items))]

    def support(self, text: str, sentence: str, question: str, answer: str) -> float:
        """QASem: p(Yes) that `text` supports the QA pair about `sentence` (>= 0.5: supported)."""
        return self.support_batch([(text, sentence, question, answer)])[0]

    def support_batch(self, items: Sequence[tuple[str, str, str, str]]) -> list[float]:
        return [float(r["p_yes"]) for r in self.detect("qasem", _records("qasem", items))]

    def classify(self, text: str, summary: str) -> str:
        """FHSumBench: no_hallu | factual_hallu | non_factual_hallu | invalid (unparseable)."""
        return self.classify_batch([(text, summary)])[0]

    def classify_batch(self, items: Sequence[tuple[str, str]]) -> list[str]:
        return [r["label"] for r in self.detect("fhsumbench", _records("fhsumbench", items))]

    # -- the shared path ---------------------------------------------------------------------

    def detect(self, task: str, records: Sequence[dict[str, str]]) -> list[dict[str, Any]]:
        """The task's reading of the model's answer for each record, in input order. With an
        overlap weight, QASem's p_yes is the combined score and `p_detector` the model's own."""
        reader, weight = get_task(task), self.overlap_weight
        results = []
        for record, o in zip(records, self.generate(task, records), strict=True):
            p_yes = combined_p_yes(o.p_yes, record, weight)
            out = reader.detect_output(o.text, p_yes, self.thresholds.get(task))
            if weight and "answer" in record:
                out["p_detector"] = o.p_yes
            results.append({**out, "trimmed": o.trimmed, "raw": o.text})
        return results

    def generate(self, task: str, records: Sequence[dict[str, str]]) -> list[RawOutput]:
        """Render, fit, generate, in batches; outputs in input order."""
        budget = self.max_new_tokens[task]
        if self.client is not None:
            return [self._ask(task, self.fit(task, record, budget), budget) for record in records]
        rendered = [self.render(task, record, budget) for record in records]  # (prompt, trimmed)
        answers = answer_in_order(
            self.model,
            self.tokenizer,
            [prompt for prompt, _ in rendered],
            budget,
            batch_size=self.batch_size,
            share=get_task(task).first_word_share,
        )
        return [
            RawOutput(text, answers.p_yes[i] if answers.p_yes else None, rendered[i][1])
            for i, text in enumerate(answers.texts)
        ]

    def _ask(self, task: str, fit: Fit, budget: int) -> RawOutput:
        """One input from the server: its score from the first answer token's top logprobs,
        then its greedy answer (the prompt is in the server's cache by then)."""
        share = get_task(task).first_word_share
        try:
            p_yes = self.client.p_yes(fit.messages, share=share) if share else None
            if share and p_yes is None and self.client.without_logprobs:
                raise FincheckError(
                    f"{self.client.where} returns no logprobs: a served detector reads {task}'s "
                    "score from them. Serve the export with llama.cpp (llama-server -m "
                    "FILE.gguf -fa off, or python -m llama_cpp.server --model FILE.gguf) or vLLM "
                    "(--max-logprobs 20)"
                )
            sampling = {"temperature": 0.0, "max_tokens": budget}
            text = self.client.complete(fit.messages, sampling).text
        except LLMCallError as error:
            raise FincheckError(f"{self.client.where}: {error}") from None
        return RawOutput(text, p_yes, fit.trimmed)

    def render(self, task: str, record: dict[str, str], budget: int) -> tuple[str, bool]:
        """The chat-formatted prompt for one input, trimmed on its grounding text to fit the
        window minus the answer budget; like evaluation, an input is trimmed, never dropped."""
        fit = self.fit(task, record, budget)
        return fit.text, fit.trimmed

    def fit(self, task: str, record: dict[str, str], budget: int) -> Fit:
        """One input's prompt fitted: messages and text (`render`)."""
        fields = load_prompt(task).fields
        if missing := [f for f in fields if not isinstance(record.get(f), str)]:
            raise FincheckError(f"{task}: missing text field(s) {missing}")
        messages, span = load_prompt(task).messages(**{f: record[f] for f in fields})
        fit = self.loaded.fit_for_answer(
            messages, span, budget, self.max_input_tokens, task, DETECT_REMEDY
        )
        if fit.trimmed:
            log.warning(
                "%s: document of %d characters trimmed to fit %d prompt tokens "
                "(the window %s minus %d for the answer)",
                task,
                span[1] - span[0],
                fit.budget,
                self.window,
                budget,
            )
        return fit


def _records(task: str, items: Sequence[Sequence[str]]) -> list[dict[str, str]]:
    fields = load_prompt(task).fields
    return [dict(zip(fields, item, strict=True)) for item in items]
