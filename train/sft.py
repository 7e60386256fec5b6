"""LoRA supervised fine-tuning of a hallucination detector on prepared pairs (TRL + PEFT + DeepSpeed).

Launch forms (all read the same recipe; any recipe key can be overridden with --key=value):

    deepspeed --num_gpus 8 train/sft.py --config configs/train/qwen2.5-7b-instruct.yaml
    torchrun --nproc_per_node 8 train/sft.py --config configs/train/qwen2.5-7b-instruct.yaml
    accelerate launch --multi_gpu --num_processes 8 train/sft.py --config configs/train/qwen2.5-7b-instruct.yaml
    fincheck train --config configs/train/tiny-cpu.yaml --max_steps=20          # one process

    # on a CPU-only machine, 2 processes (what the tests run):
    deepspeed --num_gpus 2 train/sft.py --config configs/train/tiny-cpu.yaml

Stages: recipe (an SFTConfig, built for this machine) -> base (tiny: built and saved under the
run) -> resume point (checked against the recipe) -> tokenizer + data mixture (fitted to
max_length) -> model + LoRA -> train -> final adapter + recipe + manifest + run metadata.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import logging
import os
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fincheck import __version__
from fincheck.config import build_config, describe_config
from fincheck.errors import FincheckError
from fincheck.inference import template_fingerprint
from fincheck.loading import resolve_model
from fincheck.out_lock import claim_out_dir, lock_out_dir
from fincheck.prepared import read_manifest, require_prepared_dir
from fincheck.runs import RUN_METADATA, relative_base
from fincheck.secrets import redact
from fincheck.tasks import prompt_hashes
from fincheck.train import checkpoints, model
from fincheck.train.recipe import (
    TINY_RANDOM,
    SFTRecipe,
    read_recipe_values,
    recipe_differences,
    recipe_fingerprint,
    recipe_to_yaml,
)

log = logging.getLogger("fincheck.train")
EXIT_PREEMPTED = 143  # 128 + SIGTERM: schedulers read it as "terminated", the checkpoint is saved


@dataclass
class Run:
    """What `build_trainer` set up: the trainer plus what the end of the run writes."""

    trainer: Any
    recipe: SFTRecipe
    output_dir: Path
    resume_from: Path | None
    metadata: dict[str, Any]
    manifest: dict[str, Any]
    sigterm: Any
    lock: Any = None  # the run folder's writer lock, held while this process runs


def share_cpu_threads() -> None:
    """Several processes on one machine: give each its share of the cores.

    torchrun sets OMP_NUM_THREADS=1 itself, the `deepspeed` and `accelerate` launchers do not;
    with every process using all cores, tiny-cpu on 2 processes / 2 cores ran at 4.1K tokens/s
    instead of 10K. torch is imported by then (the recipe is TRL's), so the environment
    variable would come too late: torch.set_num_threads sizes the pool.
    """
    local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    if local > 1 and "OMP_NUM_THREADS" not in os.environ:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))


def free_port() -> int:
    """A TCP port nothing listens on now (the process group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def single_process_group_env() -> None:
    """DeepSpeed outside a launcher (`fincheck train`, `python train/sft.py`): describe a
    one-process group in the environment, otherwise DeepSpeed goes looking for MPI."""
    if "WORLD_SIZE" in os.environ:
        return
    os.environ.update(
        {
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
        }
    )


def deepspeed_build_pending() -> Path | None:
    """Where DeepSpeed will compile its CPU communication kernel when it has not yet done so on
    this machine (it does, silently, on the first CPU run: minutes on 2 cores), else None."""
    import torch

    if torch.cuda.is_available():
        return None
    try:
        from torch.utils.cpp_extension import _get_build_directory

        folder = Path(_get_build_directory("deepspeed_shm_comm", verbose=False))
    except Exception:  # a private helper of torch: no notice rather than no training
        return None
    return None if (folder / "deepspeed_shm_comm.so").exists() else folder


def announce_deepspeed_build() -> None:
    folder = deepspeed_build_pending()
    if folder is not None and os.environ.get("LOCAL_RANK", "0") == "0":
        print(
            "DeepSpeed compiles its CPU communication kernel (deepspeed_shm_comm) on this first "
            f"run: about 1-3 minutes on 2 cores, once per machine (cached in {folder})",
            file=sys.stderr,
            flush=True,
        )


def load_training_recipe(config: str | Path, overrides: list[str]) -> SFTRecipe:
    """The recipe, built for this machine once what must precede torch.distributed is done.

    Building the recipe sets up its device, which starts the process group under a launcher:
    a DeepSpeed run outside a launcher first describes a one-process group in the environment,
    and the tiny random-init base is written before (every process saves its own copy, and
    transformers saves on rank 0 only once the group exists).
    """
    values = read_recipe_values(config, overrides)
    if values["deepspeed"]:
        single_process_group_env()
        announce_deepspeed_build()
    # Claimed before anything is written there: the tiny base would make any folder look like
    # a run's (the repository root, `/`) and TRL's model card would replace its README.md.
    output_dir = claim_out_dir(
        values["output_dir"] or f"checkpoints/{values['run_name']}",
        "output_dir",
        "train",
        checkpoints.RUN_FOLDER_NAMES,
        marks=(RUN_METADATA,),
    )
    if values["model_name_or_path"] == TINY_RANDOM:
        model.ensure_tiny_base(str((output_dir / "base").resolve()))
    else:
        resolve_model(values["model_name_or_path"])  # a known name: fetched once, here
    return build_config(SFTRecipe, values)


def build_trainer(recipe: SFTRecipe) -> Run:
    from datasets import Dataset

    from fincheck.train import callbacks, data, dev_eval, host_memory, tree_attention, tree_layout
    from fincheck.train.trainer import FincheckSFTTrainer, row_key

    share_cpu_threads()
    if "wandb" in recipe.report_to:
        os.environ.setdefault("WANDB_PROJECT", "fincheck")  # transformers' default: huggingface
    require_prepared_dir(recipe.dataset_dir)
    output_dir = claim_out_dir(
        recipe.output_dir,
        "output_dir",
        "train",
        checkpoints.RUN_FOLDER_NAMES,
        marks=(RUN_METADATA,),
    )
    # one writer per run folder: the first process holds its lock until it ends (another
    # `fincheck train` into it stops here, before anything is loaded)
    lock = lock_out_dir(output_dir, "fincheck train") if recipe.process_index == 0 else None
    mixture = data.load_mixture_config(recipe.data_config, recipe.dataset_dir)
    base_path = model.resolve_base_path(recipe, output_dir)
    if recipe.model_name_or_path == TINY_RANDOM:
        model.ensure_tiny_base(base_path)
    if recipe.deepspeed and recipe.use_cpu:
        # On the CPU accelerate starts torch.distributed (gloo) but not DeepSpeed's comm layer,
        # so ZeRO-3's partitioned init would see 1 process; attach DeepSpeed to the group.
        import deepspeed

        if removed := host_memory.sweep_stale_allreduce_buffers():
            log.info("removed %d allreduce buffers of killed runs from /dev/shm", len(removed))
        deepspeed.init_distributed(dist_backend="gloo")
        atexit.register(host_memory.remove_shared_allreduce_buffer)

    checkpoints.guard_output_dir(
        output_dir,
        recipe.resume_from_checkpoint,
        recipe.overwrite_output_dir,
        main=recipe.process_index == 0,  # the recipe set up torch.distributed when built
    )
    base_fp = checkpoints.base_fingerprint(base_path)
    check_one_run_on_every_rank(
        {
            "recipe": recipe_identity(recipe),
            "prepared data": str(read_manifest(recipe.dataset_dir).get("fingerprint")),
            "base": base_fp,
        }
    )
    resume_from = checkpoints.resolve_resume(recipe.resume_from_checkpoint, output_dir)
    if resume_from is not None:
        old = checkpoints.read_checkpoint_recipe(resume_from)
        checkpoints.check_resume_compatible(
            resume_from,
            recipe_differences(old, recipe),
            base_fp,
            recipe.world_size,
            read_manifest(recipe.dataset_dir).get("fingerprint"),
        )
        checkpoints.check_state_files(resume_from)
        if "wandb" in recipe.report_to:
            callbacks.continue_wandb_run(output_dir)

    tokenizer = model.load_tokenizer(recipe, base_path)
    prepared = data.build_training_data(recipe, mixture, tokenizer)
    train_rows, eval_rows, collator = prepared.train_rows, prepared.eval_rows, None
    if recipe.tree_packing:
        train_rows, eval_rows, prepared.stats["tree_packing"] = tree_layout.pack_splits(
            train_rows, eval_rows, recipe.tree_budget
        )
    if recipe.process_index == 0:
        log.info("data: %s", json.dumps(prepared.stats))
        if recipe.attention_note:
            log.info(recipe.attention_note)

    if recipe.tree_packing:
        check_one_gpu_per_process(recipe.n_gpu)
    base = model.load_base_model(recipe, base_path, tokenizer)
    if recipe.tree_packing:
        tree_attention.check_no_sliding_window(base.config, recipe.tree_budget)
        tree_attention.use_tree_attention(base)  # SDPA over the keys each query chunk sees
        # config._attn_implementation: transformers has a public setter, no getter, of the kernel
        collator = tree_collator(recipe, tokenizer.pad_token_id, base.config._attn_implementation)
    trainer = FincheckSFTTrainer(
        model=base,
        args=recipe,
        data_collator=collator,
        train_dataset=Dataset.from_list(train_rows),
        eval_dataset=Dataset.from_list(eval_rows) if eval_rows else None,
        processing_class=tokenizer,
        peft_config=model.build_lora_config(recipe, base),
    )
    if recipe.dev_figures:
        trainer.dev_figures = dev_eval.DevFigures(recipe, mixture.eval_split, tokenizer)
        prepared.stats["dev_figures"] = trainer.dev_figures.sizes()
    # a NaN/inf loss names the pairs of its batch: the trainer drops the id column itself
    trainer.pair_ids_by_row = {
        row_key(r["input_ids"]): ", ".join(r["pair_ids"]) if "pair_ids" in r else r["id"]
        for r in train_rows
    }

    manifest = prepared.manifest
    metadata = {
        "fincheck_version": __version__,
        "base_model": relative_base(base_path, output_dir),
        **model.base_identity(recipe, base_path, base),
        "base_fingerprint": base_fp,
        "recipe_fingerprint": recipe_fingerprint(recipe),
        "data_fingerprint": manifest.get("fingerprint"),
        "prompt_hashes": manifest.get("prompt_hashes") or prompt_hashes(mixture.tasks),
        "chat_template_hash": template_fingerprint(tokenizer, recipe.chat_template_kwargs),
        "chat_template_kwargs": recipe.chat_template_kwargs,
        "data": prepared.stats,
        "attn_implementation": base.config._attn_implementation,  # no public getter (above)
        "world_size": recipe.world_size,
    }
    check_prompt_hashes(manifest, mixture.tasks)
    recipe_yaml = recipe_to_yaml(recipe)
    sigterm = callbacks.SigtermCallback()
    if not recipe.disable_tqdm:
        trainer.remove_callback(callbacks.ProgressCallback)
        trainer.add_callback(callbacks.QuietProgressCallback())
    trainer.add_callback(callbacks.StepLogCallback())
    trainer.add_callback(callbacks.TokenCountCallback(trainer))
    if recipe.release_host_memory and recipe.use_cpu:
        trainer.add_callback(callbacks.ReleaseHostMemoryCallback())
    trainer.add_callback(
        callbacks.CompleteCheckpointCallback(metadata, recipe_yaml, trainer.keep_checkpoints)
    )
    trainer.add_callback(sigterm)
    trainer.add_callback(callbacks.RunConfigCallback({"recipe": recipe_yaml, **metadata}))
    return Run(trainer, recipe, output_dir, resume_from, metadata, manifest, sigterm, lock)


def recipe_identity(recipe: SFTRecipe) -> str:
    """Every key the recipe declares, as one digest: what all processes of a launch must share
    (a node started with another learning rate or another max_steps trains another run)."""
    import hashlib

    text = json.dumps(recipe.declared, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def check_one_run_on_every_rank(identity: dict[str, str]) -> None:
    """All processes of a launch, on every node, were started with the same recipe, prepared
    data and base: each rank compares its own with every other's, and each one that differs
    from rank 0's stops every rank before the first step (a node launched with another recipe
    or data would train a mix of two runs, or hang at the first collective)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, identity)
    differ = sorted(
        {key for other in gathered for key in identity if other[key] != gathered[0][key]}
    )
    if differ:
        ranks = [rank for rank, other in enumerate(gathered) if other != gathered[0]]
        raise FincheckError(
            f"the processes of this launch were not started with the same {' and '.join(differ)}"
            f" (rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} "
            f"differ{'' if len(ranks) > 1 else 's'} from rank 0): start every node with the same recipe, overrides and prepared data (this is "
            f"rank {dist.get_rank()}); nothing was trained"
        )


def tree_collator(recipe: SFTRecipe, pad_token_id: int, attention: str):
    """Tree packs -> batches. FlexAttention: one shape per run, every row the budget long
    (rounded up to its block) and every micro-batch `per_device_train_batch_size` rows, the
    eval loss's batches too, so it compiles once for training and once for evaluation; other
    kernels: rows padded to the longest, as TRL pads (none on a CPU)."""
    from fincheck.train.tree_attention import FLEX_BLOCK
    from fincheck.train.tree_batches import TreeCollator, round_up

    if attention == "flex_attention":
        length = round_up(recipe.tree_budget, FLEX_BLOCK)
        # the eval loss's batches take the same shape: no new compilation mid-run
        recipe.per_device_eval_batch_size = recipe.per_device_train_batch_size
        return TreeCollator(pad_token_id, length=length, rows=recipe.per_device_train_batch_size)
    multiple = recipe.pad_to_multiple_of  # TRL's "auto": none on a CPU, as TRL decides
    return TreeCollator(pad_token_id, multiple if isinstance(multiple, int) else None)


def check_one_gpu_per_process(n_gpu: int) -> None:
    """Tree packing needs one GPU per process: with several GPUs and no launcher the Trainer
    wraps the model in nn.DataParallel, which would split the logit positions along the batch
    and leave the attention mask on the first GPU."""
    if n_gpu > 1:
        raise FincheckError(
            f"tree_packing: this one process sees {n_gpu} GPUs; launch one process per GPU "
            f"(deepspeed --num_gpus {n_gpu} train/sft.py ..., or torchrun --nproc_per_node "
            f"{n_gpu}), or train on one: CUDA_VISIBLE_DEVICES=0"
        )


def check_prompt_hashes(manifest: dict[str, Any], tasks: list[str]) -> None:
    """Warn when the pairs were rendered with other prompt files than the ones installed now:
    evaluation renders with the installed ones, so the model would be tested on other wording."""
    recorded = manifest.get("prompt_hashes") or {}
    current = prompt_hashes([t for t in tasks if t in recorded])
    stale = [t for t in current if recorded[t] != current[t]]
    if stale:
        log.warning("prompts changed since `fincheck prepare` for %s: re-run prepare", stale)


def train_and_save(r: Run) -> int:
    """Train, then write the final adapter and the run files. Returns the exit status."""
    trainer, recipe = r.trainer, r.recipe
    done = r.resume_from and checkpoints.finished_at(r.resume_from, recipe.max_steps)
    if done:  # resuming would train one step past the end and overwrite the adapter
        if trainer.args.process_index == 0:
            best = recipe.final_adapter_from_best and checkpoints.best_checkpoint(r.resume_from)
            if best:  # load_best_model_at_end: the best checkpoint's adapter, as a full run
                r.metadata["final_adapter"] = checkpoints.best_adapter_record(
                    r.resume_from, best, recipe.metric_for_best_model
                )
            copied = checkpoints.finish_from_checkpoint(best or r.resume_from, r.output_dir)
            if copied:
                checkpoints.write_run_files(
                    r.output_dir, recipe_to_yaml(recipe), r.manifest, r.metadata
                )
            print(
                f"the run is already complete: {r.resume_from.name} reached step {done} of "
                f"{recipe.max_steps if recipe.max_steps > 0 else done}; nothing to train"
                + (f" (its adapter copied to {r.output_dir})" if copied else ""),
                file=sys.stderr,
            )
        return 0
    if trainer.args.process_index == 0:
        if r.resume_from is not None:
            log.info("resuming from %s", r.resume_from)
        elif recipe.resume_from_checkpoint == "auto":
            log.info("no complete checkpoint in %s: starting from scratch", r.output_dir)
    with full_disk_as_one_line(r.output_dir, trainer), checkpoints.weights_only_loads():
        trainer.train(resume_from_checkpoint=str(r.resume_from) if r.resume_from else None)
    if r.sigterm.stopped_at is not None:
        if trainer.args.process_index == 0:
            print(
                f"stopped by {r.sigterm.reason} after step {r.sigterm.stopped_at}; checkpoint "
                "saved. Resume "
                f"with --resume_from_checkpoint=auto --output_dir={r.output_dir}",
                file=sys.stderr,
            )
        return EXIT_PREEMPTED
    best = trainer.state.best_model_checkpoint if recipe.final_adapter_from_best else None
    with full_disk_as_one_line(r.output_dir, trainer):
        save_final_adapter(r, recipe, trainer, best)
    return 0


def save_final_adapter(r: Run, recipe: SFTRecipe, trainer: Any, best: str | None) -> None:
    """The run folder's adapter (the last one, or the best checkpoint's), tokenizer and run
    files."""
    if best is None:
        trainer.save_model(str(r.output_dir))  # every process: ZeRO-3 gathers the adapter here
    if trainer.args.process_index == 0:
        if best is not None:  # load_best_model_at_end: the best checkpoint's adapter
            checkpoints.copy_adapter(Path(best), r.output_dir)
            trainer.processing_class.save_pretrained(str(r.output_dir))  # as save_model does
            r.metadata["final_adapter"] = {
                "checkpoint": Path(best).name,
                "metric": trainer.args.metric_for_best_model,
                "value": trainer.state.best_metric,
            }
        checkpoints.write_run_files(r.output_dir, recipe_to_yaml(recipe), r.manifest, r.metadata)
        where = (
            f" (from {Path(best).name}, the best by {recipe.metric_for_best_model})" if best else ""
        )
        print(f"adapter saved to {r.output_dir}{where}", file=sys.stderr)


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
        if not checkpoints.is_out_of_space(e):
            raise
        step = trainer.state.global_step
        raise FincheckError(checkpoints.out_of_space_message(output_dir, step)) from e


HELP = __doc__ + "\nRecipe keys (YAML or --key=value):\n"
USAGE = "usage: train/sft.py --config RECIPE.yaml [--key=value ...]  (--help)"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        print(HELP + describe_config(SFTRecipe))
        return 0
    config, rest = split_config_arg(argv)
    if config is None:
        print(USAGE, file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        status = train_and_save(build_trainer(load_training_recipe(config, rest)))
    except FincheckError as e:
        print(f"train/sft.py: error: {redact(str(e))}", file=sys.stderr)
        return 1
    leave_process_group()
    return status


def leave_process_group() -> None:
    """Every process leaves the group together at the end of a run: on several nodes the
    rendezvous store lives in node 0's launcher, which exits with its own workers; a worker of
    another node still holding the group would then abort (SIGABRT) on the lost connection,
    after a run that succeeded."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def split_config_arg(argv: list[str]) -> tuple[str | None, list[str]]:
    """(the recipe, the `--key=value` overrides) of a command line. The `deepspeed` launcher
    appends --local_rank=N; LOCAL_RANK in the environment says the same, so it is dropped."""
    parser = argparse.ArgumentParser(
        prog="train/sft.py", usage=USAGE.removeprefix("usage: "), add_help=False, allow_abbrev=False
    )
    parser.add_argument("--config")
    parser.add_argument("--local_rank", "--local-rank")
    known, rest = parser.parse_known_args(argv)
    return known.config, rest


if __name__ == "__main__":
    sys.exit(main())
