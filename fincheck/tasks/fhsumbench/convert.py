"""FHSumBench: one (source, summary, label) record -> one instruction pair.

Target: the JSON judgement `{"Faithfulness": bool, "Factuality": bool}` of the label
(no_hallu = faithful + factual; factual_hallu = unfaithful + factual; non_factual_hallu =
unfaithful + non-factual). The 1,336 samples share 466 documents, so the split groups by document.
"""

from __future__ import annotations

import hashlib
import json

from fincheck.data.pairs import Pair
from fincheck.data.prompting import Prompt
from fincheck.data.raw_records import RawRecord, require
from fincheck.errors import InvalidRecordError
from fincheck.tasks.fhsumbench.metrics import JUDGEMENTS, LABELS


def document_key(text: str) -> str:
    """Group key of a source document: samples with the same source share it."""
    return hashlib.sha256(" ".join(text.split()).encode("utf-8")).hexdigest()[:16]


def convert_fhsumbench(raw: RawRecord, split: str, prompt: Prompt) -> Pair:
    record = raw.value
    source = require(record, "source", str, raw, non_empty=True)
    summary = require(record, "summary", str, raw, non_empty=True)
    label = require(record, "label", str, raw)
    sample_id = require(record, "id", (int, str), raw)
    hallu_span = require(record, "hallu_span", str, raw)
    if label not in LABELS:
        raise InvalidRecordError(raw.path, raw.line, "label", f"{label!r} not in {LABELS}")

    messages, span = prompt.messages(text=source, summary=summary)
    # the answer trained on: the label's judgement as the JSON object the prompt asks for
    target = json.dumps(dict(zip(("Faithfulness", "Factuality"), JUDGEMENTS[label], strict=True)))
    return Pair(
        id=f"fhsumbench-{sample_id}",
        task="fhsumbench",
        split=split,
        messages=[*messages, {"role": "assistant", "content": target}],
        meta={
            "label": label,
            "source_id": str(sample_id),
            "hallu_span": hallu_span,
            "group": document_key(source),
            "grounding_span": list(span),
        },
    )
