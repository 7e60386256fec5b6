"""The metrics as local `evaluate` modules: loadable by path (no hub) and equal to the pure functions."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fincheck.eval import evaluate_module_path
from fincheck.tasks.fhsumbench.metrics import score_fhsumbench
from fincheck.tasks.qasem.metrics import QasemItem, score_qasem

pytestmark = pytest.mark.slow  # `evaluate` imports datasets, pandas, pyarrow: ~9 s


@pytest.fixture
def evaluate(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_EVALUATE_OFFLINE", "1")
    import evaluate

    return evaluate


def test_qasem_module_matches_pure_function(evaluate):
    metric = evaluate.load(evaluate_module_path("fincheck_qasem"))
    scores, refs = [0.9, 0.4, 0.5, 0.1, 0.7], [1, 1, 0, 0, 1]
    subsets = ["cliff", "cliff", "cliff", "factscore", "factscore"]
    out = metric.compute(predictions=scores, references=refs, subsets=subsets, n_resamples=20)
    direct = score_qasem(
        [QasemItem(s, bool(r), p) for p, r, s in zip(scores, refs, subsets, strict=True)],
        n_resamples=20,
    )
    assert out == direct
    pooled = metric.compute(predictions=scores, references=refs, n_resamples=0)
    # supported: 0.9, 0.4, 0.7; unsupported 0.5, 0.1 -> BAcc (2/3 + 1/2)/2; AUC 5/6
    assert pooled["bacc"] == pytest.approx((2 / 3 + 1 / 2) / 2)
    assert pooled["auc"] == pytest.approx(5 / 6)


def test_fhsumbench_module_parses_raw_outputs(evaluate):
    metric = evaluate.load(evaluate_module_path("fincheck_fhsumbench"))
    outputs = [
        '{"Faithfulness": false, "Factuality": true}',
        '```json\n{"Faithfulness": true, "Factuality": true}\n```',
        "no idea",
    ]
    gold = ["factual_hallu", "factual_hallu", "no_hallu"]
    out = metric.compute(predictions=outputs, references=gold, n_resamples=0)
    expected = score_fhsumbench(
        gold, ["factual_hallu", "no_hallu", "invalid"], [False, False, True], n_resamples=0
    )
    assert math.isnan(out.pop("nfh_acc")) and math.isnan(expected.pop("nfh_acc"))  # no NFH gold
    assert out == expected
    assert out["parse_failure_rate"] == pytest.approx(1 / 3)


def test_module_paths_resolve_from_the_installed_package(evaluate):

    for name in ("fincheck_qasem", "fincheck_fhsumbench", "fincheck_final"):  # each in its task
        assert Path(evaluate_module_path(name), f"{name}.py").is_file()
    with pytest.raises(ValueError):
        evaluate_module_path("accuracy")


def test_final_module_needs_matchings_only_when_both_lists_are_non_empty(evaluate):
    metric = evaluate.load(evaluate_module_path("fincheck_final"))
    out = metric.compute(
        predictions=[
            "A. x is wrong\nB. x is wrong again\nC. y is not in the text",
            "None",
            "A. a false alarm: the date is wrong",
        ],
        references=["A. x\nB. y\nC. z", "A. missed", "None"],
        matchings=[{"A": "A", "B": "A", "C": "B"}, None, None],
        n_resamples=0,
    )
    assert out["true_positives"] == 2
    assert out["precision"] == pytest.approx(2 / 4) and out["recall"] == pytest.approx(2 / 4)
    with pytest.raises(ValueError, match="matching is needed"):
        metric.compute(predictions=["A. x is wrong"], references=["A. y"], n_resamples=0)
