#!/usr/bin/env python
"""LoRA SFT training speed, every variant side by side in one run.

Random-init models of real architectures (configs/models/*.json), LoRA r=16 on all linear
layers, AdamW, batches whose lengths follow the prepared data (or a synthetic distribution
shaped like it), bf16 on a GPU / fp32 on the CPU. For each variant: real (non-pad)
tokens/s/GPU, seconds per step, MFU by the LoRA convention and by the full-FT 6·N convention
(see fincheck/flops.py for the arithmetic), and peak memory. Warmup steps are not timed.

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

Examples:
  # the issue's goal: one H100, Qwen2.5-1.5B, sequences up to 2,048 tokens, bf16
  python scripts/bench_train.py --model qwen2.5-1.5b --prepared-dir /data/prepared \\
      --max-len 2048 --batch-size 8 --steps 20 --warmup 5 --json-out bench-train-h100.json
  # the fast variants with more tokens per step
  python scripts/bench_train.py --model qwen2.5-1.5b --prepared-dir /data/prepared \\
      --max-len 2048 --batch-size 16 --variants packed-flash,packed-flex,packed-flash-liger
  # where the time goes in one variant (torch profiler op table + chrome trace)
  python scripts/bench_train.py --model qwen2.5-1.5b --prepared-dir /data/prepared \\
      --max-len 2048 --batch-size 8 --steps 3 --variants packed-flash-liger --profile
  # CPU smoke run (seconds): the tiny config, what CI runs
  python scripts/bench_train.py --model tiny --max-len 256 --batch-size 4 --steps 2 --warmup 1
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import platform
import resource
import socket
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from fincheck import bench_workload as wl
from fincheck.flops import ModelShape, device_peak_tflops, full_ft_flops, lora_train_flops, mfu


@dataclass(frozen=True)
class Variant:
    name: str
    packed: bool = True
    grouped: bool = False  # padded batches regrouped by length (HF group_by_length)
    attn: str = "sdpa"
    liger: bool = False
    grad_ckpt: bool = False
    zero: int | None = None


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


@dataclass
class Result:
    variant: str
    status: str = "ok"  # ok | skipped: why | error: what
    tokens_per_s: float | None = None
    step_s: float | None = None
    mfu_lora: float | None = None
    mfu_6n: float | None = None
    peak_mem_gib: float | None = None
    first_loss: float | None = None  # loss of the first (warmup) step: same batches, same init
    loss: float | None = None
    settings: dict = field(default_factory=dict)


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


def build_model(args, v: Variant, device, dtype):
    """Random-init model (fixed seed) with LoRA r on every linear layer."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    config = wl.load_model_config(args.model, attn_implementation=v.attn)
    config.use_cache = False
    torch.manual_seed(args.seed)
    with device:  # initialise on the GPU directly: a 1.5B random init on the CPU takes a while
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if v.liger:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance

        _apply_liger_kernel_to_instance(model=model)
    if v.grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lora = LoraConfig(
        r=args.lora_r,
        lora_alpha=2 * args.lora_r,
        lora_dropout=0.0,
        target_modules="all-linear",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, lora).to(device), config


def deepspeed_engine(model, stage: int, bf16: bool, micro_batch: int, lr: float):
    """One-process DeepSpeed engine (nccl on a GPU, gloo on the CPU), torch AdamW as client
    optimizer (DeepSpeed's fused Adam would need a CUDA toolchain to JIT-build)."""
    import deepspeed
    import torch

    if not torch.distributed.is_initialized():
        deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr)
    config = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": stage, "overlap_comm": True, "contiguous_gradients": True},
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": bf16},
        "gradient_clipping": 1.0,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return engine


@contextmanager
def single_process_group():
    """A world of one for DeepSpeed (free port), torn down afterwards with the env restored, so
    the benchmark leaves no process group or RANK/WORLD_SIZE behind (matters under pytest)."""
    import torch

    saved = {
        k: os.environ.get(k)
        for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    }
    if saved["MASTER_PORT"] is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    for key, value in {
        "MASTER_ADDR": "127.0.0.1",
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
    }.items():
        os.environ.setdefault(key, value)
    was_initialized = torch.distributed.is_available() and torch.distributed.is_initialized()
    try:
        yield
    finally:
        if (
            not was_initialized
            and torch.distributed.is_available()
            and torch.distributed.is_initialized()
        ):
            torch.distributed.destroy_process_group()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def regroup_by_length(steps: list[list[int]], warmup: int) -> list[list[int]]:
    """The same examples, sorted by length and re-cut into batches of the same sizes, within
    the warmup steps and within the timed steps separately (so the timed tokens are unchanged)."""

    def regroup(part: list[list[int]]) -> list[list[int]]:
        pool = sorted((n for b in part for n in b), reverse=True)
        out, start = [], 0
        for b in part:
            out.append(pool[start : start + len(b)])
            start += len(b)
        return out

    return regroup(steps[:warmup]) + regroup(steps[warmup:])


