"""`fincheck eval`: run a model (optionally + LoRA adapter) over prepared pairs, keep every output.

For each task: read `DATA/<task>/<split>.jsonl`, skip ids already in
`RUN/predictions/<task>.jsonl` (resume), sort the rest by prompt length (longest first, so an
out-of-memory shows up in the first batch, and batches hold similar lengths), generate greedily
with left padding, and append one line per example, flushed per batch.

The model sees `messages[:-1]` (system + user) through the tokenizer's chat template with
`add_generation_prompt=True`, exactly as training rendered the prompt part.

QASem also gets p_yes = P(Yes)/(P(Yes)+P(No)) at the first generated position. The answer words
are scored in several spellings ("Yes", " Yes", "yes", " yes"; same for No) because tokenizers
differ on the leading space; when a spelling is one token its probability is read from the
first-position logits, when it spans several tokens the sequence probability is computed by a
teacher-forced forward pass (product of the per-token probabilities).
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fincheck.errors import FincheckError
from fincheck.eval.predictions import Prediction, PredictionWriter
from fincheck.pairs import TASKS, Pair, read_pairs

DEFAULT_MAX_NEW_TOKENS = {"final": 384, "qasem": 8, "fhsumbench": 96}
YES_SPELLINGS = ("Yes", " Yes", "yes", " yes")
NO_SPELLINGS = ("No", " No", "no", " no")


@dataclass
class EvalOptions:
    model: str
    data_dir: Path
    out_dir: Path
    adapter: str | None = None
    tasks: tuple[str, ...] = TASKS
    split: str = "test"
    limit: int | None = None
    sample_seed: int = 0
    batch_size: int = 8
    max_new_tokens: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_MAX_NEW_TOKENS))
    max_input_tokens: int | None = None
    device: str | None = None
    dtype: str = "auto"
    progress: bool = True

    @property
    def predictions_dir(self) -> Path:
        return self.out_dir / "predictions"


def resolve_base_model(model: str | None, adapter: str | None) -> str:
    """--model, or the base the adapter's run recorded."""
    if model:
        return model
    if adapter:
        from fincheck.train.checkpoints import resolve_adapter_base

        return resolve_adapter_base(adapter)
    raise FincheckError(
        "give --model (a base model name or path), or an --adapter that records its base"
    )


def load_model(opts: EvalOptions):
    """(model, tokenizer) ready for batched greedy generation (left padding, eval mode)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = opts.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if opts.dtype == "auto":
        dtype = (
            torch.bfloat16
            if device.startswith("cuda") and torch.cuda.is_bf16_supported()
            else torch.float32
        )
    else:
        dtype = getattr(torch, opts.dtype)
    if opts.adapter:
        from fincheck.train.checkpoints import load_adapter_model

        model, tokenizer = load_adapter_model(opts.adapter, opts.model, dtype)
    else:
        try:
            tokenizer = AutoTokenizer.from_pretrained(opts.model)
            model = AutoModelForCausalLM.from_pretrained(opts.model, dtype=dtype)
        except OSError as e:
            raise FincheckError(f"cannot load model {opts.model!r}: {e}") from None
    if tokenizer.chat_template is None:
        raise FincheckError(f"the tokenizer of {opts.adapter or opts.model} has no chat template")
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.to(device).eval()
    return model, tokenizer


def render_prompt(tokenizer, pair: Pair) -> str:
    return tokenizer.apply_chat_template(
        pair.prompt_messages, tokenize=False, add_generation_prompt=True
    )


def fit_prompt(tokenizer, pair: Pair, max_tokens: int | None) -> tuple[str, bool]:
    """The rendered prompt, with the grounding text cut (never the instructions, summary or
    question) until it fits in max_tokens. Returns (prompt, trimmed?).

    The cut is data-prep's `trim_grounding` (word boundary + " [...]" marker), the one training
    uses, re-measured on the real chat template and cut further while tokens merge across the
    boundary. Unlike training, evaluation never drops an example: it trims and counts.
    """
    from fincheck.data_prep.trimming import pair_text, trim_grounding

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    text = render_prompt(tokenizer, pair)
    if max_tokens is None or count(text) <= max_tokens:
        return text, False
    if "grounding_span" not in pair.meta:
        raise FincheckError(
            f"{pair.task}/{pair.id}: prompt longer than {max_tokens} tokens and no grounding_span to trim"
        )
    prompt_pair = dataclasses.replace(pair, messages=pair.prompt_messages)
    overhead = count(text) - count(pair_text(prompt_pair))  # what the chat template adds
    budget = max_tokens
    for _ in range(8):
        trimmed, _ = trim_grounding(prompt_pair, budget, count, overhead)
        if trimmed is None:
            break
        text = tokenizer.apply_chat_template(
            trimmed.messages, tokenize=False, add_generation_prompt=True
        )
        excess = count(text) - max_tokens
        if excess <= 0:
            return text, True
        budget -= excess
    raise FincheckError(
        f"{pair.task}/{pair.id}: the prompt does not fit in {max_tokens} tokens even without its "
        "grounding text; raise --max-input-tokens"
    )


def answer_spellings(tokenizer, words: Sequence[str]) -> list[tuple[int, ...]]:
    """Distinct token sequences of the answer word's spellings."""
    seqs: list[tuple[int, ...]] = []
    for word in words:
        ids = tuple(tokenizer(word, add_special_tokens=False)["input_ids"])
        if ids and ids not in seqs:
            seqs.append(ids)
    return seqs


