"""`fincheck detect`, `fincheck merge`, `fincheck publish`: using and sharing a trained adapter.

Heavy imports (torch, transformers, huggingface_hub) happen inside the handlers so that
`fincheck --help` stays instant.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from fincheck.errors import UsageError
from fincheck.inference.generation import parse_dtype
from fincheck.io.config import REQUIRED, add_options, config_field, read_options
from fincheck.model_options import ModelOptions
from fincheck.serve.llama_cpp_converter import GGUF_TYPES
from fincheck.tasks import per_task_thresholds

DETECT_EXAMPLES = """\
examples:
  # one document and one summary -> JSON on stdout
  fincheck detect --adapter checkpoints/tiny-cpu --text article.txt --summary summary.txt
  # many -> one JSON line per input line
  fincheck detect --adapter checkpoints/tiny-cpu --input pairs.jsonl --out results.jsonl

input lines (JSONL): {"id"?, "text", "summary"} for descriptions + a hallucination class;
  {"id"?, "text", "sentence", "question", "answer"} for a QASem support score p(Yes).
output: {"id", "descriptions": [...], "consistent": bool, "flag_score": float, "label":
  "no_hallu|factual_hallu|non_factual_hallu|invalid"} or {"id", "p_yes": float, "supported":
  bool}; "flag_score" ranks summaries by P(a list opens) against P("None") before the list is
  written; "trimmed": true when the document was cut to fit the model's window.
"""

MERGE_EXAMPLES = """\
examples:
  fincheck merge --adapter checkpoints/tiny-cpu --out merged/tiny-cpu
  fincheck merge --adapter checkpoints/qwen7b --out merged/qwen7b --dtype fp16

The base is loaded unquantized in fp32, the LoRA update W += (alpha/r) B A is folded into each
target weight, and the result is cast to --dtype and saved as safetensors with the tokenizer.
"""

EXPORT_EXAMPLES = """\
examples:
  fincheck export --gguf --adapter checkpoints/qwen2.5-0.5b-three-tasks-cpu --out exports/qwen-f16
  fincheck export --gguf --adapter checkpoints/qwen2.5-0.5b-three-tasks-cpu --type q4_k_m \\
      --out exports/qwen-q4
  # serve it on a CPU (llama.cpp's server: OpenAI-compatible, with logprobs; one slot, no flash
  # attention, whose CPU kernel rounds to f16) and evaluate it like a local model
  llama-server -m exports/qwen-f16/<run>-f16.gguf -c 2048 -np 1 -fa off -cram 0 --alias served --port 8080
  fincheck eval --backend openai --base-url http://127.0.0.1:8080/v1 --model served \\
      --tokenizer checkpoints/qwen2.5-0.5b-three-tasks-cpu --concurrency 1 --data runs/prepared \\
      --out runs/served

