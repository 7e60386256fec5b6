"""Writing run folders: complete checkpoints, their rotation, the run files at the end.
(`fincheck.io.runs` reads them; its docstring lists what a run folder holds. Resuming one:
`resume.py`.)

Resumable checkpoints are `checkpoint-<step>/` folders; `fincheck_complete.json` is written
last, after every process has finished writing, so a checkpoint cut short by a crash or a kill
is never picked by `auto`.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fincheck.errors import FincheckError, free_on_disk
from fincheck.io.checksums import folder_sha256
from fincheck.io.jsonl import read_json_record, strict_json
from fincheck.io.out_lock import LOCK_FILE
from fincheck.io.runs import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    LISTED_FILES,
    MANIFEST_FILE,
    RECIPE_FILE,
    RUN_METADATA,
    TOKENIZER_FILES,
    TRAINING_OUTPUT_MARK,
    changed_files,
    checkpoint_dirs,
    checkpoint_files,
    files_record,
    read_run_record,
    run_save_files,
)
from fincheck.io.runs import CHECKPOINT_METADATA as COMPLETE_MARKER  # written last: then complete
from fincheck.io.safe_files import (
    copy_file,
    fresh_folder,
    move_files_into,
    refuse_foreign_entries,
    write_text,
)
from fincheck.train.recipe import recipe_to_yaml


def is_complete(checkpoint: Path) -> bool:
    return (checkpoint / COMPLETE_MARKER).is_file()


def last_complete_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest checkpoint whose record is written and whose files match it; a damaged newer
    one is passed over, said once."""
    for path in checkpoint_dirs(output_dir):
        if not is_complete(path):
            continue
        try:
            record = read_run_record(path / COMPLETE_MARKER)
        except FincheckError as damaged:  # a record of another shape: passed over too
            print(f"{damaged}: resuming from an earlier checkpoint", file=sys.stderr)
            continue
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
    """The base as a checkpoint records it, and its resume compares: a local folder's model
    files by content (`folder_sha256`: other weights under the same config.json, a fine-tune
    put in place, are another base), a hub id by its name."""
    return folder_sha256(base_path) or hashlib.sha256(base_path.encode()).hexdigest()[:16]


def write_training_output_mark(folder: Path) -> None:
    """The mark a training output carries from before the libraries save into it (and keeps):
    without its record, it is an unfinished save wherever it is copied."""
    note = "a fincheck training output: complete only with its record (fincheck_complete.json "
    note += "in a checkpoint, fincheck_run.json in a run folder)"
    write_text(folder / TRAINING_OUTPUT_MARK, json.dumps({"state": note}))


def in_turn(saves: bool) -> Iterator[None]:
    """Once on each process that saves (`should_save`: world rank 0, or each node's first
    process with `save_on_each_node`, on a disk of its own: `launch`'s check), one at a time,
    every process waiting before and after each turn. Every process must iterate it."""
    import torch.distributed as dist

    distributed = dist.is_available() and dist.is_initialized()
    if distributed:
        dist.barrier()
    for turn in range(dist.get_world_size() if distributed else 1):
        if saves and (not distributed or dist.get_rank() == turn):
            yield
        if distributed:
            dist.barrier()


def mark_complete(checkpoint: Path, info: dict[str, Any], recipe_yaml: str) -> None:
    """The checkpoint's record, written last, listing every file saved before it (sha256);
    refused for a checkpoint holding anything but folders and plain files of one name."""
    refuse_foreign_entries(checkpoint, "the checkpoint")
    write_text(checkpoint / RECIPE_FILE, recipe_yaml)
    record = {**info, LISTED_FILES: files_record(checkpoint, checkpoint_files(checkpoint))}
    write_text(checkpoint / COMPLETE_MARKER, json.dumps(strict_json(record), indent=2))  # no NaN


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
# The final save's own folder in the run folder: the libraries write there, and its files are
# renamed into the run folder (`save_final_adapter`); a kill mid-save leaves it, the next one
# starts it afresh.
FINAL_SAVE = ".final-save"


