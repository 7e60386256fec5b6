#!/usr/bin/env python
"""Evaluation speed: prefill (prompt tokens/s) and generation (examples/s) per task.

The loop measured is the eval harness's: prompts of the prepared test pairs (system + user with
the generation prompt, their token lengths from --tokenizer or the ~4 chars/token estimate),
greedy decoding, and two ways to feed them:
  naive    one example at a time (batch 1, no padding)
  batched  sorted longest first, --batch-size examples per call, left padding (so every row's
           last prompt token sits at the same column and generation appends in step)
  harness  the eval harness's own functions (fincheck.eval.generate: fit_prompt, generate_batch)
           on the real prompts, rendered by a tokenizer's chat template and trimmed as the
           harness trims; QASem includes its P(Yes) passes. Needs a tokenizer (--tokenizer, or
           the project's tiny one for --model tiny) and the eval stage; otherwise skipped.
naive and batched time a minimal loop on random token ids of the measured lengths (the same
batching as the harness: longest first, left padding, greedy), so they run without any
tokenizer and split prefill from decoding.
Random-init models of real architectures (configs/models/*.json): the speed of a real
checkpoint of that architecture, minus its answers. In naive/batched every example generates
exactly --max-new-tokens (min_new_tokens = max_new_tokens), so a random model that emits EOS
early cannot flatter the figures (the harness mode stops at EOS like the harness; with a 150k
vocabulary a random model practically never emits it). The defaults are tiny (QASem reads one
token, Yes/No; the others a short prefix); raise them to time full outputs.

Figures per task and mode:
  prefill tok/s   real prompt tokens / time of the prompt forward passes alone (the cache is
                  built, only the last position's logits computed, as generate() does)
  ex/s            examples / time of the full generate() calls
  e2e tok/s       real prompt tokens / time of the full generate() calls
The first call of each mode is an untimed warmup.

Examples:
  # the issue's goal (eval prefill >= 50k prompt tokens/s on one H100):
  python scripts/bench_eval.py --model qwen2.5-1.5b --prepared-dir /data/prepared \\
      --limit 256 --batch-size 32 --json-out bench-eval-h100.json
  # full-length outputs as the harness generates them
  python scripts/bench_eval.py --model qwen2.5-1.5b --prepared-dir /data/prepared \\
      --max-new-tokens final=384,qasem=8,fhsumbench=96
  # CPU smoke run (seconds): the tiny config, what CI runs
  python scripts/bench_eval.py --model tiny --limit 4 --batch-size 2 --max-input 128
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import sys
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from fincheck import bench_workload as wl
from fincheck.pairs import TASKS, read_pairs

DEFAULT_NEW_TOKENS = "final=16,qasem=1,fhsumbench=8"
MODES = ("naive", "batched", "harness")


@dataclass
class Result:
    task: str
    mode: str
    examples: int
    prompt_tokens: int
    padded_tokens: int  # what the batches held, pads included
    prefill_tokens_per_s: float | None  # not timed separately in harness mode
    examples_per_s: float
    e2e_prompt_tokens_per_s: float
    max_new_tokens: int
    peak_mem_gib: float | None


def parse_new_tokens(text: str) -> dict[str, int]:
    """'final=16,qasem=1' -> {'final': 16, 'qasem': 1}."""
    out = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        task, _, value = item.partition("=")
        if task not in TASKS or not value.isdigit() or int(value) < 1:
            raise SystemExit(
                f"--max-new-tokens: bad item {item!r} (want TASK=N with TASK in {', '.join(TASKS)})"
            )
        out[task] = int(value)
    return out


def batches_for(mode: str, lengths: list[int], batch_size: int) -> list[list[int]]:
    """Indices per call: one by one (naive), or longest first in groups (batched, as the harness)."""
    if mode == "naive":
        return [[i] for i in range(len(lengths))]
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[s : s + batch_size] for s in range(0, len(order), batch_size)]


def left_padded(prompts: list, rows: list[int], pad_id: int):
    """(input_ids, attention_mask) of the chosen prompts, left-padded to the longest."""
    import torch

    width = max(len(prompts[i]) for i in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for r, i in enumerate(rows):
        n = len(prompts[i])
        ids[r, width - n :] = prompts[i]
        mask[r, width - n :] = 1
    return ids, mask


def time_mode(
    model,
    prompts: list,
    mode: str,
    batch_size: int,
    new_tokens: int,
    pad_id: int,
    device,
    cuda: bool,
):
    """(prefill seconds, generate seconds, padded tokens) over all prompts; first call untimed."""
    import torch

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    calls = batches_for(mode, [len(p) for p in prompts], batch_size)
    tensors = [tuple(t.to(device) for t in left_padded(prompts, rows, pad_id)) for rows in calls]

    def prefill(ids, mask):
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
        )

    def generate(ids, mask):
        model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=pad_id,
        )

    with torch.inference_mode():
        prefill(*tensors[0])  # warmup: kernels, allocator, lazy init
        generate(*tensors[0])
        sync()
        timings = []
        for fn in (prefill, generate):
            start = time.perf_counter()
            for ids, mask in tensors:
                fn(ids, mask)
            sync()
            timings.append(time.perf_counter() - start)
    return timings[0], timings[1], sum(ids.numel() for ids, _ in tensors)


def format_table(results: list[Result], mem_label: str) -> str:
    num = lambda x, f: "-" if x is None else format(x, f)  # noqa: E731
    head = f"{'task':<11} {'mode':<8} {'examples':>8} {'prompt tok':>10} {'pad %':>6} {'prefill tok/s':>13} {'ex/s':>8} {'e2e tok/s':>10} {'new tok':>7} {mem_label:>10}"
    lines = [head, "-" * len(head)]
    for r in results:
        pad = 100 * (1 - r.prompt_tokens / r.padded_tokens)
        lines.append(
            f"{r.task:<11} {r.mode:<8} {r.examples:>8} {r.prompt_tokens:>10,} {pad:>5.1f}% {num(r.prefill_tokens_per_s, ',.0f'):>13} "
            f"{r.examples_per_s:>8.2f} {r.e2e_prompt_tokens_per_s:>10,.0f} {r.max_new_tokens:>7} {num(r.peak_mem_gib, '.2f'):>10}"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    wl.add_workload_arguments(p, split="test", what="prompt")
    p.add_argument("--tasks", default=",".join(TASKS), help="comma list (default: %(default)s)")
    p.add_argument("--limit", type=int, default=64, help="examples per task (default: %(default)s)")
    p.add_argument(
        "--max-input",
        type=int,
        default=2048,
        help="cap on prompt tokens, as the harness trims (default: %(default)s)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=16,
        help="examples per call in batched and harness modes (default: %(default)s)",
    )
    p.add_argument(
        "--max-new-tokens", default=DEFAULT_NEW_TOKENS, help="per task (default: %(default)s)"
    )
    p.add_argument(
        "--modes",
        default=",".join(MODES),
        help="comma list of naive, batched, harness (default: %(default)s)",
    )
    p.add_argument(
        "--attn",
        default="sdpa",
        help="attn_implementation: sdpa, eager, flash_attention_2 (default: %(default)s)",
    )
    p.add_argument("--json-out", type=Path, help="also write the results as JSON here")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def pick(n_total: int, limit: int, seed: int) -> list[int]:
    """A seeded sample of `limit` indices in file order, as the harness's --limit samples
    (prepared files are grouped by sub-dataset, so the first N would be unrepresentative)."""
    if limit >= n_total:
        return list(range(n_total))
    return sorted(random.Random(seed).sample(range(n_total), limit))


def load_tokenizer(args):
    """--tokenizer, or for the tiny model the project's own tiny tokenizer when installed; set up
    as the harness's load_model sets it (left padding, a pad token)."""
    tokenizer = None
    if args.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    elif args.model == "tiny":
        try:
            from fincheck.train.tiny_model import build_tiny_tokenizer
        except ImportError:
            return None
        tokenizer = build_tiny_tokenizer()
    if tokenizer is not None:
        tokenizer.padding_side = "left"
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def harness_functions() -> tuple[tuple | None, str | None]:
    """(fit_prompt, generate_batch) of the eval harness, or None and why not."""
    try:
        from fincheck.eval.generate import fit_prompt, generate_batch
    except ImportError as e:
        return None, f"eval harness not importable ({e})"
    return (fit_prompt, generate_batch), None


