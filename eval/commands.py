"""CLI: `fincheck eval` (a detector -> predictions), `fincheck baseline` (a paper's system ->
predictions) and `fincheck score` (predictions -> figures). Their flags are the fields of
`fincheck.eval.options`."""

from __future__ import annotations

import argparse
import sys

from fincheck.errors import FincheckError, UsageError
from fincheck.eval.baselines.registry import ASKS_NO_LLM
from fincheck.eval.options import BaselineOptions, EvalOptions, ScoreOptions
from fincheck.io.config import add_options, read_options
from fincheck.io.out_lock import hold_out_dir
from fincheck.tasks import all_tasks, get_task

EVAL_EXAMPLES = """examples:
  # zero-shot baseline of an untuned model, 50 examples per task
  fincheck eval --model Qwen/Qwen2.5-0.5B-Instruct --data prepared --limit 50 --out runs/base
  # a LoRA adapter (its base is read from adapter_config.json unless --model is given)
  fincheck eval --adapter checkpoints/smollm2-135m-cpu --data prepared --tasks qasem,fhsumbench --out runs/tuned
  # a served detector (vLLM, `transformers serve`): its prompts fitted with the adapter's tokenizer
  fincheck eval --backend openai --base-url http://localhost:8000/v1 --model fincheck \\
      --tokenizer checkpoints/smollm2-135m-cpu --data prepared --out runs/served
  # --limit N of QASem draws whole reference documents (about N QAs), so the prefix tree stays fast
A rerun with the same --out resumes: ids already in predictions/<task>.jsonl are skipped.
The papers' systems run with `fincheck baseline`."""

BASELINE_EXAMPLES = """examples (docs/baselines.md):
  # any OpenAI-compatible endpoint...
  OPENAI_API_KEY=... fincheck baseline --method e2e-cot --backend openai --model gpt-4o-2024-11-20 \\
      --data prepared --tasks final --out runs/gpt4o-cot
  # ...or a local model; FINAL's pipeline and 2-step setups, FIZZ with an NLI model
  fincheck baseline --method pipeline --model smollm2-135m-instruct --data prepared --limit 20 --out runs/pipeline
  fincheck baseline --method two-step --step1 oracle --step2 cot-hint --model smollm2-135m-instruct ...
  fincheck baseline --method fizz --nli-model tals/albert-xlarge-vitaminc-mnli --model ... --tasks final
  # the floor of every QASem comparison: word overlap of the answer with the reference, no model
  fincheck baseline --method overlap --tasks qasem --data prepared --out runs/overlap
A rerun with the same --out resumes: LLM calls already answered come from OUT/llm_cache.jsonl."""

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


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "eval",
        help="run a detector (a model + adapter, or a served one) over prepared pairs",
        description="Generate predictions for the evaluation split of each task: "
        "RUN_DIR/predictions/<task>.jsonl, lines {id, task, output[, p_yes]}.",
        epilog=EVAL_EXAMPLES,
    )
    add_options(p, EvalOptions)
    p.set_defaults(
        func=eval_command,
        options=EvalOptions,
        moved_flags={
            "--method": "the papers' systems run with `fincheck baseline --method`",
            "--llm-max-tokens": "a served detector's answers get each task's budget (fitted to "
            "the window with --tokenizer); --llm-max-tokens is `fincheck baseline`'s",
        },
    )
    b = subparsers.add_parser(
        "baseline",
        help="run a paper's system (FINAL's, FIZZ, word overlap) with any LLM, write predictions",
        description="The papers' own systems beside fincheck's detector, with a local model or "
        "any OpenAI-compatible endpoint; `fincheck score` scores them alike.",
        epilog=BASELINE_EXAMPLES,
    )
    add_options(b, BaselineOptions)
    b.set_defaults(
        func=baseline_command,
        options=BaselineOptions,
        moved_flags={
            "--adapter": "a fincheck adapter is evaluated by `fincheck eval --adapter`, or is "
            "two-step's first step (--method two-step --step1 ADAPTER)",
            "--tokenizer": "a served fincheck detector is evaluated by `fincheck eval --backend "
            "openai --tokenizer ...`",
        },
    )
    s = subparsers.add_parser(
        "score",
        help="score predictions against the prepared gold: results.json, report.md, plots",
        description="Join predictions with the gold by id and compute the papers' figures "
        "(FINAL: judge matching, micro P/R/F1, binarized P/R/F1 and BAcc; QASem: BAcc/AUC per subset; "
        "FHSumBench: macro P/R/F with the reference scorer's semantics), with 95% bootstrap CIs.",
        epilog=SCORE_EXAMPLES,
    )
    add_options(s, ScoreOptions)
    s.set_defaults(func=score_command, options=ScoreOptions)


