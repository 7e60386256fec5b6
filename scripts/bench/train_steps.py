"""One variant of the training benchmark (`bench.train_variants`): its model (a
random init of a real architecture, LoRA on every linear layer), its optimizer or DeepSpeed
engine, the warmup and timed steps on the batches every variant shares, and what they measured.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from unittest import mock

from bench import workload as wl
from bench.flops import ModelShape, full_ft_flops, lora_train_flops, mfu

if TYPE_CHECKING:
    from bench.train_variants import TrainBenchSettings


@dataclass(frozen=True)
class Variant:
    name: str
    packed: bool = True
    grouped: bool = False  # padded batches regrouped by length (HF group_by_length)
    attn: str = "sdpa"
    liger: bool = False
    grad_ckpt: bool = False
    zero: int | None = None


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


def build_model(s: TrainBenchSettings, v: Variant, device, dtype):
    """Random-init model (fixed seed) with LoRA r on every linear layer."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    config = wl.load_model_config(s.model, attn_implementation=v.attn)
    config.use_cache = False
    torch.manual_seed(s.seed)
    with device:  # initialise on the GPU directly: a 1.5B random init on the CPU takes a while
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if v.liger:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance

        _apply_liger_kernel_to_instance(model=model)
    if v.grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lora = LoraConfig(
        r=s.lora_r,
        lora_alpha=2 * s.lora_r,
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


@contextlib.contextmanager
def single_process_group() -> Iterator[None]:
    """A world of one for DeepSpeed (free port), torn down afterwards with the env restored, so
    the benchmark leaves no process group or RANK/WORLD_SIZE behind (matters under pytest)."""
    import torch

    from fincheck.train.sft import single_process_group_env

    def initialized() -> bool:
        return torch.distributed.is_available() and torch.distributed.is_initialized()

    was_initialized = initialized()
    with mock.patch.dict(os.environ):  # restores the environment on the way out
        single_process_group_env()  # the one `fincheck train` describes
        try:
            yield
        finally:
            if not was_initialized and initialized():
                torch.distributed.destroy_process_group()


def regroup_by_length(steps: list[list[int]], warmup: int) -> list[list[int]]:
    """The same examples, sorted by length and re-cut into batches of the same sizes, within
    the warmup steps and within the timed steps separately (so the timed tokens are unchanged)."""

    def regroup(part: list[list[int]]) -> list[list[int]]:
        pool = iter(sorted((n for b in part for n in b), reverse=True))
        return [list(itertools.islice(pool, len(b))) for b in part]

    return regroup(steps[:warmup]) + regroup(steps[warmup:])


def run_variant(
    s: TrainBenchSettings,
    v: Variant,
    steps: list[list[int]],
    device,
    cuda: bool,
    peak: float | None,
    log: Callable[[str], None],
) -> Result:
    """Build the variant's model, run warmup + timed steps on the shared batches, measure."""
    import torch

    dtype = torch.bfloat16 if cuda else torch.float32
    model, config = build_model(s, v, device, dtype)
    shape = ModelShape.from_config(config)
    engine = None
    if v.zero:
        engine = deepspeed_engine(
            model, v.zero, bf16=cuda, micro_batch=1 if v.packed else s.batch_size, lr=s.lr
        )
        forward, optimizer = engine, None
    else:
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=s.lr, fused=cuda)
        forward = model
    model.train()
    if v.grouped:
        steps = regroup_by_length(steps, s.warmup)
    gen = torch.Generator().manual_seed(s.seed)
    batches = [
        wl.packed_batch(b, shape.vocab, gen)
        if v.packed
        else wl.padded_batch(b, shape.vocab, 0, gen)
        for b in steps
    ]
    # bf16 base weights; PEFT keeps the adapters in fp32, autocast runs their matmuls in bf16.
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda and not v.zero)

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
    first_loss = float(step(batches[0]))  # warmup >= 1 (run_train_bench checks)
    for batch in batches[1 : s.warmup]:
        step(batch)
    sync()
    timed = steps[s.warmup :]
    prof = torch.profiler.profile() if s.profile else None  # CPU, and CUDA where there is a GPU
    start = time.perf_counter()
    with prof or contextlib.nullcontext():
        for batch in batches[s.warmup :]:
            loss = step(batch)
            if prof:
                prof.step()
        sync()
    seconds = time.perf_counter() - start
    tokens = sum(sum(b) for b in timed)
    lora_flops = sum(lora_train_flops(shape, b, s.lora_r) for b in timed)
    result = Result(
        variant=v.name,
        tokens_per_s=tokens / seconds,
        step_s=seconds / len(timed),
        mfu_lora=mfu(lora_flops, seconds, peak),
        mfu_6n=mfu(full_ft_flops(shape, tokens), seconds, peak),
        peak_mem_gib=(torch.cuda.max_memory_allocated() if cuda else wl.peak_rss_bytes()) / 2**30,
        first_loss=first_loss,
        loss=float(loss),
        settings=asdict(v),
    )
    if prof:
        sort = "self_device_time_total" if cuda else "self_cpu_time_total"
        log(f"\nprofile of {v.name} ({len(timed)} steps), top 20 ops by {sort}:")
        log(prof.key_averages().table(sort_by=sort, row_limit=20))
        trace = Path(s.profile_dir) / f"trace-{v.name}.json"
        trace.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace))
        log(f"chrome trace: {trace} (open in https://ui.perfetto.dev)")
    if engine is not None:
        engine.destroy()
    return result
