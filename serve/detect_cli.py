"""`fincheck detect`: read inputs, run a `Detector`, write one JSON result per input.

Input is either `--text FILE --summary FILE` (one pair, JSON object on stdout) or `--input
pairs.jsonl` (one JSON object per line, results as JSONL to `--out` or stdout, in input order).
A line with "question" and "answer" gets a QASem support score; any other line needs "text"
and "summary" and gets descriptions (FINAL) and a hallucination class (FHSumBench).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from fincheck.errors import FincheckError, InvalidRecordError
from fincheck.jsonl import iter_json_objects

SUPPORT_KEYS = ("question", "answer")


def read_inputs(path: Path) -> list[dict[str, Any]]:
    """Validate every line up front, so a typo on line 900 fails before any model work."""
    if not path.is_file():
        raise FincheckError(f"input file not found: {path}")
    records = []
    for n, record in iter_json_objects(path):
        required = (
            ["text", "sentence", *SUPPORT_KEYS] if _is_support(record) else ["text", "summary"]
        )
        if _is_support(record) and not isinstance(record.get("sentence"), str):
            # A QA without its sentence is read against the whole answer text, if given.
            record["sentence"] = record.get("summary") or record.get("response")
        for key in required:
            if not isinstance(record.get(key), str) or not record[key].strip():
                raise InvalidRecordError(str(path), n, key, "missing or not a non-empty string")
        record.setdefault("id", str(n))
        records.append(record)
    if not records:
        raise FincheckError(f"{path}: no input lines")
    return records


def _is_support(record: dict[str, Any]) -> bool:
    return any(k in record for k in SUPPORT_KEYS)


def detect_records(detector: Any, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One result per record, in input order."""
    from fincheck.eval.fhsumbench_metrics import judgement_to_label, parse_judgement
    from fincheck.eval.final_metrics import parse_descriptions

    results: list[dict[str, Any] | None] = [None] * len(records)
    pairs = [i for i, r in enumerate(records) if not _is_support(r)]
    qas = [i for i, r in enumerate(records) if _is_support(r)]
    if pairs:
        described = detector.generate("final", [records[i] for i in pairs])
        judged = detector.generate("fhsumbench", [records[i] for i in pairs])
        for i, d, j in zip(pairs, described, judged, strict=True):
            descriptions = parse_descriptions(d.text)
            results[i] = {
                "id": records[i]["id"],
                "descriptions": descriptions,
                "consistent": not descriptions,
                "label": judgement_to_label(parse_judgement(j.text)),
                "trimmed": d.trimmed or j.trimmed,
                "raw": {"final": d.text, "fhsumbench": j.text},
            }
    if qas:
        supported = detector.generate("qasem", [records[i] for i in qas])
        for i, s in zip(qas, supported, strict=True):
            results[i] = {
                "id": records[i]["id"],
                "p_yes": s.p_yes,
                "supported": s.p_yes is not None and s.p_yes >= 0.5,
                "trimmed": s.trimmed,
                "raw": {"qasem": s.text},
            }
    return [r for r in results if r is not None]


def run_detect(args: argparse.Namespace) -> int:
    from fincheck.serve.detector import Detector

    single = args.text is not None or args.summary is not None
    if single == (args.input is not None):
        raise FincheckError("give either --text FILE --summary FILE, or --input pairs.jsonl")
    if single:
        if not (args.text and args.summary):
            raise FincheckError("--text and --summary go together")
        records = [{"id": "1", "text": _read_text(args.text), "summary": _read_text(args.summary)}]
    else:
        records = read_inputs(Path(args.input))
    if args.out and Path(args.out).exists():
        raise FincheckError(f"{args.out} exists; pick a new --out file (nothing is overwritten)")
    detector = Detector.from_pretrained(
        args.model,
        adapter=args.adapter,
        device=args.device,
        dtype=args.dtype,
        trust_remote_code=args.trust_remote_code,
        batch_size=args.batch_size,
        max_new_tokens={"final": args.max_new_tokens, "fhsumbench": args.max_new_tokens}
        if args.max_new_tokens
        else None,
    )
    results = detect_records(detector, records)
    if single:
        result = dict(results[0])
        result.pop("id")
        print(json.dumps(result, indent=2, ensure_ascii=False))
        return 0
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in results)
    if args.out:
        tmp = Path(str(args.out) + ".partial")
        tmp.write_text(lines, encoding="utf-8")
        tmp.replace(args.out)
        print(f"wrote {len(results)} results to {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(lines)
    return 0


def _read_text(path: str) -> str:
    p = Path(path)
    if not p.is_file():
        raise FincheckError(f"file not found: {p}")
    text = p.read_text(encoding="utf-8").strip()
    if not text:
        raise FincheckError(f"{p}: file is empty")
    return text
