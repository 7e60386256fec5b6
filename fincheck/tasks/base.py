"""What a task is: the one interface every stage loops over.

A task package (`fincheck/tasks/<name>/`) subclasses `Task` and says everything that is
specific to its benchmark, in one place:

    prepare   which raw files it reads (`sources`) and how they become pairs (`collect`)
    prompt    the prompt file the pairs are rendered with (`prompt_path`)
    eval      how long its answer is (`max_new_tokens`), what its p_yes weighs (`first_word_share`)
    score     gold from each pair's `meta`, the paper's metrics on (pair, prediction) rows
    report    headline figures, its report.md section, its plots, the papers' numbers
    serve     what `fincheck detect` writes for one output, how the model card names it

Stages never test a task's name: they ask the registry (`fincheck.tasks.get_task`) and call
these methods, so a new benchmark is a new module, not edits across the stages.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fincheck.data.prompting import FirstWordShare, Prompt, load_prompt_file
from fincheck.errors import FincheckError
from fincheck.io.config import config_field
from fincheck.metrics.figures import fmt

if TYPE_CHECKING:  # only for type hints: keep `import fincheck.tasks` light
    from fincheck.data.pairs import Pair, Prediction
    from fincheck.data.raw_records import RecordStream
    from fincheck.io.sources import Source


@dataclass
class PrepareSettings:
    """What every task's `sources` and `collect` may read from `fincheck prepare`'s config.
    A task's own settings are a dataclass of its package (`Task.prepare_options`, keys named
    after the task); prepare's config holds these, its own and every task's."""

    seed: int = config_field(13, "seed of the grouped splits (QASem dev -> train/dev, FHSumBench)")


@dataclass(frozen=True)
class PaperNumber:
    """A published figure shown beside ours. `value` is a fraction in [0, 1] (the QASem paper
    prints percentages: 75.7 is stored as 0.757); `source` names the paper and its table."""

    system: str
    metric: str  # the key of the figure in results.json (f1, bacc, auc, f, ...)
    value: float
    source: str
    subset: str | None = None  # QASem: cliff / factscore / verifiability; None = whole test set


@dataclass(frozen=True)
class DemoPlan:
    """A task's share of `make demo` (SmolLM2-135M, about 15 minutes on 2 cores): what the
    adapter trains on (`plan: demo` in a data mixture) and how both evaluations sample it. A
    new task joins the demo with the defaults, or with a plan of its own."""

    test_examples: int = 32  # --limit of both evaluations: an interval on every figure (n >= 30)
    answer_tokens: int | None = None  # --max-new-tokens of both (None: the task's own budget)
    train_weight: float = 1.0  # share of its train pairs (whole documents), as a mixture weight
    train_cap: int | None = None  # its train pairs at most


@dataclass(frozen=True)
class CardInfo:
    """How the task appears in a model card's model-index (the hub's eval results)."""

    task_type: str
    task_name: str
    dataset_type: str
    dataset_name: str
    metrics: tuple[str, ...]  # figures of results.json that go into the card
    # the figures a `--threshold` chosen on dev changes (FINAL: every one, lists are held
    # back); the card names the threshold beside them
    thresholded: tuple[str, ...] = ()
    threshold_note: str = ""  # what the threshold does to its figures, in the card's prose
    subsets: tuple[str, ...] = ()  # sub-dicts of the figures holding per-subset figures
    # where the data comes from, in the card's prose (GitHub repositories, not hub datasets:
    # the card's `datasets:` metadata takes hub dataset ids only)
    data_origin: str = ""


@dataclass(frozen=True)
class UserFile:
    """An input file the user names (a FINAL release), as opposed to a pinned `Source`."""

    name: str  # key in the manifest's inputs, e.g. "final_file"
    path: Path
    what: str  # for error messages: "FINAL file"
    option: str  # the option that named it: "--final_file"


@dataclass
class Collected:
    """What a task's `collect` returns: its pairs (split assigned) and notes for the manifest."""

    pairs: list[Pair]
    notes: dict[str, Any] = field(default_factory=dict)


@dataclass
class ScoreSettings:
    """What scoring needs beyond the predictions: the judge (FINAL), CI settings."""

    judge: Any = None  # the judge a task builds (`Task.build_judge`), or None
    judge_concurrency: int = 8
    judge_sanity: bool = True  # also measure the judge on description pairs of known answer
    judge_check: Path | None = None  # ... from this set (hand-matched items), not the built-in
    bootstrap_resamples: int = 1000
    seed: int = 0
    progress: bool = True
    # task -> a decision threshold chosen on dev (`fincheck score --threshold qasem=0.62`), for
    # a task that reads P(Yes): its figures at the paper's threshold stay, these come beside
    thresholds: dict[str, float] = field(default_factory=dict)
    # each joined example's key in the task's coarsest resample unit (`Task.resample_units`),
    # set by `fincheck score` per task: the intervals resample whole units
    unit_keys: Sequence[str] | None = None


