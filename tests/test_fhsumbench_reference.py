"""FHSumBench judgements read exactly as the benchmark's reference scorer reads them.

Each row: a model output, the (faithfulness, factuality) the reference's `get_judgement`
returns for it (None: invalid) and the stage that read it. The verdicts were derived by reading
the reference code and confirmed by running it (with the LangChain and pydantic versions of the
benchmark's release; they agree from langchain 0.1.6 on), including the outputs the reference
treats in surprising ways.
"""

from __future__ import annotations

import pytest

from fincheck.tasks.fhsumbench.metrics import judgement_to_label
from fincheck.tasks.fhsumbench.reference import reference_judgement

# fmt: off
CASES = [
    # exact JSON, both true
    ('{"Faithfulness": true, "Factuality": true}', (True, True), 'parser'),
    # exact JSON, unfaithful+factual
    ('{"Faithfulness": false, "Factuality": true}', (False, True), 'parser'),
    # exact JSON, both false
    ('{"Faithfulness": false, "Factuality": false}', (False, False), 'parser'),
    # exact JSON, faithful+non-factual (label invalid by mapping)
    ('{"Faithfulness": true, "Factuality": false}', (True, False), 'parser'),
    # compact JSON, no spaces
    ('{"Faithfulness":false,"Factuality":true}', (False, True), 'parser'),
    # ```json fenced block
    ('```json\n{"Faithfulness": false, "Factuality": true}\n```', (False, True), 'parser'),
    # plain ``` fenced block
    ('```\n{"Faithfulness": false, "Factuality": false}\n```', (False, False), 'parser'),
    # ```JSON uppercase tag ("JSON" not removed; token cut in fallback1)
    ('```JSON\n{"Faithfulness": false, "Factuality": true}\n```', (False, True), 'fallback1'),
    # ```JSON glued to { (no whitespace)
    ('```JSON{"Faithfulness": false, "Factuality": true}```', None, 'invalid'),
    # prose + ```json fence + prose
    ('Here is my answer:\n```json\n{"Faithfulness": false, "Factuality": true}\n```\nHope this helps.', (False, True), 'fallback1'),
    # prose after JSON
    ('{"Faithfulness": false, "Factuality": true}\nThe summary adds an unsupported but true detail.', (False, True), 'parser'),
    # prose before JSON ({ glued to key token)
    ('The summary is unfaithful. {"Faithfulness": false, "Factuality": true}', (False, True), 'fallback1'),
    # prose before pretty-printed JSON (standalone { token)
    ('The summary is unfaithful.\n{\n  "Faithfulness": false,\n  "Factuality": true\n}', (False, True), 'fallback1'),
    # Answer: {...}
    ('Answer: {"Faithfulness": false, "Factuality": false}', (False, False), 'fallback1'),
    # Answer:{...} glued
    ('Answer:{"Faithfulness": false, "Factuality": false}', None, 'invalid'),
    # CoT ending with JSON
    ('Let me think step by step. The summary mentions a date not in the source, and this date is wrong according to world knowledge. Therefore:\n{"Faithfulness": false, "Factuality": false}', (False, False), 'fallback1'),
    # JSON followed by stray }
    ('{"Faithfulness": true, "Factuality": true} }', None, 'invalid'),
    # JSON followed by unclosed [
    ('{"Faithfulness": true, "Factuality": true} see [1', None, 'invalid'),
    # Python True/False, spaced
    ('{"Faithfulness": True, "Factuality": False}', (True, False), 'fallback1'),
    # Python True/False, compact (single token)
    ('{"Faithfulness":True,"Factuality":False}', None, 'invalid'),
    # Python False/True spaced
    ('{"Faithfulness": False, "Factuality": True}', (False, True), 'fallback1'),
    # single-quoted Python dict
    ("{'Faithfulness': True, 'Factuality': True}", None, 'invalid'),
    # yes/no strings
    ('{"Faithfulness": "yes", "Factuality": "no"}', (True, False), 'parser'),
    # "1"/"0" strings
    ('{"Faithfulness": "1", "Factuality": "0"}', (True, False), 'parser'),
    # 1/0 ints
    ('{"Faithfulness": 1, "Factuality": 0}', (True, False), 'parser'),
    # 1.0/0.0 floats
    ('{"Faithfulness": 1.0, "Factuality": 0.0}', (True, False), 'parser'),
    # int 2
    ('{"Faithfulness": 2, "Factuality": 1}', None, 'invalid'),
    # string with surrounding spaces
    ('{"Faithfulness": " true ", "Factuality": "false"}', None, 'invalid'),
    # null value
    ('{"Faithfulness": null, "Factuality": true}', None, 'invalid'),
    # lowercase keys
    ('{"faithfulness": false, "factuality": true}', None, 'invalid'),
    # missing Factuality
    ('{"Faithfulness": false}', None, 'invalid'),
    # extra key Rationale
    ('{"Faithfulness": false, "Factuality": true, "Rationale": "The summary adds a detail."}', (False, True), 'parser'),
    # the word json inside a value
    ('{"Faithfulness": false, "Factuality": true, "Rationale": "output is not json compliant"}', (False, True), 'parser'),
    # trailing comma
    ('{"Faithfulness": true, "Factuality": false,}', None, 'invalid'),
    # missing closing brace
    ('{"Faithfulness": false, "Factuality": true', (False, True), 'parser'),
    # truncated in value
    ('{"Faithfulness": false, "Factuality": tr', None, 'invalid'),
    # two objects on one line
    ('{"Faithfulness": true, "Factuality": true} {"Faithfulness": false, "Factuality": false}', (True, True), 'parser'),
    # nested object
    ('{"result": {"Faithfulness": false, "Factuality": true}}', None, 'invalid'),
    # list of one object
    ('[{"Faithfulness": false, "Factuality": true}]', None, 'invalid'),
    # key-value line, unquoted keys
    ('Faithfulness: true, Factuality: false', None, 'invalid'),
    # quoted key-values without braces
    ('"Faithfulness": false, "Factuality": true', (False, True), 'fallback2'),
    # quoted key-values, Python bools, no braces
    ('"Faithfulness": False, "Factuality": True', (False, True), 'fallback2'),
    # prose only
    ('The summary is not faithful but factual.', None, 'invalid'),
    # empty string
    ('', None, 'invalid'),
    # refusal
    ("I'm sorry, but I cannot help with that request.", None, 'invalid'),
    # bare true
    ('true', None, 'invalid'),
    # single token Faithfulness (fallback2 IndexError)
    ('Faithfulness', None, 'invalid'),
    # bare word Faithfulness before glued JSON
    ('The Faithfulness is questionable. {"Faithfulness": false, "Factuality": true}', None, 'invalid'),
    # bare word Faithfulness before standalone-brace JSON
    ('Faithfulness and Factuality:\n{\n"Faithfulness": false,\n"Factuality": true\n}', (False, True), 'fallback2'),
    # quoted keys no braces with extra key (fallback2 uses 4 tokens)
    ('"Faithfulness": true,\n"Factuality": true,\n"Rationale": "ok"', (True, True), 'fallback2'),
    # JSON numbers 1e0 and -0
    ('{"Faithfulness": 1e0, "Factuality": -0}', (True, False), 'parser'),
]
# fmt: on


