"""FINAL's list format, defined once: descriptions as lettered lines ("A. ...", "B. ...",
after Z: "AA.", "AB.", ...), "None" when the summary is consistent. Training targets, the
judge's prompt and the papers' pipeline all write lists this way."""

from __future__ import annotations

from collections.abc import Sequence

NONE = "None"


def _letter(i: int) -> str:
    """The i-th identifier (from 0) in bijective base 26: Z is followed by AA."""
    return (_letter(i // 26 - 1) if i >= 26 else "") + chr(ord("A") + i % 26)


def letters(n: int) -> list[str]:
    """Identifiers for n items: A..Z, then AA, AB, ... (unambiguous past 26)."""
    return [_letter(i) for i in range(n)]


def lettered(items: Sequence[str]) -> str:
    """ "A. first\\nB. second" (empty for no items)."""
    return "\n".join(
        f"{name}. {item}" for name, item in zip(letters(len(items)), items, strict=True)
    )


def final_target(descriptions: Sequence[str]) -> str:
    """The answer FINAL is trained to give: the lettered list, or "None"."""
    return lettered(descriptions) if descriptions else NONE
