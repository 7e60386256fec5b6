"""Unit behaviour of the data-prep building blocks."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from fincheck.data.pairs import Pair
from fincheck.data.prompting import parse_prompt_file
from fincheck.data.splits import split_by_group
from fincheck.data.trimming import (
    TRIM_MARKER,
    count_whitespace_tokens,
    messages_text,
    trim_pair,
)
from fincheck.errors import FincheckError
from fincheck.tasks import load_prompt
from fincheck.tasks.final.descriptions import explanation_to_descriptions, split_sentences
from fincheck.tasks.final.lettering import final_target, letters
from fincheck.tasks.qasem.convert import qasem_target
from fincheck.tasks.qasem.detokenize import detokenize


def test_detokenize_readable():
    tokens = [
        "Muir",
        "'s",
        "24",
        "-",
        "year",
        "-",
        "old",
        "rival",
        "said",
        '"',
        "I",
        "ca",
        "n't",
        "go",
        '"',
        "(",
        "BBC",
        ")",
        ".",
    ]
    assert detokenize(tokens) == "Muir's 24-year-old rival said \"I can't go\" (BBC)."


def test_qasem_majority_one_means_not_supported():
    assert qasem_target([1, 1, 0]) == "No"
    assert qasem_target([0, 0, 1]) == "Yes"
    assert qasem_target([1, 1, 1]) == "No"


def test_letters_and_final_target():
    assert [letters(28)[i] for i in (0, 1, 25, 26, 27)] == ["A", "B", "Z", "AA", "AB"]
    assert final_target([]) == "None"
    assert final_target(["x.", "y."]) == "A. x.\nB. y."


def test_explanation_split_into_self_contained_descriptions():
    text = (
        "The summary claims the tunnel is in Cardiff, which is not supported. "
        "Also it hallucinates that the car crashed into a wall."
    )
    descriptions, was_split = explanation_to_descriptions(text, n_instructions=2)
    assert was_split
    assert descriptions == [
        "The summary claims the tunnel is in Cardiff, which is not supported.",
        "The summary hallucinates that the car crashed into a wall.",
    ]
    # one edit instruction: kept whole, whatever the sentences
    assert explanation_to_descriptions(text, n_instructions=1) == ([text], False)
    # a sentence that only comments on the previous one stays with it
    merged, _ = explanation_to_descriptions("It says he is 30. This is not in the source.", 2)
    assert merged == ["It says he is 30. This is not in the source."]
    # a sentence that affirms ("is supported", as in defacto-test-352) is no inconsistency: it
    # is never a description of its own, so the explanation stays whole
    affirmed = "The summary invents the M8. The summary is supported that a tanker caught fire."
    assert explanation_to_descriptions(affirmed, 2) == ([affirmed], False)


def test_sentence_split_keeps_abbreviations_and_quotes():
    assert split_sentences('The U.S. team won. Mr. Smith said "It ended. Done." Then left.') == [
        "The U.S. team won.",
        'Mr. Smith said "It ended. Done."',
        "Then left.",
    ]


def make_pair(i: int, group: str, document: str = "doc", target: str = "Yes") -> Pair:
    messages, span = load_prompt("qasem").messages(
        text=document, sentence="S.", question="who?", answer="he"
    )
    return Pair(
        id=f"p{i}",
        task="qasem",
        split="train",
        messages=[*messages, {"role": "assistant", "content": target}],
        meta={"group": group, "grounding_span": list(span), "label": target},
    )


def test_split_by_group_is_grouped_seeded_and_order_free():
    pairs = [make_pair(i, f"g{i % 40}") for i in range(400)]
    first = split_by_group(pairs, {"train": 0.5, "dev": 0.1, "test": 0.4}, seed=1)
    assignment = {p.id: p.split for p in pairs}
    for name, members in first.items():
        assert len(members) == pytest.approx({"train": 200, "dev": 40, "test": 160}[name], abs=10)
    groups: dict[str, set[str]] = {}
    for p in pairs:
        groups.setdefault(p.meta["group"], set()).add(p.split)
    assert all(len(s) == 1 for s in groups.values())
    reversed_pairs = [make_pair(i, f"g{i % 40}") for i in reversed(range(400))]
    split_by_group(reversed_pairs, {"train": 0.5, "dev": 0.1, "test": 0.4}, seed=1)
    assert {p.id: p.split for p in reversed_pairs} == assignment
    other = [make_pair(i, f"g{i % 40}") for i in range(400)]
    split_by_group(other, {"train": 0.5, "dev": 0.1, "test": 0.4}, seed=2)
    assert {p.id: p.split for p in other} != assignment


def test_trim_cuts_only_the_document():
    document = " ".join(f"w{i}" for i in range(500))
    pair = make_pair(0, "g", document=document, target="No")
    budget = count_whitespace_tokens(messages_text(pair.messages)) - 400
    trimmed, was_trimmed = trim_pair(pair, budget, count_whitespace_tokens)
    assert was_trimmed and trimmed is not None
    assert count_whitespace_tokens(messages_text(trimmed.messages)) <= budget
    assert trimmed.target == "No"
    assert trimmed.grounding.endswith(TRIM_MARKER) and document.startswith(
        trimmed.grounding[: -len(TRIM_MARKER)]
    )
    assert trimmed.user_content.endswith(pair.user_content[pair.meta["grounding_span"][1] :])
    assert trim_pair(pair, 10_000, count_whitespace_tokens) == (pair, False)
    assert trim_pair(pair, 5, count_whitespace_tokens) == (None, False)  # cannot fit: dropped


def test_prompt_hash_follows_the_file(tmp_path: Path):
    original = load_prompt("final")
    copy = tmp_path / "final.txt"
    copy.write_bytes(original.path.read_bytes())
    assert parse_prompt_file(copy, "final").hash == original.hash
    copy.write_text(original.path.read_text() + "\nOne more line.\n")
    assert parse_prompt_file(copy, "final").hash != original.hash
    broken = tmp_path / "broken.txt"
    broken.write_text("[system]\nno user section\n")
    with pytest.raises(FincheckError, match="needs a \\[system\\] and a \\[user\\]"):
        parse_prompt_file(broken, "x")


def test_render_keeps_literal_braces_and_reports_span():
    prompt = load_prompt("fhsumbench")
    system, user, (start, end) = prompt.render(text="A {weird} doc", summary="S")
    assert '{"Faithfulness": true, "Factuality": true}' in system
    assert user[start:end] == "A {weird} doc"
    with pytest.raises(FincheckError, match="missing values"):
        prompt.render(text="x")


def test_pair_roundtrip_and_schema_errors(tmp_path: Path):
    from fincheck.data.pairs import read_pairs, write_pairs
    from fincheck.tasks import task_names

    pair = make_pair(0, "g")
    write_pairs(tmp_path / "p.jsonl", [pair, dataclasses.replace(pair, id="p1")])
    assert [p.id for p in read_pairs(tmp_path / "p.jsonl", task_names())] == ["p0", "p1"]
    (tmp_path / "bad.jsonl").write_text(
        '{"id": "a", "task": "nope", "split": "train", "messages": []}\n'
    )
    with pytest.raises(FincheckError, match=r"bad.jsonl:1: task: 'nope' not in"):
        list(read_pairs(tmp_path / "bad.jsonl", task_names()))
    # a folder laid out by hand (no manifest vouches for it): every field its readers take apart
    good = json.loads(pair.to_json())
    for field, value, said in [
        ("messages", ["x", *good["messages"]], r"messages\[0\]: needs a role"),
        ("meta", [], "meta: expected an object"),
        ("meta", {"grounding_span": "0:5"}, "meta.grounding_span: expected"),
        ("meta", {"grounding_span": [0, 10**6]}, "meta.grounding_span: expected"),
        ("meta", {"grounding_span": [True, 1]}, "meta.grounding_span: expected"),
    ]:
        (tmp_path / "bad.jsonl").write_text(json.dumps({**good, field: value}) + "\n")
        with pytest.raises(FincheckError, match=rf"bad.jsonl:1: {said}"):
            list(read_pairs(tmp_path / "bad.jsonl", task_names()))


def test_the_sentence_splitter_looks_back_a_bounded_window(monkeypatch):
    """An answer of 12,000 "A." initials (36 KB) is one sentence, found in one pass: each
    boundary checks the few characters before it for an abbreviation, never the whole sentence
    so far (which made this answer cost 26 s)."""
    from fincheck.data import sentences

    windows = []
    pattern = sentences._ABBREVIATION

    class Spy:
        def search(self, text, pos=0, endpos=None):
            windows.append((endpos if endpos is not None else len(text)) - pos)
            return pattern.search(text, pos, endpos if endpos is not None else len(text))

    monkeypatch.setattr(sentences, "_ABBREVIATION", Spy())
    text = "A. " * 12_000
    assert sentences.split_sentences(text, lowercase_starts=True, keep_quotes=True) == [
        text.strip()
    ]
    assert len(windows) == 11_999 and max(windows) <= sentences.ABBREVIATION_WINDOW
    monkeypatch.undo()  # the real pattern decides: "Mr. Smith" is not split, "xyzMr. Ok" is
    assert sentences.split_sentences("He met Mr. Smith. Then xyzMr. Ok.") == [
        "He met Mr. Smith.",
        "Then xyzMr.",
        "Ok.",
    ]


def test_a_folder_without_a_manifest_is_fingerprinted_by_its_files(tmp_path: Path):
    """A prepared folder laid out by hand names its data by its split files as they are: a
    file changed since is another fingerprint, so an eval or a training resume refuses to mix
    the two (without one, both recorded None, and None == None passed)."""
    from fincheck.data.pairs import write_pairs
    from fincheck.tasks.prepared import read_manifest

    write_pairs(tmp_path / "qasem" / "test.jsonl", [make_pair(0, "g"), make_pair(1, "g")])
    first = read_manifest(tmp_path)
    assert first["files"]["qasem/test.jsonl"]["pairs"] == 2 and len(first["fingerprint"]) == 64
    write_pairs(tmp_path / "qasem" / "test.jsonl", [make_pair(0, "g")])
    assert read_manifest(tmp_path)["fingerprint"] != first["fingerprint"]
    assert read_manifest(tmp_path / "empty") == {}
    (tmp_path / "notes").mkdir()  # only the registered tasks' split files are its data
    (tmp_path / "notes" / "mine.jsonl").write_text("{}\n")
    assert list(read_manifest(tmp_path)["files"]) == ["qasem/test.jsonl"]
    # a split changed after the folder was opened is refused when it is read
    from fincheck.tasks.prepared import PreparedFolder

    folder = PreparedFolder.open(tmp_path)
    write_pairs(tmp_path / "qasem" / "test.jsonl", [make_pair(1, "g")])
    with pytest.raises(FincheckError, match="changed after"):
        folder.split("qasem", "test")


def test_a_json_file_s_records_are_found_by_its_structure_not_its_text(tmp_path: Path):
    """A JSON object's `data` array is found by decoding its members: spelled with escapes,
    or after another member holding a "data" of its own, each record still names its line
    (a search for the text '"data"' raised, or read the wrong array as broken JSON)."""
    from fincheck.data.raw_records import iter_json_array

    for text, lines in [
        ('{"\\u0064ata": [\n{"id": 1},\n{"id": 2}]}', [2, 3]),
        ('{"meta": {"data": [1, 2]},\n "data": [\n{"id": 1}]}', [3]),
    ]:
        (tmp_path / "final.json").write_text(text)
        assert [r.line for r in iter_json_array(tmp_path / "final.json")] == lines


def test_a_prompt_s_fields_are_read_back_around_the_grounding_span():
    """A baseline reads a pair's document and summary back from its user message: the document
    is the grounding span, taken whole even when it holds the template's own separators (a
    search split it at the first), and the reading takes linear time on such a document."""
    import time

    from fincheck.tasks import load_prompt

    for task in ("fhsumbench", "qasem", "final"):
        prompt = load_prompt(task)
        literals = "".join(re.split(r"\{[a-z_]+\}", prompt.user))
        values = {name: f"the {name}" for name in prompt.fields}
        values["text"] = "Doc." + literals + " more" + literals
        _, user, span = prompt.render(**values)
        assert prompt.fields_of(user, span) == values, task
    timings = []
    for n in (500, 2000):  # 4 x the separators may not take 8 x the time
        values["text"] = literals * n
        _, user, span = prompt.render(**values)
        start = time.process_time()
        prompt.fields_of(user, span)
        timings.append(time.process_time() - start)
    assert timings[1] < 8 * timings[0] + 0.05
