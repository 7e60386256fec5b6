"""`fincheck compare`: paired differences between scored runs, by hand and end to end."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from fincheck.commands.cli import main
from fincheck.errors import FincheckError
from fincheck.eval.compare import compare_runs, load_scored_run, paired_difference
from fincheck.tasks import get_task


def qasem_examples(scores: list[float], gold: list[str]) -> list[dict]:
    return [
        {"id": f"q{i}", "gold": g, "score": s, "predicted": "Yes" if s >= 0.5 else "No"}
        for i, (s, g) in enumerate(zip(scores, gold, strict=True))
    ]


def test_paired_difference_by_hand():
    gold = ["Yes", "No", "Yes", "No"]
    first = qasem_examples([0.6, 0.7, 0.4, 0.3], gold)  # AUC: pairs (Y,N) right 2 of 4 = 0.5
    other = qasem_examples([0.9, 0.2, 0.8, 0.1], gold)  # AUC 1.0
    d = paired_difference("qasem", first, other, "auc")
    assert d.delta == pytest.approx(0.5) and d.n == 4
    assert d.ci95 is None and d.verdict == "too few shared examples to tell"  # 4 < 30
    # ids the other run did not score are left out of both sides
    d = paired_difference("qasem", first, other[:2], "bacc")
    assert d.n == 2 and d.delta == pytest.approx(1.0 - 0.5)


def test_a_clear_difference_is_called_and_a_tie_is_not():
    rng = random.Random(0)
    gold = ["Yes" if i % 2 else "No" for i in range(200)]
    noise = qasem_examples([rng.random() for _ in gold], gold)
    good = qasem_examples([0.8 if g == "Yes" else 0.2 for g in gold], gold)
    better = paired_difference("qasem", noise, good, "auc", n_resamples=200)
    assert better.verdict == "better" and better.ci95.low > 0
    assert paired_difference("qasem", good, noise, "auc", n_resamples=200).verdict == "worse"
    same = paired_difference("qasem", noise, noise, "auc", n_resamples=200)
    assert same.delta == 0 and same.verdict == "no clear difference"


def test_paired_differences_resample_whole_sources_and_name_them(tmp_path, capsys):
    """By hand: 40 sources of 10 QAs (5 Yes, 5 No each). The other run is right on every QA of
    20 sources and wrong on every QA of the other 20; the first answers 0.5 everywhere (BAcc
    0.5). The other's BAcc on a resample is the share of right sources drawn, so the paired
    difference's interval is that of a proportion over 40 sources: 0 +- 1.96 x sqrt(0.25 /
    40) = +-0.155. Over 400 QAs one by one it would be +-0.049."""
    gold = ["Yes", "No"] * 200
    first = qasem_examples([0.5] * 400, gold)
    right = [0.9 if g == "Yes" else 0.1 for g in gold]
    other = qasem_examples([r if (i // 10) % 2 else 1 - r for i, r in enumerate(right)], gold)
    for ex in (*first, *other):
        source = int(ex["id"][1:]) // 10
        ex["units"] = {"source": f"s{source}", "response": f"s{source}:r{int(ex['id'][1:]) % 2}"}
    by_source = paired_difference("qasem", first, other, "bacc", n_resamples=1000)
    assert (by_source.unit, by_source.n_units, by_source.delta) == ("source", 40, 0.0)
    assert by_source.ci95.high - by_source.ci95.low == pytest.approx(0.31, abs=0.05)

    def plain(examples):  # records scored before units were recorded
        return [{k: v for k, v in ex.items() if k != "units"} for ex in examples]

    by_qa = paired_difference("qasem", plain(first), plain(other), "bacc", n_resamples=300)
    assert by_qa.unit == "example" and by_qa.ci95.high - by_qa.ci95.low < 0.12
    by_response = paired_difference("qasem", first, other, "bacc", 50, unit="response")
    assert (by_response.unit, by_response.n_units) == ("response", 80)
    # the CLI: the unit and its count stand in the report; --unit picks another of the task's
    for name, examples in (("a", first), ("b", other)):
        _write_run(tmp_path / name, examples, 0.5)
    runs = [str(tmp_path / "a"), str(tmp_path / "b")]
    assert main(["compare", *runs, "--bootstrap", "200"]) == 0
    text = capsys.readouterr().out
    assert "95% intervals resample whole sources (40)." in text
    assert "**b** vs a (400 shared, 40 sources): ROC-AUC" in text
    assert main(["compare", *runs, "--bootstrap", "200", "--unit", "qasem=response"]) == 0
    assert "(400 shared, 80 responses)" in capsys.readouterr().out
    assert main(["compare", *runs, "--unit", "qasem=document"]) == 2
    assert "--unit qasem=document: qasem resamples one of source, response" in (
        capsys.readouterr().err
    )


def _write_run(path: Path, examples: list[dict], auc: float) -> None:
    (path / "scored").mkdir(parents=True)
    bacc = get_task("qasem").example_figures(examples)["bacc"]
    figures = {"overall": {"auc": auc, "bacc": bacc, "n": len(examples), "n_text_not_yes_no": 1}}
    (path / "results.json").write_text(json.dumps({"tasks": {"qasem": figures}}))
    (path / "scored" / "qasem.jsonl").write_text("".join(json.dumps(e) + "\n" for e in examples))


def test_cli_writes_the_table_and_the_numbers(tmp_path, capsys):
    rng = random.Random(1)
    gold = ["Yes" if i % 2 else "No" for i in range(60)]
    _write_run(tmp_path / "base", qasem_examples([rng.random() for _ in gold], gold), 0.5)
    _write_run(
        tmp_path / "tuned", qasem_examples([0.9 if g == "Yes" else 0.1 for g in gold], gold), 1.0
    )
    out = tmp_path / "cmp.md"
    args = [str(tmp_path / "base"), str(tmp_path / "tuned"), "--names", "zero-shot,adapter"]
    assert main(["compare", *args, "--out", str(out), "--bootstrap", "100"]) == 0
    text = out.read_text()
    # no scored record names its source: the intervals resample QAs, and say so
    assert "| adapter | 60 | 1.000 [1.000, 1.000] | 1.000 [1.000, 1.000] | 1 of 60 |" in text
    assert "examples one by one (the scored records name no source" in text
    assert "**adapter** vs zero-shot (60 shared, 60 examples): ROC-AUC +" in text
    assert ": better" in text
    data = json.loads(out.with_suffix(".json").read_text())
    assert data["tasks"]["qasem"]["differences"]["adapter"]["auc"]["verdict"] == "better"
    assert text.strip() in capsys.readouterr().out


def test_a_run_scoring_one_task_stands_in_that_tasks_section_alone(tmp_path):
    """A baseline covering QASem only (word overlap) beside runs that scored more tasks: the
    QASem section holds all three, FHSumBench's the two that scored it."""
    rng = random.Random(2)
    gold = ["Yes" if i % 2 else "No" for i in range(40)]
    for name in ("base", "tuned", "overlap"):
        _write_run(tmp_path / name, qasem_examples([rng.random() for _ in gold], gold), 0.5)
    for name in ("base", "tuned"):  # FHSumBench figures too (no scored examples: not paired)
        results = json.loads((tmp_path / name / "results.json").read_text())
        results["tasks"]["fhsumbench"] = {"f": 0.2, "precision": 0.1, "recall": 0.3, "n": 40,
                                          "n_parse_failed": 0}  # fmt: skip
        (tmp_path / name / "results.json").write_text(json.dumps(results))
    runs = [load_scored_run(tmp_path / n, n) for n in ("base", "tuned", "overlap")]
    text, data = compare_runs(runs, n_resamples=50)
    assert set(data["tasks"]["qasem"]["runs"]) == {"base", "tuned", "overlap"}
    assert set(data["tasks"]["fhsumbench"]["runs"]) == {"base", "tuned"}
    assert "Not scored on this task: overlap." in text
    fh_only = tmp_path / "fh"
    fh_only.mkdir()
    (fh_only / "results.json").write_text(json.dumps({"tasks": {"fhsumbench": {"f": 0.2}}}))
    with pytest.raises(FincheckError, match="no task is scored by two"):
        compare_runs([runs[2], load_scored_run(fh_only, "fh")], n_resamples=10)


