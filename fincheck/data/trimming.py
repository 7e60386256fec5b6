"""Fit a conversation into a token budget by cutting its grounding text, never its target.

The grounding text is the only part that can be long (a news article, a Wikipedia page, cited
sources); the instructions, the summary or QA, and the target must stay whole. Its place is the
[start, end) span inside the user message (`meta["grounding_span"]` of a pair). A conversation
that does not fit even with an empty document cannot be fitted; callers count both outcomes.
`fincheck.inference.generation.fit_messages` applies this cut with a model's real chat template.
"""

from __future__ import annotations

import bisect
import dataclasses
import re
from collections.abc import Callable, Sequence

from fincheck.data.pairs import Pair

TokenCounter = Callable[[str], int]
TRIM_MARKER = " [...]"  # tells the model (and a reader) that the document was cut here
_WORD_END = re.compile(r"\S+")


def count_whitespace_tokens(text: str) -> int:
    """A tokenizer-free stand-in: words, which undercount subword tokens by roughly 1.3x."""
    return len(text.split())


def messages_text(messages: Sequence[dict[str, str]]) -> str:
    return "\n".join(m["content"] for m in messages)


def trim_grounding(
    messages: Sequence[dict[str, str]],
    span: Sequence[int],
    max_tokens: int,
    count: TokenCounter,
    overhead: int = 0,
) -> tuple[list[dict[str, str]], tuple[int, int]] | None:
    """(messages that fit, the grounding text's new span), or None when even an empty document
    does not fit. Messages that already fit come back unchanged.

    `overhead` is what the caller's format adds around the messages (chat template tokens).
    The cut keeps the start of the document up to a word boundary, plus `TRIM_MARKER`.
    """
    start, end = span
    total = count(messages_text(messages)) + overhead
    if total <= max_tokens:
        return [dict(m) for m in messages], (start, end)
    user_index = next(i for i, m in enumerate(messages) if m["role"] == "user")
    user = messages[user_index]["content"]
    document = user[start:end]
    allowed = max_tokens - (total - count(document) + count(TRIM_MARKER))
    if allowed <= 0:
        return None
    word_ends = [m.end() for m in _WORD_END.finditer(document)]
    # the most words that fit: a binary search, the count growing with the words kept
    words = bisect.bisect_right(word_ends, allowed, key=lambda end: count(document[:end]))
    if words == 0:
        return None
    kept = document[: word_ends[words - 1]] + TRIM_MARKER
    out = [dict(m) for m in messages]
    out[user_index]["content"] = user[:start] + kept + user[end:]
    return out, (start, start + len(kept))


def trim_pair(pair: Pair, max_tokens: int, count: TokenCounter) -> tuple[Pair | None, bool]:
    """A pair cut to `max_tokens` (prepare's `max_pair_tokens`): (pair, was_trimmed), or
    (None, False) when it cannot fit."""
    cut = trim_grounding(pair.messages, pair.meta["grounding_span"], max_tokens, count)
    if cut is None:
        return None, False
    messages, span = cut
    if span == tuple(pair.meta["grounding_span"]):
        return pair, False
    meta = {**pair.meta, "grounding_span": list(span), "trimmed": True}
    return dataclasses.replace(pair, messages=messages, meta=meta), True
