"""Training's dev figures (train/dev_eval.py) on the tiny model: FINAL's flag ROC-AUC comes from
the p_yes its prompts open with (the plain path's, by hand), and tasks_mean averages each
task's `choose_by` figure."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from fincheck.inference.generation import generate_batch  # noqa: E402
from fincheck.models.loading import LoadOptions, load_model  # noqa: E402
from fincheck.tasks import get_task  # noqa: E402
from fincheck.tasks.prepared import PreparedFolder  # noqa: E402
from fincheck.train import dev_eval  # noqa: E402
from fincheck.train.recipe import load_recipe  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def test_final_dev_figure_is_the_flag_auc_and_counts_in_tasks_mean(
    tiny_base, small_prepared, tmp_path
):
    overrides = [f"--dataset_dir={small_prepared}", f"--output_dir={tmp_path}", "--deepspeed="]
    overrides += ["--dev_figures=[final, fhsumbench]", "--dev_figures_limit={}", "--eval_steps=2"]
    recipe = load_recipe(REPO / "configs" / "train" / "tiny-cpu.yaml", overrides)
    loaded = load_model(str(tiny_base), options=LoadOptions(device="cpu"))
    figures = dev_eval.DevFigures(
        recipe, "dev", loaded.tokenizer, PreparedFolder.open(small_prepared)
    )
    values, _ = figures.compute(loaded.model)
    final = next(t for t in figures.tasks if t.name == "final")
    share = get_task("final").first_word_share
    p_yes = [
        generate_batch(loaded.model, loaded.tokenizer, [p], 4, share)[1][0] for p in final.prompts
    ]
    listed = [p for p, pair in zip(p_yes, final.pairs, strict=True) if pair.target != "None"]
    empty = [p for p, pair in zip(p_yes, final.pairs, strict=True) if pair.target == "None"]
    assert len(listed) == len(empty) == 1  # one of each: the AUC is 1, 0 or 1/2
    by_hand = 1.0 if listed[0] > empty[0] else 0.0 if listed[0] < empty[0] else 0.5
    assert values["final_flag_auc"] == by_hand
    mean = (values["final_flag_auc"] + values["fhsumbench_f"]) / 2
    assert values["tasks_mean"] == pytest.approx(mean, abs=1e-4)
