"""A recipe's checks beyond the types of its keys: what the keys mean together (tree packing and
the options it cannot honour, dev figures and the best checkpoint, files that must exist), run
on the values before the recipe is built, so a CPU machine can check a GPU recipe."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from fincheck.errors import FincheckError
from fincheck.inference.generation import parse_dtype
from fincheck.io.jsonl import check_shape, read_json_object
from fincheck.io.messages import library_errors_as_one_line
from fincheck.io.secrets import secret_places
from fincheck.tasks import check_task_names, get_task


def validate_recipe(values: dict[str, Any]) -> None:
    """Checks beyond the types, on the recipe's values (see `read_recipe_values`)."""
    parse_dtype(values["torch_dtype"])
    if places := secret_places(values):
        raise FincheckError(
            f"{', '.join(places)}: a token in a recipe would be written to recipe.yaml, every "
            "checkpoint's training_args.bin, the wandb config and a published model card; log in "
            "with `huggingface-cli login` or set HF_TOKEN in the environment instead"
        )
    if values.get("push_to_hub"):
        raise FincheckError(
            "push_to_hub: true: the trainer would upload the whole run folder, unchecked; train, "
            "then publish the adapter with `fincheck publish` (its card, its secret scan, its "
            "deadline)"
        )
    if values["max_length"] is None or values["max_length"] < 64:
        raise FincheckError(f"max_length={values['max_length']}: too short for prompt + target")
    if values["deepspeed"]:
        check_deepspeed_config(values["deepspeed"])
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


def check_deepspeed_config(config: str | dict) -> None:
    """The DeepSpeed config a recipe names (a JSON file, or a mapping in the recipe), read by
    fincheck before DeepSpeed reads it: no JSON, no object, a batch size that is neither a
    number nor "auto", or ZeRO options DeepSpeed's own model refuses, is one line naming it
    (DeepSpeed would stop every rank with its own traceback)."""
    where = config if isinstance(config, str) else "deepspeed (the recipe's mapping)"
    if isinstance(config, str):
        if not Path(config).is_file():
            raise FincheckError(f"deepspeed config not found: {config}")
        config = read_json_object(config)
    check_shape(config, {"zero_optimization": dict, **dict.fromkeys(BATCH_KEYS, (int, str))}, where)
    if others := sorted(set(config) - DEEPSPEED_KEYS):
        raise FincheckError(
            f"{where}: {', '.join(others)}: not read by fincheck's DeepSpeed runs (they may set "
            f"{', '.join(sorted(DEEPSPEED_KEYS))}); monitors, profilers and the like write files "
            "of their own outside the run folder: drop them"
        )
    if places := secret_places(config):
        raise FincheckError(f"{where}: {', '.join(places)}: a token in a DeepSpeed config")
    for key in BATCH_KEYS:
        if isinstance(config.get(key), str) and config[key] != "auto":
            raise FincheckError(f'{where}: {key} is {config[key]!r}, not a number or "auto"')
    zero = config.get("zero_optimization") or {}
    if zero.get("stage", 0) not in (0, 1, 2, 3):
        raise FincheckError(f"{where}: zero_optimization.stage is {zero['stage']}, not 0-3")
    for offload in ("offload_optimizer", "offload_param"):  # NVMe: files at a path of its own
        placed = zero.get(offload) if isinstance(zero.get(offload), dict) else {}
        device = placed.get("device", "none")
        if device not in ("none", "cpu") or "nvme_path" in placed:
            raise FincheckError(
                f"{where}: zero_optimization.{offload} offloads to {device!r}: fincheck's runs "
                'offload to "cpu" or "none" (an NVMe offload writes outside the run folder)'
            )
    if importlib.util.find_spec("deepspeed") is not None:  # its own model of the ZeRO options
        from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

        with library_errors_as_one_line(f"{where}: zero_optimization", "see DeepSpeed's docs"):
            DeepSpeedZeroConfig(**zero)


# The batch keys a DeepSpeed config may set (to a number, or "auto": the recipe's)
BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
# What a DeepSpeed config may set: the numerics, the batch and ZeRO, the optimizer and schedule.
DEEPSPEED_KEYS = {
    *BATCH_KEYS,
    *("zero_optimization", "bf16", "fp16", "gradient_clipping", "optimizer", "scheduler"),
    *("steps_per_print", "wall_clock_breakdown", "zero_allow_untested_optimizer"),
    *("zero_force_ds_cpu_optimizer", "communication_data_type", "prescale_gradients"),
    "gradient_predivide_factor",
}


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


# The mean over the dev tasks of each one's `Task.choose_by` figure (QASem AUC, FHSumBench F,
# FINAL's flag ROC-AUC), computed by train/dev_eval.py: what a several-task recipe keeps its
# best adapter by.
TASKS_MEAN = "tasks_mean"


def evaluation_metric_names(dev_figures: list[str]) -> list[str]:
    """What an evaluation reports, without the eval_ prefix: the loss, and each dev_figures
    task's headline figures (`Task.compare_metrics`, e.g. qasem_auc)."""
    figures = [f"{t}_{key}" for t in dev_figures for key in get_task(t).dev_metrics]
    mean = [TASKS_MEAN] if len(dev_figures) > 1 else []
    return ["loss", *figures, *mean]
