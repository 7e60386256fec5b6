"""The papers' systems as methods: what one evaluation example costs and returns.

A method turns one prepared pair into the text a task's scorer reads (and QASem's P(Yes)),
asking an injected LLM (`fincheck.inference.llm.CachedLLM`: an endpoint or a local model). The
end-to-end prompts are kept in each task's package (`Task.e2e_prompt_path`), the other prompts
in `eval/prompts/baselines/`; every header cites the section it follows. The table of methods,
which `fincheck baseline --method` offers, is `registry.py`. Each method's `run` returns a
`MethodOutput`: the output text, P(Yes) when read, and a trace of its intermediate answers
(written beside the predictions).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from fincheck.data.pairs import Pair
from fincheck.data.prompting import Prompt, parse_prompt_file
from fincheck.errors import FincheckError
from fincheck.inference.llm import CachedLLM, run_concurrently
from fincheck.tasks import all_tasks, get_task, load_prompt
from fincheck.tasks.qasem.overlap import reads_qas, word_overlap

PROMPT_DIR = Path(__file__).resolve().parents[1] / "prompts" / "baselines"


@dataclass
class MethodOutput:
    output: str
    p_yes: float | None = None
    trace: dict[str, Any] = field(default_factory=dict)
    cut: str | None = None  # the answer hit its token budget: "answer" or "reasoning"
    reasoning: bool = False  # a chain of thought: its answer follows its last "Final Output:"


def cut_kind(text: str, cut: bool | None, reasoning: bool, task: str) -> str | None:
    """How an answer that hit its budget is read: "reasoning" when a reasoning answer was cut
    before its answer (FINAL: before "Final Output:", its numbered steps are no descriptions),
    else "answer"."""
    if not cut:
        return None
    return "reasoning" if reasoning and get_task(task).cut_in_reasoning(text) else "answer"


@dataclass
class Example:
    """A prepared pair with the values its task prompt was rendered from (text, summary, ...)."""

    pair: Pair
    fields: dict[str, str]

    @classmethod
    def of(cls, pair: Pair) -> Example:
        span = pair.meta.get("grounding_span")  # (checked when the pair was read)
        return cls(pair, load_prompt(pair.task).fields_of(pair.user_content, span))


@cache
def baseline_prompt(name: str, path: Path | None = None) -> Prompt:
    """A baseline prompt of `eval/prompts/baselines/`, or the file at `path` (a task's own)."""
    path = path or PROMPT_DIR / f"{name}.txt"
    if not path.is_file():
        raise FincheckError(f"no baseline prompt {name!r}: expected {path}")
    return parse_prompt_file(path, name, needs_grounding=False)


def e2e_prompt(task: str, variant: str) -> Prompt:
    """A task's end-to-end prompt (`Task.e2e_prompt_path`, beside its own prompt)."""
    return baseline_prompt(f"{task}_{variant}", get_task(task).e2e_prompt_path(variant))


def ask(llm: CachedLLM, prompt: str | Prompt, max_tokens: int | None = None, **values: str) -> str:
    """One call with a baseline prompt (or its name); its grounding text, when it has one, may
    be trimmed to a local model's window."""
    prompt = baseline_prompt(prompt) if isinstance(prompt, str) else prompt
    messages, span = prompt.messages(**values)
    return llm.ask(messages, prompt.hash, span if "text" in prompt.fields else None, max_tokens)


# ---------------------------------------------------------------------- end to end

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
    """The paper's end-to-end prompt. A task scored by P(Yes) (QASem) reads it at the first
    answer token and keeps the short answer's text; its CoT variant reasons first and its final
    Yes/No is the answer. Any other task's answer is its text; a CoT answer is reasoning."""
    task = get_task(example.pair.task)
    prompt = e2e_prompt(task.name, variant)
    values = {k: v for k, v in example.fields.items() if k in prompt.fields}
    messages, span = prompt.messages(**values)
    span = span if "text" in prompt.fields else None
    reasoning = variant == "e2e-cot"
    if task.answers_yes_no and not reasoning:
        p_yes = llm.p_yes(messages, prompt.hash, span)
        return MethodOutput(llm.ask(messages, prompt.hash, span, max_tokens=8), p_yes)
    text = llm.ask(messages, prompt.hash, span)
    if task.answers_yes_no:  # reasoning first: the final Yes/No is the answer (no P(Yes))
        cut = cut_kind(text, llm.last_cut, False, task.name)
        return MethodOutput(last_yes_no(text) or text, None, {"reasoning": text}, cut)
    cut = cut_kind(text, llm.last_cut, reasoning, task.name)
    return MethodOutput(text, None, {}, cut, reasoning)


# ---------------------------------------------------------------------- word overlap


def run_overlap(example: Example, llm: CachedLLM) -> MethodOutput:
    """QASem without a model: s = word overlap of the QA's answer with the reference, scored
    like P(Yes) (ROC-AUC of s; supported iff s >= 0.5 for BAcc). No LLM is asked."""
    share = word_overlap(example.fields["answer"], example.fields["text"])
    return MethodOutput("Yes" if share >= 0.5 else "No", share, {"overlap": share})


# ---------------------------------------------------------------------- methods


@dataclass(frozen=True)
class Method:
    name: str
    tasks: tuple[str, ...]
    run: Callable[[Example, CachedLLM], MethodOutput]
    source: str  # the paper section it follows
    # per-task setup before the examples (FIZZ's dev threshold): what it chose, which the
    # runner records beside the predictions (a rerun that chooses otherwise is refused)
    prepare: Callable[[str], dict[str, Any]] | None = None


def run_examples(
    run: Callable[[Example, CachedLLM], MethodOutput],
    llm: CachedLLM,
    pairs: list,
    concurrency: int,
    on_done,
    progress: bool,
    desc: str,
) -> list[str]:
    """A method's `run` on each pair, `concurrency` at a time (`run_concurrently`), its calls
    counted per example; `on_done(pair, output, calls)` as each finishes. Returns the failures
    ("id: reason")."""

    def one(pair) -> tuple[MethodOutput, int]:
        llm.start_example()
        return run(Example.of(pair), llm), llm.calls  # the calls counted after the run

    return run_concurrently(
        pairs, one, concurrency, lambda pair, done: on_done(pair, *done), progress, desc
    )


def e2e_method(variant: str, source: str) -> Method:
    """An end-to-end method over every registered task that has the variant's prompt."""
    covered = tuple(n for n, t in all_tasks().items() if t.e2e_prompt_path(variant).is_file())
    return Method(variant, covered, lambda example, llm: run_e2e(variant, example, llm), source)


def overlap_method() -> Method:
    """Word overlap over every registered task whose pairs have a QA's answer."""
    return Method(
        "overlap",
        tuple(name for name in all_tasks() if reads_qas(name)),
        run_overlap,
        "not a paper's system: the share of the answer's words found in the reference",
    )
