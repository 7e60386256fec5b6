"""The one JSONL reader: each non-blank line a JSON object, errors located as `file:line`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fincheck.errors import InvalidRecordError


def iter_json_objects(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line; a bad line raises `InvalidRecordError`."""
    with Path(path).open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                problem = f"not valid JSON ({e.msg} at column {e.colno}; truncated line?)"
                raise InvalidRecordError(str(path), line_no, "<json>", problem) from None
            if not isinstance(record, dict):
                problem = f"expected a JSON object, got {type(record).__name__}"
                raise InvalidRecordError(str(path), line_no, "<record>", problem)
            yield line_no, record
