"""The training run folder, written by `fincheck train` and read here, in one place.

A finished run folder (`checkpoints/<run>/`) holds:
    adapter_model.safetensors, adapter_config.json   the LoRA adapter
    tokenizer files, chat_template.jinja              the tokenizer training used
    recipe.yaml                                       the resolved recipe
    data_manifest.json                                the prepared data's manifest
    fincheck_run.json                                 run metadata: `base_model` (relative to the
                                                      run folder when the base lives inside it),
                                                      base/recipe/data fingerprints, prompt hashes
    base/                                             a random-init base (tiny-cpu), which exists
                                                      nowhere else
A `checkpoint-<step>/` folder inside it is a run folder too: its `fincheck_complete.json` holds
the same metadata (base paths relative to the run folder around it). Both also hold
`fincheck_training_output.json` from before the libraries write: a copy of either made while it
was being saved is refused wherever it goes, never read as a bare adapter.

Completeness is written last: fincheck_run.json (and a checkpoint's fincheck_complete.json)
lists the files written before it with their sha256 (`files`), and `load_run` checks them, so a
file cut short or changed since is one line naming it, never a model loaded from it; a resume
writes the run's files again (`fincheck train --resume_from_checkpoint=auto`).
Eval, detect, merge and publish all start from `load_run(path)`.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fincheck.errors import FincheckError
from fincheck.io.checksums import folder_sha256, sha256_file
from fincheck.io.config import read_yaml_mapping
from fincheck.io.jsonl import read_json_object, read_json_record
from fincheck.io.out_lock import folder_kind
from fincheck.io.safe_files import read_regular_bytes

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
RECIPE_FILE = "recipe.yaml"
MANIFEST_FILE = "data_manifest.json"
RUN_METADATA = "fincheck_run.json"
CHECKPOINT_METADATA = "fincheck_complete.json"  # a complete checkpoint's copy of the metadata
# Written into each checkpoint-<step>/ and the final save before the libraries save into them,
# and never removed: a folder holding it is a training output, complete only with its record,
# so a copy made mid-save (whatever its listing caught) is never read as a bare adapter.
TRAINING_OUTPUT_MARK = "fincheck_training_output.json"
LISTED_FILES = "files"  # in both records: {relative path: sha256} of what was written before it
RERUN_FINAL_SAVE = (
    "rerun the training command with --resume_from_checkpoint=auto to write the run's files "
    "again from its last checkpoint"
)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
)
# The recipe's default max_length (tokens per training pair), declared here so that a run whose
# recipe.yaml omitted it still reads back the window it trained at.
DEFAULT_TRAINING_WINDOW = 2048
CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")  # a resumable checkpoint: checkpoint-<step>


def checkpoint_dirs(output_dir: str | Path) -> list[Path]:
    """`checkpoint-<step>` folders, highest step first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := CHECKPOINT_NAME.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def newest_trainer_state(run: str | Path) -> dict[str, Any] | None:
    """trainer_state.json of the run's highest checkpoint that has one (by step number, not by
    name: checkpoint-1000 is newer than checkpoint-999), else the run folder's own, else None."""
    found = [c / "trainer_state.json" for c in checkpoint_dirs(run)]
    path = next((f for f in found if f.is_file()), Path(run) / "trainer_state.json")
    return read_json_object(path) if path.is_file() else None


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def looks_like_hub_id(name: str) -> bool:
    """`org/name` with hub-legal characters (a local path that happens to match is checked first)."""
    return bool(_HUB_ID.match(name)) and not Path(name).exists()


