"""The instruction-pair schema, defined once.

Every stage reads and writes pairs in this shape (`OUT/<task>/<split>.jsonl`, one per line):

    {"id": str, "task": <a registered task: final, qasem, fhsumbench>, "split": "train"|"dev"|"test",
     "messages": [{"role": "system"|"user"|"assistant", "content": str}, ...],
     "meta": {...}}

The target is the last assistant message. `meta["grounding_span"]` holds the [start, end)
character offsets of the grounding text inside the user message, so later stages can trim an
over-long document without touching the instructions or the target.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fincheck.errors import FincheckError, InvalidRecordError
from fincheck.io.jsonl import iter_json_objects
from fincheck.io.safe_files import replaced_file

SPLITS: tuple[str, ...] = ("train", "dev", "test")
ROLES: tuple[str, ...] = ("system", "user", "assistant")


@dataclass
class Pair:
    id: str
    task: str
    split: str
    messages: list[dict[str, str]]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def target(self) -> str:
        """The assistant's answer: what the model is trained to produce."""
        return self.messages[-1]["content"]

    @property
    def prompt_messages(self) -> list[dict[str, str]]:
        """Everything before the target (system + user): what the model sees at inference."""
        return self.messages[:-1]

    @property
    def grounding(self) -> str:
        """The grounding text (document, sources) inside the user message."""
        start, end = self.meta["grounding_span"]
        return self.user_content[start:end]

    @property
    def document_key(self) -> str:
        """What identifies the pair's grounding text: pairs with the same key share their
        document (QASem: every QA about one reference; FHSumBench: the summaries of one
        source), which is what a prefix tree shares."""
        text = self.grounding if self.meta.get("grounding_span") else self.user_content
        return hashlib.sha256(f"{self.task}\0{text}".encode()).hexdigest()[:16]

    @property
    def user_content(self) -> str:
        return next(m["content"] for m in self.messages if m["role"] == "user")

    def meta_value(self, key: str, kind: type) -> Any:
        """A field data-prep stores in `meta` (gold label, descriptions, summary...), or an error
        saying the prepared data predates it."""
        value = self.meta.get(key)
        if not isinstance(value, kind):
            raise FincheckError(
                f"{self.task}/{self.id}: meta.{key} is missing or not a {kind.__name__}; "
                "re-run `fincheck prepare` with this fincheck version"
            )
        return value

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), ensure_ascii=False)


def validate_pair_dict(
    record: dict[str, Any], where: str, line: int, tasks: Collection[str]
) -> None:
    """Check a decoded object against the schema; raise `file:line: field: problem`. `tasks`:
    the task names a pair may have (the registry's: `fincheck.tasks.task_names()`)."""
    for key, kind in (("id", str), ("task", str), ("split", str), ("messages", list)):
        if key not in record:
            raise InvalidRecordError(where, line, key, "missing")
        if not isinstance(record[key], kind):
            raise InvalidRecordError(where, line, key, f"expected {kind.__name__}")
    if record["task"] not in tasks:
        raise InvalidRecordError(
            where, line, "task", f"{record['task']!r} not in {tuple(tasks)} (the registered tasks)"
        )
    if record["split"] not in SPLITS:
        raise InvalidRecordError(where, line, "split", f"{record['split']!r} not in {SPLITS}")
    messages = record["messages"]
    for i, message in enumerate(messages):
        if (
            not isinstance(message, dict)
            or message.get("role") not in ROLES
            or not isinstance(message.get("content"), str)
        ):
            raise InvalidRecordError(
                where, line, f"messages[{i}]", f"needs a role in {ROLES} and a string content"
            )
    if not messages or messages[-1]["role"] != "assistant":
        raise InvalidRecordError(
            where, line, "messages", "the last message must be the assistant target"
        )
    meta = record.get("meta", {})
    if not isinstance(meta, dict):
        raise InvalidRecordError(where, line, "meta", "expected an object")
    span, user = meta.get("grounding_span"), [m["content"] for m in messages if m["role"] == "user"]
    if span is not None and not (
        isinstance(span, list)
        and len(span) == 2
        and all(type(end) is int for end in span)
        and user
        and 0 <= span[0] <= span[1] <= len(user[0])
    ):
        raise InvalidRecordError(
            where, line, "meta.grounding_span", "expected [start, end] inside the user message"
        )


