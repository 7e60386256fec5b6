"""The training recipe: TRL's `SFTConfig` plus fincheck's own keys, one YAML file of them,
`--key=value` overrides.

`SFTRecipe` subclasses `trl.SFTConfig`, so every Trainer and TRL option (`use_liger_kernel`,
`neftune_noise_alpha`, `lr_scheduler_kwargs`, ...) is a recipe key with no code change; fincheck
adds only what TRL does not know (the base model and tokenizer, LoRA, the prepared data and its
mixture, a precision switch) and sets its own defaults for a few TRL keys. Keys are checked
against the dataclass (`fincheck train --list-keys` lists them); `recipe_checks` checks them
together, `machine` adapts the recipe to this machine, `resume` says what a resume may change.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from trl import SFTConfig

from fincheck.io.config import (
    build_config,
    config_defaults,
    config_field,
    config_values,
    declare_bounds,
    parse_overrides,
    plain_value,
)
from fincheck.io.jsonl import read_json_object
from fincheck.io.runs import DEFAULT_TRAINING_WINDOW
from fincheck.train.machine import adapt_to_machine
from fincheck.train.recipe_checks import validate_recipe

TINY_RANDOM = "tiny-random"  # model_name_or_path that builds the project's tiny test model


@dataclass
class SFTRecipe(SFTConfig):
    # --- fincheck: model --------------------------------------------------------------------
    model_name_or_path: str = config_field(
        TINY_RANDOM,
        "base model: a hub id, a local folder, a .gguf file, or 'tiny-random' (the 2-layer Qwen2 "
        "test model, built with no download and saved under <output_dir>/base)",
    )
    base_model_id: str | None = config_field(
        None,
        "the base's hub id when model_name_or_path is a local copy of a hub model: recorded in "
        "the run and written as base_model in the model card",
    )
    tokenizer_name_or_path: str | None = config_field(None, "tokenizer (default: the model's)")
    torch_dtype: str = config_field(
        "auto",
        "dtype of the base weights: auto (that of the training precision), bf16, fp16, fp32 "
        "(bfloat16, float16, float32 accepted)",
    )
    attn_implementation: str | None = config_field(
        None,
        "attention kernel: sdpa, eager, flex_attention, flash_attention_2 (default: transformers' "
        "choice; with tree_packing, flex_attention on a GPU and the chunked SDPA tree attention on "
        "the CPU, where flex_attention falls back to it with one line in the log)",
    )
    load_in_4bit: bool = config_field(
        False, "QLoRA: load the base in 4-bit NF4 (needs a GPU and bitsandbytes)"
    )
    trust_remote_code: bool = config_field(False, "allow model code from the hub")
    chat_template_kwargs: dict[str, Any] = config_field(
        {},
        "keyword arguments of the chat template, used in training and recorded for evaluation "
        "and detection (Qwen3: {enable_thinking: false} puts its empty think block in the prompt)",
    )
    # --- fincheck: LoRA ---------------------------------------------------------------------
    lora_r: int = config_field(16, "LoRA rank", at_least=1)
    lora_alpha: int = config_field(32, "LoRA scaling numerator (scale = alpha / r)", above=0)
    lora_dropout: float = config_field(0.05, "dropout on the LoRA input", at_least=0, below=1)
    lora_target_modules: list[str] = config_field(
        ["all-linear"], "modules that get adapters: 'all-linear' or names like q_proj,v_proj"
    )
    lora_last_layers: int | None = config_field(
        None,
        "adapters only in the last N decoder layers (PEFT's layers_to_transform); default: every "
        "layer. Backpropagation then stops N layers below the top: on a CPU the backward pass "
        "costs about as much as the forward pass per layer, so half the layers saves a quarter "
        "of a step (docs/performance.md)",
        at_least=1,
    )
    # --- fincheck: data ---------------------------------------------------------------------
    dataset_dir: str = config_field(
        "prepared", "a `fincheck prepare` output: <dir>/<task>/<split>.jsonl and manifest.json"
    )
    data_config: str = config_field(
        "configs/data/all-tasks.yaml", "the task mixture file (tasks, weights, max examples)"
    )
    eval_max_examples: int = config_field(
        256,
        "dev pairs whose loss is evaluated every eval_steps (per task mixture order)",
        at_least=0,
    )
    dev_figures: list[str] = config_field(
        [],
        "tasks whose own figures are computed on the dev split every eval_steps, through the "
        "eval path (QASem ROC-AUC/BAcc, FHSumBench macro P/R/F, FINAL binarized BAcc), logged "
        "as eval_<task>_<figure> (e.g. eval_qasem_auc) and usable as metric_for_best_model",
    )
    dev_figures_limit: dict[str, int] = config_field(
        {},
        "task -> dev pairs for its dev_figures, a seeded sample (QASem: whole documents, about "
        "this many QAs); a task not named: its whole dev split",
    )
    tree_packing: bool = config_field(
        False,
        "train pairs that share a prompt prefix (instructions, document, response sentence) in "
        "one sequence, each shared prefix once, with a tree attention mask and per-pair "
        "positions: the same loss per pair, far fewer tokens (QASem ~8x); needs sdpa, eager or "
        "flex_attention; not with packing/padding_free. Batch sizes then count sequences (packs), "
        "grouped by length and dealt to the processes by tokens.",
    )
    tree_packing_max_tokens: int | None = config_field(
        None,
        "tokens per tree-packed sequence (default: 2 x max_length); a larger tree is split "
        "into pieces that each fit, every pair kept. With flex_attention every row is padded to "
        "it (rounded up to 128): one shape, compiled once.",
        at_least=1,
    )
    overwrite_output_dir: bool = config_field(
        False,
        "start over in an output_dir that holds a run: its checkpoints and adapter are deleted "
        "(without it such a run stops and says to resume or start over)",
    )
    # --- fincheck: precision and schedule ---------------------------------------------------
    precision: Literal["auto", "bf16", "fp16", "fp32"] = config_field(
        "auto",
        "mixed precision: auto = bf16 where the hardware has it (a GPU that supports it, a CPU "
        "with AMX / avx512_bf16 units), else fp32. Sets TRL's bf16/fp16 keys; the base weights "
        "follow it unless torch_dtype says otherwise (LoRA's stay fp32).",
    )
    warmup_ratio: float = config_field(
        0.03,
        "fraction of the steps spent warming up, in [0, 1) (used when warmup_steps is 0)",
        at_least=0,
        below=1,
    )
    release_host_memory: bool = config_field(
        True,
        "after each step, hand the host memory freed by the step back to the OS (glibc "
        "malloc_trim; CPU training on Linux): resident memory then follows the working set "
        "instead of staying at the largest step's",
    )
    # --- TRL / transformers keys with fincheck's defaults -----------------------------------
    max_length: int | None = config_field(
        DEFAULT_TRAINING_WINDOW,
        "tokens per example; longer pairs are trimmed on the grounding text (never the target) "
        "or dropped, and counted",
        at_least=1,
    )
    num_train_epochs: float = config_field(
        2.0, "epochs over the mixture (ignored if max_steps > 0)", above=0
    )
    per_device_train_batch_size: int = config_field(
        4, "examples per process per micro-step", at_least=1
    )
    gradient_accumulation_steps: int = config_field(
        4,
        "micro-steps per optimizer step (global batch = per_device x accumulation x processes)",
        at_least=1,
    )
    learning_rate: float = config_field(2e-4, "peak learning rate", above=0)
    lr_scheduler_type: str = config_field("cosine", "schedule: cosine, linear, constant, ...")
    optim: str = config_field("adamw_torch", "optimizer name as in transformers' TrainingArguments")
    activation_checkpointing: bool | None = config_field(
        None, "recompute activations in the backward pass, non-reentrant (default: on)"
    )
    gradient_checkpointing: bool | None = config_field(
        None, "the older name of activation_checkpointing (either key works)"
    )
    run_name: str | None = config_field(
        "fincheck-sft", "name of the run (wandb and the output folder)"
    )
    output_dir: str | None = config_field(
        None, "where the run goes (default: checkpoints/<run_name>)"
    )
    logging_first_step: bool = config_field(True, "log the first step too")
    save_steps: float = config_field(200, "save a resumable checkpoint every N steps", above=0)
    save_total_limit: int | None = config_field(
        3, "keep at most N checkpoints (oldest removed)", at_least=1
    )
    # (the loggers fincheck keeps its promises with: another library's logger writes its own
    # files by name into the run folder)
    report_to: list[Literal["none", "wandb"]] = config_field(
        ["none"], "loggers: none or wandb (wandb honours WANDB_MODE=offline)"
    )
    disable_tqdm: bool | None = config_field(False, "no progress bar")
    completion_only_loss: bool | None = config_field(
        True, "loss on the completion (the target) only: prompt tokens get no loss"
    )

    def __post_init__(self) -> None:
        # What the recipe declares (defaults and the user's values), before TRL and
        # transformers normalise the fields: recipe.yaml and the resume check use this view.
        self._declared = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        self.output_dir = self.output_dir or f"checkpoints/{self.run_name}"
        if self.warmup_steps == 0 and self.warmup_ratio:
            self.warmup_steps = self.warmup_ratio  # a float in [0, 1) is a ratio of the steps
        if self.eval_steps and str(self.eval_strategy) == "no":
            self.eval_strategy = "steps"
        # load_best_model_at_end: the final adapter is copied from the best checkpoint
        # (`sft.train_and_save`) rather than reloaded into the engine by transformers
        self.final_adapter_from_best = bool(self.load_best_model_at_end)
        self.load_best_model_at_end = False
        if self.packing:
            self.padding_free = True
        if self.tree_packing:
            # the rows are packed by fincheck: TRL must not truncate them to max_length
            self.dataset_kwargs = {**(self.dataset_kwargs or {}), "skip_prepare_dataset": True}
            # the batches take position_ids and tree_end too: the tree collator picks its columns
            self.remove_unused_columns = False
        if self.data_seed is None:
            self.data_seed = self.seed
        if self.activation_checkpointing is None:  # on unless the older key turns it off
            self.activation_checkpointing = self.gradient_checkpointing is not False
        if self.activation_checkpointing_kwargs is None:
            self.activation_checkpointing_kwargs = {"use_reentrant": False}
        adapt_to_machine(self)
        super().__post_init__()

    @property
    def declared(self) -> dict[str, Any]:
        """Every key as the recipe declared it (before TRL's normalisation), JSON-ready."""
        return {k: plain_value(v) for k, v in self._declared.items()}

    @property
    def tree_budget(self) -> int:
        """Tokens per tree-packed sequence."""
        return self.tree_packing_max_tokens or 2 * self.max_length


# transformers' own keys keep their declaration (type, default, help); fincheck gives each of
# these only its range, checked wherever the value comes from and shown in --list-keys.
AT_LEAST_0, ABOVE_0, AT_LEAST_1 = {"at_least": 0}, {"above": 0}, {"at_least": 1}
FRACTION = {"at_least": 0, "below": 1}
SEED = {"at_least": 0, "at_most": 2**32 - 1}  # numpy's seeds, which transformers sets too
INHERITED_RANGES: dict[str, dict[str, float]] = {
    "warmup_steps": AT_LEAST_0, "weight_decay": AT_LEAST_0, "max_grad_norm": AT_LEAST_0,
    "eval_steps": AT_LEAST_0, "seed": SEED, "data_seed": SEED,
    "dataloader_num_workers": AT_LEAST_0, "adam_beta1": FRACTION, "adam_beta2": FRACTION,
    "label_smoothing_factor": FRACTION, "adam_epsilon": ABOVE_0, "logging_steps": ABOVE_0,
    "ddp_timeout": ABOVE_0, "per_device_eval_batch_size": AT_LEAST_1,
    "eval_accumulation_steps": AT_LEAST_1,
}  # fmt: skip
declare_bounds(SFTRecipe, INHERITED_RANGES)


def recipe_defaults() -> dict[str, Any]:
    return {k: plain_value(v) for k, v in config_defaults(SFTRecipe).items()}


def load_recipe(
    path: str | Path | None, overrides: list[str] | dict[str, Any] | None = None
) -> SFTRecipe:
    """Recipe defaults <- YAML file <- `--key=value` overrides, checked (`read_recipe_values`),
    then built for this machine, claiming no folder: what the recipe checks and the levers
    benchmark read (`fincheck train` claims its output folder in between:
    `train/sft.py:load_training_recipe`)."""
    return build_config(SFTRecipe, read_recipe_values(path, overrides))


# Keys naming files of the project (configs/deepspeed/..., configs/data/..., train/assets/...):
# relative to the current directory when they exist there, else to the folder above the recipe
# that holds them (the repository), so a launch from another directory finds them.
PROJECT_PATH_KEYS = ("deepspeed", "data_config", "chat_template_path")


def resolve_project_path(value: str, recipe_path: str | Path | None) -> str:
    """`value` itself when it exists from here (or is absolute), else the same relative path
    under the nearest folder above the recipe that has it."""
    if not value or Path(value).is_absolute() or Path(value).exists() or recipe_path is None:
        return value
    for folder in Path(recipe_path).resolve().parents:
        if (folder / value).exists():
            return str(folder / value)
    return value


def read_recipe_values(
    path: str | Path | None, overrides: list[str] | dict[str, Any] | None = None
) -> dict[str, Any]:
    """The recipe's keys (defaults <- YAML <- overrides), type-checked, without building it for
    this machine: what a CPU machine can check of a GPU recipe."""
    if isinstance(overrides, list):
        overrides = parse_overrides(overrides)
    listing = "`fincheck train --list-keys` lists every key."
    values = {**recipe_defaults(), **config_values(SFTRecipe, path, overrides, listing)}
    for key in PROJECT_PATH_KEYS:
        if isinstance(values[key], str):
            values[key] = resolve_project_path(values[key], path)
    for key in JSON_FILE_KEYS:  # read here, by the one reader (a FIFO is one line, no wait)
        if isinstance(values.get(key), str) and values[key]:
            values[key] = read_json_object(values[key])
    validate_recipe(values)
    return values


# Trainer keys that may name a JSON file, which transformers would otherwise open itself
JSON_FILE_KEYS = ("accelerator_config", "fsdp_config")


def recipe_to_yaml(recipe: SFTRecipe) -> str:
    """The resolved recipe as a user would write it: fincheck's keys, then every TRL key whose
    declared value differs from its default. Reloads to the same recipe."""
    declared, defaults = recipe.declared, recipe_defaults()
    derived = {"use_cpu", "ddp_backend", "bf16", "fp16"}  # decided by the machine and precision
    # the window eval and detect fit prompts to: written even at its default
    always = {"max_length"}
    trl = {f.name for f in dataclasses.fields(SFTConfig)}
    own = [k for k in inspect.get_annotations(SFTRecipe) if k not in trl]  # the keys fincheck adds
    keys = own + [
        k
        for k in declared
        if k not in own and k not in derived and (k in always or declared[k] != defaults.get(k))
    ]
    return yaml.safe_dump({k: declared[k] for k in keys}, sort_keys=False, allow_unicode=True)
