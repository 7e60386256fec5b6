"""`fincheck prepare`: raw benchmark files -> leakage-free instruction pairs + manifest.

Stages, in order: read and validate each source -> convert records to pairs -> split (grouped
by response / document) -> drop training pairs that share a document with any evaluation set ->
trim to the token budget (optional) -> write `OUT/<task>/<split>.jsonl` and `OUT/manifest.json`.
Same inputs and config give byte-identical outputs (no timestamps, no absolute paths).
"""

from __future__ import annotations

import functools
import json
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fincheck import __version__
from fincheck.data.pairs import SPLITS, Pair, write_pairs
from fincheck.data.raw_records import RecordStream
from fincheck.data.trimming import TokenCounter, count_whitespace_tokens, trim_pair
from fincheck.data_prep.contamination import drop_contaminated
from fincheck.errors import FincheckError
from fincheck.io.config import config_field, config_to_dict
from fincheck.io.out_lock import LOCK_FILE, hold_out_dir
from fincheck.io.safe_files import write_text
from fincheck.io.sources import Source, default_cache_dir, resolve_source, sha256_file
from fincheck.models.loading import load_prompt_fitter
from fincheck.tasks import all_tasks, get_task, prompt_hashes, task_names
from fincheck.tasks.base import PrepareSettings, UserFile
from fincheck.tasks.prepared import files_fingerprint

MANIFEST_VERSION = 1


@dataclass
class PrepareGeneral(PrepareSettings):
    """`fincheck prepare`'s own settings; `PrepareConfig` adds every built-in task's."""

    tasks: list[str] = field(
        default_factory=lambda: list(task_names()),
        metadata={"help": "tasks to prepare (default: every registered task)"},
    )
    contamination_threshold: float = config_field(
        0.5,
        "drop a training pair when this share of its document's word shingles (of the smaller document) appears in an evaluation document",
        above=0,
        at_most=1,
    )
    contamination_shingle_size: int = config_field(
        6, "words per shingle for the contamination guard", at_least=1
    )
    max_pair_tokens: int | None = config_field(
        None,
        "token budget per pair (all messages); longer pairs get their grounding text trimmed, never the target",
        at_least=1,
    )
    tokenizer: str | None = config_field(
        None, "tokenizer (name or path) that counts tokens for max_pair_tokens; unset = count words"
    )
    skip_invalid: bool = config_field(
        False, "skip invalid raw records (counted in the manifest) instead of stopping"
    )

    def __post_init__(self) -> None:
        known = task_names()
        if not self.tasks or any(t not in known for t in self.tasks):
            raise ValueError(f"tasks must be a non-empty subset of {list(known)}, got {self.tasks}")
        if not 0 < self.contamination_threshold <= 1:
            raise ValueError("contamination_threshold must be in (0, 1]")
        for options in type(self).__mro__:  # each task's options check their own values
            if "check" in vars(options):
                options.check(self)


# each registered task's own prepare settings (`Task.prepare_options`), first task first
TASK_SETTINGS = [task.prepare_options for task in all_tasks().values() if task.prepare_options]


@dataclass
class PrepareConfig(*reversed(TASK_SETTINGS), PrepareGeneral):
    """The config of `fincheck prepare`: the general settings, then each task's own, as one flat
    set of keys (`--qasem_dev_fraction=0.2`)."""


def label_counts(pairs: list[Pair], tasks: list[str]) -> dict[str, dict[str, dict[str, Any]]]:
    counts: dict[str, dict[str, dict[str, Any]]] = {}
    for task in tasks:
        counts[task] = {}
        for split in SPLITS:
            members = [p for p in pairs if p.task == task and p.split == split]
            labels = Counter(p.meta["label"] for p in members)
            counts[task][split] = {"pairs": len(members), "labels": dict(sorted(labels.items()))}
    return counts


def token_counter(tokenizer: str | None) -> TokenCounter:
    """Count with a tokenizer (a known name, a folder or a hub name) when given, else by words.
    It is loaded by the one route to a tokenizer: its model's config read first, every failure
    one line."""
    if not tokenizer:
        return count_whitespace_tokens
    tok = load_prompt_fitter(tokenizer).tokenizer
    return lambda text: len(tok(text, add_special_tokens=False, verbose=False)["input_ids"])


