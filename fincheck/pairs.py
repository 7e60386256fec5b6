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

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fincheck.errors import FincheckError, InvalidRecordError
from fincheck.jsonl import iter_json_objects

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
        record = {
            "id": self.id,
            "task": self.task,
            "split": self.split,
            "messages": self.messages,
            "meta": self.meta,
        }
        return json.dumps(record, ensure_ascii=False, sort_keys=False)

    @classmethod
    def from_dict(cls, record: dict[str, Any], where: str = "<pair>", line: int = 0) -> Pair:
        validate_pair_dict(record, where, line)
        return cls(
            id=record["id"],
            task=record["task"],
            split=record["split"],
            messages=record["messages"],
            meta=record.get("meta", {}),
        )


def validate_pair_dict(record: Any, where: str, line: int) -> None:
    """Check a decoded line against the schema; raise `file:line: field: problem`."""
    if not isinstance(record, dict):
        raise InvalidRecordError(where, line, "<record>", "expected a JSON object")
    for key, kind in (("id", str), ("task", str), ("split", str), ("messages", list)):
        if key not in record:
            raise InvalidRecordError(where, line, key, "missing")
        if not isinstance(record[key], kind):
            raise InvalidRecordError(where, line, key, f"expected {kind.__name__}")
    from fincheck.tasks import task_names  # the registry imports this module: look up late

    if record["task"] not in task_names():
        raise InvalidRecordError(
            where, line, "task", f"{record['task']!r} not in {task_names()} (the registered tasks)"
        )
    if record["split"] not in SPLITS:
        raise InvalidRecordError(where, line, "split", f"{record['split']!r} not in {SPLITS}")
    messages = record["messages"]
    if not messages or messages[-1].get("role") != "assistant":
        raise InvalidRecordError(
            where, line, "messages", "the last message must be the assistant target"
        )
    for i, message in enumerate(messages):
        if message.get("role") not in ROLES or not isinstance(message.get("content"), str):
            raise InvalidRecordError(
                where, line, f"messages[{i}]", f"needs a role in {ROLES} and a string content"
            )


def write_pairs(path: Path, pairs: Iterable[Pair]) -> int:
    """Write pairs as JSONL (UTF-8, '\\n' endings) atomically: a crash never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    n = 0
    with tmp.open("w", encoding="utf-8", newline="\n") as f:
        for pair in pairs:
            f.write(pair.to_json() + "\n")
            n += 1
    tmp.replace(path)
    return n


def read_pairs(path: Path) -> Iterator[Pair]:
    """Read a pairs file, validating every line."""
    for line_no, record in iter_json_objects(path):
        yield Pair.from_dict(record, str(path), line_no)
