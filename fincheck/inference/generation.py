"""The one inference path: eval, detect, the local judge and the baselines load, fit and
generate through these functions, so a model sees the same prompt everywhere.

    loaded = load_model(model="Qwen/Qwen2.5-0.5B-Instruct", adapter="checkpoints/run")  # .loading
    fit = fit_messages(loaded.tokenizer, messages, grounding_span, budget=1536,
                       add_generation_prompt=True)
    texts, p_yes = generate_batch(loaded.model, loaded.tokenizer, [fit.text], 8, share=YES_NO)

Loading: `fincheck.models.loading` (a base, an adapter on its base, a GGUF file, a known name).
Fitting: a prompt longer than the budget is cut at the end of its grounding text (the span in
the user message), at a word boundary, with a " [...]" marker; never the instructions, the
summary, the question or the target.
Generation: plain greedy decoding with an explicit config (not the model's shipped sampling
settings or repetition penalty), left padding, and a task's first-word share (P(Yes)/(P(Yes)+P(No)),
`FirstWordShare`) at the first position, from logits computed there in fp32
(`exact_answer_logits`).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from fincheck.data.prompting import FirstWordShare
from fincheck.data.trimming import messages_text, trim_grounding
from fincheck.errors import FincheckError
from fincheck.io.runs import RunArtifacts

log = logging.getLogger(__name__)
DTYPE_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
DTYPES = ("auto", "bf16", "fp16", "fp32")

# ------------------------------------------------------------------------ devices and dtypes


def parse_dtype(name: str | None) -> str:
    """A dtype name in the project's vocabulary (auto, bf16, fp16, fp32); long names accepted."""
    name = DTYPE_ALIASES.get(name or "auto", name or "auto")
    if name not in DTYPES:
        raise FincheckError(f"dtype {name!r}: expected one of {', '.join(DTYPES)}")
    return name


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def torch_dtype(name: str | None, device: str = "cpu"):
    """The torch dtype for a name; auto = bf16 on a GPU that supports it, else fp32."""
    import torch

    name = parse_dtype(name)
    if name == "auto":
        gpu_bf16 = device.startswith("cuda") and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if gpu_bf16 else torch.float32
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


# ------------------------------------------------------------------------ loading


