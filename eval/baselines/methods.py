"""The papers' systems as methods: what one evaluation example costs and returns.

A method turns one prepared pair into the text a task's scorer reads (and QASem's P(Yes)),
asking an injected LLM (`fincheck.eval.llm.CachedLLM`: an endpoint or a local model). Methods:

    e2e, e2e-fewshot, e2e-cot   every task: the papers' end-to-end prompts
                                (FINAL §4.1/B.1; FHSumBench vanilla, +ICL, +CoT; QASem §5.1)
    pipeline                    FINAL: FactScore-style decomposition, per-fact check, merge (B.2)
    two-step                    FINAL: a binary step 1 (self, oracle, or a fincheck adapter),
                                then CoT or CoT&Hint on the inconsistent ones (B.3)
    fizz                        FINAL, FHSumBench: atomic facts + NLI with granularity expansion
                                (FIZZ §3), thresholded on the dev split
    overlap                     QASem: no model, the share of the answer's words found in the
                                reference (a floor every QASem detector should clear)

Prompts are files in `eval/prompts/baselines/` whose headers cite the section they follow.
Each method's `run` returns a `MethodOutput`: the output text, P(Yes) when read, and a trace of
its intermediate answers (written beside the predictions).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

from fincheck.errors import FincheckError
from fincheck.eval.llm import CachedLLM
from fincheck.pairs import Pair
from fincheck.prompting import Prompt, parse_prompt_file
from fincheck.tasks import get_task, load_prompt
from fincheck.tasks.final.metrics import has_final_output

PROMPT_DIR = Path(__file__).resolve().parents[1] / "prompts" / "baselines"


@dataclass
class MethodOutput:
    output: str
    p_yes: float | None = None
    trace: dict[str, Any] = field(default_factory=dict)
    cut: str | None = None  # the answer hit its token budget: "answer" or "reasoning"
    reasoning: bool = False  # a chain of thought: its answer follows its last "Final Output:"


def cut_kind(text: str, cut: bool | None, reasoning: bool) -> str | None:
    """How an answer that hit its budget is read: "reasoning" when a FINAL reasoning answer was
    cut before its "Final Output:" (its numbered steps are no descriptions), else "answer"."""
    if not cut:
        return None
    return "reasoning" if reasoning and not has_final_output(text) else "answer"


@dataclass
class Example:
    """A prepared pair with the values its task prompt was rendered from (text, summary, ...)."""

    pair: Pair
    fields: dict[str, str]

    @classmethod
    def of(cls, pair: Pair) -> Example:
        return cls(pair, load_prompt(pair.task).fields_of(pair.user_content))


@cache
def baseline_prompt(name: str) -> Prompt:
    path = PROMPT_DIR / f"{name}.txt"
    if not path.is_file():
        raise FincheckError(f"no baseline prompt {name!r}: expected {path}")
    return parse_prompt_file(path, name, needs_grounding=False)


def ask(llm: CachedLLM, prompt_name: str, max_tokens: int | None = None, **values: str) -> str:
    """One call with a baseline prompt; its grounding text, when it has one, may be trimmed to
    a local model's window."""
    prompt = baseline_prompt(prompt_name)
    messages, span = prompt.messages(**values)
    return llm.ask(messages, prompt.hash, span if "text" in prompt.fields else None, max_tokens)


# ---------------------------------------------------------------------- end to end

E2E_PROMPTS = {"e2e": "e2e", "e2e-fewshot": "e2e_fewshot", "e2e-cot": "e2e_cot"}
# "Final answer: No", "**Final Answer:** yes", "Final answer - No."
FINAL_ANSWER = re.compile(r"final\s+answer\W{0,6}(yes|no)\b", re.IGNORECASE)
# A last line that is only the answer: "No.", "**Yes**"
BARE_ANSWER = re.compile(r"^\W*(yes|no)\W*$", re.IGNORECASE)


def last_yes_no(text: str) -> str | None:
    """The final yes/no of a reasoned answer, as the CoT prompts ask for it: the last "Final
    answer: yes|no", else a last line that is only "yes" or "no"; anything else is unreadable
    (None). A yes or no inside the reasoning ("there is no evidence") is never the answer."""
    found = FINAL_ANSWER.findall(text)
    if found:
        return found[-1].capitalize()
    lines = [line for line in text.splitlines() if line.strip()]
    bare = BARE_ANSWER.match(lines[-1]) if lines else None
    return bare.group(1).capitalize() if bare else None


def run_e2e(variant: str, example: Example, llm: CachedLLM) -> MethodOutput:
    task = example.pair.task
    name = f"{task}_{E2E_PROMPTS[variant]}"
    values = {k: v for k, v in example.fields.items() if k in baseline_prompt(name).fields}
    if task == "qasem" and variant != "e2e-cot":
        # the paper's protocol: the first answer token's P(Yes), and the short answer's text
        prompt = baseline_prompt(name)
        messages, span = prompt.messages(**values)
        p_yes = llm.p_yes(messages, prompt.hash, span)
        text = llm.ask(messages, prompt.hash, span, max_tokens=8)
        return MethodOutput(text, p_yes)
    text = ask(llm, name, **values)
    if task == "qasem":  # reasoning first: the final Yes/No is the answer (no P(Yes))
        cut = cut_kind(text, llm.last_cut, False)
        return MethodOutput(last_yes_no(text) or text, None, {"reasoning": text}, cut)
    reasoning = task == "final" and variant == "e2e-cot"
    return MethodOutput(text, None, {}, cut_kind(text, llm.last_cut, reasoning), reasoning)


