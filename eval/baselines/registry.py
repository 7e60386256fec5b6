"""The table of the papers' systems: `fincheck baseline --method` offers its keys, and each
builds its method from the command's options (two-step's step 1, FIZZ's NLI model and dev
thresholds) and the run's LLM. Nothing registers itself on import."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fincheck.eval.baselines.final_methods import PIPELINE, build_two_step
from fincheck.eval.baselines.fizz import build_fizz
from fincheck.eval.baselines.methods import Method, e2e_method, overlap_method
from fincheck.inference.llm import CachedLLM

Build = Callable[[Any, CachedLLM], Method]

METHODS: dict[str, Build] = {
    "e2e": lambda opts, llm: e2e_method(
        "e2e", "FINAL §4.1, B.1 (E.2.1); FHSumBench §4.1 vanilla; QASem §5.1"
    ),
    "e2e-fewshot": lambda opts, llm: e2e_method(
        "e2e-fewshot", "FINAL B.1 (E.2.2); FHSumBench §4.1 +ICL; QASem Table 5"
    ),
    "e2e-cot": lambda opts, llm: e2e_method(
        "e2e-cot", "FINAL B.1 (E.2.3 V2); FHSumBench §4.1 +CoT; QASem variant"
    ),
    "pipeline": lambda opts, llm: PIPELINE,
    "two-step": build_two_step,
    "fizz": build_fizz,
    "overlap": lambda opts, llm: overlap_method(),
}
ASKS_NO_LLM = ("overlap",)  # the share of the answer's words in the reference
