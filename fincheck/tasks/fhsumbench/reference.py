"""How FHSumBench's reference scorer reads a model's judgement, reproduced.

The benchmark repository scores with `method/score.py` (the same file at every commit that has
it). Its `get_judgement` reads `{"Faithfulness": bool, "Factuality": bool}` from an output in
three stages; fincheck's headline FHSumBench figures use these semantics, so they stand next to
the paper's for any output, not only well-formed ones. The stages, written from what that code
and the libraries it calls (LangChain's `PydanticOutputParser`, pydantic) do. One repair of
LangChain's is not reproduced: its `_custom_parser` escapes raw newlines and quotes inside the
string value of an `"action_input"` key; a judgement has no such key, so only an answer that
adds one could be read differently.

0. Every lowercase `json` is deleted (inside words too) and every backtick: a ```json fence
   disappears; `JSON` stays.
1. parser: the text, stripped, must START with the JSON value. It is read with LangChain's
   partial-JSON repair: Python's json when the whole text parses; else, tracking strings and
   brackets, an unmatched `}`/`]` fails at once, an open string is closed, and the longest
   prefix that parses once the missing closers are appended wins (so trailing prose is fine,
   a truncated object is completed, and of two objects the first one counts). The value must be
   an object with both keys, exact case (other keys are ignored, nothing nested is searched),
   and each value must pass pydantic's lax bool: true/false, 0/1, 0.0/1.0, or (any case, no
   spaces) "true"/"false", "yes"/"no", "y"/"n", "t"/"f", "on"/"off", "1"/"0".
2. fallback 1: with True/False lower-cased everywhere, the text is split on white space and cut
   at the first token that is exactly `{`, `{"Faithfulness":`, `"Faithfulness":`,
   `Faithfulness:`, `"Faithfulness"` or `Faithfulness`; the tokens from there, joined by single
   spaces, go through stage 1 again (prose before a spaced-out object is recovered this way).
3. fallback 2: at every such token (except `{"Faithfulness":`) whose next three tokens include
   a bare true/false, the four tokens from it are wrapped in braces (last match wins; a match
   that runs off the end of the text makes the output invalid): quoted key/value pairs without
   braces are recovered, `Faithfulness: true` lines are not (they are not JSON).
Anything else is invalid, a class of its own in the macro averages (as is faithful +
non-factual). `tests/test_fhsumbench_reference.py` holds the reference's verdict on 40 outputs.
"""

from __future__ import annotations

import json
import re
from typing import Any

KEYS = ("Faithfulness", "Factuality")
_TRUE_WORDS = {"1", "on", "t", "true", "y", "yes"}
_FALSE_WORDS = {"0", "off", "f", "false", "n", "no"}
_CUT_TOKENS = {
    "{",
    '{"Faithfulness":',
    '"Faithfulness":',
    "Faithfulness:",
    '"Faithfulness"',
    "Faithfulness",
}
_REBUILD_TOKENS = _CUT_TOKENS - {'{"Faithfulness":'}
_BOOL_TOKENS = {"true,", "false,", "true", "false"}


class _NoJudgement(Exception):
    pass


