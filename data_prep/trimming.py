"""Fit a pair into a token budget by cutting its grounding text, never its target.

The grounding text is the only part that can be long (a news article, a Wikipedia page, cited
sources); the instructions, the summary or QA, and the target must stay whole. A pair that does
not fit even with an empty document is dropped. Both outcomes are counted by the callers.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

from fincheck.pairs import Pair

TokenCounter = Callable[[str], int]
TRIM_MARKER = " [...]"  # tells the model (and a reader) that the document was cut here
_WORD_END = re.compile(r"\S+")


def count_whitespace_tokens(text: str) -> int:
    """A tokenizer-free stand-in: words, which undercount subword tokens by roughly 1.3x."""
    return len(text.split())


def load_token_counter(tokenizer: str | None) -> TokenCounter:
    """Count with a Hugging Face tokenizer (name or path) when given, else by words."""
    if not tokenizer:
        return count_whitespace_tokens
    from transformers import AutoTokenizer  # heavy import only when asked for

    tok = AutoTokenizer.from_pretrained(tokenizer)
    return lambda text: len(tok(text, add_special_tokens=False)["input_ids"])


def pair_text(pair: Pair) -> str:
    return "\n".join(m["content"] for m in pair.messages)


def trim_grounding(
    pair: Pair, max_tokens: int, count: TokenCounter, overhead: int = 0
) -> tuple[Pair | None, bool]:
    """(pair that fits, was_trimmed); (None, False) when even an empty document does not fit.

    `overhead` is what the caller's format adds around the messages (chat template tokens).
    """
    total = count(pair_text(pair)) + overhead
    if total <= max_tokens:
        return pair, False
    start, end = pair.meta["grounding_span"]
    user_index = next(i for i, m in enumerate(pair.messages) if m["role"] == "user")
    user = pair.messages[user_index]["content"]
    document = user[start:end]
    fixed = total - count(document) + count(TRIM_MARKER)
    allowed = max_tokens - fixed
    if allowed <= 0:
        return None, False
    word_ends = [m.end() for m in _WORD_END.finditer(document)]
    lo, hi = 0, len(word_ends)  # largest k with count(first k words) <= allowed
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(document[: word_ends[mid - 1]]) <= allowed:
            lo = mid
        else:
            hi = mid - 1
    if lo == 0:
        return None, False
    kept = document[: word_ends[lo - 1]] + TRIM_MARKER
    messages = [dict(m) for m in pair.messages]
    messages[user_index]["content"] = user[:start] + kept + user[end:]
    meta = {**pair.meta, "grounding_span": [start, start + len(kept)], "trimmed": True}
    return dataclasses.replace(pair, messages=messages, meta=meta), True
