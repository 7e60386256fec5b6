"""The speed benchmarks run end to end on the CPU with the tiny config (so they cannot rot):
every variant row is printed, figures are positive, and packing agrees with padding."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def table_rows(text: str, first_words: list[str]) -> dict[str, list[str]]:
    rows = {}
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] in first_words:
            rows.setdefault(parts[0], []).append(line)
    return rows


def number(cell: str) -> float:
    return float(cell.rstrip("%").replace(",", ""))


def test_bench_train_tiny_cpu(prepared_dir, tmp_path, capsys):
    bench = load_script("bench_train")
    ran = [
        "padded-sdpa",
        "padded-grouped-sdpa",
        "packed-sdpa",
        "padded-eager",
        "packed-eager",
        "packed-sdpa-gc",
        "packed-sdpa-zero2",
        "packed-sdpa-zero3",
    ]
    out_json = tmp_path / "train.json"
    rc = bench.main([
        "--model", "tiny", "--prepared-dir", str(prepared_dir), "--max-len", "384", "--batch-size", "3",
        "--steps", "2", "--warmup", "1", "--peak-tflops", "0.05",
        "--variants", ",".join([*ran, "packed-flash", "packed-sdpa-liger"]), "--json-out", str(out_json),
    ])  # fmt: skip
    text = capsys.readouterr().out
    assert rc == 0, text
    rows = table_rows(text, [*ran, "packed-flash", "packed-sdpa-liger"])
    for name in ran:
        (line,) = [r for r in rows[name] if r.rstrip().endswith("ok")]
        tokens_s, step_s, mfu_lora, mfu_6n, mem = (number(c) for c in line.split()[1:6])
        assert tokens_s > 0 and step_s > 0 and mfu_lora > 0 and mfu_6n > 0 and mem > 0, line
    assert "skipped" in rows["packed-flash"][-1] and "skipped" in rows["packed-sdpa-liger"][-1]
    record = json.loads(out_json.read_text())
    results = {r["variant"]: r for r in record["results"]}
    # Same init, same examples: padded and packed (sdpa and eager, with or without DeepSpeed)
    # see exactly the same tokens, so the first-step loss agrees in fp32 -- no cross-example attention.
    first = [results[n]["first_loss"] for n in ran if n != "padded-grouped-sdpa"]
    assert max(first) - min(first) < 1e-4, first
    # MFU 6N = 6·N·(tokens/s) / peak, N = 139,264 matmul weights of the tiny model:
    # per layer q 64·64 + k, v 64·32 + o 64·64 + gate, up, down 64·128 = 36,864; x2 + head 1024·64
    for name in ran:
        r = results[name]
        assert r["mfu_6n"] == pytest.approx(6 * 139_264 * r["tokens_per_s"] / 0.05e12, rel=1e-9)
    assert re.search(r"lengths: .*cap 384: n=\d+", text)


def test_bench_eval_tiny_cpu(prepared_dir, tmp_path, capsys):
    bench = load_script("bench_eval")
    out_json = tmp_path / "eval.json"
    rc = bench.main([
        "--model", "tiny", "--prepared-dir", str(prepared_dir), "--limit", "3", "--batch-size", "2",
        "--max-input", "96", "--modes", "naive,batched", "--json-out", str(out_json),
    ])  # fmt: skip
    text = capsys.readouterr().out
    assert rc == 0, text
    rows = table_rows(text, ["final", "qasem", "fhsumbench"])
    for task in ("final", "qasem", "fhsumbench"):
        modes = {line.split()[1]: line.split() for line in rows[task] if len(line.split()) > 5}
        assert set(modes) == {"naive", "batched"}, rows[task]
        for cells in modes.values():
            assert int(cells[2]) == 3 and all(number(c) > 0 for c in cells[5:8]), cells
        assert modes["naive"][3] == modes["batched"][3]  # the same prompt tokens either way
    record = json.loads(out_json.read_text())
    naive = [r for r in record["results"] if r["mode"] == "naive"]
    assert all(r["padded_tokens"] == r["prompt_tokens"] for r in naive)  # batch 1 never pads


def test_bench_eval_times_the_harness_itself(prepared_dir, capsys):
    """Once the eval stage and the tiny tokenizer are installed, the harness mode runs the
    harness's own fit_prompt + generate_batch on real prompts."""
    pytest.importorskip("fincheck.eval.generate", reason="the eval harness is not installed")
    pytest.importorskip("fincheck.train.tiny_model", reason="the tiny tokenizer is not installed")
    bench = load_script("bench_eval")
    rc = bench.main([
        "--model", "tiny", "--prepared-dir", str(prepared_dir), "--tasks", "qasem,fhsumbench",
        "--limit", "2", "--batch-size", "2", "--max-input", "1024", "--modes", "batched,harness",
    ])  # fmt: skip
    text = capsys.readouterr().out
    assert rc == 0, text
    rows = table_rows(text, ["qasem", "fhsumbench"])
    for task in ("qasem", "fhsumbench"):
        (harness,) = [line.split() for line in rows[task] if line.split()[1:2] == ["harness"]]
        assert int(harness[2]) == 2 and number(harness[6]) > 0 and number(harness[7]) > 0, harness


@pytest.mark.parametrize("name", ["bench_train", "bench_eval"])
def test_help_teaches_the_h100_command(name, capsys):
    bench = load_script(name)
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--help"])
    text = capsys.readouterr().out
    assert exit_info.value.code == 0
    assert "--model qwen2.5-1.5b --prepared-dir" in text and "--model tiny" in text
    assert "(default: qwen2.5-1.5b)" in text


def test_regroup_by_length_keeps_the_timed_tokens():
    bench = load_script("bench_train")
    steps = [[5, 1], [9, 2], [3, 8], [4, 7]]  # 1 warmup step, then 3 timed
    assert bench.regroup_by_length(steps, warmup=1) == [[5, 1], [9, 8], [7, 4], [3, 2]]
