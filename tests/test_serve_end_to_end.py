"""The issue's "done when": a tiny-cpu adapter trained by the real pipeline (`fincheck prepare`
on the real data, then `train/sft.py` with the tiny-cpu recipe for 2 steps) is used through
`fincheck detect`, merged, dry-run published, and the published folder works as an adapter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fincheck.commands.cli import main

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def trained_run(prepared_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("e2e") / "tiny-cpu"
    cmd = [
        sys.executable,
        "train/sft.py",
        "--config",
        "configs/train/tiny-cpu.yaml",
        f"--dataset_dir={prepared_dir}",
        f"--output_dir={out}",
        "--max_steps=2",
        "--save_steps=100",
        "--deepspeed=",
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.mark.slow
def test_trained_tiny_adapter_detect_merge_publish(
    trained_run: Path, prepared_dir: Path, tmp_path: Path, capsys
):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(
        json.dumps(
            {"id": "x", "text": "The council met on Monday.", "summary": "It met on Friday."}
        )
        + "\n"
        + json.dumps(
            {
                "id": "y",
                "text": "The council met on Monday.",
                "sentence": "It met on Friday.",
                "question": "When did it meet?",
                "answer": "on Friday",
            }
        )
        + "\n"
    )
    results = tmp_path / "results.jsonl"
    assert (
        main(
            [
                "detect",
                "--adapter",
                str(trained_run),
                "--input",
                str(pairs),
                "--out",
                str(results),
                "--max-new-tokens",
                "8",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    lines = [json.loads(x) for x in results.read_text().splitlines()]
    assert [r["id"] for r in lines] == ["x", "y"] and 0 <= lines[1]["p_yes"] <= 1

    assert main(["merge", "--adapter", str(trained_run), "--out", str(tmp_path / "merged")]) == 0
    assert (tmp_path / "merged" / "model.safetensors").is_file()

    repo = tmp_path / "repo"
    assert (
        main(
            [
                "publish",
                "--checkpoint",
                str(trained_run),
                "--repo-id",
                "me/fincheck-tiny",
                "--dry-run",
                str(repo),
            ]
        )
        == 0
    )
    card = (repo / "README.md").read_text()
    meta = yaml.safe_load(card.split("---\n")[1])
    assert meta["library_name"] == "peft"
    manifest = json.loads((prepared_dir / "manifest.json").read_text())
    assert manifest["fingerprint"] in card
    assert (repo / "base" / "model.safetensors").is_file()
    assert not list(repo.rglob("*.bin"))  # training_args.bin and optimizer state stay home
    assert not (repo / "checkpoint-2").exists()
    capsys.readouterr()

    # The published folder is itself a usable adapter (what a user downloads from the hub).
    (tmp_path / "t.txt").write_text("The council met on Monday.")
    (tmp_path / "s.txt").write_text("It met on Friday.")
    assert (
        main(
            [
                "detect",
                "--adapter",
                str(repo),
                "--text",
                str(tmp_path / "t.txt"),
                "--summary",
                str(tmp_path / "s.txt"),
                "--max-new-tokens",
                "4",
            ]
        )
        == 0
    )
    assert "label" in json.loads(capsys.readouterr().out)