def trim_all(pairs: list[Pair], config: PrepareConfig) -> tuple[list[Pair], dict]:
    if config.max_pair_tokens is None:
        return pairs, {}
    count = token_counter(config.tokenizer)
    kept: list[Pair] = []
    stats: dict[str, Counter[str]] = defaultdict(Counter)
    for pair in pairs:
        fitted, trimmed = trim_pair(pair, config.max_pair_tokens, count)
        key = f"{pair.task}/{pair.split}"
        if fitted is None:
            stats["dropped_over_budget"][key] += 1
            continue
        stats["trimmed"][key] += int(trimmed)
        kept.append(fitted)
    return kept, {
        name: dict(sorted((k, v) for k, v in c.items() if v)) for name, c in stats.items()
    }


def resolve_input(
    source: Source | UserFile, data_dir: Path | None, cache_dir: Path | None
) -> tuple[Path, dict[str, Any]]:
    """(local path, manifest entry) of a pinned source (checked against its sha256) or of a file
    the user named (its sha256 recorded)."""
    if isinstance(source, UserFile):
        if not source.path.is_file():
            raise FincheckError(f"{source.what} not found: {source.path} ({source.option})")
        return source.path, {"sha256": sha256_file(source.path), "name": source.path.name}
    path = resolve_source(source, data_dir, cache_dir)
    return path, {"sha256": source.sha256, "url": source.url, "license": source.license}


