"""sha256 of a file, read in blocks: the one digest the project pins downloads with and records
artefacts by (benchmark files, model wheels, adapter weights)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from fincheck.io.safe_files import open_regular_file


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(open_regular_file(path), "rb") as f:  # a FIFO is one line, never a wait
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# What decides a model folder's function: its configs and its weights (not its README).
# (*.py: the code a model with remote code runs, `--trust-remote-code`; *.tiktoken: a vocabulary)
MODEL_FILES = (
    "*.json",
    "*.safetensors",
    "*.bin",
    "*.model",
    "*.jinja",
    "*.txt",
    "*.py",
    "*.tiktoken",
)
# `fincheck models fetch`'s record of one machine's copy (file sizes and mtimes): not the model.
# Counted, it made the same pinned wheel another model on every machine that fetched it.
FETCH_RECORD = "fincheck_model.json"


def folder_sha256(folder: str | Path, patterns: tuple[str, ...] = MODEL_FILES) -> str | None:
    """The content of a model or adapter folder as one digest: each file matching `patterns`
    (at the top of the folder) by name and sha256. An evaluation resumed after the base's
    weights or an adapter's lora_alpha changed in place sees another digest, where its path
    and name stay the same. None for what is not a local folder (a hub id)."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    files = sorted(
        {p for pattern in patterns for p in folder.glob(pattern) if p.is_file()}
        - {folder / FETCH_RECORD}
    )
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.name}\0{sha256_file(path)}\n".encode())
    return digest.hexdigest()
