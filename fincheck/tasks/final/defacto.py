"""DeFacto -> FINAL-style pairs: consistent items get `None`, inconsistent items a lettered list
of descriptions derived from `feedback.explanation` (see `descriptions.py`).

Pair ids are `defacto-<split>-<doc_id>`, the same ids the FINAL release uses for its items, so a
FINAL file and DeFacto can be matched item by item.
"""

from __future__ import annotations

from fincheck.data.pairs import Pair
from fincheck.data.prompting import Prompt
from fincheck.data.raw_records import RawRecord, require
from fincheck.errors import InvalidRecordError
from fincheck.tasks.final.descriptions import explanation_to_descriptions
from fincheck.tasks.final.lettering import final_target


def final_pair(
    pair_id: str,
    split: str,
    text: str,
    summary: str,
    descriptions: list[str],
    meta: dict,
    prompt: Prompt,
) -> Pair:
    """The one place a FINAL-task pair is built (from DeFacto or from a FINAL file), with the
    task's prompt (`Task.prompt`)."""
    messages, span = prompt.messages(text=text, summary=summary)
    return Pair(
        id=pair_id,
        task="final",
        split=split,
        messages=[*messages, {"role": "assistant", "content": final_target(descriptions)}],
        meta={
            "label": "inconsistent" if descriptions else "consistent",
            "descriptions": descriptions,
            "summary": summary,  # what the judge compares the descriptions against
            **meta,
            "grounding_span": list(span),
        },
    )


def convert_defacto(raw: RawRecord, source_split: str, split: str, prompt: Prompt) -> Pair:
    record = raw.value
    article = require(record, "article", str, raw, non_empty=True)
    candidate = require(record, "candidate", str, raw, non_empty=True)
    doc_id = require(record, "doc_id", int, raw)
    has_error = require(record, "has_error", bool, raw)
    feedback = require(record, "feedback", dict, raw)
    descriptions: list[str] = []
    was_split = False
    n_instructions = 0
    if has_error:
        explanation = feedback.get("explanation")
        if not isinstance(explanation, str) or not explanation.strip():
            raise InvalidRecordError(
                raw.path,
                raw.line,
                "feedback.explanation",
                "an item with has_error=true needs a non-empty explanation",
            )
        instructions = feedback.get("instruction_list", [])
        if not isinstance(instructions, list):
            raise InvalidRecordError(
                raw.path, raw.line, "feedback.instruction_list", "expected a list"
            )
        n_instructions = len(instructions)
        descriptions, was_split = explanation_to_descriptions(explanation, n_instructions)
    return final_pair(
        f"defacto-{source_split}-{doc_id}",
        split,
        article,
        candidate,
        descriptions,
        meta={
            "origin": "defacto",
            "source_split": source_split,
            "doc_id": doc_id,
            "intrinsic_error": record.get("intrinsic_error"),
            "extrinsic_error": record.get("extrinsic_error"),
            "n_instructions": n_instructions,
            "explanation_split": was_split,
        },
        prompt=prompt,
    )
