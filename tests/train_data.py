"""Small prepared-pairs folders in the data-prep contract shape, for the training tests.

Built from the real raw files in ../shared/data with the project's prompt files, a few pairs per
task, so tests are fast. `prepared_dir` (tests/conftest.py) is the real `fincheck prepare` output.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from fincheck.pairs import Pair, write_pairs
from fincheck.prompting import load_prompt, prompt_hashes

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
if not DATA.is_dir():
    DATA = Path("/work/shared/data")


def _pair(task: str, split: str, pid: str, target: str, **fields: str) -> Pair:
    messages, span = load_prompt(task).messages(**fields)
    messages.append({"role": "assistant", "content": target})
    return Pair(pid, task, split, messages, {"grounding_span": list(span)})


def small_pairs(n: int = 12) -> dict[str, list[Pair]]:
    """`n` pairs per task from the raw data (final from DeFacto, qasem, fhsumbench)."""
    final = []
    with (DATA / "defacto" / "train.jsonl").open() as f:
        for i, line in zip(range(n), f, strict=False):
            r = json.loads(line)
            explanation = (r.get("feedback") or {}).get("explanation") or ""
            target = f"A. {explanation.strip()}" if r.get("has_error") and explanation else "None"
            final.append(
                _pair(
                    "final",
                    "train",
                    f"defacto-{i}",
                    target,
                    text=r["article"],
                    summary=r["candidate"],
                )
            )
    qasem = []
    with (DATA / "qasem" / "dev.jsonl").open() as f:
        for line in f:
            r = json.loads(line)
            text = " ".join(r["source"])
            for qa in r["qas"]:
                sentence = " ".join(r["summary"][qa["sent_id"]])
                label = "No" if sum(qa["annotations"]) >= 2 else "Yes"
                qasem.append(
                    _pair(
                        "qasem",
                        "train",
                        f"qasem-{len(qasem)}",
                        label,
                        text=text,
                        sentence=sentence,
                        question=qa["question"],
                        answer=qa["answer"],
                    )
                )
                if len(qasem) == n:
                    break
            if len(qasem) == n:
                break
    mapping = {
        "no_hallu": (True, True),
        "factual_hallu": (False, True),
        "non_factual_hallu": (False, False),
    }
    fh = []
    for r in json.loads((DATA / "fhsumbench" / "FHSumBench_data.json").read_text())[:n]:
        faithful, factual = mapping[r["label"]]
        target = json.dumps({"Faithfulness": faithful, "Factuality": factual})
        fh.append(
            _pair(
                "fhsumbench",
                "train",
                f"fh-{r['id']}",
                target,
                text=r["source"],
                summary=r["summary"],
            )
        )
    return {"final": final, "qasem": qasem, "fhsumbench": fh}


def write_small_prepared(out: Path, n: int = 12) -> Path:
    """Write `out/<task>/{train,dev}.jsonl` + manifest.json (dev = the last quarter)."""
    files = []
    for task, pairs in small_pairs(n).items():
        k = max(1, n // 4)
        train, dev = pairs[:-k], pairs[-k:]
        for p in dev:
            p.split = "dev"
        write_pairs(out / task / "train.jsonl", train)
        write_pairs(out / task / "dev.jsonl", dev)
        files += [out / task / "train.jsonl", out / task / "dev.jsonl"]
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()
    manifest = {"fingerprint": digest, "prompt_hashes": prompt_hashes(list(small_pairs(1)))}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return out
