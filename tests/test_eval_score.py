"""`fincheck score` on real prepared data: figures equal an independent computation, bad
prediction files fail with file:line, judge failures make the command exit non-zero."""

from __future__ import annotations

import hashlib
import json
import math
import random
from pathlib import Path
from typing import ClassVar

import pytest
from fake_judge_server import FakeJudgeServer

from fincheck.commands.cli import main
from fincheck.data.pairs import read_pairs
from fincheck.errors import FincheckError
from fincheck.eval.score import ScoreOptions, run_score
from fincheck.inference.llm import ChatClient, RequestCache
from fincheck.tasks import task_names
from fincheck.tasks.final.judge import MatchingJudge

N_PER_TASK = 60


class EchoJudge(ChatClient):
    """An injected ChatClient: a detector description matches the reference description with the
    same text (so a repeated description matches the same reference item twice)."""

    identity: ClassVar[dict] = {"backend": "echo"}

    def __init__(self) -> None:
        self.calls = 0

    def complete(self, messages, sampling, span=None):
        self.calls += 1
        user = messages[-1]["content"]
        gold_part = user.split("Reference descriptions")[1].split("Detector descriptions")[0]
        pred_part = user.split("Detector descriptions")[1].split("How to match")[0]

        def items(part):
            return [line.split(". ", 1) for line in part.splitlines() if line[1:3] == ". "]

        gold_by_text = {text: letter for letter, text in items(gold_part)}
        return json.dumps({letter: gold_by_text.get(text) for letter, text in items(pred_part)})


def write_predictions(prepared: Path, out: Path, seed: int = 0) -> dict[str, list]:
    """Synthetic predictions of known quality for the first N test pairs of each task."""
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    gold: dict[str, list] = {}
    for task in ("qasem", "fhsumbench", "final"):
        pairs = list(read_pairs(prepared / task / "test.jsonl", task_names()))[:N_PER_TASK]
        gold[task] = pairs
        with (out / f"{task}.jsonl").open("w") as f:
            for i, pair in enumerate(pairs):
                record = {"id": pair.id, "task": task}
                if task == "qasem":
                    supported = pair.target == "Yes"
                    p_yes = round(
                        min(1, max(0, (0.65 if supported else 0.4) + rng.gauss(0, 0.25))), 2
                    )
                    record.update(output="Yes" if p_yes >= 0.5 else "No", p_yes=p_yes)
                    if i % 10 == 0:  # no p_yes: scored from the text
                        record.pop("p_yes")
                elif task == "fhsumbench":
                    choice = rng.random()
                    record["output"] = (
                        pair.target
                        if choice < 0.5
                        else '```json\n{"Faithfulness": true, "Factuality": true}\n```'
                        if choice < 0.8
                        else "I am not sure."
                    )
                else:
                    record["output"] = pair.target if i % 3 else "None"
                    if i % 7 == 0 and pair.target != "None":  # a repeated description
                        first = pair.target.splitlines()[0]
                        record["output"] = f"{first}\nB. {first[3:]}"
                f.write(json.dumps(record) + "\n")
    return gold


@pytest.fixture
def scored_run(prepared_dir, tmp_path):
    predictions = tmp_path / "run" / "predictions"
    gold = write_predictions(prepared_dir, predictions)
    client = EchoJudge()
    judge = MatchingJudge(client, RequestCache(tmp_path / "run" / "judge_cache.jsonl"))
    opts = ScoreOptions(
        prepared_dir,
        predictions,
        tmp_path / "run",
        judge=judge,
        bootstrap_resamples=50,
        progress=False,
    )
    results, errors = run_score(opts)
    return results, errors, gold, tmp_path / "run", client


def test_figures_match_an_independent_computation(scored_run):
    import sklearn.metrics as sklearn

    _, errors, gold, run_dir, _ = scored_run
    assert errors == 0
    on_disk = json.loads((run_dir / "results.json").read_text())
    assert on_disk["tasks"]["qasem"]["overall"]["n"] == N_PER_TASK

    preds = {
        t: [json.loads(line) for line in (run_dir / "predictions" / f"{t}.jsonl").open()]
        for t in ("qasem", "fhsumbench", "final")
    }
    # QASem: s = p_yes, or 1/0 from the text; sklearn on the pooled set
    y = [p.target == "Yes" for p in gold["qasem"]]
    s = [r.get("p_yes", 1.0 if r["output"] == "Yes" else 0.0) for r in preds["qasem"]]
    overall = on_disk["tasks"]["qasem"]["overall"]
    assert overall["auc"] == pytest.approx(sklearn.roc_auc_score(y, s))
    assert overall["bacc"] == pytest.approx(
        sklearn.balanced_accuracy_score(y, [v >= 0.5 for v in s])
    )
    assert overall["n_scored_from_text"] == N_PER_TASK // 10

    # FHSumBench: sklearn macro P/R with -1 for invalid, as the reference scorer does
    mapping = {"factual_hallu": 0, "non_factual_hallu": 1, "no_hallu": 2}
    y3 = [mapping[p.meta["label"]] for p in gold["fhsumbench"]]
    p3 = []
    for r in preds["fhsumbench"]:
        text = r["output"]
        if "not sure" in text:
            p3.append(-1)
        elif '"Faithfulness": true, "Factuality": true' in text:
            p3.append(2)
        else:
            p3.append(mapping[next(p.meta["label"] for p in gold["fhsumbench"] if p.id == r["id"])])
    fh = on_disk["tasks"]["fhsumbench"]
    p = sklearn.precision_score(y3, p3, average="macro", zero_division=0)
    r = sklearn.recall_score(y3, p3, average="macro", zero_division=0)
    assert fh["precision"] == pytest.approx(p) and fh["recall"] == pytest.approx(r)
    assert fh["f"] == pytest.approx(2 * p * r / (p + r))
    assert fh["n_parse_failed"] == sum(v == -1 for v in p3)

    # FINAL: TP = distinct gold descriptions reproduced verbatim; repeats add predictions only
    tp = n_pred = n_gold = 0
    for pair, record in zip(gold["final"], preds["final"], strict=True):
        gold_items = (
            [] if pair.target == "None" else [line[3:] for line in pair.target.splitlines()]
        )
        pred_items = (
            []
            if record["output"] == "None"
            else [line[3:] for line in record["output"].splitlines()]
        )
        tp += len(set(gold_items) & set(pred_items))
        n_pred += len(pred_items)
        n_gold += len(gold_items)
    final = on_disk["tasks"]["final"]
    counts = (final["true_positives"], final["predicted_descriptions"], final["gold_descriptions"])
    assert counts == (tp, n_pred, n_gold)
    assert final["precision"] == pytest.approx(tp / n_pred) and final["recall"] == pytest.approx(
        tp / n_gold
    )
    assert tp < n_pred  # the repeated descriptions cost precision
    flagged_gold = [p.target != "None" for p in gold["final"]]
    flagged_pred = [r["output"] != "None" for r in preds["final"]]
    assert final["binary_bacc"] == pytest.approx(
        sklearn.balanced_accuracy_score(flagged_gold, flagged_pred)
    )
    assert final["judge_errors"] == 0 and final["n_judge_failed"] == 0


