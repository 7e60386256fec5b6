"""`fincheck prepare`: raw benchmark files -> leakage-free instruction pairs + manifest.

Stages, in order: read and validate each source -> convert records to pairs -> split (grouped
by response / document) -> drop training pairs that share a document with any evaluation set ->
trim to the token budget (optional) -> write `OUT/<task>/<split>.jsonl` and `OUT/manifest.json`.
Same inputs and config give byte-identical outputs (no timestamps, no absolute paths).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fincheck import __version__
from fincheck.config import config_field, config_to_dict
from fincheck.data_prep.contamination import drop_contaminated
from fincheck.data_prep.defacto import convert_defacto
from fincheck.data_prep.fhsumbench import convert_fhsumbench
from fincheck.data_prep.final_file import convert_final_item
from fincheck.data_prep.qasem import convert_qasem_response, qasem_response_id
from fincheck.data_prep.raw_records import RawRecord, iter_records
from fincheck.data_prep.sources import SOURCES, resolve_source, sha256_file
from fincheck.data_prep.splits import split_by_group
from fincheck.data_prep.trimming import load_token_counter, trim_grounding
from fincheck.errors import FincheckError, InvalidRecordError
from fincheck.pairs import SPLITS, TASKS, Pair, write_pairs
from fincheck.prompting import prompt_hashes

MANIFEST_VERSION = 1
SOURCE_TASK = {
    "qasem": "qasem",
    "fhsumbench": "fhsumbench",
    "defacto": "final",
}  # source folder -> task


@dataclass
class PrepareConfig:
    tasks: list[str] = config_field(
        list(TASKS), "tasks to prepare: any of final, qasem, fhsumbench"
    )
    seed: int = config_field(13, "seed of the grouped splits (QASem dev -> train/dev, FHSumBench)")
    qasem_dev_fraction: float = config_field(
        0.15,
        "share of QASem's dev QAs held out as our dev split (grouped by response); its test split is the evaluation set",
    )
    fhsumbench_train_fraction: float = config_field(
        0.4, "FHSumBench share for training (grouped by source document)"
    )
    fhsumbench_dev_fraction: float = config_field(
        0.1, "FHSumBench share for validation (grouped by source document)"
    )
    fhsumbench_test_fraction: float = config_field(
        0.5, "FHSumBench share for evaluation (grouped by source document)"
    )
    fhsumbench_eval_all: bool = config_field(
        False,
        "put all 1,336 FHSumBench samples in test and train on none of them (numbers comparable with the paper)",
    )
    final_file: str | None = config_field(
        None,
        "a FINAL release file (JSONL or JSON): its items become final/test instead of DeFacto's test split",
    )
    contamination_threshold: float = config_field(
        0.5,
        "drop a training pair when this share of its document's word shingles (of the smaller document) appears in an evaluation document",
    )
    contamination_shingle_size: int = config_field(
        6, "words per shingle for the contamination guard"
    )
    max_pair_tokens: int | None = config_field(
        None,
        "token budget per pair (all messages); longer pairs get their grounding text trimmed, never the target",
    )
    tokenizer: str | None = config_field(
        None, "tokenizer (name or path) that counts tokens for max_pair_tokens; unset = count words"
    )
    skip_invalid: bool = config_field(
        False, "skip invalid raw records (counted in the manifest) instead of stopping"
    )

    def __post_init__(self) -> None:
        unknown = [t for t in self.tasks if t not in TASKS]
        if unknown or not self.tasks:
            raise ValueError(f"tasks must be a non-empty subset of {list(TASKS)}, got {self.tasks}")
        fractions = (
            self.fhsumbench_train_fraction,
            self.fhsumbench_dev_fraction,
            self.fhsumbench_test_fraction,
        )
        if any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-6:
            raise ValueError(f"FHSumBench fractions must be >= 0 and sum to 1, got {fractions}")
        if not 0 <= self.qasem_dev_fraction < 1:
            raise ValueError("qasem_dev_fraction must be in [0, 1)")
        if not 0 < self.contamination_threshold <= 1:
            raise ValueError("contamination_threshold must be in (0, 1]")


class RecordStream:
    """Validated records of the run's sources; counts what `--skip-invalid` skipped."""

    def __init__(self, skip_invalid: bool) -> None:
        self.skip_invalid = skip_invalid
        self.skipped: Counter[str] = Counter()
        self.first_error: dict[str, str] = {}

    def convert(
        self,
        label: str,
        raws: Iterable[RawRecord],
        key: Callable[[dict], Any],
        convert: Callable[[RawRecord], Pair | list[Pair]],
    ) -> Iterator[Pair]:
        """Convert each record; a bad or duplicate record stops the run (or is skipped)."""
        seen: dict[Any, int] = {}
        for raw in raws:
            try:
                if raw.error is not None:
                    raise raw.error
                converted = convert(raw)
                record_key = key(raw.value)
                if record_key in seen:
                    raise InvalidRecordError(
                        raw.path,
                        raw.line,
                        "id",
                        f"duplicate record {record_key!r} (first at line {seen[record_key]})",
                    )
                seen[record_key] = raw.line
            except InvalidRecordError as e:
                if not self.skip_invalid:
                    raise FincheckError(f"{e} (use --skip-invalid to skip such records)") from None
                self.skipped[label] += 1
                self.first_error.setdefault(label, str(e))
                continue
            yield from (converted if isinstance(converted, list) else [converted])


