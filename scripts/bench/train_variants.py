"""LoRA SFT training speed, every variant side by side in one run (`scripts/bench_train.py`).

Random-init models of real architectures (configs/models/*.json), LoRA r=16 on all linear
layers, AdamW, batches whose lengths follow the prepared data (or a synthetic distribution
shaped like it), bf16 on a GPU / fp32 on the CPU. For each variant: real (non-pad)
tokens/s/GPU, seconds per step, MFU by the LoRA convention and by the full-FT 6·N convention
(see `bench.flops` for the arithmetic), and peak memory. Warmup steps are not timed.

Variants (each changes one thing against `packed-sdpa` unless its name says otherwise):
  padded-sdpa          right-padded batches, PyTorch SDPA attention (the plain baseline)
  padded-grouped-sdpa  the same examples regrouped by length before padding (group_by_length)
  packed-sdpa          padding-free packing: one row, position_ids restart per example
  padded-eager / packed-eager          transformers' eager (matmul + softmax) attention
  packed-flash         flash_attention_2 varlen kernels     (needs the flash-attn wheel, GPU)
  packed-flex          torch flex_attention + block mask    (GPU)
  packed-sdpa-liger    Liger kernels: RMSNorm, RoPE, SwiGLU, fused linear+CE (liger-kernel, GPU)
  packed-sdpa-gc       gradient checkpointing (non-reentrant)
  packed-sdpa-zero2 / packed-sdpa-zero3   DeepSpeed ZeRO-2 / ZeRO-3, one process
  packed-flash-liger   the expected best combination
A variant that cannot run here (missing package, no GPU) is listed with the reason.

    report = run_train_bench(TrainBenchSettings(model="tiny", steps=2, warmup=1))
    print(format_train_report(report)); report.results[0].tokens_per_s
"""

from __future__ import annotations

import gc
import importlib.util
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench import workload as wl
from bench.flops import ModelShape, device_peak_tflops
from bench.train_steps import Result, Variant, run_variant, single_process_group
from fincheck.config import config_field


@dataclass
class TrainBenchSettings:
    model: str = config_field("qwen2.5-1.5b", wl.MODEL_HELP)
    prepared_dir: Path | None = config_field(None, wl.PREPARED_HELP.format(what="example"))
    split: str = config_field("train", "split of --prepared-dir to read")
    tokenizer: str | None = config_field(None, wl.TOKENIZER_HELP)
    max_len: int = config_field(2048, "cap on example length in tokens")
    batch_size: int = config_field(8, "examples per step, per GPU")
    steps: int = config_field(10, "timed steps per variant")
    warmup: int = config_field(3, "untimed steps first")
    variants: list[str] = config_field(["all"], "comma list of variants, or all")
    lora_r: int = config_field(16, "LoRA rank")
    lr: float = config_field(1e-4, "AdamW learning rate")
    peak_tflops: float | None = config_field(
        None, "device peak for MFU (default: the GPU's dense bf16 peak; none on a CPU)"
    )
    profile: bool = config_field(False, "profile the timed steps: op table + chrome trace")
    profile_dir: str = config_field("bench-profiles", "where traces go")
    seed: int = config_field(0, "seed of the init and the sampled batches")


VARIANTS = {
    v.name: v
    for v in (
        Variant("padded-sdpa", packed=False),
        Variant("padded-grouped-sdpa", packed=False, grouped=True),
        Variant("packed-sdpa"),
        Variant("padded-eager", packed=False, attn="eager"),
        Variant("packed-eager", attn="eager"),
        Variant("packed-flash", attn="flash_attention_2"),
        Variant("packed-flex", attn="flex_attention"),
        Variant("packed-sdpa-gc", grad_ckpt=True),
        Variant("packed-sdpa-zero2", zero=2),
        Variant("packed-sdpa-zero3", zero=3),
        # Liger patches transformers' modules process-wide: these run last.
        Variant("packed-sdpa-liger", liger=True),
        Variant("packed-flash-liger", attn="flash_attention_2", liger=True),
    )
}


def why_not_runnable(v: Variant, cuda: bool) -> str | None:
    if v.attn == "flash_attention_2" and not importlib.util.find_spec("flash_attn"):
        return "flash-attn not importable (pip install flash-attn --no-build-isolation)"
    if v.attn in ("flash_attention_2", "flex_attention") and not cuda:
        return f"{v.attn} needs a GPU"
    if v.liger and not importlib.util.find_spec("liger_kernel"):
        return "liger-kernel not importable (pip install liger-kernel)"
    if v.liger and not cuda:
        return "Liger's Triton kernels need a GPU"
    if v.zero and not importlib.util.find_spec("deepspeed"):
        return "deepspeed not importable"
    return None


def format_table(results: list[Result], unit_mem: str) -> str:
    num = lambda x, f: "-" if x is None else format(x, f)  # noqa: E731
    head = f"{'variant':<20} {'tokens/s/GPU':>13} {'s/step':>8} {'MFU lora':>9} {'MFU 6N':>8} {unit_mem:>11}  status"
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(
            f"{r.variant:<20} {num(r.tokens_per_s, ',.0f'):>13} {num(r.step_s, '.3f'):>8} {num(r.mfu_lora, '.1%'):>9} "
            f"{num(r.mfu_6n, '.1%'):>8} {num(r.peak_mem_gib, '.2f'):>11}  {r.status}"
        )
    return "\n".join(lines)


