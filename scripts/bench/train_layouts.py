"""Training speed of the ways to lay pairs out, on real pairs (`scripts/bench_train.py --model
<a real model>`, or `--model <architecture> --layouts ...` for random-init weights of one).

The same prepared train pairs (per task: whole documents, about `pairs` of them), fitted and
tokenized exactly as training does (`fincheck.train.data.training_row`, window `max_length`),
go through LoRA training steps (r=16 on every linear layer, AdamW, one optimizer step per
micro-batch) in each layout, each with the loss the trainer computes for it:
  unpacked         `batch_size` pairs per micro-batch, right-padded, TRL's collator and fused LM
                   head (what training did before tree packing)
  unpacked-keep    the same batches, logits only where the next token is a target (as the tree
                   loss keeps them)
  padding-free     the same `batch_size` pairs end to end in one row, position_ids restarting per
                   pair (TRL's padding_free collator and fused LM head; SDPA masks across pairs)
  tree             the pairs in prefix-tree packs of at most `tree_max_tokens` tokens
                   (`fincheck.train.tree_layout`), `tree_batch_size` packs per micro-batch, the
                   trainer's tree loss, the chunked SDPA tree attention (the CPU's kernel)
  tree-flex        the packs one per micro-batch through FlexAttention, each row padded to the
                   budget as training pads it (one shape: compiled once; GPU only)
  tree-flex-batch  `flex_batch_size` packs per micro-batch, the same fixed rows (GPU only)
Default layouts: unpacked, padding-free, tree on a CPU; unpacked, unpacked-keep, tree, tree-flex,
tree-flex-batch on a GPU. Precision: fp32 on a CPU; on a GPU bf16 weights and autocast, the
adapters in fp32, as the trainer runs them.

Reported per task and layout: pairs/s, tokens run (what the model computed, padding included)
and their rate, the pairs' own tokens per second (as if trained unpacked without padding),
answer tokens, seconds, speed-up over unpacked, peak memory (GPU: allocated, reset per layout;
CPU: the process's resident peak so far), the untimed first step's seconds and the compile time
it hid (first step minus the median step), the slowest timed step over the median (1.0: no
spike), and MFU over the tokens run (`bench.flops`, LoRA convention: (4·N + 6·N_lora)
per token run, plus 3 x 4·d_attn·layers per query-key pair the mask lets through). With the
default lr=0 the weights never move, so the mean loss over all answer tokens must be the same
in every layout (fp32: within 1e-4; bf16: about 1e-2 from rounding): a check that the layouts
train the same thing, printed beside the speed.
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import workload as wl
from bench.flops import ModelShape, device_peak_tflops, mfu
from fincheck.config import config_field
from fincheck.errors import FincheckError

CPU_LAYOUTS = ("unpacked", "padding-free", "tree")
GPU_LAYOUTS = ("unpacked", "unpacked-keep", "tree", "tree-flex", "tree-flex-batch")
LAYOUTS = ("unpacked", "unpacked-keep", "padding-free", "tree", "tree-flex", "tree-flex-batch")
FLEX_LAYOUTS = ("tree-flex", "tree-flex-batch")


@dataclass
class TrainLayoutSettings:
    model: str = config_field(
        "smollm2-135m-instruct",
        "a real model: a `fincheck models` name, a local folder, or 'tiny-random' (the "
        "random-init test model of the recipes); or an architecture of configs/models/ with "
        "--layouts, random-init weights of it (then --tokenizer is required)",
    )
    tokenizer: str | None = config_field(
        None,
        "an architecture's tokenizer: a folder or a `fincheck models` name (a real model "
        "brings its own)",
    )
    chat_template: Path | None = config_field(
        None, "a chat template file, instead of the tokenizer's (e.g. train/assets/chatml.jinja)"
    )
    prepared_dir: Path | None = config_field(None, "a `fincheck prepare` output (required)")
    split: str = config_field("train", "split of --prepared-dir to read")
    tasks: list[str] = config_field(["qasem", "fhsumbench"], "comma list of tasks")
    pairs: int = config_field(56, "pairs per task: whole documents, about this many")
    max_length: int = config_field(1024, "tokens per pair (documents trimmed as training does)")
    tree_max_tokens: int | None = config_field(
        None, "tokens per tree pack (default 2 x max_length)"
    )
    batch_size: int = config_field(2, "pairs per micro-batch (unpacked, padding-free)")
    tree_batch_size: int = config_field(1, "packs per micro-batch (tree)")
    flex_batch_size: int = config_field(2, "packs per micro-batch (tree-flex-batch)")
    layouts: list[str] = config_field(
        ["auto"], f"comma list of layouts ({', '.join(LAYOUTS)}), or auto (by device)"
    )
    lr: float = config_field(0.0, "AdamW learning rate (0: weights fixed, losses comparable)")
    lora_r: int = config_field(16, "LoRA rank")
    peak_tflops: float | None = config_field(
        None, "device peak for MFU (default: the GPU's dense bf16 peak; none on a CPU)"
    )
    seed: int = config_field(0, "seed of the document sample and the order of pairs")


@dataclass
class LayoutResult:
    task: str
    layout: str
    pairs: int
    micro_batches: int
    seconds: float
    tokens_run: int  # input positions the model computed, padding included
    real_tokens: int  # tokens of the micro-batches before padding (a pack: each prefix once)
    pairs_per_s: float
    tokens_per_s: float  # tokens run per second
    mean_loss: float  # over every answer token of the pairs
    peak_rss_gib: float  # CPU: the process's peak so far; GPU: peak allocated in this layout
    speedup: float | None = None  # pairs/s over unpacked
    pair_tokens_per_s: float = 0.0  # the pairs' own tokens (each alone, no padding) per second
    answer_tokens: int = 0
    attention: str = ""
    rows_per_batch: int = 0
    warmup_s: float = 0.0  # the untimed first step
    compile_s: float = 0.0  # first step minus the median timed step: compilation, allocation
    max_step_ratio: float = 0.0  # slowest timed step / median: 1.0 = no spike
    mfu: float | None = None
    status: str = "ok"  # or "error: ..." (out of memory): the other layouts still run


@dataclass
class TrainLayoutReport:
    device: str
    model: str
    settings: dict
    results: list[LayoutResult] = field(default_factory=list)
    date: str = field(default_factory=wl.utc_now)
    dtype: str = "fp32"
    peak_tflops: float | None = None
    flop_convention: str = (
        "MFU = FLOPs / seconds / peak over the tokens run (padding included): "
        "(4*N + 6*N_lora) per token + 3 * 4*d_attn*layers per query-key pair the mask lets "
        "through (causal pairs for unpacked rows, tree_end's pairs for packs); N = matmul "
        "weights incl. the LM head"
    )

    def to_json(self, command: str) -> dict:
        import torch

        return {"script": "bench_train_layouts", "command": command, "torch": torch.__version__,
                **asdict(self)}  # fmt: skip


@dataclass(frozen=True)
class Machine:
    device: Any
    cuda: bool
    dtype: Any


def load_model_and_tokenizer(s: TrainLayoutSettings, scratch: Path, machine: Machine):
    """The base with LoRA on every linear layer (fp32 on a CPU; bf16 weights, fp32 adapters on
    a GPU) and its tokenizer with a pad token."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.trainer.utils import add_fused_lm_head

    from fincheck.loading import resolve_model
    from fincheck.train.model import choose_pad_token
    from fincheck.train.tree_attention import use_tree_attention

    torch.manual_seed(s.seed)
    if wl.is_architecture(s.model):
        if not s.tokenizer:
            raise ValueError(f"--model {s.model} is an architecture: give --tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(resolve_model(s.tokenizer))
        config = wl.load_model_config(s.model, attn_implementation="sdpa")
        with machine.device:  # initialise in place: a 1.5B random init on the CPU takes a while
            model = AutoModelForCausalLM.from_config(config, dtype=machine.dtype)
    else:
        if s.model == "tiny-random":
            from fincheck.train.tiny_model import save_tiny_base

            path = str(save_tiny_base(scratch / "tiny-base"))
        else:
            path = resolve_model(s.model)
        tokenizer = AutoTokenizer.from_pretrained(
            resolve_model(s.tokenizer) if s.tokenizer else path
        )
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=machine.dtype, attn_implementation="sdpa"
        ).to(machine.device)
    if s.chat_template:
        tokenizer.chat_template = s.chat_template.read_text(encoding="utf-8")
    pad = choose_pad_token(tokenizer, None)
    if pad not in tokenizer.get_vocab():
        raise FincheckError(f"{s.model}: no pad token distinct from EOS in the vocabulary")
    tokenizer.pad_token = pad
    model.config.use_cache = False
    add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))  # as SFTTrainer does
    use_tree_attention(model)  # as training with tree_packing does (other layouts: plain SDPA)
    config = LoraConfig(
        r=s.lora_r, lora_alpha=2 * s.lora_r, lora_dropout=0.0, target_modules="all-linear"
    )
    return get_peft_model(model, config), tokenizer


