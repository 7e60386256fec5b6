"""The options of a model loaded here, one block for every command that loads one (`fincheck
eval`, `fincheck detect`): each flag means the same in each. A command whose other modes load
no model says which setting reads them (`declare_applies`: eval's `--backend local`)."""

from __future__ import annotations

from dataclasses import dataclass

from fincheck.io.config import config_field
from fincheck.models.loading import LoadOptions
from fincheck.tasks import all_tasks, per_task_budget

_BUDGETS = ",".join(f"{name}={task.max_new_tokens}" for name, task in all_tasks().items())
# the fields that only a model loaded here reads (an endpoint's batching, device and weights
# are the server's own)
LOADED_HERE = ("batch_size", "template_kwargs", "device", "dtype", "trust_remote_code")


@dataclass(kw_only=True)
class ModelOptions(LoadOptions):
    batch_size: int = config_field(8, "prompts per generate call", at_least=1)
    max_new_tokens: dict[str, int] = config_field(
        {},
        f"answer tokens at most: N, or task=N,... (default: {_BUDGETS}, each at most a quarter "
        "of the window)",
        parse=per_task_budget,
    )
    max_input_tokens: int | None = config_field(
        None,
        "prompt tokens at most: longer prompts have their grounding text trimmed (default: the "
        "window -- an adapter's training max_length, capped by the model's positions -- minus "
        "the task's --max-new-tokens)",
        at_least=1,
    )
    overlap_weight: float = config_field(
        0.0,
        "a combined system for QAs: a QA's score becomes sigmoid(logit P(Yes) + W * (overlap "
        "- 1/2)), overlap being the share of the answer's words found in the text; choose W on "
        "dev and report the detector alone (W 0, the default) beside it",
        at_least=0,
    )
