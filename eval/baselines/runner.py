"""`fincheck baseline --method M`: run a paper's system over the prepared pairs, like a model.

Stages: build the client (an OpenAI-compatible endpoint or a local model) behind the request
cache -> build the method (two-step's step 1, FIZZ's NLI model and dev threshold) -> for each
task the method covers: the same seeded sample as `fincheck eval`, examples run `concurrency`
at a time, each prediction written as soon as it is done (a rerun skips them, and the cache
answers the calls of half-finished ones) -> a trace of every example's intermediate answers
and calls beside the predictions. `fincheck score` then scores them like any model's.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from fincheck.detector import Detector
from fincheck.errors import FincheckError
from fincheck.eval.baselines.final_methods import STEP1, two_step_method
from fincheck.eval.baselines.fizz import NLIScorer, choose_threshold, run_fizz
from fincheck.eval.baselines.methods import (
    Example,
    Method,
    MethodOutput,
    fit_detector_pairs,
    get_method,
)
from fincheck.eval.generate import sample_by, sample_task
from fincheck.eval.llm import CachedLLM, LLMCallError, RequestCache
from fincheck.eval.llm_backends import METHOD, OpenAIChatClient, TransformersChatClient
from fincheck.eval.options import NO_MODEL, BaselineOptions
from fincheck.eval.predictions import (
    PredictionWriter,
    check_eval_config,
    record_generation,
    record_loaded,
)
from fincheck.inference import template_fingerprint
from fincheck.jsonl import drop_torn_last_line
from fincheck.loading import load_prompt_fitter
from fincheck.pairs import Prediction
from fincheck.prepared import read_manifest, read_split
from fincheck.tasks import get_task


class NoLLM:
    """The client of a method that asks no model (overlap): any call is a bug."""

    def __init__(self) -> None:
        self.identity = {"backend": "none", "model": "none"}

    def complete(self, messages, sampling, span=None) -> str:
        raise FincheckError("this method asks no LLM")


def build_client(opts: BaselineOptions):
    if opts.method in NO_MODEL:
        return NoLLM()
    if opts.backend == "openai":
        return OpenAIChatClient(
            opts.model, opts.base_url, opts.api_key_env, opts.timeout, opts.max_retries,
            caller=METHOD,
        )  # fmt: skip
    return TransformersChatClient(
        opts.model,
        max_new_tokens=opts.max_tokens,
        device=opts.device,
        batch_size=max(1, opts.concurrency),
        window=opts.window,
    )


def step1_identity(step1: str) -> str:
    """self, oracle, or the adapter folder's absolute path (the same folder from anywhere)."""
    return str(Path(step1).resolve()) if Path(step1).is_dir() else step1


def adapter_step1(adapter: str, device: str | None):
    """Step 1 by a trained fincheck adapter: its FINAL answer (the training prompt), consistent
    when it lists nothing. One model, shared by the example threads under a lock."""
    detector = Detector.from_pretrained(adapter=adapter, device=device)
    lock = threading.Lock()

    def step1(example: Example, llm: CachedLLM) -> tuple[bool | None, dict]:
        with lock:
            found = detector.describe(example.fields["text"], example.fields["summary"])
        return (not found), {"step1": f"adapter {adapter}", "step1_descriptions": found}

    return step1


def check_method_options(opts: BaselineOptions) -> None:
    """The method's own options, checked before any model loads (a typo fails in a second)."""
    if opts.method == "two-step" and opts.step1 not in STEP1 and not Path(opts.step1).is_dir():
        raise FincheckError(
            f"--step1 {opts.step1!r}: choose self, oracle, or a fincheck adapter folder (the "
            "FINAL paper's TrueTeacher classifier is not offered: docs/baselines.md)"
        )


def build_method(opts: BaselineOptions, llm: CachedLLM) -> Method:
    if opts.method == "two-step":  # named self, oracle, or the adapter folder's name
        step1 = STEP1.get(opts.step1) or adapter_step1(opts.step1, opts.device)
        return two_step_method(Path(opts.step1).name, step1, opts.step2)
    if opts.method == "fizz":
        return fizz_method(opts, llm)
    return get_method(opts.method)