def fit_answer_budget(task_default: int, window: int | None) -> int:
    """A task's default answer budget, fitted to the window: at most a quarter of it, so the
    prompt keeps three quarters (FINAL's 384 in a 1,024 window would leave 640 for
    instructions and document; its longest prepared answer is under 300 tokens)."""
    return min(task_default, window // 4) if window else task_default


def answer_budgets(
    tasks: Mapping[str, Any], window: int | None, given: Mapping[str, int] | None = None
) -> dict[str, int]:
    """Every task's answer budget, computed once per run: the one given (`--max-new-tokens`),
    else the task's default (`tasks`: the registry) fitted to the window. Detect, both eval
    backends, training's dev figures and the benchmarks read it; a served detector without a
    tokenizer has no window (the defaults)."""
    budgets = {name: fit_answer_budget(task.max_new_tokens, window) for name, task in tasks.items()}
    return budgets | dict(given or {})


EVAL_REMEDY = (
    "lower --max-new-tokens, or raise --max-input-tokens or --window, up to the model's positions"
)


class PromptDoesNotFit(FincheckError):
    """A prompt longer than its budget even without its grounding text (instructions, summary,
    question): nothing can be cut, so it cannot be answered as asked."""


@dataclass
class LoadedModel:
    """A model ready for inference (eval mode, on its device, left padding)."""

    model: Any
    tokenizer: Any
    base: str
    run: RunArtifacts | None = None  # the adapter's run folder, None for a bare base
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    window_limit: int | None = None  # set by the user (`--window`): replaces the training length
    adapter_merged: bool = False  # the LoRA update added into the base weights (`load_model`)
    position_limit: int | None = None  # the base config's max_position_embeddings

    @property
    def window(self) -> int | None:
        """Tokens the model may see: the window the user set, else the training length when
        the run recorded one; capped by the model's position limit."""
        trained = self.window_limit or (self.run and self.run.max_length)
        limits = [n for n in (self.position_limit, trained) if n]
        return min(limits) if limits else None

    def prompt_budget(self, max_new_tokens: int, max_input_tokens: int | None = None) -> int | None:
        """The one trimming rule of eval and detect: a prompt may take `max_input_tokens` when
        given, else the window (the adapter's training length, capped by the model's
        positions) minus the answer's budget; its grounding text is cut to fit."""
        limit = self.position_limit
        if max_input_tokens:
            if limit and max_input_tokens + max_new_tokens > limit:
                raise FincheckError(
                    f"--max-input-tokens {max_input_tokens} + an answer of {max_new_tokens} "
                    f"tokens exceed the model's {limit} positions"
                )
            return max_input_tokens
        if self.window is None:
            return None
        if max_new_tokens >= self.window:
            raise FincheckError(
                f"an answer budget of {max_new_tokens} tokens leaves nothing of the "
                f"{self.window}-token window for the prompt: lower --max-new-tokens or raise --window"
            )
        return self.window - max_new_tokens

    def fit_for_answer(
        self,
        messages: Sequence[dict[str, str]],
        span: Sequence[int] | None,
        answer_tokens: int,
        max_input_tokens: int | None = None,
        what: str = "the prompt",
        remedy: str = EVAL_REMEDY,
    ) -> Fit:
        """The one budget-and-render step of eval (either backend), detect, a local judge or
        baseline, training's dev figures and the benchmarks: the prompt, with the generation
        prompt and this model's template kwargs, cut on its grounding text to `prompt_budget`'s
        tokens (kept in `Fit.budget`). `PromptDoesNotFit` names the prompt (`what`) and the
        caller's own way out (`remedy`: its options)."""
        budget = self.prompt_budget(answer_tokens, max_input_tokens)
        fit = fit_messages(
            self.tokenizer,
            messages,
            span,
            budget,
            add_generation_prompt=True,
            template_kwargs=self.template_kwargs,
        )
        if fit.text is None:
            room = (
                "--max-input-tokens"
                if max_input_tokens
                else f"a {self.window}-token window less {answer_tokens} for the answer"
            )
            raise PromptDoesNotFit(
                f"{what} does not fit in {budget} prompt tokens ({room}) even with its "
                f"grounding text cut away: {remedy}"
            )
        return replace(fit, budget=budget)

    def check_template(self) -> str:
        """The template's fingerprint now; a warning when it renders differently from training
        (a template that writes today's date, another tokenizer, other kwargs)."""
        now = template_fingerprint(self.tokenizer, self.template_kwargs)
        trained = (self.run.metadata if self.run else {}).get("chat_template_hash")
        if trained and trained != now:
            log.warning(
                "the chat template renders differently from training (%s now, %s then): the "
                "model is evaluated on prompts it was not trained on",
                now,
                trained,
            )
        return now


# ------------------------------------------------------------------------ prompts


def render_chat(
    tokenizer,
    messages: Sequence[dict[str, str]],
    add_generation_prompt: bool,
    template_kwargs: dict[str, Any] | None = None,
) -> str:
    """The chat template's text for `messages` (what the model reads). `template_kwargs` go to
    the template (Qwen3: {"enable_thinking": false}); training records them with the run."""
    if not tokenizer.chat_template:
        raise FincheckError(
            f"the tokenizer of {getattr(tokenizer, 'name_or_path', 'this model')} has no chat "
            "template (a base model, not an instruct one): prompt an instruct model, or an "
            "adapter trained on this base with the recipe key chat_template_path (its run "
            "folder keeps the template and eval reads it from there)"
        )
    return tokenizer.apply_chat_template(
        list(messages),
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        **(template_kwargs or {}),
    )


# A fixed conversation whose render fingerprints a chat template as the model sees it: two
# renders differ when the template's text, its kwargs, or what it injects (a date) differ.
TEMPLATE_PROBE = (
    {"role": "system", "content": "System text."},
    {"role": "user", "content": "User text."},
    {"role": "assistant", "content": "Answer."},
)


def template_fingerprint(tokenizer, template_kwargs: dict[str, Any] | None = None) -> str:
    """sha256 prefix of the rendered probe conversation (recorded with runs and evaluations)."""
    import hashlib

    text = render_chat(tokenizer, TEMPLATE_PROBE, False, template_kwargs)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def count_tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


@dataclass(frozen=True)
class Fit:
    """`fit_messages`' answer: the messages that fit (None when nothing fits), how, and the
    rendered text."""

    messages: list[dict[str, str]] | None
    status: str  # kept | trimmed | dropped
    kept_fraction: float  # share of the grounding text's characters kept
    text: str | None = None
    span: tuple[int, int] | None = None  # the grounding text in the fitted user message
    budget: int | None = None  # the prompt tokens it was fitted to (`fit_for_answer`)

    @property
    def trimmed(self) -> bool:
        return self.status == "trimmed"


def fit_messages(
    tokenizer,
    messages: Sequence[dict[str, str]],
    grounding_span: Sequence[int] | None,
    budget: int | None,
    *,
    add_generation_prompt: bool,
    template_kwargs: dict[str, Any] | None = None,
) -> Fit:
    """Make `messages` fit `budget` tokens of the chat template by cutting the grounding text.

    Training fits the whole conversation (target included), evaluation and detection the
    prompt with the generation prompt. The cut is data-prep's `trim_grounding`, re-measured
    on the real chat template and cut further while tokens merge across the boundary.
    """
    messages = [dict(m) for m in messages]
    text = render_chat(tokenizer, messages, add_generation_prompt, template_kwargs)
    length = count_tokens(tokenizer, text)
    if budget is None or length <= budget:
        span = tuple(grounding_span) if grounding_span is not None else None
        return Fit(messages, "kept", 1.0, text, span)
    if grounding_span is None:
        return Fit(None, "dropped", 0.0)
    start, end = grounding_span
    overhead = length - count_tokens(tokenizer, messages_text(messages))  # what the template adds
    allowed = budget
    for _ in range(8):
        cut = trim_grounding(
            messages, (start, end), allowed, lambda t: count_tokens(tokenizer, t), overhead
        )
        if cut is None:
            break
        cut_messages, (kept_start, kept_end) = cut
        text = render_chat(tokenizer, cut_messages, add_generation_prompt, template_kwargs)
        excess = count_tokens(tokenizer, text) - budget
        if excess <= 0:
            kept = (kept_end - kept_start) / (end - start) if end > start else 1.0
            return Fit(cut_messages, "trimmed", kept, text, (kept_start, kept_end))
        allowed -= excess
    return Fit(None, "dropped", 0.0)


# ------------------------------------------------------------------------ generation


def greedy_config(model, tokenizer, max_new_tokens: int):
    """Plain greedy decoding. A fresh config, not the model's generation_config: instruct models
    ship sampling settings and a repetition penalty (Qwen2.5: 1.05) that would change the
    outputs; only the stop tokens are taken from it."""
    from transformers import GenerationConfig

    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        num_beams=1,
        repetition_penalty=1.0,
        eos_token_id=stop_tokens(model, tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        return_dict_in_generate=True,
    )


def stop_tokens(model, tokenizer) -> int | list[int]:
    """The end-of-turn token(s) an answer stops at: the model's generation config's, else the
    tokenizer's EOS (the same for `generate` and the prefix tree)."""
    return getattr(model.generation_config, "eos_token_id", None) or tokenizer.eos_token_id


def answer_spellings(tokenizer, words: Sequence[str]) -> list[tuple[int, ...]]:
    """Distinct token sequences of the answer word's spellings."""
    seqs = (tuple(tokenizer(word, add_special_tokens=False)["input_ids"]) for word in words)
    return list(dict.fromkeys(ids for ids in seqs if ids))


@contextlib.contextmanager
def output_head_inputs(model) -> Iterator[list]:
    """The hidden states the model's output head reads while the block runs (one tensor a
    forward pass, (rows, kept positions, hidden)): what `exact_answer_logits` starts from."""
    seen: list = []
    head = model.get_output_embeddings()
    handle = head.register_forward_pre_hook(lambda _module, args: seen.append(args[0].detach()))
    try:
        yield seen
    finally:
        handle.remove()


def exact_answer_logits(model, hidden, spellings: Sequence[tuple[int, ...]], rounded):
    """(rows, vocab) logits at the answer position in fp32 for the spellings' first tokens,
    -inf for every other token, from `hidden` (rows, hidden), the last hidden state there;
    `rounded`, the model's own logits there, where they disagree by more than rounding (a
    model whose forward changes its logits after the head in a way not known here).

    A bf16 model rounds its logits to 8 bits of mantissa: between 16 and 32 a step of 0.125, so
    sigmoid(logit Yes - logit No) takes a few values (36 QASem QAs of three references: 6) and
    the ranking ties. The hidden state times the head's rows in fp32 gives each answer its own
    score, for the cost of a few dot products (an fp32 head for every decoding step cost about
    twice the time). Softmax over the answer tokens alone leaves P(yes) / (P(yes) + P(no))
    unchanged: the full distribution's normaliser cancels in the share."""
    import torch

    head = model.get_output_embeddings()
    ids = sorted({seq[0] for seq in spellings})
    index = torch.tensor(ids, device=hidden.device)
    logits = hidden.float() @ head.weight[index].float().T
    if getattr(head, "bias", None) is not None:
        logits = logits + head.bias[index].float()
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap:  # as the model's own forward (Gemma)
        logits = torch.tanh(logits / cap) * cap
    own = rounded[:, index].float()
    if not torch.allclose(logits, own, rtol=1 / 64, atol=0.5):  # 2x bf16's rounding, or more
        log.warning("the model's answer logits are not its head's product: P(Yes) read from them")
        return rounded
    full = torch.full((hidden.shape[0], head.weight.shape[0]), -math.inf, device=hidden.device)
    full[:, index] = logits
    return full


NOT_A_NUMBER = (
    "the model's {what} is not a number (NaN or inf): its weights (base or adapter) hold NaN or "
    "inf, or its logits overflowed in this dtype; try --dtype fp32, or check the weights"
)


def computed_scores(logits, what: str = "next-token score"):
    """`logits` (rows, classes) as the model computed them, refused when a row holds NaN or
    +inf, or no finite value at all: argmax (or a softmax's comparison) would still pick a
    token or a class, and a task scored by its text alone (FHSumBench's labels, FINAL's lists)
    would be given an answer the model never computed. -inf beside finite values is a masked
    token, and allowed. Every greedy step of both decoders (`greedy_tokens`, and
    `RefuseNonFiniteLogits` for transformers' `generate`) and every NLI score goes through
    here."""
    import torch

    broken = torch.isnan(logits) | torch.isposinf(logits)
    if bool(broken.any()) or bool(torch.isneginf(logits).all(-1).any()):
        raise FincheckError(NOT_A_NUMBER.format(what=what))
    return logits


def greedy_tokens(logits):
    """The argmax token of each row of `logits` (rows, vocab), computed ones only."""
    return computed_scores(logits).argmax(-1)


def refuse_non_finite_logits():
    """`greedy_tokens`' check as a logits processor for transformers' `generate`."""
    from transformers import LogitsProcessor

    class RefuseNonFiniteLogits(LogitsProcessor):
        def __call__(self, input_ids, scores):
            return computed_scores(scores)

    return RefuseNonFiniteLogits()


def yes_share(first_logits, yes, no, continuation) -> list[float]:
    """P(Yes) / (P(Yes) + P(No)) per row, each summed over its spellings' token sequences.

    A spelling's first token reads `first_logits` (batch, vocab), the logits at the answer's
    first position; `continuation(seq)` gives the logits that predict its later tokens,
    (batch, len(seq) - 1, vocab), from a pass that teacher-forced the spelling. The batched
    path and the prefix tree lay those passes out differently; the sum is this one.
    """
    import torch

    first = torch.softmax(first_logits.float(), dim=-1)

    def total(spellings: list[tuple[int, ...]]):
        value = torch.zeros(first.shape[0], device=first.device)
        for seq in spellings:
            prob = first[:, seq[0]]
            if len(seq) > 1:
                steps = torch.softmax(continuation(seq).float(), dim=-1)
                for j in range(1, len(seq)):
                    prob = prob * steps[:, j - 1, seq[j]]
            value = value + prob
        return value

    p_yes, p_no = total(yes), total(no)
    shares = p_yes / (p_yes + p_no).clamp(min=1e-30)
    if not bool(torch.isfinite(shares).all()):  # never written as NaN: score would refuse it
        raise FincheckError(NOT_A_NUMBER.format(what="P(Yes)"))
    return shares.tolist()


def generate_batch(
    model, tokenizer, prompts: list[str], max_new_tokens: int, share: FirstWordShare | None = None
):
    """Greedy outputs for a batch of rendered prompts, and p_yes per prompt (`share`) when
    asked."""
    import torch

    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(
        model.device
    )
    ids = enc["input_ids"]

    def continuation(seq: tuple[int, ...]):
        """The prompt plus the spelling in one pass; position ids skip the left padding."""
        tail = torch.tensor(seq, device=ids.device).expand(ids.shape[0], -1)
        full_mask = torch.cat([enc["attention_mask"], torch.ones_like(tail)], dim=1)
        positions = (full_mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(
            input_ids=torch.cat([ids, tail], dim=1),
            attention_mask=full_mask,
            position_ids=positions,
        ).logits
        return logits[:, ids.shape[1] : ids.shape[1] + len(seq) - 1]

    p_yes = None
    config = greedy_config(model, tokenizer, max_new_tokens)
    config.output_logits = share is not None
    with torch.no_grad(), output_head_inputs(model) as hidden:
        out = model.generate(
            **enc, generation_config=config, logits_processor=[refuse_non_finite_logits()]
        )
    if share:
        yes, no = (answer_spellings(tokenizer, w) for w in (share.yes, share.no))
        with torch.no_grad():  # hidden[0]: the prompt's pass, its last position the answer's
            first = exact_answer_logits(model, hidden[0][:, -1], [*yes, *no], out.logits[0])
            p_yes = yes_share(first, yes, no, continuation)
    new_tokens = out.sequences[:, ids.shape[1] :]
    texts = [t.strip() for t in tokenizer.batch_decode(new_tokens, skip_special_tokens=True)]
    return texts, p_yes
