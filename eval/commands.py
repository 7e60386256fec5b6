"""CLI: `fincheck eval` (model -> predictions) and `fincheck score` (predictions -> figures)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fincheck.errors import FincheckError
from fincheck.inference import dtype_argument
from fincheck.out_lock import hold_out_dir
from fincheck.tasks import all_tasks, get_task, task_names

EVAL_EXAMPLES = """examples:
  # zero-shot baseline of an untuned model, 50 examples per task
  fincheck eval --model Qwen/Qwen2.5-0.5B-Instruct --data prepared --limit 50 --out runs/base
  # a LoRA adapter (its base is read from adapter_config.json unless --model is given)
  fincheck eval --adapter checkpoints/smollm2-135m-cpu --data prepared --tasks qasem,fhsumbench --out runs/tuned
  # the papers' systems as baselines (docs/baselines.md): any OpenAI-compatible endpoint...
  OPENAI_API_KEY=... fincheck eval --method e2e-cot --backend openai --model gpt-4o-2024-11-20 \\
      --data prepared --tasks final --out runs/gpt4o-cot
  # ...or a local model; FINAL's pipeline and 2-step setups, FIZZ with an NLI model
  fincheck eval --method pipeline --model smollm2-135m-instruct --data prepared --limit 20 --out runs/pipeline
  fincheck eval --method two-step --step1 oracle --step2 cot-hint --model smollm2-135m-instruct ...
  fincheck eval --method fizz --nli-model tals/albert-xlarge-vitaminc-mnli --model ... --tasks final
  # the floor of every QASem comparison: word overlap of the answer with the reference, no model
  fincheck eval --method overlap --tasks qasem --data prepared --out runs/overlap
  # --limit N of QASem draws whole reference documents (about N QAs), so the prefix tree stays fast
