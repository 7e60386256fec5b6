"""The training levers of a recipe, on its own packs, interleaved (`scripts/bench_train.py
--recipe RECIPE`): which precision, LoRA placement, thread count and compilation train it fastest
on this machine, and whether they train the same thing.

Everything comes from the product: the recipe (`configs/train/*.yaml`, with `--set` overrides),
its tokenizer, data mixture and tree packs (`fincheck.train.data`, `.tree_layout`), the base and
its LoRA (`fincheck.train.model`), the loss of a tree batch (`tree_attention.tree_forward`: logits
only where the next token is a target) and the trainer's precision (accelerate wraps the model's
forward in `torch.autocast` and returns fp32 outputs; PEFT keeps the adapters in fp32). Each
variant is one optimizer step (AdamW at the recipe's learning rate, no schedule) per pack.

Interleaved: step k of every variant runs before step k+1 of any, so a machine that gets busier
or cooler during the run slows every variant alike. A variant is a precision with modifiers:

  fp32             fp32 weights, no autocast (`precision: fp32`)
  bf16-autocast    fp32 weights, bf16 autocast (`precision: bf16`, `torch_dtype: fp32`)
  bf16             bf16 weights, bf16 autocast (`precision: bf16`, `torch_dtype: auto`)
  +lastN           LoRA in the last N decoder layers only (`lora_last_layers: N`)
  +threadsN        N intra-op threads (default: torch's, the machine's cores)
  +compile         torch.compile of the model (the recipe key `torch_compile`)
  +packN           packs of at most N tokens (`tree_packing_max_tokens`): the same pairs,
                   packed again, so its steps and losses are not the reference's
  +all-logits      logits at every position (what an LM head does unless told otherwise), to
                   price keeping them at the answer positions only

Reported per variant: tokens/s (the packs' tokens, over every step but the first, which pays for
allocation and compilation and is shown apart), pairs/s, the speed-up over the first variant,
and what it trains: on the first pack, where every variant has the same function (LoRA's B
starts at zero), the per-token losses against the first variant's (mean and largest absolute
difference over the answer tokens), the cosine between the LoRA gradients both have and the share
of their entries whose signs agree; then the loss of every step.
"""

from __future__ import annotations

import copy
import gc
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import workload as wl
from fincheck.errors import FincheckError
from fincheck.io.config import config_field

PRECISIONS = {"fp32": ("fp32", False), "bf16-autocast": ("fp32", True), "bf16": ("bf16", True)}
DEFAULT_VARIANTS = ["fp32", "bf16-autocast", "bf16", "bf16+last12", "bf16+threads1"]


@dataclass
class LeverSettings:
    recipe: Path | None = config_field(None, "a training recipe (configs/train/*.yaml)")
    set: list[str] = config_field(
        [], "recipe overrides, key=value, comma list (e.g. model_name_or_path=tiny-random)"
    )
    variants: list[str] = config_field(
        DEFAULT_VARIANTS, "comma list: PRECISION[+MOD...]; the first is the reference"
    )
    packs: int = config_field(4, "packs of the recipe's mixture each variant trains", at_least=2)
    seed: int = config_field(0, "which packs: a seeded sample")


@dataclass
class Variant:
    name: str
    torch_dtype: str
    autocast: bool
    last_layers: int | None = None
    threads: int | None = None
    compile: bool = False
    pack_tokens: int | None = None
    all_logits: bool = False


def parse_variant(name: str) -> Variant:
    """`bf16+last12+threads1` -> Variant; an unknown part is a clear error."""
    precision, *mods = name.split("+")
    if precision not in PRECISIONS:
        raise FincheckError(f"variant {name!r}: precision is one of {', '.join(PRECISIONS)}")
    v = Variant(name, *PRECISIONS[precision])
    for mod in mods:
        number = mod.lstrip("abcdefghijklmnopqrstuvwxyz-")
        word = mod[: len(mod) - len(number)]
        if word == "compile" and not number:
            v.compile = True
        elif word == "all-logits" and not number:
            v.all_logits = True
        elif word in ("last", "threads", "pack") and number.isdigit() and int(number) > 0:
            setattr(v, {"last": "last_layers", "threads": "threads", "pack": "pack_tokens"}[word],
                    int(number))  # fmt: skip
        else:
            raise FincheckError(
                f"variant {name!r}: unknown modifier {mod!r} (lastN, threadsN, packN, compile, "
                "all-logits)"
            )
    return v


