"""QASem's combined system (`--overlap-weight W`): the detector's P(Yes) with the answer's word
overlap, s = sigmoid(logit P(Yes) + W (overlap - 1/2)), against hand-computed values, through
`fincheck eval` (against the same run at W 0), `fincheck score`'s label and `Detector.detect`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from fincheck.commands.cli import main
from fincheck.errors import FincheckError
from fincheck.tasks import load_prompt
from fincheck.tasks.qasem.overlap import combined_p_yes, with_overlap, word_overlap


def test_the_combined_score_against_hand_computed_values():
    # logit(0.5) = 0; overlap 1 at W 2: 0 + 2 * 0.5 = 1 -> sigmoid(1) = 0.731059
    assert with_overlap(0.5, 1.0, 2.0) == pytest.approx(0.7310586, abs=1e-7)
    # logit(0.8) = ln 4 = 1.386294; overlap 0 at W 1: 1.386294 - 0.5 = 0.886294 -> 0.708125
    assert with_overlap(0.8, 0.0, 1.0) == pytest.approx(0.7081249, abs=1e-7)
    assert with_overlap(0.8, 0.5, 3.0) == pytest.approx(0.8)  # overlap 1/2 adds nothing
    assert with_overlap(0.123, 1.0, 0.0) == 0.123  # W 0: the detector alone, unchanged
    # P(Yes) of exactly 0 or 1 keeps a finite log-odds (clipped at 1e-6), so the overlap orders
    # them: logit(1 - 1e-6) = 13.8155; with W 1 and overlap 0 -> 13.3155 -> 1 - 1.65e-6
    assert with_overlap(1.0, 0.0, 1.0) == pytest.approx(1 - 1.6487e-6, abs=1e-9)
    assert with_overlap(0.0, 1.0, 8.0) > with_overlap(0.0, 0.0, 8.0) > 0.0
    # a large W ranks by the overlap first
    assert with_overlap(0.1, 0.9, 50.0) > with_overlap(0.9, 0.6, 50.0)


def test_only_a_prompt_with_an_answer_is_combined():
    qa = {"text": "The council approved 4 million euros.", "answer": "5 million euros"}
    assert word_overlap(qa["answer"], qa["text"]) == 2 / 3
    # logit(0.5) + 2 * (2/3 - 1/2) = 1/3 -> sigmoid(1/3) = 0.582570
    assert combined_p_yes(0.5, qa, 2.0) == pytest.approx(0.5825702, abs=1e-7)
    assert combined_p_yes(0.5, {"text": "t", "summary": "s"}, 2.0) == 0.5  # FINAL's flag score
    assert combined_p_yes(None, qa, 2.0) is None  # no score read: none made up


def _eval(tiny_base: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return [
        *("eval", "--model", str(tiny_base), "--data", str(data), "--out", str(out)),
        *("--tasks", "qasem,final", "--limit", "6", "--batch-size", "2"),
        *("--max-new-tokens", "final=6,qasem=2", "--max-input-tokens", "512", *extra),
    ]


def _rows(path: Path) -> dict[str, dict]:
    return {r["id"]: r for r in map(json.loads, path.read_text().splitlines())}


def test_eval_writes_the_combined_score_and_score_names_the_system(
    tiny_base, small_prepared, tmp_path, capsys
):
    alone, combined = tmp_path / "alone", tmp_path / "combined"
    assert main(_eval(tiny_base, small_prepared, alone)) == 0
    assert main(_eval(tiny_base, small_prepared, combined, "--overlap-weight", "3")) == 0
    pairs = {
        p["id"]: p
        for p in map(json.loads, (small_prepared / "qasem" / "test.jsonl").read_text().splitlines())
    }
    prompt = load_prompt("qasem")
    before, after = (_rows(d / "predictions" / "qasem.jsonl") for d in (alone, combined))
    assert before.keys() == after.keys() and len(after) == 6
    shares = set()
    for qa_id, row in after.items():
        pair = pairs[qa_id]
        user = next(m["content"] for m in pair["messages"] if m["role"] == "user")
        fields = prompt.fields_of(user, pair.get("meta", {}).get("grounding_span"))
        share = word_overlap(fields["answer"], fields["text"])
        shares.add(round(share, 6))
        p = before[qa_id]["p_yes"]
        expected = 1 / (1 + math.exp(-(math.log(p / (1 - p)) + 3 * (share - 0.5))))
        assert row["p_yes"] == pytest.approx(expected, rel=1e-9)
        assert row["output"] == before[qa_id]["output"]  # the answer text is the model's
    assert len(shares) > 1  # the assets' QAs differ in overlap: the check can fail
    # FINAL's flag score is not a QA's: unchanged by the weight
    finals = [_rows(d / "predictions" / "final.jsonl") for d in (alone, combined)]
    assert {k: r["p_yes"] for k, r in finals[0].items()} == {
        k: r["p_yes"] for k, r in finals[1].items()
    }
    # the folder says what ran; score and its report name the combined system
    config = json.loads((combined / "predictions" / "eval_config.json").read_text())
    assert config["overlap_weight"] == 3.0
    scored = tmp_path / "scored"
    assert (
        main(
            [
                *("score", "--data", str(small_prepared), "--tasks", "qasem"),
                *("--predictions", str(combined / "predictions"), "--out", str(scored)),
                *("--judge", "none", "--bootstrap", "10"),
            ]
        )
        == 0
    )
    assert json.loads((scored / "results.json").read_text())["run"]["overlap_weight"] == 3.0
    assert "QASem's figures are the combined system's" in (scored / "report.md").read_text()
    # a resume with another weight would mix two systems in one folder
    capsys.readouterr()
    assert main(_eval(tiny_base, small_prepared, combined, "--overlap-weight", "1")) == 1
    assert "overlap_weight differ" in capsys.readouterr().err


def test_a_folder_from_before_the_weight_was_recorded_is_the_detector_alone(tmp_path):
    """Its predictions are W 0's: resuming it with a weight is refused, without one it goes on."""
    from fincheck.eval.predictions import check_eval_config

    predictions = tmp_path / "predictions"
    base = {"model": "m", "split": "test", "tasks": ["qasem"]}
    check_eval_config(predictions, base)  # written without the key
    check_eval_config(predictions, {**base, "overlap_weight": 0.0})
    (predictions / "eval_config.json").write_text(json.dumps(base))
    with pytest.raises(FincheckError, match="overlap_weight differ"):
        check_eval_config(predictions, {**base, "overlap_weight": 0.5})