def run_variant(
    args, v: Variant, steps: list[list[int]], device, cuda: bool, peak: float | None, profile: bool
) -> Result:
    """Build the variant's model, run warmup + timed steps on the shared batches, measure."""
    import torch

    dtype = torch.bfloat16 if cuda else torch.float32
    model, config = build_model(args, v, device, dtype)
    shape = ModelShape.from_config(config)
    engine = None
    if v.zero:
        engine = deepspeed_engine(
            model, v.zero, bf16=cuda, micro_batch=1 if v.packed else args.batch_size, lr=args.lr
        )
        forward, optimizer = engine, None
    else:
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=args.lr, fused=cuda)
        forward = model
    model.train()
    if v.grouped:
        steps = regroup_by_length(steps, args.warmup)
    gen = torch.Generator().manual_seed(args.seed)
    batches = [
        wl.packed_batch(b, shape.vocab, gen)
        if v.packed
        else wl.padded_batch(b, shape.vocab, 0, gen)
        for b in steps
    ]
    # bf16 base weights; PEFT keeps the adapters in fp32, autocast runs their matmuls in bf16.
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if cuda and not v.zero
        else torch.autocast("cpu", enabled=False)
    )

    def step(batch) -> float:
        batch = {k: t.to(device, non_blocking=True) for k, t in batch.items()}
        with autocast:
            loss = forward(**batch).loss
        if engine is not None:
            engine.backward(loss)
            engine.step()
        else:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:  # the peak covers warmup too: its batches may be the largest
        torch.cuda.reset_peak_memory_stats()
    first_loss = None
    for batch in batches[: args.warmup]:
        loss = step(batch)
        first_loss = float(loss) if first_loss is None else first_loss
    sync()
    timed = steps[args.warmup :]
    prof = _profiler(cuda) if profile else None
    start = time.perf_counter()
    with prof or _null():
        for batch in batches[args.warmup :]:
            loss = step(batch)
            if prof:
                prof.step()
        sync()
    seconds = time.perf_counter() - start
    tokens = sum(sum(b) for b in timed)
    lora_flops = sum(lora_train_flops(shape, b, args.lora_r) for b in timed)
    result = Result(
        variant=v.name,
        tokens_per_s=tokens / seconds,
        step_s=seconds / len(timed),
        mfu_lora=mfu(lora_flops, seconds, peak),
        mfu_6n=mfu(full_ft_flops(shape, tokens), seconds, peak),
        peak_mem_gib=(torch.cuda.max_memory_allocated() if cuda else _rss_bytes()) / 2**30,
        first_loss=first_loss,
        loss=float(loss),
        settings=asdict(v),
    )
    if prof:
        sort = "self_device_time_total" if cuda else "self_cpu_time_total"
        print(f"\nprofile of {v.name} ({len(timed)} steps), top 20 ops by {sort}:")
        print(prof.key_averages().table(sort_by=sort, row_limit=20))
        trace = Path(args.profile_dir) / f"trace-{v.name}.json"
        trace.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace))
        print(f"chrome trace: {trace} (open in https://ui.perfetto.dev)")
    if engine is not None:
        engine.destroy()
    return result


