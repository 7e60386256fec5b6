"""The training recipe: TRL's `SFTConfig` plus fincheck's own keys, one YAML file of them,
`--key=value` overrides.

`SFTRecipe` subclasses `trl.SFTConfig`, so every Trainer and TRL option (`use_liger_kernel`,
`neftune_noise_alpha`, `lr_scheduler_kwargs`, ...) is a recipe key with no code change; fincheck
adds only what TRL does not know (the base model and tokenizer, LoRA, the prepared data and its
mixture, a precision switch) and sets its own defaults for a few TRL keys. Keys are checked
against the dataclass: an unknown key or a wrong type stops with the file, the key and a
did-you-mean (`fincheck train --list-keys` lists all of them with their help).

The recipe adapts itself to the machine when it is built (`__post_init__`): on a machine without
a GPU it trains on the CPU (`use_cpu`; DeepSpeed and DDP over gloo), `precision: auto` is bf16
where the hardware has it (a GPU that supports it, a CPU with bf16 units) and fp32 elsewhere, and tree
packing trains with FlexAttention on a GPU and the chunked SDPA tree attention on the CPU.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from trl import SFTConfig

from fincheck.config import (
    build_config,
    config_defaults,
    config_field,
    config_values,
    parse_overrides,
    plain_value,
)
from fincheck.errors import FincheckError
from fincheck.inference import parse_dtype
from fincheck.secrets import secret_places
from fincheck.tasks import check_task_names, get_task
from fincheck.train.tree_attention import tree_attention_for

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
        2048,
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
    report_to: list[str] = config_field(
        ["none"], "loggers: none, wandb, tensorboard (wandb honours WANDB_MODE=offline)"
    )
    disable_tqdm: bool | None = config_field(False, "no progress bar")
    completion_only_loss: bool | None = config_field(
        True, "loss on the completion (the target) only: prompt tokens get no loss"
    )
    # --- transformers' own keys, declared again for their ranges (same defaults) -------------
    warmup_steps: float = config_field(
        0, "linear warmup: steps, or a fraction of all steps when below 1", at_least=0
    )
    weight_decay: float = config_field(0.0, "AdamW weight decay", at_least=0)
    adam_beta1: float = config_field(0.9, "AdamW beta1", at_least=0, below=1)
    adam_beta2: float = config_field(0.999, "AdamW beta2", at_least=0, below=1)
    adam_epsilon: float = config_field(1e-8, "AdamW epsilon", above=0)
    max_grad_norm: float = config_field(1.0, "gradient clipping norm (0: none)", at_least=0)
    label_smoothing_factor: float = config_field(0.0, "label smoothing", at_least=0, below=1)
    logging_steps: float = config_field(
        10, "log every N steps (a fraction of all steps when below 1)", above=0
    )
    eval_steps: float | None = config_field(
        None, "dev loss every N steps (0 or unset: none)", at_least=0
    )
    per_device_eval_batch_size: int = config_field(8, "dev batch per process", at_least=1)
    eval_accumulation_steps: int | None = config_field(
        None, "dev steps gathered before moving to the CPU", at_least=1
    )
    seed: int = config_field(42, "seed of the run (torch, numpy, random)", at_least=0)
    data_seed: int | None = config_field(None, "seed of the data order (default: seed)", at_least=0)
    dataloader_num_workers: int = config_field(0, "data loading worker processes", at_least=0)
    ddp_timeout: int = config_field(
        1800, "seconds torch.distributed waits for the other processes", above=0
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
        if self.activation_checkpointing is None:
            self.activation_checkpointing = (
                True if self.gradient_checkpointing is None else self.gradient_checkpointing
            )
        if self.activation_checkpointing_kwargs is None:
            self.activation_checkpointing_kwargs = {"use_reentrant": False}
        self._adapt_to_machine()
        super().__post_init__()

    def _adapt_to_machine(self) -> None:
        """Precision, tree packing's attention kernel and the process-group backend for this
        machine (see the module docstring)."""
        import torch

        gpu = torch.cuda.is_available() and not self.use_cpu  # use_cpu: a CPU run on a GPU box
        precision = self.precision
        explicit = [n for n, on in (("bf16", self.bf16 is True), ("fp16", bool(self.fp16))) if on]
        if precision == "auto":  # TRL's own bf16/fp16 keys, else what the machine does best
            # bf16 where the hardware has it: on a CPU with bf16 units it trained 1.5x (SmolLM2-
            # 135M) and 2.3x (Qwen2.5-0.5B) the tokens/s of fp32 (docs/performance.md)
            has_bf16 = torch.cuda.is_bf16_supported() if gpu else cpu_has_bf16()
            precision = explicit[0] if explicit else ("bf16" if has_bf16 else "fp32")
        elif any(name != precision for name in explicit):
            raise FincheckError(f"precision={precision} but {explicit} is set: use only precision")
        if not gpu and precision == "fp16":
            raise FincheckError("precision=fp16 needs a GPU; use --precision=fp32 on the CPU")
        if not gpu and precision == "bf16" and not cpu_has_bf16():
            raise FincheckError(
                "precision=bf16 needs a GPU or a CPU with bf16 units (AMX / avx512_bf16); "
                "use --precision=fp32"
            )
        self.bf16, self.fp16 = precision == "bf16", precision == "fp16"
        self.attention_note = None  # said once in the log when the kernel is not the one named
        if self.tree_packing:
            self.attn_implementation, self.attention_note = tree_attention_for(
                self.attn_implementation, gpu
            )
        if not gpu:
            # accelerate then counts the processes torch.distributed already has (without it
            # TRL's metric gathers fail with `expected length 2, got 1`).
            self.use_cpu = True
            if int(os.environ.get("WORLD_SIZE", "1")) > 1 or self.deepspeed:
                self.ddp_backend = "gloo"  # DeepSpeed always runs in a process group

    @property
    def declared(self) -> dict[str, Any]:
        """Every key as the recipe declared it (before TRL's normalisation), JSON-ready."""
        return {k: plain_value(v) for k, v in self._declared.items()}

    @property
    def tree_budget(self) -> int:
        """Tokens per tree-packed sequence."""
        return self.tree_packing_max_tokens or 2 * self.max_length


def cpu_has_bf16() -> bool:
    """AMX or avx512_bf16 on this CPU (Linux /proc/cpuinfo flags)."""
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


# Keys that may change when a run is resumed: where it writes, how often it logs/saves, how
# long it runs (a longer run also stretches the lr schedule from the resume point on), the
# machine-derived ones. Anything else (base model, LoRA shape, data, optimiser, layout) must
# match.
RESUMABLE_CHANGES = frozenset(
    {
        "max_steps",
        "num_train_epochs",
        "output_dir",
        "run_name",
        "resume_from_checkpoint",
        "report_to",
        "dataloader_num_workers",
        "per_device_eval_batch_size",
        "eval_max_examples",
        "dev_figures",
        "dev_figures_limit",
        "dataset_dir",
        "disable_tqdm",
        "overwrite_output_dir",
        "use_cpu",
        "ddp_backend",
        "local_rank",
        "release_host_memory",
    }
)
RESUMABLE_PREFIXES = ("logging_", "save_", "eval_", "hub_", "push_to_hub", "dataloader_")


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
    validate_recipe(values)
    return values


def validate_recipe(values: dict[str, Any]) -> None:
    """Checks beyond the types, on the recipe's values (see `read_recipe_values`)."""
    parse_dtype(values["torch_dtype"])
    if places := secret_places(values):
        raise FincheckError(
            f"{', '.join(places)}: a token in a recipe would be written to recipe.yaml, every "
            "checkpoint's training_args.bin, the wandb config and a published model card; log in "
            "with `huggingface-cli login` or set HF_TOKEN in the environment instead"
        )
    if values["max_length"] is None or values["max_length"] < 64:
        raise FincheckError(f"max_length={values['max_length']}: too short for prompt + target")
    if values["lora_r"] <= 0:
        raise FincheckError(f"lora_r={values['lora_r']}: must be positive")
    if isinstance(values["deepspeed"], str) and not Path(values["deepspeed"]).is_file():
        raise FincheckError(f"deepspeed config not found: {values['deepspeed']}")
    if values["chat_template_path"] and not Path(values["chat_template_path"]).is_file():
        raise FincheckError(f"chat template not found: {values['chat_template_path']}")
    check_evaluation_keys(values)
    for task, limit in (values.get("dev_figures_limit") or {}).items():
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise FincheckError(
                f"dev_figures_limit: {task}={limit!r}: a dev sample needs at least 1 pair (to "
                "compute no dev figures for a task, leave it out of dev_figures)"
            )
    if values["tree_packing"]:
        if values["packing"] or values["padding_free"]:
            raise FincheckError(
                "tree_packing and packing/padding_free are two ways of packing: choose one"
            )
        budget = values["tree_packing_max_tokens"]
        if budget is not None and budget < values["max_length"]:
            raise FincheckError(
                f"tree_packing_max_tokens={budget} < max_length={values['max_length']}: a pair "
                "of max_length tokens would not fit in a packed sequence"
            )
        # options whose loss or batches tree packing would silently not honour
        unsupported = {
            "loss_type": ("nll", values["loss_type"]),
            "label_smoothing_factor": (0.0, values["label_smoothing_factor"]),
            "use_liger_kernel": (False, values["use_liger_kernel"]),
            "assistant_only_loss": (False, values["assistant_only_loss"]),
        }
        changed = [f"{k}={v!r}" for k, (default, v) in unsupported.items() if v != default]
        if changed:
            raise FincheckError(
                f"tree_packing computes the loss itself (per-target NLL, logits at the target "
                f"positions only): it does not honour {', '.join(changed)}; drop them or set "
                "tree_packing: false"
            )
        if values["attn_implementation"] not in (None, "sdpa", "eager", "flex_attention"):
            raise FincheckError(
                f"tree_packing needs an attention kernel that takes a custom mask (sdpa, eager, "
                f"flex_attention), not attn_implementation={values['attn_implementation']}"
            )


def check_evaluation_keys(values: dict[str, Any]) -> None:
    """Dev figures and the best checkpoint need evaluations, at checkpoint steps."""
    if values["dev_figures"]:
        check_task_names(values["dev_figures"], "dev_figures")
    unlisted = [t for t in values["dev_figures_limit"] if t not in values["dev_figures"]]
    if unlisted:
        raise FincheckError(f"dev_figures_limit names {unlisted}, which dev_figures does not")
    if values["dev_figures"] and not values["eval_steps"]:
        raise FincheckError("dev_figures are computed at evaluations: set eval_steps")
    if values["eval_steps"] and values["eval_max_examples"] <= 0:
        raise FincheckError(
            "eval_steps needs dev pairs for the eval loss: set eval_max_examples >= 1"
        )
    metric = values["metric_for_best_model"]
    if metric:
        known = evaluation_metric_names(values["dev_figures"])
        if metric.removeprefix("eval_") not in known:
            raise FincheckError(
                f"metric_for_best_model={metric!r} is not computed by this recipe: name "
                f"one of {known} (a task's figures need that task in dev_figures)"
            )
    if values["load_best_model_at_end"]:
        if not metric:
            raise FincheckError(
                "load_best_model_at_end needs metric_for_best_model (e.g. qasem_auc with "
                "dev_figures: [qasem], or loss)"
            )
        allowed = {"eval_strategy": ("steps", "no"), "save_strategy": ("steps",)}  # no: eval_steps
        for key, ok in allowed.items():
            value = getattr(values[key], "value", values[key])  # an enum from TRL's types
            if value not in ok:
                raise FincheckError(
                    f"load_best_model_at_end: {key}={value!r}; fincheck evaluates and "
                    "saves by steps (eval_steps a multiple of save_steps), set it to 'steps'"
                )
        save, every = values["save_steps"], values["eval_steps"]
        if not every or every % save:
            raise FincheckError(
                f"load_best_model_at_end: eval_steps={every} must be a multiple of save_steps="
                f"{save}, so that every evaluation, the best one too, has a checkpoint"
            )


def evaluation_metric_names(dev_figures: list[str]) -> list[str]:
    """What an evaluation reports, without the eval_ prefix: the loss, and each dev_figures
    task's headline figures (`Task.compare_metrics`, e.g. qasem_auc)."""
    figures = [f"{t}_{key}" for t in dev_figures for key, _ in get_task(t).compare_metrics]
    return ["loss", *figures]


def recipe_to_yaml(recipe: SFTRecipe) -> str:
    """The resolved recipe as a user would write it: fincheck's keys, then every TRL key whose
    declared value differs from its default. Reloads to the same recipe."""
    declared, defaults = recipe.declared, recipe_defaults()
    derived = {"use_cpu", "ddp_backend", "bf16", "fp16"}  # decided by the machine and precision
    trl = {f.name for f in dataclasses.fields(SFTConfig)}
    own = [k for k in inspect.get_annotations(SFTRecipe) if k not in trl]  # the keys fincheck adds
    keys = own + [
        k for k in declared if k not in own and k not in derived and declared[k] != defaults.get(k)
    ]
    return yaml.safe_dump({k: declared[k] for k in keys}, sort_keys=False, allow_unicode=True)


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
