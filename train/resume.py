"""Resuming a run: which checkpoint `resume_from_checkpoint` names (`auto`: the last complete
one), whether it may be resumed under this recipe (the same keys, base, processes and prepared
data), and its state files loaded without running code (weights-only unpickling, an allow-list
of the globals DeepSpeed and numpy store). The checkpoints themselves: `checkpoints.py`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fincheck.errors import FincheckError
from fincheck.io.checksums import sha256_file
from fincheck.io.config import read_yaml_mapping
from fincheck.io.jsonl import read_json_object
from fincheck.io.runs import CHECKPOINT_METADATA as COMPLETE_MARKER  # written last: then complete
from fincheck.io.runs import (
    RECIPE_FILE,
    check_listed_files,
    checkpoint_dirs,
    checkpoint_files,
    read_run_record,
)
from fincheck.io.safe_files import read_regular_bytes
from fincheck.train.checkpoints import guard_output_dir, is_complete, last_complete_checkpoint
from fincheck.train.recipe import PROJECT_PATH_KEYS, SFTRecipe, recipe_defaults


def resolve_resume(requested: str | None, output_dir: Path) -> Path | None:
    """`auto` -> the last complete checkpoint (or None: a fresh start); a path must be complete."""
    if requested is None or requested == "":
        return None
    if requested == "auto":
        found = last_complete_checkpoint(output_dir)
        if found is None and any(is_complete(p) for p in checkpoint_dirs(output_dir)):
            raise FincheckError(
                f"resume_from_checkpoint=auto: every complete checkpoint in {output_dir} has "
                "files missing or changed since it was saved (named above): nothing to resume "
                "from. Restore them, or start over with --overwrite_output_dir"
            )
        return found
    path = Path(requested)
    if not path.is_dir():
        raise FincheckError(f"resume_from_checkpoint: {path} does not exist")
    if not is_complete(path):
        raise FincheckError(
            f"resume_from_checkpoint: {path} is incomplete (no {COMPLETE_MARKER}: the save was "
            "interrupted); use an earlier checkpoint or 'auto'"
        )
    marker = read_run_record(path / COMPLETE_MARKER)
    check_listed_files(
        path, COMPLETE_MARKER, marker, checkpoint_files(path), "use an earlier checkpoint or 'auto'"
    )
    return path


# What DeepSpeed's and the Trainer's own state files pickle besides tensors, dicts, lists and
# numbers (which torch's weights-only unpickler takes by itself): records and enums of
# DeepSpeed's, numpy arrays and scalars (RNG states) and numpy's dtype classes, by exact name.
# Nothing here runs code when loaded; anything else, a name reached through one of these
# (`numpy.dtypes._add_dtype_helper.__builtins__.get`) included, is refused.
DEEPSPEED_PICKLE_GLOBALS = (
    "deepspeed.utils.tensor_fragment.fragment_address",
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
)


NUMPY_PICKLE_GLOBALS = (
    "_core.multiarray._reconstruct",
    "_core.multiarray.scalar",
    "dtype",
    "ndarray",
)


# numpy's dtype classes, numbers, booleans and strings (not ObjectDType: an object array would
# unpickle whatever its elements name)
NUMPY_DTYPES = (
    "Bool", "Byte", "Bytes", "CLongDouble", "Complex128", "Complex64", "DateTime64", "Float16",
    "Float32", "Float64", "Int16", "Int32", "Int64", "Int8", "Int", "Long", "LongDouble",
    "LongLong", "Short", "Str", "TimeDelta64", "UByte", "UInt16", "UInt32", "UInt64", "UInt8",
    "UInt", "ULong", "ULongLong", "UShort",
)  # fmt: skip


def safe_pickle_globals() -> list[tuple[Any, str]]:
    """The allowed globals as (object, the name a pickle spells it with): what torch's
    weights-only unpickler is given on resume (`weights_only_loads`), and, by name, what
    `check_state_files` accepts. numpy 2 pickles say numpy._core, numpy 1's said numpy.core."""
    import importlib

    import numpy

    def resolve(dotted: str) -> Any:
        module, _, name = dotted.rpartition(".")
        return getattr(importlib.import_module(module), name)

    found = [(resolve(name), name) for name in DEEPSPEED_PICKLE_GLOBALS]
    for name in NUMPY_PICKLE_GLOBALS:
        obj = resolve(f"numpy.{name}")
        found += [(obj, f"numpy.{name}"), (obj, f"numpy.{name.removeprefix('_')}")]
    found += [(getattr(numpy.dtypes, f"{d}DType"), f"numpy.dtypes.{d}DType") for d in NUMPY_DTYPES]
    return list(dict.fromkeys(found))


