"""The eval path itself on a real model: naive, batched and prefix-reuse, side by side.

`scripts/bench_eval.py --model smollm2-135m-instruct --prepared-dir prepared` runs
`fincheck eval` (`fincheck.eval.generate.run_eval`, model loading included) once per mode on the
same examples, into a scratch folder, and reports per task:

  naive         batch 1, the plain path: every prompt on its own
  batched       `batch_size` prompts per call, longest first, left padding
  prefix-reuse  the default of `fincheck eval` (`fincheck.inference.shared_prefix`): every prefix that
                prompts share (the task's instructions, a document, a response sentence) runs
                once into a KV cache, each prompt only its own suffix from a copy, batched

Two more kinds of mode compare the CPU paths a user can pick (`--modes prefix-reuse:fp32,
prefix-reuse:bf16,served-f16,served-q4_k_m --gguf f16=F16.gguf,q4_k_m=Q4.gguf`):

  prefix-reuse:DTYPE  prefix reuse with the weights in DTYPE (fp32, bf16), whatever --dtype says
  served-TYPE         the `fincheck export --gguf` file of that type, served by llama-cpp-python's
                      server (`python -m llama_cpp.server`, started here on loopback with
                      --threads) and evaluated through it (`fincheck eval --backend openai`,
                      one request at a time, so the server's cache keeps each document's prefix)
  llama-server-TYPE   the same file served by llama.cpp's own C++ server (`--llama-server`,
                      default the one `scripts/build_llama_server.py` built; one slot, the same
                      threads), evaluated the same way

With `--memory`, each local mode runs in a process of its own and the report gives its peak
resident memory; a served mode gives the server's (the process that holds the model).

For each mode: wall seconds, examples/s, prompt tokens/s (the fitted prompts' tokens, the same
count in every mode, over the wall time), the prompt tokens the model actually ran (fewer with
prefix reuse); against the first mode listed (naive by default; `--modes batched,prefix-reuse`
skips the slowest on a full split): the speed-up, the largest |p_yes| difference on QASem, and
the share of identical answers (QASem's Yes/No word, the generating tasks' whole text).

The examples are `fincheck eval`'s own sample (`--limit`, `--sample-seed`): QASem by whole
reference documents, about N QAs, every QA asked over them as the full split holds them (97
documents, 1,556 QAs; a sample of single QAs would share nothing and hide what prefix reuse
saves); FINAL and FHSumBench by example, which hides the documents FHSumBench's summaries share
(227 documents for 667 summaries): their full splits show it. `--limit 0`: every example.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench import workload as wl
from fincheck.eval.options import EvalRun
from fincheck.io.config import config_field
from fincheck.metrics.classification import parse_yes_no
from fincheck.tasks import all_tasks, get_task, per_task_numbers

PATH_MODES = ("naive", "batched", "prefix-reuse")
# A served mode is named by its server and the type of the file it serves: served-f16.
SERVERS = {"served-": "llama_cpp.server", "llama-server-": "llama-server"}


def served_mode(mode: str) -> tuple[str, str] | None:
    """(server, gguf type) of a served mode; None for a local one."""
    for prefix, server in SERVERS.items():
        if mode.startswith(prefix):
            return server, mode[len(prefix) :]
    return None


@dataclass
class EvalPathSettings:
    model: str = config_field("smollm2-135m-instruct", "a real model: name, folder or hub id")
    adapter: str | None = config_field(None, "a fincheck adapter run folder (default: none)")
    prepared_dir: Path = config_field(Path("prepared"), "a `fincheck prepare` output")
    tasks: list[str] = config_field(["qasem"], "comma list of tasks")
    modes: list[str] = config_field(
        list(PATH_MODES),
        "comma list of naive, batched, prefix-reuse, prefix-reuse:DTYPE, served-TYPE, "
        "llama-server-TYPE (a --gguf file)",
    )
    gguf: dict[str, str] = config_field(
        {},
        "TYPE=FILE,...: the exported GGUF files the served modes serve",
        parse=lambda text: dict(item.split("=", 1) for item in text.split(",") if item),
    )
    tokenizer: str | None = config_field(
        None, "what fits a served mode's prompts (default: --adapter, else --model)"
    )
    threads: int = config_field(2, "a served mode's llama.cpp threads", at_least=1)
    llama_server: str | None = config_field(
        None, "the llama-server binary (default: the one scripts/build_llama_server.py built)"
    )
    server_args: str = config_field(
        "", "more arguments for a served mode's server, as one string (`-fa off`)"
    )
    memory: bool = config_field(
        False, "run each local mode in its own process and report its peak resident memory"
    )
    limit: int | dict[str, int] = config_field(
        {"qasem": 100, "final": 32, "fhsumbench": 32},
        "examples per task as `fincheck eval --limit` samples them: N, or task=N,... (QASem: "
        "whole documents, about N QAs); 0: all",
        parse=lambda text: 0 if text.strip() == "0" else per_task_numbers(text),
    )
    batch_size: int = config_field(8, "prompts per call in batched and prefix-reuse modes")
    window: int | None = config_field(1024, "tokens the model may see, as `fincheck eval --window`")
    dtype: str = config_field(
        "auto", "weights' dtype, as `fincheck eval --dtype` (auto: fp32 on a CPU)"
    )
    seed: int = config_field(0, "seed of the samples")
    scratch: Path = config_field(Path("runs/bench-eval-paths"), "scratch folder (replaced)")
    progress: bool = config_field(False, "show the eval's progress bars (rate and ETA) on stderr")


@dataclass
class PathResult:
    task: str
    mode: str
    examples: int
    seconds: float
    prompt_tokens: int
    examples_per_s: float
    prompt_tokens_per_s: float
    tokens_run: int | None = None  # prompt tokens through the model (prefix reuse: fewer)
    # against the reference mode (the first of `modes`):
    speedup: float | None = None
    max_abs_delta_p_yes: float | None = None  # QASem only
    same_output_share: float | None = None  # identical answers
    mean_abs_delta_p_yes: float | None = None
    peak_rss_gib: float | None = None  # the process holding the model (`--memory`, served modes)
    differing: list[dict] = field(default_factory=list)  # answers unlike the reference's


@dataclass
class EvalPathReport:
    device: str
    settings: dict
    reference_mode: str
    results: list[PathResult] = field(default_factory=list)

    def to_json(self, command: str) -> dict:
        return {"command": command, **asdict(self)}


def prompt_tokens(s: EvalPathSettings, sample: EvalRun) -> dict[str, tuple[int, int]]:
    """Per task: tokens of the prompts as the eval path fits them (the same in every mode), and
    those the prefix-reuse path runs through the model (each shared prefix once)."""
    from fincheck.inference.generation import answer_budgets
    from fincheck.inference.prefix_tree import build_prefix_tree, count_prefill_tokens
    from fincheck.models.loading import LoadOptions, load_model

    loaded = load_model(s.model, s.adapter, LoadOptions(window=s.window, dtype=s.dtype))
    budgets = answer_budgets(all_tasks(), loaded.window)
    totals = {}
    for task in s.tasks:
        ids = []
        for pair in sample.sample(task):
            fit = loaded.fit_for_answer(
                pair.prompt_messages, pair.meta.get("grounding_span"), budgets[task]
            )
            ids.append(loaded.tokenizer(fit.text, add_special_tokens=False)["input_ids"])
        totals[task] = (sum(map(len, ids)), count_prefill_tokens(ids, build_prefix_tree(ids)))
    return totals


def answer_of(task: str, output: str) -> str:
    """What is compared between modes: QASem's Yes/No word (prefix reuse decodes only the
    answer's first token where the plain path writes on, `No.` vs `No, because ...`); the
    whole text for the generating tasks."""
    if get_task(task).answers_yes_no:
        word = parse_yes_no(output)
        return output if word is None else ("yes" if word else "no")
    return output


def check_modes(s: EvalPathSettings) -> None:
    for mode in s.modes:
        name, _, dtype = mode.partition(":")
        served = served_mode(mode)
        if served:
            if served[1] not in s.gguf:
                raise ValueError(f"{mode}: give its file with --gguf {served[1]}=FILE")
            if served[0] == "llama-server":
                llama_server_binary(s)  # built or given, before anything runs
        elif name not in PATH_MODES or (dtype and name != "prefix-reuse"):
            raise ValueError(
                f"unknown mode {mode!r}; the modes: {', '.join(PATH_MODES)}, "
                "prefix-reuse:DTYPE, served-TYPE, llama-server-TYPE"
            )


def llama_server_binary(s: EvalPathSettings) -> Path:
    from fincheck.serve.llama_server_build import built_llama_server

    binary = Path(s.llama_server) if s.llama_server else built_llama_server()
    if binary is None or not binary.is_file():
        raise ValueError(
            f"no llama-server at {binary or 'the cache'}: build it (python "
            "scripts/build_llama_server.py) or give --llama-server"
        )
    return binary


def mode_options(base, s: EvalPathSettings, mode: str, task: str, out: Path):
    """The eval options of one mode (a served one's before its server's address is known)."""
    from fincheck.eval.options import EvalOptions

    served = served_mode(mode)
    # this task's cap alone: a cap for a task a run does not answer is refused
    limit = base.limit.get(task) if isinstance(base.limit, dict) else base.limit
    if served:
        return EvalOptions(
            backend="openai",
            model=str(s.gguf[served[1]]),
            tokenizer=s.tokenizer or s.adapter or s.model,
            data_dir=s.prepared_dir,
            out_dir=out,
            tasks=(task,),
            limit=limit,
            sample_seed=s.seed,
            window=s.window,
            concurrency=1,
            progress=s.progress,
        )
    name, _, dtype = mode.partition(":")
    return dataclasses.replace(
        base,
        out_dir=out,
        tasks=(task,),
        limit=limit,
        prefix_reuse=name == "prefix-reuse",
        batch_size=1 if name == "naive" else s.batch_size,
        dtype=dtype or base.dtype,
    )


def run_mode(opts, s: EvalPathSettings, mode: str) -> tuple[float, float | None]:
    """(wall seconds of the eval, peak resident GiB of the process holding the model or None)."""
    from fincheck.eval.generate import run_eval

    served = served_mode(mode)
    if served:  # timed from the server's start: its model load counts
        command = server_command(s, served[0], Path(opts.model))
        start = time.perf_counter()
        with serving(command, opts.out_dir) as server:
            run_eval(dataclasses.replace(opts, base_url=server.url))
            seconds = time.perf_counter() - start
        return seconds, server.peak_rss_gib
    if not s.memory:
        start = time.perf_counter()
        run_eval(opts)
        return time.perf_counter() - start, None
    return timed_in_own_process(opts)


def timed_in_own_process(opts) -> tuple[float, float]:
    """The eval in a fresh process (spawned: nothing of this one's memory), its wall seconds
    (measured there, without the imports) and its peak resident memory (`wait4`)."""
    import multiprocessing

    seconds_file = opts.out_dir.parent / f".{opts.out_dir.name}.seconds"
    child = multiprocessing.get_context("spawn").Process(
        target=_timed_eval, args=(opts, seconds_file)
    )
    child.start()
    _, status, usage = os.wait4(child.pid, 0)
    if status != 0:
        raise RuntimeError(f"the eval of {opts.out_dir.name} failed (wait status {status})")
    return float(seconds_file.read_text()), usage.ru_maxrss / 2**20  # KiB -> GiB


def _timed_eval(opts, seconds_file: Path) -> None:
    from fincheck.eval.generate import run_eval

    start = time.perf_counter()
    run_eval(opts)
    seconds_file.write_text(str(time.perf_counter() - start))


@dataclass
class Server:
    url: str
    peak_rss_gib: float | None = None


def server_command(s: EvalPathSettings, server: str, gguf: Path) -> list[str]:
    """The server's command line up to its address: its context the window (every fitted
    prompt and its answer fit), its threads; llama-server with one slot (one request at a time,
    as llama-cpp-python's), so both keep one document's prefix between requests, no host prompt
    cache (`-cram 0`: it grew to 3.5 GiB over 40 summaries) and no flash attention: its CPU
    kernel rounds queries to f16 (P(Yes) off the local detector's by up to 2.5e-3 on 101 QAs,
    against 9.2e-4 without it, at the same speed)."""
    context, threads = str(s.window or 4096), str(s.threads)
    if server == "llama-server":
        command = [str(llama_server_binary(s)), "-m", str(gguf), "-c", context, "-np", "1"]
        command += ["-fa", "off", "-cram", "0", "-t", threads, "-tb", threads]
    else:
        command = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf)]
        command += ["--n_ctx", context, "--n_threads", threads, "--n_threads_batch", threads]
    return [*command, *shlex.split(s.server_args)]


@contextlib.contextmanager
def serving(command: list[str], log_dir: Path):
    """`command` serving on a free loopback port (`--host`/`--port` appended: both servers
    spell them so) until the block ends; then its peak memory."""
    import socket
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log_dir.mkdir(parents=True, exist_ok=True)
    command = [*command, "--host", "127.0.0.1", "--port", str(port)]
    with open(log_dir / "server.log", "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    server = Server(f"http://127.0.0.1:{port}/v1")
    try:
        deadline = time.monotonic() + 300
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the server stopped at start: see {log_dir}/server.log")
            try:
                with urllib.request.urlopen(f"{server.url}/models", timeout=5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("the server did not start in 300 s") from None
                time.sleep(0.5)
        yield server
    finally:
        process.terminate()
        _, _, usage = os.wait4(process.pid, 0)
        server.peak_rss_gib = usage.ru_maxrss / 2**20


def run_eval_paths(s: EvalPathSettings, log=lambda line: print(line, flush=True)) -> EvalPathReport:
    from fincheck.eval.options import EvalOptions
    from fincheck.eval.predictions import read_predictions

    check_modes(s)
    if s.scratch.exists():
        shutil.rmtree(s.scratch)  # the benchmark's own scratch folder
    base = EvalOptions(
        model=s.model, adapter=s.adapter, data_dir=s.prepared_dir, out_dir=s.scratch,
        limit=s.limit or None,  # 0: every example
        sample_seed=s.seed, batch_size=s.batch_size, window=s.window, dtype=s.dtype,
        progress=s.progress,
    )  # fmt: skip
    tokens = prompt_tokens(s, base)
    report = EvalPathReport(
        device=wl.device_name(),
        settings={k: str(v) if isinstance(v, Path) else v for k, v in asdict(s).items()},
        reference_mode=s.modes[0],
    )
    for task in s.tasks:
        for mode in s.modes:
            out = s.scratch / f"{task}-{mode.replace(':', '-')}"
            log(f"[{task} / {mode}] ...")
            seconds, rss = run_mode(mode_options(base, s, mode, task, out), s, mode)
            predictions = {p.id: p for p in read_predictions(out / "predictions" / f"{task}.jsonl")}
            n = len(predictions)
            total, reused = tokens[task]
            result = PathResult(task, mode, n, seconds, total, n / seconds, total / seconds)
            result.tokens_run = reused if mode.startswith("prefix-reuse") else total
            result.peak_rss_gib = rss
            if mode == report.reference_mode:  # the first of s.modes: run before the others
                ref, ref_seconds = predictions, seconds
            else:
                compare_to_reference(result, task, ref, predictions, ref_seconds)
            report.results.append(result)
            log(f"[{task} / {mode}] {n} examples in {seconds:.1f}s ({n / seconds:.2f} ex/s)")
    return report


def compare_to_reference(
    result: PathResult, task: str, ref: dict, predictions: dict, ref_seconds: float
) -> None:
    """Speed-up, answers alike (those unlike listed with both texts) and p_yes differences."""
    result.speedup = ref_seconds / result.seconds
    ids = sorted(predictions)
    unlike = [
        i for i in ids if answer_of(task, ref[i].output) != answer_of(task, predictions[i].output)
    ]
    result.same_output_share = 1 - len(unlike) / len(ids)
    result.differing = [
        {"id": i, "reference": ref[i].output, "this": predictions[i].output} for i in unlike
    ]
    if get_task(task).reads_p_yes:
        deltas = [abs(ref[i].p_yes - predictions[i].p_yes) for i in ids]
        result.max_abs_delta_p_yes = max(deltas)
        result.mean_abs_delta_p_yes = sum(deltas) / len(deltas)


def format_paths_report(report: EvalPathReport) -> str:
    def num(value, spec):
        return "-" if value is None else format(value, spec)

    rows = [
        f"| task | mode | examples | seconds | ex/s | prompt tok/s | tokens run | "
        f"x {report.reference_mode} | max abs dp_yes | mean abs dp_yes | same answers | "
        "peak RSS GiB |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in report.results:
        rows.append(
            f"| {r.task} | {r.mode} | {r.examples} | {r.seconds:.1f} | {r.examples_per_s:.2f} | "
            f"{r.prompt_tokens_per_s:,.0f} | {num(r.tokens_run, ',')} | "
            f"{num(r.speedup, '.1f')} | "
            f"{num(r.max_abs_delta_p_yes, '.1e')} | {num(r.mean_abs_delta_p_yes, '.1e')} | "
            f"{num(r.same_output_share, '.1%')} | {num(r.peak_rss_gib, '.2f')} |"
        )
    return "\n".join(rows)
