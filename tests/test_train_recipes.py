"""Every shipped recipe, data mixture and DeepSpeed config parses; bad recipes fail clearly."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fincheck.config import config_to_dict
from fincheck.errors import FincheckError
from fincheck.train.data import load_mixture_config
from fincheck.train.recipe import (
    SFTRecipe,
    build_sft_config,
    load_recipe,
    recipe_differences,
    recipe_paths,
)

REPO = Path(__file__).resolve().parents[1]
RECIPES = recipe_paths(REPO / "configs" / "train")
EXPECTED = {
    "tiny-cpu",
    "qwen2.5-0.5b-instruct",
    "qwen2.5-1.5b-instruct",
    "qwen2.5-7b-instruct",
    "llama-3.2-1b-instruct",
    "llama-3.2-3b-instruct",
}


def test_the_documented_recipes_are_shipped():
    assert {p.stem for p in RECIPES} == EXPECTED


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_parses_and_documents_its_launch(path, monkeypatch):
    monkeypatch.chdir(REPO)  # recipes name configs/... relative to the repo root
    recipe = load_recipe(path)
    header = "".join(line for line in path.read_text().splitlines(True) if line.startswith("#"))
    assert re.search(
        r"(deepspeed|torchrun|accelerate launch|fincheck train) .*--config configs/train/"
        + re.escape(path.name),
        header,
    )
    # The header's global batch arithmetic matches the recipe's own numbers.
    match = re.search(r"= (\d+) x (\d+) x (\d+) = (\d+)", header)
    assert match, "header must spell out per_device x accumulation x processes = global batch"
    per_device, accumulation, processes, total = map(int, match.groups())
    assert (per_device, accumulation) == (
        recipe.per_device_train_batch_size,
        recipe.gradient_accumulation_steps,
    )
    assert per_device * accumulation * processes == total
    load_mixture_config(recipe.data_config)
    if recipe.deepspeed:
        json.loads(Path(recipe.deepspeed).read_text())
    assert recipe.pad_token is None or recipe.pad_token not in ("<|im_end|>", "<|eot_id|>")


@pytest.mark.parametrize(
    "path", sorted((REPO / "configs" / "deepspeed").glob("*.json")), ids=lambda p: p.stem
)
def test_deepspeed_configs_defer_batch_and_precision_to_the_recipe(path):
    config = json.loads(path.read_text())
    assert config["train_micro_batch_size_per_gpu"] == "auto"
    assert config["gradient_accumulation_steps"] == "auto"
    assert config["bf16"]["enabled"] == "auto"
    assert config["zero_optimization"]["stage"] in (2, 3)
    if config["zero_optimization"]["stage"] == 3:
        # Without it a ZeRO-3 save writes empty (partitioned) adapter tensors.
        assert config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
    assert {p.stem for p in path.parent.glob("*.json")} == {"zero2", "zero3", "zero3_offload"}


def test_unknown_key_names_the_key_and_suggests(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("lora_rank: 8\n")
    with pytest.raises(
        FincheckError, match=r"r.yaml: unknown key 'lora_rank'.*Did you mean lora_r"
    ):
        load_recipe(path)


def test_overrides_are_typed():
    recipe = load_recipe(
        None, ["--max_steps=7", "--lora_target_modules=q_proj,v_proj", "--packing=true"]
    )
    assert recipe.max_steps == 7 and recipe.packing is True
    assert recipe.lora_target_modules == ["q_proj", "v_proj"]
    with pytest.raises(FincheckError, match="--max_steps: expected an integer"):
        load_recipe(None, ["--max_steps=many"])


def test_cpu_training_arguments():
    args = build_sft_config(SFTRecipe(), Path("/tmp/x"), gpu=False)
    assert args.use_cpu and not args.bf16 and not args.fp16
    assert args.completion_only_loss is True
    with pytest.raises(FincheckError, match="precision=bf16 needs a GPU"):
        build_sft_config(SFTRecipe(precision="bf16"), Path("/tmp/x"), gpu=False)


def test_resume_guard_ignores_run_length_but_not_the_model():
    old = config_to_dict(SFTRecipe())
    assert recipe_differences(old, SFTRecipe(max_steps=99, output_dir="elsewhere")) == []
    assert recipe_differences(old, SFTRecipe(lora_r=4)) == ["lora_r: 16 -> 4"]