def fizz_method(opts: BaselineOptions, llm: CachedLLM) -> Method:
    """FIZZ with its NLI model, and a threshold per task chosen on the dev split first."""
    if not opts.nli_model:
        raise FincheckError(
            "--method fizz needs --nli-model (a Hugging Face NLI classifier, e.g. "
            "tals/albert-xlarge-vitaminc-mnli as in the FIZZ paper)"
        )
    nli = NLIScorer(opts.nli_model, opts.device, labels=opts.nli_labels)
    thresholds: dict[str, float] = {}

    def run(example: Example, llm: CachedLLM) -> MethodOutput:
        return run_fizz(example, llm, nli, thresholds.get(example.pair.task))

    def prepare(task: str) -> None:
        """The dev pass: score the dev split's sample (the same --limit), pick the threshold."""
        dev = sample_task(read_split(opts.data_dir, task, "dev"), task, opts)
        scores: list[tuple[float, bool]] = []

        def done(pair, output: MethodOutput, n_calls: int) -> None:
            scores.append((output.trace["score"], get_task(task).gold_consistent(pair)))

        dev_method = Method("fizz", ("final", "fhsumbench"), run, "FIZZ §3")
        failures = run_examples(
            dev_method, llm, dev, opts.concurrency, done, opts.progress, f"fizz {task} dev"
        )
        if failures:
            raise FincheckError(f"FIZZ dev pass for {task}: {len(failures)} failed: {failures[0]}")
        thresholds[task] = choose_threshold([s for s, _ in scores], [c for _, c in scores])
        record_loaded(opts.predictions_dir, **{f"fizz_threshold_{task}": thresholds[task]})

    return Method("fizz", ("final", "fhsumbench"), run, "FIZZ §3", prepare)


def fitter_identity(fitter) -> str:
    """What fits a served detector's prompts, by content: the tokenizer (a folder updated in
    place keeps its path), its chat template with the run's kwargs, the positions it allows."""
    import hashlib

    tokenizer = fitter.tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", None)
    vocab = (
        backend.to_str()
        if backend is not None
        else json.dumps(tokenizer.get_vocab(), sort_keys=True)
    )
    parts = [
        vocab,
        template_fingerprint(tokenizer, fitter.template_kwargs),
        str(fitter.position_limit),
    ]
    return hashlib.sha256("\n".join(parts).encode("utf-8")).hexdigest()[:16]


def run_examples(
    method: Method,
    llm: CachedLLM,
    pairs: list,
    concurrency: int,
    on_done,
    progress: bool,
    desc: str,
) -> list[str]:
    """Run the method on each pair, `concurrency` at a time; `on_done(pair, output, calls)`, in
    this thread, as each finishes. Returns the failures ("id: reason"); a run-stopping error
    stops the rest."""
    from tqdm.auto import tqdm

    def one(pair) -> tuple[Any, MethodOutput, int]:
        llm.start_example()
        output = method.run(Example.of(pair), llm)
        return pair, output, llm.calls

    failures: list[str] = []
    pool = ThreadPoolExecutor(max_workers=max(1, concurrency))
    futures = {pool.submit(one, pair): pair for pair in pairs}
    try:
        with tqdm(total=len(pairs), desc=desc, unit="ex", disable=not progress) as bar:
            for future in as_completed(futures):
                try:
                    pair, output, calls = future.result()
                except LLMCallError as error:
                    failures.append(f"{futures[future].id}: {error}")
                else:
                    on_done(pair, output, calls)
                bar.update(1)
    except BaseException:
        # a wrong key, a tripped breaker, Ctrl-C: send no more, and wait for no call in flight
        # (an endpoint that never answers would hold the command for timeout x retries)
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return failures