@pytest.mark.parametrize(("output", "judgement", "stage"), CASES)
def test_the_reference_verdict(output, judgement, stage):
    assert reference_judgement(output) == (judgement, stage)


def test_the_table_covers_every_stage_and_label():
    assert len(CASES) >= 30
    assert {s for _, _, s in CASES} == {"parser", "fallback1", "fallback2", "invalid"}
    labels = {judgement_to_label(j) for _, j, _ in CASES}
    assert labels == {"no_hallu", "factual_hallu", "non_factual_hallu", "invalid"}


def _langchain_loop(text: str):
    """LangChain's own prefix search, one character at a time (quadratic), after the scan both
    share (`close_partial`): the oracle for the one-pass search."""
    import json

    from fincheck.tasks.fhsumbench import reference

    try:
        return json.loads(text, strict=False)
    except json.JSONDecodeError:
        pass
    closed = reference.close_partial(text)
    if closed is None:
        return None
    prefix, closers = closed
    out = list(prefix)
    tail = "".join(reversed(closers))
    while out:
        try:
            return json.loads("".join(out) + tail, strict=False)
        except json.JSONDecodeError:
            out.pop()
    raise reference._NoJudgement


def test_the_prefix_search_jumps_to_the_same_prefix_as_langchains_loop():
    """On 5,000 random JSON-like texts the one-pass search returns what LangChain's
    one-character-at-a-time loop returns (or fails alike)."""
    import random

    from fincheck.tasks.fhsumbench import reference

    rng = random.Random(0)
    pieces = ['{', '}', '[', ']', '"', ',', ':', '\\', ' ', '\n', 'a', '1', '-', '.', 'e',
              'true', 'false', 'null', '"Faithfulness"', '"Factuality"', '0', 'x', '\t', '\r',
              '\x0b', '+', 'E', '9', 'NaN', 'Infinity', '-Infinity', 'Infin', 'tru', '\\u',
              '\\u00e9', '\\ud83d', '\\q', '\\n', '\ufeff', 'é', '0.5', '1e-', '01']  # fmt: skip
    for _ in range(5_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 14)))
        results = []
        for search in (reference.partial_json, _langchain_loop):
            try:
                results.append(("ok", search(text)))
            except reference._NoJudgement:
                results.append(("none", None))
        assert results[0] == results[1], text