@contextlib.contextmanager
def weights_only_loads() -> Iterator[None]:
    """Every `torch.load` in the block goes through torch's weights-only unpickler with the exact
    globals of `safe_pickle_globals`: DeepSpeed asks for full unpickling of its state files
    (`weights_only=False`), which would run whatever a crafted file names. transformers' own
    loads are weights-only already."""
    import torch

    original = torch.load
    allowed = safe_pickle_globals()

    def load(*args: Any, **kwargs: Any) -> Any:
        kwargs["weights_only"] = True
        with torch.serialization.safe_globals(allowed):
            return original(*args, **kwargs)

    torch.load = load
    try:
        yield
    finally:
        torch.load = original


STATE_SUFFIXES = (".pt", ".pth", ".bin", ".pkl")


NOT_LOADED_ON_RESUME = ("training_args.bin",)  # written for reference; resume never reads it


DEEPSPEED_TAG = re.compile(r"global_step\d+")


def check_checkpoint_layout(checkpoint: Path) -> None:
    """What DeepSpeed will load stays inside the checkpoint: no symlinks (a linked
    `global_stepN` would escape the pickle check), and its `latest` file names a plain
    `global_step<N>` folder of this checkpoint (an absolute or `../` tag would load files from
    anywhere, unchecked)."""
    for path in sorted(checkpoint.rglob("*")):
        if path.is_symlink():
            raise FincheckError(
                f"cannot resume from {checkpoint}: {path.relative_to(checkpoint)} is a symbolic "
                "link; a checkpoint written by this trainer has none. Nothing was loaded."
            )
    latest = checkpoint / "latest"
    if latest.exists() or latest.is_symlink():  # a FIFO or a folder there: one line
        tag = read_regular_bytes(latest).decode("utf-8", errors="replace").strip()
        if not DEEPSPEED_TAG.fullmatch(tag) or not (checkpoint / tag).is_dir():
            raise FincheckError(
                f"cannot resume from {checkpoint}: its 'latest' file names {tag[:80]!r}, not a "
                "global_step<N> folder inside the checkpoint. Nothing was loaded."
            )


def check_state_files(checkpoint: Path) -> None:
    """Refuse to resume from a checkpoint whose pickled state (DeepSpeed's model and optimizer
    states, the Trainer's scheduler and RNG states) would run code when loaded: DeepSpeed loads
    them with full unpickling, so a crafted file would execute. The globals each pickle needs
    are read without running anything and compared with what DeepSpeed and the Trainer write."""
    from torch.serialization import get_unsafe_globals_in_checkpoint

    check_checkpoint_layout(checkpoint)
    allowed = {name for _, name in safe_pickle_globals()}
    for path in sorted(checkpoint.rglob("*")):
        if not path.is_file() or path.suffix not in STATE_SUFFIXES:
            continue
        if path.name in NOT_LOADED_ON_RESUME:
            continue
        try:
            needed = get_unsafe_globals_in_checkpoint(str(path))
        except Exception as error:  # not a torch zip file: a legacy or foreign pickle
            raise FincheckError(
                f"cannot resume from {checkpoint}: {path.relative_to(checkpoint)} is not a torch "
                f"checkpoint file that can be checked ({type(error).__name__}); it was not "
                "written by this trainer. Resume from another checkpoint or start a new run."
            ) from error
        unsafe = sorted(g for g in needed if g not in allowed)
        if unsafe:
            raise FincheckError(
                f"cannot resume from {checkpoint}: {path.relative_to(checkpoint)} would run code "
                f"when loaded ({', '.join(unsafe[:3])}{', ...' if len(unsafe) > 3 else ''}); "
                "training state holds only tensors and a few DeepSpeed records, so the file was "
                "not written by this trainer or was tampered with. Nothing was loaded."
            )