def _profiler(cuda: bool):
    from torch.profiler import ProfilerActivity, profile

    return profile(
        activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []),
        record_shapes=False,
    )


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _rss_bytes() -> int:
    """Peak resident memory of this process so far (Linux ru_maxrss is KiB); never decreases."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def format_table(results: list[Result], unit_mem: str) -> str:
    pct = lambda x: "-" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    num = lambda x, f: "-" if x is None else format(x, f)  # noqa: E731
    head = f"{'variant':<20} {'tokens/s/GPU':>13} {'s/step':>8} {'MFU lora':>9} {'MFU 6N':>8} {unit_mem:>11}  status"
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(
            f"{r.variant:<20} {num(r.tokens_per_s, ',.0f'):>13} {num(r.step_s, '.3f'):>8} {pct(r.mfu_lora):>9} "
            f"{pct(r.mfu_6n):>8} {num(r.peak_mem_gib, '.2f'):>11}  {r.status}"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    wl.add_workload_arguments(p, split="train", what="example")
    p.add_argument(
        "--max-len",
        type=int,
        default=2048,
        help="cap on example length in tokens (default: %(default)s)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=8,
        help="examples per step, per GPU (default: %(default)s)",
    )
    p.add_argument(
        "--steps", type=int, default=10, help="timed steps per variant (default: %(default)s)"
    )
    p.add_argument(
        "--warmup", type=int, default=3, help="untimed steps first (default: %(default)s)"
    )
    p.add_argument(
        "--variants", default="all", help=f"comma list or 'all' (default): {', '.join(VARIANTS)}"
    )
    p.add_argument("--lora-r", type=int, default=16, help="LoRA rank (default: %(default)s)")
    p.add_argument(
        "--lr", type=float, default=1e-4, help="AdamW learning rate (default: %(default)s)"
    )
    p.add_argument(
        "--peak-tflops",
        type=float,
        help="device peak for MFU (default: the GPU's dense bf16 peak; none on CPU)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="profile the timed steps: op table + chrome trace per variant",
    )
    p.add_argument(
        "--profile-dir", default="bench-profiles", help="where traces go (default: %(default)s)"
    )
    p.add_argument("--json-out", type=Path, help="also write the results as JSON here")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import torch

    args = parse_args(argv)
    if args.warmup < 1 or args.steps < 1:
        raise SystemExit(
            "--warmup and --steps must be at least 1 (the first warmup step gives the loss check)"
        )
    names = (
        list(VARIANTS) if args.variants == "all" else [n.strip() for n in args.variants.split(",")]
    )
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    names.sort(key=list(VARIANTS).index)  # Liger patches process-wide: its variants go last
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    device_name = (
        torch.cuda.get_device_name()
        if cuda
        else f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    )
    peak = args.peak_tflops or (device_peak_tflops(device_name) if cuda else None)

    tokenizer = None
    if args.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    if args.prepared_dir:
        per_task = wl.prepared_lengths(args.prepared_dir, args.split, tokenizer=tokenizer)
        lengths = [n for ls in per_task.values() for n in ls]
        source = f"{args.prepared_dir} ({args.split}; {'tokenizer' if tokenizer else f'~{wl.CHARS_PER_TOKEN} chars/token'})"
    else:
        lengths, source = (
            wl.synthetic_lengths(4096, args.max_len, args.seed),
            "synthetic log-normal",
        )
    lengths = wl.cap_lengths(lengths, args.max_len)
    steps = wl.sample_steps(lengths, args.batch_size, args.warmup + args.steps, args.seed)
    shape = ModelShape.from_config(wl.load_model_config(args.model))

    print(
        f"device: {device_name}; peak for MFU: {f'{peak} TFLOP/s' if peak else 'unknown (MFU not shown; pass --peak-tflops)'}"
    )
    print(
        f"model: {args.model} (N = {shape.matmul_params():,} matmul params, LoRA r={args.lora_r}: {shape.lora_params(args.lora_r):,}); dtype {'bf16' if cuda else 'fp32'}"
    )
    print(f"lengths: {source}, cap {args.max_len}: {wl.describe_lengths(lengths)}")
    print(
        f"batch: {args.batch_size} examples/step, {args.warmup} warmup + {args.steps} timed steps, same batches for every variant"
    )

    results = []
    with single_process_group():
        results = run_all(args, names, steps, device, cuda, peak)
    return report(args, argv, results, device_name, peak, lengths, cuda)


def run_all(
    args, names: list[str], steps: list[list[int]], device, cuda: bool, peak: float | None
) -> list[Result]:
    import torch

    results = []
    for name in names:
        v = VARIANTS[name]
        reason = why_not_runnable(v, cuda)
        if reason:
            print(f"[{name}] skipped: {reason}")
            results.append(Result(name, status=f"skipped: {reason}", settings=asdict(v)))
            continue
        print(f"[{name}] running ...", flush=True)
        try:
            results.append(run_variant(args, v, steps, device, cuda, peak, args.profile))
        except torch.cuda.OutOfMemoryError:
            print(f"[{name}] CUDA out of memory", file=sys.stderr)
            results.append(Result(name, status="error: CUDA out of memory", settings=asdict(v)))
        except Exception as e:  # one broken variant must not hide the others' figures
            print(f"[{name}] failed: {type(e).__name__}: {e}", file=sys.stderr)
            results.append(
                Result(
                    name, status=f"error: {type(e).__name__}: {str(e)[:120]}", settings=asdict(v)
                )
            )
        # Outside the except blocks, so no traceback keeps the variant's tensors alive.
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    return results


def report(
    args,
    argv,
    results: list[Result],
    device_name: str,
    peak: float | None,
    lengths: list[int],
    cuda: bool,
) -> int:
    import torch

    print()
    print(format_table(results, "peak GiB" if cuda else "peak RSS GiB"))
    # Regrouped batches hold other examples in step 1: left out of the loss comparison.
    first = {
        r.variant: r.first_loss
        for r in results
        if r.first_loss is not None and not r.settings.get("grouped")
    }
    if first:
        spread = max(first.values()) - min(first.values())
        print(
            f"first-step loss, all variants on the shared batches (same init, same examples): {min(first.values()):.5f} .. {max(first.values()):.5f} (spread {spread:.2e});"
        )
        print(
            "packing and padding must agree (fp32: < 1e-5; bf16: ~1e-2 from rounding); more means cross-example attention or a mask bug."
        )
    print(
        "tokens/s counts real (non-pad) tokens. MFU lora = (4·N + 6·N_lora)·tokens + 3·causal attention fwd;"
    )
    print(
        "MFU 6N = 6·N·tokens (full fine-tuning convention); both over the peak above, recompute not counted."
    )
    if args.json_out:
        record = {
            "script": "bench_train",
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(
                [Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]
            ),
            "device": device_name,
            "peak_tflops": peak,
            "torch": torch.__version__,
            "args": {
                k: str(val) if isinstance(val, Path) else val for k, val in vars(args).items()
            },
            "lengths": wl.describe_lengths(lengths),
            "results": [asdict(r) for r in results],
        }
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json_out}")
    return 0 if all(not r.status.startswith("error") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
