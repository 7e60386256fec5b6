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

import atexit
import contextlib
import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fincheck.io.bounded_http import bound_hub_replies
from fincheck.io.cache import cache_root
from fincheck.io.config import build_config, describe_config
from fincheck.io.messages import (
    check_command_line,
    error_line,
    library_errors_as_one_line,
    redacting_excepthook,
    show_progress_lines,
)
from fincheck.io.out_lock import claim_out_dir, lock_out_dir
from fincheck.io.runs import RUN_METADATA, config_fingerprint
from fincheck.io.secrets import redacted_output
from fincheck.models.loading import resolve_model
from fincheck.tasks.prepared import PreparedFolder
from fincheck.train import checkpoints, launch, model, resume
from fincheck.train.recipe import (
    TINY_RANDOM,
    SFTRecipe,
    read_recipe_values,
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


def load_training_recipe(config: str | Path, overrides: list[str]) -> SFTRecipe:
    """The recipe, built for this machine once what must precede torch.distributed is done.

    Building the recipe sets up its device, which starts the process group under a launcher:
    a DeepSpeed run outside a launcher first describes a one-process group in the environment,
    and the tiny random-init base is written before (every process saves its own copy, and
    transformers saves on rank 0 only once the group exists).
    """
    values = read_recipe_values(config, overrides)
    if values["deepspeed"]:
        launch.single_process_group_env()
        launch.announce_deepspeed_build()
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
    """The trainer of a recipe from `load_training_recipe` (its output folder claimed, its base
    fetched or built), with what the end of the run writes."""
    from datasets import Dataset

    from fincheck.train import (
        callbacks,
        data,
        dev_eval,
        host_memory,
        tree_attention,
        tree_batches,
        tree_layout,
    )
    from fincheck.train.trainer import FincheckSFTTrainer, row_key

    launch.share_cpu_threads()
    if "wandb" in recipe.report_to:
        os.environ.setdefault("WANDB_PROJECT", "fincheck")  # transformers' default: huggingface
        # wandb's default console capture wraps sys.stdout.write and sees the text before
        # fincheck's redacting stream does; "redirect" reads the file descriptor, after it
        os.environ.setdefault("WANDB_CONSOLE", "redirect")
        # wandb writes its files by name and links its logs: under fincheck's cache, never in
        # the working folder (its default) nor the run folder, whose resume refuses a link
        cache_root().mkdir(parents=True, exist_ok=True)  # (wandb writes its wandb/ in it)
        os.environ.setdefault("WANDB_DIR", str(cache_root()))
    folder = PreparedFolder.open(recipe.dataset_dir)  # the one entry to the prepared data
    output_dir = Path(recipe.output_dir)  # claimed by load_training_recipe
    # one writer per run folder: the first process holds its lock until it ends (another
    # `fincheck train` into it stops here, before anything is loaded)
    lock = lock_out_dir(output_dir, "fincheck train") if recipe.process_index == 0 else None
    mixture = data.load_mixture_config(recipe.data_config, folder)
    base_path = model.resolve_base_path(recipe, output_dir)  # fetched or built already
    if recipe.deepspeed and recipe.use_cpu:
        # On the CPU accelerate starts torch.distributed (gloo) but not DeepSpeed's comm layer,
        # so ZeRO-3's partitioned init would see 1 process; attach DeepSpeed to the group.
        import deepspeed

        if removed := host_memory.sweep_stale_allreduce_buffers():
            log.info("removed %d allreduce buffers of killed runs from /dev/shm", len(removed))
        deepspeed.init_distributed(dist_backend="gloo")
        atexit.register(host_memory.remove_shared_allreduce_buffer)

    base_fp = checkpoints.base_fingerprint(base_path)
    data_fp = folder.fingerprint
    launch.check_one_run_on_every_rank(
        {
            "recipe": launch.recipe_identity(recipe),
            "prepared data": str(data_fp),
            "base": base_fp,  # the model files by content (a local folder), else the name
        }
    )
    launch.check_each_saving_node_has_its_own_disk(recipe, output_dir)
    legacy_fp = config_fingerprint(base_path)  # what older checkpoints recorded
    resume_from = resume.resume_point(recipe, output_dir, base_fp, data_fp, legacy_fp)
    if resume_from is not None and "wandb" in recipe.report_to:
        callbacks.continue_wandb_run(output_dir)

    tokenizer = model.load_tokenizer(recipe, base_path)
    train_rows, eval_rows, stats = data.build_training_data(recipe, mixture, tokenizer, folder)
    collator = None
    if recipe.tree_packing:
        train_rows, eval_rows, stats["tree_packing"] = tree_layout.pack_splits(
            train_rows, eval_rows, recipe.tree_budget
        )
    if recipe.process_index == 0:
        log.info("data: %s", json.dumps(stats))
        if recipe.attention_note:
            log.info(recipe.attention_note)

    if recipe.tree_packing:
        launch.check_one_gpu_per_process(recipe.n_gpu)
    with library_errors_as_one_line(
        f"{base_path}: the base does not load for training"
        + (
            f" (attn_implementation: {recipe.attn_implementation})"
            if recipe.attn_implementation
            else ""
        ),
        "check attn_implementation (sdpa or eager run everywhere) and the base's files",
    ):
        base = model.load_base_model(recipe, base_path, tokenizer)
    if recipe.tree_packing:
        tree_attention.check_no_sliding_window(base.config, recipe.tree_budget)
        tree_attention.use_tree_attention(base)  # SDPA over the keys each query chunk sees
        # config._attn_implementation: transformers has a public setter, no getter, of the kernel
        attention = base.config._attn_implementation
        collator = tree_batches.tree_collator(recipe, tokenizer.pad_token_id, attention)
    dev_figures = None
    if recipe.dev_figures:
        dev_figures = dev_eval.DevFigures(recipe, mixture.eval_split, tokenizer, folder)
        stats["dev_figures"] = dev_figures.sizes()
    lora = f"lora_target_modules {recipe.lora_target_modules}"
    with library_errors_as_one_line(
        f"the LoRA setup on {base_path} ({lora})",
        "name modules the base has (all-linear, or e.g. q_proj, v_proj)",
    ):
        trainer = FincheckSFTTrainer(
            model=base,
            args=recipe,
            data_collator=collator,
            train_dataset=Dataset.from_list(train_rows),
            eval_dataset=Dataset.from_list(eval_rows) if eval_rows else None,
            processing_class=tokenizer,
            peft_config=model.build_lora_config(recipe, base),
            dev_figures=dev_figures,
            # a NaN/inf loss names the pairs of its batch: the trainer drops the id column
            pair_ids_by_row={
                row_key(r["input_ids"]): ", ".join(r["pair_ids"]) if "pair_ids" in r else r["id"]
                for r in train_rows
            },
        )

    manifest = folder.manifest
    data.check_prompt_hashes(manifest, mixture.tasks)
    metadata = model.run_metadata(
        recipe,
        base_path,
        base_fp,
        output_dir,
        base,
        tokenizer,
        manifest,
        stats,
        mixture.tasks,
    )
    metadata["resumes"] = resume.resume_history(resume_from)  # how often it was restarted
    sigterm = callbacks.install(trainer, recipe, metadata, recipe_to_yaml(recipe))
    return Run(trainer, recipe, output_dir, resume_from, metadata, manifest, sigterm, lock)


def train_and_save(r: Run) -> int:
    """Train, then write the final adapter and the run files. Returns the exit status; the run
    folder's writer lock is released once it is written."""
    with r.lock or contextlib.nullcontext():
        trainer, recipe = r.trainer, r.recipe
        main = trainer.args.process_index == 0
        done = r.resume_from and checkpoints.finished_at(r.resume_from, recipe.max_steps)
        if done:  # resuming would train one step past the end and overwrite the adapter
            for _ in checkpoints.in_turn(trainer.args.should_save):  # each node's disk, in turn
                checkpoints.finish_completed_run(
                    r.resume_from, done, r.output_dir, recipe, r.manifest, r.metadata
                )
            return 0
        if main and r.resume_from is not None:
            log.info("resuming from %s", r.resume_from)
        elif main and recipe.resume_from_checkpoint == "auto":
            log.info("no complete checkpoint in %s: starting from scratch", r.output_dir)
        with (
            library_errors_as_one_line(  # outermost: a full disk is said as such first
                f"training {r.output_dir}",
                "check the recipe's keys and the files it names (`fincheck --debug train` shows the "
                "traceback); a run stopped after a checkpoint resumes with "
                "--resume_from_checkpoint=auto",
            ),
            checkpoints.full_disk_as_one_line(r.output_dir, trainer),
            resume.weights_only_loads(),
        ):
            trainer.train(resume_from_checkpoint=str(r.resume_from) if r.resume_from else None)
        if r.sigterm.stopped_at is not None:
            if main:
                print(
                    f"stopped by {r.sigterm.reason} after step {r.sigterm.stopped_at}; checkpoint "
                    f"saved. Resume with --resume_from_checkpoint=auto --output_dir={r.output_dir}",
                    file=sys.stderr,
                )
            return EXIT_PREEMPTED
        best = trainer.state.best_model_checkpoint if recipe.final_adapter_from_best else None
        with checkpoints.full_disk_as_one_line(r.output_dir, trainer):
            checkpoints.save_final_adapter(
                trainer, recipe, r.output_dir, best, r.manifest, r.metadata
            )
        return 0


HELP = __doc__ + "\nRecipe keys (YAML or --key=value):\n"


def main(argv: list[str] | None = None) -> int:
    """The launcher's entry point (`deepspeed train/sft.py --config ...`), with the errors and
    the redacted output of `fincheck train`."""
    sys.excepthook = redacting_excepthook  # a traceback is printed after the streams are back
    with redacted_output():
        argv = list(sys.argv[1:] if argv is None else argv)
        if "-h" in argv or "--help" in argv:
            print(HELP + describe_config(SFTRecipe))
            return 0
        config, rest = launch.split_config_arg(argv)
        if config is None:
            print(launch.USAGE, file=sys.stderr)
            return 2
        show_progress_lines("%(asctime)s %(name)s: %(message)s")
        bound_hub_replies()  # every hub reply of this process read with bounds
        try:
            check_command_line(argv)
            status = train_and_save(build_trainer(load_training_recipe(config, rest)))
        except Exception as e:
            said = error_line(e, "then rerun with --resume_from_checkpoint=auto")
            if said is None:
                raise
            print(f"train/sft.py: error: {said[0]}", file=sys.stderr)
            return said[1]
        launch.leave_process_group()
        return status


if __name__ == "__main__":
    sys.exit(main())