def sequence_probs(model, input_ids, attention_mask, first_logits, spellings) -> Any:
    """P(spelling | prompt) for each spelling, summed: a (batch,) tensor.

    Single-token spellings read `first_logits` (the first generated position); longer ones are
    teacher-forced: the prompt plus the spelling's tokens in one forward pass. Position ids skip
    the left padding (RoPE models would not notice a constant shift; absolute-position models
    would).
    """
    import torch

    first_probs = torch.softmax(first_logits.float(), dim=-1)
    total = torch.zeros(first_probs.shape[0], device=first_probs.device)
    for seq in spellings:
        prob = first_probs[:, seq[0]]
        if len(seq) > 1:
            tail = torch.tensor(seq, device=input_ids.device).expand(input_ids.shape[0], -1)
            ids = torch.cat([input_ids, tail], dim=1)
            mask = torch.cat([attention_mask, torch.ones_like(tail)], dim=1)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            with torch.no_grad():
                logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
            n_prompt = input_ids.shape[1]
            for k in range(1, len(seq)):
                step = torch.softmax(logits[:, n_prompt + k - 1].float(), dim=-1)
                prob = prob * step[:, seq[k]]
        total = total + prob
    return total


def greedy_config(model, tokenizer, max_new_tokens: int, want_logits: bool):
    """Plain greedy decoding. A fresh config, not the model's generation_config: instruct models
    ship sampling settings and a repetition penalty (Qwen2.5: 1.05) that would change the
    outputs; only the stop tokens are taken from it."""
    from transformers import GenerationConfig

    eos = getattr(model.generation_config, "eos_token_id", None) or tokenizer.eos_token_id
    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        num_beams=1,
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id,
        return_dict_in_generate=True,
        output_logits=want_logits,
    )


def generate_batch(model, tokenizer, prompts: list[str], max_new_tokens: int, want_p_yes: bool):
    """Greedy outputs for a batch of rendered prompts, and p_yes per prompt when asked."""
    import torch

    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(
        model.device
    )
    with torch.no_grad():
        out = model.generate(
            **enc, generation_config=greedy_config(model, tokenizer, max_new_tokens, want_p_yes)
        )
    new_tokens = out.sequences[:, enc["input_ids"].shape[1] :]
    texts = [t.strip() for t in tokenizer.batch_decode(new_tokens, skip_special_tokens=True)]
    p_yes = None
    if want_p_yes:
        first = out.logits[0]
        yes = sequence_probs(
            model,
            enc["input_ids"],
            enc["attention_mask"],
            first,
            answer_spellings(tokenizer, YES_SPELLINGS),
        )
        no = sequence_probs(
            model,
            enc["input_ids"],
            enc["attention_mask"],
            first,
            answer_spellings(tokenizer, NO_SPELLINGS),
        )
        p_yes = (yes / (yes + no).clamp(min=1e-30)).tolist()
    return texts, p_yes


