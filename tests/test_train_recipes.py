"""Every shipped recipe, data mixture and DeepSpeed config parses; bad recipes fail clearly."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from fincheck.errors import FincheckError
from fincheck.train import machine
from fincheck.train.data import load_mixture_config
from fincheck.train.recipe import (
    SFTRecipe,
    load_recipe,
    read_recipe_values,
    recipe_to_yaml,
)
from fincheck.train.resume import recipe_differences

REPO = Path(__file__).resolve().parents[1]
RECIPES = sorted((REPO / "configs" / "train").glob("*.yaml"))
EXPECTED = {
    "tiny-cpu",
    "smollm2-135m-cpu",
    "smollm2-135m-learn-cpu",
    "qwen2.5-0.5b-cpu",
    "qwen2.5-0.5b-three-tasks-cpu",
    "smollm2-135m-instruct",
    "qwen3-1.7b",
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
    values = read_recipe_values(path)  # a GPU recipe is checked, not built, on a CPU machine
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
        values["per_device_train_batch_size"],
        values["gradient_accumulation_steps"],
    )
    assert per_device * accumulation * processes == total
    load_mixture_config(values["data_config"])
    if values["deepspeed"]:
        json.loads(Path(values["deepspeed"]).read_text())
    assert values["pad_token"] is None or values["pad_token"] not in ("<|im_end|>", "<|eot_id|>")


GPU_RECIPES = [p for p in RECIPES if not p.stem.endswith("-cpu")]


@pytest.mark.parametrize("path", GPU_RECIPES, ids=lambda p: p.stem)
def test_every_gpu_recipe_trains_tree_packs_with_flex_attention(path, monkeypatch):
    """The GPU recipes' default: tree packing with FlexAttention (the chunked SDPA on a CPU),
    batch sizes in packs, and the header gives the global batch in packs and in pairs."""
    monkeypatch.chdir(REPO)
    values = read_recipe_values(path)
    assert values["tree_packing"] and values["attn_implementation"] == "flex_attention"
    assert values["tree_packing_max_tokens"] >= values["max_length"]
    header = "".join(line for line in path.read_text().splitlines(True) if line.startswith("#"))
    packs, pairs = re.search(
        r"= (\d+) packs? per optimizer step, about (\d+) pairs", header
    ).groups()
    assert int(pairs) > int(packs) * 10  # a pack holds a document's pairs, or several documents


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
        FincheckError, match=r"r.yaml: unknown key .lora_rank.*Did you mean .*lora_r"
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


def test_the_recipe_is_trl_native_every_trainer_key_works():
    recipe = load_recipe(None, ["--neftune_noise_alpha=5", "--use_liger_kernel=false"])
    assert recipe.neftune_noise_alpha == 5.0 and recipe.use_liger_kernel is False
    from trl import SFTConfig

    assert isinstance(recipe, SFTConfig)
    with pytest.raises(
        FincheckError, match=r"unknown key 'neftune_alpha'.*Did you mean neftune_noise_alpha"
    ):
        load_recipe(None, ["--neftune_alpha=5"])


def test_cpu_training_arguments(monkeypatch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the CPU adaptation")
    monkeypatch.setattr(machine, "cpu_has_bf16", lambda: False)
    recipe = SFTRecipe()
    assert recipe.use_cpu and not recipe.bf16 and not recipe.fp16  # auto: fp32 without bf16 units
    assert recipe.completion_only_loss is True and recipe.activation_checkpointing is True
    assert recipe.activation_checkpointing_kwargs == {"use_reentrant": False}
    with pytest.raises(FincheckError, match="precision=fp16 needs a GPU"):
        SFTRecipe(precision="fp16")
    monkeypatch.setattr(machine, "cpu_has_bf16", lambda: False)
    with pytest.raises(FincheckError, match="precision=bf16 needs a GPU or a CPU with bf16"):
        SFTRecipe(precision="bf16")
    monkeypatch.setattr(machine, "cpu_has_bf16", lambda: True)
    assert SFTRecipe(precision="bf16").bf16 is True
    assert SFTRecipe().bf16 is True  # auto: bf16 where the CPU has the units


def test_saved_recipe_reloads_to_the_same_recipe(tmp_path):
    recipe = load_recipe(REPO / "configs/train/tiny-cpu.yaml", ["--max_steps=7", "--deepspeed="])
    (tmp_path / "recipe.yaml").write_text(recipe_to_yaml(recipe))
    again = load_recipe(tmp_path / "recipe.yaml")
    assert again.declared == recipe.declared
    assert yaml.safe_load(recipe_to_yaml(recipe))["max_steps"] == 7


def test_resume_guard_ignores_run_length_but_not_the_model():
    old = yaml.safe_load(recipe_to_yaml(SFTRecipe()))
    assert recipe_differences(old, SFTRecipe(max_steps=99, output_dir="elsewhere")) == []
    assert recipe_differences(old, SFTRecipe(lora_r=4)) == ["lora_r: 16 -> 4"]


def test_a_recipe_launched_from_another_directory_finds_the_project_files(tmp_path, monkeypatch):
    from fincheck.train.resume import _must_match

    monkeypatch.chdir(tmp_path)  # not the repository: configs/... do not exist from here
    values = read_recipe_values(REPO / "configs" / "train" / "tiny-cpu.yaml")
    assert values["deepspeed"] == str(REPO / "configs" / "deepspeed" / "zero2.json")
    assert values["data_config"] == str(REPO / "configs" / "data" / "tiny.yaml")
    # ...and a resume from here matches a run started in the repository
    assert _must_match({"deepspeed": values["deepspeed"]}) == _must_match(
        {"deepspeed": "configs/deepspeed/zero2.json"}
    )
    with pytest.raises(FincheckError, match=r"deepspeed config not found: configs/nope\.json"):
        read_recipe_values(
            REPO / "configs" / "train" / "tiny-cpu.yaml", ["--deepspeed=configs/nope.json"]
        )


def test_the_first_deepspeed_cpu_run_says_it_compiles(tmp_path, monkeypatch, capsys):
    from fincheck.train import launch

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("LOCAL_RANK", "0")
    folder = launch.deepspeed_build_pending()
    assert folder is not None and folder.is_relative_to(tmp_path)
    launch.announce_deepspeed_build()
    assert "compiles its CPU communication kernel" in capsys.readouterr().err
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "deepspeed_shm_comm.so").write_bytes(b"")  # built: nothing more to say
    assert launch.deepspeed_build_pending() is None
    launch.announce_deepspeed_build()
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["--tree_packing=true", "--packing=true"], "two ways of packing"),
        (["--tree_packing=true", "--tree_packing_max_tokens=100"], "a pair of max_length"),
        (["--tree_packing=true", "--attn_implementation=flash_attention_2"], "custom mask"),
        (["--load_best_model_at_end=true", "--eval_steps=10"], "needs metric_for_best_model"),
        (
            ["--load_best_model_at_end=true", "--metric_for_best_model=qasem_auc",
             "--dev_figures=[qasem]", "--eval_steps=10", "--save_steps=4"],
            "must be a multiple of save_steps",
        ),
        (["--metric_for_best_model=qasem_auc", "--eval_steps=10"], "not computed by this recipe"),
        (["--metric_for_best_model=qasem_f1", "--dev_figures=[qasem]", "--eval_steps=10"],
         r"name one of \['loss', 'qasem_auc', 'qasem_bacc', 'qasem_auc_cliff', "),
        (["--load_best_model_at_end=true", "--metric_for_best_model=loss", "--eval_steps=10",
          "--save_steps=10", "--save_strategy=epoch"], "save_strategy='epoch'"),
        (["--tree_packing=true", "--label_smoothing_factor=0.1"], "label_smoothing_factor=0.1"),
        (["--tree_packing=true", "--loss_type=dft"], "loss_type='dft'"),
        (["--tree_packing=true", "--use_liger_kernel=true"], "use_liger_kernel=True"),
        (["--dev_figures=[qasem]"], "set eval_steps"),
        (["--dev_figures=[qasem]", "--eval_steps=5", "--dev_figures_limit={final: 9}"],
         "dev_figures does not"),
        (["--dev_figures=[qasm]", "--eval_steps=5"], "unknown task"),
        (["--eval_steps=5", "--eval_max_examples=0"], "eval_max_examples >= 1"),
    ],
)  # fmt: skip
def test_packing_and_evaluation_keys_that_cannot_work_together_fail_clearly(overrides, match):
    with pytest.raises(FincheckError, match=match):
        read_recipe_values(REPO / "configs" / "train" / "tiny-cpu.yaml", overrides)


def test_the_tree_budget_defaults_to_twice_max_length_and_strategy_words_stay_strings():
    recipe = load_recipe(
        REPO / "configs" / "train" / "tiny-cpu.yaml",
        ["--deepspeed=", "--tree_packing=true", "--save_strategy=no", "--max_length=300"],
    )
    assert recipe.tree_budget == 600
    assert recipe.dataset_kwargs["skip_prepare_dataset"]  # TRL must not cut the packs
    assert str(recipe.save_strategy) in ("no", "SaveStrategy.NO")
    assert load_recipe(
        REPO / "configs" / "train" / "smollm2-135m-learn-cpu.yaml", ["--deepspeed="]
    ).final_adapter_from_best


@pytest.mark.parametrize("where", ["yaml", "override"])
def test_a_hub_token_in_a_recipe_is_refused_before_it_is_written_anywhere(where, tmp_path):
    """A recipe is copied into recipe.yaml, every checkpoint and the wandb config: a token given
    as a key would land in all of them."""
    from fincheck.errors import FincheckError

    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "model_name_or_path: tiny\n" + ("hub_token: hf_secret123\n" if where == "yaml" else "")
    )
    overrides = ["--hub_token=hf_secret123"] if where == "override" else []
    with pytest.raises(FincheckError, match="hub_token: a token in a recipe") as error:
        read_recipe_values(recipe, overrides)
    assert "hf_secret123" not in str(error.value)


@pytest.mark.parametrize(
    ("yaml_text", "said"),
    [
        ("per_device_train_batch_size: 0\n", "per_device_train_batch_size: must be at least 1"),
        ("lora_dropout: 1.5\n", "lora_dropout: must be at least 0 and below 1, got 1.5"),
        ("learning_rate: .nan\n", "learning_rate: expected a finite number"),
        ("learning_rate: -1.0e-4\n", "learning_rate: must be above 0"),
        ("learning_rate: 1" + "0" * 400 + "\n", "learning_rate: expected a finite number"),
        # a logger that would write its own files into the run folder by name
        ("report_to: [tensorboard]\n", "report_to[0]: 'tensorboard' is not one of"),
    ],
    ids=["batch", "dropout", "nan", "negative", "too-large-for-a-float", "a-logger"],
)
def test_a_recipe_value_out_of_its_range_names_the_file_and_key(yaml_text, said, tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(yaml_text)
    with pytest.raises(FincheckError, match=re.escape(f"{path}: {said}")):
        load_recipe(path)
    key = yaml_text.split(":")[0]
    with pytest.raises(FincheckError, match=re.escape(f"--{key}") + r"(\[0\])?: "):
        load_recipe(None, [f"--{key}={yaml_text.split(': ')[1].strip()}"])


@pytest.mark.parametrize(
    ("yaml_text", "place"),
    [
        ("model_init_kwargs: {token: abc123}\n", "model_init_kwargs.token"),
        ("model_init_kwargs: {revision: main}\nhub_model_id: hf_abcdefghijklmnopqrstuvwx\n",
         "hub_model_id"),
        # inside a value, and other token shapes
        ("run_name: exp-hf_abcdefghijklmnopqrstuvwx\n", "run_name"),
        ("hub_model_id: me/x:hf_abcdefghijklmnopqrstuvwx\n", "hub_model_id"),
        ("run_name: ghp_abcdefghijklmnopqrstuvwxyz0123456789\n", "run_name"),
        ("report_to: [wandb]\nrun_name: see https://me:abc123@example.org/x\n", "run_name"),
    ],
)  # fmt: skip
def test_a_token_anywhere_in_a_recipe_is_refused_without_echoing_it(yaml_text, place, tmp_path):
    """Not only `hub_token`: a nested key named like a secret, or a value shaped like a hub
    key, would land in recipe.yaml, every checkpoint and the published card."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model_name_or_path: tiny\n" + yaml_text)
    with pytest.raises(FincheckError, match=rf"{re.escape(place)}: a token in a recipe") as error:
        read_recipe_values(recipe)
    assert "abc123" not in str(error.value) and "hf_abcdef" not in str(error.value)