@dataclass
class LeverResult:
    variant: str
    steps: int
    pairs: int
    tokens: int  # tokens of the timed packs (each shared prefix once)
    seconds: float  # the timed steps: every step but the first
    tokens_per_s: float
    pairs_per_s: float
    first_step_s: float
    step_losses: list[float]
    speedup: float | None = None
    same_packs: bool = True  # trains the reference's packs: the loss columns below apply
    first_loss: float | None = None  # mean over the answer tokens of the first pack
    token_loss_mean_abs_diff: float | None = None  # vs the reference, first pack
    token_loss_max_abs_diff: float | None = None
    grad_cosine: float | None = None  # LoRA gradients of the first pack vs the reference's
    grad_sign_agreement: float | None = None  # share of their nonzero entries of equal sign
    status: str = "ok"


@dataclass
class LeverReport:
    device: str
    recipe: str
    model: str
    settings: dict
    learning_rate: float
    results: list[LeverResult] = field(default_factory=list)
    date: str = field(default_factory=wl.utc_now)
    peak_rss_gib: float = 0.0

    def to_json(self, command: str) -> dict:
        import torch

        return {"script": "bench_train_levers", "command": command, "torch": torch.__version__,
                **asdict(self)}  # fmt: skip


@dataclass
class Runner:
    """One variant's model, optimizer and packs, and what its steps measured."""

    variant: Variant
    model: Any
    optimizer: Any
    packs: list[dict[str, Any]]
    seconds: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    first_token_losses: Any = None
    first_grads: dict[str, Any] = field(default_factory=dict)


def load_recipe(s: LeverSettings):
    """The recipe as training builds it, with `--set` applied (no output folder is claimed), in
    fp32: each variant sets its own precision, so a recipe written for bf16 loads on a CPU
    without bf16 units too."""
    from fincheck.train.recipe import load_recipe as load

    if s.recipe is None:
        raise FincheckError("--recipe is required: a training recipe (configs/train/*.yaml)")
    given = [item if item.startswith("--") else f"--{item}" for item in s.set]
    return load(s.recipe, [*given, "--precision=fp32"])


def sample_packs(recipe, rows: list[dict[str, Any]], s: LeverSettings) -> list[dict[str, Any]]:
    """`s.packs` packs of the recipe's training rows, packed as training packs them."""
    import random

    from fincheck.train import tree_layout

    packs = tree_layout.pack_by_round(rows, recipe.tree_budget)
    chosen = random.Random(s.seed).sample(packs, min(s.packs, len(packs)))
    return [p.as_row() for p in chosen]


def repack(packs: list[dict[str, Any]], rows: list[dict[str, Any]], budget: int) -> list[dict]:
    """The same pairs packed again with another token budget."""
    from fincheck.train import tree_layout

    by_id = {r["id"]: r for r in rows}
    chosen = [by_id[i] for p in packs for i in p["pair_ids"]]
    return [p.as_row() for p in tree_layout.pack_rows(chosen, budget)]


def build_runner(
    recipe, base_path: str, tokenizer, v: Variant, packs: list[dict], init: dict[str, Any]
) -> Runner:
    """The variant's base + LoRA, as the trainer builds them, and its AdamW. Every adapter
    starts from the same values (`init`, filled by the first variant built): with LoRA in fewer
    layers the seeded init would otherwise draw other values for the layers both have."""
    import torch
    from accelerate.utils import convert_outputs_to_fp32
    from peft import get_peft_model

    from fincheck.train import model as train_model
    from fincheck.train.tree_attention import use_tree_attention

    r = copy.copy(recipe)
    r.torch_dtype, r.bf16, r.lora_last_layers = v.torch_dtype, v.autocast, v.last_layers
    base = train_model.load_base_model(r, base_path, tokenizer)
    use_tree_attention(base)
    torch.manual_seed(recipe.seed)  # the same LoRA init in every variant
    lora = train_model.build_lora_config(r, base)
    peft_model = get_peft_model(base, lora)
    peft_model.train()
    for name, p in peft_model.named_parameters():
        if p.requires_grad:
            p.data.copy_(init.setdefault(name, p.detach().float().clone()))
    if v.autocast:  # what accelerate does to the trainer's model under bf16
        autocast = torch.autocast(device_type="cpu", dtype=torch.bfloat16)
        peft_model.forward = convert_outputs_to_fp32(autocast(peft_model.forward))
    trainable = [p for p in peft_model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        trainable, lr=recipe.learning_rate, weight_decay=recipe.weight_decay
    )
    model = torch.compile(peft_model) if v.compile else peft_model
    return Runner(v, model, optimizer, packs)


