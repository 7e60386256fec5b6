"""How FHSumBench's reference scorer reads a model's judgement, reproduced exactly.

The benchmark repository scores with `method/score.py` (the same file at every commit that has
it). Its `get_judgement` reads `{"Faithfulness": bool, "Factuality": bool}` from an output in
three stages; fincheck's headline FHSumBench figures use exactly these semantics, so they stand
next to the paper's for any output, not only well-formed ones. The stages, written from what
that code and the libraries it calls (LangChain's `PydanticOutputParser`, pydantic) do:

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
        return json.loads(text, strict=False)
    except json.JSONDecodeError:
        pass
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
    tail = "".join(reversed(closers))
    # LangChain drops one character at a time until `prefix + tail` parses: quadratic (88 s on
    # 100 KB). The same longest prefix, found by jumping: json reads left to right, so when
    # `prefix[:k] + tail` fails at position p < k, every prefix[:k'] with p < k' <= k fails at p
    # too (the same characters up to p; a cut inside an open string leaves it open, the tail
    # holds no quote), and the next prefix that can parse is prefix[:p].
    prefix = "".join(out)
    k = len(prefix)
    while k > 0:
        try:
            return json.loads(prefix[:k] + tail, strict=False)
        except json.JSONDecodeError as e:
            k = e.pos if e.pos < k else k - 1
    raise _NoJudgement


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
    try:
        return _parse(candidate), "fallback1"
    except _NoJudgement:
        pass
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
        return _parse(candidate), "fallback2"
    except _NoJudgement:
        return None, "invalid"