def check_resume_compatible(
    checkpoint: Path,
    recipe_diffs: list[str],
    base_fp: str,
    world_size: int | None = None,
    data_fp: str | None = None,
    base_config_fp: str | None = None,
) -> None:
    """Stop before resuming a checkpoint made with another base model, recipe, prepared data
    (re-prepared in place: the pairs and their order differ) or number of processes (each
    process saved its own share of the optimizer state and its RNG state)."""
    info = read_run_record(checkpoint / COMPLETE_MARKER)
    saved_by = info.get("world_size")
    if world_size is not None and saved_by not in (None, world_size):
        raise FincheckError(
            f"cannot resume from {checkpoint}: it was saved by {saved_by} processes and this run "
            f"has {world_size}; each process saved its own share of the optimizer and RNG state. "
            f"Relaunch with {saved_by} processes (e.g. deepspeed --num_gpus {saved_by}), or start "
            "a new run in another output_dir"
        )
    problems = list(recipe_diffs)
    # (a checkpoint saved before the base was fingerprinted by its files recorded its config's)
    if info.get("base_fingerprint") not in (None, base_fp, base_config_fp):
        problems.insert(
            0,
            f"the base model's files differ (fingerprint {info['base_fingerprint'][:16]} -> "
            f"{base_fp[:16]})",
        )
    if data_fp is not None and info.get("data_fingerprint") not in (None, data_fp):
        problems.append(
            f"the prepared data differs (fingerprint {info['data_fingerprint'][:12]} -> "
            f"{data_fp[:12]}: re-prepared since)"
        )
    if problems:
        raise FincheckError(
            f"cannot resume from {checkpoint}: it was made with a different setup: "
            + "; ".join(problems)
            + ". Use a new output_dir (or run_name) to start a new run."
        )


def resume_point(
    recipe: Any, output_dir: Path, base_fp: str, data_fp: str | None, base_config_fp: str | None
) -> Path | None:
    """The resume policy: a fresh start never replaces a run (`guard_output_dir`); with
    `resume_from_checkpoint` (auto: the last complete checkpoint) the checkpoint must have been
    trained with the same recipe keys, base, processes and prepared data, and its state files
    must load without running code. Returns the checkpoint to resume from, or None."""
    guard_output_dir(
        output_dir,
        recipe.resume_from_checkpoint,
        recipe.overwrite_output_dir,
        main=recipe.process_index == 0,  # the recipe set up torch.distributed when built
    )
    resume_from = resolve_resume(recipe.resume_from_checkpoint, output_dir)
    if resume_from is not None:
        saved = resume_from / RECIPE_FILE
        old = read_yaml_mapping(saved) if saved.is_file() else {}
        check_resume_compatible(
            resume_from,
            recipe_differences(old, recipe) + file_differences(resume_from, recipe),
            base_fp,
            recipe.world_size,
            data_fp,
            base_config_fp,
        )
        check_state_files(resume_from)
    return resume_from


