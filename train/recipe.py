"""The training recipe: one typed dataclass, a YAML file of its keys, `--key=value` overrides.

Every key a recipe may set is a field below with its help text (`fincheck train --help` lists
them); unknown keys and wrong types stop with the file and key named. `build_sft_config` turns a
recipe into TRL's `SFTConfig` for this machine (GPU or CPU), so the YAML stays short and the
hardware-dependent settings (precision, process-group backend) are decided in one place.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from fincheck.config import config_field, config_to_dict, load_config, parse_overrides
from fincheck.errors import FincheckError

TINY_RANDOM = "tiny-random"  # model_name_or_path that builds the project's tiny test model


@dataclass
class SFTRecipe:
    # --- model ---
    model_name_or_path: str = config_field(
        TINY_RANDOM,
        "base model: a hub id, a local folder, or 'tiny-random' (the 2-layer Qwen2 test model, "
        "built with no download and saved under <output_dir>/base)",
    )
    tokenizer_name_or_path: str | None = config_field(None, "tokenizer (default: the model's)")
    chat_template_path: str | None = config_field(
        None, "a .jinja chat template file replacing the tokenizer's (default: the tokenizer's own)"
    )
    pad_token: str | None = config_field(
        None,
        "pad token; must differ from EOS so EOS stays a trained target (default: the tokenizer's "
        "pad, else a reserved token such as <|finetune_right_pad_id|>, else a new <|pad|>)",
    )
    torch_dtype: Literal["auto", "bfloat16", "float16", "float32"] = config_field(
        "auto", "dtype of the base weights: auto = bfloat16 when training in bf16, else float32"
    )
    attn_implementation: str | None = config_field(
        None, "attention kernel: sdpa, eager, flash_attention_2 (default: transformers' choice)"
    )
    load_in_4bit: bool = config_field(
        False, "QLoRA: load the base in 4-bit NF4 (needs a GPU and bitsandbytes)"
    )
    trust_remote_code: bool = config_field(False, "allow model code from the hub")
    # --- LoRA ---
    lora_r: int = config_field(16, "LoRA rank")
    lora_alpha: int = config_field(32, "LoRA scaling numerator (scale = alpha / r)")
    lora_dropout: float = config_field(0.05, "dropout on the LoRA input")
    lora_target_modules: list[str] = config_field(
        ["all-linear"], "modules that get adapters: 'all-linear' or names like q_proj,v_proj"
    )
    # --- data ---
    dataset_dir: str = config_field(
        "prepared", "a `fincheck prepare` output: <dir>/<task>/<split>.jsonl and manifest.json"
    )
    data_config: str = config_field(
        "configs/data/all-tasks.yaml", "the task mixture file (tasks, weights, max examples)"
    )
    max_length: int = config_field(
        2048,
        "tokens per example; longer pairs are trimmed on the grounding text (never the target) "
        "or dropped, and counted",
    )
    packing: bool = config_field(
        False, "padding-free packing: examples share a row, kept apart by position_ids"
    )
    # --- optimisation ---
    num_train_epochs: float = config_field(
        2.0, "epochs over the mixture (ignored if max_steps > 0)"
    )
    max_steps: int = config_field(-1, "optimizer steps; > 0 overrides num_train_epochs")
    per_device_train_batch_size: int = config_field(4, "examples per process per micro-step")
    per_device_eval_batch_size: int = config_field(8, "examples per process per eval step")
    gradient_accumulation_steps: int = config_field(
        4, "micro-steps per optimizer step (global batch = per_device x accumulation x processes)"
    )
    learning_rate: float = config_field(2e-4, "peak learning rate")
    lr_scheduler_type: str = config_field("cosine", "schedule: cosine, linear, constant, ...")
    warmup_ratio: float = config_field(0.03, "fraction of steps spent warming up, in [0, 1)")
    weight_decay: float = config_field(0.0, "AdamW weight decay")
    max_grad_norm: float = config_field(1.0, "gradient clipping norm")
    optim: str = config_field("adamw_torch", "optimizer name as in transformers' TrainingArguments")
    precision: Literal["auto", "bf16", "fp16", "fp32"] = config_field(
        "auto", "mixed precision: auto = bf16 on a GPU that supports it, fp32 on the CPU"
    )
    gradient_checkpointing: bool = config_field(
        True, "recompute activations in the backward pass (non-reentrant)"
    )
    seed: int = config_field(42, "seed for init, data order and dropout")
    # --- hardware layout ---
    deepspeed: str | None = config_field(
        None, "DeepSpeed JSON config (configs/deepspeed/zero2.json, zero3.json, zero3_offload.json)"
    )
    # --- output, logging, checkpoints ---
    run_name: str = config_field("fincheck-sft", "name of the run (wandb and the output folder)")
    output_dir: str | None = config_field(
        None, "where the run goes (default: checkpoints/<run_name>)"
    )
    logging_steps: int = config_field(10, "log loss, lr and tokens/s every N optimizer steps")
    save_steps: int = config_field(200, "save a resumable checkpoint every N steps")
    save_total_limit: int | None = config_field(3, "keep at most N checkpoints (oldest removed)")
    eval_steps: int | None = config_field(
        None, "evaluate on the dev split every N steps (default: no evaluation during training)"
    )
    eval_max_examples: int = config_field(256, "dev pairs evaluated (per task mixture order)")
    report_to: list[str] = config_field(
        ["none"], "loggers: none, wandb, tensorboard (wandb honours WANDB_MODE=offline)"
    )
    resume_from_checkpoint: str | None = config_field(
        None, "a checkpoint folder, or 'auto' for the last complete checkpoint in output_dir"
    )
    dataloader_num_workers: int = config_field(0, "data-loading worker processes")

    def resolved_output_dir(self) -> Path:
        return Path(self.output_dir or f"checkpoints/{self.run_name}")


# Keys that may change when a run is resumed: where it writes, how often it logs/saves, how
# long it runs (a longer run also stretches the lr schedule from the resume point on).
# Anything else (base model, LoRA shape, data, optimiser, layout) must match.
RESUMABLE_CHANGES = frozenset(
    {
        "max_steps",
        "num_train_epochs",
        "output_dir",
        "run_name",
        "resume_from_checkpoint",
        "report_to",
        "logging_steps",
        "save_steps",
        "save_total_limit",
        "eval_steps",
        "dataloader_num_workers",
        "per_device_eval_batch_size",
        "eval_max_examples",
        "dataset_dir",
    }
)


def load_recipe(
    path: str | Path | None, overrides: list[str] | dict[str, Any] | None = None
) -> SFTRecipe:
    """Recipe defaults <- YAML file <- `--key=value` overrides."""
    if isinstance(overrides, list):
        overrides = parse_overrides(overrides)
    recipe = load_config(SFTRecipe, path, overrides or {})
    validate_recipe(recipe)
    return recipe


def validate_recipe(recipe: SFTRecipe) -> None:
    if recipe.max_length < 64:
        raise FincheckError(f"max_length={recipe.max_length}: too short for prompt + target")
    if recipe.lora_r <= 0:
        raise FincheckError(f"lora_r={recipe.lora_r}: must be positive")
    if recipe.deepspeed and not Path(recipe.deepspeed).is_file():
        raise FincheckError(f"deepspeed config not found: {recipe.deepspeed}")
    if recipe.chat_template_path and not Path(recipe.chat_template_path).is_file():
        raise FincheckError(f"chat template not found: {recipe.chat_template_path}")


def recipe_to_yaml(recipe: SFTRecipe) -> str:
    return yaml.safe_dump(config_to_dict(recipe), sort_keys=False, allow_unicode=True)


def recipe_fingerprint(recipe: SFTRecipe) -> str:
    """sha256 over the keys a resume must keep (see RESUMABLE_CHANGES)."""
    kept = {k: v for k, v in config_to_dict(recipe).items() if k not in RESUMABLE_CHANGES}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:16]


def recipe_differences(old: dict[str, Any], new: SFTRecipe) -> list[str]:
    """`key: old -> new` for the keys that must not change across a resume."""
    current = config_to_dict(new)
    return [
        f"{key}: {old.get(key)!r} -> {current[key]!r}"
        for key in current
        if key not in RESUMABLE_CHANGES and old.get(key) != current[key]
    ]


def has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def build_sft_config(recipe: SFTRecipe, output_dir: Path, gpu: bool | None = None):
    """TRL's SFTConfig for this recipe on this machine.

    On a machine without a GPU, DeepSpeed and DDP run over gloo: `use_cpu=True` makes accelerate
    count the processes torch.distributed already has (without it TRL's metric gathers fail with
    `expected length 2, got 1`), and bf16 is off (SFTConfig defaults to bf16; the CPU refuses it).
    """
    import torch
    from trl import SFTConfig

    gpu = has_gpu() if gpu is None else gpu
    precision = recipe.precision
    if precision == "auto":
        precision = "bf16" if gpu and torch.cuda.is_bf16_supported() else "fp32"
    if not gpu and precision != "fp32":
        raise FincheckError(f"precision={precision} needs a GPU; use --precision=fp32 on the CPU")
    cpu_only: dict[str, Any] = {}
    if not gpu:
        cpu_only["use_cpu"] = True
        if int(os.environ.get("WORLD_SIZE", "1")) > 1 or recipe.deepspeed:
            cpu_only["ddp_backend"] = "gloo"  # DeepSpeed always runs in a process group
    eval_on = recipe.eval_steps is not None and recipe.eval_steps > 0
    return SFTConfig(
        output_dir=str(output_dir),
        run_name=recipe.run_name,
        num_train_epochs=recipe.num_train_epochs,
        max_steps=recipe.max_steps,
        per_device_train_batch_size=recipe.per_device_train_batch_size,
        per_device_eval_batch_size=recipe.per_device_eval_batch_size,
        gradient_accumulation_steps=recipe.gradient_accumulation_steps,
        learning_rate=recipe.learning_rate,
        lr_scheduler_type=recipe.lr_scheduler_type,
        warmup_steps=recipe.warmup_ratio,  # a float in [0, 1) is a ratio of the total steps
        weight_decay=recipe.weight_decay,
        max_grad_norm=recipe.max_grad_norm,
        optim=recipe.optim,
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        **checkpointing_kwargs(SFTConfig, recipe.gradient_checkpointing),
        seed=recipe.seed,
        data_seed=recipe.seed,
        deepspeed=recipe.deepspeed or None,
        logging_steps=recipe.logging_steps,
        logging_first_step=True,
        save_strategy="steps",
        save_steps=recipe.save_steps,
        save_total_limit=recipe.save_total_limit,
        eval_strategy="steps" if eval_on else "no",
        eval_steps=recipe.eval_steps if eval_on else None,
        report_to=[r for r in recipe.report_to if r != "none"] or "none",
        dataloader_num_workers=recipe.dataloader_num_workers,
        # Data: the pairs arrive as conversational prompt/completion, so TRL masks the prompt
        # (completion-only loss); every pair already fits max_length (see data.fit_pair).
        max_length=recipe.max_length,
        packing=recipe.packing,
        padding_free=recipe.packing,
        completion_only_loss=True,
        shuffle_dataset=False,  # the mixture is shuffled with `seed`; the sampler shuffles per epoch
        dataset_num_proc=None,
        remove_unused_columns=True,
        disable_tqdm=False,
        **cpu_only,
    )


def checkpointing_kwargs(config_cls: type, enabled: bool) -> dict[str, Any]:
    """Non-reentrant activation checkpointing, under the name this transformers version uses
    (`activation_checkpointing`; `gradient_checkpointing` before it was renamed)."""
    names = {f.name for f in dataclasses.fields(config_cls)}
    prefix = "activation" if "activation_checkpointing" in names else "gradient"
    return {
        f"{prefix}_checkpointing": enabled,
        f"{prefix}_checkpointing_kwargs": {"use_reentrant": False},
    }


def recipe_paths(directory: str | Path = "configs/train") -> list[Path]:
    return sorted(Path(directory).glob("*.yaml"))


def field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(SFTRecipe)]