def eval_command(args: argparse.Namespace) -> int:
    opts = read_options(EvalOptions, args)
    if opts.backend == "openai":
        if not opts.model:
            raise UsageError("--backend openai needs --model (the served model's name)")
        if not opts.tokenizer and (opts.window or opts.max_input_tokens):
            given = "--window" if opts.window else "--max-input-tokens"
            raise UsageError(
                f"{given} needs --tokenizer (an adapter's folder, or the served model's "
                "tokenizer) to count the prompt's tokens"
            )
    elif not (opts.model or opts.adapter):
        raise UsageError("give --model (a base model name or path), or an --adapter")
    with hold_out_dir(opts.out_dir, "fincheck eval"):  # one writer per --out
        from fincheck.eval.generate import run_eval

        summary = run_eval(opts)
    return report_counts(opts, summary, "fincheck eval")


def baseline_command(args: argparse.Namespace) -> int:
    opts = read_options(BaselineOptions, args)  # an LLM's options with overlap: exit 2
    if not opts.model and opts.method not in ASKS_NO_LLM:
        raise UsageError("--method needs --model (the LLM that runs it)")
    from fincheck.eval.baseline import run_baseline

    with hold_out_dir(opts.out_dir, "fincheck baseline"):  # one writer per --out
        summary = run_baseline(opts)
    return report_counts(opts, summary, "fincheck baseline")


def report_counts(opts: EvalOptions | BaselineOptions, summary: dict, command: str) -> int:
    """One line per task, the next command, and exit 3 when examples failed (a rerun retries
    them; answers received are cached)."""
    for task, counts in summary.items():
        parts = [f"{counts['generated']} generated", f"{counts['resumed']} already done"]
        parts += [f"{len(counts['failed'])} failed"] if counts["failed"] else []
        if "calls_per_example" in counts:
            parts.append(f"{counts['calls_per_example']:.1f} LLM calls per example")
        parts += [f"{counts['trimmed']} prompts trimmed"] if counts.get("trimmed") else []
        print(f"{task}: {', '.join(parts)} -> {opts.predictions_dir / (task + '.jsonl')}")
        if counts.get("method_counts"):
            print(f"  {task}: " + ", ".join(f"{k} {v}" for k, v in counts["method_counts"].items()))
    if any(c["generated"] + c["resumed"] for c in summary.values()):
        print(
            f"next: fincheck score --data {opts.data_dir} --predictions {opts.predictions_dir} "
            f"--out {opts.out_dir}"
        )
    failures = [failure for counts in summary.values() for failure in counts["failed"]]
    if failures:
        print(
            f"{command}: {len(failures)} example(s) failed (first: {failures[0]}); rerun to "
            "retry them (answers received are cached)",
            file=sys.stderr,
        )
        return 3
    return 0


def build_judge(args: ScoreOptions):
    """The judge the --judge* options name, built by the task whose figures need one (None:
    those figures are not scored)."""
    from fincheck.inference.llm import RequestCache

    if args.judge_kind == "none":
        return None
    if not args.judge_model:
        raise FincheckError(f"--judge {args.judge_kind} needs --judge-model")
    from fincheck.models.llm_clients import JUDGE, build_client

    # a local judge's concurrent calls are batched by the client's worker thread
    local = {"max_new_tokens": args.judge_max_tokens, "dtype": args.judge_dtype}
    client = build_client(args, args.judge_kind, args.judge_model, JUDGE, **local)
    cache_path = args.judge_cache or args.out_dir / "judge_cache.jsonl"
    sampling = {"temperature": 0.0, "max_tokens": args.judge_max_tokens}  # part of the cache key
    (task,) = [t for t in all_tasks().values() if t.judge_prompts]
    return task.build_judge(client, RequestCache(cache_path), args.judge_prompt, sampling)


def score_command(args: argparse.Namespace) -> int:
    from fincheck.eval.score import run_score

    opts = read_options(ScoreOptions, args)
    with hold_out_dir(opts.out_dir, "fincheck score"):  # eval's folder, or a new one
        opts.judge = build_judge(opts)
        results, _ = run_score(opts)
        for task, figures in results["tasks"].items():
            print(f"{task}: {get_task(task).headline_text(figures)}")
        print(f"report: {opts.out_dir / 'report.md'}")
        if opts.report_to == "wandb":  # its files are written under the folder's lock too
            from fincheck.eval.wandb_report import log_to_wandb

            log_to_wandb(results, opts.out_dir, opts.wandb_project)
    return judge_exit_status(results.get("judge"), opts.max_judge_failure_rate)


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
