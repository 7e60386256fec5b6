"""The model card: YAML metadata the hub indexes, and a README people read.

The metadata is built as a dict and dumped with huggingface_hub's `ModelCardData` (so the
model-index has the exact shape the hub validates); the prose lives in `templates/model_card.md`.
Evaluation numbers come from `results.json` (written by `fincheck score`), flattened to
(task, subset, metric, value) rows and printed beside the papers' numbers each task declares
(`fincheck.tasks`, `Task.paper_numbers`).
"""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import yaml
from markupsafe import Markup

from fincheck.errors import FincheckError
from fincheck.io.jsonl import read_json_record
from fincheck.io.messages import library_errors_as_one_line
from fincheck.io.runs import RunArtifacts
from fincheck.serve.llama_cpp_converter import gguf_name
from fincheck.tasks import all_tasks, get_task, task_names

TEMPLATE_PATH = Path(__file__).parent / "templates" / "model_card.md"
REVISION = re.compile(r"[\w.\-/]{1,200}")  # a commit hash or a branch name


# ------------------------------------------------------------------ values are data, not code
# Every value that reaches the card is either checked against its grammar (a hub repo id, a
# revision) or escaped for the place it lands (prose, a code span, a fenced block): nothing
# read from a run folder or a flag is spliced into the card's markdown or its code.