def collect_pairs(
    config: PrepareConfig, paths: dict[str, Path], stream: RecordStream
) -> tuple[list[Pair], dict]:
    """All pairs of the selected tasks, with their split assigned; plus per-source notes."""
    pairs: list[Pair] = []
    notes: dict[str, Any] = {}
    if "qasem" in config.tasks:
        dev = list(
            stream.convert(
                "qasem/dev.jsonl",
                iter_records(paths["qasem/dev.jsonl"]),
                qasem_response_id,
                lambda raw: convert_qasem_response(raw, "dev", "train"),
            )
        )
        split_by_group(
            dev,
            {"train": 1 - config.qasem_dev_fraction, "dev": config.qasem_dev_fraction},
            config.seed,
        )
        test = stream.convert(
            "qasem/test.jsonl",
            iter_records(paths["qasem/test.jsonl"]),
            qasem_response_id,
            lambda raw: convert_qasem_response(raw, "test", "test"),
        )
        pairs += dev + list(test)
    if "fhsumbench" in config.tasks:
        name = "fhsumbench/FHSumBench_data.json"
        samples = list(
            stream.convert(
                name,
                iter_records(paths[name]),
                lambda r: str(r["id"]),
                lambda raw: convert_fhsumbench(raw, "test"),
            )
        )
        if not config.fhsumbench_eval_all:
            split_by_group(
                samples,
                {
                    "train": config.fhsumbench_train_fraction,
                    "dev": config.fhsumbench_dev_fraction,
                    "test": config.fhsumbench_test_fraction,
                },
                config.seed,
            )
        notes["fhsumbench_documents"] = len({p.meta["group"] for p in samples})
        pairs += samples
    if "final" in config.tasks:
        defacto_splits = {"train": "train", "val": "dev", "test": "test"}
        if config.final_file:
            del defacto_splits["test"]  # the FINAL file is the evaluation set
        explanation_stats: dict[str, dict[str, int]] = {}
        for source_split, split in defacto_splits.items():
            name = f"defacto/{source_split}.jsonl"
            converted = list(
                stream.convert(
                    name,
                    iter_records(paths[name]),
                    lambda r: r["doc_id"],
                    lambda raw, s=source_split, t=split: convert_defacto(raw, s, t),
                )
            )
            inconsistent = [p for p in converted if p.meta["label"] == "inconsistent"]
            explanation_stats[source_split] = {
                "inconsistent": len(inconsistent),
                "split_into_several": sum(p.meta["explanation_split"] for p in inconsistent),
                "descriptions": sum(len(p.meta["descriptions"]) for p in inconsistent),
            }
            pairs += converted
        notes["defacto_explanations"] = explanation_stats
        if config.final_file:
            pairs += list(
                stream.convert(
                    "final_file",
                    iter_records(paths["final_file"]),
                    lambda r: r.get("id"),
                    convert_final_item,
                )
            )
    return pairs, notes


def label_counts(pairs: list[Pair], tasks: list[str]) -> dict[str, dict[str, dict[str, Any]]]:
    counts: dict[str, dict[str, dict[str, Any]]] = {}
    for task in tasks:
        counts[task] = {}
        for split in SPLITS:
            members = [p for p in pairs if p.task == task and p.split == split]
            labels = Counter(p.meta["label"] for p in members)
            counts[task][split] = {"pairs": len(members), "labels": dict(sorted(labels.items()))}
    return counts


def trim_all(pairs: list[Pair], config: PrepareConfig) -> tuple[list[Pair], dict]:
    if config.max_pair_tokens is None:
        return pairs, {}
    count = load_token_counter(config.tokenizer)
    kept: list[Pair] = []
    stats: dict[str, Counter[str]] = defaultdict(Counter)
    for pair in pairs:
        fitted, trimmed = trim_grounding(pair, config.max_pair_tokens, count)
        key = f"{pair.task}/{pair.split}"
        if fitted is None:
            stats["dropped_over_budget"][key] += 1
            continue
        stats["trimmed"][key] += int(trimmed)
        kept.append(fitted)
    return kept, {
        name: dict(sorted((k, v) for k, v in c.items() if v)) for name, c in stats.items()
    }


