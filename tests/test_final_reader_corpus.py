"""FINAL's answer reader measured on answers it was not written from: tests/assets/
final_answers.jsonl, real outputs of the models this project runs (each prompt style) and
layouts larger models write, each labelled by hand (tests/assets/final_answers.md says how).

Labels: `none` (the answer says the summary has no unsupported information), `list` (the
descriptions a careful reader finds, markers and bold dropped, exact repeats once) or
`unreadable` (a careful reader cannot tell either way). The corpus is split in two by a hash of
the id: the reader's rules were revised while looking at the misses of `dev` only; `held_out`
says how far that generalises.

Two kinds of answer are set apart from the accuracy figures: a reasoning answer whose prompt
asked for "Final Output:" and that never wrote it (the protocol reads no answer there; the
labeller read its steps: the test checks they are counted apart), and rows whose note says
"Contested" (figures are printed with and without them).

Run with `-s` to print the figures and every miss.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from fincheck.tasks.final.reader import has_final_output, read_descriptions

CORPUS = Path(__file__).resolve().parent / "assets" / "final_answers.jsonl"
LABELS = ("none", "list", "unreadable")
# Prompt styles that ask for the answer under "Final Output:" (predictions carry reasoning).
REASONING_STYLES = ("e2e-cot", "two-step", "cot-hint")


@dataclass(frozen=True)
class Answer:
    id: str
    source: str
    output: str
    label: str
    descriptions: list[str]
    note: str = ""

    @property
    def part(self) -> str:
        return "dev" if int(hashlib.sha256(self.id.encode()).hexdigest(), 16) % 2 else "held_out"

    @property
    def reasoning(self) -> bool:
        return any(style in self.source for style in REASONING_STYLES)

    @property
    def without_final_output(self) -> bool:
        """A reasoning answer that never gave its answer: the protocol reads none."""
        return self.reasoning and not has_final_output(self.output)

    @property
    def contested(self) -> bool:
        return "contested" in self.note.lower()


def load_corpus() -> list[Answer]:
    answers = []
    for line_no, line in enumerate(CORPUS.read_text(encoding="utf-8").splitlines(), start=1):
        record = json.loads(line)
        assert record["label"] in LABELS, f"{CORPUS.name}:{line_no}: label {record['label']!r}"
        assert (record["label"] == "list") == bool(record["descriptions"]), f"line {line_no}"
        answers.append(
            Answer(
                record["id"],
                record["source"],
                record["output"],
                record["label"],
                record["descriptions"],
                record.get("note") or "",
            )
        )
    return answers


def normal(description: str) -> str:
    """Spacing, case, bold and end punctuation aside: what the judge would see the same."""
    return re.sub(r"\s+", " ", description.replace("**", "")).strip().strip(".").strip().lower()


def distinct(descriptions: list[str]) -> list[str]:
    """Normalized, exact repeats once (the labeller counted a looping item once; the reader
    keeps repeats, which the FINAL protocol counts as predictions)."""
    return list(dict.fromkeys(normal(d) for d in descriptions))


@dataclass(frozen=True)
class Reading:
    answer: Answer
    items: list[str]
    structured: bool

    @property
    def exact(self) -> bool:
        return distinct(self.items) == distinct(self.answer.descriptions)

    @property
    def flag_right(self) -> bool:
        return bool(self.items) == (self.answer.label == "list")

    @property
    def silent_misread(self) -> bool:
        """Read with confidence, yet flagged the other way from what a person reads."""
        return self.answer.label != "unreadable" and self.structured and not self.flag_right


def read_all(answers: list[Answer]) -> list[Reading]:
    out = []
    for answer in answers:
        parsed = read_descriptions(answer.output, reasoning=answer.reasoning)
        out.append(Reading(answer, parsed.items, parsed.structured))
    return out


def figures(readings: list[Reading]) -> dict[str, float | int]:
    """The reader never guesses (FINAL's E.4 rule: an answer that is no list of descriptions
    gives no prediction): agreement is measured on the answers it reads with confidence, and
    how many of the answers a person can read it reads (`coverage`); the rest is counted apart."""
    readings = [r for r in readings if not r.answer.without_final_output]
    readable = [r for r in readings if r.answer.label != "unreadable"]
    read = [r for r in readable if r.structured]
    unreadable = [r for r in readings if r.answer.label == "unreadable"]
    apart = [r for r in readings if not r.structured]
    return {
        "n": len(readings),
        "n_readable": len(readable),
        "n_read": len(read),
        "coverage": len(read) / len(readable),
        "exact": sum(r.exact for r in read) / len(read),
        "binarized": sum(r.flag_right for r in read) / len(read),
        "silent_misreads": sum(r.silent_misread for r in readings),
        "n_unreadable": len(unreadable),
        "unreadable_counted_apart": sum(not r.structured for r in unreadable),
        "counted_apart": len(apart),
    }


def describe_misses(readings: list[Reading]) -> list[str]:
    lines = []
    for r in readings:
        tag = " (contested)" if r.answer.contested else ""
        if r.answer.without_final_output:
            if r.structured or r.items:
                lines.append(f"{r.answer.id} [no Final Output, read as {r.items!r}]")
        elif r.answer.label == "unreadable":
            if r.structured:
                lines.append(f"{r.answer.id}{tag} [unreadable, read as {r.items!r}]")
        elif not r.structured:
            lines.append(f"{r.answer.id}{tag} [{r.answer.label}, counted apart]")
        elif not r.exact:
            kind = "SILENT" if r.silent_misread else ("flag ok" if r.flag_right else "flag wrong")
            lines.append(
                f"{r.answer.id}{tag} [{kind}{'' if r.structured else ', counted apart'}] "
                f"expected {r.answer.descriptions!r}, read {r.items!r}"
            )
    return lines


@pytest.fixture(scope="module")
def readings() -> list[Reading]:
    return read_all(load_corpus())


def test_the_corpus_is_large_varied_and_labelled(readings):
    answers = [r.answer for r in readings]
    assert len(answers) >= 150
    assert len({a.id for a in answers}) == len(answers)
    real = [a for a in answers if not a.source.startswith("handwritten/")]
    assert len(real) >= 100
    for label in LABELS:
        assert any(a.label == label for a in answers), label
    for style in ("e2e", "e2e-fewshot", "e2e-cot", "fincheck-prompt"):
        assert any(a.source.endswith(f"/{style}") for a in real), style
    # the layouts larger models write, a family each (hand-written in their styles)
    for family in ("gpt4o", "claude", "llama", "qwen"):
        assert sum(a.id.startswith(f"handwritten-{family}-") for a in answers) >= 10, family


def test_the_reader_on_the_labelled_corpus(readings):
    """Every miss is listed in the output; the figures hold on both halves; no answer a person
    reads is read with confidence the other way (a silent false flag or a silent miss)."""
    report = []
    for part in ("dev", "held_out"):
        part_readings = [r for r in readings if r.answer.part == part]
        report.append(f"{part}: {figures(part_readings)}")
    report.append(f"all: {figures(readings)}")
    report.append(
        f"all, contested left out: {figures([r for r in readings if not r.answer.contested])}"
    )
    no_final = [r for r in readings if r.answer.without_final_output]
    report.append(
        f"reasoning without Final Output: {len(no_final)}, counted apart "
        f"{sum(not r.structured and not r.items for r in no_final)}"
    )
    misses = describe_misses(readings)
    print("\n".join([*report, f"misses ({len(misses)}):", *misses]))
    silent = [m for m in misses if "[SILENT" in m]
    assert not silent, "\n".join(silent)
    # measured 2026-11-28 (245 answers read by the protocol, 56 of them in the layouts of
    # larger models): see docs/evaluation.md for the figures of each half
    for part in ("dev", "held_out"):
        part_figures = figures([r for r in readings if r.answer.part == part])
        assert part_figures["binarized"] >= 0.95, (part, "\n".join(misses))
        assert part_figures["exact"] >= 0.85, (part, "\n".join(misses))
        assert part_figures["unreadable_counted_apart"] >= 0.9 * part_figures["n_unreadable"]
    assert all(not r.structured and not r.items for r in no_final)


HOSTILE = Path(__file__).resolve().parent / "assets" / "final_answers_hostile.jsonl"


# Two "nothing wrong" check lists the reader still flags: a claim answered "Yes." and "Sunday -
# yes, the text says Sunday." (a bare "yes" is no verdict of its own to the reader)
KNOWN_FLAGGED = {"hostile-2026-11-29-c70", "hostile-2026-11-29-c80"}
# A chain of thought that finds an error, then writes "Final Output: None": the prompt makes
# what follows that label the answer, which the reader reads (the reviewer labelled it unreadable)
KNOWN_CONFIDENT = {"hostile-2026-11-30-e106"}
# The fourth review's 35 adversarial answers (2026-11-30) break the promise, as recorded in
# docs/evaluation.md: affirmations and denials in words the rules do not know, qualifiers before
# an affirmation, tables with footnotes, questions. Bounds, so that it gets no worse.
REVIEW_4_ADVERSARIAL_MISSES = {"flagged": 17, "read as nothing": 6, "read with confidence": 5}


def _misses(rows: list[dict]) -> tuple[dict[str, list[str]], list[bool]]:
    """Each promise's misses (ids) over labelled answers, and the counts of the lists read."""
    misses: dict[str, list[str]] = {
        "flagged": [],
        "read as nothing": [],
        "read with confidence": [],
    }
    counts = []
    for row in rows:
        parsed = read_descriptions(row["output"], reasoning=row["reasoning"])
        if row["label"] == "unreadable" and parsed.structured:
            misses["read with confidence"].append(row["id"])
        elif parsed.structured and row["label"] == "none" and parsed.items:
            misses["flagged"].append(row["id"])
        elif parsed.structured and row["label"] == "list" and not parsed.items:
            misses["read as nothing"].append(row["id"])
        elif parsed.structured and row["label"] == "list":
            counts.append(len(parsed.items) == row["count"])
    return misses, counts


