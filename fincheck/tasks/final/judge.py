"""The FINAL matching judge: prompt, strict answer parsing, caching, and the run over a corpus.

The judge is an injected `ChatClient` (`fincheck.inference.llm`: an OpenAI-compatible endpoint, a
local transformers model, or a test fake): this module only builds requests and reads answers.
Every answer is cached on disk under a key of the full request, so a rerun after a crash repeats
no call.

Outcomes per example (`JudgeResult.status`):
  skipped       either list is empty: no call, every prediction unmatched (TP = 0)
  ok            a valid matching
  parse_failed  malformed twice (one re-ask): raw answers kept; counts as a miss in the headline
  error         the client gave up (retries exhausted, timeout): not cached; counts as a miss in
                the headline (as the paper, which leaves nothing out), left out of the
                `excluding_judge_failures` variant
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from fincheck.data.prompting import Prompt, parse_prompt_file
from fincheck.errors import FincheckError
from fincheck.inference.llm import (
    ChatClient,
    LLMCallError,
    RequestCache,
    as_completion,
    asked_of,
    expect_served,
    run_concurrently,
)
from fincheck.io import jsonl
from fincheck.tasks.final.lettering import lettered, letters

HERE = Path(__file__).parent
# The paper's matching criteria (FINAL, prompt E.4) in the project's words, and two variants,
# each named in every report that uses it (JUDGE_VARIANTS says how it departs from the paper).
JUDGE_PROMPTS = {
    "paper": HERE / "judge.txt",
    "strict": HERE / "judge_strict.txt",
    "direct": HERE / "judge_direct.txt",
}
JUDGE_VARIANTS = {
    "strict": "the strict matching variant (omissions and multi-fact descriptions match "
    "nothing): not the FINAL paper's criteria",
    "direct": "the direct variant (the paper's criteria, answered with the JSON object alone, "
    "without the paper's step-by-step reasoning): not the FINAL paper's protocol",
}
DEFAULT_SAMPLING: dict = {"temperature": 0.0, "max_tokens": 1024}


# ---------------------------------------------------------------- prompt


@dataclass(frozen=True)
class JudgePrompt:
    prompt: Prompt  # the file's [system] and [user] sections, read as the task prompts are
    name: str = "paper"

    @property
    def version(self) -> str:
        """sha256 prefix of the prompt file: part of every cache key and result."""
        return self.prompt.hash[:12]

    @classmethod
    def named(cls, name: str) -> JudgePrompt:
        if name not in JUDGE_PROMPTS:
            raise FincheckError(f"judge prompt {name!r}: choose one of {', '.join(JUDGE_PROMPTS)}")
        return replace(cls.load(JUDGE_PROMPTS[name]), name=name)

    @classmethod
    def load(cls, path: Path = JUDGE_PROMPTS["paper"]) -> JudgePrompt:
        return cls(parse_prompt_file(Path(path), "judge", needs_grounding=False))

    def messages(
        self, summary: str, predicted: Sequence[str], gold: Sequence[str]
    ) -> list[dict[str, str]]:
        # one pass, so braces inside descriptions are never re-substituted
        messages, _ = self.prompt.messages(
            summary=summary, gold=lettered(gold), predicted=lettered(predicted)
        )
        return messages


# ---------------------------------------------------------------- answer parsing


class MatchingParseError(ValueError):
    """The judge's answer is not a valid matching; the message is shown to it on the re-ask."""


_NULLS = {"null", "none", "", "no match", "n/a"}


def parse_matching(
    text: str, predicted_letters: Sequence[str], gold_letters: Sequence[str]
) -> dict[str, str | None]:
    """The last JSON object in `text` as {predicted letter: gold letter or None}, validated.

    Tolerated: code fences, reasoning before the object, Python's None, "None"/"null" strings,
    lower-case letters. Rejected: no object, a missing or unknown predicted letter, a value that
    is not a gold letter.
    """
    cleaned = re.sub(r"```(?:json|JSON)?", " ", text or "")
    candidates = re.findall(r"\{[^{}]*\}", cleaned, re.DOTALL)  # "{...}": a dict, or a decode error
    if not candidates:
        raise MatchingParseError("no JSON object found")
    raw = re.sub(r"\bNone\b", "null", candidates[-1])
    try:
        obj = jsonl.loads(raw)
    except json.JSONDecodeError as e:
        raise MatchingParseError(f"the JSON object does not parse ({e.msg})") from None
    matching: dict[str, str | None] = {}
    for key, value in obj.items():
        letter = str(key).strip().rstrip(".").upper()
        if letter not in predicted_letters:
            raise MatchingParseError(f"key {key!r} is not a detector letter")
        if value is None or (isinstance(value, str) and value.strip().lower() in _NULLS):
            matching[letter] = None
            continue
        target = str(value).strip().rstrip(".").upper()
        if target not in gold_letters:
            raise MatchingParseError(f"value {value!r} for {letter} is not a reference letter")
        matching[letter] = target
    missing = [p for p in predicted_letters if p not in matching]
    if missing:
        raise MatchingParseError(f"missing detector letters: {', '.join(missing)}")
    return matching


