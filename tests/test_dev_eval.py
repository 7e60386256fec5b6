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


def final_and_fhsumbench_figures(tiny_base: Path, prepared: Path, out: Path):
    """The tiny model, and the dev figures of FINAL and FHSumBench on the small prepared data."""
    overrides = [f"--dataset_dir={prepared}", f"--output_dir={out}", "--deepspeed="]
    overrides += ["--dev_figures=[final, fhsumbench]", "--dev_figures_limit={}", "--eval_steps=2"]
    recipe = load_recipe(REPO / "configs" / "train" / "tiny-cpu.yaml", overrides)
    loaded = load_model(str(tiny_base), options=LoadOptions(device="cpu"))
    return loaded, dev_eval.DevFigures(
        recipe, "dev", loaded.tokenizer, PreparedFolder.open(prepared)
    )


def test_final_dev_figure_is_the_flag_auc_and_counts_in_tasks_mean(
    tiny_base, small_prepared, tmp_path
):
    loaded, figures = final_and_fhsumbench_figures(tiny_base, small_prepared, tmp_path)
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


def test_the_answers_behind_the_dev_figures_are_written_and_score_to_the_same_figures(
    tiny_base, small_prepared, tmp_path
):
    """Each dev evaluation's answers are written as predictions (`write_dev_predictions`):
    `fincheck score` reads them and gets the figures training logged, so two epochs or two runs
    can be compared paired, from files, without a second pass over the dev split."""
    import json

    from fincheck.commands.cli import main

    loaded, figures = final_and_fhsumbench_figures(tiny_base, small_prepared, tmp_path)
    values, _ = figures.compute(loaded.model)
    folder = tmp_path / "dev-predictions" / "step-2"
    dev_eval.write_dev_predictions(folder, figures.answers)
    assert sorted(p.name for p in folder.iterdir()) == ["fhsumbench.jsonl", "final.jsonl"]
    argv = ["score", "--data", str(small_prepared), "--split", "dev", "--judge", "none"]
    assert main([*argv, "--predictions", str(folder), "--out", str(tmp_path / "scored")]) == 0
    scored = json.loads((tmp_path / "scored" / "results.json").read_text())["tasks"]
    assert scored["final"]["flag_auc"] == pytest.approx(values["final_flag_auc"], abs=1e-4)
    assert scored["fhsumbench"]["f"] == pytest.approx(values["fhsumbench_f"], abs=1e-4)


def test_the_dev_figures_answer_the_sample_fincheck_eval_draws(tiny_base, prepared_dir, tmp_path):
    """Training's dev figures and `fincheck eval --split dev --limit` draw one sample (the same
    seed): an epoch's written dev answers and an eval's pair up item for item in `fincheck
    compare`. With the recipe's seed, 22 of FINAL's 96 were shared."""
    from transformers import AutoTokenizer

    from fincheck.eval.options import EvalRun

    overrides = [f"--dataset_dir={prepared_dir}", f"--output_dir={tmp_path}", "--deepspeed="]
    overrides += ["--dev_figures=[final]", "--dev_figures_limit={final: 96}", "--eval_steps=2"]
    recipe = load_recipe(REPO / "configs" / "train" / "tiny-cpu.yaml", overrides)
    tokenizer = AutoTokenizer.from_pretrained(tiny_base)
    figures = dev_eval.DevFigures(recipe, "dev", tokenizer, PreparedFolder.open(prepared_dir))
    opts = EvalRun(data_dir=prepared_dir, out_dir=tmp_path / "e", limit={"final": 96})
    evaluated = [pair.id for pair in opts.sample("final", "dev")]
    assert [pair.id for pair in figures.tasks[0].pairs] == evaluated and len(evaluated) == 96


def test_the_dev_figures_show_a_progress_bar_per_task_unless_disable_tqdm(
    tiny_base, small_prepared, tmp_path, capsys
):
    """An epoch's dev figures take 20-30 min on 2 cores: a bar per task says where they are,
    as `fincheck eval`'s does; `disable_tqdm` silences it with the trainer's own bar."""
    loaded, figures = final_and_fhsumbench_figures(tiny_base, small_prepared, tmp_path)
    sizes = figures.sizes()
    figures.compute(loaded.model)
    shown = capsys.readouterr().err
    for task, n in sizes.items():
        assert f"dev figures {task}: 100%" in shown and f"{n}/{n}" in shown
    figures.progress = False  # what `disable_tqdm: true` sets
    figures.compute(loaded.model)
    assert "dev figures" not in capsys.readouterr().err


def test_disable_tqdm_turns_the_dev_figures_bar_off(tiny_base, small_prepared, tmp_path):
    overrides = [f"--dataset_dir={small_prepared}", f"--output_dir={tmp_path}", "--deepspeed="]
    overrides += ["--dev_figures=[final]", "--dev_figures_limit={}", "--eval_steps=2"]
    tiny = REPO / "configs" / "train" / "tiny-cpu.yaml"
    prepared = PreparedFolder.open(small_prepared)
    tokenizer = load_model(str(tiny_base), options=LoadOptions(device="cpu")).tokenizer
    on = dev_eval.DevFigures(load_recipe(tiny, overrides), "dev", tokenizer, prepared)
    quiet = load_recipe(tiny, [*overrides, "--disable_tqdm=true"])
    off = dev_eval.DevFigures(quiet, "dev", tokenizer, prepared)
    assert on.progress and not off.progress
