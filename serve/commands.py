"""`fincheck detect`, `fincheck merge`, `fincheck publish`: using and sharing a trained adapter.

Heavy imports (torch, transformers, huggingface_hub) happen inside the handlers so that
`fincheck --help` stays instant.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from fincheck.inference import dtype_argument

DETECT_EXAMPLES = """\
examples:
  # one document and one summary -> JSON on stdout
  fincheck detect --adapter checkpoints/tiny-cpu --text article.txt --summary summary.txt
  # many -> one JSON line per input line
  fincheck detect --adapter checkpoints/tiny-cpu --input pairs.jsonl --out results.jsonl

input lines (JSONL): {"id"?, "text", "summary"} for descriptions + a hallucination class;
  {"id"?, "text", "sentence", "question", "answer"} for a QASem support score p(Yes).
output: {"id", "descriptions": [...], "consistent": bool, "label": "no_hallu|factual_hallu|
  non_factual_hallu|invalid"} or {"id", "p_yes": float, "supported": bool}; "trimmed": true
  when the document was cut to fit the model's window.
"""

MERGE_EXAMPLES = """\
examples:
  fincheck merge --adapter checkpoints/tiny-cpu --out merged/tiny-cpu
  fincheck merge --adapter checkpoints/qwen7b --out merged/qwen7b --dtype fp16

The base is loaded unquantized in fp32, the LoRA update W += (alpha/r) B A is folded into each
target weight, and the result is cast to --dtype and saved as safetensors with the tokenizer.
"""

PUBLISH_EXAMPLES = """\
examples:
  fincheck publish --checkpoint checkpoints/qwen7b --repo-id my-org/fincheck-qwen7b \\
      --results runs/qwen7b/results.json --private
  fincheck publish --checkpoint checkpoints/tiny-cpu --repo-id me/tiny --dry-run out/tiny-repo

The token comes from HF_TOKEN or `hf auth login`; it is never printed or written to the card.
Publishing the same checkpoint twice makes no new commit. In a distributed job only rank 0
publishes.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter

    detect = subparsers.add_parser(
        "detect",
        help="run a trained adapter on a text and a summary (or a JSONL file of them)",
        description="Say what a summary (or answer) states that its grounding text does not support.",
        epilog=DETECT_EXAMPLES,
        formatter_class=fmt,
    )
    detect.add_argument("--adapter", required=True, help="run folder or adapter folder (or hub id)")
    detect.add_argument(
        "--model", default=None, help="base model (default: the adapter's own base, as recorded)"
    )
    detect.add_argument("--text", help="file with the grounding text (document)")
    detect.add_argument("--summary", help="file with the summary / generated output")
    detect.add_argument("--input", help="JSONL input file (see below)")
    detect.add_argument("--out", help="JSONL output file (default: stdout)")
    detect.add_argument(
        "--batch-size", type=int, default=4, help="inputs per forward pass (default 4)"
    )
    detect.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="tokens generated for the free-text answers (descriptions, judgement); "
        "default: each task's own, as in `fincheck eval`",
    )
    detect.add_argument(
        "--max-input-tokens",
        type=int,
        default=None,
        help="prompt tokens at most: longer documents are trimmed (default: the adapter's "
        "training max_length, capped by the model's positions, minus the answer's budget; the "
        "rule `fincheck eval` uses)",
    )
    detect.add_argument(
        "--device", default=None, help="cpu, cuda, cuda:1 (default: cuda if available)"
    )
    detect.add_argument(
        "--dtype",
        type=dtype_argument,
        default="auto",
        help="weights dtype: auto, bf16, fp16, fp32 (default auto: bf16 on a GPU that has it, "
        "else fp32)",
    )
    detect.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow the base model's own Python code to run (off by default)",
    )
    detect.set_defaults(func=_detect)

    merge = subparsers.add_parser(
        "merge",
        help="fold an adapter into its base and save one standalone model",
        description="Write base + LoRA as one model (safetensors), ready for any inference server.",
        epilog=MERGE_EXAMPLES,
        formatter_class=fmt,
    )
    merge.add_argument("--adapter", required=True, help="run folder or adapter folder")
    merge.add_argument("--out", required=True, help="output folder (must be new or empty)")
    merge.add_argument("--model", default=None, help="base model (default: the adapter's own base)")
    merge.add_argument(
        "--dtype",
        type=dtype_argument,
        default="bf16",
        help="saved dtype: bf16, fp16, fp32 (default bf16)",
    )
    merge.add_argument("--trust-remote-code", action="store_true", help="allow the base's own code")
    merge.set_defaults(func=_merge)

    publish = subparsers.add_parser(
        "publish",
        help="upload an adapter, its tokenizer and a model card to the Hugging Face Hub",
        description="Publish a trained adapter with a model card built from its run and results.",
        epilog=PUBLISH_EXAMPLES,
        formatter_class=fmt,
    )
    publish.add_argument("--checkpoint", required=True, help="run folder (checkpoints/<run>/)")
    publish.add_argument("--repo-id", required=True, help="ORG/NAME on the hub")
    publish.add_argument("--private", action="store_true", help="create the repo as private")
    publish.add_argument("--revision", default=None, help="branch to publish to (default main)")
    publish.add_argument(
        "--results",
        default=None,
        help="results.json from `fincheck score` (its figures go into the model card)",
    )
    publish.add_argument(
        "--license",
        default="apache-2.0",
        help="card license (default apache-2.0; must be compatible with the base model's)",
    )
    publish.add_argument(
        "--base-model-id",
        default=None,
        help="the hub id of the base (default: the one training recorded; needed when the run "
        "trained on a local folder it could not name)",
    )
    publish.add_argument(
        "--dry-run",
        metavar="DIR",
        default=None,
        help="write the repo folder to DIR, upload nothing",
    )
    publish.set_defaults(func=_publish)


def _setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")


def _detect(args: argparse.Namespace) -> int:
    _setup_logging()
    from fincheck.serve.detect_cli import run_detect

    return run_detect(args)


def _merge(args: argparse.Namespace) -> int:
    _setup_logging()
    from fincheck.serve.merge import merge_adapter

    report = merge_adapter(
        args.adapter,
        args.out,
        dtype=args.dtype,
        base=args.model,
        trust_remote_code=args.trust_remote_code,
    )
    print(json.dumps(report, indent=2))
    return 0


def _publish(args: argparse.Namespace) -> int:
    _setup_logging()
    from fincheck.serve.publish import publish

    result = publish(
        args.checkpoint,
        args.repo_id,
        private=args.private,
        revision=args.revision,
        results_path=args.results,
        dry_run=args.dry_run,
        license=args.license,
        base_model_id=args.base_model_id,
    )
    if result is None:
        print("not rank 0: nothing published", file=sys.stderr)
        return 0
    if args.dry_run:
        print(f"dry run: wrote {len(result.files)} files to {args.dry_run} (nothing uploaded)")
    elif result.changed:
        print(f"published {result.repo_id}@{result.revision}: {result.commit_url}")
    else:
        print(f"{result.repo_id}@{result.revision} already up to date: no new commit")
    for name in result.files:
        print(f"  {name}")
    return 0
