"""What the benchmarks share: random-init models of real architectures (built from the
config.json values written out in `configs/models/<name>.json`: no weights, no download), the
prepared data's token lengths, and a report's device and date.

Token lengths come from the model's tokenizer and chat template when one is given (a local
tokenizer folder). Without one they are estimated: English prose averages about 4 characters per
token with the Qwen2.5 and Llama-3 BPE vocabularies (150k / 128k entries), and a ChatML-style
template adds about 5 tokens per message (`<|im_start|>role\\n ... <|im_end|>\\n`) plus 3 for
the generation prompt. The estimate is within ~15% on news articles; pass --tokenizer for exact
figures.
"""

from __future__ import annotations

import json
import math
import os
import platform
import resource
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fincheck.errors import FincheckError
from fincheck.tasks import task_names
from fincheck.tasks.prepared import read_split

CHARS_PER_TOKEN = 4.0
TEMPLATE_TOKENS_PER_MESSAGE = 5
GENERATION_PROMPT_TOKENS = 3
REPO_ROOT = Path(__file__).resolve().parents[2]


def model_config_path(name_or_path: str) -> Path:
    """`configs/models/<name>.json` for a short name, or the given .json path."""
    path = Path(name_or_path)
    if path.suffix == ".json" and path.exists():
        return path
    for root in (Path.cwd(), REPO_ROOT):
        candidate = root / "configs" / "models" / f"{name_or_path}.json"
        if candidate.exists():
            return candidate
    known = sorted(p.stem for p in (REPO_ROOT / "configs" / "models").glob("*.json"))
    raise FincheckError(
        f"model config {name_or_path!r} not found; known: {', '.join(known)} (or a path to a config.json)"
    )


def load_model_config(name_or_path: str):
    """A transformers config from a written-out config.json (its `model_type` picks the class)."""
    from transformers import AutoConfig

    values = json.loads(model_config_path(name_or_path).read_text(encoding="utf-8"))
    model_type = values.pop("model_type", None)
    if model_type is None:
        raise FincheckError(f"{name_or_path}: config.json has no model_type")
    values.pop("torch_dtype", None)  # the benchmark picks the dtype
    return AutoConfig.for_model(model_type, **values)


def estimate_tokens(messages: Sequence[dict[str, str]], add_generation_prompt: bool = False) -> int:
    """Token count of chat messages by the chars-per-token estimate (see module docstring)."""
    chars = sum(len(m["content"]) for m in messages)
    extra = GENERATION_PROMPT_TOKENS if add_generation_prompt else 0
    return math.ceil(chars / CHARS_PER_TOKEN) + TEMPLATE_TOKENS_PER_MESSAGE * len(messages) + extra


def count_tokens(
    tokenizer,
    messages: Sequence[dict[str, str]],
    add_generation_prompt: bool = False,
    template_kwargs: dict[str, Any] | None = None,
) -> int:
    """Exact token count through the tokenizer's chat template (the render the model reads)."""
    from fincheck.inference import generation as inference

    text = inference.render_chat(tokenizer, messages, add_generation_prompt, template_kwargs)
    return inference.count_tokens(tokenizer, text)


def prepared_lengths(
    prepared_dir: Path,
    split: str,
    tasks: Sequence[str] | None = None,
    tokenizer: Any = None,
    prompt_only: bool = False,
    template_kwargs: dict[str, Any] | None = None,
) -> dict[str, list[int]]:
    """Token length of every pair per task: the full conversation (training) or, with
    `prompt_only`, system + user with the generation prompt (what evaluation feeds the model)."""
    out: dict[str, list[int]] = {}
    for task in tasks or task_names():
        lengths = []
        for pair in read_split(prepared_dir, task, split):  # a missing file says how to make it
            messages = pair.prompt_messages if prompt_only else pair.messages
            if tokenizer is not None:
                lengths.append(count_tokens(tokenizer, messages, prompt_only, template_kwargs))
            else:
                lengths.append(estimate_tokens(messages, add_generation_prompt=prompt_only))
        out[task] = lengths
    return out


def percentiles(lengths: Sequence[int], qs: Sequence[float] = (0.5, 0.9, 0.99)) -> list[int]:
    """Nearest-rank percentiles (the q-th value of the sorted lengths) and the maximum."""
    s = sorted(lengths)
    return [s[min(len(s) - 1, math.ceil(q * len(s)) - 1)] for q in qs] + [s[-1]]


def device_name() -> str:
    """What a report ran on: the GPU's name, else the CPU's with its cores."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def utc_now() -> str:
    """A report's date."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def peak_rss_bytes() -> int:
    """Peak resident memory of this process so far (Linux ru_maxrss is KiB); never decreases."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def save_random_model(name: str, tokenizer: str | Path, out: Path, dtype: str = "bfloat16") -> Path:
    """A model folder `fincheck train` loads like a hub model: random-init weights of the
    architecture `name` (configs/models/), in `dtype`, with the tokenizer of the folder
    `tokenizer`. Speed and memory do not depend on the weights' values."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = load_model_config(name)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tokenizer).save_pretrained(out)
    return out