def test_a_dev_sample_of_no_pairs_is_refused(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("eval_steps: 10\ndev_figures: [qasem]\ndev_figures_limit: {qasem: 0}\n")
    with pytest.raises(FincheckError, match=r"dev_figures_limit: qasem=0: a dev sample needs"):
        read_recipe_values(recipe)


@pytest.mark.parametrize(
    ("yaml_text", "said"),
    [
        ("adam_beta2: 1.0\n", "adam_beta2: must be at least 0 and below 1, got 1.0"),
        ("weight_decay: -0.1\n", "weight_decay: must be at least 0"),
        ("seed: -1\n", "seed: must be at least 0"),  # numpy refuses it only deep in training
        ("seed: 4294967296\n", "seed: must be at least 0 and at most 4294967295"),
        ("logging_steps: 0\n", "logging_steps: must be above 0"),
        ("per_device_eval_batch_size: 0\n", "per_device_eval_batch_size: must be at least 1"),
        ("max_grad_norm: .inf\n", "max_grad_norm: expected a finite number"),
        ("ddp_timeout: 0\n", "ddp_timeout: must be above 0"),
    ],
)
def test_transformers_own_keys_are_range_checked_like_fincheck_s(yaml_text, said, tmp_path):
    """The TRL/transformers keys a recipe may set have their ranges declared too: a bad value
    is one line naming the file and key, not an error (or a silent NaN) mid-training."""
    path = tmp_path / "r.yaml"
    path.write_text(yaml_text)
    with pytest.raises(FincheckError, match=re.escape(f"{path}: {said}")):
        load_recipe(path)
    from fincheck.commands.cli import main

    assert main(["train", "--config", str(path)]) == 2  # a usage error, as for a flag
    # the ranges are fincheck's: TRL's own SFTConfig declares its fields as before
    import dataclasses

    from trl import SFTConfig

    assert all("bounds" not in f.metadata for f in dataclasses.fields(SFTConfig))


def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path):
    """Nine lines of aliases of aliases expand to 10^9 values; no recipe needs an alias, so any
    is one line naming the file and line, before anything walks the recipe."""
    lines = ['a0: &a0 ["x"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 10)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    with pytest.raises(FincheckError, match=r"bomb\.yaml:2: not valid YAML: aliases \(\*a0\)"):
        read_recipe_values(bomb)


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("run_name: !!binary aGVsbG8=", r"r\.yaml:2: not valid YAML: the tag !!binary is not"),
        ("run_name: !!timestamp 2024-01-01", r"r\.yaml:2: not valid YAML: the tag !!timestamp"),
        ("report_to: !!set {none}", r"r\.yaml:2: not valid YAML: the tag !!set is not"),
        ("run_name: !custom x", r"r\.yaml:2: not valid YAML: the tag !custom is not"),
    ],
)
def test_a_recipe_holds_only_text_numbers_booleans_null_lists_and_mappings(line, said, tmp_path):
    """The loader constructs an allow-list of YAML types: a `!!binary` run name used to become
    the text "b'hello'" and a `!!set` a Python set, both without a word."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"learning_rate: 1.0e-4\n{line}\n")
    with pytest.raises(FincheckError, match=said):
        read_recipe_values(recipe)


def test_a_date_or_an_equals_sign_in_a_recipe_stays_the_text_written(tmp_path):
    """YAML 1.1 reads `2024-01-01` as a date (whose str() is not always the text written) and
    `=` as a "value" tag no loader constructs; both are plain text here."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text("run_name: 2001-12-14t21:59:43.10-05:00\nhub_model_id: =\n")
    values = read_recipe_values(recipe)
    assert values["run_name"] == "2001-12-14t21:59:43.10-05:00"
    assert values["hub_model_id"] == "="