def resume_history(resume_from: Path | None) -> list[dict[str, Any]]:
    """fincheck_run.json's `resumes`: every time the run restarted from a checkpoint (its
    step and when), carried from checkpoint to checkpoint; [] for a run that never stopped."""
    if resume_from is None:
        return []
    earlier = read_run_record(resume_from / COMPLETE_MARKER).get("resumes")
    state = resume_from / "trainer_state.json"  # a checkpoint may be named anything
    step = read_json_object(state).get("global_step") if state.is_file() else None
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    restart = {"from_checkpoint": resume_from.name, "from_step": step, "at": now}
    return [*(earlier if isinstance(earlier, list) else []), restart]


# Keys that may change when a run is resumed: where it writes, how often it logs/saves, how
# long it runs (a longer run also stretches the lr schedule from the resume point on), the
# machine-derived ones. Anything else (base model, LoRA shape, data, optimiser, layout) must
# match.
RESUMABLE_CHANGES = frozenset((
    "max_steps", "num_train_epochs", "output_dir", "run_name", "resume_from_checkpoint",
    "report_to", "dataloader_num_workers", "per_device_eval_batch_size", "eval_max_examples",
    "dev_figures", "dev_figures_limit", "dataset_dir", "disable_tqdm", "overwrite_output_dir",
    "use_cpu", "ddp_backend", "local_rank", "release_host_memory",
))  # fmt: skip


RESUMABLE_PREFIXES = ("logging_", "save_", "eval_", "hub_", "push_to_hub", "dataloader_")


def _must_match(values: dict[str, Any]) -> dict[str, Any]:
    """The keys a resume must keep, project files named by where they are (a launch from the
    repository and one from elsewhere spell the same file differently)."""
    return {
        k: _same_file(v) if k in PROJECT_PATH_KEYS else v
        for k, v in values.items()
        if k not in RESUMABLE_CHANGES and not k.startswith(RESUMABLE_PREFIXES)
    }


PROJECT_ROOT = Path(__file__).resolve().parents[1]  # the repository (editable install)


def _same_file(value: Any) -> Any:
    if not isinstance(value, str) or not value:
        return value
    for candidate in (Path(value), PROJECT_ROOT / value):
        if candidate.exists():
            found = candidate.resolve()
            inside = found.is_relative_to(PROJECT_ROOT)
            return found.relative_to(PROJECT_ROOT).as_posix() if inside else str(found)
    return value


def recipe_files(recipe: SFTRecipe) -> dict[str, str]:
    """The files a recipe names (a DeepSpeed config, the data mixture, a chat template) by
    content: edited in place, a file keeps its path, which is all `recipe_differences` sees."""
    named = {key: getattr(recipe, key, None) for key in PROJECT_PATH_KEYS}
    return {k: sha256_file(v) for k, v in named.items() if isinstance(v, str) and Path(v).is_file()}


def file_differences(checkpoint: Path, recipe: SFTRecipe) -> list[str]:
    """`key: its file changed` for each file the checkpoint's record names by content that now
    holds another (records from before they were named compare paths only)."""
    recorded = read_run_record(checkpoint / COMPLETE_MARKER).get("recipe_files") or {}
    now = recipe_files(recipe)
    return [
        f"{key}: {recipe.declared.get(key) or key}'s content changed since (sha256 "
        f"{sha[:12]} -> {(now.get(key) or 'none')[:12]})"
        for key, sha in recorded.items()
        if now.get(key) != sha
    ]


def recipe_fingerprint(recipe: SFTRecipe) -> str:
    """sha256 over the keys a resume must keep (see RESUMABLE_CHANGES)."""
    kept = _must_match(recipe.declared)
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]


def recipe_differences(old: dict[str, Any], new: SFTRecipe) -> list[str]:
    """`key: old -> new` for the keys that must not change across a resume. `old` is a saved
    recipe.yaml (keys it does not list had their default)."""
    defaults = recipe_defaults()
    current = _must_match(new.declared)
    before = _must_match({key: old.get(key, defaults.get(key)) for key in current})
    return [
        f"{key}: {before[key]!r} -> {value!r}"
        for key, value in current.items()
        if before[key] != value
    ]
