"""Writing run folders: complete checkpoints, resume checks, the run files at the end.
(`fincheck.io.runs` reads them; its docstring lists what a run folder holds.)

Resumable checkpoints are `checkpoint-<step>/` folders; `fincheck_complete.json` is written
last, after every process has finished writing, so a checkpoint cut short by a crash or a kill
is never picked by `auto`.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import re
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fincheck.errors import FincheckError, free_on_disk
from fincheck.io.config import read_yaml_mapping
from fincheck.io.jsonl import read_json_object
from fincheck.io.out_lock import LOCK_FILE
from fincheck.io.runs import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    LISTED_FILES,
    MANIFEST_FILE,
    RECIPE_FILE,
    RUN_METADATA,
    TOKENIZER_FILES,
    changed_files,
    check_listed_files,
    checkpoint_dirs,
    checkpoint_files,
    files_record,
    run_save_files,
)
from fincheck.io.runs import CHECKPOINT_METADATA as COMPLETE_MARKER  # written last: then complete
from fincheck.io.safe_files import copy_file, write_text
from fincheck.train.recipe import PROJECT_PATH_KEYS, SFTRecipe, recipe_defaults, recipe_to_yaml


def is_complete(checkpoint: Path) -> bool:
    return (checkpoint / COMPLETE_MARKER).is_file()


def last_complete_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest checkpoint whose record is written and whose files match it; a damaged newer
    one is passed over, said once."""
    for path in checkpoint_dirs(output_dir):
        if not is_complete(path):
            continue
        record = read_json_object(path / COMPLETE_MARKER)
        if changed := changed_files(path, record, checkpoint_files(path)):
            print(
                f"{path}: {', '.join(changed[:4])} missing or changed since the checkpoint was "
                "saved: resuming from an earlier one",
                file=sys.stderr,
            )
            continue
        return path
    return None


def rotate_checkpoints(output_dir: Path, limit: int | None, keep: str | None = None) -> list[Path]:
    """Keep the newest `limit` complete checkpoints, and `keep` (the best one by
    metric_for_best_model); remove older complete ones and the incomplete leftovers older than
    the newest complete one (an interrupted save). Called only after a new checkpoint is
    marked complete, so a kill at any moment leaves one to resume."""
    if not limit or limit <= 0:
        return []
    all_checkpoints = checkpoint_dirs(output_dir)  # highest step first
    complete = [p for p in all_checkpoints if is_complete(p)]
    if not complete:
        return []
    newest = int(complete[0].name.split("-")[1])
    kept = Path(keep).resolve() if keep else None
    doomed = [p for p in complete[limit:] if p.resolve() != kept] + [
        p for p in all_checkpoints if not is_complete(p) and int(p.name.split("-")[1]) < newest
    ]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def base_fingerprint(base_path: str) -> str:
    """sha256 of the base's config.json (local folder) or its name (hub id not downloaded yet)."""
    config = Path(base_path) / "config.json"
    data = config.read_bytes() if config.is_file() else base_path.encode()
    return hashlib.sha256(data).hexdigest()[:16]


def mark_complete(checkpoint: Path, info: dict[str, Any], recipe_yaml: str) -> None:
    """The checkpoint's record, written last, listing every file saved before it (sha256)."""
    write_text(checkpoint / RECIPE_FILE, recipe_yaml)
    record = {**info, LISTED_FILES: files_record(checkpoint, checkpoint_files(checkpoint))}
    write_text(checkpoint / COMPLETE_MARKER, json.dumps(record, indent=2))


def disk_of(path: Path) -> str:
    """The device (and mount point) holding `path`, an existing resolved path, for messages:
    "/dev/vdb (/data)"."""
    import psutil

    try:
        partitions = psutil.disk_partitions(all=True)
    except OSError:
        return "its disk"
    mounts = [p for p in partitions if str(path).startswith(p.mountpoint)]
    best = max(mounts, key=lambda p: len(p.mountpoint), default=None)
    return f"{best.device} ({best.mountpoint})" if best else "its disk"