def test_detect_returns_the_combined_score_and_the_detectors_own(tiny_base):
    from fincheck.serve import Detector

    text = "The council approved 4 million euros for the new bridge on Tuesday."
    qa = {"text": text, "sentence": "It approved 5 million euros.", "question": "What?"}
    records = [{**qa, "answer": "5 million euros"}, {**qa, "answer": "a tunnel"}]
    alone = Detector.from_pretrained(base=str(tiny_base), device="cpu", dtype="fp32")
    combined = Detector.from_pretrained(
        base=str(tiny_base), device="cpu", dtype="fp32", overlap_weight=4.0
    )
    plain, both = alone.detect("qasem", records), combined.detect("qasem", records)
    for record, a, c in zip(records, plain, both, strict=True):
        assert "p_detector" not in a
        assert c["p_detector"] == pytest.approx(a["p_yes"], abs=1e-6)
        share = word_overlap(record["answer"], text)
        assert c["p_yes"] == pytest.approx(with_overlap(a["p_yes"], share, 4.0), abs=1e-6)
        assert c["supported"] == (c["p_yes"] >= 0.5)  # the label follows the combined score
    # overlap 2/3 against 0: the combined scores are pushed apart by 4 * 2/3 in log-odds
    assert both[0]["p_yes"] > both[0]["p_detector"] and both[1]["p_yes"] < both[1]["p_detector"]


def test_a_weight_with_no_qa_to_combine_is_refused_not_ignored(tmp_path, capsys):
    """A weight that would change nothing says so before any model loads, in eval and detect."""
    small = Path(__file__).parent / "assets" / "prepared"
    args = ["eval", "--model", "none", "--data", str(small), "--out", str(tmp_path / "run")]
    assert main([*args, "--tasks", "final,fhsumbench", "--overlap-weight", "0.5"]) == 2
    assert "none of this run's tasks (final, fhsumbench) has QAs" in capsys.readouterr().err
    (tmp_path / "a.txt").write_text("The text.")
    (tmp_path / "s.txt").write_text("The summary.")
    detect = ["detect", "--adapter", str(tmp_path / "no-adapter"), "--overlap-weight", "1"]
    pair = ["--text", str(tmp_path / "a.txt"), "--summary", str(tmp_path / "s.txt")]
    assert main([*detect, *pair]) == 2
    assert "no input has a question and an answer" in capsys.readouterr().err
