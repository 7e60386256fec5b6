"""Sentence splitting for the stages that need sentences (DeFacto explanations, FIZZ, the FINAL
pipeline): one splitter, so an abbreviation handled in one place is handled everywhere.

A boundary is ., ! or ? (and closing quotes or brackets), then white space, then the next
sentence's first character: a capital letter or digit by default (NLTK's punkt, which FIZZ
uses, rarely breaks before a lowercase word), any letter with `lowercase_starts`. No boundary
after an abbreviation ("Mr.", "Dr.", "Jan.", "e.g.") or after initials ("U.S.", "J. Smith"),
nor, with `keep_quotes`, inside a quotation.
"""

from __future__ import annotations

import re

# Titles, month and common Latin abbreviations, and runs of single-letter initials ("U.S.").
_ABBREVIATION = re.compile(
    r"(?:\b[A-Za-z]\.)+$"
    r"|\b(?:Mr|Mrs|Ms|Dr|St|Jr|Sr|vs|No|Co|Inc|Ltd|Corp|Gen|Col|Lt|Sgt|Capt|Rev|Prof|Gov|Sen|Rep"
    r"|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec|approx|etc|al|e\.g|i\.e)\.$"
)
ABBREVIATION_WINDOW = 16  # characters before a boundary that can hold an abbreviation
_CAPITAL_NEXT = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"')\]]))\s+(?=[\"'(\[]?[A-Z0-9])")
_ANY_NEXT = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"')\]]))\s+(?=[\"'(]?[A-Za-z0-9])")


def ends_in_abbreviation(text: str) -> bool:
    """Whether `text` ends in an abbreviation or an initial ("Sen.", "U.S."): a period that
    ends no sentence."""
    return bool(_ABBREVIATION.search(text, max(0, len(text) - ABBREVIATION_WINDOW)))


def split_sentences(
    text: str, min_chars: int = 0, *, lowercase_starts: bool = False, keep_quotes: bool = False
) -> list[str]:
    """Sentences of `text`, stripped; those of `min_chars` characters or fewer dropped (FIZZ's
    reference code drops sentences and atomic facts of 10 or fewer)."""
    boundary = _ANY_NEXT if lowercase_starts else _CAPITAL_NEXT
    pieces: list[str] = []
    start = 0
    quotes, counted = 0, 0  # '"' in text[:counted]: counted once, whatever the boundaries
    for match in boundary.finditer(text):
        # Linear in the text: each boundary looks back a bounded window only (the longest
        # abbreviation is a few letters; a run of initials matches at its last "X."), never
        # the whole sentence so far, which an answer of "A. A. A. ..." makes as long as itself.
        end = match.start()
        while end > start and text[end - 1] in "\"')] ":
            end -= 1
        if _ABBREVIATION.search(text, max(start, end - ABBREVIATION_WINDOW), end):
            continue
        if keep_quotes:
            quotes += text.count('"', counted, match.end())
            counted = match.end()
            if quotes % 2 == 1:
                continue
        pieces.append(text[start : match.start()].strip())
        start = match.end()
    pieces.append(text[start:].strip())
    return [p for p in pieces if p and len(p) > min_chars]
