"""FINAL's multi-call systems (FINAL paper §4.1, appendix B.2 and B.3).

pipeline (FactScore-style), per summary:
    1. atomic facts of each summary sentence            one call per sentence
    2. is each fact consistent with the text? if not,   one call per fact
       one "- " bullet per inconsistency
    3. merge descriptions of the same wrong information one call when there are two or more
    -> a lettered list, or None

two-step: step 1 decides consistent / inconsistent, step 2 describes the inconsistent ones:
    step 1   self      the model's own binary CoT answer (prompt E.3)       one call
             oracle    the gold label (an upper bound, as the paper's Oracle rows)
             ADAPTER   a trained fincheck adapter on FINAL's own prompt (its list empty or not)
    step 2   cot       the end-to-end CoT prompt                            one call
             cot-hint  the same, told the summary is inconsistent (E.2.4)
    a summary judged consistent in step 1 gets None without a step 2 call.
"""

from __future__ import annotations

import difflib
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fincheck.data.sentences import split_sentences
from fincheck.detector import Detector
from fincheck.errors import FincheckError
from fincheck.eval.baselines.methods import (
    Example,
    Method,
    MethodOutput,
    ask,
    cut_kind,
    e2e_prompt,
    last_yes_no,
)
from fincheck.inference.llm import CachedLLM
from fincheck.metrics.classification import parse_yes_no
from fincheck.tasks.final.lettering import final_target, lettered
from fincheck.tasks.final.reader import parse_descriptions

# ---------------------------------------------------------------------- pure parts

_BULLET = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s+(.*\S)\s*$")


def bullets(text: str) -> list[str]:
    """The items of a "- " (or "* ", "1.") list in an answer; other lines are ignored."""
    return [m.group(1) for line in text.splitlines() if (m := _BULLET.match(line))]


def parse_fact_check(answer: str) -> tuple[bool | None, list[str]]:
    """(consistent?, descriptions) from a per-fact answer: "yes" / "no" on the first line that
    has one, then the "- " bullets. An answer with neither yes nor no reads as None (unknown):
    its bullets, if any, still count as descriptions."""
    read = (parse_yes_no(line) for line in answer.splitlines())
    verdict = next((v for v in read if v is not None), None)
    found_bullets = bullets(answer)
    if verdict is None and found_bullets:
        verdict = False
    return verdict, ([] if verdict else found_bullets)


# difflib ratio at which an edited description still maps to its original (a changed article
# or tense stays; a rewritten sentence does not)
NEAR_MATCH = 0.8


@dataclass(frozen=True)
class Merge:
    """The merge step read against the descriptions it was given (FINAL paper, E.2.5: keep one
    of each group of duplicates, word for word)."""

    kept: list[str]  # originals, in the answer's order
    exact: int  # answer items equal to an original (spacing and case aside)
    near: int  # edited items mapped to their closest original
    unmatched: int  # items that are no original: dropped
    fallback: bool  # nothing usable in the answer: the un-merged list is kept

    def counts(self) -> dict[str, int]:
        return {
            "merge_near_matches": self.near,
            "merge_unmatched_items": self.unmatched,
            "merge_fallbacks": int(self.fallback),
        }


