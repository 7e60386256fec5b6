"""What a training recipe becomes on this machine: on one without a GPU it trains on the CPU
(`use_cpu`; DeepSpeed and DDP over gloo), `precision: auto` is bf16 where the hardware has it (a
GPU that supports it, a CPU with bf16 units) and fp32 elsewhere, and tree packing trains with
FlexAttention on a GPU and the chunked SDPA tree attention on the CPU."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fincheck.errors import FincheckError
from fincheck.train.tree_attention import tree_attention_for


def adapt_to_machine(recipe: Any) -> None:
    """Set the recipe's precision, tree packing's attention kernel and process-group backend
    for this machine (called when the recipe is built)."""
    import torch

    gpu = torch.cuda.is_available() and not recipe.use_cpu  # use_cpu: a CPU run on a GPU box
    precision = recipe.precision
    explicit = [n for n, on in (("bf16", recipe.bf16 is True), ("fp16", bool(recipe.fp16))) if on]
    if precision == "auto":  # TRL's own bf16/fp16 keys, else what the machine does best
        # bf16 where the hardware has it: on a CPU with bf16 units it trained 1.5x (SmolLM2-
        # 135M) and 2.3x (Qwen2.5-0.5B) the tokens/s of fp32 (docs/performance.md)
        has_bf16 = torch.cuda.is_bf16_supported() if gpu else cpu_has_bf16()
        precision = explicit[0] if explicit else ("bf16" if has_bf16 else "fp32")
    elif any(name != precision for name in explicit):
        raise FincheckError(f"precision={precision} but {explicit} is set: use only precision")
    if not gpu and precision == "fp16":
        raise FincheckError("precision=fp16 needs a GPU; use --precision=fp32 on the CPU")
    if not gpu and precision == "bf16" and not cpu_has_bf16():
        raise FincheckError(
            "precision=bf16 needs a GPU or a CPU with bf16 units (AMX / avx512_bf16); "
            "use --precision=fp32"
        )
    recipe.bf16, recipe.fp16 = precision == "bf16", precision == "fp16"
    recipe.attention_note = None  # said once in the log when the kernel is not the one named
    if recipe.tree_packing:
        recipe.attn_implementation, recipe.attention_note = tree_attention_for(
            recipe.attn_implementation, gpu
        )
    if not gpu:
        # accelerate then counts the processes torch.distributed already has (without it
        # TRL's metric gathers fail with `expected length 2, got 1`).
        recipe.use_cpu = True
        if int(os.environ.get("WORLD_SIZE", "1")) > 1 or recipe.deepspeed:
            recipe.ddp_backend = "gloo"  # DeepSpeed always runs in a process group


def cpu_has_bf16() -> bool:
    """AMX or avx512_bf16 on this CPU (Linux /proc/cpuinfo flags)."""
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags
