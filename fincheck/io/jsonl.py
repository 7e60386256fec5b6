"""Reading JSON files: JSONL (each non-blank line an object, errors at `file:line`) and single
JSON objects (run metadata, results)."""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fincheck.errors import FincheckError, InvalidRecordError
from fincheck.io.safe_files import open_own_file, open_regular_file, read_regular_bytes
from fincheck.io.secrets import redacted_value


def loads(text: str, **kwargs: Any) -> Any:
    """`json.loads` for text fincheck did not write (a model's reply, a user's file, a cache
    line): whatever makes it unreadable is a `json.JSONDecodeError`, the one error callers
    handle, never a crash. Beyond syntax that is nesting past Python's recursion limit
    (`[[[[...` 200,000 deep) or past `MAX_DEPTH` (what fincheck's recursive helpers, such as
    the redaction of a record, take: 600 deep crashed them), integers past its digit limit
    (4,301 digits), and a lone surrogate escape (`"\\ud800"`): JSON allows it, but it is no
    character, and it would crash the first write or tokenizer it reached. A key given twice in
    one object is refused too: which of its values counts is no reader's to guess (Python's
    keeps the last, others the first)."""
    try:
        value = json.loads(text, object_pairs_hook=_without_repeated_keys, **kwargs)
    except json.JSONDecodeError:
        raise
    except RepeatedKey as e:
        raise json.JSONDecodeError(str(e), str(text)[:200], 0) from None
    except RecursionError:
        raise json.JSONDecodeError("nested deeper than can be read", str(text)[:200], 0) from None
    except ValueError as e:  # an integer past sys.get_int_max_str_digits()
        raise json.JSONDecodeError(" ".join(str(e).split())[:120], str(text)[:200], 0) from None
    if _nested_past(value, MAX_DEPTH, text):
        raise json.JSONDecodeError(f"nested deeper than {MAX_DEPTH} levels", str(text)[:200], 0)
    if isinstance(text, str) and _SURROGATE_ESCAPE.search(text) and _holds_surrogate(value):
        lone = _LONE_ESCAPE.search(text)
        at = lone.start() if lone else 0
        escape = text[at : at + 6] if lone else "\\ud800"
        raise json.JSONDecodeError(f"a lone surrogate escape ({escape}), no character", text, at)
    return value


class RepeatedKey(ValueError):
    """A JSON object that gives one key twice."""


def _without_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise RepeatedKey(f"the key {json.dumps(key)[:80]} given twice in one object")
            seen.add(key)
    return value


# As a recipe's YAML: no record fincheck reads is nested half as deep.
MAX_DEPTH = 64


def _nested_past(value: Any, limit: int, text: str | bytes) -> bool:
    """Whether `value` nests lists and objects more than `limit` deep. Only text holding that
    many brackets is walked (without recursion)."""
    opening = (b"[", b"{") if isinstance(text, bytes) else ("[", "{")
    if sum(text.count(o) for o in opening) <= limit:
        return False
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            inner = item.values() if isinstance(item, dict) else item
            stack += [(v, depth + 1) for v in inner if isinstance(v, (dict, list))]
    return False


# Only text holding a surrogate escape is walked: a valid pair ("\\ud83d\\ude00") decodes to
# one character, so a surrogate left in the parsed value is a lone one.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_LONE_ESCAPE = re.compile(
    r"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F])|(?<![0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)
_SURROGATE = re.compile("[\ud800-\udfff]")