def write_pairs(path: Path, pairs: Iterable[Pair]) -> None:
    """Write pairs as JSONL (UTF-8, '\\n' endings) atomically: a crash never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with replaced_file(path) as f:
        f.writelines(pair.to_json() + "\n" for pair in pairs)


def read_pairs(path: Path, tasks: Collection[str]) -> Iterator[Pair]:
    """Read a pairs file, validating every line (a task among `tasks`, the registry's names); an
    id given twice is an error naming both lines (eval would write two predictions that score
    refuses, training would train it twice)."""
    seen: dict[str, int] = {}
    for line_no, record in iter_json_objects(path):
        validate_pair_dict(record, str(path), line_no, tasks)
        if record["id"] in seen:
            raise InvalidRecordError(
                str(path),
                line_no,
                "id",
                f"{record['id']!r} again (first on line {seen[record['id']]})",
            )
        seen[record["id"]] = line_no
        yield Pair(
            id=record["id"],
            task=record["task"],
            split=record["split"],
            messages=record["messages"],
            meta=record.get("meta", {}),
        )


# The seed of `fincheck eval --limit`'s sample and of training's dev figures: one sample, so
# an epoch's dev answers and an eval's pair up item for item.
EVAL_SAMPLE_SEED = 0


def sample_documents(pairs: Sequence[Pair], limit: int, seed: int) -> list[Pair]:
    """About `limit` pairs made of whole documents (`Pair.document_key`), in file order: the
    documents in a seeded order, taken while fewer than `limit` pairs are chosen (so the count
    may pass `limit` by less than one document). A small evaluation of QASem then asks every
    QA of a few references, and the prefix tree runs each reference once."""
    by_document: dict[str, list[int]] = defaultdict(list)
    for i, pair in enumerate(pairs):
        by_document[pair.document_key].append(i)
    documents = sorted(by_document)
    random.Random(seed).shuffle(documents)
    keep: list[int] = []
    for key in documents:
        if len(keep) >= limit:
            break
        keep += by_document[key]
    return [pairs[i] for i in sorted(keep)]


def sample_pairs(pairs: Sequence[Pair], limit: int | None, seed: int) -> list[Pair]:
    """A seeded random sample of `limit` pairs, in file order (all pairs when limit is None).

    Random rather than the first N because prepared files are grouped (the first QASem pairs
    are all CLIFF); seeded so that a rerun selects the same ids and resumes.
    """
    if limit is None or limit >= len(pairs):
        return list(pairs)
    keep = sorted(random.Random(seed).sample(range(len(pairs)), limit))
    return [pairs[i] for i in keep]


def sample(pairs: Sequence[Pair], limit: int | None, seed: int, by_document: bool) -> list[Pair]:
    """`limit` pairs drawn with `seed`: whole documents (`sample_documents`) for a task whose
    pairs share them (`Task.limit_by_document`), else single pairs (`sample_pairs`)."""
    if limit is not None and by_document and limit < len(pairs):
        return sample_documents(pairs, limit, seed)
    return sample_pairs(pairs, limit, seed)


# ------------------------------------------------------------------ the model's answer


@dataclass(frozen=True)
class Prediction:
    id: str
    task: str
    output: str
    p_yes: float | None = None
    line: int = 0  # where it was read, for error messages
    # The answer hit its token budget: "answer" (what was written is read, its end may be
    # missing), "reasoning" (a reasoning answer cut before its final answer: nothing to read).
    # None: it ended on its own, or the writer could not tell.
    cut: str | None = None
    # A chain of thought whose prompt asked for its answer under "Final Output:": only what
    # follows that label is read, and without it there is no answer.
    reasoning: bool = False

    def to_json(self) -> str:
        record: dict[str, Any] = {"id": self.id, "task": self.task, "output": self.output}
        if self.p_yes is not None:
            record["p_yes"] = self.p_yes
        if self.cut is not None:
            record["cut"] = self.cut
        if self.reasoning:
            record["reasoning"] = True
        return json.dumps(record, ensure_ascii=False)


CUT_KINDS = ("answer", "reasoning")
