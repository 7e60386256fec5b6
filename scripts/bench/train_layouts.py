"""Training speed of the ways to lay pairs out, on real pairs and a real model
(`scripts/bench_train.py --model <a real model>`).

The same prepared train pairs (per task: whole documents, about `pairs` of them), fitted and
tokenized exactly as training does (`fincheck.train.data.training_row`, window `max_length`),
go through LoRA training steps (r=16 on every linear layer, AdamW, fp32, one optimizer step per
micro-batch) in each layout, each with the loss the trainer computes for it:
  unpacked      `batch_size` pairs per micro-batch, right-padded, TRL's collator and fused LM
                head (what training did before tree packing)
  padding-free  the same `batch_size` pairs end to end in one row, position_ids restarting per
                pair (TRL's padding_free collator and fused LM head; SDPA masks across pairs)
  tree          the pairs in prefix-tree packs of at most `tree_max_tokens` tokens
                (`fincheck.train.tree_packing`), `tree_batch_size` packs per micro-batch, the
                trainer's tree loss (logits at the target positions only)
Reported per task and layout: pairs/s, tokens run (what the model computed, padding
included), seconds, speed-up over unpacked, peak resident memory. With the default lr=0 the
weights never move, so the mean loss over all answer tokens must be the same in every layout
(fp32: within 1e-4): a check that the layouts train the same thing, printed beside the speed.
One untimed warmup micro-batch per layout first.
"""

from __future__ import annotations

import gc
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fincheck.bench import workload as wl
from fincheck.config import config_field
from fincheck.errors import FincheckError

LAYOUTS = ("unpacked", "padding-free", "tree")