def test_one_run_or_a_folder_without_results_is_a_clear_error(tmp_path):
    with pytest.raises(FincheckError, match=r"no results\.json"):
        load_scored_run(tmp_path)
    (tmp_path / "results.json").write_text(json.dumps({"tasks": {}}))
    with pytest.raises(FincheckError, match="at least two"):
        compare_runs([load_scored_run(tmp_path)])


def test_scored_runs_edited_into_another_shape_are_one_line(tmp_path, capsys):
    """results.json or a scored record of another shape than `fincheck score` writes (a list of
    tasks, a record without its gold, units that are no mapping): one line naming the run, not
    a traceback in the bootstrap."""
    gold = ["Yes" if i % 2 else "No" for i in range(8)]
    examples = qasem_examples([0.5] * 8, gold)
    _write_run(tmp_path / "good", examples, 0.5)
    edits = {
        "tasks-a-list": ("results.json", json.dumps({"tasks": ["qasem"]})),
        "no-gold": ("scored/qasem.jsonl", '{"id": "x"}\n'),
        "units-a-number": ("scored/qasem.jsonl", json.dumps({**examples[0], "units": 5}) + "\n"),
        "score-nan": ("scored/qasem.jsonl", json.dumps({**examples[0], "score": math.nan}) + "\n"),
    }
    for name, (file, text) in edits.items():
        _write_run(tmp_path / name, examples, 0.5)
        (tmp_path / name / file).write_text(text)
        assert main(["compare", str(tmp_path / "good"), str(tmp_path / name)]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and name in err[0], err


def test_runs_that_cannot_be_paired_honestly_are_refused_in_one_line(tmp_path, capsys):
    """Runs scored on different inputs (results.json's split_sha256 of the task), two runs of
    one name (one row and one figure would be lost), scored records cut or repeated since
    results.json counted them: each one line, nothing written. A name holding "|" or a line
    break stays one table cell."""
    rng = random.Random(3)
    gold = ["Yes" if i % 2 else "No" for i in range(40)]

    def run(name: str, inputs: str | None = "a" * 64, folder: str = "") -> Path:
        path = tmp_path / folder / name
        _write_run(path, qasem_examples([rng.random() for _ in gold], gold), 0.5)
        results = json.loads((path / "results.json").read_text())
        results["counts"] = {"qasem": {"n_scored": len(gold)}}
        results["run"] = {"split_sha256": {"qasem": inputs}}
        (path / "results.json").write_text(json.dumps(results))
        return path

    base, other = run("base"), run("trimmed", inputs="b" * 64)
    out = tmp_path / "cmp.md"
    assert main(["compare", str(base), str(other), "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "qasem: the runs were scored on different inputs" in err[0], err
    assert "base: aaaaaaaaaaaa, trimmed: bbbbbbbbbbbb" in err[0]
    unrecorded = run("old", inputs=None)  # scored before the inputs were recorded: paired
    assert main(["compare", str(base), str(unrecorded), "--bootstrap", "10"]) == 0
    twin = run("base", folder="elsewhere")
    capsys.readouterr()
    assert main(["compare", str(base), str(twin), "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "two runs are named 'base'" in err[0] and "--names" in err[0]
    assert main(["compare", str(base), str(twin), "--names", "a|b,c\nd", "--bootstrap", "10"]) == 0
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| a")]
    assert table[0].startswith("| a\\|b | 40 |"), table
    for edit, said in (("cut", "39 scored examples, where results.json counts 40"),
                       ("repeated", "id 'q0' again")):  # fmt: skip
        edited = run(edit)
        lines = (edited / "scored" / "qasem.jsonl").read_text().splitlines(keepends=True)
        lines = lines[1:] if edit == "cut" else [*lines, lines[0]]
        (edited / "scored" / "qasem.jsonl").write_text("".join(lines))
        assert main(["compare", str(base), str(edited), "--out", str(out)]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0], err
    assert not out.exists()


def test_undefined_figures_are_null_in_the_json_and_out_names_the_markdown(tmp_path, capsys):
    """`NaN` is not JSON (strict readers refuse it): an undefined difference is written null."""
    from fincheck.io.jsonl import strict_json

    data = {"f1": {"value": float("nan"), "ci95": [float("nan"), 0.5]}, "n": 3}
    text = json.dumps(strict_json(data))
    assert json.loads(text) == {"f1": {"value": None, "ci95": [None, 0.5]}, "n": 3}
    gold = ["Yes", "No"] * 20
    _write_run(tmp_path / "a", qasem_examples([0.5] * len(gold), gold), 0.5)
    _write_run(tmp_path / "b", qasem_examples([0.5] * len(gold), gold), 0.5)
    runs = [str(tmp_path / "a"), str(tmp_path / "b")]
    assert main(["compare", *runs, "--out", str(tmp_path / "x.json")]) != 0
    assert "name the markdown file (.md)" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_compare_never_overwrites_a_file_it_did_not_write(tmp_path, capsys):
    """`--out notes.md` holding the user's notes (or a notes.json beside it) is refused before
    anything is read; compare's own earlier pair, unedited, is replaced (a rerun)."""
    gold = ["Yes" if i % 2 else "No" for i in range(8)]
    _write_run(tmp_path / "a", qasem_examples([0.5] * 8, gold), 0.5)
    runs = [str(tmp_path / "a"), str(tmp_path / "a"), "--names", "x,y", "--bootstrap", "10"]
    for name, edited in (("notes.md", "notes.md"), ("table.md", "table.json")):
        out = tmp_path / name
        (tmp_path / edited).write_text("mine")
        assert main(["compare", *runs, "--out", str(out)]) == 1
        assert "earlier `fincheck compare` output" in capsys.readouterr().err
        assert (tmp_path / edited).read_text() == "mine"
    out = tmp_path / "cmp.md"
    assert main(["compare", *runs, "--out", str(out)]) == 0
    assert main(["compare", *runs, "--out", str(out)]) == 0  # its own: rerun replaces it
    out.write_text(out.read_text() + "my edit\n")
    assert main(["compare", *runs, "--out", str(out)]) == 1
    assert out.read_text().endswith("my edit\n")


def test_one_compare_at_a_time_writes_a_pair(tmp_path, capsys):
    """Two compares to one --out: the second is refused while the first holds the pair, from
    its check to its second write, so the JSON and the markdown are always one run's; no lock
    file is left behind."""
    from fincheck.io.safe_files import one_writer

    gold = ["Yes" if i % 2 else "No" for i in range(8)]
    _write_run(tmp_path / "a", qasem_examples([0.5] * 8, gold), 0.5)
    runs = [str(tmp_path / "a"), str(tmp_path / "a"), "--names", "x,y", "--bootstrap", "10"]
    out = tmp_path / "cmp.md"
    assert main(["compare", *runs, "--out", str(out)]) == 0
    pair = (out.read_text(), out.with_suffix(".json").read_text())
    with one_writer(out, "--out"):  # another compare is writing
        capsys.readouterr()
        assert main(["compare", *runs, "--seed", "7", "--out", str(out)]) == 1
        assert "is being written by another fincheck command" in capsys.readouterr().err
    assert (out.read_text(), out.with_suffix(".json").read_text()) == pair
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "cmp.json", "cmp.md"]


def test_qasem_subsets_stand_in_the_table_and_are_paired_by_subset(tmp_path):
    """Each subset's AUC (the paper's columns) has a column when results.json recorded it, and
    is computed from the scored examples of that subset alone, for the table and the paired
    difference."""
    gold = ["Yes", "No"] * 20
    first = qasem_examples([0.5] * 40, gold)
    # cliff (first 20) ranked perfectly, factscore (last 20) inverted
    other = qasem_examples([(0.9 if g == "Yes" else 0.1) for g in gold[:20]]
                           + [(0.1 if g == "Yes" else 0.9) for g in gold[20:]], gold)  # fmt: skip
    for ex in (*first, *other):
        ex["subset"] = "cliff" if int(ex["id"][1:]) < 20 else "factscore"
    assert paired_difference("qasem", first, other, "auc_cliff").delta == pytest.approx(0.5)
    assert paired_difference("qasem", first, other, "auc_factscore").delta == pytest.approx(-0.5)
    assert paired_difference("qasem", first, other, "auc").delta == pytest.approx(0.0)
    for name, examples in (("a", first), ("b", other)):
        _write_run(tmp_path / name, examples, 0.5)
        results = json.loads((tmp_path / name / "results.json").read_text())
        results["tasks"]["qasem"]["cliff"] = {"auc": 0.75, "ci95": {"auc": [0.6, 0.9]}, "n": 20}
        (tmp_path / name / "results.json").write_text(json.dumps(results))
    text, data = compare_runs([load_scored_run(tmp_path / n, n) for n in "ab"], n_resamples=50)
    # a subset no run recorded gets no column
    assert "| run | n | ROC-AUC | BAcc | CLIFF AUC | unreadable |" in text
    # figures and intervals are recomputed from the scored examples, never results.json's
    # per-QA intervals; results.json only says which columns were recorded
    assert "| b | 40 | 0.500 [" in text and "| 1.000 [1.000, 1.000] | 1 of 40 |" in text
    assert data["tasks"]["qasem"]["runs"]["b"]["auc_cliff"] == 1.0


def fhsumbench_examples(predicted: list[str], gold: list[str]) -> list[dict]:
    return [{"id": f"s{i}", "gold": g, "predicted": p} for i, (g, p) in enumerate(zip(gold, predicted, strict=True))]  # fmt: skip


def test_the_shuffle_floor_is_each_runs_own_answers_dealt_at_random():
    """FHSumBench's macro-F rewards any spread of answers: beside each run stands the F of its
    own answers shuffled across its examples. Answering the gold clears it; a spread that
    ignores the input sits inside it."""
    from fincheck.eval.compare import shuffle_floor

    rng = random.Random(3)
    labels = ["factual_hallu", "non_factual_hallu", "no_hallu"]
    gold = [labels[i % 3] for i in range(90)]
    right = fhsumbench_examples(gold, gold)
    mean, band = shuffle_floor("fhsumbench", right, "f", n_shuffles=200)
    assert 0.2 < mean < 0.45 and band.high < 1.0  # a perfect run: F 1.0, far above
    # answers that ignore the input fall inside their band about 95% of the time
    inside = 0
    for _ in range(20):
        blind = fhsumbench_examples([rng.choice(labels) for _ in gold], gold)
        blind_f = get_task("fhsumbench").example_figures(blind)["f"]
        _, band = shuffle_floor("fhsumbench", blind, "f", n_shuffles=200)
        inside += band.low <= blind_f <= band.high
    assert inside >= 16
    assert shuffle_floor("fhsumbench", right[:10], "f") is None  # too few to say


def test_compare_says_whether_each_run_clears_its_shuffle_floor(tmp_path):
    gold = [["factual_hallu", "non_factual_hallu", "no_hallu"][i % 3] for i in range(60)]
    runs = []
    for name, predicted in (("constant", ["factual_hallu"] * 60), ("right", gold)):
        path = tmp_path / name
        (path / "scored").mkdir(parents=True)
        examples = fhsumbench_examples(predicted, gold)
        figures = get_task("fhsumbench").example_figures(examples)
        results = {"tasks": {"fhsumbench": {**figures, "n": 60, "n_parse_failed": 0}}}
        (path / "results.json").write_text(json.dumps(results))
        (path / "scored" / "fhsumbench.jsonl").write_text("".join(json.dumps(e) + "\n" for e in examples))  # fmt: skip
        runs.append(load_scored_run(path, name))
    text, data = compare_runs(runs, n_resamples=100)
    assert "Shuffle floor of F:" in text
    assert "right 1.000 vs " in text and ": above" in text
    assert "constant 0.167 vs 0.167 [0.167, 0.167]: within or below" in text
    assert data["tasks"]["fhsumbench"]["runs"]["right"]["f_shuffle_floor"][2] < 1.0
