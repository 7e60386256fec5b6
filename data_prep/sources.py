"""The raw data sources, each declared once: pinned origin, sha256, license note.

`resolve_source` finds a source's file either in a local data directory laid out like
`../shared/data` (`--data-dir` / `FINCHECK_DATA_DIR`) or in the download cache, fetching it from
its pinned URL on first use. Either way the sha256 is checked before anything reads the file.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from fincheck.errors import FincheckError

DATA_DIR_ENV = "FINCHECK_DATA_DIR"
CACHE_DIR_ENV = "FINCHECK_CACHE_DIR"

_QASEM = "https://raw.githubusercontent.com/ariecattan/qasem_consistency/6a48e9dfa09ec310f52223284ebbffe281e72c18/data"
_FHSUM = (
    "https://raw.githubusercontent.com/cece00/FHSumBench/4cffcdffac22e6174bbece5d5525548321cd4bd6"
)
_DEFACTO = "https://raw.githubusercontent.com/microsoft/DeFacto/a7e70a2fab6b6953f88a2e56d5b14feb4ff5beef/data"
_NO_LICENSE = "no license file in the repository at the pinned commit: research use; ask the authors before redistributing"


@dataclass(frozen=True)
class Source:
    name: str  # path relative to the data directory, e.g. "qasem/dev.jsonl"
    url: str
    sha256: str
    license: str


SOURCES: dict[str, Source] = {
    s.name: s
    for s in (
        Source(
            "qasem/dev.jsonl",
            f"{_QASEM}/dev.jsonl",
            "fde80e4c4c61bddd32c37a73b07957611d4020e80e8a7fc450d4f4505897556f",
            f"QASemConsistency (Cattan et al.); {_NO_LICENSE}",
        ),
        Source(
            "qasem/test.jsonl",
            f"{_QASEM}/test.jsonl",
            "c816457d29088a976abe66fee8c472ee2d9e9d78cd6cfa789ebd875956eb1e5b",
            f"QASemConsistency (Cattan et al.); {_NO_LICENSE}",
        ),
        Source(
            "fhsumbench/FHSumBench_data.json",
            f"{_FHSUM}/FHSumBench_data.json",
            "657caa975b34c261573faae06a5b76a239039e724e7db0d286f5ac22cd6b6031",
            f"FHSumBench (XSum-derived); {_NO_LICENSE}",
        ),
        Source(
            "defacto/train.jsonl",
            f"{_DEFACTO}/train.jsonl",
            "53a0e42f2d627170e00d3db32a367bfe8280f2a61c77aee6e2f8a2a354b72f78",
            f"DeFacto (Liu et al., XSum-derived); {_NO_LICENSE}",
        ),
        Source(
            "defacto/val.jsonl",
            f"{_DEFACTO}/val.jsonl",
            "f7f4ec9c2526d5e7bb542dcfb05d5df6444d9840cc3036ef6b90a8d5377b6466",
            f"DeFacto (Liu et al., XSum-derived); {_NO_LICENSE}",
        ),
        Source(
            "defacto/test.jsonl",
            f"{_DEFACTO}/test.jsonl",
            "5d3539be0cb1d71a9ec5e148a273e5744def10ece3184646bfaaeb033bc4e72c",
            f"DeFacto (Liu et al., XSum-derived); {_NO_LICENSE}",
        ),
    )
}


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def default_cache_dir() -> Path:
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "fincheck" / "data"


def default_data_dir() -> Path | None:
    """`FINCHECK_DATA_DIR` if set; else `../shared/data` beside a checkout when it exists."""
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV])
    return None


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
    allow_download: bool = True,
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

    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    path = cache / source.name
    if path.is_file():
        return _verify(source, path, f"delete it to download it again from {source.url}.")
    if not allow_download:
        raise FincheckError(f"{source.name} is not cached at {path} and downloads are disabled.")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with (
            urllib.request.urlopen(source.url, timeout=60) as response,
            tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as tmp,
        ):
            shutil.copyfileobj(response, tmp)
    except (urllib.error.URLError, OSError) as e:
        raise FincheckError(
            f"could not download {source.name} from {source.url} ({e}). Without network, pass "
            f"--data-dir (or set {DATA_DIR_ENV}) to a local copy laid out like ../shared/data."
        ) from None
    tmp_path = Path(tmp.name)
    try:
        _verify(source, tmp_path, "the download was corrupted or the origin changed; try again.")
    except FincheckError:
        tmp_path.unlink(missing_ok=True)
        raise
    tmp_path.replace(path)
    return path