@dataclass
class RunArtifacts:
    path: Path
    adapter_config: dict[str, Any]
    recipe: dict[str, Any] = field(default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)
    manifest_path: Path | None = None
    metadata: dict[str, Any] = field(default_factory=dict)  # fincheck_run.json
    root: Path | None = None  # the run folder (a checkpoint's parent), where relative bases live
    local_base: Path | None = None  # a base model saved inside the run (random-init tiny base)

    @property
    def base_name(self) -> str:
        """The base the adapter was trained on, as recorded by the run (or else by PEFT)."""
        return str(
            self.metadata.get("base_model")
            or self.adapter_config.get("base_model_name_or_path")
            or ""
        )

    @property
    def data_fingerprint(self) -> str | None:
        return self.manifest.get("fingerprint") or self.metadata.get("data_fingerprint")

    @property
    def hub_base_id(self) -> str | None:
        """The base's hub id when it has one: what training recorded (a fetched model knows its
        origin, a recipe may name it), else the base name when it is a hub id; None for a base
        that only exists in this run."""
        if self.local_base is not None:
            return None
        if self.metadata.get("base_model_id"):
            return str(self.metadata["base_model_id"])
        return self.base_name if looks_like_hub_id(self.base_name) else None

    @property
    def base_revision(self) -> str | None:
        return self.metadata.get("base_model_revision")

    @property
    def tokenizer_files(self) -> list[Path]:
        return [self.path / n for n in TOKENIZER_FILES if (self.path / n).is_file()]

    @property
    def prompt_hashes(self) -> dict[str, str]:
        return dict(self.manifest.get("prompt_hashes") or self.metadata.get("prompt_hashes") or {})

    @property
    def tasks(self) -> list[str]:
        """The tasks trained on, from the training mixture: what the run recorded (`tasks`),
        else, for runs written before it did, the tasks that had training pairs; never the
        prepared folder's task list, which can hold tasks the mixture left out."""
        if isinstance(self.metadata.get("tasks"), list):
            return [str(t) for t in self.metadata["tasks"]]
        trained = (self.metadata.get("data") or {}).get("train_examples") or {}
        if trained:
            return [t for t, n in trained.items() if n]
        return list(self.prompt_hashes)

    @property
    def max_length(self) -> int | None:
        """The training window: the recipe's max_length, else what the run metadata recorded.
        A recipe.yaml written before max_length was always recorded left it out when it equalled
        the recipe default, which was then DEFAULT_TRAINING_WINDOW."""
        for value in (self.recipe.get("max_length"), self.metadata.get("max_length")):
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        return DEFAULT_TRAINING_WINDOW if self.recipe else None


# What the commands read of a run's (or a checkpoint's) record, as training writes it
_TEXT = (str, type(None))
RUN_RECORD_SHAPE = {
    "base_model": _TEXT,
    "base_model_id": _TEXT,
    "base_fingerprint": _TEXT,
    "recipe_fingerprint": _TEXT,
    "recipe_files": {str: str},
    "data_fingerprint": _TEXT,
    "tasks": [str],
    "max_length": (int, type(None)),
    "prompt_hashes": {str: str},
    "chat_template_hash": _TEXT,
    "chat_template_kwargs": {str: (str, int, float, bool, type(None), list, dict)},
    "data": {"train_examples": {str: int}},
    "base_origin": _TEXT,
    "base_model_revision": _TEXT,
    "world_size": int,
    "resumes": [dict],
    "final_adapter": dict,
    LISTED_FILES: {str: str},
}
# A prepared folder's manifest.json (also copied into a run folder): what its readers take.
MANIFEST_SHAPE = {
    "files": {str: {"sha256": str, "pairs": int}},
    "fingerprint": str,
    "prompt_hashes": {str: str},
    "counts": {str: {str: {"pairs": int, "labels": {str: int}}}},  # task, split
}
# An adapter's config: its base, as the run names it when its record does not.
ADAPTER_CONFIG_SHAPE = {"base_model_name_or_path": _TEXT}


def read_run_record(path: Path) -> dict[str, Any]:
    """A run's or a checkpoint's record, of the shape its readers rely on (or one line)."""
    record = read_json_record(path, RUN_RECORD_SHAPE)
    if record is None:
        raise FincheckError(f"{path}: not found")
    return record


def load_run(path: str | Path) -> RunArtifacts:
    """Read a run folder (or a bare adapter folder); stop with a clear message if it is not one."""
    path = Path(path)
    if not path.is_dir():
        raise FincheckError(f"adapter folder not found: {path}")
    config_path = path / ADAPTER_CONFIG
    if not config_path.is_file():
        raise FincheckError(
            f"{path}: no {ADAPTER_CONFIG}; point --adapter/--checkpoint at a run folder "
            f"(checkpoints/<run>/) or one of its checkpoint-<step>/ folders"
        )
    if not (path / ADAPTER_WEIGHTS).is_file():
        pickled = (path / "adapter_model.bin").is_file()
        hint = " (found adapter_model.bin: pickle files are not loaded)" if pickled else ""
        raise FincheckError(f"{path}: no {ADAPTER_WEIGHTS}{hint}")
    run = RunArtifacts(
        path=path, adapter_config=read_json_record(config_path, ADAPTER_CONFIG_SHAPE)
    )
    if (path / RECIPE_FILE).is_file():
        run.recipe = read_yaml_mapping(path / RECIPE_FILE)
    if (path / MANIFEST_FILE).is_file():
        run.manifest_path = path / MANIFEST_FILE
        run.manifest = read_json_record(run.manifest_path, MANIFEST_SHAPE)
    run.root = Path(os.path.abspath(path))  # `.` stands for a folder with a name
    records = {  # what = (its record, the files it lists, what to do when one changed)
        "run": (RUN_METADATA, run_save_files, RERUN_FINAL_SAVE),
        "checkpoint": (CHECKPOINT_METADATA, checkpoint_files, "use another checkpoint"),
    }
    found = next((what for what, kind in records.items() if (path / kind[0]).is_file()), None)
    if found is not None:
        record, files, fix = records[found]
        run.metadata = read_run_record(path / record)
        check_listed_files(path, record, run.metadata, files(path), fix)
        if found == "checkpoint":  # checkpoint-<step>/ inside a run folder
            run.root = run.root.parent  # `.` inside a checkpoint: its run
    elif (
        (path / TRAINING_OUTPUT_MARK).exists()
        or folder_kind(path.resolve()) == "train"
        or folder_kind(path.resolve().parent) == "train"
    ):
        # a training output without its record: a final save or a checkpoint cut short (its
        # recipe and manifest may be an earlier run's), never read as a bare adapter
        inside = folder_kind(path.resolve().parent) == "train"
        what = "checkpoint" if inside or path.resolve().name.startswith("checkpoint-") else "run"
        record, _, fix = records[what]
        raise FincheckError(f"{path}: a training {what} that did not finish (no {record}); {fix}")
    base = run.root / run.base_name  # a base saved inside the run (random-init); an absolute
    inside = base.resolve().is_relative_to(run.root.resolve())  # base_name stays as it is
    if run.base_name and inside and (base / "config.json").is_file():
        run.local_base = base  # the one the record names, by its files (older: its config.json)
        recorded = run.metadata.get("base_fingerprint")
        if recorded and recorded not in (folder_sha256(base), config_fingerprint(str(base))):
            raise FincheckError(
                f"{base}: the base's files differ from those {run.path} was trained on (its "
                f"record's base_fingerprint {recorded[:16]}): edited since; train again, or "
                "restore the base"
            )
    return run


