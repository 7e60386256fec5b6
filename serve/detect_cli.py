"""`fincheck detect`: read inputs, run a `Detector`, write one JSON result per input.

Input is either `--text FILE --summary FILE` (one pair, JSON object on stdout) or `--input
pairs.jsonl` (one JSON object per line, results as JSONL to `--out` or stdout, in input order).
Each line goes to the tasks whose prompt fields it holds (`route`): a line with "question" and
"answer" gets a QASem support score; a line with "text" and "summary" gets descriptions (FINAL)
and a hallucination class (FHSumBench).
"""

from __future__ import annotations

import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from fincheck.errors import FincheckError, InvalidRecordError, UsageError
from fincheck.io.jsonl import iter_json_objects, read_utf8_text, record_json
from fincheck.io.safe_files import claimed_output_file
from fincheck.tasks import all_tasks, load_prompt
from fincheck.tasks.qasem.overlap import reads_qas

SUPPORT_KEYS = ("question", "answer")


def _present(record: dict[str, Any], key: str) -> bool:
    return isinstance(record.get(key), str) and bool(record[key].strip())


def route(record: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(tasks to run on this record, fields missing for the closest task when none fits).

    A record goes to every task whose prompt fields it holds, keeping only the most specific
    ones: a QA record (text, sentence, question, answer) gets QASem alone, a (text, summary)
    record gets FINAL and FHSumBench.
    """
    fields = {name: load_prompt(name).fields for name in all_tasks()}  # each prompt's inputs
    fits = [name for name, needed in fields.items() if all(_present(record, f) for f in needed)]
    if fits:
        most = max(len(fields[name]) for name in fits)
        return [name for name in fits if len(fields[name]) == most], []
    closest = max(fields, key=lambda name: sum(_present(record, f) for f in fields[name]))
    return [], [f for f in fields[closest] if not _present(record, f)]


def read_inputs(path: Path) -> list[dict[str, Any]]:
    """Validate every line up front, so a typo on line 900 fails before any model work."""
    if not path.exists():  # (a FIFO or a folder there is refused by the reader, as such)
        raise FincheckError(f"input file not found: {path}")
    records = []
    first_line: dict[str, int] = {}
    for n, record in iter_json_objects(path):
        if any(k in record for k in SUPPORT_KEYS) and not isinstance(record.get("sentence"), str):
            # A QA without its sentence is read against the whole answer text, if given.
            record["sentence"] = record.get("summary") or record.get("response")
        tasks, missing = route(record)
        if not tasks:
            raise InvalidRecordError(str(path), n, missing[0], "missing or not a non-empty string")
        record.setdefault("id", str(n))
        if not isinstance(record["id"], str) and type(record["id"]) is not int:
            # (NaN and Infinity, which Python's JSON reads, would be written back as no JSON)
            raise InvalidRecordError(str(path), n, "id", "expected a string or an integer")
        key = str(record["id"])
        if key in first_line:
            raise InvalidRecordError(
                str(path), n, "id", f"{key!r} repeats line {first_line[key]}: ids must be unique"
            )
        first_line[key] = n
        records.append(record)
    if not records:
        raise FincheckError(f"{path}: no input lines")
    return records


def detect_records(detector: Any, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One result per record, in input order: each routed task's reading, merged."""
    routes = [route(r)[0] for r in records]
    results: list[dict[str, Any]] = [{"id": r["id"]} for r in records]
    tails: list[dict[str, Any]] = [{"trimmed": False, "raw": {}} for _ in records]  # keys put last
    for task in all_tasks():
        indices = [i for i, tasks in enumerate(routes) if task in tasks]
        if not indices:
            continue
        for i, out in zip(
            indices, detector.detect(task, [records[i] for i in indices]), strict=True
        ):
            tails[i]["raw"][task] = out.pop("raw")
            tails[i]["trimmed"] |= out.pop("trimmed")
            results[i].update(out)
    return [{**result, **tail} for result, tail in zip(results, tails, strict=True)]


def run_detect(args) -> int:
    """`args`: the command's DetectOptions."""
    single = args.text is not None or args.summary is not None
    if single == (args.input is not None):
        raise FincheckError("give either --text FILE --summary FILE, or --input pairs.jsonl")
    if single:
        if not (args.text and args.summary):
            raise FincheckError("--text and --summary go together")
        if args.out is not None:  # never ignored: the one result goes to stdout
            raise UsageError(
                "--out: read only with --input (JSONL results); --text and --summary print "
                "their one result as JSON on stdout: leave --out out, or redirect (> FILE)"
            )
        records = [{"id": "1", "text": _read_text(args.text), "summary": _read_text(args.summary)}]
    else:
        records = read_inputs(Path(args.input))
    routed = {task for record in records for task in route(record)[0]}
    if args.overlap_weight and not any(map(reads_qas, routed)):
        raise UsageError(
            "--overlap-weight combines a QA's P(Yes) with its answer's word overlap, and no "
            "input has a question and an answer: leave it out"
        )
    if args.out and Path(args.out).parent.exists() and not Path(args.out).parent.is_dir():
        raise FincheckError(
            f"--out {args.out}: {Path(args.out).parent} is a file, not a folder: choose another path"
        )
    if args.out and not Path(args.out).parent.resolve().is_dir():  # before the model runs
        raise FincheckError(
            f"--out {args.out}: the folder {Path(args.out).parent} does not exist; create it first"
        )
    # claimed before the model runs: a folder that takes no file, a second writer of the same
    # --out, a link planted there, all say so now; moved into place when complete
    with claimed_output_file(args.out, "--out") if args.out else nullcontext(sys.stdout) as out:
        from fincheck.detector import Detector

        detector = Detector.from_pretrained(
            args.model, args.adapter, args, thresholds=args.thresholds
        )
        results = detect_records(detector, records)
        if single:
            del results[0]["id"]
            print(record_json(results[0], indent=2))
        else:
            out.write("".join(record_json(r) + "\n" for r in results))
    if args.out:
        print(f"wrote {len(records)} results to {args.out}", file=sys.stderr)
    return 0


def _read_text(path: str) -> str:
    p = Path(path)
    if not p.exists():
        raise FincheckError(f"file not found: {p}")
    text = read_utf8_text(p).strip()
    if not text:
        raise FincheckError(f"{p}: file is empty")
    return text
