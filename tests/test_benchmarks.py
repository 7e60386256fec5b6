"""The speed benchmarks run end to end on the CPU with the tiny model (so they cannot rot), and
each is checked for what it promises: the modes of the eval path give the same answers and the
speed-up they report; the levers train the same thing (their losses agree), and
their rates are what their own counts over their own seconds say. The scripts are thin command
lines over the library."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from fincheck.errors import FincheckError

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("name", "shows"), [("bench_train", "--recipe configs/train/"),
                                            ("bench_eval", "--limit 100")])  # fmt: skip
def test_help_teaches_the_benchmark(name, shows, capsys):
    bench = load_script(name)
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--help"])
    assert exit_info.value.code == 0 and shows in capsys.readouterr().out


def test_bench_eval_paths_times_the_eval_path_in_every_mode(small_prepared, tmp_path, capsys):
    """A real-model run (here the tiny base folder): the same examples in every mode, p_yes of
    batched and prefix-reuse equal to naive's, the speed-up against naive reported."""
    from fincheck.train.tiny_model import save_tiny_base

    base = save_tiny_base(tmp_path / "base")
    bench = load_script("bench_eval")
    out = tmp_path / "paths.json"
    argv = ["--model", str(base), "--prepared-dir", str(small_prepared), "--tasks", "qasem,final",
            "--limit", "qasem=4,final=2", "--window", "512", "--batch-size", "4",
            "--scratch", str(tmp_path / "scratch"), "--json-out", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    results = json.loads(out.read_text())["results"]
    by = {(r["task"], r["mode"]): r for r in results}
    modes = ("naive", "batched", "prefix-reuse")
    assert set(by) == {(task, m) for task in ("qasem", "final") for m in modes}
    assert by["qasem", "naive"]["examples"] == by["qasem", "prefix-reuse"]["examples"] == 4
    assert by["qasem", "prefix-reuse"]["max_abs_delta_p_yes"] < 1e-4
    assert by["qasem", "batched"]["max_abs_delta_p_yes"] < 1e-4
    for task, mode in (("final", "batched"), ("qasem", "prefix-reuse")):  # against naive's time
        naive_s, mode_s = by[task, "naive"]["seconds"], by[task, mode]["seconds"]
        assert by[task, mode]["speedup"] == pytest.approx(naive_s / mode_s)
    assert by["final", "naive"]["speedup"] is None  # the reference has none
    assert by["final", "prefix-reuse"]["same_output_share"] == 1.0
    # the 4 QAs over 2 documents: each document (and the instructions) runs once
    naive, reused = by["qasem", "naive"], by["qasem", "prefix-reuse"]
    assert naive["tokens_run"] == naive["prompt_tokens"] > 2 * reused["tokens_run"]
    assert "| qasem | prefix-reuse | 4 |" in capsys.readouterr().out


def test_the_gpu_check_runs_its_stages_and_reads_their_figures(small_prepared, tmp_path):
    """scripts/gpu_check.py at toy sizes (`--smoke`: the tiny model, on a CPU the chunked SDPA):
    every stage runs, and the table's figures come from the training runs' per-step logs, tree
    packed and unpacked alike, so the command a lent GPU runs cannot rot."""
    check = load_script("gpu_check")
    out = tmp_path / "check"
    argv = ["--prepared", str(small_prepared), "--out", str(out), "--smoke", "--steps", "3",
            "--stages", "exact,train,train-unpacked"]  # fmt: skip
    assert check.main(argv) == 0
    record = json.loads((out / "gpu-check.json").read_text())
    stages = {r["stage"]: r for r in record["stages"]}
    assert list(stages) == ["exact", "train", "train-unpacked"]
    assert all(r["rc"] == 0 for r in stages.values())
    for name in ("train", "train-unpacked"):
        figures = stages[name]["figures"]
        assert figures["steps"] == 3 and figures["first_steps_s"] > 0 and "last_loss" in figures
        assert (out / "logs" / f"{name}.log").is_file()
    logs = {
        name: (out / "logs" / f"{name}.log").read_text() for name in ("train", "train-unpacked")
    }
    assert '"tree_packing": {' in logs["train"] and '"tree_packing"' not in logs["train-unpacked"]
    with pytest.raises(SystemExit):
        check.main(["--prepared", str(small_prepared), "--stages", "nonsense"])


def test_bench_train_levers_runs_a_recipes_variants_on_the_same_packs(small_prepared, tmp_path):
    """`--recipe`: every variant trains the recipe's own packs; on the first pack (the same
    function everywhere) the levers that change no arithmetic give the reference's per-token
    losses, bf16 gives them within its rounding, and LoRA in fewer layers or packs of another
    size train something else, which the report says."""
    from bench.train_levers import LeverSettings, parse_variant, run_train_levers

    settings = LeverSettings(
        recipe=REPO / "configs" / "train" / "qwen2.5-0.5b-cpu.yaml",
        set=["model_name_or_path=tiny-random", f"dataset_dir={small_prepared}",
             "max_length=512", "tree_packing_max_tokens=1024"],
        variants=["fp32", "fp32+threads1", "fp32+all-logits", "bf16", "fp32+last1", "fp32+pack512"],
        packs=2,
    )  # fmt: skip
    report = run_train_levers(settings)
    rows = {r.variant: r for r in report.results}
    assert all(r.status == "ok" for r in report.results)
    ref = rows["fp32"]
    assert ref.speedup == 1.0 and ref.token_loss_max_abs_diff == 0.0 and ref.grad_cosine == 1.0
    assert (
        ref.steps == 2
        and ref.tokens > 0
        and ref.tokens_per_s == pytest.approx(ref.tokens / ref.seconds, rel=0.02)
    )
    for same in ("fp32+threads1", "fp32+all-logits"):  # other kernels' summation order only
        assert rows[same].token_loss_max_abs_diff < 1e-4 and rows[same].grad_cosine > 0.9999
        assert rows[same].step_losses == pytest.approx(ref.step_losses, abs=1e-3)
    bf16 = rows["bf16"]  # 8 mantissa bits: close, not equal
    assert 0 < bf16.token_loss_mean_abs_diff < 0.05 and bf16.grad_cosine > 0.99
    assert 0.5 < bf16.grad_sign_agreement <= 1.0
    last = rows["fp32+last1"]  # the same function at first, another set of adapters trained
    assert last.token_loss_max_abs_diff < 1e-4 and last.step_losses[1] != pytest.approx(
        ref.step_losses[1], abs=1e-6
    )
    repacked = rows["fp32+pack512"]
    assert not repacked.same_packs and repacked.first_loss is None
    assert repacked.steps > ref.steps  # smaller packs: the same pairs in more of them
    with pytest.raises(FincheckError, match="unknown modifier 'fast'"):
        parse_variant("bf16+fast")
    with pytest.raises(FincheckError, match="precision is one of"):
        parse_variant("fp8")
    v = parse_variant("bf16+last12+threads1+compile")
    assert (v.torch_dtype, v.autocast, v.last_layers, v.threads, v.compile) == (
        "bf16",
        True,
        12,
        1,
        True,
    )