def config_fingerprint(base_path: str) -> str:
    """What checkpoints recorded before the base was fingerprinted by its files: the sha256 of
    the base's config.json (or of its name), which their resume and readers still accept."""
    config = Path(base_path) / "config.json"
    data = read_regular_bytes(config) if config.is_file() else base_path.encode()
    return hashlib.sha256(data).hexdigest()[:16]


def files_record(folder: Path, names: list[str]) -> dict[str, str]:
    """{name: sha256} of the named files present in `folder` (relative posix paths)."""
    return {name: sha256_file(folder / name) for name in names if (folder / name).is_file()}


def run_save_files(folder: Path) -> list[str]:
    """The files of a run's final save, as they are now: what loading reads (the adapter, the
    tokenizer files, a base saved inside the run) and the recipe and data manifest."""
    top = [ADAPTER_WEIGHTS, ADAPTER_CONFIG, *TOKENIZER_FILES, RECIPE_FILE, MANIFEST_FILE]
    names = [name for name in top if (folder / name).is_file()]
    if (folder / "base").is_dir():
        names += sorted(_files_under(folder, folder / "base"))
    return names


def checkpoint_files(folder: Path) -> list[str]:
    """Every file of a checkpoint folder but its record and its mark of a training output."""
    marks = (CHECKPOINT_METADATA, TRAINING_OUTPUT_MARK)
    return sorted(n for n in _files_under(folder, folder) if n not in marks)


def _files_under(root: Path, folder: Path) -> list[str]:
    return [p.relative_to(root).as_posix() for p in folder.rglob("*") if p.is_file()]


def changed_files(folder: Path, record: dict[str, Any], present: list[str]) -> list[str]:
    """Both ways: the files a record lists (`LISTED_FILES`) that are missing or differ from
    their sha256, and the files of `present` (what the folder holds now, of the kinds the
    record covers) that it does not list (added since); [] for a record from before fincheck
    listed them. (The list guards against damage, not against whoever rewrites the record: they
    could rewrite the list as well.)"""
    listed = record.get(LISTED_FILES)
    if not isinstance(listed, dict):
        return []
    differ = [
        name
        for name, sha in listed.items()
        if not (folder / name).is_file() or sha256_file(folder / name) != sha
    ]
    return differ + [name for name in present if name not in listed]


def check_listed_files(
    folder: Path, record_name: str, record: dict[str, Any], present: list[str], fix: str
) -> None:
    if changed := changed_files(folder, record, present):
        shown = ", ".join(changed[:4]) + (", ..." if len(changed) > 4 else "")
        raise FincheckError(
            f"{folder}: {shown} missing, changed or added since its {record_name} listed its "
            f"files (sha256): cut short or edited since it was written; {fix}"
        )


def adapter_sha256(adapter_dir: str | Path) -> str:
    """The adapter weights' sha256: what evaluation results record, so that a publish can check
    that the results it uploads were computed with the adapter it uploads."""
    return sha256_file(Path(adapter_dir) / ADAPTER_WEIGHTS)


def relative_base(base_path: str, output_dir: Path) -> str:
    """The base as recorded in fincheck_run.json: relative when it lives inside the run folder."""
    if not Path(base_path).is_dir():
        return base_path
    base, out = Path(base_path).resolve(), output_dir.resolve()
    return str(base.relative_to(out) if base.is_relative_to(out) else base)