def run_step(runner: Runner, k: int, collator, default_threads: int) -> None:
    """Step k of a variant: one pack, forward + backward + AdamW, timed."""
    import torch

    from fincheck.train.tree_attention import tree_forward

    v = runner.variant
    torch.set_num_threads(v.threads or default_threads)
    batch = collator([runner.packs[k]])
    if v.all_logits:
        batch["logit_positions"] = torch.arange(batch["input_ids"].shape[1] - 1)
    start = time.perf_counter()
    loss, _, logits, gold, valid = tree_forward(runner.model, batch)
    loss.backward()
    if k == 0:
        per_token = torch.nn.functional.cross_entropy(
            logits.detach().flatten(0, 1), gold.flatten(), ignore_index=-100, reduction="none"
        )
        runner.first_token_losses = per_token[valid]
        runner.first_grads = {  # a compiled model's names start with _orig_mod.
            n.removeprefix("_orig_mod."): p.grad.detach().float().flatten().clone()
            for n, p in runner.model.named_parameters()
            if p.grad is not None
        }
    runner.optimizer.step()
    runner.optimizer.zero_grad(set_to_none=True)
    runner.seconds.append(time.perf_counter() - start)
    runner.losses.append(round(float(loss.detach()), 5))
    del loss, logits, gold, valid, batch
    gc.collect()


def grad_agreement(a: dict[str, Any], b: dict[str, Any]) -> tuple[float, float] | None:
    """Two runs' gradients over the LoRA parameters both have: their cosine (in fp64: an fp32
    sum over millions of entries drifts past 1), and the share of the nonzero entries whose
    signs agree, which is what AdamW's first step follows (its update is lr x g/|g| per entry,
    so a sign flipped by rounding moves that weight a full lr the other way)."""
    import torch

    names = sorted(set(a) & set(b))
    if not names:
        return None
    x = torch.cat([a[n] for n in names]).double()
    y = torch.cat([b[n] for n in names]).double()
    cosine = float(x @ y / (x.norm() * y.norm()))
    nonzero = (x != 0) | (y != 0)
    signs = float((torch.sign(x) == torch.sign(y))[nonzero].double().mean())
    return cosine, signs


def summarize(runner: Runner, reference: Runner) -> LeverResult:
    timed = runner.seconds[1:]
    tokens = sum(len(p["input_ids"]) for p in runner.packs[1 : len(runner.seconds)])
    pairs = sum(len(p["pair_ids"]) for p in runner.packs[1 : len(runner.seconds)])
    seconds = sum(timed)
    result = LeverResult(
        variant=runner.variant.name,
        steps=len(runner.seconds),
        pairs=pairs,
        tokens=tokens,
        seconds=round(seconds, 4),  # a tiny model's steps take hundredths of a second
        tokens_per_s=round(tokens / seconds, 1) if seconds else 0.0,
        pairs_per_s=round(pairs / seconds, 3) if seconds else 0.0,
        first_step_s=round(runner.seconds[0], 2) if runner.seconds else 0.0,
        step_losses=runner.losses,
        same_packs=runner.variant.pack_tokens is None,
    )
    if result.same_packs and runner.first_token_losses is not None:
        diff = (runner.first_token_losses - reference.first_token_losses).abs()
        result.first_loss = round(float(runner.first_token_losses.mean()), 5)
        result.token_loss_mean_abs_diff = round(float(diff.mean()), 5)
        result.token_loss_max_abs_diff = round(float(diff.max()), 5)
        agreement = grad_agreement(runner.first_grads, reference.first_grads)
        if agreement is not None:
            result.grad_cosine, result.grad_sign_agreement = (round(x, 5) for x in agreement)
    if reference.seconds[1:] and seconds:
        ref_tokens = sum(len(p["input_ids"]) for p in reference.packs[1 : len(reference.seconds)])
        ref_rate = ref_tokens / sum(reference.seconds[1:])
        result.speedup = round(result.tokens_per_s / ref_rate, 2)
    return result


