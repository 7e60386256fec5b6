"""Run folders, complete checkpoints, resume checks, and finding an adapter's base.

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

COMPLETE_MARKER = "fincheck_complete.json"
RUN_METADATA = "fincheck_run.json"
RECIPE_FILE = "recipe.yaml"
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
    (output_dir / "data_manifest.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    (output_dir / RUN_METADATA).write_text(json.dumps(metadata, indent=2), encoding="utf-8")


def relative_base(base_path: str, output_dir: Path) -> str:
    """The base as recorded in fincheck_run.json: relative when it lives inside the run folder."""
    base = Path(base_path)
    if base.is_dir():
        try:
            return str(base.resolve().relative_to(output_dir.resolve()))
        except ValueError:
            return str(base.resolve())
    return base_path


def resolve_adapter_base(adapter_dir: str | Path) -> str:
    """The base model of a saved adapter: fincheck_run.json's `base_model` (relative paths are
    inside the adapter's run folder), else adapter_config.json's `base_model_name_or_path`."""
    adapter_dir = Path(adapter_dir)
    meta_path = adapter_dir / RUN_METADATA
    if meta_path.is_file():
        base = json.loads(meta_path.read_text(encoding="utf-8"))["base_model"]
        local = adapter_dir / base
        return str(local) if local.is_dir() else base
    config = adapter_dir / "adapter_config.json"
    if not config.is_file():
        raise FincheckError(f"{adapter_dir}: no adapter_config.json: not a saved adapter")
    return json.loads(config.read_text(encoding="utf-8"))["base_model_name_or_path"]


def load_adapter_model(
    adapter_dir: str | Path,
    base: str | None = None,
    dtype: Any = None,
    device: str | None = None,
    trust_remote_code: bool = False,
):
    """(PeftModel, tokenizer) for inference, the one loader eval, detect and merge share.

    Safetensors weights only and no remote code unless asked; the base is `base` or the one the
    run recorded. The tokenizer is the run's own when it saved one, and the base's embeddings are
    resized to it first, as training did (training may add a pad token; the adapter carries the
    new rows).
    """
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    adapter_dir = Path(adapter_dir)
    base = base or resolve_adapter_base(adapter_dir)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            base,
            dtype=dtype or torch.float32,
            use_safetensors=True,
            trust_remote_code=trust_remote_code,
        )
    except OSError as e:
        raise FincheckError(
            f"cannot load base model {base!r} (safetensors weights required): {e}"
        ) from None
    has_tokenizer = (adapter_dir / "tokenizer_config.json").is_file()
    tokenizer = AutoTokenizer.from_pretrained(
        str(adapter_dir) if has_tokenizer else base, trust_remote_code=trust_remote_code
    )
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer))
    if device:
        model = model.to(device)
    model = PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=False)
    model.eval()
    return model, tokenizer