class Stopwatch:
    """Wall time per named stage, printed in the summary (never written: outputs stay
    byte-identical)."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self._clock = time.perf_counter()

    def stage(self, name: str) -> None:
        now = time.perf_counter()
        self.timings[name] = now - self._clock
        self._clock = now


def refuse_overlap(out_dir: Path, inputs: list[str | Path]) -> None:
    """The output folder must not be, contain, or sit inside an input: writing there could
    overwrite the raw benchmark files."""
    out = Path(out_dir).resolve()
    for given in inputs:
        path = Path(given).resolve()
        if not path.exists():
            continue  # a missing input is reported by name further on; nothing to overwrite
        if out == path or out.is_relative_to(path) or path.is_relative_to(out):
            raise FincheckError(
                f"--out {out_dir} overlaps the input {given}: pick an output folder outside "
                "the data (nothing was written)"
            )


def run_prepare(
    config: PrepareConfig,
    data_dir: Path | None,
    out_dir: Path,
    cache_dir: Path | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> dict:
    """The whole stage: resolve and verify the sources, then `prepare_from_files`."""
    sources_dir = data_dir or cache_dir or default_cache_dir()
    sources = [source for task in config.tasks for source in get_task(task).sources(config)]
    user_files = [source.path for source in sources if isinstance(source, UserFile)]
    refuse_overlap(out_dir, [sources_dir, *user_files])
    own = (LOCK_FILE, "manifest.json", "manifest.json.tmp", *task_names())
    with hold_out_dir(out_dir, "fincheck prepare", "prepare", own):
        clock = Stopwatch()
        files: dict[str, Path] = {}  # source name -> verified local file
        inputs: dict[str, dict[str, Any]] = {}  # source name -> manifest entry
        for source in sources:
            files[source.name], inputs[source.name] = resolve_input(source, data_dir, cache_dir)
        # every input file as resolved (a data folder whose task folder links into --out passes
        # the check of the folders above, and its files would be overwritten)
        refuse_overlap(out_dir, list(files.values()))
        clock.stage("resolve sources")
        return prepare_from_files(config, files, inputs, out_dir, progress, log, clock)


def prepare_from_files(
    config: PrepareConfig,
    files: dict[str, Path],
    inputs: dict[str, dict[str, Any]],
    out_dir: Path,
    progress: bool = True,
    log: Callable[[str], None] = print,
    clock: Stopwatch | None = None,
) -> dict:
    """Raw files (already resolved) -> pairs + manifest in `out_dir`; returns the manifest."""
    clock = clock or Stopwatch()
    stream = RecordStream(config.skip_invalid)
    pairs: list[Pair] = []
    notes: dict[str, Any] = {}  # per-task manifest notes
    for name in config.tasks:  # every selected task's pairs, with their split assigned
        collected = get_task(name).collect(config, files, stream)
        pairs += collected.pairs
        notes.update(collected.notes)
    clock.stage("convert + split")
    before = label_counts(pairs, config.tasks)

    # Train and dev pairs that share a document with a test pair go; then train pairs that
    # share one with a dev pair (choices made on dev would otherwise favour memorising).
    guard = functools.partial(
        drop_contaminated,
        threshold=config.contamination_threshold,
        shingle_size=config.contamination_shingle_size,
        progress=progress,
    )
    test = [p for p in pairs if p.split == "test"]
    not_test, contamination = guard([p for p in pairs if p.split != "test"], test)
    dev = [p for p in not_test if p.split == "dev"]
    train, contamination["dev"] = guard([p for p in not_test if p.split != "dev"], dev)
    kept_ids = {id(p) for p in train + dev}
    pairs = [p for p in pairs if p.split == "test" or id(p) in kept_ids]
    clock.stage("contamination guard")

    pairs, trimming = trim_all(pairs, config)
    clock.stage("trim")

    out_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, dict[str, Any]] = {}
    for task in config.tasks:
        for split in SPLITS:
            members = [p for p in pairs if p.task == task and p.split == split]
            path = out_dir / task / f"{split}.jsonl"
            if not members:
                path.unlink(missing_ok=True)
                continue
            write_pairs(path, members)
            written[f"{task}/{split}.jsonl"] = {"pairs": len(members), "sha256": sha256_file(path)}
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "fincheck_version": __version__,
        "fingerprint": files_fingerprint(written),
        "inputs": inputs,
        "config": config_to_dict(config),
        "prompt_hashes": prompt_hashes(config.tasks),
        "counts": label_counts(pairs, config.tasks),
        "counts_before_guard": before,
        "contamination": contamination,
        "trimming": trimming,
        "skipped_invalid": dict(stream.skipped),
        "first_skipped_error": dict(stream.first_error),
        "notes": notes,
        "files": written,
    }
    # written last: it lists every file with its sha256, so a folder with a manifest is whole
    write_text(out_dir / "manifest.json", json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    clock.stage("write")
    log(format_summary(manifest, clock.timings, out_dir))
    return manifest


def format_summary(manifest: dict, timings: dict[str, float], out_dir: Path) -> str:
    lines = [f"Prepared pairs in {out_dir} (fingerprint {manifest['fingerprint'][:12]})", ""]
    lines.append(f"{'task':<11}{'train':>8}{'dev':>8}{'test':>8}   labels (test)")
    for task, splits in manifest["counts"].items():
        row = "".join(f"{splits[s]['pairs']:>8}" for s in SPLITS)
        labels = ", ".join(f"{k}={v}" for k, v in splits["test"]["labels"].items())
        lines.append(f"{task:<11}{row}   {labels}")
    guard = manifest["contamination"]
    dropped = ", ".join(f"{k} {v}" for k, v in guard["dropped"].items())
    lines += ["", f"contamination guard dropped: {dropped or 'nothing'}"]
    if "dev" in guard:  # train pairs sharing a document with a dev pair
        dropped = ", ".join(f"{k} {v}" for k, v in guard["dev"]["dropped"].items())
        lines.append(f"  and train pairs sharing a document with dev: {dropped or 'nothing'}")
    if manifest["trimming"]:
        lines.append(f"trimming: {manifest['trimming']}")
    if manifest["skipped_invalid"]:
        lines.append(f"skipped invalid records: {manifest['skipped_invalid']}")
    notes = manifest["notes"].get("defacto_explanations")
    if notes:
        split = sum(v["split_into_several"] for v in notes.values())
        total = sum(v["inconsistent"] for v in notes.values())
        lines.append(f"DeFacto explanations split into several descriptions: {split} of {total}")
    spent = ", ".join(f"{k} {v:.1f}s" for k, v in timings.items())
    lines.append(f"time: {spent} (total {sum(timings.values()):.1f}s)")
    return "\n".join(lines)