def run_eval(opts: EvalOptions) -> dict[str, dict[str, int]]:
    """Generate predictions for every task; returns per-task counts (done before, new, trimmed)."""
    from tqdm.auto import tqdm

    _check_run_config(opts)
    task_pairs = {}
    for task in opts.tasks:
        path = opts.data_dir / task / f"{opts.split}.jsonl"
        if not path.exists():
            raise FincheckError(f"{task}: {path} not found (run `fincheck prepare` first?)")
        pairs = list(read_pairs(path))
        task_pairs[task] = sample_pairs(pairs, opts.limit, opts.sample_seed)
    model, tokenizer = load_model(opts)
    max_input = opts.max_input_tokens or _model_window(model, opts)
    summary: dict[str, dict[str, int]] = {}
    for task, pairs in task_pairs.items():
        writer = PredictionWriter(opts.predictions_dir / f"{task}.jsonl", task)
        todo = [p for p in pairs if p.id not in writer.done]
        prompts, n_trimmed = {}, 0
        for pair in todo:
            prompts[pair.id], trimmed = fit_prompt(tokenizer, pair, max_input)
            n_trimmed += trimmed
        todo.sort(key=lambda p: -len(prompts[p.id]))
        bar = tqdm(
            total=len(pairs),
            initial=len(pairs) - len(todo),
            desc=f"eval {task}",
            unit="ex",
            disable=not opts.progress,
        )
        try:
            for start in range(0, len(todo), opts.batch_size):
                batch = todo[start : start + opts.batch_size]
                texts, p_yes = generate_batch(
                    model,
                    tokenizer,
                    [prompts[p.id] for p in batch],
                    opts.max_new_tokens.get(task, DEFAULT_MAX_NEW_TOKENS[task]),
                    task == "qasem",
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
        _record_generation(opts.predictions_dir, task, summary[task])
    return summary


def _record_generation(predictions_dir: Path, task: str, counts: dict[str, int]) -> None:
    """predictions/eval_summary.json: per task, how many prompts were trimmed (over all runs into
    this directory), so the score report can say so."""
    path = predictions_dir / "eval_summary.json"
    record = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    previous = record.get(task, {"trimmed": 0})
    record[task] = {
        "n_predictions": counts["total"],
        "trimmed": previous["trimmed"] + counts["trimmed"],
    }
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def sample_pairs(pairs: list[Pair], limit: int | None, seed: int) -> list[Pair]:
    """A seeded random sample of `limit` pairs, in file order (all pairs when limit is None).

    Random rather than the first N because prepared files are grouped (the first QASem pairs
    are all CLIFF); seeded so that a rerun selects the same ids and resumes.
    """
    if limit is None or limit >= len(pairs):
        return pairs
    keep = sorted(random.Random(seed).sample(range(len(pairs)), limit))
    return [pairs[i] for i in keep]


def _model_window(model, opts: EvalOptions) -> int | None:
    window = getattr(model.config, "max_position_embeddings", None)
    if not window:
        return None
    return window - max(opts.max_new_tokens.get(t, DEFAULT_MAX_NEW_TOKENS[t]) for t in opts.tasks)


def _check_run_config(opts: EvalOptions) -> None:
    """Record what produced the predictions; refuse to mix two models' outputs in one run dir."""
    path = opts.predictions_dir / "eval_config.json"
    config = {
        "model": opts.model,
        "adapter": opts.adapter,
        "split": opts.split,
        "limit": opts.limit,
        "sample_seed": opts.sample_seed,
        "max_new_tokens": opts.max_new_tokens,
        "max_input_tokens": opts.max_input_tokens,
    }
    if path.exists():
        previous = json.loads(path.read_text(encoding="utf-8"))
        changed = [k for k in ("model", "adapter", "split") if previous.get(k) != config[k]]
        if changed:
            raise FincheckError(
                f"{opts.predictions_dir} holds predictions of a different run ({', '.join(changed)} "
                f"differ: {[previous.get(k) for k in changed]} vs {[config[k] for k in changed]}); "
                "use another --out"
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({**config, "tasks": list(opts.tasks)}, indent=2) + "\n", encoding="utf-8"
    )


def options_as_dict(opts: EvalOptions) -> dict:
    return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(opts).items()}
