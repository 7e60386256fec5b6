"""The options of `fincheck eval`, `fincheck baseline` and `fincheck score`: each command's flags
are these fields (`fincheck.io.config.add_options`), declared once with their help and default.

An option one mode alone reads says so (`applies`): `--batch-size` with `--backend openai`, or
`--step1` with `--method e2e`, is an error naming the flag, never silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from fincheck.data.pairs import EVAL_SAMPLE_SEED, Pair, sample
from fincheck.errors import FincheckError
from fincheck.eval.baselines.final_methods import check_step1
from fincheck.eval.baselines.registry import ASKS_NO_LLM, METHODS
from fincheck.inference.generation import parse_dtype
from fincheck.io.config import REQUIRED, config_field, declare_applies
from fincheck.model_options import LOADED_HERE, ModelOptions
from fincheck.models.known import KNOWN as FETCHABLE_MODELS
from fincheck.models.llm_clients import DEFAULT_KEY_ENV, DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT_S
from fincheck.tasks import get_task, per_task_numbers, per_task_thresholds, task_names
from fincheck.tasks.prepared import prepared_tasks, read_split

LOCAL = {"backend": ("local",)}
ENDPOINT = {"backend": ("openai",)}


def parse_tasks(text: str) -> tuple[str, ...]:
    tasks = tuple(t.strip() for t in text.split(",") if t.strip())
    unknown = [t for t in tasks if t not in task_names()]
    if unknown or not tasks:
        raise FincheckError(f"unknown task(s) {unknown}; choose from {','.join(task_names())}")
    return tasks


@dataclass(kw_only=True)
class EvalRun:
    """What every model run over prepared pairs shares: the data, the output folder, the sample."""

    data_dir: Path = config_field(
        REQUIRED, "prepared data directory (`fincheck prepare --out`)", flag="data"
    )
    out_dir: Path = config_field(
        REQUIRED, "run directory; predictions go to OUT/predictions/", flag="out"
    )
    tasks: tuple[str, ...] | None = config_field(
        None,
        f"comma-separated tasks, of {','.join(task_names())} (default: every task the prepared "
        "folder holds)",
        parse=parse_tasks,
    )
    split: Literal["dev", "test"] = config_field("test", "split to evaluate")
    limit: int | dict[str, int] | None = config_field(
        None,
        "a seeded random sample of N examples per task, or task=N,... (the tasks not named: all "
        "their examples); QASem's N draws whole reference documents, about N QAs (default: all)",
        parse=per_task_numbers,
    )
    sample_seed: int = config_field(EVAL_SAMPLE_SEED, "seed of the --limit sample")
    progress: bool = config_field(True, "no progress bars")

    @property
    def predictions_dir(self) -> Path:
        return self.out_dir / "predictions"

    def resolve_tasks(self) -> tuple[str, ...]:
        """--tasks, or every registered task the prepared folder holds."""
        if self.tasks is None:
            self.tasks = tuple(prepared_tasks(self.data_dir))
        return self.tasks

    def sample(self, task: str, split: str | None = None) -> list[Pair]:
        """The run's sample of a task's split (default: --split): `--limit` pairs drawn with
        `--sample-seed`, as whole documents for a task that shares them (QASem: a sample keeps
        the prefix tree's speed)."""
        pairs = read_split(self.data_dir, task, split or self.split)
        limit = self.limit.get(task) if isinstance(self.limit, dict) else self.limit
        return sample(pairs, limit, self.sample_seed, get_task(task).limit_by_document)

    def sample_by(self, tasks) -> dict[str, str]:
        """How --limit samples each task (recorded: a resume must draw the same sample)."""
        return {t: "documents" if get_task(t).limit_by_document else "pairs" for t in tasks}


# The one options block of an OpenAI-compatible endpoint (api.openai.com, vLLM, `transformers
# serve`, ...), written out twice: as the endpoint of eval and baseline, and under the prefix
# judge_ as `fincheck score`'s judge (--judge-base-url, ...). `build_client` reads either by
# its caller's prefix.
RETRIES_HELP = (
    "retries on 429/5xx/timeouts/connection errors, honouring Retry-After (4: an endpoint that "
    "never answers gives a one-line error within about five minutes)"
)
KEY_HELP = "environment variable holding {}'s API key; the key is never written anywhere"
URL_HELP = "OpenAI-compatible base URL of {} (default: api.openai.com)"
TIMEOUT_HELP = "seconds per call to {} (raise it for a slow server writing long answers)"


@dataclass(kw_only=True)
class Endpoint:
    base_url: str | None = config_field(None, URL_HELP.format("the endpoint"), applies=ENDPOINT)
    api_key_env: str = config_field(
        DEFAULT_KEY_ENV, KEY_HELP.format("the endpoint"), applies=ENDPOINT
    )
    timeout: float = config_field(
        DEFAULT_TIMEOUT_S, TIMEOUT_HELP.format("the endpoint"), applies=ENDPOINT, above=0
    )
    max_retries: int = config_field(DEFAULT_MAX_RETRIES, RETRIES_HELP, applies=ENDPOINT, at_least=0)


@dataclass(kw_only=True)
class EvalOptions(ModelOptions, Endpoint, EvalRun):
    """`fincheck eval`: a detector's predictions, run here (a model and its adapter) or served."""

    backend: Literal["local", "openai"] = config_field(
        "local",
        "where the detector runs: local (--model and --adapter loaded here), or openai (a served "
        "detector: fincheck's task prompts sent to the endpoint's --model -- vLLM, llama.cpp, "
        "`transformers serve` -- QASem's P(Yes) from its logprobs when it returns them)",
    )
    model: str | None = config_field(
        None,
        "base model name or path (default: the adapter's recorded base); with --backend openai "
        "the served model's name",
    )
    adapter: str | None = config_field(
        None, "LoRA adapter directory (from `fincheck train`)", applies=LOCAL
    )
    prefix_reuse: bool = config_field(
        True,
        "the plain generate path, every prompt whole (for comparison and debugging): by default "
        "each prefix that prompts share (the task's instructions, a document, a response "
        "sentence) runs once into a KV cache, and QASem's P(Yes) needs no generation",
        applies=LOCAL,
    )
    tokenizer: str | None = config_field(
        None,
        "fit a served detector's prompts to the window as a local eval does: an adapter's run "
        "folder (its tokenizer, training length and template kwargs) or the served model's "
        "tokenizer (folder or name; window: its positions, or --window) (default: prompts sent "
        "whole, answers at the task's default budget)",
        applies=ENDPOINT,
    )
    concurrency: int = config_field(8, "requests in flight", applies=ENDPOINT, at_least=1)


declare_applies(EvalOptions, LOADED_HERE, LOCAL)


LLM = {"method": tuple(m for m in METHODS if m not in ASKS_NO_LLM)}
LOCAL_LLM = {**LOCAL, **LLM}


def parse_method(text: str) -> str:
    if text not in METHODS:
        raise FincheckError(f"{text!r} is not one of {', '.join(METHODS)}")
    return text


@dataclass(kw_only=True)
class BaselineOptions(Endpoint, EvalRun):
    """`fincheck baseline`: a paper's system run with any LLM (docs/baselines.md)."""

    method: str = config_field(
        REQUIRED,
        f"one of {', '.join(METHODS)}. e2e, e2e-fewshot, e2e-cot: every task that ships the "
        "paper's prompt; pipeline, two-step: FINAL; fizz: FINAL and FHSumBench; overlap: QASem, "
        "no model (the share of the answer's words found in the reference)",
        parse=parse_method,
    )
    model: str | None = config_field(
        None,
        "the LLM that runs the method: a local model, or the endpoint's model name",
        applies=LLM,
    )
    backend: Literal["local", "openai"] = config_field(
        "local",
        "where --model runs: local, or openai (any OpenAI-compatible endpoint)",
        applies=LLM,
    )
    concurrency: int = config_field(
        8, "examples in flight (a local model batches their calls)", applies=LLM, at_least=1
    )
    max_tokens: int = config_field(
        512,
        "answer tokens per call, reasoning included",
        flag="llm_max_tokens",
        applies=LLM,
        at_least=1,
    )
    step1: str = config_field(
        "self",
        "two-step, step 1: self (the model's binary CoT), oracle (the gold label), or a "
        "fincheck adapter folder",
        applies={"method": ("two-step",)},
    )
    step2: Literal["cot", "cot-hint"] = config_field(
        "cot", "two-step, step 2", applies={"method": ("two-step",)}
    )
    nli_model: str | None = config_field(
        None, "fizz: a Hugging Face NLI sequence classifier", applies={"method": ("fizz",)}
    )
    nli_labels: tuple[str, ...] | None = config_field(
        None,
        "fizz: the NLI model's three labels in its output order, for a model saved without "
        "label names (LABEL_0..2), e.g. entailment,contradiction,neutral (named labels, also "
        "SUPPORTS/REFUTES/NOT ENOUGH INFO, are read from the model's config)",
        parse=lambda text: tuple(text.split(",")),
        applies={"method": ("fizz",)},
    )
    device: str | None = config_field(
        None,
        "cpu, cuda, cuda:1 ... for what runs here: the local model, FIZZ's NLI model, a two-step "
        "adapter (default: cuda when available)",
        applies=[LOCAL_LLM, {"method": ("fizz", "two-step")}],
    )
    window: int | None = config_field(
        None,
        "tokens the local model may see (default: its positions); longer prompts are trimmed",
        applies=LOCAL_LLM,
        at_least=1,
    )
    dtype: str = config_field(
        "auto",
        "the local model's weights dtype: auto, bf16, fp16, fp32 (auto: bf16 on a GPU that has "
        "it, else fp32; on a CPU with bf16 units bf16 generates faster, docs/performance.md)",
        parse=parse_dtype,
        applies=LOCAL_LLM,
    )

    def __post_init__(self) -> None:
        if self.method == "two-step":
            check_step1(self.step1)  # a typo fails before any model loads


def judge_kind(judge: str | None, model: str | None, base_url: str | None) -> str:
    """The judge backend the options name. A base URL or a judge model never goes unused: given
    without --judge they choose it, and with --judge none they are an error. A judge model that
    is a folder or a name `fincheck models list` shows runs here; any other name is an API's."""
    if judge is None:
        if base_url:
            return "openai"
        if model:
            local = Path(model).is_dir() or model in FETCHABLE_MODELS
            return "local" if local else "openai"
        return "none"
    if judge == "none" and (model or base_url):
        given = "--judge-base-url" if base_url else "--judge-model"
        raise FincheckError(f"{given} was given with --judge none: drop one of them")
    if judge == "local" and base_url:
        raise FincheckError("--judge-base-url is for --judge openai, not --judge local")
    return judge


JUDGED = {"judge_kind": ("openai", "local")}
JUDGE_API = {"judge_kind": ("openai",)}
JUDGE_LOCAL = {"judge_kind": ("local",)}


@dataclass(kw_only=True)
class JudgeEndpoint:
    judge_base_url: str | None = config_field(None, URL_HELP.format("the judge"), applies=JUDGE_API)
    judge_api_key_env: str = config_field(
        DEFAULT_KEY_ENV, KEY_HELP.format("the judge"), applies=JUDGE_API
    )
    judge_timeout: float = config_field(
        DEFAULT_TIMEOUT_S, TIMEOUT_HELP.format("the judge"), applies=JUDGE_API, above=0
    )
    judge_max_retries: int = config_field(
        DEFAULT_MAX_RETRIES, RETRIES_HELP, applies=JUDGE_API, at_least=0
    )


@dataclass
class ScoreOptions(JudgeEndpoint):
    """`fincheck score`: predictions against the gold, with a judge for FINAL's matching."""

    data_dir: Path = config_field(REQUIRED, "prepared data directory (the gold)", flag="data")
    predictions_dir: Path = config_field(
        REQUIRED, "directory with <task>.jsonl predictions", flag="predictions"
    )
    out_dir: Path = config_field(
        REQUIRED, "where results.json, report.md, plots/ and scored/ go", flag="out"
    )
    tasks: tuple[str, ...] | None = config_field(
        None, "tasks to score (default: every task with a predictions file)", parse=parse_tasks
    )
    split: Literal["dev", "test"] = config_field("test", "gold split")
    judge_kind: Literal["none", "openai", "local"] | None = config_field(
        None,
        "FINAL matching judge: none, openai or local (default: openai with --judge-base-url, "
        "else as --judge-model says, else none = FINAL P/R/F1 not computed)",
        flag="judge",
    )
    judge_model: str | None = config_field(
        None,
        "judge model: an endpoint's model name (openai), or a folder or fetchable name (local)",
    )
    judge_prompt: Literal["paper", "strict", "direct"] = config_field(
        "paper",
        "FINAL matching criteria: paper = the FINAL paper's (prompt E.4); strict = also no match "
        "for omissions and multi-fact descriptions; direct = the paper's criteria answered with "
        "the JSON object alone, no reasoning (for a small local judge); the variants are named "
        "in the report",
        applies=JUDGED,
    )
    judge_concurrency: int = config_field(8, "judge calls in flight", applies=JUDGED, at_least=1)
    judge_max_tokens: int = config_field(
        1024, "answer budget per judge call, reasoning included", applies=JUDGED, at_least=1
    )
    judge_cache: Path | None = config_field(
        None, "judge answer cache (default: OUT/judge_cache.jsonl)", applies=JUDGED
    )
    judge_dtype: str = config_field(
        "auto",
        "a local judge's weights dtype: auto, bf16, fp16, fp32 (auto: bf16 on a GPU that has "
        "it, else fp32)",
        parse=parse_dtype,
        applies=JUDGE_LOCAL,
    )
    judge_sanity: bool = config_field(
        True,
        "skip the judge sanity set (by default the judge also matches 15 descriptions of known "
        "answer, 12 calls, cached, and its agreement is printed beside FINAL's figures)",
        applies=JUDGED,
    )
    judge_check: Path | None = config_field(
        None,
        "measure the judge on this set instead of the built-in one: FINAL items matched by "
        "hand, one JSON object a line {summary, predicted, gold, expected: {predicted letter: "
        "gold letter or null}}; its agreement and match precision/recall are recorded beside "
        "FINAL's figures",
        applies=JUDGED,
    )
    max_judge_failure_rate: float = config_field(
        0.02,
        "exit 3 when a larger share of the FINAL examples needing the judge got no usable answer",
        applies=JUDGED,
        at_least=0,
        at_most=1,
    )
    bootstrap_resamples: int = config_field(
        1000, "bootstrap resamples for the CIs", flag="bootstrap", at_least=0
    )
    seed: int = config_field(0, "bootstrap seed")
    thresholds: dict[str, float] = config_field(
        {},
        "task=T,...: a decision threshold on a task's p_yes, chosen on dev (a dev run's report "
        "and results.json give the one that maximises its BAcc): QASem's BAcc at it comes "
        "beside the paper's at 0.5; FINAL's lists whose flag score is below it are held back "
        "(every FINAL figure is then the thresholded detector's, labelled)",
        flag="threshold",
        parse=per_task_thresholds,
    )
    report_to: Literal["none", "wandb"] = config_field(
        "none", "also log results and the report to wandb (WANDB_MODE=offline works)"
    )
    wandb_project: str = config_field(
        "fincheck", "wandb project", applies={"report_to": ("wandb",)}
    )
    progress: bool = config_field(True, "no progress bars")
    judge: Any = config_field(None, "", cli=False)  # the MatchingJudge the judge_* options build

    def __post_init__(self) -> None:
        # resolved here, so that the judge options it leaves unread are refused (`applies`)
        self.judge_kind = judge_kind(self.judge_kind, self.judge_model, self.judge_base_url)
        if self.judge_check and not self.judge_sanity:
            raise FincheckError(
                "--judge-check names the set the judge is measured on, --no-judge-sanity skips "
                "that measurement: drop one of them"
            )