def training_rows(s: TrainLayoutSettings, task: str, tokenizer) -> list[dict[str, Any]]:
    """The task's sampled train pairs as training rows (fitted, tokenized, labels), shuffled."""
    from fincheck.pairs import sample_documents
    from fincheck.prepared import read_split
    from fincheck.train.data import training_row

    pairs = sample_documents(read_split(s.prepared_dir, task, s.split), s.pairs, s.seed)
    rows = [row for p in pairs if (row := training_row(p, tokenizer, s.max_length)[0])]
    if not rows:
        raise ValueError(f"{task}: no {s.split} pair fits --max-length {s.max_length}")
    random.Random(s.seed).shuffle(rows)
    return rows


def micro_batches(layout: str, rows: list[dict], s: TrainLayoutSettings, pad: int) -> list[dict]:
    """The rows laid out as `layout`'s micro-batches (tensors, on the CPU), with what was
    measured of each: `_real` tokens before padding, `_pairs` visible query-key pairs."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from fincheck.train.tree_attention import FLEX_BLOCK
    from fincheck.train.tree_batches import TreeCollator, round_up
    from fincheck.train.tree_layout import pack_rows

    budget = s.tree_max_tokens or 2 * s.max_length
    if layout.startswith("tree"):
        items = [p.as_row() for p in pack_rows(rows, budget)]
        size = {"tree": s.tree_batch_size, "tree-flex": 1}.get(layout, s.flex_batch_size)
        flex = layout in FLEX_LAYOUTS
        length = round_up(budget, FLEX_BLOCK) if flex else None
        collate = TreeCollator(pad, length=length, rows=size if flex else 1)
    else:
        items = [{"input_ids": r["input_ids"], "labels": r["labels"]} for r in rows]
        size = s.batch_size
        collate = DataCollatorForLanguageModeling(pad, padding_free=layout == "padding-free")
    chunks = [items[k : k + size] for k in range(0, len(items), size)]
    return [{**collate(c), "_real": sum(len(x["input_ids"]) for x in c),
             "_pairs": visible_pairs(c, layout)} for c in chunks]  # fmt: skip


def visible_pairs(items: list[dict], layout: str) -> int:
    """Query-key pairs the mask lets through (real tokens): a pack's, from tree_end (key k is
    seen by the queries [k, tree_end[k])); an unpacked row's, causal; padding-free: per pair."""
    if layout.startswith("tree"):
        return sum(end - k for it in items for k, end in enumerate(it["tree_end"]))
    return sum(len(it["input_ids"]) * (len(it["input_ids"]) + 1) // 2 for it in items)


def attention_for(layout: str) -> str:
    from fincheck.train.tree_attention import TREE_SDPA

    return "flex_attention" if layout in FLEX_LAYOUTS else TREE_SDPA


def keep_loss(model, inputs: dict):
    """Unpacked rows, logits only where some row's next token is a target (as tree_forward)."""
    import torch

    from fincheck.train.tree_layout import IGNORE, logit_positions

    labels = inputs["labels"]
    keep = logit_positions(labels)
    logits = model(
        input_ids=inputs["input_ids"],
        attention_mask=inputs["attention_mask"],
        use_cache=False,
        logits_to_keep=keep,
    ).logits
    return torch.nn.functional.cross_entropy(
        logits.float().flatten(0, 1), labels[:, keep + 1].flatten(), ignore_index=IGNORE
    )


def run_layout(model, batches: list[dict], lr: float, layout: str, machine: Machine):
    """Train on the batches (one AdamW step each) after one untimed step of the first batch
    (the warmup: compilation, allocation). Returns (warmup seconds, each timed step's seconds,
    mean answer-token loss)."""
    import torch

    from fincheck.train.tree_attention import tree_forward

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    model.train()
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=machine.cuda)
    sync = torch.cuda.synchronize if machine.cuda else (lambda: None)

    def step(batch: dict) -> tuple[float, int]:
        inputs = {k: v.to(machine.device) if hasattr(v, "to") else v  # padding-free: ints too
                  for k, v in batch.items() if not k.startswith("_")}  # fmt: skip
        with autocast:
            if "tree_end" in inputs:
                loss = tree_forward(model, inputs)[0]
            elif layout == "unpacked-keep":
                loss = keep_loss(model, inputs)
            else:  # TRL's SFT loss (use_cache=False as TRL trains: padding-free needs it)
                loss = model(**inputs, use_cache=False, fused_lm_head=True).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        n = int((batch["labels"][:, 1:] != -100).sum())
        return float(loss.detach()) * n, n

    sync()
    start = time.perf_counter()
    step(batches[0])
    sync()
    warmup = time.perf_counter() - start
    total, count, times = 0.0, 0, []
    for batch in batches:
        start = time.perf_counter()
        loss_sum, n = step(batch)  # float(loss) waits for the step: the time is the step's
        times.append(time.perf_counter() - start)
        total, count = total + loss_sum, count + n
    return warmup, times, total / max(count, 1)


