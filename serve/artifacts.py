"""What a training run leaves behind, read in one place.

A finished run folder (`checkpoints/<run>/`) holds the adapter (`adapter_model.safetensors`,
`adapter_config.json`), the tokenizer, the resolved recipe and the data manifest; a run on a
random-init base (the tiny CPU recipe) also holds that base, since it exists nowhere else.
Detect, merge and publish all start from `load_run(path)`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fincheck.errors import FincheckError

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
# File names a run may use for its resolved recipe and its data manifest, first match wins.
RECIPE_NAMES = ("recipe.yaml", "resolved_recipe.yaml", "config.yaml", "train_config.yaml")
MANIFEST_NAMES = ("data_manifest.json", "manifest.json")
# Sub-folders where a run keeps a base model it created (random init) rather than downloaded.
LOCAL_BASE_NAMES = ("base_model", "base", "tiny_base")
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
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def looks_like_hub_id(name: str) -> bool:
    """`org/name` with hub-legal characters (a local path that happens to match is checked first)."""
    return bool(_HUB_ID.match(name)) and not Path(name).exists()


@dataclass
class RunArtifacts:
    path: Path
    adapter_config: dict[str, Any]
    recipe: dict[str, Any] = field(default_factory=dict)
    recipe_path: Path | None = None
    manifest: dict[str, Any] = field(default_factory=dict)
    manifest_path: Path | None = None
    local_base: Path | None = None  # a base model saved inside the run (random-init tiny base)

    @property
    def base_name(self) -> str:
        """The base the adapter was trained on, as recorded by PEFT."""
        return str(self.adapter_config.get("base_model_name_or_path") or "")

    @property
    def hub_base_id(self) -> str | None:
        """The base's hub id when it has one (None for a base that only exists in this run)."""
        if self.local_base is not None:
            return None
        return self.base_name if looks_like_hub_id(self.base_name) else None

    @property
    def tokenizer_files(self) -> list[Path]:
        return [self.path / n for n in TOKENIZER_FILES if (self.path / n).is_file()]

    @property
    def prompt_hashes(self) -> dict[str, str]:
        return dict(self.manifest.get("prompt_hashes") or self.recipe.get("prompt_hashes") or {})

    @property
    def tasks(self) -> list[str]:
        hashes = self.prompt_hashes
        if hashes:
            return list(hashes)
        tasks = self.recipe.get("tasks")
        return list(tasks) if isinstance(tasks, (list, tuple)) else []

    def resolve_base(self, override: str | None = None) -> str:
        """The base to load: the user's choice, else the run's own base (saved copy or hub id)."""
        if override:
            return override
        if self.local_base is not None:
            return str(self.local_base)
        if self.base_name:
            return self.base_name
        raise FincheckError(
            f"{self.path / ADAPTER_CONFIG}: no base_model_name_or_path; pass --model BASE"
        )


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
        pickled = [p.name for p in path.glob("adapter_model.bin")]
        hint = " (found adapter_model.bin: pickle files are not loaded)" if pickled else ""
        raise FincheckError(f"{path}: no {ADAPTER_WEIGHTS}{hint}")
    adapter_config = _read_json(config_path)
    run = RunArtifacts(path=path, adapter_config=adapter_config)
    for name in RECIPE_NAMES:
        if (path / name).is_file():
            run.recipe_path = path / name
            run.recipe = _read_yaml(path / name)
            break
    for name in MANIFEST_NAMES:
        if (path / name).is_file():
            run.manifest_path = path / name
            run.manifest = _read_json(path / name)
            break
    run.local_base = _find_local_base(path, run.base_name)
    return run


def _find_local_base(path: Path, base_name: str) -> Path | None:
    candidates = []
    if base_name and not Path(base_name).is_absolute():
        candidates.append(path / base_name)
    if base_name:
        candidates.append(Path(base_name))
    candidates += [path / n for n in LOCAL_BASE_NAMES]
    for candidate in candidates:
        if (candidate / "config.json").is_file() and candidate.resolve().is_relative_to(
            path.resolve()
        ):
            return candidate
    return None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise FincheckError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise FincheckError(f"{path}: expected a JSON object")
    return data


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise FincheckError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise FincheckError(f"{path}: expected a mapping")
    return data
