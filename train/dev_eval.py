"""The tasks' own figures on the dev split while training runs: QASem ROC-AUC and BAcc,
FHSumBench macro P/R/F, FINAL's binarized BAcc (no judge) every `eval_steps`.

The eval loss says how well the model imitates the targets; it says little about whether it
ranks QAs or separates the three FHSumBench classes, which is what a detector is chosen on. So
each evaluation also answers a sample of the dev split the way `fincheck eval` does: the same
prompt fitting (the window is the recipe's max_length, the answer budget the task's default
fitted to it), the same prefix-tree path (`fincheck.inference.shared_prefix`), greedy answers and QASem's
P(Yes) from the first answer token, scored by the task's own scorer. The figures are logged
as `eval_<task>_<figure>` (console, wandb, trainer_state.json), and `metric_for_best_model`
can name one of them (`qasem_auc`, `fhsumbench_f`, ...).

With several processes, the sample is dealt out by document (each process answers its share
and the answers are gathered) under DDP and ZeRO-1/2, where each process holds the whole model;
under ZeRO-3 every forward pass is a collective, so every process answers the whole sample in
step.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fincheck.data.pairs import EVAL_SAMPLE_SEED, Pair, Prediction, sample
from fincheck.inference.generation import LoadedModel, answer_budgets
from fincheck.inference.shared_prefix import answer_in_order
from fincheck.io.safe_files import write_text
from fincheck.tasks import all_tasks, get_task
from fincheck.tasks.base import ScoreSettings, Task
from fincheck.tasks.prepared import PreparedFolder
from fincheck.train.recipe_checks import TASKS_MEAN

if TYPE_CHECKING:
    from fincheck.train.recipe import SFTRecipe

log = logging.getLogger(__name__)


@dataclass
class DevTask:
    task: Task
    pairs: list[Pair]
    prompts: list[str]
    max_new_tokens: int

    @property
    def name(self) -> str:
        return self.task.name


class DevFigures:
    """The dev sample of each task, its prompts fitted once; `compute(model)` answers them."""

    def __init__(
        self, recipe: SFTRecipe, split: str, tokenizer: Any, prepared: PreparedFolder
    ) -> None:
        """The recipe's dev_figures tasks on `split`, sampled by dev_figures_limit, fitted to
        max_length (the window) and answered per_device_eval_batch_size at a time."""
        self.tokenizer, self.batch_size = tokenizer, recipe.per_device_eval_batch_size
        self.progress = not recipe.disable_tqdm  # a bar per task: minutes of answers on a CPU
        # the prompts fitted as `fincheck eval` fits them for a model trained to this window
        kwargs = recipe.chat_template_kwargs or {}
        fitter = LoadedModel(None, tokenizer, "", None, kwargs, window_limit=recipe.max_length)
        budgets = answer_budgets(all_tasks(), fitter.window)
        self.tasks: list[DevTask] = []
        for name in recipe.dev_figures:
            task = get_task(name)
            pairs = prepared.split(name, split)
            limit = recipe.dev_figures_limit.get(name)
            pairs = sample(pairs, limit, EVAL_SAMPLE_SEED, task.limit_by_document)  # eval's
            prompts = [
                fitter.fit_for_answer(
                    pair.prompt_messages,
                    pair.meta.get("grounding_span"),
                    budgets[name],
                    what=f"dev figures: {name}/{pair.id}",
                    remedy="raise the recipe's max_length",
                ).text
                for pair in pairs
            ]
            self.tasks.append(DevTask(task, pairs, prompts, budgets[name]))

    answers: dict[str, list[Prediction]]  # the last `compute`'s, in the sample's order

    def sizes(self) -> dict[str, int]:
        return {t.name: len(t.pairs) for t in self.tasks}

    def compute(self, model: Any, rank: int = 0, world: int = 1, sharded: bool = False):
        """{f"{task}_{figure}": value} over the whole sample, for the task's headline figures
        (`Task.compare_metrics`; NaN where undefined), and the seconds it took. Process 0 shows
        a progress bar of its answers per task."""
        import torch
        from tqdm.auto import tqdm

        start = time.perf_counter()
        was_training = model.training
        model.eval()
        figures: dict[str, float] = {}
        self.answers = {}
        try:
            for task in self.tasks:
                mine = shard(task.pairs, rank, world) if sharded and world > 1 else None
                chosen = range(len(task.pairs)) if mine is None else mine
                with tqdm(
                    total=len(chosen),
                    desc=f"dev figures {task.name}",
                    unit="ex",
                    leave=False,
                    disable=not (self.progress and rank == 0),
                    smoothing=0.0,  # batches come in a seeded random order: the mean rate
                ) as bar:
                    ordered = answer_in_order(
                        model,
                        self.tokenizer,
                        [task.prompts[i] for i in chosen],
                        task.max_new_tokens,
                        batch_size=self.batch_size,
                        share=task.task.first_word_share,
                        answered=bar.update,
                    )
                p_yes = ordered.p_yes or [None] * len(ordered.texts)
                answers = [
                    Prediction(task.pairs[i].id, task.name, ordered.texts[k], p_yes[k])
                    for k, i in enumerate(chosen)
                ]
                if mine is not None:
                    gathered: list[Any] = [None] * world
                    torch.distributed.all_gather_object(gathered, answers)
                    answers = [a for part in gathered for a in part]
                by_id = {a.id: a for a in answers}
                self.answers[task.name] = [by_id[pair.id] for pair in task.pairs]
                joined = [(pair, by_id[pair.id]) for pair in task.pairs]
                score = task.task.score(
                    joined, ScoreSettings(bootstrap_resamples=0, progress=False)
                )
                values = task.task.example_figures(score.examples)
                for key in task.task.dev_metrics:  # the headline ones a dev run can compute
                    value = values.get(key)
                    # always logged, so metric_for_best_model finds its key; NaN where the
                    # sample leaves it undefined (one class only), and NaN never counts as best
                    missing = value is None or math.isnan(value)
                    figures[f"{task.name}_{key}"] = math.nan if missing else round(float(value), 4)
            if len(self.tasks) > 1:  # one figure that weighs every task alike
                chosen = [figures[f"{t.name}_{t.task.choose_by}"] for t in self.tasks]
                figures[TASKS_MEAN] = round(sum(chosen) / len(chosen), 4)  # NaN if any is
        finally:
            model.train(was_training)
        return figures, time.perf_counter() - start


def write_dev_predictions(folder: Path, answers: dict[str, list[Prediction]]) -> None:
    """One evaluation's answers as `fincheck eval` writes predictions (`<task>.jsonl`, with
    QASem's P(Yes)): `fincheck score --split dev --predictions FOLDER` scores them, and
    `fincheck compare` sets two epochs, or two runs, side by side, paired by document, with no
    second pass over the dev split."""
    folder.mkdir(parents=True, exist_ok=True)
    for task, predictions in answers.items():
        write_text(folder / f"{task}.jsonl", "".join(a.to_json() + "\n" for a in predictions))


def shard(pairs: list[Pair], rank: int, world: int) -> list[int]:
    """This process's share of the pairs: whole documents dealt out in turn (a document's
    prompts stay on one process, where its prefix runs once)."""
    documents: dict[str, list[int]] = {}
    for i, pair in enumerate(pairs):
        documents.setdefault(pair.document_key, []).append(i)
    return [i for k, key in enumerate(documents) if k % world == rank for i in documents[key]]