def test_the_nodes_of_a_launch_compare_the_files_a_recipe_names_by_content(tmp_path, monkeypatch):
    """Each rank's recipe identity digests the data mixture, DeepSpeed config and chat
    template by content: one path holding two mixtures on two nodes differs (both nodes once
    trained, each on its own mixture, and exited 0); one mixture under two paths does not."""
    from fincheck.train.launch import recipe_identity

    def identity(node: Path, mixture: str) -> str:
        monkeypatch.chdir(node)  # each node launched from its own copy of the repository
        return recipe_identity(load_recipe(None, [f"--data_config={mixture}", "--deepspeed="]))

    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    for node, cap in ((node0, 8), (node1, 80)):
        (node / "configs").mkdir(parents=True)
        (node / "configs" / "mix.yaml").write_text(f"max_examples: {{qasem: {cap}}}\n")
    assert identity(node0, "configs/mix.yaml") != identity(node1, "configs/mix.yaml")
    (node1 / "configs" / "mix.yaml").write_text("max_examples: {qasem: 8}\n")
    assert identity(node0, "configs/mix.yaml") == identity(node1, "configs/mix.yaml")
    assert identity(node0, "configs/mix.yaml") == identity(node1, str(node0 / "configs/mix.yaml"))


def test_a_recipe_with_an_inline_deepspeed_mapping_has_an_identity():
    """A DeepSpeed config given inline is a mapping, not a file: the identity every rank
    compares takes it as written (it raised a TypeError in every run that gave one)."""
    from types import SimpleNamespace

    from fincheck.train.launch import recipe_identity

    def identity(stage: int) -> str:
        inline = {"zero_optimization": {"stage": stage}}
        return recipe_identity(SimpleNamespace(declared={"deepspeed": inline}, deepspeed=inline))

    assert identity(2) == identity(2) != identity(3)


