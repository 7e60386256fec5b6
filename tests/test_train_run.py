"""Real (tiny, one-process) training runs: outputs, save -> load, resume guards, NaN stop,
packing, wandb offline, SIGTERM."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fincheck.errors import FincheckError
from fincheck.io.runs import TRAINING_OUTPUT_MARK, load_run
from fincheck.models.loading import load_adapter_model
from fincheck.train.checkpoints import COMPLETE_MARKER, FINAL_SAVE, last_complete_checkpoint
from fincheck.train.resume import resolve_resume

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "configs" / "train" / "tiny-cpu.yaml"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def small_mixture(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("mix") / "mix.yaml"
    path.write_text("max_examples: {final: 8, qasem: 8, fhsumbench: 8}\nmin_grounding_kept: 0.0\n")
    return path


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(REPO)


def load_recipe(*args):
    """The recipe as `fincheck train` loads it: its output folder claimed, a tiny base built."""
    from fincheck.train.sft import load_training_recipe

    return load_training_recipe(*args)


def build_trainer(recipe):
    from fincheck.train.sft import build_trainer

    return build_trainer(recipe)


def train_and_save(run) -> int:
    from fincheck.train.sft import train_and_save

    return train_and_save(run)


def tiny_recipe(prepared_dir: Path, mixture: Path, out: Path, *extra: str):
    return load_recipe(
        TINY,
        [
            f"--dataset_dir={prepared_dir}",
            f"--data_config={mixture}",
            f"--output_dir={out}",
            "--deepspeed=",
            "--per_device_train_batch_size=2",
            *extra,
        ],
    )


@pytest.fixture(scope="module")
def finished(prepared_dir, small_mixture, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "tiny"
    mp = pytest.MonkeyPatch()
    mp.chdir(REPO)
    run = build_trainer(
        tiny_recipe(prepared_dir, small_mixture, out, "--max_steps=6", "--save_steps=3")
    )
    assert train_and_save(run) == 0
    mp.undo()
    return run


def test_final_folder_holds_adapter_tokenizer_recipe_manifest_and_base(finished, prepared_dir):
    out = finished.output_dir
    for name in (
        "adapter_model.safetensors",
        "adapter_config.json",
        "tokenizer.json",
        "chat_template.jinja",
        "recipe.yaml",
        "data_manifest.json",
        "fincheck_run.json",
        "base/config.json",
    ):
        assert (out / name).is_file(), name
    manifest = json.loads((Path(prepared_dir) / "manifest.json").read_text())
    assert (
        json.loads((out / "data_manifest.json").read_text())["fingerprint"]
        == manifest["fingerprint"]
    )
    meta = json.loads((out / "fincheck_run.json").read_text())
    assert meta["base_model"] == "base"
    assert meta["prompt_hashes"] == manifest["prompt_hashes"]
    from fincheck.train.recipe import load_recipe as parse_recipe

    assert parse_recipe(out / "recipe.yaml").max_steps == 6  # the resolved recipe reloads as-is
    assert [p.name for p in sorted(out.glob("checkpoint-*"))] == ["checkpoint-3", "checkpoint-6"]
    assert all((p / COMPLETE_MARKER).is_file() for p in out.glob("checkpoint-*"))
    # no library's template card (a run's card is `fincheck publish`'s)
    assert sorted(out.rglob("README.md")) == []


def test_saved_adapter_reloads_with_identical_logits(finished):
    import torch

    model = finished.trainer.model.eval()
    tok = finished.trainer.processing_class
    ids = tok.apply_chat_template(
        [
            {
                "role": "user",
                "content": "Document: the bank lost money.\nSummary: the bank made a profit.",
            }
        ],
        add_generation_prompt=True,
        return_tensors="pt",
    )["input_ids"]
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        loaded, _ = load_adapter_model(finished.output_dir, dtype=torch.float32)
        got = loaded(input_ids=ids).logits
    assert torch.equal(got, expected)
    # ...and the adapter is not a no-op: the base alone gives other logits.
    with torch.no_grad(), loaded.disable_adapter():
        assert not torch.allclose(loaded(input_ids=ids).logits, expected)


def test_auto_resume_skips_an_incomplete_checkpoint(finished, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(finished.output_dir, copy)
    assert last_complete_checkpoint(copy) == copy / "checkpoint-6"
    (copy / "checkpoint-6" / COMPLETE_MARKER).unlink()  # as if killed while saving step 6
    assert resolve_resume("auto", copy) == copy / "checkpoint-3"
    with pytest.raises(FincheckError, match="incomplete"):
        resolve_resume(str(copy / "checkpoint-6"), copy)
    assert resolve_resume("auto", tmp_path / "fresh") is None  # nothing yet: a fresh start


def test_resume_with_another_recipe_stops_clearly(finished, prepared_dir, small_mixture):
    recipe = tiny_recipe(
        prepared_dir,
        small_mixture,
        finished.output_dir,
        "--resume_from_checkpoint=auto",
        "--lora_r=4",
        "--max_steps=8",
    )
    with pytest.raises(FincheckError, match=r"cannot resume .*checkpoint-6.*lora_r: 8 -> 4"):
        build_trainer(recipe)


def test_resume_after_a_named_file_changed_in_place_stops_clearly(
    finished, prepared_dir, small_mixture, tmp_path
):
    """The mixture (a file the recipe names, as its DeepSpeed config and chat template) edited
    in place keeps its path: the checkpoint's record names it by content, so the resume would
    train its second half on other pairs; it stops in one line naming the file."""
    copy = tmp_path / "copy"
    shutil.copytree(finished.output_dir, copy)
    recorded = json.loads((copy / "checkpoint-6" / COMPLETE_MARKER).read_text())
    assert set(recorded["recipe_files"]) == {"data_config"}
    original = small_mixture.read_text()
    try:
        small_mixture.write_text(original.replace("final: 8", "final: 2"))
        recipe = tiny_recipe(
            prepared_dir, small_mixture, copy, "--resume_from_checkpoint=auto", "--max_steps=8"
        )
        with pytest.raises(
            FincheckError, match=r"cannot resume .*data_config: .*mix\.yaml's content"
        ):
            build_trainer(recipe)
    finally:
        small_mixture.write_text(original)


def test_a_recipe_value_a_library_refuses_mid_setup_is_one_line(
    prepared_dir, small_mixture, tmp_path
):
    """Values only the libraries check, when the trainer builds its scheduler, or a chat
    template file that raises when rendered: one FincheckError naming what failed (the command
    prints it as one line), not a traceback from inside trainer.train() or the data."""
    kwargs = '--lr_scheduler_kwargs={"num_cycles": "x"}'
    scheduler = "--lr_scheduler_type=cosine_with_restarts"
    recipe = tiny_recipe(
        prepared_dir, small_mixture, tmp_path / "a", "--max_steps=2", scheduler, kwargs
    )
    with pytest.raises(FincheckError, match=r"training .*/a: \w+Error: .*resume_from_checkpoint"):
        train_and_save(build_trainer(recipe))
    template = tmp_path / "raises.jinja"
    template.write_text("{{ raise_exception('no system turn here') }}")
    recipe = tiny_recipe(
        prepared_dir, small_mixture, tmp_path / "b", f"--chat_template_path={template}"
    )
    with pytest.raises(FincheckError, match=r"raises\.jinja: its chat template does not render"):
        build_trainer(recipe)


def poison_after_step(step: int):
    """A callback that turns one LoRA weight into NaN at the end of `step`, as a divergence would."""
    import torch
    from transformers import TrainerCallback

    class PoisonAfterStep(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step == step:
                with torch.no_grad():
                    lora_b = next(p for n, p in model.named_parameters() if "lora_B" in n)
                    lora_b.fill_(float("nan"))

    return PoisonAfterStep()


def test_nan_loss_stops_naming_the_step(prepared_dir, small_mixture, tmp_path):
    run = build_trainer(
        tiny_recipe(
            prepared_dir, small_mixture, tmp_path / "nan", "--max_steps=6", "--save_steps=100"
        )
    )
    run.trainer.add_callback(poison_after_step(2))
    from fincheck.train.trainer import NonFiniteLossError

    with pytest.raises(NonFiniteLossError, match="loss is nan at step 3 on rank 0") as info:
        run.trainer.train()
    assert info.value.step == 3
    ids = str(info.value).split("batch of pairs ")[1].split(":")[0].split(", ")
    assert len(ids) == 2  # per_device_train_batch_size=2, every row found
    known = {r for r in run.trainer.pair_ids_by_row.values()}
    assert set(ids) <= known and all(
        i.split("-")[0] in ("final", "defacto", "qasem", "fhsumbench") for i in ids
    )


def test_packed_batch_gives_the_same_per_example_loss(prepared_dir, small_mixture, tmp_path):
    import torch

    run = build_trainer(
        tiny_recipe(prepared_dir, small_mixture, tmp_path / "pack", "--packing=true")
    )
    trainer = run.trainer
    # Padding-free packing: the collator lays the batch's pairs end to end in ONE row, with
    # position_ids restarting at 0 for each pair and no attention mask.
    rows = [trainer.train_dataset[i] for i in range(3)]
    batch = trainer.data_collator(
        [{k: r[k] for k in ("input_ids", "labels", "seq_lengths")} for r in rows]
    )
    assert batch["input_ids"].shape[0] == 1 and "attention_mask" not in batch
    lengths = [len(r["input_ids"]) for r in rows]
    assert batch["input_ids"].shape[1] == sum(lengths)
    assert batch["position_ids"][0].tolist() == [i for n in lengths for i in range(n)]
    model = trainer.model.eval()

    def per_token_loss(input_ids, labels, **kw):
        logits = model(input_ids=input_ids, **kw).logits[0, :-1]
        return torch.nn.functional.cross_entropy(
            logits, labels[0, 1:], ignore_index=-100, reduction="none"
        )

    with torch.no_grad():
        packed = per_token_loss(
            batch["input_ids"], batch["labels"], position_ids=batch["position_ids"]
        )
        start = 0
        for row, length in zip(rows, lengths, strict=True):
            ids = torch.tensor([row["input_ids"]])
            labels = torch.tensor([row["labels"]])
            alone = per_token_loss(ids, labels)
            mask = labels[0, 1:] != -100
            in_pack = packed[start : start + length - 1]
            assert mask.any()
            torch.testing.assert_close(in_pack[mask].mean(), alone[mask].mean(), rtol=0, atol=1e-5)
            start += length


def test_wandb_offline_run_config_has_recipe_fingerprint_hashes_and_no_secrets(
    prepared_dir, small_mixture, tmp_path, monkeypatch, fresh_wandb
):
    secret = "sk-fincheck-test-secret-0123456789"
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    monkeypatch.setenv("FINCHECK_CACHE_DIR", str(tmp_path))  # wandb's files go under it
    (tmp_path / "wb-cwd").mkdir()
    monkeypatch.chdir(tmp_path / "wb-cwd")  # wandb's default folder: the working one
    monkeypatch.setenv("WANDB_API_KEY", secret)
    monkeypatch.setenv("HF_TOKEN", secret)
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = build_trainer(
        tiny_recipe(
            prepared_dir,
            small_mixture,
            tmp_path / "wb",
            "--max_steps=2",
            "--save_steps=100",
            "--report_to=wandb",
        )
    )
    assert train_and_save(run) == 0
    fresh_wandb.finish()
    # The record file is written by wandb's service process; teardown waits for it to exit, so
    # the file is complete (CI once read only its 8-byte header after finish() alone).
    fresh_wandb.teardown()
    # Offline, wandb keeps the run config inside the run's .wandb record file (JSON values).
    records = list(tmp_path.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(records) == 1
    text = records[0].read_bytes().decode("utf-8", errors="replace")
    manifest = json.loads((Path(prepared_dir) / "manifest.json").read_text())
    assert f'"data_fingerprint":"{manifest["fingerprint"]}"' in text
    for prompt_hash in manifest["prompt_hashes"].values():
        assert prompt_hash in text
    assert "model_name_or_path: tiny-random" in text  # the recipe itself
    for path in (tmp_path / "wandb").rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), f"secret leaked into {path}"
    # nothing in the working folder (wandb's default) nor in the run folder
    assert list((tmp_path / "wb-cwd").iterdir()) == []
    assert not [p for p in (tmp_path / "wb").rglob("*") if p.is_symlink()]


def test_sigterm_saves_a_complete_checkpoint_and_exits(prepared_dir, small_mixture, tmp_path):
    out = tmp_path / "term"
    cmd = [
        sys.executable,
        "train/sft.py",
        "--config",
        str(TINY),
        f"--dataset_dir={prepared_dir}",
        f"--data_config={small_mixture}",
        f"--output_dir={out}",
        "--deepspeed=",
        "--max_steps=500",
        "--save_steps=1000",
        "--per_device_train_batch_size=1",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, cwd=REPO, stderr=subprocess.PIPE, text=True, env=env)
    seen = []
    for line in proc.stderr:  # wait for step 2's log line
        seen.append(line)
        if "step 2/500 | loss" in line:
            proc.send_signal(signal.SIGTERM)
            break
    _, rest = proc.communicate(timeout=120)
    assert proc.returncode == 143, "".join(seen[-20:]) + rest
    saved = last_complete_checkpoint(out)
    assert saved is not None and 2 <= int(saved.name.split("-")[1]) < 500
    assert "stopped by SIGTERM" in rest
    state = json.loads((saved / "trainer_state.json").read_text())
    assert state["global_step"] == int(saved.name.split("-")[1])


def test_resume_on_another_base_model_stops_clearly(
    finished, prepared_dir, small_mixture, tmp_path
):
    copy = tmp_path / "copy"
    shutil.copytree(finished.output_dir, copy)
    # Another base in the run folder: same recipe, other weights' config (a wider tiny model).
    config = json.loads((copy / "base" / "config.json").read_text())
    config["intermediate_size"] = 256
    (copy / "base" / "config.json").write_text(json.dumps(config))
    recipe = tiny_recipe(prepared_dir, small_mixture, copy, "--resume_from_checkpoint=auto")
    with pytest.raises(FincheckError, match=r"cannot resume .*checkpoint-6.*base model's files"):
        build_trainer(recipe)
    # the same config.json over other weights (a fine-tune put in place) is another base too
    from safetensors.torch import load_file, save_file

    (copy / "base" / "config.json").write_text(
        (finished.output_dir / "base" / "config.json").read_text()
    )
    weights = load_file(copy / "base" / "model.safetensors")
    save_file({k: v * 1.01 for k, v in weights.items()}, copy / "base" / "model.safetensors")
    with pytest.raises(FincheckError, match=r"cannot resume .*checkpoint-6.*base model's files"):
        build_trainer(recipe)


def test_resuming_a_finished_run_trains_nothing_and_keeps_the_adapter(
    finished, prepared_dir, small_mixture, capsys
):
    out = finished.output_dir
    before = (out / "adapter_model.safetensors").read_bytes()
    recipe = tiny_recipe(
        prepared_dir, small_mixture, out, "--max_steps=6", "--resume_from_checkpoint=auto"
    )
    run = build_trainer(recipe)
    assert train_and_save(run) == 0
    assert (
        "the run is already complete: checkpoint-6 reached step 6 of 6" in capsys.readouterr().err
    )
    assert run.trainer.state.global_step == 0  # train() was never called
    assert (out / "adapter_model.safetensors").read_bytes() == before
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-6"]
    # a kill -9 during the final save: the adapter half-written, the run files not yet, the
    # save's own folder left behind: the resume finishes the save from the last checkpoint, the
    # run record last, and removes that folder
    (out / "adapter_model.safetensors").write_bytes(before[: len(before) // 2])
    for name in ("fincheck_run.json", "recipe.yaml", "data_manifest.json"):
        (out / name).unlink()
    (out / FINAL_SAVE).mkdir()
    (out / FINAL_SAVE / "adapter_model.safetensors").write_bytes(before[:100])
    assert train_and_save(build_trainer(recipe)) == 0
    assert not (out / FINAL_SAVE).exists()
    assert "its adapter copied to" in capsys.readouterr().err
    last = (out / "checkpoint-6" / "adapter_model.safetensors").read_bytes()
    assert (out / "adapter_model.safetensors").read_bytes() == last
    for name in ("fincheck_run.json", "recipe.yaml", "data_manifest.json"):
        assert (out / name).is_file(), name


def test_first_step_learns_and_the_token_count_continues_after_a_resume(
    prepared_dir, small_mixture, tmp_path
):
    out = tmp_path / "warm"
    args = ["--max_steps=4", "--save_steps=2", "--warmup_ratio=0.2", "--lr_scheduler_type=linear"]
    assert train_and_save(build_trainer(tiny_recipe(prepared_dir, small_mixture, out, *args))) == 0
    history = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())["log_history"]
    lr = {e["step"]: e["learning_rate"] for e in history if "learning_rate" in e}
    # warmup of ceil(0.2 * 4) = 1 step: step 1 at half the peak (not 0), then linear decay
    assert lr[1] == pytest.approx(3e-3 / 2) and lr[2] == pytest.approx(3e-3 * 3 / 3)
    tokens = {e["step"]: e["num_tokens"] for e in history if "num_tokens" in e}
    resumed = tmp_path / "resumed"
    shutil.copytree(out, resumed)
    shutil.rmtree(resumed / "checkpoint-4")
    again = tiny_recipe(
        prepared_dir, small_mixture, resumed, *args, "--resume_from_checkpoint=auto"
    )
    assert train_and_save(build_trainer(again)) == 0
    history = json.loads((resumed / "checkpoint-4" / "trainer_state.json").read_text())
    tokens_resumed = {
        e["step"]: e["num_tokens"] for e in history["log_history"] if "num_tokens" in e
    }
    assert tokens_resumed[3] == tokens[3] and tokens_resumed[4] == tokens[4]  # not from 0
    # the run says how often it was restarted: never, then once from step 2, carried by the
    # checkpoints (a second resume would append to the list)
    assert json.loads((out / "fincheck_run.json").read_text())["resumes"] == []
    resumes = json.loads((resumed / "fincheck_run.json").read_text())["resumes"]
    assert [r["from_step"] for r in resumes] == [2]
    marker = json.loads((resumed / "checkpoint-4" / COMPLETE_MARKER).read_text())
    assert [r["from_step"] for r in marker["resumes"]] == [2]


def test_a_fresh_start_on_a_run_folder_stops_and_keeps_the_run(
    finished, prepared_dir, small_mixture
):
    out = finished.output_dir
    before = sorted(p.name for p in out.glob("checkpoint-*"))
    recipe = tiny_recipe(prepared_dir, small_mixture, out, "--max_steps=6")
    with pytest.raises(FincheckError, match=r"already holds a run .*resume_from_checkpoint=auto"):
        build_trainer(recipe)
    assert sorted(p.name for p in out.glob("checkpoint-*")) == before


def test_a_kill_while_saving_keeps_the_last_complete_checkpoint(
    prepared_dir, small_mixture, tmp_path, monkeypatch
):
    """save_total_limit=1: checkpoint-2 may go only once checkpoint-4 is complete."""
    from fincheck.train import callbacks

    real_mark = callbacks.mark_complete

    def killed_at_step_4(checkpoint, info, recipe_yaml):
        if checkpoint.name == "checkpoint-4":
            raise KeyboardInterrupt  # the job is killed before the marker is written
        real_mark(checkpoint, info, recipe_yaml)

    monkeypatch.setattr(callbacks, "mark_complete", killed_at_step_4)
    out = tmp_path / "killed"
    args = ["--max_steps=6", "--save_steps=2", "--save_total_limit=1"]
    with pytest.raises(KeyboardInterrupt):
        train_and_save(build_trainer(tiny_recipe(prepared_dir, small_mixture, out, *args)))
    assert last_complete_checkpoint(out) == out / "checkpoint-2"
    assert resolve_resume("auto", out) == out / "checkpoint-2"
    # The unfinished checkpoint, copied out of its run folder (the run's own mark left behind),
    # is still refused by its own mark, never read as a bare adapter; so is a copy of a
    # complete one that a listing made before its record (the mark is never removed).
    elsewhere = tmp_path / "elsewhere"
    copied = shutil.copytree(out / "checkpoint-4", elsewhere / "checkpoint-4")
    assert (copied / "adapter_model.safetensors").is_file()
    with pytest.raises(FincheckError, match="training checkpoint that did not finish"):
        load_run(copied)
    listed_early = shutil.copytree(
        out / "checkpoint-2", elsewhere / "listed", ignore=shutil.ignore_patterns(COMPLETE_MARKER)
    )
    with pytest.raises(FincheckError, match="did not finish"):
        load_run(listed_early)
    assert (out / "checkpoint-2" / TRAINING_OUTPUT_MARK).is_file()  # kept: the record wins
    load_run(shutil.copytree(out / "checkpoint-2", elsewhere / "checkpoint-2"))


def test_a_final_save_copied_before_its_record_is_refused_wherever_it_goes(
    prepared_dir, small_mixture, tmp_path, monkeypatch
):
    """Killed after the final save's files were moved into the run folder but before its
    record: the run folder, copied without its hidden mark (`cp -r run/* elsewhere`), is still
    a training output without its record, never a bare adapter that detect or publish use."""
    from fincheck.train import checkpoints

    def killed(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoints, "write_run_files", killed)
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        train_and_save(
            build_trainer(tiny_recipe(prepared_dir, small_mixture, out, "--max_steps=2"))
        )
    copy = tmp_path / "copy"
    copy.mkdir()
    for entry in out.iterdir():  # what a shell glob copies: no hidden entries
        if not entry.name.startswith(".") and entry.is_file():
            shutil.copy2(entry, copy / entry.name)
    assert (copy / "adapter_model.safetensors").is_file() and not (copy / ".fincheck-out").exists()
    with pytest.raises(FincheckError, match="training run that did not finish"):
        load_run(copy)


def test_a_resumed_run_continues_the_same_wandb_run(
    prepared_dir, small_mixture, tmp_path, monkeypatch, fresh_wandb
):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in ("WANDB_RUN_ID", "WANDB_RESUME"):  # restored (unset) after the test
        monkeypatch.setenv(name, "x")
        monkeypatch.delenv(name)
    out = tmp_path / "wb"
    args = ["--save_steps=2", "--report_to=wandb"]
    first = tiny_recipe(prepared_dir, small_mixture, out, "--max_steps=2", *args)
    assert train_and_save(build_trainer(first)) == 0
    fresh_wandb.finish()
    fresh_wandb.teardown()
    run_id = (out / "wandb_run_id").read_text()
    again = tiny_recipe(
        prepared_dir, small_mixture, out, "--max_steps=4", "--resume_from_checkpoint=auto", *args
    )
    assert train_and_save(build_trainer(again)) == 0
    fresh_wandb.finish()
    runs = sorted(p.name for p in tmp_path.glob("wandb/offline-run-*"))
    assert len(runs) == 2 and all(name.endswith(f"-{run_id}") for name in runs), runs


def test_a_full_disk_while_saving_names_the_disk_and_the_complete_checkpoint(
    prepared_dir, small_mixture, tmp_path, monkeypatch
):
    import torch

    real_save = torch.save
    calls = {"n": 0}

    def disk_full_on_the_second_checkpoint(obj, f, *a, **k):
        if "checkpoint-4" in str(f):
            raise RuntimeError(
                "[enforce fail at inline_container.cc:664] . unexpected pos 64 vs 0 "
                "basic_ios::clear: iostream error"
            )
        calls["n"] += 1
        return real_save(obj, f, *a, **k)

    monkeypatch.setattr(torch, "save", disk_full_on_the_second_checkpoint)
    out = tmp_path / "full"
    args = ["--max_steps=6", "--save_steps=2"]
    with pytest.raises(FincheckError) as info:
        train_and_save(build_trainer(tiny_recipe(prepared_dir, small_mixture, out, *args)))
    message = str(info.value)
    assert message.startswith("no space left on ") and "while saving at step 4" in message
    assert "checkpoint-2 is still complete" in message and "resume_from_checkpoint=auto" in message
    assert last_complete_checkpoint(out) == out / "checkpoint-2"


def test_a_full_disk_while_the_tokenizer_is_saved_is_one_line(
    prepared_dir, small_mixture, tmp_path, monkeypatch
):
    """The tokenizers library reports a full disk as a plain Exception ("No space left on device
    (os error 28)"): the same one line as any other full disk, naming the complete checkpoint."""
    from transformers import PreTrainedTokenizerBase

    real = PreTrainedTokenizerBase.save_pretrained
    out = tmp_path / "full"

    def full_disk_at_the_end(self, save_directory, *a, **k):
        if Path(save_directory) == out / FINAL_SAVE:  # the run folder's final save
            raise Exception("No space left on device (os error 28)")
        return real(self, save_directory, *a, **k)

    monkeypatch.setattr(PreTrainedTokenizerBase, "save_pretrained", full_disk_at_the_end)
    with pytest.raises(FincheckError) as info:
        train_and_save(
            build_trainer(
                tiny_recipe(prepared_dir, small_mixture, out, "--max_steps=2", "--save_steps=2")
            )
        )
    message = str(info.value)
    assert message.startswith("no space left on ") and "checkpoint-2 is still complete" in message


def test_links_planted_in_the_run_folder_before_the_final_save_are_replaced(
    prepared_dir, small_mixture, tmp_path
):
    """The libraries write the final save into a fresh folder of the run's own, whose files are
    then renamed into the run folder: links planted after the claim at the adapter's and the
    tokenizer's names (which the libraries would open and write through), and one at the save
    folder's, are replaced; what they point at is untouched."""
    from transformers import TrainerCallback

    out, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    names = ("adapter_model.safetensors", "adapter_config.json", "tokenizer_config.json")
    victims = {name: tmp_path / f"victim-{name}" for name in names}
    for victim in victims.values():
        victim.write_text("someone else's file")
    elsewhere.mkdir()

    class PlantLinks(TrainerCallback):
        def on_train_end(self, args, state, control, **kwargs):
            for name, victim in victims.items():
                (out / name).symlink_to(victim)
            (out / FINAL_SAVE).symlink_to(elsewhere, target_is_directory=True)

    run = build_trainer(
        tiny_recipe(prepared_dir, small_mixture, out, "--max_steps=2", "--save_steps=2")
    )
    run.trainer.add_callback(PlantLinks())
    assert train_and_save(run) == 0
    assert {v.read_text() for v in victims.values()} == {"someone else's file"}
    assert list(elsewhere.iterdir()) == []
    for name in names:
        assert (out / name).is_file() and not (out / name).is_symlink()
    assert not (out / FINAL_SAVE).exists()
    assert load_run(out).adapter_config  # every listed file matches its sha256


def test_links_planted_where_a_checkpoint_will_be_saved_are_removed_not_written_through(
    prepared_dir, small_mixture, tmp_path
):
    """Each checkpoint-N is made a fresh folder before transformers and PEFT save into it: a
    link planted at checkpoint-2 (to a folder elsewhere), and links planted inside a leftover
    checkpoint-4 at the names the libraries open, are removed; what they point at is untouched
    and both checkpoints come out complete."""
    from transformers import TrainerCallback

    out, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    names = ("adapter_model.safetensors", "optimizer.pt", "trainer_state.json", "rng_state.pth")
    victims = {name: tmp_path / f"victim-{name}" for name in names}
    for victim in victims.values():
        victim.write_text("someone else's file")
    elsewhere.mkdir()

    class PlantLinks(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            (out / "checkpoint-2").symlink_to(elsewhere, target_is_directory=True)
            (out / "checkpoint-4").mkdir()
            for name, victim in victims.items():
                (out / "checkpoint-4" / name).symlink_to(victim)

    run = build_trainer(
        tiny_recipe(prepared_dir, small_mixture, out, "--max_steps=4", "--save_steps=2")
    )
    run.trainer.add_callback(PlantLinks())
    assert train_and_save(run) == 0
    assert {v.read_text() for v in victims.values()} == {"someone else's file"}
    assert list(elsewhere.iterdir()) == []
    for step in (2, 4):
        checkpoint = out / f"checkpoint-{step}"
        assert checkpoint.is_dir() and not checkpoint.is_symlink()
        assert (checkpoint / COMPLETE_MARKER).is_file()
        assert not any(path.is_symlink() for path in checkpoint.rglob("*"))
    assert last_complete_checkpoint(out) == out / "checkpoint-4"


def test_a_link_made_inside_a_checkpoint_while_it_is_saved_stops_the_run_unmarked(
    prepared_dir, small_mixture, tmp_path, monkeypatch
):
    """Libraries open their files by name: a link made inside checkpoint-N while they save
    (another process racing them) is found before the checkpoint is marked complete. The run
    stops with one line naming it; the checkpoint is never marked, so no resume trusts it."""
    from transformers import Trainer

    out, victim = tmp_path / "run", tmp_path / "victim.pth"
    victim.write_text("someone else's file")
    real_save_rng_state = Trainer._save_rng_state

    def racing(self, output_dir):  # what a racer between two of the libraries' writes does
        (Path(output_dir) / "rng_state.pth").symlink_to(victim)
        return real_save_rng_state(self, output_dir)

    monkeypatch.setattr(Trainer, "_save_rng_state", racing)
    run = build_trainer(
        tiny_recipe(prepared_dir, small_mixture, out, "--max_steps=2", "--save_steps=2")
    )
    with pytest.raises(FincheckError) as caught:
        train_and_save(run)
    message = str(caught.value)
    assert "checkpoint-2/rng_state.pth: a link, made while the checkpoint was saved" in message
    assert "\n" not in message
    assert not (out / "checkpoint-2" / COMPLETE_MARKER).exists()
    assert last_complete_checkpoint(out) is None


def test_a_tree_packed_run_logs_dev_figures_and_keeps_the_best_adapter(prepared_dir, tmp_path):
    """tree_packing + dev_figures + load_best_model_at_end: eval_<task>_<figure> at every
    evaluation, the best checkpoint survives rotation, and the final adapter is its adapter."""
    mixture = tmp_path / "mix.yaml"
    mixture.write_text(
        "tasks: [qasem, fhsumbench]\nmax_examples: {qasem: 30, fhsumbench: 8}\n"
        "whole_documents: true\nmin_grounding_kept: 0.0\n"
    )
    out = tmp_path / "tree"
    recipe_args = (
        "--tree_packing=true",
        "--max_steps=6",
        "--eval_steps=2",
        "--save_steps=2",
        "--save_total_limit=1",
        "--eval_max_examples=6",
        "--dev_figures=[qasem, fhsumbench]",
        "--dev_figures_limit={qasem: 40, fhsumbench: 6}",  # 48 QAs of both labels (seed 0)
        "--metric_for_best_model=qasem_auc",
        "--load_best_model_at_end=true",
        "--lr_scheduler_type=cosine",
        "--warmup_ratio=0.5",
    )
    run = build_trainer(tiny_recipe(prepared_dir, mixture, out, *recipe_args))
    assert train_and_save(run) == 0
    state = json.loads((out / "checkpoint-6" / "trainer_state.json").read_text())
    evals = [e for e in state["log_history"] if "eval_qasem_auc" in e]
    assert [e["step"] for e in evals] == [2, 4, 6]
    assert all({"eval_qasem_bacc", "eval_fhsumbench_f"} <= set(e) for e in evals)
    for e in evals:  # the one figure several tasks are chosen by: each one's choose_by, averaged
        mean = (e["eval_qasem_auc"] + e["eval_fhsumbench_f"]) / 2
        assert e["eval_tasks_mean"] == pytest.approx(mean, abs=1e-4)
    assert [e["step"] for e in state["log_history"] if "eval_loss" in e] == [2, 4, 6]
    best_step = max(evals, key=lambda e: (e["eval_qasem_auc"], -e["step"]))["step"]
    best = out / f"checkpoint-{best_step}"
    assert Path(state["best_model_checkpoint"]).name == best.name and best.is_dir()
    kept = sorted(p.name for p in out.glob("checkpoint-*"))
    assert kept == sorted({best.name, "checkpoint-6"})  # rotation keeps the newest and the best
    final = (out / "adapter_model.safetensors").read_bytes()
    assert final == (best / "adapter_model.safetensors").read_bytes()
    meta = json.loads((out / "fincheck_run.json").read_text())
    assert meta["final_adapter"]["checkpoint"] == best.name
    assert (
        meta["data"]["tree_packing"]["train"]["packs"]
        < meta["data"]["tree_packing"]["train"]["pairs"]
    )
    assert meta["data"]["dev_figures"]["qasem"] >= 20
    # the mixture's tasks, not the prepared folder's three (the card and eval read them)
    assert meta["tasks"] == ["qasem", "fhsumbench"] and load_run(out).tasks == meta["tasks"]
    assert set(meta["prompt_hashes"]) == {"qasem", "fhsumbench"}
    first = next(e for e in state["log_history"] if "loss" in e)
    assert first["step"] == 1 and first["learning_rate"] > 0  # warmup does not start at 0
    later = [e for e in state["log_history"] if "loss" in e and e["step"] > 1]
    assert all(e["pairs_per_second"] > 0 and e["rank_token_spread"] == 0 for e in later)
    assert (out / "tokenizer_config.json").is_file()  # the run folder loads like any other
    load_adapter_model(out)
    # killed after the last checkpoint, before the final save: a resume finishes the run with
    # the best checkpoint's adapter too, not the last one's
    (out / "adapter_model.safetensors").unlink()
    again = build_trainer(
        tiny_recipe(prepared_dir, mixture, out, *recipe_args, "--resume_from_checkpoint=auto")
    )
    assert train_and_save(again) == 0
    assert (out / "adapter_model.safetensors").read_bytes() == final
    meta = json.loads((out / "fincheck_run.json").read_text())
    assert meta["final_adapter"]["checkpoint"] == best.name


def test_a_run_at_the_default_window_records_it_and_is_evaluated_at_it(
    prepared_dir, small_mixture, tmp_path
):
    """max_length equal to the recipe's default (2,048) is still written to recipe.yaml and
    fincheck_run.json, and eval fits prompts to it, not to the model's 4,096 positions."""
    from fincheck.commands.cli import main
    from fincheck.io.runs import DEFAULT_TRAINING_WINDOW
    from fincheck.train.recipe import recipe_defaults

    assert recipe_defaults()["max_length"] == DEFAULT_TRAINING_WINDOW == 2048
    out = tmp_path / "default-window"
    recipe = tiny_recipe(
        prepared_dir, small_mixture, out, "--max_length=2048", "--max_steps=1", "--save_steps=1"
    )
    assert train_and_save(build_trainer(recipe)) == 0
    assert yaml.safe_load((out / "recipe.yaml").read_text())["max_length"] == 2048
    assert json.loads((out / "fincheck_run.json").read_text())["max_length"] == 2048
    args = ["eval", "--adapter", str(out), "--data", str(prepared_dir), "--tasks", "fhsumbench"]
    assert main([*args, "--limit", "1", "--out", str(tmp_path / "ev"), "--no-progress"]) == 0
    config = json.loads((tmp_path / "ev" / "predictions" / "eval_config.json").read_text())
    assert config["window"] == 2048  # the model's positions are 4,096
    # a run folder written before the window was always recorded: its recipe.yaml left the
    # default out, and the window read back is that default
    recipe_yaml = yaml.safe_load((out / "recipe.yaml").read_text())
    del recipe_yaml["max_length"]
    (out / "recipe.yaml").write_text(yaml.safe_dump(recipe_yaml))
    meta = json.loads((out / "fincheck_run.json").read_text())
    del meta["max_length"], meta["files"]  # nor listed its files
    (out / "fincheck_run.json").write_text(json.dumps(meta))
    assert load_run(out).max_length == 2048


def test_the_best_checkpoint_is_found_beside_the_last_one(tmp_path):
    """trainer_state.json records the best checkpoint by the path of the run that wrote it;
    a moved run folder still finds it, and a removed one is a clear error."""
    from fincheck.train.checkpoints import best_checkpoint, finish_from_checkpoint

    run = tmp_path / "moved"
    for step, payload in ((2, b"best"), (6, b"last")):
        (run / f"checkpoint-{step}").mkdir(parents=True)
        (run / f"checkpoint-{step}" / "adapter_model.safetensors").write_bytes(payload)
        (run / f"checkpoint-{step}" / "adapter_config.json").write_text("{}")
    state = {"best_model_checkpoint": "/elsewhere/run/checkpoint-2", "best_metric": 0.7}
    (run / "checkpoint-6" / "trainer_state.json").write_text(json.dumps(state))
    best = best_checkpoint(run / "checkpoint-6")
    assert best == run / "checkpoint-2"
    assert finish_from_checkpoint(best, run)
    assert (run / "adapter_model.safetensors").read_bytes() == b"best"
    (run / "checkpoint-2" / "adapter_model.safetensors").unlink()
    with pytest.raises(FincheckError, match="names checkpoint-2 the best checkpoint"):
        best_checkpoint(run / "checkpoint-6")


def test_the_training_curve_plots_from_a_run_folder(tmp_path):
    """scripts/plot_training.py: the loss and the dev figures of trainer_state.json."""
    import importlib.util

    run = tmp_path / "run"
    (run / "checkpoint-4").mkdir(parents=True)
    history = [
        {"step": 1, "loss": 1.5},
        {"step": 2, "loss": 0.9},
        {"step": 2, "eval_loss": 0.8},
        {"step": 2, "eval_qasem_auc": 0.55, "eval_fhsumbench_f": 0.2},
        {"step": 4, "loss": 0.5},
        {"step": 4, "eval_qasem_auc": 0.61, "eval_fhsumbench_f": 0.3},
    ]
    state = {"log_history": history, "best_model_checkpoint": str(run / "checkpoint-4")}
    (run / "checkpoint-4" / "trainer_state.json").write_text(json.dumps(state))
    spec = importlib.util.spec_from_file_location(
        "plot_training", REPO / "scripts" / "plot_training.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    png, points = tmp_path / "curve.png", tmp_path / "curve.json"
    assert script.main([str(run), "--out", str(png), "--json-out", str(points)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    curves = json.loads(points.read_text())["curves"]
    assert curves["eval_qasem_auc"] == [[2, 0.55], [4, 0.61]] and len(curves["loss"]) == 3
    assert script.main([str(tmp_path / "nothing"), "--out", str(png)]) == 1


def test_the_cpu_recipe_trains_a_step_in_its_precision_with_lora_in_the_last_layers(
    small_prepared, tmp_path
):
    """configs/train/qwen2.5-0.5b-cpu.yaml as shipped, on the tiny model: precision bf16 where
    the CPU has bf16 units (the benchmark's choice), the base in bf16, LoRA only in the last
    layer (of 2), one finite step, and an adapter that holds that layer's weights alone."""
    import torch
    from safetensors import safe_open

    from fincheck.train.machine import cpu_has_bf16

    if not cpu_has_bf16():
        pytest.skip("the recipe trains in bf16: this CPU has no bf16 units")
    out = tmp_path / "run"
    recipe = load_recipe(
        REPO / "configs" / "train" / "qwen2.5-0.5b-cpu.yaml",
        [f"--dataset_dir={small_prepared}", f"--output_dir={out}", "--model_name_or_path=tiny-random",
         "--lora_last_layers=1", "--max_steps=1", "--eval_steps=0", "--save_steps=100",
         "--dev_figures=[]", "--dev_figures_limit={}", "--metric_for_best_model=loss",
         "--load_best_model_at_end=false", "--max_length=512",
         "--tree_packing_max_tokens=1024"],
    )  # fmt: skip
    assert recipe.bf16 and not recipe.fp16
    run = build_trainer(recipe)
    weights = dict(run.trainer.model.named_parameters())
    assert {p.dtype for n, p in weights.items() if "lora_" not in n} == {torch.bfloat16}
    assert {p.dtype for n, p in weights.items() if "lora_" in n} == {torch.float32}
    assert train_and_save(run) == 0
    losses = [e["loss"] for e in run.trainer.state.log_history if "loss" in e]
    assert len(losses) == 1 and 0 < losses[0] < 20
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["layers_to_transform"] == [1]
    with safe_open(out / "adapter_model.safetensors", "pt") as f:
        layers = {k.split(".layers.")[1].split(".")[0] for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    assert layers == {"1"}


def test_lora_in_more_layers_than_the_base_has_is_refused(small_prepared, tmp_path):
    recipe = load_recipe(
        TINY, [f"--dataset_dir={small_prepared}", f"--output_dir={tmp_path / 'r'}",
               "--deepspeed=", "--lora_last_layers=3", "--max_steps=1"],
    )  # fmt: skip
    with pytest.raises(FincheckError, match="lora_last_layers=3: the base has only 2 layers"):
        build_trainer(recipe)