REASK = (
    "Your answer could not be used: {problem}. Reply with only one JSON object that has one key "
    "per detector letter ({keys}) and, as each value, a reference letter ({values}) or null."
)


# ---------------------------------------------------------------- judging


@dataclass
class JudgeResult:
    status: str  # skipped | ok | parse_failed | error
    matching: dict[str, str | None] | None = None
    raw: list[str] = field(default_factory=list)
    error: str | None = None
    calls: int = 0  # requests sent over the wire (cache hits excluded)
    served: str | None = None  # the model an endpoint said answered (cached answers included)


@dataclass
class MatchingJudge:
    client: ChatClient
    cache: RequestCache
    prompt: JudgePrompt = field(default_factory=JudgePrompt.load)
    sampling: dict = field(default_factory=lambda: dict(DEFAULT_SAMPLING))

    served: list[str] = field(default_factory=list)  # what the endpoint said it served

    def __post_init__(self) -> None:
        # a reply from another model than the cached answers' is refused before it is cached
        expect_served(self.client, self.cache)

    @property
    def identity(self) -> dict[str, Any]:
        """The client, the prompt and its version, and the model the endpoint said served the
        answers: what FINAL's figures and results.json name."""
        return {
            **self.client.identity,
            "prompt": self.prompt.name,
            "prompt_version": self.prompt.version,
            **({"served_models": self.served} if self.served else {}),
        }

    def _ask(self, messages: list[dict[str, str]], result: JudgeResult) -> str:
        key = RequestCache.key(self.client.identity, self.prompt.version, messages, self.sampling)
        cached = self.cache.get(key)
        if cached is not None:
            result.served = self.cache.served(key)
            return cached
        result.calls += 1
        response = as_completion(self.client.complete(messages, self.sampling))
        self.cache.put(key, response.text, response.cut, response.served, asked_of(self.client))
        result.served = response.served
        return response.text

    def match(self, summary: str, predicted: Sequence[str], gold: Sequence[str]) -> JudgeResult:
        pred_letters, gold_letters = letters(len(predicted)), letters(len(gold))
        if not predicted or not gold:
            return JudgeResult("skipped", {p: None for p in pred_letters})
        messages = self.prompt.messages(summary, predicted, gold)
        result = JudgeResult("parse_failed")
        try:
            for attempt in range(2):
                answer = self._ask(messages, result)
                result.raw.append(answer)
                try:
                    result.matching = parse_matching(answer, pred_letters, gold_letters)
                    result.status = "ok"
                    return result
                except MatchingParseError as e:
                    result.error = str(e)
                    if attempt == 0:
                        reask = REASK.format(
                            problem=e,
                            keys=", ".join(pred_letters),
                            values=", ".join(gold_letters),
                        )
                        messages = [
                            *messages,
                            {"role": "assistant", "content": answer},
                            {"role": "user", "content": reask},
                        ]
        except LLMCallError as e:
            result.status, result.error = "error", str(e)
        return result

    def match_many(
        self,
        requests: Sequence[tuple[str, Sequence[str], Sequence[str]]],
        concurrency: int = 8,
        progress: bool = True,
    ) -> list[JudgeResult]:
        """Judge (summary, predicted, gold) triples, `concurrency` calls in flight at most, in
        the order given. Run as every endpoint's concurrent calls are (`run_concurrently`): an
        error that stops the run (a wrong key, a tripped breaker, Ctrl-C) sends nothing more
        and waits for no call in flight."""
        items = [SimpleNamespace(id=str(i), request=r) for i, r in enumerate(requests)]
        results: dict[str, JudgeResult] = {}
        run_concurrently(
            items,
            lambda item: self.match(*item.request),
            concurrency,
            lambda item, result: results.__setitem__(item.id, result),
            progress,
            "judging FINAL",
        )
        answers = [results[item.id] for item in items]
        served = sorted({a.served for a in answers if a.served})
        if len(served) > 1:  # a judge cache filled while the endpoint served another model
            raise FincheckError(
                f"the judge's answers came from {len(served)} models ({', '.join(served)}: what "
                "the endpoint said it served, cached answers included): the figures would mix "
                "two judges; score with a new --judge-cache, or against the endpoint that "
                "served the cached answers"
            )
        self.served = served
        return answers
