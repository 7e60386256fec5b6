"""A prepared-data folder (what `fincheck prepare --out` writes), read in one place.

    OUT/<task>/<split>.jsonl   pairs (`fincheck.data.pairs`)
    OUT/manifest.json          input checksums, config, prompt hashes, counts, `fingerprint`
Evaluation and scoring read it through these functions; training opens it once as a
`PreparedFolder` (the manifest read and checked once, each split read once).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fincheck.data.pairs import SPLITS, Pair, read_pairs
from fincheck.errors import FincheckError
from fincheck.io.checksums import sha256_file
from fincheck.io.jsonl import read_json_record
from fincheck.io.runs import MANIFEST_SHAPE
from fincheck.io.safe_files import read_regular_bytes
from fincheck.tasks import task_names

MANIFEST = "manifest.json"
log = logging.getLogger(__name__)


def split_path(dataset_dir: str | Path, task: str, split: str) -> Path:
    return Path(dataset_dir) / task / f"{split}.jsonl"


def split_sha256(manifest: dict[str, Any], task: str, split: str) -> str | None:
    """The sha256 of one task's split file as the prepared folder's manifest records it (the
    inputs a run read: two folders may share it, and a folder prepared again may not)."""
    return (manifest.get("files", {}).get(f"{task}/{split}.jsonl") or {}).get("sha256")


def read_split(
    dataset_dir: str | Path, task: str, split: str, manifest: dict[str, Any] | None = None
) -> list[Pair]:
    """One task's pairs of one split (checked against `manifest`, read here when not given); a
    missing file says how to make it."""
    path = split_path(dataset_dir, task, split)
    if not path.is_file():
        raise FincheckError(
            f"no {split} pairs for task {task!r}: {path} is missing. Run `fincheck prepare` "
            f"(with {task!r} among its tasks) first."
        )
    check_recorded_sha256(dataset_dir, path, manifest)
    return list(read_pairs(path, task_names()))


def check_recorded_sha256(
    dataset_dir: str | Path, path: Path, manifest: dict[str, Any] | None = None
) -> None:
    """A split file as `fincheck prepare` wrote it: its sha256 is the one the manifest records
    (and the data fingerprint is made of), so results and runs that name the fingerprint name
    these very pairs. A file edited by hand, or a folder re-prepared under a kept manifest,
    stops here."""
    manifest_path = Path(dataset_dir) / MANIFEST
    if manifest is None and not manifest_path.is_file():
        return
    key = path.relative_to(dataset_dir).as_posix()
    # (a folder without one: the manifest its files made when it was opened)
    manifest = read_manifest(dataset_dir) if manifest is None else manifest
    files = manifest.get("files")
    if not manifest_path.is_file():  # no manifest: the folder as this command first read it
        recorded = (files or {}).get(key)
        if recorded is None or recorded.get("sha256") != sha256_file(path):
            raise FincheckError(
                f"{path} changed after this command read {dataset_dir} (a folder without a "
                "manifest is named by its files as they were then): leave it as it is while a "
                "command reads it, or prepare it with `fincheck prepare`"
            )
        return
    if isinstance(files, dict) and key not in files:
        raise FincheckError(
            f"{path} is not among the files {manifest_path} records (it was not written by "
            "`fincheck prepare`, whose data fingerprint names only those): prepare the data "
            "again with this task"
        )
    recorded = (files or {}).get(key)
    if isinstance(recorded, dict) and recorded.get("sha256") != sha256_file(path):
        raise FincheckError(
            f"{path} changed after `fincheck prepare` wrote it: its sha256 is not the one "
            f"{manifest_path} records (data fingerprint {manifest.get('fingerprint', '?')[:12]}). "
            "Prepare the data again rather than editing it"
        )


def read_manifest(dataset_dir: str | Path) -> dict[str, Any]:
    """The manifest; for a folder that has none (with a warning), its files' (`files_manifest`)."""
    path = Path(dataset_dir) / MANIFEST
    # what it vouches for: every split file's sha256, and the fingerprint they make
    manifest = read_json_record(path, MANIFEST_SHAPE, required=("files", "fingerprint"))
    if manifest is None:
        log.warning("%s not found: the data is fingerprinted by its files as they are now", path)
        return files_manifest(dataset_dir)
    files, recorded = manifest["files"], manifest["fingerprint"]
    if files_fingerprint(files) != recorded:
        # results and runs name the data by this fingerprint: it must be the files' own
        raise FincheckError(
            f"{path}: its fingerprint is not the one its files' sha256 make (the manifest was "
            "edited after `fincheck prepare` wrote it): prepare the data again"
        )
    return manifest