The adapter is merged into its base in fp32 and converted by llama.cpp's own converter
(downloaded once, pinned: llama-cpp-python's source archive); a quantized type is quantized
from the f32 conversion by llama.cpp's quantizer (needs llama-cpp-python installed).
fincheck_export.json records the source adapter and base by content.
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


@dataclass(kw_only=True)
class DetectOptions(ModelOptions):
    adapter: str = config_field(REQUIRED, "run folder or adapter folder (or hub id)")
    model: str | None = config_field(
        None, "base model (default: the adapter's own base, as recorded)"
    )
    text: str | None = config_field(None, "file with the grounding text (document)")
    summary: str | None = config_field(None, "file with the summary / generated output")
    input: str | None = config_field(None, "JSONL input file (see below)")
    out: Path | None = config_field(None, "JSONL output file (default: stdout)")
    thresholds: dict[str, float] = config_field(
        {},
        "task=T,...: a decision threshold on p_yes chosen on dev (`fincheck score --split dev` "
        "prints the one that maximises BAcc): QASem's QA is supported at or above it (not "
        "0.5); a FINAL list whose flag score is below it is held back, the summary called "
        "consistent",
        flag="threshold",
        parse=per_task_thresholds,
    )


@dataclass
class MergeOptions:
    adapter: str = config_field(REQUIRED, "run folder or adapter folder")
    out: Path = config_field(REQUIRED, "output folder (must be new or empty)")
    model: str | None = config_field(None, "base model (default: the adapter's own base)")
    dtype: str = config_field("bf16", "saved dtype: bf16, fp16, fp32", parse=parse_dtype)
    trust_remote_code: bool = config_field(False, "allow the base's own code")


@dataclass
class ExportOptions:
    adapter: str = config_field(REQUIRED, "run folder or adapter folder")
    out: Path = config_field(REQUIRED, "output folder (must be new or empty)")
    gguf: bool = config_field(False, "write a GGUF file for llama.cpp (the one format so far)")
    type: Literal[GGUF_TYPES] = config_field(
        "f16",
        "the GGUF tensor type: f16, bf16, f32 keep full precision; q8_0 ... q4_0 are llama.cpp's "
        "quantized types (smaller and faster on a CPU, a little less exact: see docs/serving.md)",
    )
    model: str | None = config_field(None, "base model (default: the adapter's own base)")
    trust_remote_code: bool = config_field(False, "allow the base's own code")


@dataclass
class PublishOptions:
    checkpoint: str = config_field(REQUIRED, "run folder (checkpoints/<run>/)")
    repo_id: str = config_field(REQUIRED, "ORG/NAME on the hub")
    private: bool = config_field(False, "create the repo as private")
    revision: str | None = config_field(None, "branch to publish to (default: main)")
    results: Path | None = config_field(
        None, "results.json from `fincheck score` (its figures go into the model card)"
    )
    license: str = config_field(
        "apache-2.0", "card license (must be compatible with the base model's)"
    )
    base_model_id: str | None = config_field(
        None,
        "the hub id of the base (default: the one training recorded; needed when the run "
        "trained on a local folder it could not name)",
    )
    dry_run: Path | None = config_field(
        None, "write the repo folder to DIR, upload nothing", metavar="DIR"
    )
    hub_timeout: float = config_field(
        600.0,  # publish.HUB_DEADLINE_S (publish is imported only when it runs)
        "seconds one hub call may take, all its retries included (the upload is one call: "
        "raise it for a shipped base on a slow link)",
        above=0,
        metavar="SECONDS",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    for name, options, handler, help_, description, epilog in (
        (
            "detect",
            DetectOptions,
            _detect,
            "run a trained adapter on a text and a summary (or a JSONL file of them)",
            "Say what a summary (or answer) states that its grounding text does not support.",
            DETECT_EXAMPLES,
        ),
        (
            "merge",
            MergeOptions,
            _merge,
            "fold an adapter into its base and save one standalone model",
            "Write base + LoRA as one model (safetensors), ready for any inference server.",
            MERGE_EXAMPLES,
        ),
        (
            "export",
            ExportOptions,
            _export,
            "write an adapter as a GGUF file that llama.cpp serves",
            "Merge an adapter into its base and convert it for llama.cpp (CPU serving).",
            EXPORT_EXAMPLES,
        ),
        (
            "publish",
            PublishOptions,
            _publish,
            "upload an adapter, its tokenizer and a model card to the Hugging Face Hub",
            "Publish a trained adapter with a model card built from its run and results.",
            PUBLISH_EXAMPLES,
        ),
    ):
        parser = subparsers.add_parser(name, help=help_, description=description, epilog=epilog)
        add_options(parser, options)
        parser.set_defaults(func=handler, options=options)


def _setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")


def _detect(args: argparse.Namespace) -> int:
    _setup_logging()
    from fincheck.serve.detect_cli import run_detect

    return run_detect(read_options(DetectOptions, args))


def _merge(args: argparse.Namespace) -> int:
    _setup_logging()
    args = read_options(MergeOptions, args)
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


def _export(args: argparse.Namespace) -> int:
    _setup_logging()
    args = read_options(ExportOptions, args)
    if not args.gguf:
        raise UsageError(
            "name the format: --gguf (the one so far; `fincheck merge` writes safetensors)"
        )
    from fincheck.serve.export import export_gguf

    record = export_gguf(
        args.adapter, args.out, args.type, base=args.model, trust_remote_code=args.trust_remote_code
    )
    print(json.dumps(record, indent=2))
    return 0


def _publish(args: argparse.Namespace) -> int:
    _setup_logging()
    args = read_options(PublishOptions, args)
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
        hub_timeout_s=args.hub_timeout,
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