# ---------------------------------------------------------------------- word overlap

WORD = re.compile(r"\w+")


def word_overlap(answer: str, reference: str) -> float:
    """The share of the answer's words (lowercased \\w+ runs, repeats counted) that occur in
    the reference: 1.0 when every word is there, 0.0 for an answer without words."""
    words = WORD.findall(answer.lower())
    known = set(WORD.findall(reference.lower()))
    return sum(w in known for w in words) / len(words) if words else 0.0


def run_overlap(example: Example, llm: CachedLLM) -> MethodOutput:
    """QASem without a model: s = word overlap of the QA's answer with the reference, scored
    like P(Yes) (ROC-AUC of s; supported iff s >= 0.5 for BAcc). No LLM is asked."""
    share = word_overlap(example.fields["answer"], example.fields["text"])
    return MethodOutput("Yes" if share >= 0.5 else "No", share, {"overlap": share})


# ---------------------------------------------------------------------- registry


@dataclass(frozen=True)
class Method:
    name: str
    tasks: tuple[str, ...]
    run: Callable[[Example, CachedLLM], MethodOutput]
    source: str  # the paper section it follows
    prepare: Callable[[str], None] | None = None  # per-task setup before the examples (FIZZ)


def run_detector(example: Example, llm: CachedLLM) -> MethodOutput:
    """fincheck's own task prompt, the prepared pair's messages as `fincheck eval` renders them,
    sent to the endpoint: a detector served by vLLM, llama.cpp or `transformers serve`. A task
    scored by P(Yes) (QASem) reads it from the endpoint's logprobs when it returns them, and
    its short answer's text either way (the scorer says when it had only the text)."""
    pair = example.pair
    task = get_task(pair.task)
    messages = pair.prompt_messages
    version = f"fincheck-{pair.task}-{load_prompt(pair.task).hash}"
    span = pair.meta.get("grounding_span")
    if task.reads_p_yes:
        p_yes = llm.p_yes(messages, version, span)
        return MethodOutput(llm.ask(messages, version, span, max_tokens=8), p_yes)
    budget = pair.meta.get("answer_budget") or task.max_new_tokens
    text = llm.ask(messages, version, span, max_tokens=budget)
    return MethodOutput(text, None, {}, cut_kind(text, llm.last_cut, False))


def fit_detector_pairs(
    pairs: list[Pair], task_name: str, fitter, max_input_tokens: int | None
) -> tuple[list[Pair], int]:
    """The pairs as the served detector sends them, fitted as a local eval fits them:
    the answer budget is the task's default fitted to the fitter's window (at most a quarter of
    it), the prompt gets `max_input_tokens` or the rest of the window, and a longer prompt has
    its grounding text cut. Returns (pairs, how many were trimmed); the budget rides in
    `meta["answer_budget"]`."""
    answer = fitter.answer_budget(get_task(task_name).max_new_tokens)
    fitted, trimmed = [], 0
    for pair in pairs:
        span = pair.meta.get("grounding_span")
        fit = fitter.fit_for_answer(pair.prompt_messages, span, answer, max_input_tokens)
        if fit.messages is None:
            raise FincheckError(
                f"{task_name}/{pair.id}: the prompt does not fit in {fit.budget} tokens even "
                "without its grounding text; raise --max-input-tokens or --window"
            )
        trimmed += fit.trimmed
        meta = {**pair.meta, "answer_budget": answer}
        if fit.span is not None:
            meta["grounding_span"] = list(fit.span)
        fitted.append(replace(pair, messages=[*fit.messages, pair.messages[-1]], meta=meta))
    return fitted, trimmed


def e2e_method(variant: str, source: str) -> Method:
    return Method(
        variant,
        ("final", "qasem", "fhsumbench"),
        lambda example, llm: run_e2e(variant, example, llm),
        source,
    )


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        e2e_method("e2e", "FINAL §4.1, B.1 (E.2.1); FHSumBench §4.1 vanilla; QASem §5.1"),
        e2e_method("e2e-fewshot", "FINAL B.1 (E.2.2); FHSumBench §4.1 +ICL; QASem Table 5"),
        e2e_method("e2e-cot", "FINAL B.1 (E.2.3 V2); FHSumBench §4.1 +CoT; QASem variant"),
        Method(
            "detector",
            ("final", "qasem", "fhsumbench"),
            run_detector,
            "fincheck's own task prompts on an endpoint (`fincheck eval --backend openai`)",
        ),
        Method(
            "overlap",
            ("qasem",),
            run_overlap,
            "not a paper's system: the share of the answer's words found in the reference",
        ),
    )
}


def get_method(name: str) -> Method:
    from fincheck.eval.baselines import final_methods, fizz  # noqa: F401  (they register)

    if name not in METHODS:
        raise FincheckError(f"unknown method {name!r}; choose from {', '.join(sorted(METHODS))}")
    return METHODS[name]