def strings_in(value: Any) -> Iterator[str]:
    """Every string of a parsed JSON value, keys included (iterative: no recursion limit)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            stack += [*item.keys(), *item.values()]
        elif isinstance(item, list):
            stack += item


def _holds_surrogate(value: Any) -> bool:
    return any(_SURROGATE.search(text) for text in strings_in(value))


def without_lone_surrogates(text: str) -> str:
    """A text from a library or a server (a reply parsed by someone else's JSON reader) with
    each lone surrogate replaced by U+FFFD, so that it can be written, tokenized and printed."""
    return _SURROGATE.sub("\ufffd", text)


def loads_object(text: str) -> dict[str, Any]:
    """A JSON object given as text (a command-line option), or a one-line error."""
    try:
        parsed = loads(text)
    except json.JSONDecodeError as e:
        raise FincheckError(f"not JSON: {e}") from None
    if not isinstance(parsed, dict):
        raise FincheckError("expected a JSON object")
    return parsed


def decode_object_line(path: str | Path, line_no: int, line: str) -> dict[str, Any]:
    """One JSONL line as an object, or `InvalidRecordError` at `file:line`. A byte-order mark
    that opens the file (an editor's UTF-8 with BOM) is not part of the first record."""
    if line_no == 1:
        line = line.removeprefix("\ufeff")
    try:
        record = loads(line)
    except json.JSONDecodeError as e:
        cut = "" if e.msg.startswith("a lone surrogate") else "; truncated line?"
        problem = f"not valid JSON ({e.msg} at column {e.colno}{cut})"
        raise InvalidRecordError(str(path), line_no, "<json>", problem) from None
    if not isinstance(record, dict):
        problem = f"expected a JSON object, got {type(record).__name__}"
        raise InvalidRecordError(str(path), line_no, "<record>", problem)
    return record


def read_utf8_text(path: str | Path) -> str:
    """A whole text file (without the byte-order mark an editor may open it with), or a one-line
    error naming the line with the first non-UTF-8 byte."""
    raw = read_regular_bytes(path)
    try:
        return raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        line_no = raw.count(b"\n", 0, e.start) + 1
        raise FincheckError(
            f"{path}:{line_no}: not UTF-8 text (byte 0x{raw[e.start]:02x}); save it as UTF-8"
        ) from None


def iter_json_objects(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line; a bad line (not JSON, not an object,
    not UTF-8) raises `InvalidRecordError`."""
    with os.fdopen(open_regular_file(path), "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            if line_no == 1:
                raw = raw.removeprefix(b"\xef\xbb\xbf")  # a byte-order mark is no record
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                problem = f"not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1})"
                raise InvalidRecordError(str(path), line_no, "<encoding>", problem) from None
            if line.strip():
                yield line_no, decode_object_line(path, line_no, line)


def read_json_object(path: str | Path) -> dict[str, Any]:
    """A JSON file whose top level is an object, or a one-line error naming the file."""
    path = Path(path)
    try:
        data = loads(read_utf8_text(path))
    except json.JSONDecodeError as e:
        cut = "" if e.doc.rstrip().endswith(("}", "]")) else "; the file looks cut short"
        raise FincheckError(
            f"{path}:{e.lineno}: not valid JSON: {e.msg} (column {e.colno}){cut}"
        ) from None
    if not isinstance(data, dict):
        raise FincheckError(f"{path}: expected a JSON object")
    return data


_JSON_KINDS = {
    dict: "an object",
    list: "a list",
    str: "a text",
    int: "an integer",
    float: "a number",
    bool: "true or false",
    type(None): "null",
}


def check_shape(value: Any, shape: Any, where: str, required: tuple[str, ...] = ()) -> None:
    """A record read back (fincheck wrote it; a user may have edited it) has the shape its
    readers rely on, or one line naming `where` and the place in it. `shape`: a type or a tuple
    of types; {key: shape} for an object whose listed keys, where present, have theirs; {str:
    shape} for an object of any keys; [shape] for a list. A bool is no number here, and a number
    is a finite one (no NaN, no infinity, no integer past a float's range). `required`: the
    top-level keys it must have."""
    missing = [key for key in required if not isinstance(value, dict) or key not in value]
    if missing:
        raise FincheckError(f"{where}: no {', '.join(missing)} (edited or damaged since written)")
    stack: list[tuple[Any, Any, str]] = [(value, shape, "")]
    while stack:
        value, shape, at = stack.pop()
        if isinstance(shape, dict) and list(shape) == [str]:
            expected: Any = dict
        elif isinstance(shape, (dict, list)):
            expected = type(shape)
        else:
            expected = shape
        number = expected in (int, float) or (isinstance(expected, tuple) and float in expected)
        if number and not isinstance(value, bool) and isinstance(value, (int, float)):
            try:
                finite = math.isfinite(float(value))
            except OverflowError:  # an integer of 400 digits
                finite = False
            if not finite:
                raise FincheckError(
                    f"{where}: {at.lstrip('.') or 'the whole'} is {value!r:.40}, not a finite "
                    "number (edited or damaged since fincheck wrote it)"
                )
        if not isinstance(value, expected) or (number and isinstance(value, bool)):
            names = expected if isinstance(expected, tuple) else (expected,)
            kind = " or ".join(_JSON_KINDS[t] for t in names)
            raise FincheckError(
                f"{where}: {at.lstrip('.') or 'the whole'} is {_JSON_KINDS[type(value)]}, not "
                f"{kind} (edited or damaged since fincheck wrote it)"
            )
        if isinstance(shape, dict) and list(shape) == [str]:
            stack += [(v, shape[str], f"{at}.{k}") for k, v in value.items()]
        elif isinstance(shape, dict):
            stack += [(value[k], s, f"{at}.{k}") for k, s in shape.items() if k in value]
        elif isinstance(shape, list):
            stack += [(v, shape[0], f"{at}[{i}]") for i, v in enumerate(value)]


def read_json_record(
    path: str | Path, shape: Any, required: tuple[str, ...] = ()
) -> dict[str, Any] | None:
    """A record fincheck wrote and reads back: None when nothing is at `path`; else the JSON
    object it holds, of `shape` (`check_shape`). Whatever else is there (a FIFO, a folder, a
    dangling link, bad JSON, another shape) is one line, never read as no record."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return None
    record = read_json_object(path)
    check_shape(record, shape, str(path), required)
    return record


def strict_json(value: Any) -> Any:
    """NaN (an undefined figure) -> null, recursively: `json.dumps` would write `NaN`, which
    is not JSON and breaks strict readers (jq, JavaScript, other languages)."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value


def record_json(value: Any, indent: int | None = None) -> str:
    """A record as fincheck writes it: strict JSON (`strict_json`), every string redacted as a
    value before it is serialised (`redacted_value`: a held secret is found unescaped)."""
    return json.dumps(redacted_value(strict_json(value)), ensure_ascii=False, indent=indent)


def drop_torn_last_line(path: str | Path) -> bool:
    """Remove a last line that a crash or a full disk left without its newline (an append-only
    log's partial write), so the next append starts on a line of its own. True if one was."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return False
    fd = open_own_file(path, os.O_RDWR)  # read and cut through one descriptor: no link, no FIFO
    try:
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read()
        if not data or data.endswith(b"\n"):
            return False
        os.ftruncate(fd, data.rfind(b"\n") + 1)
    finally:
        os.close(fd)
    return True
