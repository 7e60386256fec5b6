"""Silver FINAL-style descriptions from DeFacto's free-text `feedback.explanation`.

An explanation often merges several errors ("X is not mentioned. Also it hallucinates Y.");
FINAL wants one self-contained description per inconsistency. We split only where the split is
safe: the annotator listed several edit instructions (`instruction_list`) and the explanation has
several sentences, no more than the instructions (more sentences than edits means some
sentences only add context: the explanation stays whole). Each piece loses its connective ("Also", "In addition") and a leading "it"
becomes "The summary", so it reads on its own. Everything else is kept as written; explanations
that enumerate several errors inside one sentence are left whole (the hard 27% of the FINAL paper).
"""

from __future__ import annotations

import re

from fincheck.data.sentences import split_sentences as split_into_sentences

_CONNECTIVE = re.compile(
    r"^(?:also|additionally|in addition|furthermore|moreover|plus|and|first|firstly|second|secondly|third|thirdly|finally|lastly|"
    r"another (?:error|mistake|problem|issue) is that)\s*[,:]?\s+",
    re.IGNORECASE,
)
_LEADING_IT = re.compile(r"^(?:it|they)\s+(?=(?:also\s+)?[a-z])", re.IGNORECASE)
# A sentence that only comments on the previous one ("This is not in the source.") is no error of its own.
_CONTINUATION = re.compile(
    r"^(?:this|that|these|those|which|neither|nor|none|both|so)\b", re.IGNORECASE
)
_AFFIRMATION = re.compile(
    r"\b(?:does|do|is|are)\s+(?:support(?:ed|s)?|correct|accurate|fine|right)\b"
    r"|\bit does support\b",
    re.IGNORECASE,
)


def split_sentences(text: str) -> list[str]:
    """Sentences of an explanation: "U.S." and "Mr." stay inside theirs, so do quotations, and
    annotators' sentences may start in lower case."""
    return split_into_sentences(text, lowercase_starts=True, keep_quotes=True)


def tidy(description: str) -> str:
    """Collapse white space, capitalize, end with punctuation."""
    description = " ".join(description.split())
    if not description:
        return description
    description = description[0].upper() + description[1:]
    if description[-1] not in ".!?\"')":
        description += "."
    return description


def make_self_contained(piece: str) -> str:
    piece = _CONNECTIVE.sub("", piece.strip())
    piece = _LEADING_IT.sub("The summary ", piece)
    piece = re.sub(r"^The summary also\s+", "The summary ", piece)
    return tidy(piece)


def explanation_to_descriptions(explanation: str, n_instructions: int) -> tuple[list[str], bool]:
    """(descriptions, was_split) for one inconsistent DeFacto item."""
    whole = tidy(explanation)
    if n_instructions < 2:
        return [whole], False
    merged: list[str] = []
    for sentence in split_sentences(" ".join(explanation.split())):
        if merged and _CONTINUATION.match(sentence):
            merged[-1] = f"{merged[-1]} {sentence}"
        else:
            merged.append(sentence)
    pieces = [make_self_contained(s) for s in merged]
    pieces = [p for p in pieces if len(p.split()) >= 3 and not _AFFIRMATION.search(p)]
    if not 2 <= len(pieces) <= n_instructions:
        return [whole], False
    return pieces, True