@dataclass
class TrainLayoutSettings:
    model: str = config_field(
        "smollm2-135m-instruct",
        "a real model: a `fincheck models` name, a local folder, or 'tiny-random' (the "
        "random-init test model of the recipes)",
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
    layouts: list[str] = config_field(list(LAYOUTS), "comma list of layouts")
    lr: float = config_field(0.0, "AdamW learning rate (0: weights fixed, losses comparable)")
    lora_r: int = config_field(16, "LoRA rank")
    seed: int = config_field(0, "seed of the document sample and the order of pairs")


@dataclass
class LayoutResult:
    task: str
    layout: str
    pairs: int
    micro_batches: int
    seconds: float
    tokens_run: int  # input positions the model computed, padding included
    real_tokens: int
    pairs_per_s: float
    tokens_per_s: float
    mean_loss: float  # over every answer token of the pairs
    peak_rss_gib: float
    speedup: float | None = None  # pairs/s over unpacked


@dataclass
class TrainLayoutReport:
    device: str
    model: str
    settings: dict
    results: list[LayoutResult] = field(default_factory=list)
    date: str = field(default_factory=wl.utc_now)

    def to_json(self, command: str) -> dict:
        import torch

        return {"command": command, "torch": torch.__version__, **asdict(self)}


def load_model_and_tokenizer(s: TrainLayoutSettings, scratch: Path):
    """The base (fp32) with LoRA on every linear layer, and its tokenizer with a pad token."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from fincheck.models import resolve_model
    from fincheck.train.model import choose_pad_token

    if s.model == "tiny-random":
        from fincheck.train.tiny_model import save_tiny_base

        path = str(save_tiny_base(scratch / "tiny-base"))
    else:
        path = resolve_model(s.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    pad = choose_pad_token(tokenizer, None)
    if pad not in tokenizer.get_vocab():
        raise FincheckError(f"{path}: no pad token distinct from EOS in the vocabulary")
    tokenizer.pad_token = pad
    from trl.trainer.utils import add_fused_lm_head

    from fincheck.train.tree_packing import use_tree_attention

    torch.manual_seed(s.seed)
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="sdpa"
    )
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
    """The rows laid out as `layout`'s micro-batches (tensors, on the CPU)."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from fincheck.train.tree_batches import TreeCollator
    from fincheck.train.tree_packing import pack_rows

    if layout == "tree":
        items = [p.as_row() for p in pack_rows(rows, s.tree_max_tokens or 2 * s.max_length)]
        size, collate = s.tree_batch_size, TreeCollator(pad)
    else:
        items = [{"input_ids": r["input_ids"], "labels": r["labels"]} for r in rows]
        size = s.batch_size
        collate = DataCollatorForLanguageModeling(pad, padding_free=layout == "padding-free")
    chunks = [items[k : k + size] for k in range(0, len(items), size)]
    # _real: the tokens before padding (a tree pack's input_ids hold each shared prefix once)
    return [{**collate(c), "_real": sum(len(x["input_ids"]) for x in c)} for c in chunks]


def run_layout(model, batches: list[dict], lr: float) -> tuple[float, float]:
    """Train on the batches (one AdamW step each); returns (seconds, mean answer-token loss).
    The first batch runs once more, untimed, as warmup."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    model.train()

    from fincheck.train.tree_packing import tree_forward

    def step(batch: dict) -> tuple[float, int]:
        inputs = {k: v for k, v in batch.items() if not k.startswith("_")}
        if "tree_end" in inputs:
            loss = tree_forward(model, inputs)[0]
        else:  # TRL's SFT loss (use_cache=False as TRL trains: padding-free needs it)
            loss = model(**inputs, use_cache=False, fused_lm_head=True).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        n = int((inputs["labels"][:, 1:] != -100).sum())
        return float(loss.detach()) * n, n

    step(batches[0])  # warmup
    total, count = 0.0, 0
    start = time.perf_counter()
    for batch in batches:
        loss_sum, n = step(batch)
        total, count = total + loss_sum, count + n
    return time.perf_counter() - start, total / max(count, 1)


def run_train_layouts(
    s: TrainLayoutSettings, log: Callable[[str], None] = lambda line: print(line, flush=True)
) -> TrainLayoutReport:
    import tempfile

    if s.prepared_dir is None:
        raise ValueError("--prepared-dir is required (a `fincheck prepare` output)")
    unknown = [name for name in s.layouts if name not in LAYOUTS]
    if unknown:
        raise ValueError(f"unknown layouts {unknown}; known: {', '.join(LAYOUTS)}")
    report = TrainLayoutReport(wl.device_name(), s.model, {k: str(v) for k, v in asdict(s).items()})
    with tempfile.TemporaryDirectory() as scratch:
        model, tokenizer = load_model_and_tokenizer(s, Path(scratch))
        for task in s.tasks:
            rows = training_rows(s, task, tokenizer)
            log(f"{task}: {len(rows)} pairs, {sum(len(r['input_ids']) for r in rows):,} tokens")
            base_rate = None
            for layout in s.layouts:
                batches = micro_batches(layout, rows, s, tokenizer.pad_token_id)
                seconds, loss = run_layout(model, batches, s.lr)
                tokens_run = sum(int(b["input_ids"].numel()) for b in batches)
                result = LayoutResult(
                    task=task,
                    layout=layout,
                    pairs=len(rows),
                    micro_batches=len(batches),
                    seconds=round(seconds, 2),
                    tokens_run=tokens_run,
                    real_tokens=sum(b["_real"] for b in batches),
                    pairs_per_s=len(rows) / seconds,
                    tokens_per_s=tokens_run / seconds,
                    mean_loss=loss,
                    peak_rss_gib=wl.peak_rss_bytes() / 2**30,
                )
                if layout == "unpacked":
                    base_rate = result.pairs_per_s
                if base_rate:
                    result.speedup = result.pairs_per_s / base_rate
                report.results.append(result)
                log(
                    f"  {layout:<13} {result.pairs_per_s:6.3f} pairs/s  {tokens_run:>9,} tokens "
                    f"run  {seconds:7.1f} s  loss {loss:.5f}"
                )
                del batches
                gc.collect()
    return report


def format_layouts_report(report: TrainLayoutReport) -> str:
    lines = [
        f"model: {report.model}; device: {report.device}; fp32, LoRA r={report.settings['lora_r']}",
        "",
        "| task | layout | pairs | micro-batches | tokens run | seconds | pairs/s | tokens/s "
        "| speed-up | mean loss |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    losses: dict[str, list[float]] = {}  # per task, one per layout
    for r in report.results:
        losses.setdefault(r.task, []).append(r.mean_loss)
        speedup = f"{r.speedup:.2f}x" if r.speedup is not None else "–"
        lines.append(
            f"| {r.task} | {r.layout} | {r.pairs} | {r.micro_batches} | {r.tokens_run:,} | "
            f"{r.seconds:.1f} | {r.pairs_per_s:.3f} | {r.tokens_per_s:.0f} | {speedup} | "
            f"{r.mean_loss:.5f} |"
        )
    lines.append("")
    lines.append(
        "mean loss spread between layouts (lr=0: must be ~0, fp32 < 1e-4): "
        + ", ".join(f"{task} {max(ls) - min(ls):.1e}" for task, ls in sorted(losses.items()))
    )
    return "\n".join(lines)