@dataclass
class TaskScore:
    """A task's figures (as in results.json) and one record per example (scored/<task>.jsonl,
    the report's examples, the plots)."""

    figures: dict
    examples: list[dict] = field(default_factory=list)
    judge_errors: int = 0  # judge calls that failed (after retries)
    judge_parse_failed: int = 0  # judge answers that could not be read, even after a re-ask
    judge_asked: int = 0  # examples that needed the judge, with one present
    judge_first_error: str | None = None  # what went wrong first, for the one-line message


def paper_rows(numbers: Iterable[PaperNumber]) -> dict[str, dict[tuple[str, str | None], float]]:
    """Row label -> {(metric, subset): value}, in the order the task lists them; the label
    names the system and the paper's table ("GPT-4o vanilla (FHSumBench paper, Table 1)")."""
    rows: dict[str, dict[tuple[str, str | None], float]] = {}
    for n in numbers:
        rows.setdefault(f"{n.system} ({n.source})", {})[(n.metric, n.subset)] = n.value
    return rows


Joined = Sequence[tuple["Pair", "Prediction"]]


class Task(ABC):
    """One benchmark. Subclasses set the class attributes and implement the abstract methods."""

    name: str  # the id in file names, --tasks, pairs and predictions
    title: str  # how a reader knows it: "FINAL", "QASemConsistency", "FHSumBench"
    listed: int = 100  # where reports and tables list it (then by name): a new task goes last
    # the names of its LLM judge's prompts (`build_judge` takes one); none: its figures need
    # no judge
    judge_prompts: tuple[str, ...] = ()
    max_new_tokens: int  # default answer budget of `fincheck eval` and `fincheck detect`
    # eval also writes p_yes, the share of one answer word against another at the first answer
    # position (`FirstWordShare`: QASem's Yes/No, FINAL's list against "None"); None: no p_yes
    first_word_share: FirstWordShare | None = None
    # --limit N draws whole documents (`fincheck.data.pairs.sample_documents`) rather than N pairs:
    # for a task whose pairs share documents, so a sample keeps the prefix tree's speed
    limit_by_document: bool = False
    # its own `fincheck prepare` settings: a PrepareSettings subclass whose keys start with the
    # task's name (qasem_dev_fraction); None when it has none
    prepare_options: type[PrepareSettings] | None = None
    train_weight: float = 1.0  # share of its pairs per epoch in the default training mixture
    demo: DemoPlan = DemoPlan()  # its share of the demo
    paper_numbers: tuple[PaperNumber, ...] = ()
    comparability: str = ""  # when our figure can stand next to the papers', in one paragraph
    card: CardInfo

    def build_judge(self, client: Any, cache: Any, prompt: str, sampling: dict) -> Any:
        """The judge its figures need (`judge_prompts`): `client` (a `fincheck.inference.llm.ChatClient`)
        asking with the prompt named `prompt`, every answer kept in `cache`."""
        raise NotImplementedError(f"{self.name} needs no judge")

    @property
    def reads_p_yes(self) -> bool:
        return self.first_word_share is not None

    @property
    def answers_yes_no(self) -> bool:
        """Its answer is the Yes/No word itself (QASem): what a baseline's short answer and its
        final word after reasoning are read as."""
        return self.first_word_share is not None and self.first_word_share.ends_answer

    @property
    def prompt_path(self) -> Path:
        """`prompt.txt` beside the task's module (its package's `__init__.py`)."""
        return Path(inspect.getfile(type(self))).parent / "prompt.txt"

    def e2e_prompt_path(self, variant: str) -> Path:
        """The paper's end-to-end prompt of `fincheck baseline --method e2e[-fewshot|-cot]`
        (`e2e.txt`, `e2e_fewshot.txt`, `e2e_cot.txt` beside `prompt.txt`); a task without one is
        not covered by that method, and says so."""
        return self.prompt_path.with_name(variant.replace("-", "_") + ".txt")

    def cut_in_reasoning(self, text: str) -> bool:
        """Whether a reasoning answer cut at its token budget stopped before its answer (FINAL:
        before "Final Output:"), so nothing in it is read; by default the answer is read."""
        return False

    def prompt(self) -> Prompt:
        """The prompt its pairs are rendered with (`prompt_path`, read once)."""
        return load_prompt_file(self.prompt_path, self.name)

    # --- prepare ---------------------------------------------------------------------------

    @abstractmethod
    def sources(self, config: PrepareSettings) -> list[Source | UserFile]:
        """The raw files `collect` reads, under the config."""

    @abstractmethod
    def collect(
        self, config: PrepareSettings, files: dict[str, Path], stream: RecordStream
    ) -> Collected:
        """Raw files (by source name) -> pairs with their split assigned (train/dev/test)."""

    # --- score -----------------------------------------------------------------------------

    @abstractmethod
    def score(self, joined: Joined, settings: ScoreSettings) -> TaskScore:
        """The paper's figures over (gold pair, prediction) rows; gold comes from pair.meta."""

    @abstractmethod
    def headline(self, figures: dict) -> list[tuple[str, float | None]]:
        """The figures a one-line summary shows (CLI, demo), as (label, value)."""

    def headline_text(self, figures: dict) -> str:
        return " ".join(f"{label} {fmt(value)}" for label, value in self.headline(figures))

    @abstractmethod
    def report_section(self, figures: dict) -> list[str]:
        """Markdown lines of this task's section of report.md (table with CIs, notes)."""

    def plots(self, score: TaskScore, plot_dir: Path, model: str | None) -> list[Path]:
        """PNG files for the report; none by default."""
        return []

    def is_right(self, example: dict) -> bool:
        """Whether a scored example counts as right (the report shows wrong ones first)."""
        return example.get("predicted") == example.get("gold")

    # --- compare ---------------------------------------------------------------------------

    compare_metrics: tuple[tuple[str, str], ...] = ()  # (key of example_figures, label)
    # What `fincheck compare` resamples whole: the units its examples are drawn in, the
    # coarsest first (the default). A task whose examples share documents names the document.
    resample_units: tuple[str, ...] = ("document",)
    # Figures that reward a spread of answers whatever it says (macro averages over classes):
    # `fincheck compare` puts beside each run the same figures with its answers shuffled
    # across its examples, the floor a detector has to clear. Keys of example_figures.
    shuffle_floor_metrics: tuple[str, ...] = ()

    def compare_figure(self, figures: dict, metric: str) -> tuple[float | None, list | None]:
        """A `compare_metrics` figure and its CI as `score` recorded them in results.json."""
        return figures.get(metric), (figures.get("ci95") or {}).get(metric)

    # What a dev evaluation during training cannot compute: figures that need a judge or a
    # threshold chosen elsewhere (keys of compare_metrics).
    needs_more_than_dev: tuple[str, ...] = ()

    @property
    def dev_metrics(self) -> tuple[str, ...]:
        """The compare_metrics training's dev figures log (`eval_<task>_<key>`) and
        metric_for_best_model may name."""
        return tuple(k for k, _ in self.compare_metrics if k not in self.needs_more_than_dev)

    @property
    def choose_by(self) -> str:
        """The one figure a checkpoint, a threshold or a mixture is chosen by on dev (training's
        `tasks_mean` averages it over the tasks); by default the first dev metric."""
        return self.dev_metrics[0]

    def resample_keys(self, pair: Pair) -> dict[str, str]:
        """The pair's key in each of `resample_units` (recorded in its scored record as
        `units`); by default the one unit is the grounding text."""
        return {self.resample_units[0]: pair.document_key}

    @abstractmethod
    def example_figures(self, examples: Sequence[dict]) -> dict[str, float]:
        """The headline figures recomputed from scored example records (scored/<task>.jsonl):
        what `fincheck compare` bootstraps, paired by id, to compare two runs."""

    @abstractmethod
    def unreadable_outputs(self, figures: dict) -> tuple[int, int, str]:
        """(count, n, what): outputs in none of the forms the task asks for."""

    # --- a binary verdict (systems that only say consistent or not: FIZZ) -------------------

    def gold_consistent(self, pair: Pair) -> bool:
        """Whether the gold says the output is supported by its text."""
        raise FincheckError(f"task {self.name!r} has no binary consistency label")

    def verdict_answer(self, consistent: bool, reason: str) -> str:
        """A binary verdict written as this task's answer (what its scorer reads); `reason`
        says what is unsupported when it is not consistent."""
        raise FincheckError(f"task {self.name!r} has no answer for a binary verdict")

    # --- serve -----------------------------------------------------------------------------

    @abstractmethod
    def detect_output(
        self, text: str, p_yes: float | None, threshold: float | None = None
    ) -> dict[str, Any]:
        """What `fincheck detect` reports for one model output of this task (`threshold`: a
        decision threshold on p_yes chosen on dev, `fincheck detect --threshold`)."""