def time_harness(
    model, tokenizer, pairs, task: str, batch_size: int, new_tokens: int, max_input: int, cuda: bool
):
    """The harness's own loop: fit_prompt (chat template + grounding trim), longest first,
    generate_batch (greedy; QASem adds its P(Yes) passes). (seconds, prompt tokens, padded tokens)."""
    import torch

    (fit_prompt, generate_batch), _ = harness_functions()
    texts = sorted(
        (fit_prompt(tokenizer, pair, max_input)[0] for pair in pairs), key=len, reverse=True
    )
    lengths = [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    calls = [texts[s : s + batch_size] for s in range(0, len(texts), batch_size)]
    padded = sum(
        len(c) * max(lengths[s : s + batch_size])
        for s, c in zip(range(0, len(texts), batch_size), calls, strict=True)
    )
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    generate_batch(model, tokenizer, calls[0], new_tokens, task == "qasem")  # warmup
    sync()
    start = time.perf_counter()
    for call in calls:
        generate_batch(model, tokenizer, call, new_tokens, task == "qasem")
    sync()
    return time.perf_counter() - start, sum(lengths), padded


def main(argv: list[str] | None = None) -> int:
    import torch
    from transformers import AutoModelForCausalLM

    args = parse_args(argv)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if bad := [t for t in tasks if t not in TASKS] + [m for m in modes if m not in MODES]:
        raise SystemExit(
            f"unknown tasks/modes {bad}; tasks: {', '.join(TASKS)}; modes: {', '.join(MODES)}"
        )
    new_tokens = {**parse_new_tokens(DEFAULT_NEW_TOKENS), **parse_new_tokens(args.max_new_tokens)}
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    device_name = (
        torch.cuda.get_device_name()
        if cuda
        else f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    )

    tokenizer = load_tokenizer(args)
    pairs: dict[str, list] = {}
    if args.prepared_dir:
        # Lengths from an explicit --tokenizer only: the tiny one (1,024 entries) would inflate them.
        length_tokenizer = tokenizer if args.tokenizer else None
        per_task = wl.prepared_lengths(
            args.prepared_dir, args.split, tasks, tokenizer=length_tokenizer, prompt_only=True
        )
        for task in tasks:
            keep = pick(len(per_task[task]), args.limit, args.seed)
            per_task[task] = [per_task[task][i] for i in keep]
            all_pairs = list(read_pairs(args.prepared_dir / task / f"{args.split}.jsonl"))
            pairs[task] = [all_pairs[i] for i in keep]
        how = "tokenizer" if length_tokenizer is not None else f"~{wl.CHARS_PER_TOKEN} chars/token"
        source = f"{args.prepared_dir} ({args.split}, {args.limit} sampled per task; {how})"
    else:
        per_task = {
            t: wl.synthetic_lengths(args.limit, args.max_input, args.seed + k)
            for k, t in enumerate(tasks)
        }
        source = "synthetic log-normal"
    per_task = {t: wl.cap_lengths(ls, args.max_input) for t, ls in per_task.items()}
    if "harness" in modes:
        _, why = harness_functions()
        why = why or (None if tokenizer is not None else "needs a tokenizer (--tokenizer PATH)")
        why = why or (None if pairs else "needs --prepared-dir (real prompts)")
        if why:
            print(f"[harness] skipped: {why}")
            modes.remove("harness")

    config = wl.load_model_config(args.model, attn_implementation=args.attn)
    pad_id = config.pad_token_id if config.pad_token_id is not None else 0
    torch.manual_seed(args.seed)
    with device:  # initialise on the GPU directly
        model = AutoModelForCausalLM.from_config(
            config, dtype=torch.bfloat16 if cuda else torch.float32
        ).eval()
    model.generation_config.eos_token_id = config.eos_token_id
    gen = torch.Generator().manual_seed(args.seed)

    print(
        f"device: {device_name}; model {args.model} ({'bf16' if cuda else 'fp32'}, {args.attn}); prompts: {source}, cap {args.max_input}"
    )
    results = []
    for task in tasks:
        prompts = [torch.randint(3, config.vocab_size, (n,), generator=gen) for n in per_task[task]]
        print(f"[{task}] prompt lengths {wl.describe_lengths(per_task[task])}", flush=True)
        for mode in modes:
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            if mode == "harness":
                gen_s, n_tokens, padded = time_harness(
                    model,
                    tokenizer,
                    pairs[task],
                    task,
                    args.batch_size,
                    new_tokens[task],
                    args.max_input,
                    cuda,
                )
                prefill_tps = None
            else:
                prefill_s, gen_s, padded = time_mode(
                    model, prompts, mode, args.batch_size, new_tokens[task], pad_id, device, cuda
                )
                n_tokens = sum(per_task[task])
                prefill_tps = n_tokens / prefill_s
            results.append(
                Result(
                    task=task,
                    mode=mode,
                    examples=len(prompts),
                    prompt_tokens=n_tokens,
                    padded_tokens=padded,
                    prefill_tokens_per_s=prefill_tps,
                    examples_per_s=len(prompts) / gen_s,
                    e2e_prompt_tokens_per_s=n_tokens / gen_s,
                    max_new_tokens=new_tokens[task],
                    peak_mem_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
                )
            )
        gc.collect()

    print()
    print(format_table(results, "peak GiB"))
    print(
        f"batched = longest first, {args.batch_size} per call, left padding; prefill tok/s and e2e tok/s count real prompt tokens only."
    )
    if "harness" in modes:
        print(
            "harness = fincheck.eval.generate.generate_batch on the real prompts (QASem includes its P(Yes) passes)."
        )
    if args.json_out:
        record = {
            "script": "bench_eval",
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(
                [Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]
            ),
            "device": device_name,
            "torch": torch.__version__,
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "results": [asdict(r) for r in results],
        }
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