def run_train_levers(s: LeverSettings) -> LeverReport:
    import torch

    from fincheck.models.loading import resolve_model
    from fincheck.tasks.prepared import PreparedFolder
    from fincheck.train import data
    from fincheck.train import model as train_model
    from fincheck.train.recipe import TINY_RANDOM
    from fincheck.train.tree_batches import TreeCollator

    variants = [parse_variant(name) for name in s.variants]
    recipe = load_recipe(s)
    if recipe.model_name_or_path == TINY_RANDOM:
        from tempfile import mkdtemp

        from fincheck.train.tiny_model import save_tiny_base

        base_path = str(save_tiny_base(Path(mkdtemp(prefix="levers-")) / "base"))
    else:
        base_path = resolve_model(recipe.model_name_or_path)
    if not recipe.tree_packing:
        raise FincheckError("the levers are measured on tree packs: the recipe needs tree_packing")
    tokenizer = train_model.load_tokenizer(recipe, base_path)
    folder = PreparedFolder.open(recipe.dataset_dir)
    mixture = data.load_mixture_config(recipe.data_config, folder)
    rows = data.build_training_data(recipe, mixture, tokenizer, folder)[0]
    packs = sample_packs(recipe, rows, s)
    runners, init = [], {}
    for v in variants:
        own = repack(packs, rows, v.pack_tokens) if v.pack_tokens else packs
        runners.append(build_runner(recipe, base_path, tokenizer, v, own, init))
    collator = TreeCollator(tokenizer.pad_token_id)
    threads = torch.get_num_threads()
    report = LeverReport(
        device=wl.device_name(),
        recipe=str(s.recipe),
        model=recipe.model_name_or_path,
        settings={k: str(v) for k, v in asdict(s).items()},
        learning_rate=recipe.learning_rate,
    )
    failed: dict[str, str] = {}  # a variant that fails (out of memory, compilation) stops alone
    for k in range(max(len(r.packs) for r in runners)):
        for runner in runners:
            if k < len(runner.packs) and runner.variant.name not in failed:
                try:
                    run_step(runner, k, collator, threads)
                except Exception as e:  # reported in its row; the other variants go on
                    failed[runner.variant.name] = f"error at step {k + 1}: {e}".splitlines()[0]
        done = [r for r in runners if k < len(r.seconds)]
        print(f"step {k + 1}: " + ", ".join(f"{r.variant.name} {r.seconds[k]:.1f}s" for r in done),
              flush=True)  # fmt: skip
    torch.set_num_threads(threads)
    report.results = [summarize(r, runners[0]) for r in runners]
    for result in report.results:
        result.status = failed.get(result.variant, "ok")
    report.peak_rss_gib = round(wl.peak_rss_bytes() / 2**30, 2)
    return report


def format_levers_report(report: LeverReport) -> str:
    head = (
        f"{report.model} on {report.device}, recipe {report.recipe}, lr {report.learning_rate}; "
        f"peak RSS {report.peak_rss_gib} GiB (all variants together)"
    )
    columns = ("variant", "tokens/s", "pairs/s", "speed-up", "first step s", "first loss",
               "mean |dloss|", "max |dloss|", "grad cos", "grad signs", "step losses")  # fmt: skip
    lines = [head, "", "| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    for r in report.results:
        cells = (r.variant, r.tokens_per_s, r.pairs_per_s, r.speedup, r.first_step_s,
                 r.first_loss, r.token_loss_mean_abs_diff, r.token_loss_max_abs_diff,
                 r.grad_cosine, r.grad_sign_agreement,
                 " ".join(f"{x:.3f}" for x in r.step_losses))  # fmt: skip
        lines.append("| " + " | ".join("-" if c is None else str(c) for c in cells) + " |")
    return "\n".join(lines)
