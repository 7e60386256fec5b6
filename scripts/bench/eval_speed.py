"""Evaluation speed: prefill (prompt tokens/s) and generation (examples/s) per task
(`scripts/bench_eval.py`).

The loop measured is the eval harness's: prompts of the prepared test pairs (system + user with
the generation prompt, their token lengths from a tokenizer or the ~4 chars/token estimate),
greedy decoding, and ways to feed them:
  naive    one example at a time (batch 1, no padding)
  batched  sorted longest first, `batch_size` examples per call, left padding (so every row's
           last prompt token sits at the same column and generation appends in step)
  harness  the eval harness's own functions (`LoadedModel.fit_for_answer`,
           `fincheck.inference.generate_batch`) on the real prompts, rendered by a tokenizer's
           chat template and trimmed as the harness trims; QASem includes its P(Yes) passes.
           Needs a tokenizer (`tokenizer`, or the project's tiny one for model "tiny").
naive and batched time a minimal loop on random token ids of the measured lengths (the same
batching as the harness: longest first, left padding, greedy), so they run without any
tokenizer and split prefill from decoding.
Random-init models of real architectures (configs/models/*.json): the speed of a real
checkpoint of that architecture, minus its answers. In naive/batched every example generates
exactly `max_new_tokens` (min_new_tokens = max_new_tokens), so a random model that emits EOS
early cannot flatter the figures. The defaults are short (QASem reads one token, Yes/No; the
others a short prefix); raise them to time full outputs.

Figures per task and mode:
  prefill tok/s   real prompt tokens / time of the prompt forward passes alone (the cache is
                  built, only the last position's logits computed, as generate() does)
  ex/s            examples / time of the full generate() calls
  e2e tok/s       real prompt tokens / time of the full generate() calls
The first call of each mode is an untimed warmup.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench import workload as wl
from fincheck.config import config_field
from fincheck.eval.options import per_task_budget
from fincheck.pairs import sample_pairs
from fincheck.prepared import read_split
from fincheck.tasks import get_task, task_names

MODES = ("naive", "batched", "harness")
DEFAULT_NEW_TOKENS = per_task_budget("final=16,qasem=1,fhsumbench=8")


@dataclass
class EvalBenchSettings:
    model: str = config_field("qwen2.5-1.5b", wl.MODEL_HELP)
    prepared_dir: Path | None = config_field(None, wl.PREPARED_HELP.format(what="prompt"))
    split: str = config_field("test", "split of --prepared-dir to read")
    tokenizer: str | None = config_field(None, wl.TOKENIZER_HELP)
    tasks: list[str] = config_field(["final", "qasem", "fhsumbench"], "comma list of tasks")
    limit: int = config_field(64, "examples per task (a seeded sample, as --limit of eval)")
    max_input: int = config_field(2048, "cap on prompt tokens, as the harness trims")
    batch_size: int = config_field(16, "examples per call in batched and harness modes")
    max_new_tokens: dict[str, int] = config_field(
        DEFAULT_NEW_TOKENS,
        "tokens generated per task: N, or TASK=N,... (the others keep the default)",
        parse=per_task_budget,  # as `fincheck eval --max-new-tokens`
    )
    modes: list[str] = config_field(list(MODES), "comma list of naive, batched, harness")
    attn: str = config_field("sdpa", "attn_implementation: sdpa, eager, flash_attention_2")
    seed: int = config_field(0, "seed of the sample and the random token ids")


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


@dataclass
class EvalBenchReport:
    device: str
    model: str
    dtype: str
    prompts_source: str
    results: list[Result]
    settings: dict
    skipped: dict[str, str] = field(default_factory=dict)  # mode -> why
    date: str = field(default_factory=wl.utc_now)

    def to_json(self, command: str) -> dict:
        import torch

        return {
            "script": "bench_eval",
            "date": self.date,
            "command": command,
            "device": self.device,
            "torch": torch.__version__,
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in self.settings.items()},
            "skipped": self.skipped,
            "results": [asdict(r) for r in self.results],
        }


def batches_for(mode: str, lengths: list[int], batch_size: int) -> list[list[int]]:
    """Indices per call: one by one (naive), or longest first in groups (batched, as the harness)."""
    if mode == "naive":
        return [[i] for i in range(len(lengths))]
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[s : s + batch_size] for s in range(0, len(order), batch_size)]


def left_padded(prompts: list, rows: list[int], pad_id: int):
    """(input_ids, attention_mask) of the chosen prompts, left-padded to the longest."""
    import torch
    from trl.trainer.utils import pad

    ids = pad([torch.as_tensor(prompts[i], dtype=torch.long) for i in rows], pad_id, "left")
    mask = pad([torch.ones(len(prompts[i]), dtype=torch.long) for i in rows], 0, "left")
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


def load_tokenizer(s: EvalBenchSettings):
    """The tokenizer named, or for the tiny model the project's own tiny tokenizer; set up as
    the harness sets it (left padding, a pad token)."""
    tokenizer = None
    if s.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(s.tokenizer)
    elif s.model == "tiny":
        from fincheck.train.tiny_model import build_tiny_tokenizer

        tokenizer = build_tiny_tokenizer()
    if tokenizer is not None:
        tokenizer.padding_side = "left"
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def time_harness(
    model, tokenizer, pairs, task: str, batch_size: int, new_tokens: int, max_input: int, cuda: bool
):
    """The harness's own loop: fit_for_answer (chat template + grounding trim), longest first,
    generate_batch (greedy; QASem adds its P(Yes) passes). (seconds, prompt tokens, padded tokens)."""
    import torch

    from fincheck.inference import LoadedModel, count_tokens, generate_batch

    fitter = LoadedModel(model, tokenizer, "bench")
    fits = (
        fitter.fit_for_answer(
            pair.prompt_messages, pair.meta.get("grounding_span"), new_tokens, max_input
        )
        for pair in pairs
    )
    texts = sorted((fit.text for fit in fits), key=len, reverse=True)
    lengths = [count_tokens(tokenizer, t) for t in texts]
    calls = [texts[s : s + batch_size] for s in range(0, len(texts), batch_size)]
    call_lengths = [lengths[s : s + batch_size] for s in range(0, len(texts), batch_size)]
    padded = sum(len(c) * max(c) for c in call_lengths)  # each call padded to its longest
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    generate_batch(model, tokenizer, calls[0], new_tokens, get_task(task).reads_p_yes)  # warmup
    sync()
    start = time.perf_counter()
    for call in calls:
        generate_batch(model, tokenizer, call, new_tokens, get_task(task).reads_p_yes)
    sync()
    return time.perf_counter() - start, sum(lengths), padded


def run_eval_bench(
    s: EvalBenchSettings, log: Callable[[str], None] = lambda line: print(line, flush=True)
) -> EvalBenchReport:
    """Time every selected mode on every selected task; return what was measured."""
    import torch
    from transformers import AutoModelForCausalLM

    tasks, modes = list(s.tasks), list(s.modes)
    if bad := [t for t in tasks if t not in task_names()] + [m for m in modes if m not in MODES]:
        raise ValueError(
            f"unknown tasks/modes {bad}; tasks: {', '.join(task_names())}; modes: {', '.join(MODES)}"
        )
    new_tokens = {**DEFAULT_NEW_TOKENS, **s.max_new_tokens}
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    device_name = wl.device_name()
    tokenizer = load_tokenizer(s)
    pairs: dict[str, list] = {}
    if s.prepared_dir:
        # Lengths from an explicit tokenizer only: the tiny one (1,024 entries) would inflate them.
        length_tokenizer = tokenizer if s.tokenizer else None
        per_task = wl.prepared_lengths(
            s.prepared_dir, s.split, tasks, tokenizer=length_tokenizer, prompt_only=True
        )
        for task in tasks:
            keep = sample_pairs(range(len(per_task[task])), s.limit, s.seed)  # as eval --limit
            per_task[task] = [per_task[task][i] for i in keep]
            all_pairs = read_split(s.prepared_dir, task, s.split)
            pairs[task] = [all_pairs[i] for i in keep]
        how = "tokenizer" if length_tokenizer is not None else f"~{wl.CHARS_PER_TOKEN} chars/token"
        source = f"{s.prepared_dir} ({s.split}, {s.limit} sampled per task; {how})"
    else:
        per_task = {
            t: wl.synthetic_lengths(s.limit, s.max_input, s.seed + k) for k, t in enumerate(tasks)
        }
        source = "synthetic log-normal"
    per_task = {t: wl.cap_lengths(ls, s.max_input) for t, ls in per_task.items()}
    skipped = {}
    if "harness" in modes:
        why = None if tokenizer is not None else "needs a tokenizer (--tokenizer PATH)"
        why = why or (None if pairs else "needs --prepared-dir (real prompts)")
        if why:
            skipped["harness"] = why
            log(f"[harness] skipped: {why}")
            modes.remove("harness")

    config = wl.load_model_config(s.model, attn_implementation=s.attn)
    pad_id = config.pad_token_id if config.pad_token_id is not None else 0
    torch.manual_seed(s.seed)
    with device:  # initialise on the GPU directly
        model = AutoModelForCausalLM.from_config(
            config, dtype=torch.bfloat16 if cuda else torch.float32
        ).eval()
    model.generation_config.eos_token_id = config.eos_token_id
    gen = torch.Generator().manual_seed(s.seed)
    log(f"device: {device_name}; model {s.model}; prompts: {source}, cap {s.max_input}")
    results = []
    for task in tasks:
        prompts = [torch.randint(3, config.vocab_size, (n,), generator=gen) for n in per_task[task]]
        log(f"[{task}] prompt lengths {wl.describe_lengths(per_task[task])}")
        for mode in modes:
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            if mode == "harness":
                gen_s, n_tokens, padded = time_harness(
                    model,
                    tokenizer,
                    pairs[task],
                    task,
                    s.batch_size,
                    new_tokens[task],
                    s.max_input,
                    cuda,
                )
                prefill_tps = None
            else:
                prefill_s, gen_s, padded = time_mode(
                    model, prompts, mode, s.batch_size, new_tokens[task], pad_id, device, cuda
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
    return EvalBenchReport(
        device=device_name,
        model=s.model,
        dtype="bf16" if cuda else "fp32",
        prompts_source=source,
        results=results,
        settings=asdict(s),
        skipped=skipped,
    )


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


def format_eval_report(report: EvalBenchReport) -> str:
    lines = [
        f"device: {report.device}; model {report.model} ({report.dtype}); "
        f"prompts: {report.prompts_source}",
        "",
        format_table(report.results, "peak GiB"),
        f"batched = longest first, {report.settings['batch_size']} per call, left padding; "
        "prefill tok/s and e2e tok/s count real prompt tokens only.",
    ]
    if any(r.mode == "harness" for r in report.results):
        lines.append(
            "harness = fincheck.inference.generate_batch on the real prompts (QASem includes its "
            "P(Yes) passes)."
        )
    return "\n".join(lines)