def test_a_long_answer_is_read_in_linear_time():
    """A 2 MB answer (the object, then prose): the one-character loop tries about two million
    prefixes of up to 2 MB each (88 s on 100 KB, hours here); the search jumps to the object's
    end at once."""
    from fincheck.tasks.fhsumbench.reference import reference_judgement

    answer = '{"Faithfulness": true, "Factuality": false}' + " Because the text says so." * 80_000
    assert reference_judgement(answer) == ((True, False), "parser")
    assert reference_judgement("I think " * 250_000) == (None, "invalid")


def test_white_space_inside_an_unfinished_object_is_read_in_linear_time(monkeypatch):
    """A megabyte of spaces inside an object that ends with a lone key: every prefix down to
    the last value fails, one character at a time (the one-character loop and json's error
    position alike: a million parses of a megabyte), while the search reads the text once and
    parses once. Counted, not timed: more than a handful of parses fails at once."""
    import json

    from fincheck.tasks.fhsumbench import reference

    calls = []
    loads = json.loads

    def counted(text, **kwargs):
        calls.append(len(text))
        assert len(calls) < 50, "the prefix search parses the text again and again"
        return loads(text, **kwargs)

    monkeypatch.setattr(json, "loads", counted)
    answer = '{"Faithfulness": true, "Factuality": false, ' + " " * 1_000_000 + '"Because'
    assert reference.reference_judgement(answer) == ((True, False), "parser")
    assert len(calls) <= 3


def test_brackets_nested_past_pythons_recursion_limit_are_no_judgement():
    """An output of a hundred thousand `[` is invalid, not a RecursionError that ends eval."""
    from fincheck.tasks.fhsumbench.reference import reference_judgement

    assert reference_judgement("[" * 100_000) == (None, "invalid")
    assert reference_judgement('{"Faithfulness": ' + "[" * 100_000 + "]" * 100_000) == (
        None,
        "invalid",
    )


COT_ANSWERS = [
    (
        "Faithfulness: the summary adds a date the document lacks.\nFactuality: the date is right.\n"
        '{"Faithfulness": false, "Factuality": true}',
        (False, True),
    ),
    (
        'Let me check. "Faithfulness": the claim is new. So:\n```json\n{"Faithfulness": false, '
        '"Factuality": false}\n```',
        (False, False),
    ),
    (
        "Step 1: every fact is in the document {as stated}.\n"
        '{"Faithfulness": true, "Factuality": true}',
        (True, True),
    ),
]


@pytest.mark.parametrize(("answer", "judgement"), COT_ANSWERS)
def test_a_chain_of_thought_is_read_from_its_final_judgement(answer, judgement):
    """The paper's CoT runs scored the judgement apart from the reasoning: the reasoning's own
    "Faithfulness:" words, braces or quotes no longer decide what is read."""
    from fincheck.tasks.fhsumbench.reference import cot_judgement, reference_judgement

    assert reference_judgement(cot_judgement(answer))[0] == judgement
    assert cot_judgement("no judgement at all") == "no judgement at all"