@dataclass
class TrainBenchReport:
    """What one benchmark run measured, with what it ran on."""

    device: str
    cuda: bool
    peak_tflops: float | None
    model: str
    matmul_params: int
    lora_params: int
    lengths: str  # describe_lengths of the capped lengths
    lengths_source: str
    results: list[Result]
    settings: dict
    date: str = field(default_factory=wl.utc_now)

    @property
    def ok(self) -> bool:
        return all(not r.status.startswith("error") for r in self.results)

    @property
    def first_losses(self) -> dict[str, float]:
        """First-step loss per variant on the shared batches (regrouped ones hold others)."""
        return {
            r.variant: r.first_loss
            for r in self.results
            if r.first_loss is not None and not r.settings.get("grouped")
        }

    def to_json(self, command: str) -> dict:
        import torch

        return {
            "script": "bench_train",
            "date": self.date,
            "command": command,
            "device": self.device,
            "peak_tflops": self.peak_tflops,
            "torch": torch.__version__,
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in self.settings.items()},
            "lengths": self.lengths,
            "results": [asdict(r) for r in self.results],
        }


def run_train_bench(
    s: TrainBenchSettings, log: Callable[[str], None] = lambda line: print(line, flush=True)
) -> TrainBenchReport:
    """Run every selected variant on the same batches; return what was measured."""
    import torch

    if s.warmup < 1 or s.steps < 1:
        raise ValueError(
            "warmup and steps must be at least 1 (the first warmup step gives the loss check)"
        )
    names = list(VARIANTS) if s.variants in ([], ["all"]) else list(s.variants)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    names.sort(key=list(VARIANTS).index)  # Liger patches process-wide: its variants go last
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    device_name = wl.device_name()
    peak = s.peak_tflops or (device_peak_tflops(device_name) if cuda else None)
    tokenizer = None
    if s.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(s.tokenizer)
    if s.prepared_dir:
        per_task = wl.prepared_lengths(s.prepared_dir, s.split, tokenizer=tokenizer)
        lengths = [n for ls in per_task.values() for n in ls]
        how = "tokenizer" if tokenizer else f"~{wl.CHARS_PER_TOKEN} chars/token"
        source = f"{s.prepared_dir} ({s.split}; {how})"
    else:
        lengths, source = wl.synthetic_lengths(4096, s.max_len, s.seed), "synthetic log-normal"
    lengths = wl.cap_lengths(lengths, s.max_len)
    steps = wl.sample_steps(lengths, s.batch_size, s.warmup + s.steps, s.seed)
    shape = ModelShape.from_config(wl.load_model_config(s.model))
    log(f"device: {device_name}; peak for MFU: {f'{peak} TFLOP/s' if peak else 'unknown'}")
    log(f"model: {s.model} ({'bf16' if cuda else 'fp32'}); lengths: {source}, cap {s.max_len}")
    results = []
    with single_process_group():
        for name in names:
            v = VARIANTS[name]
            reason = why_not_runnable(v, cuda)
            if reason:
                log(f"[{name}] skipped: {reason}")
                results.append(Result(name, status=f"skipped: {reason}", settings=asdict(v)))
                continue
            log(f"[{name}] running ...")
            try:
                results.append(run_variant(s, v, steps, device, cuda, peak, log))
            except Exception as e:  # one broken variant must not hide the others' figures
                oom = isinstance(e, torch.cuda.OutOfMemoryError)
                what = "CUDA out of memory" if oom else f"{type(e).__name__}: {e}"
                log(f"[{name}] failed: {what}")
                results.append(Result(name, status=f"error: {what[:150]}", settings=asdict(v)))
            # Outside the except blocks, so no traceback keeps the variant's tensors alive.
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
    return TrainBenchReport(
        device=device_name,
        cuda=cuda,
        peak_tflops=peak,
        model=s.model,
        matmul_params=shape.matmul_params(),
        lora_params=shape.lora_params(s.lora_r),
        lengths=wl.describe_lengths(lengths),
        lengths_source=source,
        results=results,
        settings=asdict(s),
    )


def format_train_report(report: TrainBenchReport) -> str:
    """The table and its notes, as the script prints them."""
    lines = [
        f"model: {report.model} (N = {report.matmul_params:,} matmul params, LoRA: "
        f"{report.lora_params:,}); dtype {'bf16' if report.cuda else 'fp32'}",
        f"lengths: {report.lengths_source}: {report.lengths}",
        "",
        format_table(report.results, "peak GiB" if report.cuda else "peak RSS GiB"),
    ]
    first = report.first_losses
    if first:
        spread = max(first.values()) - min(first.values())
        lines.append(
            f"first-step loss, every variant (same init, same examples): "
            f"{min(first.values()):.5f} .. {max(first.values()):.5f} (spread {spread:.2e}); "
            "packing and padding must agree (fp32: < 1e-5; bf16: ~1e-2 from rounding)."
        )
    lines.append(
        "tokens/s counts real (non-pad) tokens. MFU lora = (4·N + 6·N_lora)·tokens + 3·causal "
        "attention fwd; MFU 6N = 6·N·tokens (full fine-tuning convention)."
    )
    return "\n".join(lines)
