"""Writing run folders: complete checkpoints, resume checks, the run files at the end.
(`fincheck.runs` reads them.)

A run folder `checkpoints/<run_name>/` holds:
    base/                     the tiny random-init base (only for model_name_or_path: tiny-random)
    checkpoint-<step>/        resumable checkpoints; `fincheck_complete.json` is written last,
                              after every process has finished writing, so a checkpoint cut
                              short by a crash or a kill is never picked by `auto`
    adapter_model.safetensors, adapter_config.json, tokenizer files   the final adapter
    recipe.yaml               the resolved recipe (every key, after overrides)
    data_manifest.json        the prepared data's manifest (fingerprint, prompt hashes, counts)
    fincheck_run.json         run metadata: `base_model` (relative to the run folder when it is
                              inside it), fingerprints, data counts
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import yaml

from fincheck.errors import FincheckError
from fincheck.runs import MANIFEST_FILE, RECIPE_FILE, RUN_METADATA

COMPLETE_MARKER = "fincheck_complete.json"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def checkpoint_dirs(output_dir: str | Path) -> list[Path]:
    """`checkpoint-<step>` folders, highest step first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _CHECKPOINT.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def is_complete(checkpoint: Path) -> bool:
    return (checkpoint / COMPLETE_MARKER).is_file()


def last_complete_checkpoint(output_dir: str | Path) -> Path | None:
    return next((p for p in checkpoint_dirs(output_dir) if is_complete(p)), None)


def base_fingerprint(base_path: str) -> str:
    """sha256 of the base's config.json (local folder) or its name (hub id not downloaded yet)."""
    config = Path(base_path) / "config.json"
    data = config.read_bytes() if config.is_file() else base_path.encode()
    return hashlib.sha256(data).hexdigest()[:16]


def mark_complete(checkpoint: Path, info: dict[str, Any], recipe_yaml: str) -> None:
    (checkpoint / RECIPE_FILE).write_text(recipe_yaml, encoding="utf-8")
    tmp = checkpoint / (COMPLETE_MARKER + ".tmp")
    tmp.write_text(json.dumps(info, indent=2), encoding="utf-8")
    tmp.replace(checkpoint / COMPLETE_MARKER)


def resolve_resume(requested: str | None, output_dir: Path) -> Path | None:
    """`auto` -> the last complete checkpoint (or None: a fresh start); a path must be complete."""
    if requested is None or requested == "":
        return None
    if requested == "auto":
        return last_complete_checkpoint(output_dir)
    path = Path(requested)
    if not path.is_dir():
        raise FincheckError(f"resume_from_checkpoint: {path} does not exist")
    if not is_complete(path):
        raise FincheckError(
            f"resume_from_checkpoint: {path} is incomplete (no {COMPLETE_MARKER}: the save was "
            "interrupted); use an earlier checkpoint or 'auto'"
        )
    return path


def check_resume_compatible(checkpoint: Path, recipe_diffs: list[str], base_fp: str) -> None:
    """Stop before resuming a checkpoint made with another base model or recipe."""
    info = json.loads((checkpoint / COMPLETE_MARKER).read_text(encoding="utf-8"))
    problems = list(recipe_diffs)
    if info.get("base_fingerprint") not in (None, base_fp):
        problems.insert(
            0, f"base model differs (config fingerprint {info['base_fingerprint']} -> {base_fp})"
        )
    if problems:
        raise FincheckError(
            f"cannot resume from {checkpoint}: it was made with a different setup: "
            + "; ".join(problems)
            + ". Use a new output_dir (or run_name) to start a new run."
        )


def read_checkpoint_recipe(checkpoint: Path) -> dict[str, Any]:
    path = checkpoint / RECIPE_FILE
    return yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else {}


def write_run_files(
    output_dir: Path, recipe_yaml: str, manifest: dict[str, Any], metadata: dict[str, Any]
) -> None:
    (output_dir / RECIPE_FILE).write_text(recipe_yaml, encoding="utf-8")
    (output_dir / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    (output_dir / RUN_METADATA).write_text(json.dumps(metadata, indent=2), encoding="utf-8")
