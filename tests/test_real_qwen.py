"""The recipe users launch on GPUs, `configs/train/qwen2.5-0.5b-instruct.yaml`, on real Qwen2.5
weights (Qwen2.5-Coder-0.5B-Instruct: the recipe base's architecture, tokenizer and chat
template), with only what a CPU cannot run replaced: one training step, the adapter saved and
named after the hub model, then `fincheck eval` and `fincheck detect` on it.

Replaced for the CPU (the recipe's value -> here): precision bf16 -> fp32, torch_dtype bfloat16
-> fp32 (fp32 measured faster on these CPUs), deepspeed zero2 -> none (one process; the
2-process ZeRO path is the distributed tier's), report_to wandb -> none, max_length 4096 ->
512 and tree packs of 8,192 -> 1,024 tokens, eval every 20 steps -> none; FlexAttention falls
back by itself to the chunked SDPA tree attention (it has no backward on the CPU). Tree packing,
one pack per step, no gradient checkpointing, LoRA r=16 on all linear layers, lr and schedule
stay as the recipe says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fincheck.commands.cli import main

pytestmark = [pytest.mark.real_weights, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "configs" / "train" / "qwen2.5-0.5b-instruct.yaml"
CPU = ["--precision=fp32", "--torch_dtype=fp32", "--deepspeed=", "--report_to=none",
       "--max_length=512", "--tree_packing_max_tokens=1024", "--eval_steps=0",
       "--eval_max_examples=0", "--max_steps=1", "--save_steps=100"]  # fmt: skip


@pytest.fixture(scope="module")
def qwen_run(small_prepared, tmp_path_factory) -> Path:
    from conftest import fetched

    from fincheck.train.sft import build_trainer, load_training_recipe, train_and_save

    base = fetched("qwen2.5-coder-0.5b-instruct")
    out = tmp_path_factory.mktemp("qwen") / "run"
    mp = pytest.MonkeyPatch()
    mp.chdir(REPO)
    recipe = load_training_recipe(
        RECIPE,
        [f"--model_name_or_path={base}", f"--dataset_dir={small_prepared}", f"--output_dir={out}",
         *CPU],
    )  # fmt: skip
    assert recipe.tree_packing and recipe.lora_r == 16 and not recipe.gradient_checkpointing
    assert recipe.attn_implementation == "sdpa" and "flex_attention" in recipe.attention_note
    assert train_and_save(build_trainer(recipe)) == 0
    mp.undo()
    return out


def test_the_recipe_trains_an_adapter_named_after_the_hub_model(qwen_run):
    meta = json.loads((qwen_run / "fincheck_run.json").read_text())
    assert meta["base_model_id"] == "Qwen/Qwen2.5-Coder-0.5B-Instruct"
    assert meta["data"]["train_examples"] == {"final": 2, "qasem": 4, "fhsumbench": 4}
    assert meta["attn_implementation"] == "fincheck_tree_sdpa"
    assert meta["data"]["tree_packing"]["train"]["pairs"] == 10
    adapter = json.loads((qwen_run / "adapter_config.json").read_text())
    assert adapter["r"] == 16 and "q_proj" in adapter["target_modules"]
    assert (qwen_run / "adapter_model.safetensors").stat().st_size > 1_000_000


def test_eval_and_detect_run_on_the_qwen_adapter(qwen_run, small_prepared, tmp_path, capsys):
    out = tmp_path / "eval"
    args = ["eval", "--adapter", str(qwen_run), "--data", str(small_prepared), "--out", str(out),
            "--limit", "1", "--max-new-tokens", "final=16,fhsumbench=24", "--device", "cpu",
            "--no-progress"]  # fmt: skip
    assert main(args) == 0
    config = json.loads((out / "predictions" / "eval_config.json").read_text())
    assert config["window"] == 512  # the adapter's training length
    for task in ("final", "qasem", "fhsumbench"):
        assert len((out / "predictions" / f"{task}.jsonl").read_text().splitlines()) >= 1
    qasem = json.loads((out / "predictions" / "qasem.jsonl").read_text().splitlines()[0])
    assert 0.0 <= qasem["p_yes"] <= 1.0  # P(Yes) from the Qwen tokenizer's Yes/No tokens
    (tmp_path / "text.txt").write_text("The bridge opened in 1990 after four years of work.")
    (tmp_path / "summary.txt").write_text("The bridge opened in 1991.")
    capsys.readouterr()
    assert main(["detect", "--adapter", str(qwen_run), "--text", str(tmp_path / "text.txt"),
                 "--summary", str(tmp_path / "summary.txt"), "--device", "cpu"]) == 0  # fmt: skip
    assert {"descriptions", "label"} <= set(json.loads(capsys.readouterr().out))
