"""QASemConsistency: one response record -> one instruction pair per QA.

`summary` is a list of sentences, each a token list -- except in the verifiability subset,
where the response is one flat token list (its `sent_id` may still be 1 when the list holds a
stray "5 ." before the sentence, and `answer_idx` indexes the whole list): there the whole
response is the sentence. The grounding text is the detokenized
reference; the user message also carries the response
sentence the QA is about (`sent_id`), the question and the answer. Target: `Yes` (supported) or
`No`, by the majority of the three annotations, where 1 means *not* supported.
"""

from __future__ import annotations

from fincheck.data.pairs import Pair
from fincheck.data.prompting import Prompt
from fincheck.data.raw_records import RawRecord, require
from fincheck.errors import InvalidRecordError
from fincheck.tasks.qasem.detokenize import detokenize
from fincheck.tasks.qasem.metrics import SUBSETS


def qasem_response_id(record: dict) -> str:
    """Responses are identified by (sub-dataset, source id, generating model)."""
    return f"{record['dataset']}:{record['source_id']}:{record['model']}"


def qasem_source_id(response_id: str) -> str:
    """A response's source: (sub-dataset, source id). Several models' responses about one
    source share its document, though one may quote other passages of it than another."""
    return response_id.rsplit(":", 1)[0]


def convert_qasem_response(
    raw: RawRecord, source_split: str, split: str, prompt: Prompt
) -> list[Pair]:
    """`source_split` is the file's own split (dev/test); `split` the one the pair lands in;
    `prompt` the task's (`Task.prompt`)."""
    record = raw.value
    source = require(record, "source", list, raw, non_empty=True)
    summary = require(record, "summary", list, raw, non_empty=True)
    dataset = require(record, "dataset", str, raw)
    require(record, "source_id", (str, int), raw)
    require(record, "model", str, raw)
    qas = require(record, "qas", list, raw)
    if dataset not in SUBSETS:
        raise InvalidRecordError(raw.path, raw.line, "dataset", f"{dataset!r} not in {SUBSETS}")
    if not all(isinstance(t, str) for t in source):
        raise InvalidRecordError(raw.path, raw.line, "source", "expected a list of token strings")
    flat = all(isinstance(t, str) for t in summary)
    if flat:  # verifiability: the response is one flat token list; answer_idx indexes it whole
        summary = [summary]
    for i, sentence in enumerate(summary):
        if not isinstance(sentence, list) or not all(isinstance(t, str) for t in sentence):
            raise InvalidRecordError(
                raw.path, raw.line, f"summary[{i}]", "expected a list of token strings"
            )

    text = detokenize(source)
    sentences = [detokenize(s) for s in summary]
    response_id = qasem_response_id(record)
    pairs = []
    seen_qa: set[int] = set()
    for k, qa in enumerate(qas):
        field = f"qas[{k}]"
        if not isinstance(qa, dict):
            raise InvalidRecordError(raw.path, raw.line, field, "expected an object")
        for name, kind in (
            ("qa_id", int),
            ("sent_id", int),
            ("question", str),
            ("answer", str),
            ("predicate", str),
            ("annotations", list),
        ):
            require(qa, name, kind, raw, shown_as=f"{field}.{name}")
        if not flat and not 0 <= qa["sent_id"] < len(sentences):
            raise InvalidRecordError(
                raw.path,
                raw.line,
                f"{field}.sent_id",
                f"{qa['sent_id']} is outside the {len(sentences)} summary sentences",
            )
        sentence = sentences[0] if flat else sentences[qa["sent_id"]]
        votes = qa["annotations"]
        if len(votes) != 3 or any(v not in (0, 1) or isinstance(v, bool) for v in votes):
            raise InvalidRecordError(
                raw.path,
                raw.line,
                f"{field}.annotations",
                f"expected three 0/1 votes (1 = not supported), got {votes}",
            )
        if qa["qa_id"] in seen_qa:
            raise InvalidRecordError(
                raw.path, raw.line, f"{field}.qa_id", f"duplicate qa_id {qa['qa_id']}"
            )
        seen_qa.add(qa["qa_id"])

        messages, span = prompt.messages(
            text=text, sentence=sentence, question=qa["question"], answer=qa["answer"]
        )
        target = qasem_target(votes)
        pairs.append(
            Pair(
                id=f"qasem-{source_split}-{raw.line:04d}-{qa['qa_id']:03d}",
                task="qasem",
                split=split,
                messages=[*messages, {"role": "assistant", "content": target}],
                meta={
                    "label": target,
                    "dataset": dataset,
                    "response_id": response_id,
                    "source_split": source_split,
                    "source_line": raw.line,
                    "sent_id": qa["sent_id"],
                    "qa_id": qa["qa_id"],
                    "predicate": qa["predicate"],
                    "annotations": votes,
                    # the split keeps a source's responses together: the responses of
                    # several models about one source share its document
                    "group": qasem_source_id(response_id),
                    "grounding_span": list(span),
                },
            )
        )
    return pairs


# QA `annotations`: 1 = NOT supported (hallucinated), 0 = supported; gold = majority of three.
SUPPORTED, NOT_SUPPORTED = "Yes", "No"


def qasem_target(annotations: list[int]) -> str:
    """Majority of the annotators' votes, where 1 means the QA is not supported."""
    not_supported = sum(annotations)
    return NOT_SUPPORTED if 2 * not_supported > len(annotations) else SUPPORTED
