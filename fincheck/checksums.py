"""sha256 of a file, read in blocks: the one digest the project pins downloads with and records
artefacts by (benchmark files, model wheels, adapter weights)."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
