"""Raw data sources: a pinned origin, its sha256 and license note (each task module declares
the sources it reads, e.g. `fincheck.tasks.qasem.TEST`).

`resolve_source` finds a source's file either in a local data directory laid out like
`../shared/data` (`--data-dir` / `FINCHECK_DATA_DIR`) or in the download cache, fetching it from
its pinned URL on first use. Either way the sha256 is checked before anything reads the file.
"""

from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from fincheck.errors import FincheckError
from fincheck.io.bounded_http import copy_download, open_download
from fincheck.io.cache import cache_root
from fincheck.io.checksums import sha256_file
from fincheck.io.safe_files import replaced_file

DATA_DIR_ENV = "FINCHECK_DATA_DIR"


@dataclass(frozen=True)
class Source:
    name: str  # path relative to the data directory, e.g. "qasem/dev.jsonl"
    url: str
    sha256: str
    license: str


def default_cache_dir() -> Path:
    """<fincheck cache>/data: $FINCHECK_CACHE_DIR/data, else ~/.cache/fincheck/data."""
    return cache_root() / "data"


def default_data_dir() -> Path | None:
    """`FINCHECK_DATA_DIR` if set, else None (the sources come from the download cache)."""
    return Path(os.environ[DATA_DIR_ENV]) if os.environ.get(DATA_DIR_ENV) else None


def _verify(source: Source, path: Path, fix: str) -> Path:
    actual = sha256_file(path)
    if actual != source.sha256:
        raise FincheckError(
            f"{path}: sha256 mismatch for {source.name} (expected {source.sha256}, got {actual}). "
            f"The file is not the pinned release: {fix}"
        )
    return path


def resolve_source(
    source: Source,
    data_dir: Path | None,
    cache_dir: Path | None = None,
) -> Path:
    """The verified local path of `source`: from `data_dir` if given, else the cache/download."""
    if data_dir is not None:
        data_dir = Path(data_dir)
        if not data_dir.is_dir():
            raise FincheckError(
                f"data directory not found: {data_dir}. Point --data-dir (or {DATA_DIR_ENV}) at a "
                "folder laid out like ../shared/data, or leave both unset to download the sources."
            )
        path = data_dir / source.name
        if not path.is_file():
            raise FincheckError(
                f"missing file: {path} ({source.name}). Put the pinned file there "
                f"(from {source.url}) or leave --data-dir unset to download it."
            )
        return _verify(source, path, f"replace it with the file from {source.url}.")

    path = (Path(cache_dir) if cache_dir else default_cache_dir()) / source.name
    if path.is_file():
        return _verify(source, path, f"delete it to download it again from {source.url}.")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:  # put in place only once its sha256 is the pinned one (else nothing is left)
        with (
            open_download(source.url) as response,
            replaced_file(path, binary=True) as f,
        ):
            digest = hashlib.sha256()
            copy_download(response, f, digest)
            if digest.hexdigest() != source.sha256:
                raise FincheckError(
                    f"{source.url}: sha256 mismatch for {source.name} (expected {source.sha256}, "
                    f"got {digest.hexdigest()}): the download was corrupted or the origin "
                    "changed; try again."
                )
    except (urllib.error.URLError, OSError) as e:
        raise FincheckError(
            f"could not download {source.name} from {source.url} ({e}). Without network, pass "
            f"--data-dir (or set {DATA_DIR_ENV}) to a local copy laid out like ../shared/data."
        ) from None
    return path