def test_outputs_written(scored_run, prepared_dir):
    results, _, _, run_dir, _ = scored_run
    report = (run_dir / "report.md").read_text()
    assert "MiniCheck-770M (QASem paper, Table 4)" in report
    assert "GPT-4o vanilla (FHSumBench paper, Table 1)" in report
    assert "Claude-3.5-Sonnet, CoT (FINAL paper, Table 4 (F1, test, 1,265))" in report
    for png in ("fhsumbench_confusion", "qasem_roc", "qasem_confusion", "final_binary_confusion"):
        data = (run_dir / "plots" / f"{png}.png").read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"plots/{png}.png" in report
    scored = [json.loads(line) for line in (run_dir / "scored" / "final.jsonl").open()]
    assert len(scored) == N_PER_TASK and {"judge", "true_positives"} <= set(scored[0])
    # every scored record names the units `fincheck compare` resamples whole, from the gold
    for task in task_names():
        gold = {p.id: p for p in read_pairs(prepared_dir / task / "test.jsonl", task_names())}
        for line in (run_dir / "scored" / f"{task}.jsonl").open():
            record = json.loads(line)
            pair = gold[record["id"]]
            if task == "qasem":  # a response is subset:source id:model
                response = pair.meta["response_id"]
                expected = {"source": response.rsplit(":", 1)[0], "response": response}
            elif task == "fhsumbench":  # the source document, as the split groups them
                expected = {"source": pair.meta["group"]}
            else:  # FINAL's document: its grounding text
                expected = {"document": pair.document_key}
            assert record["units"] == expected
    assert (
        results["counts"]["qasem"]["n_missing"] == results["counts"]["qasem"]["n_gold"] - N_PER_TASK
    )


def test_rescoring_reuses_the_judge_cache(scored_run, prepared_dir):
    _, _, _, run_dir, first_client = scored_run
    assert first_client.calls > 0
    client = EchoJudge()
    judge = MatchingJudge(client, RequestCache(run_dir / "judge_cache.jsonl"))
    run_score(
        ScoreOptions(
            prepared_dir,
            run_dir / "predictions",
            run_dir,
            judge=judge,
            bootstrap_resamples=10,
            progress=False,
        )
    )
    assert client.calls == 0 and judge.cache.hits == first_client.calls