def run_baseline(opts: BaselineOptions) -> dict[str, dict[str, Any]]:
    """Predictions of the method for each task it covers; returns per-task counts."""
    opts.resolve_tasks()
    check_method_options(opts)
    client = build_client(opts)
    cache = RequestCache(opts.out_dir / "llm_cache.jsonl")
    llm = CachedLLM(client, cache, {"temperature": 0.0, "max_tokens": opts.max_tokens})
    method = build_method(opts, llm)
    tasks = [t for t in opts.tasks if t in method.tasks]
    if not tasks:
        raise FincheckError(
            f"--method {opts.method} covers {', '.join(method.tasks)}, not {', '.join(opts.tasks)}"
        )
    check_eval_config(
        opts.predictions_dir,
        {
            "model": "/".join(str(v) for v in client.identity.values()),
            "adapter": None,
            "split": opts.split,
            "method": method.name,
            "method_source": method.source,
            "backend": opts.backend,
            "limit": opts.limit,
            "sample_seed": opts.sample_seed,
            "tasks": tasks,
            "sample_by": sample_by(tasks),
            "max_tokens": opts.max_tokens,
            "nli_model": opts.nli_model,
            "nli_labels": list(opts.nli_labels) if opts.nli_labels else None,
            "step1": step1_identity(opts.step1) if opts.method == "two-step" else None,
            "step2": opts.step2 if opts.method == "two-step" else None,
            "data_fingerprint": read_manifest(opts.data_dir).get("fingerprint"),
            "tokenizer": str(Path(opts.tokenizer).resolve())
            if opts.tokenizer and Path(opts.tokenizer).exists()
            else opts.tokenizer,
            "max_input_tokens": opts.max_input_tokens,
            "requested_window": opts.window,
        },
    )
    fitter = None
    if opts.tokenizer:  # a served detector whose prompts are fitted as a local eval's
        fitter = load_prompt_fitter(opts.tokenizer, opts.window)
        record_loaded(
            opts.predictions_dir,
            window=fitter.window,
            tokenizer_fingerprint=fitter_identity(fitter),
        )
    record_loaded(opts.predictions_dir, client=client.identity)
    summary: dict[str, dict[str, Any]] = {}
    for task in tasks:
        pairs = sample_task(read_split(opts.data_dir, task, opts.split), task, opts)
        fitted = 0
        if fitter is not None:
            pairs, fitted = fit_detector_pairs(pairs, task, fitter, opts.max_input_tokens)
        if method.prepare is not None:
            method.prepare(task)
        trimmed_before = getattr(client, "trimmed", 0)  # the client counts across tasks
        summary[task] = run_task(method, llm, opts, task, pairs)
        summary[task]["trimmed"] = getattr(client, "trimmed", 0) - trimmed_before + fitted
        record_generation(opts.predictions_dir, task, summary[task])
    if getattr(client, "served_models", None):  # what the endpoint says it ran
        record_loaded(opts.predictions_dir, served_models=sorted(client.served_models))
    return summary


def run_task(
    method: Method, llm: CachedLLM, opts: BaselineOptions, task: str, pairs: list
) -> dict[str, Any]:
    """One task's predictions (those not written yet) and a trace line per example."""
    writer = PredictionWriter(opts.predictions_dir / f"{task}.jsonl", task)
    todo = [p for p in pairs if p.id not in writer.done]
    trace_path = opts.predictions_dir / f"{task}.trace.jsonl"
    drop_torn_last_line(trace_path)  # a crash or a full disk mid-write: that record is lost

    def done(pair, output: MethodOutput, n_calls: int) -> None:
        writer.write_batch(
            [
                Prediction(
                    pair.id,
                    task,
                    output.output,
                    output.p_yes,
                    cut=output.cut,
                    reasoning=output.reasoning,
                )
            ]
        )
        record = {"id": pair.id, "calls": n_calls, **output.trace}
        with trace_path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")

    try:
        failures = run_examples(
            method, llm, todo, opts.concurrency, done, opts.progress, f"{method.name} {task}"
        )
    finally:
        writer.close()
    # calls per example over every example written, this run's and earlier ones' (the trace)
    # and the method's own counts (the pipeline's merge fallbacks, ...) summed the same way
    wanted = {p.id for p in pairs}
    per_id, counts_per_id = {}, {}
    if trace_path.is_file():
        for line in trace_path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            if record.get("id") in wanted:
                per_id[record["id"]] = record["calls"]
                counts_per_id[record["id"]] = record.get("counts") or {}
    counts: dict[str, int] = {}
    for example_counts in counts_per_id.values():
        for key, n in example_counts.items():
            counts[key] = counts.get(key, 0) + n
    return {
        "total": len(pairs),
        "resumed": len(pairs) - len(todo),
        "generated": len(todo) - len(failures),
        "failed": failures,
        "calls_per_example": sum(per_id.values()) / len(per_id) if per_id else 0.0,
        **({"method_counts": counts} if counts else {}),
    }
