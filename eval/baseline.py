"""`fincheck baseline --method M`: run a paper's system over the prepared pairs, like a model.

Stages: build the client (an OpenAI-compatible endpoint or a local model) behind the request
cache -> build the method (two-step's step 1, FIZZ's NLI model and dev threshold) -> for each
task the method covers: the same seeded sample as `fincheck eval`, examples run `concurrency`
at a time, each prediction written as soon as it is done (a rerun skips them, and the cache
answers the calls of half-finished ones) -> a trace of every example's intermediate answers
and calls beside the predictions. `fincheck score` then scores them like any model's.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from fincheck.data.pairs import Pair, Prediction
from fincheck.errors import FincheckError
from fincheck.eval.baselines.methods import Method, MethodOutput, run_examples
from fincheck.eval.baselines.registry import ASKS_NO_LLM, METHODS
from fincheck.eval.options import BaselineOptions
from fincheck.eval.predictions import PredictionWriter, path_identity, record_loaded
from fincheck.eval.runner import Answerer, answer_tasks
from fincheck.inference.llm import CachedLLM, ChatClient, RequestCache
from fincheck.io.jsonl import check_shape, drop_torn_last_line, iter_json_objects, record_json
from fincheck.io.safe_files import append_line
from fincheck.models.llm_clients import METHOD, build_client

# What a rerun reads back of each trace record (its calls and the method's own counts)
TRACE_SHAPE = {"id": str, "calls": int, "counts": {str: int}}


class NoLLM(ChatClient):
    """The client of a method that asks no model (overlap): any call is a bug."""

    def __init__(self) -> None:
        self.identity = {"backend": "none", "model": "none"}

    def complete(self, messages, sampling, span=None) -> str:
        raise FincheckError("this method asks no LLM")


def covered_tasks(method: Method, opts: BaselineOptions, named: bool) -> list[str]:
    """The tasks of the run the method covers. A task it does not cover is an error when
    --tasks named it, else a line saying it is left out: never dropped without a word."""
    tasks = [t for t in opts.tasks if t in method.tasks]
    left = [t for t in opts.tasks if t not in method.tasks]
    if left and (named or not tasks):
        raise FincheckError(
            f"--method {opts.method} covers {', '.join(method.tasks) or 'no registered task'}, "
            f"not {', '.join(left)}"
        )
    if left:
        print(f"--method {opts.method} does not cover {', '.join(left)}: left out")
    return tasks


def run_baseline(opts: BaselineOptions) -> dict[str, dict[str, Any]]:
    """Predictions of the method for each task it covers; returns per-task counts."""
    named = opts.tasks is not None
    opts.resolve_tasks()
    if opts.method in ASKS_NO_LLM:
        client = NoLLM()
    else:
        client = build_client(
            opts,
            opts.backend,
            opts.model,
            METHOD,
            max_new_tokens=opts.max_tokens,
            device=opts.device,
            batch_size=opts.concurrency,
            window=opts.window,
            dtype=opts.dtype,
        )
    cache = RequestCache(opts.out_dir / "llm_cache.jsonl")
    llm = CachedLLM(client, cache, {"temperature": 0.0, "max_tokens": opts.max_tokens})
    method = METHODS[opts.method](opts, llm)
    identity = {
        "model": "/".join(str(v) for v in client.identity.values()),
        "adapter": None,
        "method": method.name,
        "method_source": method.source,
        "max_tokens": opts.max_tokens,
        "nli_model": path_identity(opts.nli_model),  # a local NLI model by its content
        "nli_labels": list(opts.nli_labels) if opts.nli_labels else None,
        "step1": path_identity(opts.step1) if opts.method == "two-step" else None,
        "step2": opts.step2 if opts.method == "two-step" else None,
    }
    tasks = covered_tasks(method, opts, named)
    return answer_tasks(opts, identity, tasks, lambda: PaperMethod(method, llm, opts))


class PaperMethod(Answerer):
    """A paper's system (or a plain score) over an LLM client: examples run `concurrency` at a
    time, each prediction written as soon as it is done, with a trace line of its intermediate
    answers and calls."""

    def __init__(self, method: Method, llm: CachedLLM, opts: BaselineOptions) -> None:
        self.method, self.llm, self.opts = method, llm, opts
        self.client = llm.client

    def loaded(self) -> dict[str, Any]:
        return {"client": self.client.identity}

    def answer_task(
        self, task: str, pairs: list[Pair], todo: list[Pair], writer: PredictionWriter
    ) -> dict[str, Any]:
        """The task's predictions (those not written yet) and a trace line per example."""
        method, opts = self.method, self.opts
        if method.prepare is not None:
            record_loaded(opts.predictions_dir, **method.prepare(task))
        trimmed_before = self.client.trimmed  # the client counts across tasks
        trace_path = opts.predictions_dir / f"{task}.trace.jsonl"
        drop_torn_last_line(trace_path)  # a crash or a full disk mid-write: that record is lost

        def done(pair: Pair, output: MethodOutput, n_calls: int) -> None:
            answer = {"cut": output.cut, "reasoning": output.reasoning}
            prediction = Prediction(pair.id, task, output.output, output.p_yes, **answer)
            writer.write_batch([prediction])
            record = {"id": pair.id, "calls": n_calls, **output.trace}
            append_line(trace_path, record_json(record) + "\n")  # redacted, as every record

        failures = run_examples(
            method.run,
            self.llm,
            todo,
            opts.concurrency,
            done,
            opts.progress,
            f"{method.name} {task}",
        )
        # calls per example over every example written, this run's and earlier ones' (the
        # trace) and the method's own counts (the pipeline's merge fallbacks, ...) summed alike
        wanted = {p.id for p in pairs}
        per_id, counts_per_id = {}, {}
        if trace_path.exists() or trace_path.is_symlink():  # a FIFO there: one line
            for line_no, record in iter_json_objects(trace_path):
                check_shape(record, TRACE_SHAPE, f"{trace_path}:{line_no}", ("id", "calls"))
                if record["calls"] < 0:
                    raise FincheckError(f"{trace_path}:{line_no}: calls is {record['calls']}")
                if record.get("id") in wanted:
                    per_id[record["id"]] = record["calls"]
                    counts_per_id[record["id"]] = record.get("counts") or {}
        counts: Counter[str] = Counter()
        for example_counts in counts_per_id.values():
            counts.update(example_counts)  # not `+`: it would drop counts of zero
        return {
            "failed": failures,
            "calls_per_example": sum(per_id.values()) / len(per_id) if per_id else 0.0,
            **({"method_counts": dict(counts)} if counts else {}),
            "trimmed": self.client.trimmed - trimmed_before,
        }