def check_layouts(s: TrainLayoutSettings, cuda: bool) -> list[str]:
    if s.prepared_dir is None:
        raise ValueError("--prepared-dir is required (a `fincheck prepare` output)")
    layouts = list(GPU_LAYOUTS if cuda else CPU_LAYOUTS) if s.layouts == ["auto"] else s.layouts
    unknown = [name for name in layouts if name not in LAYOUTS]
    if unknown:
        raise ValueError(f"unknown layouts {unknown}; known: {', '.join(LAYOUTS)}, auto")
    if not cuda and any(name in FLEX_LAYOUTS for name in layouts):
        raise ValueError("tree-flex layouts need a GPU: FlexAttention has no backward on the CPU")
    return layouts


def run_train_layouts(
    s: TrainLayoutSettings, log: Callable[[str], None] = lambda line: print(line, flush=True)
) -> TrainLayoutReport:
    import tempfile

    import torch

    cuda = torch.cuda.is_available()
    layouts = check_layouts(s, cuda)
    machine = Machine(
        torch.device("cuda" if cuda else "cpu"), cuda, torch.bfloat16 if cuda else torch.float32
    )
    device = wl.device_name()
    peak = s.peak_tflops or (device_peak_tflops(device) if cuda else None)
    report = TrainLayoutReport(
        device, s.model, {k: str(v) for k, v in asdict(s).items()},
        dtype="bf16" if cuda else "fp32", peak_tflops=peak,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as scratch:
        model, tokenizer = load_model_and_tokenizer(s, Path(scratch), machine)
        shape = ModelShape.from_config(model.get_base_model().config)
        # FLOPs per token run and per query-key pair the mask lets through (flop_convention)
        costs = (4 * shape.matmul_params() + 6 * shape.lora_params(s.lora_r),
                 3 * 4 * shape.attn_dim * shape.layers)  # fmt: skip
        for task in s.tasks:
            rows = training_rows(s, task, tokenizer)
            totals = (sum(len(r["input_ids"]) for r in rows),
                      sum(sum(x != -100 for x in r["labels"]) for r in rows))  # fmt: skip
            log(f"{task}: {len(rows)} pairs, {totals[0]:,} tokens, {totals[1]:,} answer tokens")
            base_rate = None
            for layout in layouts:
                model.get_base_model().set_attn_implementation(attention_for(layout))
                batches = micro_batches(layout, rows, s, tokenizer.pad_token_id)
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                try:
                    measured = run_layout(model, batches, s.lr, layout, machine)
                except torch.cuda.OutOfMemoryError:  # one layout too big: the others still run
                    measured = None
                if measured is None:
                    log(f"  {layout:<15} out of GPU memory")
                    report.results.append(failed_layout(task, layout, rows, "error: out of memory"))
                else:
                    result = measure(task, layout, rows, totals, batches, measured, machine,
                                     peak, costs)  # fmt: skip
                    if layout == "unpacked":
                        base_rate = result.pairs_per_s
                    if base_rate:
                        result.speedup = result.pairs_per_s / base_rate
                    report.results.append(result)
                    log(
                        f"  {layout:<15} {result.pairs_per_s:8.2f} pairs/s  {result.tokens_run:>9,} "
                        f"tokens run  {result.seconds:7.2f} s  first step {result.warmup_s:6.2f} s  "
                        f"loss {result.mean_loss:.5f}"
                    )
                del batches
                gc.collect()
                if cuda:
                    torch.cuda.empty_cache()
    return report


def measure(task: str, layout: str, rows: list[dict], totals: tuple[int, int],
            batches: list[dict], measured: tuple, machine: Machine, peak: float | None,
            costs: tuple[int, int]) -> LayoutResult:  # fmt: skip
    """What one layout's run measured (`run_layout`'s warmup, step times, loss); `totals`: the
    pairs' own tokens and answer tokens; `costs`: FLOPs per token run and per visible pair."""
    import torch

    warmup, times, loss = measured
    seconds, median = sum(times), statistics.median(times)
    tokens_run = sum(int(b["input_ids"].numel()) for b in batches)
    flops = costs[0] * tokens_run + costs[1] * sum(b["_pairs"] for b in batches)
    memory = torch.cuda.max_memory_allocated() if machine.cuda else wl.peak_rss_bytes()
    return LayoutResult(
        task=task,
        layout=layout,
        pairs=len(rows),
        micro_batches=len(batches),
        seconds=round(seconds, 3),
        tokens_run=tokens_run,
        real_tokens=sum(b["_real"] for b in batches),
        pairs_per_s=len(rows) / seconds,
        tokens_per_s=tokens_run / seconds,
        mean_loss=loss,
        peak_rss_gib=memory / 2**30,
        pair_tokens_per_s=totals[0] / seconds,
        answer_tokens=totals[1],
        attention=attention_for(layout) if layout.startswith("tree") else "sdpa",
        rows_per_batch=int(batches[0]["input_ids"].shape[0]),
        warmup_s=round(warmup, 3),
        compile_s=round(max(0.0, warmup - median), 3),
        max_step_ratio=round(max(times) / median, 2),
        mfu=mfu(flops, seconds, peak),
    )


def failed_layout(task: str, layout: str, rows: list[dict], status: str) -> LayoutResult:
    return LayoutResult(task, layout, len(rows), 0, 0.0, 0, 0, 0.0, 0.0, float("nan"), 0.0,
                        status=status)  # fmt: skip


def format_layouts_report(report: TrainLayoutReport) -> str:
    memory = "peak GiB" if report.dtype == "bf16" else "peak RSS GiB"
    lines = [
        f"model: {report.model}; device: {report.device}; {report.dtype}, LoRA "
        f"r={report.settings['lora_r']}",
        "",
        "| task | layout | pairs | micro-batches | tokens run | seconds | pairs/s | tokens/s "
        f"| speed-up | mean loss | pair tokens/s | first step s | slowest/median | MFU | {memory} |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    losses: dict[str, list[float]] = {}  # per task, one per layout
    for r in report.results:
        if r.status != "ok":
            lines.append(f"| {r.task} | {r.layout} | {r.pairs} | {r.status} |")
            continue
        losses.setdefault(r.task, []).append(r.mean_loss)
        speedup = f"{r.speedup:.2f}x" if r.speedup is not None else "–"
        util = f"{r.mfu:.1%}" if r.mfu is not None else "–"
        lines.append(
            f"| {r.task} | {r.layout} | {r.pairs} | {r.micro_batches} | {r.tokens_run:,} | "
            f"{r.seconds:.1f} | {r.pairs_per_s:.3f} | {r.tokens_per_s:.0f} | {speedup} | "
            f"{r.mean_loss:.5f} | {r.pair_tokens_per_s:.0f} | {r.warmup_s:.2f} | "
            f"{r.max_step_ratio:.2f} | {util} | {r.peak_rss_gib:.2f} |"
        )
    lines.append("")
    bound = "bf16 ~1e-2" if report.dtype == "bf16" else "fp32 < 1e-4"
    lines.append(
        f"mean loss spread between layouts (lr=0: must be ~0, {bound}): "
        + ", ".join(f"{task} {max(ls) - min(ls):.1e}" for task, ls in sorted(losses.items()))
    )
    if report.peak_tflops:
        lines.append(f"{report.flop_convention}; peak {report.peak_tflops} TFLOP/s")
    return "\n".join(lines)
