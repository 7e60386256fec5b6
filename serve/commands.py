"""`fincheck detect`, `fincheck merge`, `fincheck publish`: using and sharing a trained adapter.

Heavy imports (torch, transformers, huggingface_hub) happen inside the handlers so that
`fincheck --help` stays instant.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from fincheck.errors import UsageError
from fincheck.io.config import REQUIRED, add_options, config_field, read_options
from fincheck.io.messages import show_progress_lines
from fincheck.model_options import ModelOptions
from fincheck.serve.export import ExportOptions, export_gguf
from fincheck.serve.merge import MergeOptions, merge_adapter
from fincheck.serve.publish import PublishOptions, publish
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
  written; "trimmed": true when the document was cut to fit the model's window. With
  --overlap-weight W, QASem's "p_yes" is the combined score and "p_detector" the model's own.
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
    show_progress_lines("%(levelname)s %(name)s: %(message)s")


def _detect(args: argparse.Namespace) -> int:
    _setup_logging()
    from fincheck.serve.detect_cli import run_detect

    return run_detect(read_options(DetectOptions, args))


def _merge(args: argparse.Namespace) -> int:
    _setup_logging()
    print(json.dumps(merge_adapter(read_options(MergeOptions, args)), indent=2))
    return 0


def _export(args: argparse.Namespace) -> int:
    _setup_logging()
    opts = read_options(ExportOptions, args)
    if not opts.gguf:
        raise UsageError(
            "name the format: --gguf (the one so far; `fincheck merge` writes safetensors)"
        )
    print(json.dumps(export_gguf(opts), indent=2))
    return 0


def _publish(args: argparse.Namespace) -> int:
    _setup_logging()
    args = read_options(PublishOptions, args)
    result = publish(args)
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
