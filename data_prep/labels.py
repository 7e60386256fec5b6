"""Label conventions and target formats, in one place (they are easy to get wrong).

- QASem QA `annotations`: 1 = NOT supported (hallucinated), 0 = supported; gold = majority of 3.
- FHSumBench: label <-> {"Faithfulness", "Factuality"} judgement.
- FINAL: descriptions as lettered lines "A. ...", or "None" when consistent.
"""

from __future__ import annotations

import json
import string

QASEM_SUPPORTED, QASEM_NOT_SUPPORTED = "Yes", "No"

FHSUM_LABELS = ("factual_hallu", "non_factual_hallu", "no_hallu")
FHSUM_JUDGEMENT = {
    "no_hallu": {"Faithfulness": True, "Factuality": True},
    "factual_hallu": {"Faithfulness": False, "Factuality": True},
    "non_factual_hallu": {"Faithfulness": False, "Factuality": False},
}
FINAL_NONE = "None"


def qasem_target(annotations: list[int]) -> str:
    """Majority of the annotators' votes, where 1 means the QA is not supported."""
    not_supported = sum(annotations)
    return QASEM_NOT_SUPPORTED if 2 * not_supported > len(annotations) else QASEM_SUPPORTED


def fhsum_target(label: str) -> str:
    return json.dumps(FHSUM_JUDGEMENT[label])


def letter(index: int) -> str:
    """A, B, ..., Z, AA, AB, ... (lists longer than 26 stay unambiguous)."""
    letters = string.ascii_uppercase
    out = ""
    index += 1
    while index:
        index, rem = divmod(index - 1, 26)
        out = letters[rem] + out
    return out


def final_target(descriptions: list[str]) -> str:
    if not descriptions:
        return FINAL_NONE
    return "\n".join(f"{letter(i)}. {d}" for i, d in enumerate(descriptions))
