"""`fincheck train`: one-process LoRA SFT from a recipe (multi-GPU: launch train/sft.py)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from fincheck.io.config import REQUIRED, add_options, config_field, describe_config, read_options
from fincheck.io.messages import show_progress_lines

EPILOG = """\
examples:
  fincheck train --config configs/train/tiny-cpu.yaml --dataset_dir=prepared
  fincheck train --config configs/train/qwen2.5-0.5b-instruct.yaml --max_steps=100 --report_to=wandb

multi-process / multi-GPU (same recipe, same overrides):
  deepspeed --num_gpus 8 train/sft.py --config RECIPE
  torchrun --nproc_per_node 8 train/sft.py --config RECIPE
  accelerate launch --multi_gpu --num_processes 8 train/sft.py --config RECIPE

Any recipe key can be overridden as --key=value; `python train/sft.py --help` lists them all
with their defaults. Resume an interrupted run with --resume_from_checkpoint=auto.
"""


@dataclass
class TrainCommand:
    """The command's own flags; every recipe key is a `--key=value` override."""

    config: str = config_field(REQUIRED, "recipe YAML (configs/train/*.yaml)")
    list_keys: bool = config_field(False, "print every recipe key with its default and exit")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train",
        help="LoRA fine-tune a detector on prepared pairs (one process)",
        description=__doc__,
        epilog=EPILOG,
    )
    add_options(parser, TrainCommand)
    parser.set_defaults(func=handle_train, accepts_overrides=True, options=TrainCommand)


def handle_train(args: argparse.Namespace) -> int:
    from fincheck.train.recipe import SFTRecipe
    from fincheck.train.sft import build_trainer, load_training_recipe, train_and_save

    if read_options(TrainCommand, args).list_keys:
        print(describe_config(SFTRecipe))
        return 0
    recipe = load_training_recipe(args.config, args.overrides)
    show_progress_lines("%(asctime)s %(name)s: %(message)s")
    return train_and_save(build_trainer(recipe))
