"""The detector the README shows is committed (docs/bench/qwen2.5-0.5b-three-tasks-3ep-cpu/detector:
the LoRA weights, their config, the tokenizer and the run's records): on a fresh clone it loads
from its base's known name, evaluates at its training window, reproduces the QASem P(Yes) its
committed test predictions carry, and `fincheck detect` answers with it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from fincheck.commands.cli import main

pytestmark = [pytest.mark.real_weights, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[1]
KEPT = REPO / "docs" / "bench" / "qwen2.5-0.5b-three-tasks-3ep-cpu"
BASE = "qwen2.5-coder-0.5b-instruct"


@pytest.fixture(scope="module")
def base_fetched():
    from conftest import fetched

    return fetched(BASE)


def test_the_kept_detector_records_what_it_was_trained_on():
    meta = json.loads((KEPT / "detector" / "fincheck_run.json").read_text())
    assert meta["base_model"] == BASE and meta["max_length"] == 2048
    assert meta["tasks"] == ["final", "qasem", "fhsumbench"]
    folder_bytes = sum(p.stat().st_size for p in (KEPT / "detector").iterdir())
    assert folder_bytes < 30_000_000  # the adapter, its config, the tokenizer, the run's records


def test_the_kept_detector_reproduces_its_committed_qasem_scores(
    base_fetched, prepared_dir, tmp_path
):
    out = tmp_path / "eval"
    # --limit draws whole reference documents (seeded): a few QAs of the committed test split
    args = [
        "eval",
        "--adapter",
        str(KEPT / "detector"),
        "--data",
        str(prepared_dir),
        "--tasks",
        "qasem",
        "--limit",
        "8",
        "--dtype",
        "fp32",
        "--device",
        "cpu",
        "--no-progress",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    config = json.loads((out / "predictions" / "eval_config.json").read_text())
    assert config["window"] == 2048 and config["base"] == BASE
    lines = (out / "predictions" / "qasem.jsonl").read_text().splitlines()
    fresh = {r["id"]: r["p_yes"] for r in map(json.loads, lines)}
    committed_lines = (KEPT / "adapter-test" / "qasem.jsonl").read_text().splitlines()
    committed = {r["id"]: r["p_yes"] for r in map(json.loads, committed_lines)}
    assert len(fresh) >= 8 and fresh.keys() <= committed.keys()

    # The same weights, prompts and dtype (fp32, as it was trained), but not the same batches:
    # the full run shared each reference's prefix among more QAs. Measured on these 36 QAs the
    # logits moved by at most 8e-6; the 2-epoch adapter's committed scores are up to 0.44 away
    # (bf16 rounding moved that adapter's by up to 0.25), so 1e-3 tells this adapter from others.
    def logit(p: float) -> float:
        return math.log(p / (1 - p))

    assert max(abs(logit(fresh[i]) - logit(committed[i])) for i in fresh) <= 1e-3


def test_detect_answers_with_the_kept_detector(base_fetched, tmp_path, capsys):
    (tmp_path / "text.txt").write_text("The bridge opened in 1990 after four years of work.")
    (tmp_path / "summary.txt").write_text("The bridge opened in 1991.")
    capsys.readouterr()
    args = [
        "detect",
        "--adapter",
        str(KEPT / "detector"),
        "--text",
        str(tmp_path / "text.txt"),
        "--summary",
        str(tmp_path / "summary.txt"),
        "--dtype",
        "fp32",
        "--device",
        "cpu",
    ]
    assert main(args) == 0
    answer = json.loads(capsys.readouterr().out)
    assert isinstance(answer["descriptions"], list) and answer["label"] in {
        "no_hallu",
        "factual_hallu",
        "non_factual_hallu",
        "invalid",
    }


def test_the_base_s_tokenizer_passes_publish_s_secret_check(base_fetched):
    """Qwen2.5's vocabulary holds the word "Authorization" as a JSON key with a number: publish
    scans every file it uploads (tokenizer.json too) and must not take it for a header."""
    from fincheck.io.secrets import has_secret
    from fincheck.serve.publish import upload_text

    text = upload_text(base_fetched / "tokenizer.json")
    assert '"Authorization": ' in text and not has_secret(text)
