"""`Detector`: a trained adapter as a Python object with one method per task.

    detector = Detector.from_pretrained(adapter="checkpoints/tiny-cpu")
    detector.describe(text, summary)                     # FINAL: ["...", ...], [] = consistent
    detector.support(text, sentence, question, answer)   # QASem: p(Yes) in [0, 1]
    detector.classify(text, summary)                     # FHSumBench: no_hallu | factual_hallu |
                                                         #   non_factual_hallu | invalid

Every input goes through the pipeline training and evaluation use, so the model sees what it
was trained on:
  prompt file (`fincheck.prompting`) -> messages + grounding span
  -> `fincheck.eval.generate.fit_prompt`: a document too long for the window is cut at the end
     of its grounding text, at a word boundary, with data-prep's `trim_grounding` -- the cut
     training and evaluation use (with a warning here)
  -> chat template -> `fincheck.eval.generate.generate_batch`: greedy decoding with left
     padding, and p(Yes) = P(Yes) / (P(Yes) + P(No)) at the first generated position
  -> the eval parsers (`parse_descriptions`, `parse_judgement` + `judgement_to_label`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fincheck.errors import FincheckError
from fincheck.serve.artifacts import RunArtifacts, looks_like_hub_id

log = logging.getLogger(__name__)

# What each task's prompt needs (the placeholders of fincheck/prompts/<task>.txt).
TASK_FIELDS: dict[str, tuple[str, ...]] = {
    "final": ("text", "summary"),
    "qasem": ("text", "sentence", "question", "answer"),
    "fhsumbench": ("text", "summary"),
}
# Files fetched when the adapter is a hub repo (weights only as safetensors).
HUB_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.yaml", "base/*"]


@dataclass
class RawOutput:
    """What the model produced for one input, before parsing."""

    text: str
    p_yes: float | None
    trimmed: bool


class Detector:
    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        run: RunArtifacts | None = None,
        max_input_tokens: int | None = None,
        batch_size: int = 4,
        max_new_tokens: dict[str, int] | None = None,
    ) -> None:
        from fincheck.eval.generate import DEFAULT_MAX_NEW_TOKENS

        self.model = model
        self.tokenizer = tokenizer
        self.run = run
        self.batch_size = batch_size
        self.max_new_tokens = {**DEFAULT_MAX_NEW_TOKENS, **(max_new_tokens or {})}
        self.window = max_input_tokens or _window(model, run)
        tokenizer.padding_side = "left"  # generation continues from the right end of each row
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token

    @classmethod
    def from_pretrained(
        cls,
        base: str | None = None,
        adapter: str | Path | None = None,
        *,
        device: str | None = None,
        dtype: str | None = None,
        trust_remote_code: bool = False,
        **kwargs: Any,
    ) -> Detector:
        """Load `base` (default: the adapter's own base) plus the LoRA `adapter`.

        `adapter` is a run folder, an adapter folder or a hub repo id. Weights are read from
        safetensors only; the base's own Python code runs only with trust_remote_code=True.
        `dtype`: "bf16" | "fp16" | "fp32" (default bf16 on GPU, fp32 on CPU).
        """
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from fincheck.serve.merge import load_base_and_adapter

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}.get(
            dtype or ("fp32" if device == "cpu" else "bf16")
        )
        if torch_dtype is None:
            raise FincheckError(f"dtype {dtype!r}: expected bf16, fp16 or fp32")
        if adapter is None:
            if base is None:
                raise FincheckError("give an adapter (run folder or hub id), a base model, or both")
            model = AutoModelForCausalLM.from_pretrained(
                base, dtype=torch_dtype, use_safetensors=True, trust_remote_code=trust_remote_code
            ).to(device)
            tokenizer = AutoTokenizer.from_pretrained(base, trust_remote_code=trust_remote_code)
            return cls(model.eval(), tokenizer, None, **kwargs)
        adapter_dir = _local_adapter_dir(adapter)
        model, tokenizer, run = load_base_and_adapter(
            adapter_dir, base, torch_dtype, trust_remote_code, device
        )
        return cls(model, tokenizer, run, **kwargs)

    # -- the three tasks ---------------------------------------------------------------------

    def describe(self, text: str, summary: str) -> list[str]:
        """FINAL: one description per unsupported piece of `summary`; [] when consistent."""
        return self.describe_batch([(text, summary)])[0]

    def describe_batch(self, items: Sequence[tuple[str, str]]) -> list[list[str]]:
        from fincheck.eval.final_metrics import parse_descriptions

        outputs = self.generate(
            "final", [dict(zip(TASK_FIELDS["final"], i, strict=True)) for i in items]
        )
        return [parse_descriptions(o.text) for o in outputs]

    def support(self, text: str, sentence: str, question: str, answer: str) -> float:
        """QASem: p(Yes) that `text` supports the QA pair about `sentence` (>= 0.5: supported)."""
        return self.support_batch([(text, sentence, question, answer)])[0]

    def support_batch(self, items: Sequence[tuple[str, str, str, str]]) -> list[float]:
        outputs = self.generate(
            "qasem", [dict(zip(TASK_FIELDS["qasem"], i, strict=True)) for i in items]
        )
        return [float(o.p_yes) for o in outputs]  # type: ignore[arg-type]

    def classify(self, text: str, summary: str) -> str:
        """FHSumBench: no_hallu | factual_hallu | non_factual_hallu | invalid (unparseable)."""
        return self.classify_batch([(text, summary)])[0]

    def classify_batch(self, items: Sequence[tuple[str, str]]) -> list[str]:
        from fincheck.eval.fhsumbench_metrics import judgement_to_label, parse_judgement

        outputs = self.generate(
            "fhsumbench", [dict(zip(TASK_FIELDS["fhsumbench"], i, strict=True)) for i in items]
        )
        return [judgement_to_label(parse_judgement(o.text)) for o in outputs]

    # -- the shared path ---------------------------------------------------------------------

    def generate(self, task: str, records: Sequence[dict[str, str]]) -> list[RawOutput]:
        """Render, fit, generate, in batches; outputs in input order."""
        from fincheck.eval.generate import generate_batch

        budget = self.max_new_tokens[task]
        prompts, trimmed = [], []
        for record in records:
            prompt, was_trimmed = self.render(task, record, budget)
            prompts.append(prompt)
            trimmed.append(was_trimmed)
        outputs: list[RawOutput] = []
        for start in range(0, len(prompts), self.batch_size):
            batch = prompts[start : start + self.batch_size]
            texts, p_yes = generate_batch(
                self.model, self.tokenizer, batch, budget, task == "qasem"
            )
            for i, text in enumerate(texts):
                outputs.append(RawOutput(text, p_yes[i] if p_yes else None, trimmed[start + i]))
        return outputs

    def render(self, task: str, record: dict[str, str], budget: int) -> tuple[str, bool]:
        """The chat-formatted prompt for one input, trimmed on its grounding text to fit.

        The cut is `fincheck.eval.generate.fit_prompt`: data-prep's `trim_grounding` (end of the
        document, word boundary, " [...]" marker), the cut training applies, re-measured on the
        real chat template; like evaluation, an input is trimmed, never dropped.
        """
        from fincheck.eval.generate import fit_prompt
        from fincheck.pairs import Pair
        from fincheck.prompting import load_prompt

        missing = [f for f in TASK_FIELDS[task] if not isinstance(record.get(f), str)]
        if missing:
            raise FincheckError(f"{task}: missing text field(s) {missing}")
        messages, span = load_prompt(task).messages(**{f: record[f] for f in TASK_FIELDS[task]})
        pair = Pair(
            id=str(record.get("id", "")),
            task=task,
            split="test",
            # fit_prompt renders everything before the target: an empty answer stands in for it.
            messages=[*messages, {"role": "assistant", "content": ""}],
            meta={"grounding_span": list(span)},
        )
        max_tokens = None if self.window is None else self.window - budget  # room for the answer
        try:
            prompt, trimmed = fit_prompt(self.tokenizer, pair, max_tokens)
        except FincheckError:
            raise FincheckError(
                f"{task}: the instructions and {', '.join(TASK_FIELDS[task][1:])} alone exceed "
                f"the model's window of {self.window} tokens (with {budget} for the answer)"
            ) from None
        if trimmed:
            log.warning(
                "%s: document of %d characters trimmed to fit the model's window "
                "(%d tokens incl. %d for the answer)",
                task,
                span[1] - span[0],
                self.window,
                budget,
            )
        return prompt, trimmed


def _window(model: Any, run: RunArtifacts | None) -> int | None:
    """Tokens the model may see: the training length when the recipe records one, capped by
    the model's position limit."""
    limits = [getattr(model.config, "max_position_embeddings", None)]
    if run is not None:
        for key in ("max_length", "max_seq_length"):
            if isinstance(run.recipe.get(key), int):
                limits.append(run.recipe[key])
    limits = [n for n in limits if n]
    return min(limits) if limits else None


def _local_adapter_dir(adapter: str | Path) -> Path:
    """A local folder as is; a hub repo id is downloaded (safetensors and config files only)."""
    path = Path(adapter)
    if path.exists() or not looks_like_hub_id(str(adapter)):
        return path
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(str(adapter), allow_patterns=HUB_PATTERNS))