def hub_repo_id(value: str, what: str) -> None:
    """Nothing if `value` is a hub repo id (ORG/NAME: letters, digits, '-', '_', '.'), else a
    one-line error naming `what` (the flag or file it came from)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        if not isinstance(value, str) or value.count("/") != 1:
            raise HFValidationError("expected exactly one '/'")
        validate_repo_id(value)
    except HFValidationError as error:
        reason = " ".join(str(error).split())
        raise FincheckError(
            f"{what} {value!r} is not a valid hub repo id (ORG/NAME or USER/NAME; letters, "
            f"digits, '-', '_', '.'): {reason}"
        ) from None


def code_fence(text: str) -> str:
    """A backtick fence longer than any backtick run inside `text`, so the text cannot close
    the block it is shown in."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def code_span(value: Any) -> str:
    """`value` as inline code that nothing inside it can end (one line)."""
    text = " ".join(str(value).split())
    ticks = "`" * (max((len(r) for r in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def prose(value: Any) -> str:
    """Free text (a base's origin) as inert markdown: one line, HTML escaped, markdown's
    punctuation backslash-escaped."""
    text = html.escape(" ".join(str(value).split()), quote=False)
    return re.sub(r"([\\`*_{}\[\]()#+!|~])", r"\\\1", text)


@dataclass(frozen=True)
class MetricRow:
    task: str
    subset: str | None
    metric: str
    value: float
    ci95: tuple[float, float] | None = None
    n: int | None = None  # items behind the figure
    of: int | None = None  # items in the evaluated split (the task's), when known
    threshold: float | None = None  # the p_yes threshold chosen on dev the figure is at

    @property
    def label(self) -> str:
        """The metric as the card names it: with the dev threshold it depends on."""
        if self.threshold is None:
            return self.metric
        return f"{self.metric} at the dev threshold {self.threshold:g}"

    @property
    def is_sample(self) -> bool:
        """Computed on part of the split (`fincheck eval --limit`): not a test-set figure."""
        return (
            self.of is not None and self.n is not None and self.subset is None and self.n < self.of
        )


def metrics_from_results(results: dict[str, Any]) -> list[MetricRow]:
    """The card's rows from results.json (`{"tasks": {task: figures}}`, as `fincheck score`
    writes it; a bare `{task: figures}` is accepted too).

    Figures are either flat (`{"f1": x, "ci95": {"f1": [lo, hi]}}`) or per subset
    (`{"cliff": {"bacc": x, ...}, "overall": {...}}`, QASem). Undefined figures (null) are skipped.
    """
    root = results.get("tasks", results)
    counts = results.get("counts") if isinstance(results.get("counts"), dict) else {}
    rows: list[MetricRow] = []
    for task in all_tasks():
        section = root.get(task)
        if not isinstance(section, dict):
            continue
        count = counts.get(task) or {}
        rows += _rows(task, None, section, _count(count, "n_gold"), _count(count, "n_scored"))
        for subset in get_task(task).card.subsets:
            if isinstance(section.get(subset), dict):
                rows += _rows(task, subset, section[subset], None, None)
    return rows


def _count(figures: dict[str, Any], key: str) -> int | None:
    value = figures.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _rows(
    task: str, subset: str | None, figures: dict[str, Any], of: int | None, scored: int | None
) -> list[MetricRow]:
    cis = figures.get("ci95") if isinstance(figures.get("ci95"), dict) else {}
    n = _count(figures, "n") or scored
    card = get_task(task).card
    threshold = figures.get("threshold")
    threshold = float(threshold) if isinstance(threshold, (int, float)) else None
    rows = []
    for metric in card.metrics:
        value = figures.get(metric)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            ci = cis.get(metric)
            ci95 = (float(ci[0]), float(ci[1])) if isinstance(ci, list) and len(ci) == 2 else None
            at = threshold if metric in card.thresholded else None
            rows.append(MetricRow(task, subset, metric, float(value), ci95, n, of, at))
    return rows


@dataclass
class PublishedBase:
    """The base as the published repo names it: a hub id, or a random-init base shipped in it."""

    hub_id: str | None
    revision: str | None
    shipped: Path | None  # the local folder copied into the repo as base/
    origin: str


def published_base(run: RunArtifacts, base_model_id: str | None = None) -> PublishedBase:
    """Never a path on this machine: the hub id the run recorded (or the one named now), or the
    run's random-init base, shipped; any other local base stops with what to do."""
    origin = str(run.metadata.get("base_origin") or "")
    if base_model_id:
        hub_repo_id(base_model_id, "--base-model-id")
        return PublishedBase(base_model_id, None, None, origin or "named at publish time")
    if run.hub_base_id:
        hub_repo_id(run.hub_base_id, f"the base recorded in {run.path}")
        revision = run.base_revision
        if revision is not None and not REVISION.fullmatch(str(revision)):
            raise FincheckError(
                f"the base revision recorded in {run.path} is not a commit or branch name: "
                f"{str(revision)[:80]!r}"
            )
        return PublishedBase(run.hub_base_id, revision, None, origin or "Hugging Face Hub")
    if run.local_base is not None:
        return PublishedBase(None, None, run.local_base, origin or "random-init base of the run")
    raise FincheckError(
        f"the adapter's base {run.base_name or '?'} is a local folder with no known hub id: pass "
        "--base-model-id ORG/NAME (the hub model it is a copy of); a path on this machine means "
        "nothing to the people who download the adapter"
    )


MACHINE_KEYS = ("output_dir", "logging_dir", "resume_from_checkpoint", "hub_token")


def public_recipe(recipe: dict[str, Any], base_hub_id: str | None) -> str:
    """The resolved recipe as YAML that can be shown to the world: the base as its hub id, and
    no absolute paths of the machine that trained it."""
    public: dict[str, Any] = {}
    for key, value in recipe.items():
        if key in MACHINE_KEYS:
            continue
        if key == "model_name_or_path" and base_hub_id:
            value = base_hub_id
        elif isinstance(value, str) and (value.startswith(("/", "~")) or ":\\" in value):
            value = f"<local: {Path(value).name}>"
        public[key] = value
    return yaml.safe_dump(public, sort_keys=False)


def build_metadata(
    run: RunArtifacts,
    repo_id: str,
    results: dict[str, Any] | None,
    license: str,
    base_model: str | None = None,
) -> dict[str, Any]:
    """The card's YAML header, as the hub expects it (model-index only when results exist)."""
    from huggingface_hub import EvalResult, ModelCardData

    tasks = run.tasks or list(all_tasks())
    known = [t for t in tasks if t in task_names()]  # tags by allow-list: registered tasks only
    tags = ["fincheck", "hallucination-detection", "fact-checking", "lora", "peft", *known]
    split = str(((results or {}).get("run") or {}).get("split", "test"))
    rows = metrics_from_results(results or {})
    sampled = {row.task for row in rows if row.is_sample}
    eval_results = [
        EvalResult(
            task_type=get_task(row.task).card.task_type,
            task_name=get_task(row.task).card.task_name,
            dataset_type=get_task(row.task).card.dataset_type,
            dataset_name=get_task(row.task).card.dataset_name,
            dataset_config=row.subset,
            dataset_split=split,
            metric_type=row.metric,
            metric_name=row.label if row.subset is None else f"{row.label} ({row.subset})",
            metric_value=row.value,
        )
        for row in rows
        if row.task not in sampled  # a sample's figure is not the benchmark's test-set figure
    ]
    data = ModelCardData(
        base_model=base_model,
        library_name="peft",
        license=license,
        language=["en"],
        pipeline_tag="text-generation",
        tags=tags,
        model_name=repo_id.split("/")[-1] if eval_results else None,
        eval_results=eval_results or None,
    )
    return data.to_dict()


def render_card(
    run: RunArtifacts,
    repo_id: str,
    results: dict[str, Any] | None = None,
    license: str = "apache-2.0",
    published: Any = None,
) -> str:
    """The README.md text for `run` published as `repo_id` (`published`: the base as the repo
    names it, `PublishedBase`)."""
    published = published or published_base(run)
    metadata = build_metadata(run, repo_id, results, license, published.hub_id)
    rows = metrics_from_results(results or {})
    base = published.hub_id
    revision = f" at revision `{published.revision}`" if published.revision else ""
    lora = run.adapter_config
    layers = lora.get("layers_to_transform")
    lora_text = (
        f" (r={code_span(lora['r'])}, alpha={code_span(lora.get('lora_alpha'))}, "
        f"dropout={code_span(lora.get('lora_dropout'))}, "
        f"targets={_targets(lora.get('target_modules'))}"
        f"{f', layers={code_span(layers)}' if layers else ''})"
        if lora.get("r")
        else ""
    )
    recipe_yaml = public_recipe(run.recipe, published.hub_id) if run.recipe else "# not recorded\n"
    context = {
        "metadata_yaml": yaml.safe_dump(metadata, sort_keys=False, allow_unicode=True),
        "model_name": repo_id.split("/")[-1],
        "repo_id": repo_id,
        "base_description": f"[{base}](https://huggingface.co/{base}){revision}"
        if base
        else "a small randomly initialised base model shipped with the adapter (folder `base/`)",
        "base_origin": prose(published.origin),
        "base_comment": f"# base: {base} (pass base=... to use a local copy)\n"
        if base
        else "# base: the random-init base shipped in this repo, found automatically\n",
        "tasks_text": ", ".join(map(code_span, run.tasks)) if run.tasks else "not recorded",
        "lora_text": lora_text,
        "fingerprint": code_span(run.data_fingerprint or "not recorded"),
        "vllm_base": base,
        "vllm_lora_rank": vllm_lora_rank(lora.get("r")),
        "gguf_file": gguf_name(repo_id.split("/")[-1], "f16"),  # `fincheck export --gguf`'s
        "serve_window": run.max_length or 4096,  # the server's context: the training window
        "run_fingerprints": {
            k: code_span(run.metadata[k])
            for k in ("base_fingerprint", "recipe_fingerprint")
            if run.metadata.get(k)
        },
        "prompt_hashes": {
            code_span(t): code_span(d) for t, d in run.prompt_hashes.items() if t in run.tasks
        },
        "recipe_yaml": recipe_yaml,
        "recipe_fence": code_fence(recipe_yaml),
        "result_rows": [_result_row(row) for row in rows],
        "sampled_tasks": sorted({row.task for row in rows if row.is_sample}),
        "threshold_notes": [
            Markup(get_task(t).card.threshold_note)
            for t in dict.fromkeys(row.task for row in rows if row.threshold is not None)
            if get_task(t).card.threshold_note
        ],
        "data_origins": Markup(  # the registry's own text; a task no longer registered: its name
            "; ".join(
                get_task(t).card.data_origin
                if t in task_names() and get_task(t).card.data_origin
                else prose(t)
                for t in (run.tasks or list(all_tasks()))
            )
        ),
        "anchor_rows": [
            {"task": t, "subset": s or "all", "metric": m, "anchors": Markup(_anchor_text(t, s, m))}
            for t, s, m in dict.fromkeys(  # in order, each once
                (name, n.subset, n.metric)
                for name, t in all_tasks().items()
                for n in t.paper_numbers
            )
        ],
        # what differs between the card's figures and the anchors beside them (items, training
        # regime, the same-size rows), for each task the results hold
        "setting_notes": [  # the registry's own text, for registered tasks only
            Markup(f"{get_task(t).title}: {get_task(t).comparability}")
            for t in dict.fromkeys(row.task for row in rows)
            if get_task(t).comparability
        ],
    }
    built = {  # structure fincheck builds, each escaped for its place or checked by grammar
        "metadata_yaml", "repo_id", "base_description", "base_origin", "base_comment",
        "tasks_text", "lora_text", "fingerprint", "vllm_base", "recipe_yaml", "recipe_fence",
    }  # fmt: skip
    for key in built:
        context[key] = Markup(context[key]) if context[key] else context[key]
    context["run_fingerprints"] = {k: Markup(v) for k, v in context["run_fingerprints"].items()}
    context["prompt_hashes"] = {Markup(k): Markup(v) for k, v in context["prompt_hashes"].items()}
    env = jinja2.Environment(
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # HTML escaping is not enough for markdown: `as_markdown_text` is
        finalize=as_markdown_text,
    )
    return env.from_string(TEMPLATE_PATH.read_text(encoding="utf-8")).render(**context)


def as_markdown_text(value: Any) -> Any:
    """What every `{{ value }}` of the card template becomes: fincheck's own structure (a
    `Markup`, escaped for its place when built) as it is; anything else (a task name, a row of
    a results file, a note) as inert prose (`prose`: HTML and markdown escaped, one line)."""
    return value if isinstance(value, Markup) else prose(value)


def vllm_lora_rank(rank: Any) -> int:
    """vLLM's --max-lora-rank for an adapter of rank `rank`: the smallest value vLLM accepts
    (8, 16, 32, ...) at or above it."""
    return 1 << (rank - 1).bit_length() if isinstance(rank, int) and rank > 8 else 8


def _targets(modules: Any) -> str:
    if isinstance(modules, (list, tuple, set)):
        return ", ".join(code_span(m) for m in sorted(map(str, modules)))
    return code_span(modules)


def _anchor_text(task: str, subset: str | None, metric: str) -> str:
    """The papers' numbers for one (task, subset, metric), with their tables."""
    by_source: dict[str, list[str]] = {}
    for n in get_task(task).paper_numbers:
        if n.subset == subset and n.metric == metric:
            by_source.setdefault(n.source, []).append(f"{n.system} {n.value:.3f}")
    return " / ".join(f"{'; '.join(v)} ({source})" for source, v in by_source.items()) or "-"


def _result_row(row: MetricRow) -> dict[str, str]:
    """A results row: the names as read (escaped by the template), the figures as fincheck
    formats them (numbers) and the anchors from the task registry, marked as built."""
    return {
        "task": row.task,
        "subset": row.subset or "all",
        "metric": row.label,
        "value": Markup(
            f"{float(row.value):.3f}"
            + (f" [{float(row.ci95[0]):.3f}, {float(row.ci95[1]):.3f}]" if row.ci95 else "")
        ),
        "n": Markup(
            "-"
            if row.n is None
            else f"{int(row.n):,}" + (f" of {int(row.of):,} (sample)" if row.is_sample else "")
        ),
        "anchors": Markup(_anchor_text(row.task, row.subset, row.metric)),
    }


# What the card and publish's provenance check read of results.json, as `fincheck score` writes it
RESULTS_SHAPE = {
    "tasks": {str: dict},
    "run": {"adapter_sha256": (str, type(None)), "model": (str, type(None))},
    "counts": {str: dict},
}


def read_results(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    data = read_json_record(path, RESULTS_SHAPE)
    if data is None:
        raise FincheckError(f"results file not found: {path} (written by `fincheck score`)")
    redo = "give the results.json `fincheck score` wrote"
    with library_errors_as_one_line(f"{path}: a figure of another shape", redo):
        rows = metrics_from_results(data)  # every value the card will show, read once here
    if not rows:
        raise FincheckError(f"{path}: no metrics found under any of the tasks {list(all_tasks())}")
    return data