A rerun with the same --out resumes: ids already in predictions/<task>.jsonl are skipped (and a
baseline's LLM calls already answered come from OUT/llm_cache.jsonl)."""

SCORE_EXAMPLES = """examples:
  fincheck score --data prepared --predictions runs/tiny/predictions --out runs/tiny
  # FINAL needs a judge; any OpenAI-compatible endpoint, key read from $OPENAI_API_KEY
  fincheck score --data prepared --predictions runs/tiny/predictions --out runs/tiny \\
      --judge openai --judge-model gpt-4o-2024-11-20
  fincheck score ... --judge openai --judge-base-url http://localhost:8000/v1 --judge-model Qwen/Qwen2.5-72B-Instruct
  fincheck score ... --judge local --judge-model path/to/model
  # --judge-base-url (an OpenAI-compatible server) implies --judge openai
Exit status: 0 when everything was scored; 3 when more than --max-judge-failure-rate (2%) of the
FINAL examples needing the judge got no usable answer (call failed, or unreadable after a re-ask):
results.json and report.md are written either way. A rerun retries the failed calls; answers
received (malformed ones too) come from the cache: --judge-cache NEW re-asks those."""


def _tasks(value: str) -> tuple[str, ...]:
    tasks = tuple(t.strip() for t in value.split(",") if t.strip())
    unknown = [t for t in tasks if t not in task_names()]
    if unknown or not tasks:
        raise argparse.ArgumentTypeError(
            f"unknown task(s) {unknown}; choose from {','.join(task_names())}"
        )
    return tasks


def _json_object(value: str) -> dict:
    import json

    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return parsed


def default_max_new_tokens() -> dict[str, int]:
    return {name: task.max_new_tokens for name, task in all_tasks().items()}


def per_task_numbers(value: str, defaults: dict[str, int | None]) -> dict[str, int | None]:
    """'256' (every task) or 'final=512,fhsumbench=128' (the others keep `defaults`); each
    number at least 1."""
    out = dict(defaults)
    try:
        if "=" not in value:
            numbers = dict.fromkeys(out, int(value))
        else:
            numbers = dict(out)
            for part in value.split(","):
                task, n = part.split("=")
                if task.strip() not in out:
                    raise ValueError(task)
                numbers[task.strip()] = int(n)
        if any(n is not None and n < 1 for n in numbers.values()):
            raise ValueError(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected N or task=N,... with N >= 1 (tasks: {','.join(out)}), got {value!r}"
        ) from None
    return numbers


def _max_new_tokens(value: str) -> dict[str, int]:
    """Only the tasks given: the others keep their default, fitted to the window."""
    given = per_task_numbers(value, dict.fromkeys(task_names()))
    return {task: n for task, n in given.items() if n is not None}


def _limit(value: str) -> int | dict[str, int | None]:
    """N (every task) or task=N,... (the tasks not named: all their examples)."""
    numbers = per_task_numbers(value, dict.fromkeys(task_names()))
    if "=" not in value:
        return next(iter(numbers.values()))
    return numbers


def register(subparsers) -> None:
    defaults = default_max_new_tokens()
    p = subparsers.add_parser(
        "eval",
        help="run a model (+ adapter) over prepared evaluation pairs, write predictions",
        description="Generate predictions for the evaluation split of each task: "
        "RUN_DIR/predictions/<task>.jsonl, lines {id, task, output[, p_yes]}.",
        epilog=EVAL_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", help="base model name or path (default: the adapter's recorded base)")
    p.add_argument("--adapter", help="LoRA adapter directory (from `fincheck train`)")
    p.add_argument(
        "--data",
        required=True,
        type=Path,
        help="prepared data directory (`fincheck prepare --out`)",
    )
    p.add_argument(
        "--out", required=True, type=Path, help="run directory; predictions go to OUT/predictions/"
    )
    p.add_argument(
        "--tasks",
        type=_tasks,
        help=f"comma-separated tasks, of {','.join(task_names())} (default: every task the "
        "prepared folder holds)",
    )
    p.add_argument(
        "--split", default="test", choices=("dev", "test"), help="split to evaluate (default: test)"
    )
    p.add_argument(
        "--limit",
        type=_limit,
        help="a seeded random sample of N examples per task, or task=N,... (default: all)",
    )
    p.add_argument(
        "--sample-seed", type=int, default=0, help="seed of the --limit sample (default: 0)"
    )
    p.add_argument(
        "--batch-size", type=int, default=8, help="prompts per generate call (default: 8)"
    )
    p.add_argument(
        "--max-new-tokens",
        type=_max_new_tokens,
        default={},
        help="answer tokens at most: N, or task=N,... (default: "
        f"{','.join(f'{k}={v}' for k, v in defaults.items())}, each at most a quarter of the "
        "window)",
    )
    p.add_argument(
        "--max-input-tokens",
        type=int,
        help="prompt tokens at most: longer prompts have their grounding text trimmed (default: "
        "the window -- an adapter's training max_length, capped by the model's positions -- "
        "minus the task's --max-new-tokens; the rule detect uses too)",
    )
    p.add_argument(
        "--window",
        type=int,
        help="tokens the model may see, prompt and answer (default: an adapter's training "
        "max_length, capped by the model's positions): gives an untuned base the same prompts "
        "as its adapter",
    )
    p.add_argument(
        "--chat-template-kwargs",
        type=_json_object,
        default=None,
        help="keyword arguments of the chat template, e.g. '{\"enable_thinking\": false}' for "
        "Qwen3 (default: those the adapter was trained with, else none)",
    )
    p.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda when available)")
    p.add_argument(
        "--dtype",
        default="auto",
        type=dtype_argument,
        help="weights dtype: auto, bf16, fp16, fp32 (default auto: bf16 on a GPU that has it, "
        "else fp32)",
    )
    p.add_argument(
        "--no-prefix-reuse",
        action="store_true",
        help="the plain generate path, every prompt whole (for comparison and debugging): by "
        "default each prefix that prompts share (the task's instructions, a document, a "
        "response sentence) runs once into a KV cache, and QASem's P(Yes) needs no generation",
    )
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow the base model's own Python code from its repository (off by default)",
    )
    b = p.add_argument_group(
        "baselines: the papers' systems (--method; docs/baselines.md)",
        "Run a paper's protocol with any LLM instead of the fincheck task prompt. --model names "
        "the LLM: a local model (--backend local) or an endpoint's model (--backend openai).",
    )
    b.add_argument(
        "--method",
        choices=("e2e", "e2e-fewshot", "e2e-cot", "pipeline", "two-step", "fizz", "overlap"),
        help="e2e / e2e-fewshot / e2e-cot: every task; pipeline, two-step: FINAL; fizz: FINAL "
        "and FHSumBench; overlap: QASem, no model (the share of the answer's words found in "
        "the reference) (default: none, the fincheck prompt and an optional --adapter)",
    )
    b.add_argument(
        "--backend",
        choices=("local", "openai"),
        default="local",
        help="where --model runs (default: local). --backend openai without --method evaluates "
        "a served detector: fincheck's own prompts sent to the endpoint (vLLM, llama.cpp, "
        "`transformers serve`), QASem's P(Yes) from its logprobs when it returns them",
    )
    b.add_argument("--base-url", help="OpenAI-compatible base URL (default: api.openai.com)")
    b.add_argument(
        "--tokenizer",
        help="a served detector (--backend openai, no --method): fit its prompts to the window "
        "as a local eval does -- an adapter's run folder (its tokenizer, training length and "
        "template kwargs) or the served model's tokenizer (folder or name; window: its "
        "positions, or --window); --max-input-tokens and --window then apply (default: prompts "
        "sent whole, answers at the task's default budget)",
    )
    b.add_argument(
        "--api-key-env",
        default="OPENAI_API_KEY",
        help="environment variable holding the API key (default: OPENAI_API_KEY); the key is "
        "never written anywhere",
    )
    b.add_argument("--concurrency", type=int, default=8, help="examples in flight (default: 8)")
    b.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds per call (default: 60; raise it for a slow server writing long answers)",
    )
    b.add_argument(
        "--max-retries",
        type=int,
        default=4,
        help="retries on 429/5xx/timeouts, honouring Retry-After (default: 4: an endpoint that "
        "never answers gives a one-line error within about five minutes)",
    )
    b.add_argument(
        "--llm-max-tokens",
        type=int,
        default=512,
        help="answer tokens per call, reasoning included (default: 512)",
    )
    b.add_argument(
        "--step1",
        default="self",
        help="two-step, step 1: self (the model's binary CoT), oracle (the gold label), or a "
        "fincheck adapter folder (default: self)",
    )
    b.add_argument(
        "--step2",
        default="cot",
        choices=("cot", "cot-hint"),
        help="two-step, step 2: cot or cot-hint (default: cot)",
    )
    b.add_argument("--nli-model", help="fizz: a Hugging Face NLI sequence classifier")
    b.add_argument(
        "--nli-labels",
        type=lambda text: tuple(text.split(",")),
        help="fizz: the NLI model's three labels in its output order, for a model saved without "
        "label names (LABEL_0..2), e.g. entailment,contradiction,neutral (named labels, also "
        "SUPPORTS/REFUTES/NOT ENOUGH INFO, are read from the model's config)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(
        func=eval_command,
        mode_defaults={
            dest: p.get_default(dest) for dest in (*PLAIN_ONLY, *METHOD_ONLY, *LOCAL_ONLY)
        },
    )

    s = subparsers.add_parser(
        "score",
        help="score predictions against the prepared gold: results.json, report.md, plots",
        description="Join predictions with the gold by id and compute the papers' figures "
        "(FINAL: judge matching, micro P/R/F1, binarized BAcc; QASem: BAcc/AUC per subset; "
        "FHSumBench: macro P/R/F with the reference scorer's semantics), with 95% bootstrap CIs.",
        epilog=SCORE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument("--data", required=True, type=Path, help="prepared data directory (the gold)")
    s.add_argument(
        "--predictions", required=True, type=Path, help="directory with <task>.jsonl predictions"
    )
    s.add_argument(
        "--out",
        required=True,
        type=Path,
        help="where results.json, report.md, plots/ and scored/ go",
    )
    s.add_argument(
        "--tasks", type=_tasks, help="tasks to score (default: every task with a predictions file)"
    )
    s.add_argument(
        "--split", default="test", choices=("dev", "test"), help="gold split (default: test)"
    )
    s.add_argument(
        "--judge",
        default=None,
        choices=("none", "openai", "local"),
        help="FINAL matching judge (default: openai when --judge-base-url is given, local when "
        "--judge-model is an existing folder, openai when it is a model name; else none = "
        "FINAL P/R/F1 not computed)",
    )
    s.add_argument("--judge-model", help="judge model name (openai) or path (local)")
    s.add_argument(
        "--max-judge-failure-rate",
        type=float,
        default=0.02,
        help="exit 3 when a larger share of the FINAL examples needing the judge got no usable "
        "answer (default: 0.02)",
    )
    s.add_argument(
        "--judge-prompt",
        default="paper",
        choices=("paper", "strict"),
        help="FINAL matching criteria: paper = the FINAL paper's (prompt E.4, default); strict = "
        "also no match for omissions and multi-fact descriptions (a variant, named in the report)",
    )
    s.add_argument("--judge-base-url", help="OpenAI-compatible base URL (default: api.openai.com)")
    s.add_argument(
        "--judge-api-key-env",
        default="OPENAI_API_KEY",
        help="environment variable holding the judge's API key (default: OPENAI_API_KEY)",
    )
    s.add_argument(
        "--judge-concurrency", type=int, default=8, help="judge calls in flight (default: 8)"
    )
    s.add_argument(
        "--no-judge-sanity",
        action="store_true",
        help="skip the judge sanity set (by default the judge also matches 15 descriptions of "
        "known answer, 12 calls, cached, and its agreement is printed beside FINAL's figures)",
    )
    s.add_argument(
        "--judge-timeout", type=float, default=60.0, help="seconds per judge call (default: 60)"
    )
    s.add_argument(
        "--judge-max-retries",
        type=int,
        default=4,
        help="retries on 429/5xx/timeouts/connection errors, honouring Retry-After (default: 4)",
    )
    s.add_argument(
        "--judge-max-tokens",
        type=int,
        default=1024,
        help="answer budget per judge call, reasoning included (default: 1024)",
    )
    s.add_argument(
        "--judge-cache", type=Path, help="judge answer cache (default: OUT/judge_cache.jsonl)"
    )
    s.add_argument(
        "--bootstrap",
        type=int,
        default=1000,
        help="bootstrap resamples for the CIs (default: 1000)",
    )
    s.add_argument("--seed", type=int, default=0, help="bootstrap seed (default: 0)")
    s.add_argument(
        "--report-to",
        default="none",
        choices=("none", "wandb"),
        help="also log results and the report to wandb (WANDB_MODE=offline works)",
    )
    s.add_argument("--wandb-project", default="fincheck", help="wandb project (default: fincheck)")
    s.add_argument("--no-progress", action="store_true", help="no progress bars")
    s.set_defaults(func=score_command)


def baseline_command(args) -> int:
    from fincheck.eval.baselines.runner import BaselineOptions, get_method_needs_llm, run_baseline

    needs_llm = get_method_needs_llm(args.method)
    if not args.model and needs_llm:
        raise FincheckError("--method needs --model (the LLM that runs it)")
    if args.model and not needs_llm:
        raise FincheckError(f"--method {args.method} asks no model: leave out --model")
    if args.adapter:
        raise FincheckError(
            "--method runs a paper's system with --model; a fincheck adapter goes in --step1 "
            "(two-step) or in a plain `fincheck eval --adapter` run"
        )
    opts = BaselineOptions(
        method=args.method,
        model=args.model or "none",
        data_dir=args.data,
        out_dir=args.out,
        backend=args.backend,
        tasks=args.tasks,
        split=args.split,
        limit=args.limit,
        sample_seed=args.sample_seed,
        base_url=args.base_url,
        api_key_env=args.api_key_env,
        concurrency=args.concurrency,
        timeout=args.timeout,
        max_retries=args.max_retries,
        max_tokens=args.llm_max_tokens,
        step1=args.step1,
        step2=args.step2,
        nli_model=args.nli_model,
        nli_labels=args.nli_labels,
        device=args.device,
        window=args.window,
        tokenizer=args.tokenizer,
        max_input_tokens=args.max_input_tokens,
        progress=not args.no_progress,
    )
    summary = run_baseline(opts)
    failed = 0
    for task, counts in summary.items():
        failed += len(counts["failed"])
        trimmed = f", {counts['trimmed']} prompts trimmed" if counts.get("trimmed") else ""
        print(
            f"{task}: {counts['generated']} done, {counts['resumed']} already done, "
            f"{len(counts['failed'])} failed, {counts['calls_per_example']:.1f} LLM calls per "
            f"example{trimmed} -> {opts.predictions_dir / (task + '.jsonl')}"
        )
        if counts.get("method_counts"):
            print(f"  {task}: " + ", ".join(f"{k} {v}" for k, v in counts["method_counts"].items()))
    answered = sum(c["generated"] + c["resumed"] for c in summary.values())
    if answered:
        print(
            f"next: fincheck score --data {args.data} --predictions {opts.predictions_dir} "
            f"--out {args.out}"
        )
    if failed:
        first = next(c["failed"][0] for c in summary.values() if c["failed"])
        print(
            f"fincheck eval: {failed} example(s) failed (first: {first}); rerun to retry them "
            "(answers received are cached)",
            file=sys.stderr,
        )
        return 3
    return 0


# Options that only one mode reads: given to the other, they are an error, never ignored.
PLAIN_ONLY = {
    "batch_size": "--batch-size",
    "max_new_tokens": "--max-new-tokens",
    "max_input_tokens": "--max-input-tokens",
    "chat_template_kwargs": "--chat-template-kwargs",
    "dtype": "--dtype",
    "no_prefix_reuse": "--no-prefix-reuse",
    "trust_remote_code": "--trust-remote-code",
}
METHOD_ONLY = {
    "backend": "--backend",
    "base_url": "--base-url",
    "api_key_env": "--api-key-env",
    "concurrency": "--concurrency",
    "timeout": "--timeout",
    "max_retries": "--max-retries",
    "llm_max_tokens": "--llm-max-tokens",
    "step1": "--step1",
    "step2": "--step2",
    "nli_model": "--nli-model",
    "nli_labels": "--nli-labels",
}


# Options that one method alone reads, and those only a local model reads.
ONE_METHOD_ONLY = {
    "step1": ("--step1", "two-step"),
    "step2": ("--step2", "two-step"),
    "nli_model": ("--nli-model", "fizz"),
    "nli_labels": ("--nli-labels", "fizz"),
}
LOCAL_ONLY = {"window": "--window", "device": "--device"}
# What a served detector reads beyond the endpoint's options: prompts fitted with a tokenizer.
SERVED_DETECTOR = {"tokenizer", "max_input_tokens", "window"}


def unused_options(args) -> list[str]:
    """The options given that the chosen mode (plain eval, or --method, its backend) would not
    read."""
    defaults = getattr(args, "mode_defaults", {})

    def given(dest: str) -> bool:
        return getattr(args, dest) != defaults.get(dest)

    served = args.method == "detector"
    other = PLAIN_ONLY if args.method else METHOD_ONLY
    unused = [
        flag
        for dest, flag in other.items()
        if given(dest) and not (served and dest in SERVED_DETECTOR)
    ]
    if args.tokenizer and not served:
        unused.append("--tokenizer")
    if args.method:
        unused += [
            flag
            for dest, (flag, method) in ONE_METHOD_ONLY.items()
            if method != args.method and given(dest)
        ]
        if args.backend == "openai":
            unused += [
                flag
                for dest, flag in LOCAL_ONLY.items()
                if given(dest) and not (served and dest in SERVED_DETECTOR)
            ]
    return unused


def eval_command(args) -> int:
    if args.method is None and args.backend == "openai":
        # a served detector: fincheck's own prompts, answered by the endpoint
        if args.adapter:
            raise FincheckError(
                "--adapter with --backend openai: the server serves the adapter (merged, or as a "
                "LoRA module); name it with --model, and give --tokenizer ADAPTER_DIR to fit the "
                "prompts as its local eval would (docs/serving.md)"
            )
        args.method = "detector"
        served = True
    else:
        served = False
    unused = unused_options(args)
    if unused:
        mode = f"--method {args.method}" if args.method else "a plain eval (no --method)"
        if args.method and args.backend == "openai":
            mode += " with --backend openai"
        if served:
            mode = "a served detector (--backend openai without --method)"
        raise FincheckError(f"{', '.join(unused)}: not used by {mode}; leave them out")
    if args.tasks is None:
        from fincheck.prepared import prepared_tasks

        args.tasks = tuple(prepared_tasks(args.data))
    with hold_out_dir(args.out, "fincheck eval"):  # one writer per --out
        if args.method:
            return baseline_command(args)
        return plain_eval_command(args)


def plain_eval_command(args) -> int:
    from fincheck.eval.generate import EvalOptions, resolve_base_model, run_eval

    opts = EvalOptions(
        model=resolve_base_model(args.model, args.adapter),
        adapter=args.adapter,
        data_dir=args.data,
        out_dir=args.out,
        tasks=args.tasks,
        split=args.split,
        limit=args.limit,
        sample_seed=args.sample_seed,
        batch_size=args.batch_size,
        max_new_tokens=args.max_new_tokens,
        max_input_tokens=args.max_input_tokens,
        window=args.window,
        template_kwargs=args.chat_template_kwargs,
        prefix_reuse=not args.no_prefix_reuse,
        trust_remote_code=args.trust_remote_code,
        device=args.device,
        dtype=args.dtype,
        progress=not args.no_progress,
    )
    summary = run_eval(opts)
    for task, counts in summary.items():
        print(
            f"{task}: {counts['generated']} generated, {counts['resumed']} already done, "
            f"{counts['trimmed']} prompts trimmed -> {opts.predictions_dir / (task + '.jsonl')}"
        )
    print(
        f"next: fincheck score --data {args.data} --predictions {opts.predictions_dir} --out {args.out}"
    )
    return 0


def judge_kind(judge: str | None, model: str | None, base_url: str | None) -> str:
    """The judge backend the options name. A base URL or a judge model never goes unused: given
    without --judge they choose it, and with --judge none they are an error."""
    if judge is None:
        if base_url:
            return "openai"
        if model:
            return "local" if Path(model).is_dir() else "openai"
        return "none"
    if judge == "none" and (model or base_url):
        given = "--judge-base-url" if base_url else "--judge-model"
        raise FincheckError(f"{given} was given with --judge none: drop one of them")
    if judge == "local" and base_url:
        raise FincheckError("--judge-base-url is for --judge openai, not --judge local")
    return judge


def build_judge(args):
    from fincheck.eval.judge import JudgePrompt, MatchingJudge
    from fincheck.eval.llm import RequestCache

    args.judge = judge_kind(args.judge, args.judge_model, args.judge_base_url)
    if args.judge == "none":
        return None
    if not args.judge_model:
        raise FincheckError(f"--judge {args.judge} needs --judge-model")
    if args.judge == "openai":
        from fincheck.eval.llm_backends import OpenAIChatClient

        client = OpenAIChatClient(
            args.judge_model,
            args.judge_base_url,
            args.judge_api_key_env,
            args.judge_timeout,
            args.judge_max_retries,
        )
    else:
        from fincheck.eval.llm_backends import TransformersChatClient

        # Concurrent calls are batched by the client's worker thread.
        client = TransformersChatClient(args.judge_model, max_new_tokens=args.judge_max_tokens)
    cache_path = args.judge_cache or args.out / "judge_cache.jsonl"
    sampling = {"temperature": 0.0, "max_tokens": args.judge_max_tokens}  # part of the cache key
    prompt = JudgePrompt.named(args.judge_prompt)
    return MatchingJudge(client, RequestCache(cache_path), prompt=prompt, sampling=sampling)


def score_command(args) -> int:
    from fincheck.eval.score import ScoreOptions, run_score

    opts = ScoreOptions(
        data_dir=args.data,
        predictions_dir=args.predictions,
        out_dir=args.out,
        split=args.split,
        tasks=args.tasks,
        judge=build_judge(args),
        judge_concurrency=args.judge_concurrency,
        judge_sanity=not args.no_judge_sanity,
        bootstrap_resamples=args.bootstrap,
        seed=args.seed,
        progress=not args.no_progress,
    )
    results, _ = run_score(opts)
    for task, figures in results["tasks"].items():
        print(f"{task}: {get_task(task).headline_text(figures)}")
    print(f"report: {args.out / 'report.md'}")
    if args.report_to == "wandb":
        from fincheck.eval.wandb_report import log_to_wandb

        log_to_wandb(results, args.out, args.wandb_project)
    return judge_exit_status(results.get("judge"), args.max_judge_failure_rate)


def judge_exit_status(judge: dict | None, max_rate: float) -> int:
    """3 when too many examples got no usable judge answer (their figures count them as misses,
    so the headline would understate the model), else 0; one line either way."""
    if not judge or not judge.get("asked"):
        return 0
    failed = judge["errors"] + judge["parse_failed"]
    if not failed:
        return 0
    rate = failed / judge["asked"]
    what = (
        f"{failed} of {judge['asked']} FINAL examples ({rate:.1%}) got no usable judge answer "
        f"({judge['errors']} calls failed, {judge['parse_failed']} answers unreadable; first: "
        f"{(judge.get('first_error') or '?')[:120]})"
    )
    if rate > max_rate:
        print(
            f"fincheck score: error: {what}, above --max-judge-failure-rate {max_rate:.0%}: the "
            "FINAL figures are not comparable (a rerun retries the failed calls; answers received, "
            "malformed ones too, are cached: point --judge-cache elsewhere to re-ask those)",
            file=sys.stderr,
        )
        return 3
    print(f"fincheck score: warning: {what}; counted as misses", file=sys.stderr)
    return 0