def is_out_of_space(error: BaseException) -> bool:
    """ENOSPC/EDQUOT, or what torch's C++ writer says when the disk fills up mid-save."""
    text = str(error)
    return getattr(error, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or any(
        s in text for s in ("No space left", "iostream error", "file write failed")
    )


def out_of_space_message(output_dir: Path, step: int) -> str:
    last = last_complete_checkpoint(output_dir)
    where, free = free_on_disk(output_dir.resolve()) or (output_dir.resolve(), float("nan"))
    keep = f"{last.name} is still complete" if last else "no complete checkpoint is left"
    return (
        f"no space left on {disk_of(where)} ({free:.1f} GiB free) while saving at step "
        f"{step}: {keep}. Free some space (or point --output_dir at a larger disk) and rerun "
        "with --resume_from_checkpoint=auto"
    )


ADAPTER_FILES = (ADAPTER_WEIGHTS, ADAPTER_CONFIG)
RUN_OUTPUTS = (*ADAPTER_FILES, RUN_METADATA)
# What a training run writes (`claim_out_dir`: an older folder holding only these is a run's;
# one with fincheck_run.json is a run's whatever else it holds).
RUN_FOLDER_NAMES = (*RUN_OUTPUTS, RECIPE_FILE, MANIFEST_FILE, "checkpoint-*", "base",
                    "base.tmp-*", "runs", "wandb", LOCK_FILE)  # fmt: skip


def guard_output_dir(output_dir: Path, resume: str | None, overwrite: bool, main: bool) -> None:
    """A fresh start must not silently replace a run: with checkpoints or an adapter in
    `output_dir` and no resume, stop and say what to do; with `overwrite`, delete them first
    (the main process only) and start over."""
    if resume:
        return
    found = checkpoint_dirs(output_dir)
    found += [output_dir / name for name in RUN_OUTPUTS if (output_dir / name).is_file()]
    if not found:
        return
    if not overwrite:
        names = ", ".join(p.name for p in found[:3]) + (", ..." if len(found) > 3 else "")
        raise FincheckError(
            f"{output_dir} already holds a run ({names}): resume it with "
            "--resume_from_checkpoint=auto, start over with --overwrite_output_dir (deletes its "
            "checkpoints and adapter), or pick another --output_dir"
        )
    if main:
        for path in found:
            shutil.rmtree(path) if path.is_dir() else path.unlink()


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
    marker = read_json_object(path / COMPLETE_MARKER)
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
    if latest.exists():
        tag = latest.read_text(encoding="utf-8", errors="replace").strip()
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


def finished_at(checkpoint: Path, max_steps: int) -> int | None:
    """The checkpoint's step when its run has nothing left to train (it reached `max_steps`, or
    without one the step count the run derived from its epochs), else None."""
    state = read_json_object(checkpoint / "trainer_state.json")
    target = max_steps if max_steps > 0 else state.get("max_steps")
    step = int(state.get("global_step", 0))
    return step if target and step >= target else None


def copy_adapter(checkpoint: Path, output_dir: Path) -> None:
    """The checkpoint's adapter and tokenizer files as the run's final ones (each written
    beside, then renamed in)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    saved_tokenizer = [n for n in TOKENIZER_FILES if (checkpoint / n).is_file()]
    for name in (*ADAPTER_FILES, *saved_tokenizer):
        copy_file(checkpoint / name, output_dir / name)


def best_checkpoint(checkpoint: Path) -> Path | None:
    """The best checkpoint by metric_for_best_model that `checkpoint`'s trainer_state.json
    records, looked up beside `checkpoint` (the run folder may have moved since)."""
    state_file = checkpoint / "trainer_state.json"
    if not state_file.is_file():
        return None
    best = read_json_object(state_file).get("best_model_checkpoint")
    if not best:
        return None
    found = checkpoint.parent / Path(best).name
    if not (found / ADAPTER_WEIGHTS).is_file():
        raise FincheckError(
            f"{state_file} names {Path(best).name} the best checkpoint, but {found} holds no "
            "adapter (removed by hand?): copy the adapter you want into the run folder"
        )
    return found


def finish_from_checkpoint(checkpoint: Path, output_dir: Path) -> bool:
    """Put the checkpoint's adapter in the run folder when the final save did not happen (a
    kill after the last checkpoint); False when the final adapter is already there."""
    if (output_dir / ADAPTER_WEIGHTS).is_file():
        return False
    copy_adapter(checkpoint, output_dir)
    return True


def check_resume_compatible(
    checkpoint: Path,
    recipe_diffs: list[str],
    base_fp: str,
    world_size: int | None = None,
    data_fp: str | None = None,
) -> None:
    """Stop before resuming a checkpoint made with another base model, recipe, prepared data
    (re-prepared in place: the pairs and their order differ) or number of processes (each
    process saved its own share of the optimizer state and its RNG state)."""
    info = read_json_object(checkpoint / COMPLETE_MARKER)
    saved_by = info.get("world_size")
    if world_size is not None and saved_by not in (None, world_size):
        raise FincheckError(
            f"cannot resume from {checkpoint}: it was saved by {saved_by} processes and this run "
            f"has {world_size}; each process saved its own share of the optimizer and RNG state. "
            f"Relaunch with {saved_by} processes (e.g. deepspeed --num_gpus {saved_by}), or start "
            "a new run in another output_dir"
        )
    problems = list(recipe_diffs)
    if info.get("base_fingerprint") not in (None, base_fp):
        problems.insert(
            0, f"base model differs (config fingerprint {info['base_fingerprint']} -> {base_fp})"
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


def write_run_files(
    output_dir: Path, recipe_yaml: str, manifest: dict[str, Any], metadata: dict[str, Any]
) -> None:
    """The run's recipe, data manifest and record, the record last: it lists the final save's
    files with their sha256, so its presence with matching files says the save completed."""
    write_text(output_dir / RECIPE_FILE, recipe_yaml)
    write_text(output_dir / MANIFEST_FILE, json.dumps(manifest, indent=2))
    listed = files_record(output_dir, run_save_files(output_dir))
    write_text(output_dir / RUN_METADATA, json.dumps({**metadata, LISTED_FILES: listed}, indent=2))


@contextlib.contextmanager
def full_disk_as_one_line(output_dir: Path, trainer: Any) -> Iterator[None]:
    """A full disk while training or saving, in whatever form the writer reports it (an
    OSError, torch's "iostream error" RuntimeError, the tokenizers library's plain Exception):
    one line naming the disk and the last complete checkpoint."""
    try:
        yield
    except FincheckError:
        raise
    except Exception as e:
        if not is_out_of_space(e):
            raise
        raise FincheckError(out_of_space_message(output_dir, trainer.state.global_step)) from e


def resume_point(recipe: Any, output_dir: Path, base_fp: str, data_fp: str | None) -> Path | None:
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
            resume_from, recipe_differences(old, recipe), base_fp, recipe.world_size, data_fp
        )
        check_state_files(resume_from)
    return resume_from


def resume_history(resume_from: Path | None) -> list[dict[str, Any]]:
    """fincheck_run.json's `resumes`: every time the run restarted from a checkpoint (its
    step and when), carried from checkpoint to checkpoint; [] for a run that never stopped."""
    if resume_from is None:
        return []
    earlier = read_json_object(resume_from / COMPLETE_MARKER).get("resumes")
    state = resume_from / "trainer_state.json"  # a checkpoint may be named anything
    step = read_json_object(state).get("global_step") if state.is_file() else None
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    restart = {"from_checkpoint": resume_from.name, "from_step": step, "at": now}
    return [*(earlier if isinstance(earlier, list) else []), restart]


def final_adapter_record(best: str | Path, metric: str | None, value: Any) -> dict[str, Any]:
    """What fincheck_run.json says of a final adapter taken from the best checkpoint."""
    return {"checkpoint": Path(best).name, "metric": metric, "value": value}


def finish_completed_run(
    checkpoint: Path, done: int, output_dir: Path, recipe: Any, manifest: dict, metadata: dict
) -> None:
    """A resume of a run that reached its last step trains nothing: the run folder gets the
    adapter the full run would have written (the best checkpoint's with
    load_best_model_at_end) when the final save did not happen, and says so. `done`: the
    checkpoint's step (`finished_at`)."""
    best = recipe.final_adapter_from_best and best_checkpoint(checkpoint)
    if best:
        value = read_json_object(checkpoint / "trainer_state.json").get("best_metric")
        metadata["final_adapter"] = final_adapter_record(best, recipe.metric_for_best_model, value)
    # the final save is complete when its last file, the run record, was written and the files
    # it lists match: a kill during it (the adapter half-written, the run files missing) or a
    # file damaged since is written again from the checkpoint, the run record last
    record = output_dir / RUN_METADATA
    saved = (
        record.is_file()
        and (output_dir / ADAPTER_WEIGHTS).is_file()
        and not changed_files(output_dir, read_json_object(record), run_save_files(output_dir))
    )
    copied = not saved
    if copied:
        copy_adapter(best or checkpoint, output_dir)
        write_run_files(output_dir, recipe_to_yaml(recipe), manifest, metadata)
    print(
        f"the run is already complete: {checkpoint.name} reached step {done} of "
        f"{recipe.max_steps if recipe.max_steps > 0 else done}; nothing to train"
        + (f" (its adapter copied to {output_dir})" if copied else ""),
        file=sys.stderr,
    )


def save_final_adapter(
    trainer: Any, recipe: Any, output_dir: Path, best: str | None, manifest: dict, metadata: dict
) -> None:
    """The run folder's adapter (the last one, or with load_best_model_at_end the best
    checkpoint's), tokenizer and run files."""
    if best is None:
        trainer.save_model(str(output_dir))  # every process: ZeRO-3 gathers the adapter here
    if trainer.args.process_index != 0:
        return
    if best is not None:
        copy_adapter(Path(best), output_dir)
        trainer.processing_class.save_pretrained(str(output_dir))  # as save_model does
        metric, value = recipe.metric_for_best_model, trainer.state.best_metric
        metadata["final_adapter"] = final_adapter_record(best, metric, value)
    write_run_files(output_dir, recipe_to_yaml(recipe), manifest, metadata)
    where = f" (from {Path(best).name}, the best by {recipe.metric_for_best_model})" if best else ""
    print(f"adapter saved to {output_dir}{where}", file=sys.stderr)


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