def _normal(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def merge_descriptions(answer: str, originals: list[str]) -> Merge:
    """Map each description of the merge answer to the original it keeps: exactly (spacing and
    case aside), else the closest original at a similarity of NEAR_MATCH or more; an item
    matching none is dropped. With no item mapped, the merge is a fallback to the originals."""
    norm = {_normal(d): d for d in originals}
    chosen: list[str] = []
    exact = near = unmatched = 0
    for item in parse_descriptions(answer):
        key = _normal(item)
        if key in norm:
            exact += 1
            original = norm[key]
        else:
            ratio, original = max(
                (difflib.SequenceMatcher(None, key, k).ratio(), d) for k, d in norm.items()
            )
            if ratio < NEAR_MATCH:
                unmatched += 1
                continue
            near += 1
        if original not in chosen:
            chosen.append(original)
    return Merge(chosen or list(originals), exact, near, unmatched, fallback=not chosen)


# ---------------------------------------------------------------------- pipeline


def run_pipeline(example: Example, llm: CachedLLM) -> MethodOutput:
    text, summary = example.fields["text"], example.fields["summary"]
    facts: list[str] = []
    for sentence in split_sentences(summary) or [summary]:
        facts += bullets(ask(llm, "atomic_facts", max_tokens=256, sentence=sentence))
    checks = []
    descriptions: list[str] = []
    for fact in facts:
        answer = ask(llm, "final_pipeline_check", max_tokens=256, text=text, fact=fact)
        consistent, found = parse_fact_check(answer)
        checks.append({"fact": fact, "consistent": consistent, "descriptions": found})
        descriptions += [d for d in found if d not in descriptions]
    merged, merge_answer, counts = descriptions, None, {}
    if len(descriptions) > 1:
        merge_answer = ask(
            llm, "final_pipeline_merge", summary=summary, descriptions=lettered(descriptions)
        )
        merge = merge_descriptions(merge_answer, descriptions)
        merged, counts = merge.kept, merge.counts()
    trace = {"facts": checks, "merge_answer": merge_answer, "merged": merged, "counts": counts}
    return MethodOutput(final_target(merged), None, trace)


# ---------------------------------------------------------------------- two-step


def self_step1(example: Example, llm: CachedLLM) -> tuple[bool | None, dict]:
    answer = ask(
        llm, "final_binary_cot", text=example.fields["text"], summary=example.fields["summary"]
    )
    verdict = last_yes_no(answer)
    return (None if verdict is None else verdict == "Yes"), {"step1_answer": answer}


Step1 = Callable[[Example, CachedLLM], tuple[bool | None, dict]]


def run_two_step(example: Example, llm: CachedLLM, step1: Step1, step2: str) -> MethodOutput:
    """Step 1's verdict (None, unreadable, counts as inconsistent: the summary goes on to
    step 2, as a filter should not silently drop work), then step 2 on the inconsistent."""
    consistent, trace = step1(example, llm)
    trace["step1_consistent"] = consistent
    if consistent:
        return MethodOutput("None", None, trace)
    prompt = e2e_prompt("final", "e2e-cot") if step2 == "cot" else "final_cot_hint"
    answer = ask(llm, prompt, text=example.fields["text"], summary=example.fields["summary"])
    cut = cut_kind(answer, llm.last_cut, True, example.pair.task)
    return MethodOutput(answer, None, trace, cut, True)


STEP1: dict[str, Step1] = {
    "self": self_step1,
    "oracle": lambda example, llm: (  # the gold: consistent when it lists no description
        not example.pair.meta_value("descriptions", list),
        {"step1": "oracle"},
    ),
}


def adapter_step1(adapter: str, device: str | None) -> Step1:
    """Step 1 by a trained fincheck adapter: its FINAL answer (the training prompt), consistent
    when it lists nothing. One model, shared by the example threads under a lock."""
    detector = Detector.from_pretrained(adapter=adapter, device=device)
    lock = threading.Lock()

    def step1(example: Example, llm: CachedLLM) -> tuple[bool | None, dict]:
        with lock:
            found = detector.describe(example.fields["text"], example.fields["summary"])
        return (not found), {"step1": f"adapter {adapter}", "step1_descriptions": found}

    return step1


def check_step1(step1: str) -> None:
    """--step1 checked before any model loads (a typo fails in a second)."""
    if step1 not in STEP1 and not Path(step1).is_dir():
        raise FincheckError(
            f"--step1 {step1!r}: choose self, oracle, or a fincheck adapter folder (the "
            "FINAL paper's TrueTeacher classifier is not offered: docs/baselines.md)"
        )


def build_two_step(opts: Any, llm: CachedLLM) -> Method:
    """Two-step with the options' step 1 (named self, oracle, or the adapter folder's name)
    and step 2."""
    step1, step2 = STEP1.get(opts.step1) or adapter_step1(opts.step1, opts.device), opts.step2
    return Method(
        f"two-step:{Path(opts.step1).name}+{step2}",
        ("final",),
        lambda example, llm: run_two_step(example, llm, step1, step2),
        "FINAL §4.1, B.3 (E.3, E.2.3, E.2.4)",
    )


PIPELINE = Method("pipeline", ("final",), run_pipeline, "FINAL §4.1, B.2 (E.2.5)")
