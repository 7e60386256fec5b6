"""`fincheck merge`: the merged model's logits equal base+adapter's, within a stated tolerance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from serve_tiny_run import build_tiny_run

from fincheck.commands.cli import main
from fincheck.errors import FincheckError
from fincheck.models.loading import load_adapter_model
from fincheck.serve.merge import MergeOptions, merge_adapter

# fp32: same arithmetic up to reassociation of (W + s*B@A) @ x vs W@x + s*B@(A@x)
# (measured max |diff| 5e-7 on the tiny model).
FP32_ATOL = 1e-5
# bf16 keeps 8 mantissa bits: each weight moves by up to 2^-9 of itself. On the tiny model
# (logits within +-0.6) the measured max |diff| is 0.009 (fp16: 0.001); the bound is 0.05,
# i.e. under 10% of the logit range. Larger models have larger logits: compare relative error.
BF16_ATOL = 0.05


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_run(tmp_path_factory.mktemp("merge"))


def _logits(model, input_ids):
    import torch

    with torch.no_grad():
        return model(input_ids=input_ids).logits.float()


def test_merged_fp32_logits_match_base_plus_adapter(run_dir: Path, tmp_path: Path):
    import torch
    from transformers import AutoModelForCausalLM

    peft_model, tokenizer = load_adapter_model(run_dir)
    ids = tokenizer(
        "Text: The council met on Monday. Summary: It met on Friday.", return_tensors="pt"
    ).input_ids
    reference = _logits(peft_model, ids)
    with peft_model.disable_adapter():
        base_only = _logits(peft_model, ids)
    # The adapter must change the output, or this test could not fail.
    assert (reference - base_only).abs().max() > 1e-2

    report = merge_adapter(MergeOptions(run_dir, tmp_path / "fp32", dtype="fp32"))
    assert "model.safetensors" in report["files"] and not any(
        f.endswith(".bin") for f in report["files"]
    )
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "fp32", use_safetensors=True)
    assert merged.dtype == torch.float32
    assert not any("lora" in name for name, _ in merged.named_parameters())
    torch.testing.assert_close(_logits(merged, ids), reference, atol=FP32_ATOL, rtol=0)


def test_merged_bf16_by_default_via_cli(run_dir: Path, tmp_path: Path, capsys):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "bf16"
    assert main(["merge", "--adapter", str(run_dir), "--out", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["dtype"] == "bf16"
    merged = AutoModelForCausalLM.from_pretrained(out, use_safetensors=True)
    assert merged.dtype == torch.bfloat16
    tokenizer = AutoTokenizer.from_pretrained(out)  # saved beside the weights, chat template too
    assert tokenizer.chat_template
    peft_model, _ = load_adapter_model(run_dir)
    ids = tokenizer("The summary adds a date the text never gives.", return_tensors="pt").input_ids
    diff = (_logits(merged, ids) - _logits(peft_model, ids)).abs().max().item()
    assert diff < BF16_ATOL


def test_a_base_inside_the_run_edited_since_training_is_refused(run_dir: Path, tmp_path, capsys):
    """A small base saved inside the run is the one its record names, by content: edited since
    (another rms_norm_eps), merge, detect and publish would use it under the card's old
    fingerprint. Through the run folder and through a checkpoint of it (whose record lists its
    own files only) alike: one line."""
    import json
    import shutil

    from fincheck.io.runs import CHECKPOINT_METADATA

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    checkpoint = run / "checkpoint-1"
    checkpoint.mkdir()
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        shutil.copy(run / name, checkpoint / name)
    record = json.loads((run / "fincheck_run.json").read_text())
    (checkpoint / CHECKPOINT_METADATA).write_text(json.dumps(record))
    assert main(["merge", "--adapter", str(checkpoint), "--out", str(tmp_path / "m0")]) == 0
    config = json.loads((run / "base" / "config.json").read_text())
    config["rms_norm_eps"] = 0.5
    (run / "base" / "config.json").write_text(json.dumps(config))
    capsys.readouterr()
    for given in (run, checkpoint):
        assert main(["merge", "--adapter", str(given), "--out", str(tmp_path / "m1")]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "the base's files differ from those" in err[0], err
    assert not (tmp_path / "m1").exists()


def test_no_output_goes_inside_a_folder_another_command_claimed(run_dir: Path, tmp_path, capsys):
    """A training run's folder, or prepared data, holds what its command wrote: detect's --out,
    merge's --out (a "checkpoint-99"), publish's --dry-run folder and an eval's --out put
    inside it would be taken for its own files (a resume listed detect's output as a run file;
    then every command refused the run). One line each, nothing written there."""
    import json
    import shutil

    from fincheck.io.out_lock import OWN_MARKER

    run, prepared = tmp_path / "run", tmp_path / "prepared"
    shutil.copytree(run_dir, run)
    (run / OWN_MARKER).write_text("train\n")  # as `fincheck train` marks its folder
    (prepared / "qasem").mkdir(parents=True)
    (prepared / OWN_MARKER).write_text("prepare\n")
    pairs = tmp_path / "in.jsonl"
    pairs.write_text(json.dumps({"text": "It met on Monday.", "summary": "It met."}) + "\n")
    commands = {
        "detect": [
            "detect",
            "--adapter",
            str(run),
            "--input",
            str(pairs),
            "--out",
            str(run / "special_tokens_map.json"),
        ],
        "merge": ["merge", "--adapter", str(run), "--out", str(run / "checkpoint-99")],
        "publish": [
            "publish",
            "--checkpoint",
            str(run),
            "--repo-id",
            "me/x",
            "--dry-run",
            str(prepared / "qasem" / "x"),
        ],
        "eval": [
            "baseline",
            "--method",
            "overlap",
            "--data",
            str(prepared),
            "--out",
            str(run / "evals"),
        ],
    }
    before = sorted(p.name for p in run.iterdir())
    for name, argv in commands.items():
        capsys.readouterr()
        assert main(argv) == 1, name
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "a folder `fincheck " in err[0] and "writes" in err[0], err
    assert sorted(p.name for p in run.iterdir()) == before
    assert list((prepared / "qasem").iterdir()) == []


def test_merge_refuses_non_empty_out_and_missing_adapter(run_dir: Path, tmp_path: Path):
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "f").write_text("x")
    with pytest.raises(FincheckError, match="not empty"):
        merge_adapter(MergeOptions(run_dir, tmp_path / "busy"))
    with pytest.raises(FincheckError, match=r"adapter_config\.json"):
        merge_adapter(MergeOptions(tmp_path, tmp_path / "out"))


def test_a_merge_that_fails_midway_leaves_no_half_folder_and_a_rerun_works(
    run_dir: Path, tmp_path: Path, monkeypatch
):
    """Merged into a folder beside --out and renamed in once complete: a full disk while
    saving leaves neither --out nor the staging folder, and the rerun succeeds."""
    import errno

    from transformers import PreTrainedModel

    out = tmp_path / "merged"
    real_save = PreTrainedModel.save_pretrained

    def full_disk(self, *args, **kwargs):
        real_save(self, *args, **kwargs)  # half the files written, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", full_disk)
    with pytest.raises(OSError, match="No space left"):
        merge_adapter(MergeOptions(run_dir, out, dtype="fp32"))
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    monkeypatch.setattr(PreTrainedModel, "save_pretrained", real_save)
    summary = merge_adapter(MergeOptions(run_dir, out, dtype="fp32"))
    assert summary["out"] == str(out) and (out / "config.json").is_file()