def run_prepare(
    config: PrepareConfig,
    data_dir: Path | None,
    out_dir: Path,
    cache_dir: Path | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> dict:
    timings: dict[str, float] = {}
    clock = time.perf_counter()

    def stage(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timings[name] = now - clock
        clock = now

    needed = [name for name in SOURCES if SOURCE_TASK[name.split("/")[0]] in config.tasks]
    if config.final_file:
        needed.remove("defacto/test.jsonl")
    paths = {name: resolve_source(SOURCES[name], data_dir, cache_dir) for name in needed}
    inputs = {
        name: {
            "sha256": SOURCES[name].sha256,
            "url": SOURCES[name].url,
            "license": SOURCES[name].license,
        }
        for name in needed
    }
    if config.final_file:
        final_path = Path(config.final_file)
        if not final_path.is_file():
            raise FincheckError(f"FINAL file not found: {final_path} (--final_file)")
        paths["final_file"] = final_path
        inputs["final_file"] = {"sha256": sha256_file(final_path), "name": final_path.name}
    stage("resolve sources")

    stream = RecordStream(config.skip_invalid)
    pairs, notes = collect_pairs(config, paths, stream)
    stage("convert + split")
    before = label_counts(pairs, config.tasks)

    evaluation = [p for p in pairs if p.split == "test"]
    training = [p for p in pairs if p.split != "test"]
    kept, contamination = drop_contaminated(
        training,
        evaluation,
        config.contamination_threshold,
        config.contamination_shingle_size,
        progress=progress,
    )
    kept_ids = {id(p) for p in kept}
    pairs = [p for p in pairs if p.split == "test" or id(p) in kept_ids]
    stage("contamination guard")

    pairs, trimming = trim_all(pairs, config)
    stage("trim")

    out_dir.mkdir(parents=True, exist_ok=True)
    files: dict[str, dict[str, Any]] = {}
    for task in config.tasks:
        for split in SPLITS:
            members = [p for p in pairs if p.task == task and p.split == split]
            path = out_dir / task / f"{split}.jsonl"
            if not members:
                path.unlink(missing_ok=True)
                continue
            write_pairs(path, members)
            files[f"{task}/{split}.jsonl"] = {"pairs": len(members), "sha256": sha256_file(path)}
    fingerprint = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "fincheck_version": __version__,
        "fingerprint": fingerprint,
        "inputs": inputs,
        "config": config_to_dict(config),
        "prompt_hashes": prompt_hashes(config.tasks),
        "counts": label_counts(pairs, config.tasks),
        "counts_before_guard": before,
        "contamination": contamination.to_dict(),
        "trimming": trimming,
        "skipped_invalid": dict(stream.skipped),
        "first_skipped_error": dict(stream.first_error),
        "notes": notes,
        "files": files,
    }
    tmp = out_dir / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(out_dir / "manifest.json")
    stage("write")
    log(format_summary(manifest, timings, out_dir))  # timings are printed, never written
    return manifest


def format_summary(manifest: dict, timings: dict[str, float], out_dir: Path) -> str:
    lines = [f"Prepared pairs in {out_dir} (fingerprint {manifest['fingerprint'][:12]})", ""]
    lines.append(f"{'task':<11}{'train':>8}{'dev':>8}{'test':>8}   labels (test)")
    for task, splits in manifest["counts"].items():
        row = "".join(f"{splits[s]['pairs']:>8}" for s in SPLITS)
        labels = ", ".join(f"{k}={v}" for k, v in splits["test"]["labels"].items())
        lines.append(f"{task:<11}{row}   {labels}")
    dropped = manifest["contamination"]["dropped"]
    lines.append("")
    lines.append(
        "contamination guard dropped: "
        + (", ".join(f"{k} {v}" for k, v in dropped.items()) or "nothing")
    )
    if manifest["trimming"]:
        lines.append(f"trimming: {manifest['trimming']}")
    if manifest["skipped_invalid"]:
        lines.append(f"skipped invalid records: {manifest['skipped_invalid']}")
    notes = manifest["notes"].get("defacto_explanations")
    if notes:
        split = sum(v["split_into_several"] for v in notes.values())
        total = sum(v["inconsistent"] for v in notes.values())
        lines.append(f"DeFacto explanations split into several descriptions: {split} of {total}")
    lines.append(
        "time: "
        + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items())
        + f" (total {sum(timings.values()):.1f}s)"
    )
    return "\n".join(lines)