# What a training run writes (`claim_out_dir`: an older folder holding only these is a run's;
# one with fincheck_run.json is a run's whatever else it holds).
RUN_FOLDER_NAMES = (*RUN_OUTPUTS, RECIPE_FILE, MANIFEST_FILE, "checkpoint-*", "base",
                    "base.tmp-*", "runs", "wandb", LOCK_FILE, FINAL_SAVE)  # fmt: skip


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


# What fincheck reads of the trainer's state file (transformers writes it into a checkpoint).
TRAINER_STATE_SHAPE = {
    "global_step": int,
    "max_steps": int,
    "best_model_checkpoint": (str, type(None)),
    "best_metric": (int, float, type(None)),
}


def trainer_state(checkpoint: Path) -> dict[str, Any]:
    """A checkpoint's trainer_state.json, of the shape fincheck reads (or one line)."""
    state = read_json_record(checkpoint / "trainer_state.json", TRAINER_STATE_SHAPE)
    if state is None:
        raise FincheckError(f"{checkpoint / 'trainer_state.json'}: not found")
    return state


def finished_at(checkpoint: Path, max_steps: int) -> int | None:
    """The checkpoint's step when its run has nothing left to train (it reached `max_steps`, or
    without one the step count the run derived from its epochs), else None."""
    state = trainer_state(checkpoint)
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
    best = trainer_state(checkpoint).get("best_model_checkpoint")
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


def write_run_files(
    output_dir: Path, recipe_yaml: str, manifest: dict[str, Any], metadata: dict[str, Any]
) -> None:
    """The run's recipe, data manifest and record, the record last: it lists the final save's
    files with their sha256, so its presence with matching files says the save completed."""
    write_text(output_dir / RECIPE_FILE, recipe_yaml)
    write_text(output_dir / MANIFEST_FILE, json.dumps(manifest, indent=2))
    listed = files_record(output_dir, run_save_files(output_dir))
    record = strict_json({**metadata, LISTED_FILES: listed})  # JSON, no NaN, for every reader
    write_text(output_dir / RUN_METADATA, json.dumps(record, indent=2))


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
        value = trainer_state(checkpoint).get("best_metric")
        metadata["final_adapter"] = final_adapter_record(best, recipe.metric_for_best_model, value)
    # the final save is complete when its last file, the run record, was written and the files
    # it lists match: a kill during it (the adapter half-written, the run files missing) or a
    # file damaged since is written again from the checkpoint, the run record last
    record = output_dir / RUN_METADATA
    saved = (
        record.is_file()
        and (output_dir / ADAPTER_WEIGHTS).is_file()
        and not changed_files(output_dir, read_run_record(record), run_save_files(output_dir))
    )
    copied = not saved
    if copied:
        leftover = output_dir / FINAL_SAVE  # a final save cut short: written again from here
        if leftover.exists() or leftover.is_symlink():
            fresh_folder(leftover).rmdir()
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
    checkpoint's), tokenizer and run files. The libraries save into a fresh folder of the run's
    own (`FINAL_SAVE`), whose files are then renamed into the run folder: a link planted in the
    run folder is replaced, never written through. Every process that saves does so in its turn:
    with `save_on_each_node`, each node's run folder gets the final adapter."""
    staging = output_dir / FINAL_SAVE
    for _ in in_turn(trainer.args.should_save):
        fresh_folder(staging, "the final save")
        write_training_output_mark(staging)  # moved into the run folder with the save
    if best is None:
        trainer.save_model(str(staging))  # every process: ZeRO-3 gathers the adapter here
    for _ in in_turn(trainer.args.should_save):
        if best is not None:
            copy_adapter(Path(best), staging)
            trainer.processing_class.save_pretrained(str(staging))  # as save_model does
            metric, value = recipe.metric_for_best_model, trainer.state.best_metric
            metadata["final_adapter"] = final_adapter_record(best, metric, value)
        move_files_into(staging, output_dir, "the final save")
        write_run_files(output_dir, recipe_to_yaml(recipe), manifest, metadata)
        where = (
            f" (from {Path(best).name}, the best by {recipe.metric_for_best_model})" if best else ""
        )
        print(f"adapter saved to {output_dir}{where}", file=sys.stderr)
