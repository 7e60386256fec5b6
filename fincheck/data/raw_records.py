"""Reading raw benchmark files with a line number for every record.

Readers never stop on a bad record themselves: they yield `RawRecord`s that carry either the
decoded object or the `InvalidRecordError` that describes what is wrong, so the caller decides
between stopping (the default) and `--skip-invalid`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fincheck.errors import FincheckError, InvalidRecordError
from fincheck.io import jsonl
from fincheck.io.jsonl import decode_object_line
from fincheck.io.safe_files import open_regular_file

if TYPE_CHECKING:
    from fincheck.data.pairs import Pair


@dataclass(frozen=True)
class RawRecord:
    path: str
    line: int
    value: Any = None
    error: InvalidRecordError | None = None


def iter_jsonl(path: Path) -> Iterator[RawRecord]:
    """One record per non-blank line; a line that is not a JSON object (or not UTF-8) is an
    error record naming the file and line."""
    n = 0
    with open(open_regular_file(path), "rb") as f:  # a FIFO is one line, never a wait
        for line_no, raw in enumerate(f, start=1):
            if line_no == 1:
                raw = raw.removeprefix(b"\xef\xbb\xbf")  # a byte-order mark is no record
            if not raw.strip():
                continue
            n += 1
            try:
                line = raw.decode("utf-8")
                record = RawRecord(str(path), line_no, decode_object_line(path, line_no, line))
            except UnicodeDecodeError as e:
                problem = f"not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1})"
                error = InvalidRecordError(str(path), line_no, "<encoding>", problem)
                record = RawRecord(str(path), line_no, error=error)
            except InvalidRecordError as e:
                record = RawRecord(str(path), line_no, error=e)
            yield record
    if n == 0:
        raise FincheckError(f"{path}: the file is empty (no records)")


def iter_json_array(path: Path) -> Iterator[RawRecord]:
    """Elements of a top-level JSON array (or of its `data` field), each with its start line."""
    text = jsonl.read_utf8_text(path)
    if not text.strip():
        raise FincheckError(f"{path}: the file is empty (no records)")
    try:
        document = jsonl.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidRecordError(
            str(path), e.lineno, "<json>", f"not valid JSON ({e.msg}; truncated file?)"
        ) from None
    if isinstance(document, dict) and isinstance(document.get("data"), list):
        document = document["data"]
    if not isinstance(document, list):
        raise InvalidRecordError(str(path), 1, "<json>", "expected a JSON array of records")
    if not document:
        raise FincheckError(f"{path}: the file is empty (no records)")
    lines = _element_lines(text, len(document))
    for value, line_no in zip(document, lines, strict=True):
        if isinstance(value, dict):
            yield RawRecord(str(path), line_no, value)
        else:  # an error record, as a JSONL line that is not an object
            problem = f"expected a JSON object, got {type(value).__name__}"
            error = InvalidRecordError(str(path), line_no, "<record>", problem)
            yield RawRecord(str(path), line_no, error=error)


def _element_lines(text: str, count: int) -> list[int]:
    """Start line of each top-level array element, found by decoding them one after another."""
    decoder = json.JSONDecoder()
    start = _array_start(text, decoder)
    lines: list[int] = []
    pos, last, line = start + 1, 0, 1  # `line` is the line of text[last]
    for _ in range(count):
        while text[pos] in " \t\r\n,":
            pos += 1
        line += text.count("\n", last, pos)
        lines.append(line)
        last = pos
        _, pos = decoder.raw_decode(text, pos)
    return lines


def _array_start(text: str, decoder: json.JSONDecoder) -> int:
    """Where the records' array starts: the document, or its top-level `data` member's value
    (the last one, as a JSON reader keeps it), found by decoding the object's members in turn,
    never by searching the text ("data" may be spelled with escapes, or stand in a value)."""
    pos = len(text) - len(text.lstrip())
    if text[pos] == "[":
        return pos
    found, pos = pos, pos + 1
    while True:
        pos = len(text) - len(text[pos:].lstrip(" \t\r\n,"))
        if text[pos] == "}":
            return found
        key, pos = decoder.raw_decode(text, pos)
        pos = len(text) - len(text[pos:].lstrip(" \t\r\n:"))
        if key == "data":
            found = pos
        _, pos = decoder.raw_decode(text, pos)


def iter_records(path: Path) -> Iterator[RawRecord]:
    """JSONL or JSON array, by content: a file whose first character is '[' is a JSON array."""
    path = Path(path)
    with open(open_regular_file(path), "rb") as f:  # only to tell the two apart (and a FIFO)
        head = f.read(4096).decode("utf-8", errors="replace").lstrip("\ufeff \t\r\n")
    if head.startswith("[") or (head.startswith("{") and path.suffix == ".json"):
        return iter_json_array(path)
    return iter_jsonl(path)


def require(
    record: dict[str, Any],
    field: str,
    kind: type | tuple[type, ...],
    where: RawRecord,
    non_empty: bool = False,
    shown_as: str | None = None,
) -> Any:
    """The value of `field`, or an `InvalidRecordError` naming file, line and field (as `shown_as`
    when given: the path of a field inside a nested object, "qas[3].qa_id")."""
    name = shown_as or field
    if field not in record:
        raise InvalidRecordError(where.path, where.line, name, "missing")
    value = record[field]
    bool_for_number = isinstance(value, bool) and kind in (int, float, (int, float))
    if bool_for_number or not isinstance(value, kind):
        names = " or ".join(k.__name__ for k in kind) if isinstance(kind, tuple) else kind.__name__
        got = "a boolean" if bool_for_number else type(value).__name__
        raise InvalidRecordError(where.path, where.line, name, f"expected {names}, got {got}")
    if non_empty and not (value.strip() if isinstance(value, str) else value):
        raise InvalidRecordError(where.path, where.line, name, "is empty")
    return value


class RecordStream:
    """Validated records of the run's sources; counts what `--skip-invalid` skipped."""

    def __init__(self, skip_invalid: bool) -> None:
        self.skip_invalid = skip_invalid
        self.skipped: Counter[str] = Counter()
        self.first_error: dict[str, str] = {}

    def convert(
        self,
        label: str,
        raws: Iterable[RawRecord],
        key: Callable[[dict], Any] | None,
        convert: Callable[[RawRecord], Pair | list[Pair]],
    ) -> Iterator[Pair]:
        """Convert each record; a bad record, a record whose `key` (what names it in its
        source, if it has such a name) an earlier one had, or one whose pairs' ids an earlier
        record's took (an id given as 1 and as "1", or none twice), stops the run (or is
        skipped)."""
        seen: dict[Any, int] = {}
        for raw in raws:
            try:
                if raw.error is not None:
                    raise raw.error
                converted = convert(raw)
                pairs = converted if isinstance(converted, list) else [converted]
                keys = [("record", key(raw.value))] if key else []
                keys += [("pair", p.id) for p in pairs]
                for taken in keys:
                    if taken in seen:
                        raise InvalidRecordError(
                            raw.path,
                            raw.line,
                            "id",
                            f"duplicate record {taken[1]!r} (first at line {seen[taken]})",
                        )
                seen.update(dict.fromkeys(keys, raw.line))
            except InvalidRecordError as e:
                if not self.skip_invalid:
                    raise FincheckError(f"{e} (use --skip-invalid to skip such records)") from None
                self.skipped[label] += 1
                self.first_error.setdefault(label, str(e))
                continue
            yield from pairs

    def convert_file(
        self,
        label: str,
        path: Path,
        key: Callable[[dict], Any] | None,
        convert: Callable[[RawRecord], Pair | list[Pair]],
    ) -> list[Pair]:
        """`convert` over every record of the file at `path` (`iter_records`)."""
        return list(self.convert(label, iter_records(path), key, convert))