def test_the_reader_on_five_hostile_reviews_answers():
    """527 answers five hostile reviews wrote against the reader in the phrasings small models
    use (92; then 112 against the reader revised on them; then 103, two thirds of them
    realistic, against the reader revised again: denials and affirmations inside lists, JSON
    verdicts, roman numerals, sub-items of another kind, "the rest is correct", claims listed
    before a later "Inconsistencies:" label or checked one by one before "No inconsistencies
    found.", "bar the year"; then 110, 75 realistic and 35 adversarial; then 110 again, 80 and
    30), each labelled before the reader ran: `none`, `list` with its item count, or
    `unreadable`. They were then read to revise the reader, so they are seen, not held out. The
    promise: no "nothing wrong" answer flagged (but the two named), no list read as nothing, no
    unreadable answer read with confidence (but the one named), and the count right on at
    least 90% of the lists read; anything else is counted apart. The fourth review's
    adversarial answers miss it, within recorded bounds."""
    rows = [json.loads(line) for line in HOSTILE.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 527 and {r["label"] for r in rows} == set(LABELS)
    adversarial = [
        r for r in rows if r["written_by"] == "red-team-review-4" and r["note"].startswith("adv")
    ]
    assert len(adversarial) == 35
    misses, counts = _misses([r for r in rows if r not in adversarial])
    print(f"hostile reviews: {len(counts)} lists read, count right {sum(counts)}")
    assert set(misses["flagged"]) == KNOWN_FLAGGED, misses
    assert not misses["read as nothing"], misses
    assert set(misses["read with confidence"]) == KNOWN_CONFIDENT, misses
    assert len(counts) >= 50 and sum(counts) >= 0.9 * len(counts), counts
    missed, _ = _misses(adversarial)
    assert all(len(missed[k]) <= bound for k, bound in REVIEW_4_ADVERSARIAL_MISSES.items()), missed
