"""A user-supplied FINAL file (the release is not public here) as FINAL evaluation pairs.

Accepts JSONL or a JSON array, one item per record: `{id, text, summary, inconsistencies, split?}`
with common aliases (document/source/article for text; descriptions/errors for
inconsistencies). An empty list means the summary is consistent. Items marked `"split": "dev"`
(the release has 140) go to final/dev, all others to final/test: the paper's numbers are on the
1,265 test items.
"""

from __future__ import annotations

from fincheck.data.pairs import Pair
from fincheck.data.prompting import Prompt
from fincheck.data.raw_records import RawRecord
from fincheck.errors import InvalidRecordError
from fincheck.tasks.final.defacto import final_pair

TEXT_FIELDS = ("text", "document", "source", "article")
SUMMARY_FIELDS = ("summary", "candidate", "output", "response")
LIST_FIELDS = ("inconsistencies", "descriptions", "errors")


def _first_field(record: dict, names: tuple[str, ...], raw: RawRecord) -> tuple[str, object]:
    present = [n for n in names if n in record]
    if not present:
        raise InvalidRecordError(
            raw.path, raw.line, names[0], f"missing (also accepted: {', '.join(names[1:])})"
        )
    return present[0], record[present[0]]


def convert_final_item(raw: RawRecord, prompt: Prompt) -> Pair:
    record = raw.value
    text_field, text = _first_field(record, TEXT_FIELDS, raw)
    summary_field, summary = _first_field(record, SUMMARY_FIELDS, raw)
    list_field, items = _first_field(record, LIST_FIELDS, raw)
    for name, value in ((text_field, text), (summary_field, summary)):
        if not isinstance(value, str) or not value.strip():
            raise InvalidRecordError(raw.path, raw.line, name, "expected a non-empty string")
    if isinstance(items, dict):  # {"A": "...", "B": "..."}
        items = [items[k] for k in sorted(items, key=lambda k: (len(k), k))]
    if not isinstance(items, list) or not all(isinstance(d, str) and d.strip() for d in items):
        raise InvalidRecordError(
            raw.path, raw.line, list_field, "expected a list of non-empty strings"
        )
    item_id = record.get("id", f"final-{raw.line}")
    if not isinstance(item_id, (str, int)) or isinstance(item_id, bool):
        raise InvalidRecordError(raw.path, raw.line, "id", "expected a string or an integer")
    origin = record.get("origin") if isinstance(record.get("origin"), dict) else {}
    split = "dev" if record.get("split") == "dev" else "test"  # the paper reports on test
    return final_pair(
        str(item_id),
        split,
        text,
        summary,
        [" ".join(d.split()) for d in items],
        meta={"origin": "final", "final_split": record.get("split"), "source": origin},
        prompt=prompt,
    )