def files_manifest(dataset_dir: str | Path) -> dict[str, Any]:
    """For a folder without a manifest (laid out by hand): its split files' sha256 and pair
    counts and the fingerprint they make, as prepare would record them, so a run or a resume
    names these very pairs and a folder changed since is another data set."""
    files = {}
    for task in task_names():  # the registered tasks' split files, nothing else found there
        for split in SPLITS:
            path = split_path(dataset_dir, task, split)
            if path.is_file():
                data = read_regular_bytes(path)  # hashed and counted from the same bytes
                pairs = sum(1 for line in data.splitlines() if line.strip())
                digest = hashlib.sha256(data).hexdigest()
                files[f"{task}/{split}.jsonl"] = {"sha256": digest, "pairs": pairs}
    return {"files": files, "fingerprint": files_fingerprint(files)} if files else {}


def files_fingerprint(files: dict[str, Any]) -> str:
    """The data fingerprint: the sha256 of the split files' records (pairs and sha256 each)."""
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def prepared_tasks(dataset_dir: str | Path) -> list[str]:
    """The default task list of train and eval: every registered task the prepared folder
    holds (the tasks its manifest counts; all registered ones for a folder without a
    manifest), so a new task's package is trained on and evaluated without naming it."""
    path = Path(dataset_dir) / MANIFEST
    return tasks_held(dataset_dir, read_json_record(path, MANIFEST_SHAPE))


def tasks_held(dataset_dir: str | Path, manifest: dict[str, Any] | None) -> list[str]:
    """`prepared_tasks` from a manifest already read (None: the folder has none)."""
    if manifest is None:
        return list(task_names())
    held = manifest.get("counts") or {}
    tasks = [t for t in task_names() if t in held]
    if not tasks:
        raise FincheckError(
            f"{dataset_dir}: its manifest counts none of the registered tasks "
            f"({', '.join(task_names())}): run `fincheck prepare` into it"
        )
    return tasks


@dataclass
class PreparedFolder:
    """A prepared folder opened once: training's one entry to its data. The manifest is read
    and checked once; each split is read, and checked against it, once."""

    path: Path
    manifest: dict[str, Any]  # {} for a folder without one (`read_manifest`)
    _splits: dict[tuple[str, str], list[Pair]] = field(default_factory=dict, repr=False)

    @classmethod
    def open(cls, path: str | Path) -> PreparedFolder:
        """Checked before any slow setup of training (DeepSpeed, model loading)."""
        if not (path := Path(path)).is_dir():
            raise FincheckError(f"dataset_dir {path} does not exist: run `fincheck prepare` first")
        return cls(path, read_manifest(path))

    @property
    def fingerprint(self) -> str | None:
        return self.manifest.get("fingerprint")

    def tasks(self) -> list[str]:
        """Every registered task the folder holds (`prepared_tasks`)."""
        has_one = (self.path / MANIFEST).is_file()
        return tasks_held(self.path, self.manifest if has_one else None)

    def has(self, task: str, split: str) -> bool:
        return split_path(self.path, task, split).is_file()

    def split(self, task: str, split: str) -> list[Pair]:
        if (task, split) not in self._splits:
            self._splits[task, split] = read_split(self.path, task, split, self.manifest)
        return self._splits[task, split]