def _write(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_unknown_and_duplicate_ids_fail_with_file_and_line(prepared_dir, tmp_path):
    first = next(read_pairs(prepared_dir / "qasem" / "test.jsonl", task_names()))
    path = tmp_path / "p" / "qasem.jsonl"
    opts = ScoreOptions(
        prepared_dir, path.parent, tmp_path / "out", bootstrap_resamples=0, progress=False
    )
    _write(
        path,
        [
            {"id": first.id, "task": "qasem", "output": "Yes"},
            {"id": "no-such-id", "task": "qasem", "output": "Yes"},
        ],
    )
    with pytest.raises(FincheckError, match=r"qasem.jsonl:2: id: 'no-such-id' is not in the gold"):
        run_score(opts)
    _write(
        path,
        [
            {"id": first.id, "task": "qasem", "output": "Yes"},
            {"id": first.id, "task": "qasem", "output": "No"},
        ],
    )
    with pytest.raises(
        FincheckError, match=r"qasem.jsonl:2: id: duplicate id .* \(first on line 1\)"
    ):
        run_score(opts)
    _write(path, [{"id": first.id, "task": "qasem", "output": "Yes", "p_yes": 1.5}])
    with pytest.raises(FincheckError, match=r"qasem.jsonl:1: p_yes"):
        run_score(opts)
    _write(path, [{"id": first.id, "task": "fhsumbench", "output": "Yes"}])
    with pytest.raises(FincheckError, match=r"qasem.jsonl:1: task"):
        run_score(opts)


def test_predictions_made_on_other_inputs_are_refused(prepared_dir, tmp_path, capsys):
    """An eval records each task's inputs (its split file's sha256); scoring its predictions
    against another folder's, or the same folder prepared again (trimmed, split anew), would
    pair answers with inputs they were not made on: one line, nothing written. Another folder
    with the same split file (only its other splits differ) scores them, and results.json
    records the inputs, which compare checks."""
    out = tmp_path / "run"
    args = ["--data", str(prepared_dir), "--no-progress"]
    assert main(["baseline", "--method", "overlap", "--tasks", "qasem", "--limit", "20",
                 "--out", str(out), *args]) == 0  # fmt: skip
    config_file = out / "predictions" / "eval_config.json"
    config = json.loads(config_file.read_text())
    sha = config["split_sha256"]["qasem"]
    assert sha == hashlib.sha256((prepared_dir / "qasem" / "test.jsonl").read_bytes()).hexdigest()
    config["data_fingerprint"] = "f" * 64  # another folder, the same test split
    config_file.write_text(json.dumps(config))
    score = ["score", "--predictions", str(out / "predictions"), "--bootstrap", "0", *args]
    assert main([*score, "--out", str(tmp_path / "scored")]) == 0
    results = json.loads((tmp_path / "scored" / "results.json").read_text())
    assert results["run"]["split_sha256"] == {"qasem": sha}
    config["split_sha256"]["qasem"] = "0" * 64  # made on other inputs
    config_file.write_text(json.dumps(config))
    capsys.readouterr()
    assert main([*score, "--out", str(tmp_path / "scored-again")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "predictions were made on inputs 000000000000, but" in err[0], err
    assert not (tmp_path / "scored-again").exists()


def test_cli_exits_non_zero_with_the_judge_error_count(prepared_dir, tmp_path, monkeypatch, capsys):
    pairs = [
        p
        for p in read_pairs(prepared_dir / "final" / "test.jsonl", task_names())
        if p.target != "None"
    ][:3]
    _write(
        tmp_path / "run" / "predictions" / "final.jsonl",
        [{"id": p.id, "task": "final", "output": p.target} for p in pairs],
    )
    monkeypatch.setenv("FAKE_JUDGE_KEY", "k")
    with FakeJudgeServer() as server:
        for p in pairs:  # the first example's judge is down, the others answer
            trigger = p.target.splitlines()[0][3:]
            server.script[trigger] = [("ok", '{"A": "A"}')]
        server.script[pairs[0].target.splitlines()[0][3:]] = [
            ("status", 503, {"retry-after-ms": "5"})
        ]
        code = main(
            [
                "score",
                "--data",
                str(prepared_dir),
                "--predictions",
                str(tmp_path / "run" / "predictions"),
                "--out",
                str(tmp_path / "run"),
                "--judge",
                "openai",
                "--judge-model",
                "fake",
                "--judge-base-url",
                server.base_url,
                "--judge-api-key-env",
                "FAKE_JUDGE_KEY",
                "--judge-max-retries",
                "1",
                "--bootstrap",
                "0",
            ]
        )
    assert code == 3
    err = capsys.readouterr().err
    assert "1 of 3 FINAL examples (33.3%) got no usable judge answer (1 calls failed" in err
    assert "above --max-judge-failure-rate 2%" in err
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["tasks"]["final"]["judge_errors"] == 1
    assert results["tasks"]["final"]["n_judge_failed"] == 1  # a miss in the headline P/R
    assert results["judge"]["errors"] == 1


def test_endpoint_secrets_reach_no_file_and_no_printed_line(
    prepared_dir, tmp_path, monkeypatch, capsys
):
    """Secrets by value and by shape: an API key of no known shape, and keys in a URL's query
    under names no list holds, are in no file the score writes and no line it prints, whether
    the judge answers or fails (the exit-3 summary line included); nor in its escaped form in
    JSON (a key holding a quote and a backslash), and every JSON file written still parses (a
    query key named like a secret, `?token=`, is redacted without cutting the JSON around it)."""
    pairs = [
        p
        for p in read_pairs(prepared_dir / "final" / "test.jsonl", task_names())
        if p.target != "None"
    ][:2]
    _write(
        tmp_path / "run" / "predictions" / "final.jsonl",
        [{"id": p.id, "task": "final", "output": p.target} for p in pairs],
    )
    key = 'plain "words\\ key 8842'
    in_query = ("QUERYSECRET4242", "sub-secret-9191", "tok-secret-7373")
    monkeypatch.setenv("ODD_JUDGE_KEY", key)
    with FakeJudgeServer() as server:
        server.script[pairs[0].target.splitlines()[0][3:]] = [("ok", '{"A": "A"}')]
        server.script[pairs[1].target.splitlines()[0][3:]] = [("status", 503, {})]
        url = f"{server.base_url}?x-api-key={in_query[0]}&subscription-key={in_query[1]}"
        url += f"&token={in_query[2]}"
        code = main(
            ["score", "--data", str(prepared_dir), "--predictions",
             str(tmp_path / "run" / "predictions"), "--out", str(tmp_path / "run"),
             "--judge-model", "fake", "--judge-base-url", url, "--judge-api-key-env",
             "ODD_JUDGE_KEY", "--judge-max-retries", "0", "--bootstrap", "0", "--no-judge-sanity"]
        )  # fmt: skip
    printed = "".join(capsys.readouterr())
    assert code in (0, 3)
    written = [f.read_text(errors="replace") for f in tmp_path.rglob("*") if f.is_file()]
    for secret in (key, json.dumps(key)[1:-1], *in_query):
        assert secret not in printed and not any(secret in text for text in written), secret
    for path in tmp_path.rglob("*.json"):
        json.loads(path.read_text())  # whole: no redaction cut into it


def test_text_only_qasem_predictions_are_flagged_in_the_report(prepared_dir, tmp_path):
    pairs = list(read_pairs(prepared_dir / "qasem" / "test.jsonl", task_names()))[:20]
    _write(
        tmp_path / "run" / "predictions" / "qasem.jsonl",
        [
            {"id": p.id, "task": "qasem", "output": "Yes" if i % 2 else "No."}
            for i, p in enumerate(pairs)
        ],
    )
    results, _ = run_score(
        ScoreOptions(
            prepared_dir, tmp_path / "run" / "predictions", tmp_path / "run", bootstrap_resamples=0
        )
    )
    overall = results["tasks"]["qasem"]["overall"]
    assert overall["n_scored_from_text"] == 20 and overall["auc"] == pytest.approx(overall["bacc"])
    assert "not comparable with the paper's AUC" in (tmp_path / "run" / "report.md").read_text()


def test_report_to_wandb_offline(prepared_dir, tmp_path, monkeypatch, fresh_wandb):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    pairs = list(read_pairs(prepared_dir / "fhsumbench" / "test.jsonl", task_names()))[:5]
    _write(
        tmp_path / "run" / "predictions" / "fhsumbench.jsonl",
        [{"id": p.id, "task": "fhsumbench", "output": p.target} for p in pairs],
    )
    code = main(
        [
            "score",
            "--data",
            str(prepared_dir),
            "--predictions",
            str(tmp_path / "run" / "predictions"),
            "--out",
            str(tmp_path / "run"),
            "--bootstrap",
            "0",
            "--report-to",
            "wandb",
        ]
    )
    assert code == 0
    offline_runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert offline_runs, "wandb wrote no offline run"
    assert list(offline_runs[0].glob("*.wandb")), "no run file for `wandb sync`"
    # wandb links its logs: none of them is left in OUT, whose next command would refuse it
    assert not [p for p in (tmp_path / "run").rglob("*") if p.is_symlink()]
    again = ["score", "--data", str(prepared_dir), "--predictions",
             str(tmp_path / "run" / "predictions"), "--out", str(tmp_path / "run"), "--bootstrap", "0"]  # fmt: skip
    assert main(again) == 0


def test_crosscheck_script_agrees(scored_run, prepared_dir):
    import subprocess
    import sys

    run_dir = scored_run[3]
    script = Path(__file__).resolve().parents[1] / "scripts" / "crosscheck_scores.py"
    done = subprocess.run(
        [sys.executable, str(script), "--data", str(prepared_dir), "--run", str(run_dir)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "DIFF" not in done.stdout and "figures agree" in done.stdout


def test_fhsumbench_figures_equal_the_reference_scorers_on_off_format_outputs(
    prepared_dir, tmp_path
):
    """Every FHSumBench test pair gets one of the table's off-format outputs (fences, prose,
    yes/no, 0/1, single quotes, key: value lines, truncations, refusals): results.json holds
    the reference scorer's P, R, F, accuracy and per-class accuracies (sklearn's macro over gold
    ∪ predicted labels, invalid a class) to 1e-9, and the lenient figures differ."""
    import subprocess
    import sys

    import sklearn.metrics as sklearn
    from test_fhsumbench_reference import CASES

    from fincheck.tasks.fhsumbench.reference import reference_judgement

    pairs = list(read_pairs(prepared_dir / "fhsumbench" / "test.jsonl", task_names()))
    run = tmp_path / "run"
    (run / "predictions").mkdir(parents=True)
    outputs = [CASES[i % len(CASES)][0] for i in range(len(pairs))]
    with (run / "predictions" / "fhsumbench.jsonl").open("w") as f:
        for pair, output in zip(pairs, outputs, strict=True):
            f.write(json.dumps({"id": pair.id, "task": "fhsumbench", "output": output}) + "\n")
    args = ["score", "--data", str(prepared_dir), "--predictions", str(run / "predictions"),
            "--out", str(run), "--bootstrap", "0", "--no-progress"]  # fmt: skip
    assert main(args) == 0
    figures = json.loads((run / "results.json").read_text())["tasks"]["fhsumbench"]
    codes = {"factual_hallu": 0, "non_factual_hallu": 1, "no_hallu": 2}
    y_true = [codes[p.meta["label"]] for p in pairs]
    verdict = {(False, True): 0, (False, False): 1, (True, True): 2}
    y_pred = [verdict.get(reference_judgement(o)[0], -1) for o in outputs]
    p = sklearn.precision_score(y_true, y_pred, average="macro", zero_division=0)
    r = sklearn.recall_score(y_true, y_pred, average="macro", zero_division=0)
    assert figures["precision"] == pytest.approx(p, abs=1e-9)
    assert figures["recall"] == pytest.approx(r, abs=1e-9)
    assert figures["f"] == pytest.approx(2 * p * r / (p + r), abs=1e-9)
    assert figures["accuracy"] == pytest.approx(sklearn.accuracy_score(y_true, y_pred), abs=1e-9)
    fh = [(t, q) for t, q in zip(y_true, y_pred, strict=True) if t == 0]
    assert figures["fh_acc"] == pytest.approx(sum(q == 0 for _, q in fh) / len(fh), abs=1e-9)
    assert figures["lenient_parse"]["f"] != figures["f"]  # the two readings do differ here
    script = Path(__file__).resolve().parents[1] / "scripts" / "crosscheck_scores.py"
    done = subprocess.run([sys.executable, str(script), "--data", str(prepared_dir), "--run", str(run)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0 and "fhsumbench/noh_acc" in done.stdout, done.stdout


def _score_with_fake_judge(prepared_dir, tmp_path, server, *extra):
    return main(
        [
            "score",
            "--data",
            str(prepared_dir),
            "--predictions",
            str(tmp_path / "run" / "predictions"),
            "--out",
            str(tmp_path / "run"),
            "--judge-model",
            "fake",
            "--judge-base-url",
            server.base_url,
            "--judge-max-retries",
            "0",
            "--bootstrap",
            "0",
            "--no-progress",
            *extra,
        ]
    )


def _final_predictions(prepared_dir, tmp_path, n=3):
    pairs = [
        p
        for p in read_pairs(prepared_dir / "final" / "test.jsonl", task_names())
        if p.target != "None"
    ][:n]
    _write(
        tmp_path / "run" / "predictions" / "final.jsonl",
        [{"id": p.id, "task": "final", "output": p.target} for p in pairs],
    )
    return pairs


def test_a_judge_base_url_alone_means_the_openai_judge(prepared_dir, tmp_path, capsys):
    """No --judge: the URL and model are used, not ignored with empty FINAL figures."""
    from fincheck.tasks.final.judge_sanity import read_sanity_set

    pairs = _final_predictions(prepared_dir, tmp_path)
    sanity = read_sanity_set()
    with FakeJudgeServer() as server:
        for p in pairs:
            server.script[p.target.splitlines()[0][3:]] = [("ok", '{"A": "A"}')]
        # the judge sanity set: the expected matching, except one item answered all-null
        for item in sanity:
            answer = dict(item["expected"])
            if item["id"] == "two-of-two":
                answer = dict.fromkeys(answer)
            server.script[item["summary"]] = [("ok", json.dumps(answer))]
        assert _score_with_fake_judge(prepared_dir, tmp_path, server) == 0
        assert len(server.requests) == 3 + len(sanity)
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["judge"]["backend"] == "openai"
    assert results["tasks"]["final"]["precision"] is not None
    # 15 predicted descriptions, the 2 of "two-of-two" answered wrongly
    agreement = results["tasks"]["final"]["judge_sanity"]
    assert (agreement["n"], agreement["agreed"], agreement["failed"]) == (15, 13, 0)
    # the paper's count against human matching: of the judge's pairs, all are right (precision
    # 1); of the expected pairs, the two of "two-of-two" were missed
    expected = agreement["matches_expected"]
    assert agreement["match_precision"] == 1.0
    assert agreement["match_recall"] == pytest.approx((expected - 2) / expected)
    assert (
        "**Judge checked on built-in sanity set** (12 items): the expected verdict on 13 of 15"
        in (tmp_path / "run" / "report.md").read_text()
    )


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--judge-timeout", "5"], "--judge-timeout: read only with --judge openai, not --judge none"),
        (["--judge-concurrency", "2"], "--judge-concurrency: read only with --judge openai or local"),
        (["--no-judge-sanity"], "--no-judge-sanity: read only with --judge openai or local"),
        (["--judge-check", "x.jsonl"], "--judge-check: read only with --judge openai or local"),
        (["--judge", "local", "--judge-model", ".", "--judge-api-key-env", "K"],
         "--judge-api-key-env: read only with --judge openai, not --judge local"),
        (["--wandb-project", "p"], "--wandb-project: read only with --report-to wandb"),
    ],
)  # fmt: skip
def test_score_options_nothing_would_read_are_usage_errors(argv, match, tmp_path, capsys):
    args = [
        "score",
        "--data",
        str(tmp_path),
        "--predictions",
        str(tmp_path),
        "--out",
        str(tmp_path),
    ]
    assert main([*args, *argv]) == 2
    assert match in capsys.readouterr().err


def test_judge_options_that_would_go_unused_are_an_error(tmp_path):
    from fincheck.eval.options import judge_kind

    assert judge_kind(None, None, None) == "none"
    assert judge_kind(None, "gpt-4o", None) == "openai"
    assert judge_kind(None, str(tmp_path), None) == "local"  # a model folder
    assert judge_kind(None, "qwen2.5-coder-1.5b-instruct", None) == "local"  # fetchable by name
    assert judge_kind(None, "qwen2.5-coder-1.5b-instruct", "http://x/v1") == "openai"  # served
    assert judge_kind(None, None, "http://localhost:8000/v1") == "openai"
    with pytest.raises(FincheckError, match="--judge-base-url was given with --judge none"):
        judge_kind("none", None, "http://x/v1")
    with pytest.raises(FincheckError, match="--judge-model was given with --judge none"):
        judge_kind("none", "m", None)


def test_a_judge_that_never_answers_in_json_fails_the_run_and_keeps_the_results(
    prepared_dir, tmp_path, capsys
):
    pairs = _final_predictions(prepared_dir, tmp_path)
    with FakeJudgeServer() as server:
        for p in pairs:
            server.script[p.target.splitlines()[0][3:]] = [("ok", "I think they match.")]
        code = _score_with_fake_judge(prepared_dir, tmp_path, server)
    err = capsys.readouterr().err
    assert code == 3
    assert "3 of 3 FINAL examples (100.0%) got no usable judge answer" in err
    assert "3 answers unreadable" in err and "Traceback" not in err
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["judge"]["parse_failed"] == 3 and (tmp_path / "run" / "report.md").is_file()


def test_an_html_reply_is_one_line_and_the_results_are_written(prepared_dir, tmp_path, capsys):
    pairs = _final_predictions(prepared_dir, tmp_path)
    with FakeJudgeServer() as server:
        for p in pairs:
            server.script[p.target.splitlines()[0][3:]] = [("html", "<html>Sign in</html>")]
        code = _score_with_fake_judge(prepared_dir, tmp_path, server)
    err = capsys.readouterr().err
    assert code == 3
    assert "a 200 reply that began '<html>Sign in</html>'" in err
    assert "Traceback" not in err
    assert (tmp_path / "run" / "results.json").is_file()


def test_a_judge_reply_of_broken_json_is_one_line_and_the_results_are_written(
    prepared_dir, tmp_path, capsys
):
    """A 200 whose body is cut JSON: each example's call fails (one line, never cached), the
    run exits 3 and still writes results.json."""
    pairs = _final_predictions(prepared_dir, tmp_path)
    with FakeJudgeServer() as server:
        for p in pairs:
            server.script[p.target.splitlines()[0][3:]] = [("raw", '{"id": "x", "choi', "always")]
        code = _score_with_fake_judge(prepared_dir, tmp_path, server)
    err = capsys.readouterr().err
    assert code == 3
    assert "a reply that is not JSON" in err
    assert "Traceback" not in err
    assert (tmp_path / "run" / "results.json").is_file()


def test_few_judge_failures_below_the_threshold_are_a_warning(capsys):
    from fincheck.eval.commands import judge_exit_status

    judge = {"asked": 100, "errors": 1, "parse_failed": 1, "first_error": "x"}
    assert judge_exit_status(judge, 0.02) == 0
    assert "warning: 2 of 100 FINAL examples (2.0%)" in capsys.readouterr().err
    assert judge_exit_status({**judge, "parse_failed": 2}, 0.02) == 3


def test_every_figure_shows_its_n_and_tiny_subsets_get_no_ci(prepared_dir, tmp_path):
    """40 CLIFF QAs and 10 FactScore QAs: with their QAs resampled source by source, neither
    subset has the 30 sources an interval needs, and each shows its n and its sources instead."""
    predictions = tmp_path / "run" / "predictions"
    write_predictions(prepared_dir, predictions)  # FHSumBench and FINAL: 60 each
    pairs = list(read_pairs(prepared_dir / "qasem" / "test.jsonl", task_names()))
    chosen = [p for p in pairs if p.meta["dataset"] == "cliff"][:40]
    chosen += [p for p in pairs if p.meta["dataset"] == "factscore"][:10]
    rng = random.Random(0)
    _write(
        predictions / "qasem.jsonl",
        [{"id": p.id, "task": "qasem", "output": "Yes", "p_yes": rng.random()} for p in chosen],
    )
    results, _ = run_score(
        ScoreOptions(prepared_dir, predictions, tmp_path / "run", bootstrap_resamples=50)
    )
    qasem = results["tasks"]["qasem"]
    assert qasem["factscore"]["n"] == 10 and qasem["factscore"]["ci95"]["auc"] is None
    sources = qasem["cliff"]["n_units"]
    assert sources == len({p.meta["response_id"].rsplit(":", 1)[0] for p in chosen[:40]}) < 30
    assert qasem["cliff"]["ci95"]["auc"] is None  # 40 QAs, but fewer than 30 sources
    report = (tmp_path / "run" / "report.md").read_text()
    assert "factscore BAcc (n=10)" in report and "cliff BAcc (n=40)" in report
    assert f"(n=40 in {sources} resampled units, too few for a CI)" in report
    assert "| **this run** | 60 |" in report  # FHSumBench and FINAL tables carry n
    assert "qasem: whole sources" in report and "none below 30 examples" in report


def test_plots_name_the_model_and_gold_has_no_invalid_row(monkeypatch, tmp_path):
    from fincheck.eval.score import model_label
    from fincheck.metrics import plots
    from fincheck.tasks import get_task
    from fincheck.tasks.base import TaskScore

    calls = []
    monkeypatch.setattr(plots, "plot_confusion", lambda *a, **k: calls.append((a, k)) or a[3])
    labels = ["no_hallu", "factual_hallu", "non_factual_hallu", "invalid"]
    figures = {"confusion": {"labels": labels, "counts": [[1, 0, 0, 1]] * 3 + [[0, 0, 0, 0]]}}
    label = model_label({"model": "/x/base", "adapter": "/runs/smollm2-135m-cpu"})
    assert label == "smollm2-135m-cpu (on base)"
    get_task("fhsumbench").plots(TaskScore(figures), tmp_path, label)
    (counts, got_labels, title, _), kwargs = calls[0]
    assert title == "FHSumBench: smollm2-135m-cpu (on base)"
    assert kwargs["gold_labels"] == labels[:3]
    monkeypatch.undo()  # the real function draws 3 gold rows x 4 predicted columns
    assert plots.plot_confusion(counts, got_labels, title, tmp_path / "c.png", labels[:3]).is_file()


def test_final_answers_cut_in_their_reasoning_are_no_descriptions(tmp_path):
    """A CoT answer that hit its token budget before "Final Output:" is not read as a list of
    its reasoning steps; one cut inside its list keeps the items it wrote; both are counted."""
    small = Path(__file__).parent / "assets" / "prepared"
    ids = [p.id for p in read_pairs(small / "final" / "test.jsonl", task_names())]
    steps = "1. The summary says 2025.\n2. The text says 2027.\n3. The summary names"
    outputs = [
        {"output": steps, "cut": "reasoning"},
        {"output": "Final Output:\nA. The year is wrong.\nB. The", "cut": "answer"},
        {"output": steps},  # not cut: read as written (its steps become items)
        {"output": "None"},
    ]
    _write(
        tmp_path / "run" / "predictions" / "final.jsonl",
        [{"id": i, "task": "final", **o} for i, o in zip(ids, outputs, strict=True)],
    )
    results, _ = run_score(
        ScoreOptions(
            small, tmp_path / "run" / "predictions", tmp_path / "run", bootstrap_resamples=0
        )
    )
    final = results["tasks"]["final"]
    assert (final["n_cut"], final["n_cut_in_reasoning"]) == (2, 1)
    scored = [
        json.loads(line)
        for line in (tmp_path / "run" / "scored" / "final.jsonl").read_text().splitlines()
    ]
    predicted = {r["id"]: r["predicted"] for r in scored}
    assert predicted[ids[0]] == []
    assert predicted[ids[1]] == ["The year is wrong.", "The"]
    assert len(predicted[ids[2]]) == 3
    assert (
        "Answers cut at their token budget: 2 of 4" in (tmp_path / "run" / "report.md").read_text()
    )


def test_a_predictions_file_with_bytes_that_are_not_utf8_names_file_and_line(tmp_path, capsys):
    small = Path(__file__).parent / "assets" / "prepared"
    first = next(read_pairs(small / "final" / "test.jsonl", task_names())).id
    path = tmp_path / "run" / "predictions" / "final.jsonl"
    path.parent.mkdir(parents=True)
    path.write_bytes(b'{"id": "%s", "task": "final", "output": "Caf\xe9"}\n' % first.encode())
    code = main(["score", "--data", str(small), "--predictions", str(path.parent),
                 "--out", str(tmp_path / "run"), "--no-progress"])  # fmt: skip
    assert code == 1
    assert f"{path}:1: <encoding>: not UTF-8 text (byte 0xe9" in capsys.readouterr().err


def test_a_predictions_files_line_order_moves_no_figure_and_no_ci(scored_run, prepared_dir):
    """A resumed eval or a baseline's concurrent calls write the same predictions in another
    order: the figures and their bootstrap CIs are those of the gold split's order."""
    first, _, _, run_dir, _ = scored_run
    shuffled = run_dir.parent / "shuffled"
    for path in (run_dir / "predictions").glob("*.jsonl"):
        lines = path.read_text().splitlines(keepends=True)
        random.Random(1).shuffle(lines)
        (shuffled / "predictions").mkdir(parents=True, exist_ok=True)
        (shuffled / "predictions" / path.name).write_text("".join(reversed(lines)))
    judge = MatchingJudge(EchoJudge(), RequestCache(run_dir / "judge_cache.jsonl"))
    again, _ = run_score(
        ScoreOptions(
            prepared_dir, shuffled / "predictions", shuffled, judge=judge,
            bootstrap_resamples=50, progress=False,
        )
    )  # fmt: skip
    assert again["tasks"] == first["tasks"]


def test_a_dev_threshold_is_scored_beside_the_papers_and_compared(prepared_dir, tmp_path, capsys):
    """`fincheck score` on one split names the threshold that maximises its BAcc; handed to
    another run with --threshold, that run's BAcc at it stands beside the paper's BAcc at 0.5
    (recomputed by hand here), in results.json, the scored records, the report and compare."""
    predictions = tmp_path / "run" / "predictions"
    write_predictions(prepared_dir, predictions)
    args = ["score", "--data", str(prepared_dir), "--predictions", str(predictions)]
    assert main([*args, "--tasks", "qasem", "--out", str(tmp_path / "a"), "--bootstrap", "50"]) == 0
    plain = json.loads((tmp_path / "a" / "results.json").read_text())["tasks"]["qasem"]["overall"]
    threshold = plain["best_threshold"]["threshold"]
    assert "bacc_at_threshold" not in plain and 0 < threshold < 1
    out = tmp_path / "b"
    chosen = ["--tasks", "qasem", "--threshold", f"qasem={threshold}", "--bootstrap", "50"]
    assert main([*args, *chosen, "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    overall = results["tasks"]["qasem"]["overall"]
    assert results["run"]["thresholds"] == {"qasem": threshold}
    assert overall["bacc"] == plain["bacc"]  # the paper's protocol is untouched
    scored = [json.loads(line) for line in (out / "scored" / "qasem.jsonl").open()]
    yes = [r for r in scored if r["gold"] == "Yes"]
    no = [r for r in scored if r["gold"] == "No"]
    by_hand = (
        sum(r["score"] >= threshold for r in yes) / len(yes)
        + sum(r["score"] < threshold for r in no) / len(no)
    ) / 2
    assert overall["bacc_at_threshold"] == pytest.approx(by_hand)
    assert overall["bacc_at_threshold"] == pytest.approx(plain["best_threshold"]["bacc"])
    assert all(r["threshold"] == threshold for r in scored)
    assert (
        f"BAcc at the threshold {threshold} (`--threshold`, chosen on dev"
        in (out / "report.md").read_text()
    )
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "a"), str(out), "--bootstrap", "50"]) == 0
    assert "BAcc at the dev threshold" in capsys.readouterr().out
    for bad, said in (
        ("qasem=1.5", "0 < T < 1"),
        ("fhsumbench=0.5", "no p_yes to threshold"),
        ("qasem=0.5,qasem=0.7", "qasem=0.7: qasem was already given a value"),  # not the last
    ):
        assert main([*args, "--threshold", bad, "--out", str(tmp_path / "c")]) == 2
        assert said in capsys.readouterr().err


def test_a_hand_match_sheet_from_scored_runs_measures_a_judge(scored_run, prepared_dir, tmp_path):
    """scripts/final_hand_match_sheet.py draws items that need the judge from a scored run, in
    the shape --judge-check reads; filled by hand (here: the echo judge's own rule, each
    description matched to the same gold text), a judge that agrees has precision and recall 1."""
    import importlib.util

    from fincheck.tasks.final.judge_sanity import judge_agreement

    script = Path(__file__).resolve().parents[1] / "scripts" / "final_hand_match_sheet.py"
    spec = importlib.util.spec_from_file_location("sheet", script)
    sheet_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sheet_module)
    run_dir, sheet = scored_run[3], tmp_path / "sheet.jsonl"
    args = ["--data", str(prepared_dir), "--split", "test", "--scored", str(run_dir)]
    assert sheet_module.main([*args, "--names", "synthetic", "--n", "6", "--out", str(sheet)]) == 0
    items = [json.loads(line) for line in sheet.read_text().splitlines()]
    gold = {p.id: p for p in read_pairs(prepared_dir / "final" / "test.jsonl", task_names())}
    assert len(items) == 6 and len({i["id"] for i in items}) == 6
    for item in items:
        assert item["summary"] == gold[item["id"]].meta["summary"] and item["gold"]
        assert item["expected"] == {letter: "?" for letter in "ABCDEFGH"[: len(item["predicted"])]}
        for k, text in enumerate(item["predicted"]):  # by hand: the gold item of the same text
            found = [i for i, g in enumerate(item["gold"]) if g == text]
            item["expected"]["ABCDEFGH"[k]] = "ABCDEFGH"[found[0]] if found else None
    judge = MatchingJudge(EchoJudge(), RequestCache(tmp_path / "cache.jsonl"))
    with pytest.raises(FincheckError, match=r"sheet.jsonl:1: expected: .* not matched by hand yet"):
        judge_agreement(judge, path=sheet)  # unfilled: never measured as "no match"
    sheet.write_text("".join(json.dumps(i) + "\n" for i in items))
    agreement = judge_agreement(judge, path=sheet)
    assert agreement["agreement"] == agreement["match_precision"] == agreement["match_recall"] == 1
    filled = sheet.read_text()
    with pytest.raises(SystemExit):  # a filled sheet is never overwritten
        sheet_module.main([*args, "--out", str(sheet)])
    assert sheet.read_text() == filled


def test_final_flag_score_its_auc_and_a_dev_threshold_by_hand(prepared_dir, tmp_path, capsys):
    """FINAL's p_yes (a list against "None", read before the list): its ROC-AUC, the threshold
    that maximises binarized BAcc on one run, and a second run scored with it, where lists
    below the threshold are held back (the summary called consistent), all by hand."""
    pairs = list(read_pairs(prepared_dir / "final" / "test.jsonl", task_names()))
    listed = [p for p in pairs if p.target != "None"][:4]
    empty = [p for p in pairs if p.target == "None"][:4]
    scores = (0.9, 0.7, 0.6, 0.3, 0.8, 0.5, 0.4, 0.2)  # four inconsistent, four consistent
    flag = dict(zip((p.id for p in listed + empty), scores, strict=True))
    path = tmp_path / "run" / "predictions" / "final.jsonl"
    # the detector flags every summary, as the first three-task adapter did
    output = "A. The year is wrong."
    _write(
        path, [{"id": i, "task": "final", "output": output, "p_yes": p} for i, p in flag.items()]
    )
    args = ["score", "--data", str(prepared_dir), "--predictions", str(path.parent)]
    args += ["--tasks", "final", "--judge", "none", "--bootstrap", "20", "--no-progress"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    plain = json.loads((tmp_path / "a" / "results.json").read_text())["tasks"]["final"]
    # 11 of the 16 (inconsistent, consistent) pairs are ranked right
    assert plain["flag_auc"] == pytest.approx(11 / 16)
    assert plain["binary_bacc"] == 0.5  # everything flagged
    # sweeping up 0.2 0.3 0.4 0.5 | 0.6 0.7 0.8 0.9: at 0.55, 3 of 4 found, 3 of 4 passed
    assert plain["best_threshold"] == {"threshold": 0.55, "bacc": pytest.approx(0.75)}
    assert main([*args, "--threshold", "final=0.55", "--out", str(tmp_path / "b")]) == 0
    chosen = json.loads((tmp_path / "b" / "results.json").read_text())["tasks"]["final"]
    assert chosen["binary_bacc"] == pytest.approx(0.75)
    assert chosen["binary_precision"] == pytest.approx(3 / 4)  # 0.9 0.7 0.6 right, 0.8 wrong
    assert chosen["n_held_back"] == 4 and chosen["n_without_p_yes"] == 0
    scored = {
        r["id"]: r for r in map(json.loads, (tmp_path / "b" / "scored" / "final.jsonl").open())
    }
    assert {i for i, r in scored.items() if r.get("held_back")} == {
        i for i, p in flag.items() if p < 0.55
    }
    assert all(r["predicted"] == [] for r in scored.values() if r.get("held_back"))
    report = (tmp_path / "b" / "report.md").read_text()
    assert "Flagged by the threshold 0.55 on p_yes" in report and "4 lists held back" in report
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--bootstrap", "20"]) == 0
    assert "flag ROC-AUC" in capsys.readouterr().out
    # one prediction without p_yes: no AUC, and its list keeps the text's verdict
    records = [json.loads(line) for line in path.open()]
    del records[0]["p_yes"]
    _write(path, records)
    assert main([*args, "--threshold", "final=0.55", "--out", str(tmp_path / "c")]) == 0
    partial = json.loads((tmp_path / "c" / "results.json").read_text())["tasks"]["final"]
    assert partial["n_without_p_yes"] == 1 and "best_threshold" not in partial
    assert partial["flag_auc"] is None or math.isnan(partial["flag_auc"])