def lax_bool(value: Any) -> bool:
    """pydantic's lax coercion of one value to bool (what JSON can hold)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):  # 0, 1, 0.0, -0.0, 1.0
        return bool(value)
    if isinstance(value, str):
        word = value.lower()
        if word in _TRUE_WORDS:
            return True
        if word in _FALSE_WORDS:
            return False
    raise _NoJudgement


def partial_json(text: str) -> Any:
    """LangChain's `parse_partial_json` (strict=False): the value of `text`, of its longest
    prefix that parses once the open strings and brackets are closed, or None when a closing
    bracket does not match. Raises _NoJudgement when nothing parses."""
    try:
        return _loads(text)
    except json.JSONDecodeError:
        pass
    closed = close_partial(text)
    if closed is None:
        return None
    prefix, closers = closed
    tail = "".join(reversed(closers))
    # LangChain drops one character at a time until `prefix + tail` parses: quadratic (88 s on
    # 100 KB). The same longest prefix is found in one pass that follows json's grammar.
    k = _longest_closable(prefix, closers)
    if k == 0:
        raise _NoJudgement
    return _loads(prefix[:k] + tail)


def close_partial(text: str) -> tuple[str, list[str]] | None:
    """LangChain's scan before its prefix search: `text` with raw newlines in strings escaped
    and an open string closed, and the closers still open (innermost last); None when a
    closing bracket does not match."""
    out: list[str] = []
    closers: list[str] = []
    in_string = escaped = False
    for char in text:
        if in_string:
            if char == '"' and not escaped:
                in_string = False
            elif char == "\n" and not escaped:
                char = "\\n"  # a raw newline inside a string is escaped
            elif char == "\\":
                escaped = not escaped
            else:
                escaped = False
        elif char == '"':
            in_string, escaped = True, False
        elif char in "{[":
            closers.append("}" if char == "{" else "]")
        elif char in "}]":
            if not closers or closers[-1] != char:
                return None
            closers.pop()
        out.append(char)
    if in_string:
        if escaped:
            out.pop()
        out.append('"')
    return "".join(out), closers


def _loads(text: str) -> Any:
    """json.loads; nesting past Python's recursion limit or an integer past its digit limit is
    no judgement (the reference catches the exception its parser raises), not a crash."""
    try:
        return json.loads(text, strict=False)
    except (RecursionError, ValueError) as e:
        if isinstance(e, json.JSONDecodeError):
            raise
        raise _NoJudgement from e


_WS = re.compile(r"[ \t\n\r]*")
# a whole string: its body, each escape json reads (a string cut short or a bad escape: no match)
_STRING = re.compile(r'"[^"\\]*(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})[^"\\]*)*"')
# a whole string, number or literal as json reads one (a part of one is never closable)
_SCALAR = re.compile(
    rf"{_STRING.pattern}|-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?"
    r"|true|false|null|NaN|-?Infinity"
)


def _longest_closable(prefix: str, closers: list[str]) -> int:
    """The largest k >= 1 such that json.loads(prefix[:k] + tail, strict=False) parses, where
    tail closes `closers` (innermost last); 0 when none does. One pass over prefix, following
    Python json's grammar: prefix[:k] + tail parses exactly when prefix[:k] reads without an
    error, its open brackets are `closers` and it stands where a closer (or the end) may come:
    after a complete value or just inside an opening bracket. The first character no valid
    text could continue with ends the search, as no longer prefix can parse."""
    n = len(prefix)
    stack: list[str] = []
    match = 0  # the length of the common start of `stack` and `closers`
    full = len(closers)
    best = 0
    # states: "value" (a value is due), "first" (just after [ or {: a value/key or the closer),
    # "key" (a key is due, after a comma in an object), "colon", "after" (a value just ended)
    state = "value"
    i = 0

    def closable() -> bool:
        return match == len(stack) == full

    while i < n:
        c = prefix[i]
        if c in " \t\n\r":
            i = _WS.match(prefix, i).end()
            if state in ("first", "after") and closable():
                best = i
            continue
        top = stack[-1] if stack else ""
        if state in ("value", "first") and not (state == "first" and top == "}"):
            if state == "first" and c == "]":
                pass  # an empty array: closed below
            elif c in "{[":
                closer = "}" if c == "{" else "]"
                if match == len(stack) and len(stack) < full and closers[len(stack)] == closer:
                    match += 1
                stack.append(closer)
                state = "first"
                i += 1
                if closable():
                    best = i
                continue
            elif token := _SCALAR.match(prefix, i):
                i, state = token.end(), "after"
                if closable():
                    best = i
                continue
            else:
                return best
        if state in ("first", "key") and top == "}":
            if state == "first" and c == "}":
                pass
            elif c == '"':
                if not (string := _STRING.match(prefix, i)):
                    return best
                i = string.end()
                state = "colon"
                continue
            else:
                return best
        if state == "colon":
            if c != ":":
                return best
            state = "value"
            i += 1
            continue
        # "after" a value, or "first" with its closer
        if c == "," and state == "after" and top:
            state = "key" if top == "}" else "value"
            i += 1
            continue
        if c in "}]" and top == c:
            stack.pop()
            match = min(match, len(stack))
            state = "after"
            i += 1
            if closable():
                best = i
            continue
        return best
    return best


def _parse(text: str) -> tuple[bool, bool]:
    value = partial_json(text.strip().strip(" \n\r\t`"))
    if not isinstance(value, dict) or any(k not in value for k in KEYS):
        raise _NoJudgement
    return lax_bool(value["Faithfulness"]), lax_bool(value["Factuality"])


def reference_judgement(output: str) -> tuple[tuple[bool, bool] | None, str]:
    """((faithfulness, factuality) or None, the stage that read it: parser / fallback1 /
    fallback2 / invalid), as the reference scorer reads `output`."""
    text = output.replace("json", "").replace("`", "")
    try:
        return _parse(text), "parser"
    except _NoJudgement:
        pass
    tokens = text.replace("True", "true").replace("False", "false").split()
    cut = next((i for i, token in enumerate(tokens) if token in _CUT_TOKENS), None)
    candidate = text if cut is None else " ".join(tokens[cut:])
    failed = {text}  # a text read again fails again: each stage reads a new one only once
    try:
        if candidate not in failed:
            return _parse(candidate), "fallback1"
    except _NoJudgement:
        failed.add(candidate)
    for i, token in enumerate(tokens):
        if token not in _REBUILD_TOKENS:
            continue
        for j in (i + 1, i + 2, i + 3):
            if j >= len(tokens):
                return None, "invalid"  # the reference indexes past the end: an exception
            if tokens[j] in _BOOL_TOKENS:
                candidate = "{" + " ".join(tokens[i : i + 4]).strip(",") + "}"
                break
    try:
        if candidate not in failed:
            return _parse(candidate), "fallback2"
    except _NoJudgement:
        pass
    return None, "invalid"


def cot_judgement(text: str) -> str:
    """The judgement of a chain-of-thought answer: from the last `{` before its last
    "Faithfulness" to the end (the JSON object the CoT prompt asks for after the reasoning);
    the whole answer when it has none. The reference parser then reads it as any answer."""
    key = text.rfind("Faithfulness")
    start = text.rfind("{", 0, key) if key >= 0 else -1
    return text[start:] if start >= 0 else text