@pytest.mark.parametrize("value", [".nan", "1.5", "x", "[3]", "true"])
def test_a_data_config_s_mapping_values_are_checked_like_its_keys(value, tmp_path):
    """A mapping's values are checked against its type as any key's value is (`max_examples`
    maps tasks to integers): a NaN or a word was found only by the slicing in training."""
    mixture = tmp_path / "mix.yaml"
    mixture.write_text(f"max_examples: {{qasem: {value}}}\n")
    with pytest.raises(FincheckError, match=r"max_examples\.qasem: expected an integer"):
        load_mixture_config(mixture)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('{"zero_optimization": {"stage": 2', r"ds\.json:1: not valid JSON"),
        ("[1, 2]", r"ds\.json: expected a JSON object"),
        ('{"zero_optimization": {"stage": 7}}', r"ds\.json: zero_optimization\.stage is 7"),
        ('{"zero_optimization": []}', r"ds\.json: zero_optimization is a list"),
        ('{"zero_optimization": {"stage": 2, "offload_optimizer": "cpu"}}', r"ds\.json: zero_opt"),
        ('{"train_micro_batch_size_per_gpu": "lots"}', r"ds\.json: train_micro_batch_size_per_gpu"),
        # keys that write files of their own outside the run folder, or hold a token
        (
            '{"flops_profiler": {"enabled": true, "output_file": "/tmp/x"}}',
            r"ds\.json: flops_profiler: not read by fincheck's DeepSpeed runs",
        ),
        ('{"csv_monitor": {"enabled": false}, "wandb": {}}', r"ds\.json: csv_monitor, wandb: not"),
        (
            '{"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/"'
            "}}}",
            r"ds\.json: zero_optimization\.offload_param offloads to 'nvme'",
        ),
        (
            '{"optimizer": {"type": "AdamW", "params": {"name": "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"}}}',
            r"ds\.json: optimizer\.params\.name: a token in a DeepSpeed config",
        ),
    ],
)
def test_the_deepspeed_config_a_recipe_names_is_read_before_deepspeed_reads_it(
    text, said, tmp_path
):
    """A DeepSpeed JSON cut short, of another shape or naming no ZeRO stage: one line naming the
    file when the recipe is read, not a traceback from every rank at the trainer's start."""
    config = tmp_path / "ds.json"
    config.write_text(text)
    with pytest.raises(FincheckError, match=said):
        load_recipe(None, [f"--deepspeed={config}"])
    with pytest.raises(FincheckError, match=r"deepspeed \(the recipe's mapping\): zero_opt"):
        load_recipe(None, ["--deepspeed={zero_optimization: {stage: 9}}"])  # given inline


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("weights: {final: 1.0e+300}", r"weights\.final: 1e\+300 is not in \[0, 1000"),
        ("weights: {final: -1}", r"weights\.final: -1\.0 is not in \[0, 1000"),
        ("max_examples: {final: -5}", r"max_examples\.final: -5 is below 0"),
    ],
)
def test_a_data_config_s_weights_and_caps_are_in_range(text, said, tmp_path):
    """A weight repeats a task's pairs (1e300 would exhaust memory, or overflow), a cap keeps at
    most that many: out of range is one line naming the task."""
    mixture = tmp_path / "mix.yaml"
    mixture.write_text(text + "\n")
    with pytest.raises(FincheckError, match=said):
        load_mixture_config(mixture)
