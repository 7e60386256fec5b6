"""The one loop of `fincheck eval` and `fincheck baseline`: something answers the prepared pairs
of each task into resumable predictions files. What answers is an `Answerer`: the detector's own
prompt on a backend (`eval/generate.py:DetectorPrompt`) or a paper's method
(`eval/baseline.py:PaperMethod`).

    the run's identity checked against the folder's (a resume under other settings stops
    before anything loads) -> each task's sample -> the answerer started -> what it loaded
    recorded -> per task: the ids already predicted skipped, the rest answered and appended,
    the counts recorded -> the models an endpoint says it ran, recorded (a resume's replies
    must come from the models that answered the folder's earlier predictions).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from fincheck.data.pairs import Pair
from fincheck.errors import FincheckError
from fincheck.eval.options import BaselineOptions, EvalOptions
from fincheck.eval.predictions import (
    PredictionWriter,
    check_eval_config,
    record_generation,
    record_loaded,
    served_before,
    unlist_task,
)
from fincheck.inference.llm import CachedLLM, expect_served
from fincheck.tasks.prepared import read_manifest, split_sha256


class Answerer(ABC):
    """What answers a task's pairs in `answer_tasks`; `llm`: the LLM it asks, whose replies
    may name the models that served them (None: a model loaded here)."""

    llm: CachedLLM | None = None

    @abstractmethod
    def loaded(self) -> dict[str, Any]:
        """What it turned out to be (recorded beside the predictions)."""

    @abstractmethod
    def answer_task(
        self, task: str, pairs: list[Pair], todo: list[Pair], writer: PredictionWriter
    ) -> dict[str, Any]:
        """Answer `todo` (of the task's sample `pairs`) into `writer`; returns the task's
        counts: `failed` (the examples that failed, "id: reason") and any of its own."""

    def served_models(self) -> list[str] | None:
        """The model names an endpoint's replies carried (None: nothing to record)."""
        return sorted(self.llm.client.served_models) or None if self.llm else None

    def expect_served(self, models: list[str]) -> None:
        """The models the endpoint served for the folder's earlier predictions (and those kept
        with each cached answer: a record lost to a kill still leaves them in the cache): a reply
        from another stops the run (a model loaded here has no say: its identity is checked
        before it loads)."""
        if self.llm:
            expect_served(self.llm.client, self.llm.cache, models)


def answer_tasks(
    opts: EvalOptions | BaselineOptions,
    identity: dict[str, Any],
    tasks: list[str],
    start: Callable[[], Answerer],
) -> dict[str, dict[str, Any]]:
    """Predictions for every task of `tasks`; returns per-task counts (total, resumed,
    generated, failed and the answerer's own). `identity`: what else identifies the run."""
    if isinstance(opts.limit, dict) and not set(opts.limit) & set(tasks):
        # caps for other tasks only: read by nothing, while this run's tasks run whole (one
        # spec shared by several commands, each reading its own tasks' caps, is fine)
        raise FincheckError(
            f"--limit names {', '.join(sorted(opts.limit))}, none of which this run answers "
            f"(its tasks: {', '.join(tasks)}); give its tasks' caps, or add them to --tasks"
        )
    earlier = served_before(opts.predictions_dir)  # before the config is written again
    manifest = read_manifest(opts.data_dir)
    check_eval_config(
        opts.predictions_dir,
        {
            "backend": opts.backend,
            "split": opts.split,
            "limit": opts.limit,
            "sample_seed": opts.sample_seed,
            "tasks": list(tasks),
            "sample_by": opts.sample_by(tasks),
            "data_fingerprint": manifest.get("fingerprint"),
            # each task's inputs, which score and compare check: another folder may share them
            "split_sha256": {task: split_sha256(manifest, task, opts.split) for task in tasks},
            "requested_window": opts.window,
            **identity,
        },
    )
    task_pairs = {task: opts.sample(task) for task in tasks}
    answerer = start()
    record_loaded(opts.predictions_dir, **answerer.loaded())
    answerer.expect_served(earlier)
    summary: dict[str, dict[str, Any]] = {}
    try:
        for task, pairs in task_pairs.items():
            writer = PredictionWriter(opts.predictions_dir / f"{task}.jsonl", task)
            todo = [p for p in pairs if p.id not in writer.done]
            if todo:  # its file grows again: unfinished until listed anew
                unlist_task(opts.predictions_dir, task)
            try:
                counts = answerer.answer_task(task, pairs, todo, writer)
            finally:
                writer.close()
            generated = len(todo) - len(counts["failed"])
            summary[task] = {
                "total": len(pairs),
                "resumed": len(pairs) - len(todo),
                "generated": generated,
                **counts,
            }
            record_generation(opts.predictions_dir, task, summary[task])
            _record_served(opts, answerer, earlier)
    finally:  # a run stopped part-way (Ctrl-C, a breaker) records what answered it too
        _record_served(opts, answerer, earlier)
    return summary


def _record_served(
    opts: EvalOptions | BaselineOptions, answerer: Answerer, earlier: list[str]
) -> None:
    """The models the endpoint said it served, added to the folder's, never overwritten."""
    if served := answerer.served_models():
        record_loaded(opts.predictions_dir, served_models=sorted({*earlier, *served}))
