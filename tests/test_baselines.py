"""The papers' systems as baselines: pure parts by hand, every method end to end against the
fake OpenAI-compatible server (a 429 and malformed answers included), and on a local model."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from fake_judge_server import FakeJudgeServer

from fincheck.commands.cli import main
from fincheck.data.pairs import read_pairs
from fincheck.data.sentences import split_sentences
from fincheck.eval.baselines.final_methods import (
    Merge,
    bullets,
    merge_descriptions,
    parse_fact_check,
    run_two_step,
)
from fincheck.eval.baselines.fizz import choose_threshold, label_indices, windows
from fincheck.eval.baselines.methods import Example, last_yes_no
from fincheck.tasks import task_names

REPO = Path(__file__).resolve().parents[1]
SMALL = REPO / "tests" / "assets" / "prepared"

# ---------------------------------------------------------------------- pure parts


def test_sentences_split_on_end_marks_before_a_capital_and_short_ones_drop():
    text = 'He said "Go." Then he left! Was it 3 p.m.? 42 people came. ok. U.S. troops stayed.'
    assert split_sentences(text) == [
        'He said "Go."',
        "Then he left!",
        "Was it 3 p.m.?",
        "42 people came. ok.",
        "U.S. troops stayed.",
    ]
    assert split_sentences(text, min_chars=13) == [  # 13 characters or fewer drop
        "Was it 3 p.m.?",
        "42 people came. ok.",
        "U.S. troops stayed.",
    ]


def test_sentences_keep_titles_initials_and_abbreviations_as_punkt_does():
    """FIZZ splits with NLTK's punkt, which does not break after "Mr." or "U.S."."""
    text = (
        "Mr. Smith met Dr. Jones in the U.S. Army base. J. K. Rowling wrote it in Jan. 2020. "
        "Sales rose, e.g. Shoes sold. The end."
    )
    assert split_sentences(text) == [
        "Mr. Smith met Dr. Jones in the U.S. Army base.",
        "J. K. Rowling wrote it in Jan. 2020.",
        "Sales rose, e.g. Shoes sold.",
        "The end.",
    ]


def test_bullets_and_per_fact_answers():
    assert bullets("Facts:\n- A is B.\n* C is D.\n1. E.\nnot a bullet\n  -   F  ") == [
        "A is B.",
        "C is D.",
        "E.",
        "F",
    ]
    assert parse_fact_check("Yes, it is stated.\n- stray") == (True, [])
    assert parse_fact_check("No.\n- The text says 34, not 43.\n- No arrest.") == (
        False,
        ["The text says 34, not 43.", "No arrest."],
    )
    assert parse_fact_check("**No**\n- x") == (False, ["x"])
    assert parse_fact_check("- The date is wrong.") == (False, ["The date is wrong."])
    assert parse_fact_check("I am not sure.") == (None, [])


def test_the_merge_keeps_what_matches_maps_near_matches_and_counts_fallbacks():
    """The dedup step must keep descriptions word for word (FINAL paper, E.2.5); a model that
    edits one item no longer loses the whole merge."""
    originals = ["The age is wrong.", "The woman's age differs.", "No charge was made."]
    merge = merge_descriptions("A. The age is wrong.\nB. No charge was made.", originals)
    assert merge == Merge(["The age is wrong.", "No charge was made."], 2, 0, 0, False)
    assert merge_descriptions("A. the  age is WRONG.", originals).kept == ["The age is wrong."]
    # one item edited (a word changed), one kept: both map to their originals
    edited = merge_descriptions("A. The age was wrong.\nB. No charge was made.", originals)
    assert edited == Merge(["The age is wrong.", "No charge was made."], 1, 1, 0, False)
    # an item that is no original is dropped and counted; the rest stands
    added = merge_descriptions("A. The age is wrong.\nB. A new claim entirely.", originals)
    assert added == Merge(["The age is wrong."], 1, 0, 1, False)
    # nothing usable: the un-merged list, counted as a fallback
    fallback = merge_descriptions("I merged them.", originals)
    assert fallback.kept == originals and fallback.fallback
    assert fallback.counts()["merge_fallbacks"] == 1


def test_granularity_windows_contain_the_best_sentence_and_stay_inside():
    assert windows(10, 5) == [(5,), (4, 5), (5, 6), (3, 4, 5), (4, 5, 6), (5, 6, 7)]
    assert windows(3, 0) == [(0,), (0, 1), (0, 1, 2)]
    assert windows(2, 1) == [(1,), (0, 1)]
    assert windows(1, 0) == [(0,)]


def test_threshold_maximises_dev_balanced_accuracy_ties_to_the_later():
    scores = [0.1, 0.2, 0.3, 0.8, 0.9]
    consistent = [False, False, False, True, True]
    # score > t separates the classes for every t in [0.3, 0.8): percentiles 50 to 74.8 of the
    # dev scores; the tie goes to the last, 74.8: position 0.748 * 4 = 2.992 -> 0.3 + 0.992 * 0.5
    assert choose_threshold(scores, consistent) == pytest.approx(0.796)


def test_nli_labels_come_from_the_config():
    assert label_indices({0: "ENTAILMENT", 1: "CONTRADICTION", 2: "NEUTRAL"}) == {
        "entailment": 0,
        "contradiction": 1,
        "neutral": 2,
    }
    assert (
        label_indices({"0": "contradiction", "1": "entailment", "2": "neutral"})["entailment"] == 1
    )
    from fincheck.errors import FincheckError

    with pytest.raises(FincheckError, match="do not name entailment"):
        label_indices({0: "LABEL_0", 1: "LABEL_1"})


def test_nli_labels_of_fact_verification_models_and_unnamed_ones():
    """VitaminC's names (the FIZZ paper's NLI model was trained on SUPPORTS / REFUTES / NOT
    ENOUGH INFO); unnamed labels take --nli-labels in index order, or the paper's order for the
    paper's own model, with a notice."""
    from fincheck.errors import FincheckError

    vitaminc = {0: "REFUTES", 1: "NOT ENOUGH INFO", 2: "SUPPORTS"}
    assert label_indices(vitaminc) == {"entailment": 2, "contradiction": 0, "neutral": 1}
    unnamed = {0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"}
    order = ("neutral", "entailment", "contradiction")
    assert label_indices(unnamed, order) == {"neutral": 0, "entailment": 1, "contradiction": 2}
    notices: list[str] = []
    paper = label_indices(
        unnamed, model_name="tals/albert-xlarge-vitaminc-mnli", notice=notices.append
    )
    assert paper == {"entailment": 0, "contradiction": 1, "neutral": 2}
    assert len(notices) == 1 and "FIZZ" in notices[0]
    with pytest.raises(FincheckError, match="--nli-labels entailment,contradiction,neutral"):
        label_indices(unnamed, model_name="someone/other-nli")
    with pytest.raises(FincheckError, match="once each"):
        label_indices(unnamed, ("entailment", "entailment", "neutral"))
    with pytest.raises(FincheckError, match="once each"):
        label_indices({0: "LABEL_0", 1: "LABEL_1"}, ("entailment", "contradiction", "neutral"))


def test_the_final_yes_or_no_of_a_reasoned_answer():
    """Only the final-answer line counts (FINAL paper prompt E.3: "end your response with final
    answer: yes or no only"); a yes or no in the reasoning is not the answer."""
    assert last_yes_no("No wait... yes.\nFinal answer: No") == "No"
    assert last_yes_no("Every claim checks out.\n**Final Answer:** yes") == "Yes"
    assert last_yes_no("Step 1 ...\nFinal answer - No.") == "No"
    assert last_yes_no("The date matches.\n\nYes.") == "Yes"
    assert last_yes_no("There is no evidence for the date in the text.") is None
    assert last_yes_no("It is supported, so yes") is None
    assert last_yes_no("Unclear.") is None


class CountingLLM:
    """A stand-in for CachedLLM: scripted answers by the first matching trigger, calls counted."""

    last_cut = None  # no answer hits a budget

    def __init__(self, script: dict[str, str]) -> None:
        self.script, self.calls = script, 0

    def ask(self, messages, version, span=None, max_tokens=None) -> str:
        self.calls += 1
        text = messages[-1]["content"]
        return next(answer for trigger, answer in self.script.items() if trigger in text)


def final_examples() -> list[Example]:
    return [Example.of(p) for p in read_pairs(SMALL / "final" / "test.jsonl", task_names())]


def test_fizz_drops_atomic_facts_of_ten_characters_or_fewer():
    """FIZZ's reference code keeps facts longer than 10 characters."""
    from fincheck.eval.baselines.fizz import Entailment, fizz_score

    def nli(pairs):
        return [Entailment(0.9, 0.05, 0.05) for _ in pairs]

    llm = CountingLLM({"": "- He won.\n- The council approved the new library."})
    _, trace = fizz_score(final_examples()[0], llm, nli)
    assert set(trace["facts"]) == {"The council approved the new library."}
    # and splits the LLM's facts into sentences again: a bullet of two sentences is two facts
    llm = CountingLLM({"": "- The council met on Monday. It approved the new library."})
    _, trace = fizz_score(final_examples()[0], llm, nli)
    assert set(trace["facts"]) == {"- The council met on Monday.", "It approved the new library."}


def test_fizz_fact_units_follow_the_reference_code_on_any_answer():
    """FIZZ's code joins each decomposition answer's lines and the answers themselves, then
    splits sentences: a bullet without a final period runs into the next, a prose answer is
    split by sentence, an answer's first "- " stays, and two answers meet without a space."""
    from fincheck.eval.baselines.fizz import reference_fact_units

    assert reference_fact_units(["- Rees is the mayor\n- Rees opened a bridge."]) == [
        "- Rees is the mayor Rees opened a bridge."
    ]
    assert reference_fact_units(["Rees is the mayor of Bristol. He opened a new bridge."]) == [
        "Rees is the mayor of Bristol.",
        "He opened a new bridge.",
    ]
    assert reference_fact_units(
        ["- Rees is the mayor.\n- The bridge is new.", "- It rained all day."]
    ) == ["- Rees is the mayor.", "The bridge is new.- It rained all day."]


def test_two_step_routes_consistent_summaries_to_none_without_step_2():
    from fincheck.eval.baselines.final_methods import STEP1

    example = final_examples()[0]
    llm = CountingLLM({"Final answer": "All supported.\nFinal answer: yes"})
    out = run_two_step(example, llm, STEP1["self"], "cot")
    assert (out.output, llm.calls, out.trace["step1_consistent"]) == ("None", 1, True)
    llm = CountingLLM({"contains factually": "Final Output:\nA. Wrong date.", "Final answer": "no"})
    out = run_two_step(example, llm, STEP1["self"], "cot-hint")
    assert (out.output, llm.calls) == ("Final Output:\nA. Wrong date.", 2)
    llm = CountingLLM({"Final answer": "I cannot tell.", "Final Output": "Final Output:\nNone"})
    out = run_two_step(example, llm, STEP1["self"], "cot")  # unreadable step 1: goes on
    assert llm.calls == 2 and out.trace["step1_consistent"] is None
    oracle = STEP1["oracle"]
    for ex in final_examples():
        llm = CountingLLM({"Final Output": "Final Output:\nA. x"})
        out = run_two_step(ex, llm, oracle, "cot")
        gold_consistent = not ex.pair.meta_value("descriptions", list)
        assert (out.output == "None") == gold_consistent and llm.calls == (
            0 if gold_consistent else 1
        )


# ---------------------------------------------------------------------- end to end, fake server


def _eval(out: Path, server: FakeJudgeServer, method: str, *extra: str) -> int:
    return main(
        [
            "baseline", "--method", method, "--backend", "openai", "--model", "fake-gpt",
            "--base-url", server.base_url, "--data", str(SMALL), "--out", str(out),
            "--max-retries", "2", "--concurrency", "2", "--no-progress", *extra,
        ]
    )  # fmt: skip


def _score(out: Path) -> dict:
    args = ["score", "--data", str(SMALL), "--predictions", str(out / "predictions")]
    assert main([*args, "--out", str(out), "--bootstrap", "0", "--no-progress"]) == 0
    return json.loads((out / "results.json").read_text())


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_e2e_on_every_task_over_an_endpoint_retries_reads_logprobs_and_resumes(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-never-written")
    out = tmp_path / "run"
    with FakeJudgeServer() as server:
        server.script = {
            # FINAL: a 429 first (retried, honouring retry-after-ms), then a list
            "factual inconsistency in the summary": [
                ("status", 429, {"retry-after-ms": "5"}),
                ("ok", "A. The summary gives the wrong year."),
            ],
            # FHSumBench: prose the reference parser cannot read (invalid), for every summary
            "Faithfulness: the information": [("ok", "I think it is faithful.")],
            # QASem: logprobs at the first token give P(Yes)
            "QA pair supported": [("logprobs", "Yes", {"Yes": math.log(0.6), "No": math.log(0.2)})],
        }
        assert _eval(out, server, "e2e") == 0
        first = len(server.requests)
        # 4 FINAL examples + the one retried after the 429
        assert server.calls_for("factual inconsistency in the summary") == 5
        # a rerun sends nothing: every prediction is there
        assert _eval(out, server, "e2e") == 0
        assert len(server.requests) == first
    qasem = _lines(out / "predictions" / "qasem.jsonl")
    assert all(r["p_yes"] == pytest.approx(0.75) and r["output"] == "Yes" for r in qasem)
    results = _score(out)
    assert results["run"]["method"] == "e2e" and results["run"]["backend"] == "openai"
    assert results["tasks"]["fhsumbench"]["n_parse_failed"] == 4  # the prose: invalid
    assert results["tasks"]["final"]["n"] == 4
    assert results["run"]["llm_calls_per_example"] == {
        "final": 1.0,
        "qasem": 2.0,
        "fhsumbench": 1.0,
    }
    for path in out.rglob("*"):
        if path.is_file():
            assert "sk-test-never-written" not in path.read_text(errors="ignore"), path


def _completion(top: list | None, choices: bool = True, logprobs=None) -> str:
    """A chat completion body as an endpoint may send it, `Infinity` included (Python's json
    writes and reads it, as the openai client does); `logprobs` replaces the whole object."""
    logprobs = logprobs or {"content": [{"token": "Yes", "logprob": 0.0, "top_logprobs": top}]}
    choice = {"index": 0, "message": {"role": "assistant", "content": "Yes"},
              "finish_reason": "stop", "logprobs": logprobs}  # fmt: skip
    return json.dumps(
        {
            "id": "c",
            "object": "chat.completion",
            "created": 0,
            "model": "served-7b",
            "choices": [choice] if choices else [],
        }
    )


@pytest.mark.parametrize(
    ("reply", "what"),
    [
        (_completion([{"token": "Yes", "logprob": math.inf, "bytes": None}]), "no log-probab"),
        (_completion([{"token": "Yes", "logprob": math.nan, "bytes": None}]), "no log-probab"),
        (_completion(None, choices=False), "a reply with no choices"),
        (_completion(None, logprobs="x"), "logprobs that are no list of tokens"),
        (_completion(None, logprobs={"content": {"0": 1}}), "logprobs that are no list of"),
        (_completion(None).replace('"content": "Yes"', '"content": 7'), "a message with no text"),
        ('{"id": "c", "choices": [{"index": 0, "mess', "a reply that is not JSON"),
    ],
)
def test_a_malformed_p_yes_reply_fails_the_example_and_a_rerun_asks_again(
    tmp_path, capsys, reply, what
):
    """A 200 reply to the P(Yes) call with an infinite or NaN logprob, no choices, or broken
    JSON: the examples fail (exit 3; 1 once five replies in a row are no chat completion: the
    run stops), one line, nothing is cached as "no P(Yes)" and no NaN is
    written; a rerun against the healthy endpoint asks again and reads P(Yes)."""
    out = tmp_path / "run"
    healthy = ("logprobs", "Yes", {"Yes": math.log(0.6), "No": math.log(0.2)})
    with FakeJudgeServer() as server:
        server.script = {"QA pair supported": [("raw", reply, "logprobs")]}
        # no retries here (retrying a malformed reply: test_eval_judge.py)
        assert _eval(out, server, "e2e", "--tasks", "qasem", "--max-retries", "0") in (1, 3)
        err = capsys.readouterr().err
        assert what in err and "Traceback" not in err
        predictions = out / "predictions" / "qasem.jsonl"
        assert not predictions.exists() or predictions.read_text() == ""
        server.script = {"QA pair supported": [healthy]}
        assert _eval(out, server, "e2e", "--tasks", "qasem") == 0
    qasem = _lines(predictions)
    assert qasem and all(r["p_yes"] == pytest.approx(0.75) for r in qasem)


def test_the_model_named_in_the_replies_is_recorded(tmp_path):
    """A router may serve another model than the one asked for: the name the replies carry
    goes beside the predictions and into results.json."""
    out = tmp_path / "run"
    with FakeJudgeServer() as server:
        server.script = {"QA pair supported": [("raw", _completion(None), "always")]}
        assert _eval(out, server, "e2e", "--tasks", "qasem") == 0
    config = json.loads((out / "predictions" / "eval_config.json").read_text())
    assert config["served_models"] == ["served-7b"]
    assert _score(out)["run"]["served_models"] == ["served-7b"]


def test_a_resume_answered_by_another_served_model_stops_before_writing(tmp_path, capsys):
    """What the endpoint said it served is compared, never overwritten: a resume whose
    endpoint now serves another model (a router switched, another server on the port) stops
    at its first reply, writing nothing, so one predictions file never holds two models'
    answers; the same model finishes the run."""
    out = tmp_path / "run"
    other = _completion(None).replace("served-7b", "served-70b")
    with FakeJudgeServer() as server:
        server.script = {"QA pair supported": [("raw", _completion(None), "always")]}
        assert _eval(out, server, "e2e", "--tasks", "qasem") == 0
        predictions = out / "predictions" / "qasem.jsonl"
        lines = predictions.read_text().splitlines(keepends=True)
        predictions.write_text("".join(lines[:2]))  # a run stopped after two answers
        (out / "llm_cache.jsonl").unlink()  # the rest is asked again, not read from the cache
        server.script = {"QA pair supported": [("raw", other, "always")]}
        capsys.readouterr()
        assert _eval(out, server, "e2e", "--tasks", "qasem") == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "answered as 'served-70b', but the answers this run" in err[0]
        assert "answered by served-7b" in err[0] and "use another --out" in err[0]
        assert predictions.read_text() == "".join(lines[:2])
        server.script = {"QA pair supported": [("raw", _completion(None), "always")]}
        assert _eval(out, server, "e2e", "--tasks", "qasem") == 0
        assert len(predictions.read_text().splitlines()) == len(lines)
        config_file = out / "predictions" / "eval_config.json"
        assert json.loads(config_file.read_text())["served_models"] == ["served-7b"]
        assert _eval(out, server, "e2e", "--tasks", "qasem") == 0  # nothing left to ask
        config = json.loads(config_file.read_text())
        assert config["served_models"] == ["served-7b"], "a rerun that asked nothing erased it"
        # a run killed before its record was written: each cached answer keeps who served it
        del config["served_models"]
        config_file.write_text(json.dumps(config))
        predictions.write_text("".join(lines[:2]))
        cached = (out / "llm_cache.jsonl").read_text().splitlines(keepends=True)
        (out / "llm_cache.jsonl").write_text("".join(cached[:2]))
        server.script = {"QA pair supported": [("raw", other, "always")]}
        assert _eval(out, server, "e2e", "--tasks", "qasem") == 1
        # (an example whose calls are all among the cached two may be written: served-7b's)
        assert set(predictions.read_text().splitlines(keepends=True)) <= set(lines)


def test_a_served_detector_killed_before_its_record_refuses_another_served_model(tmp_path):
    """`eval --backend openai` keeps who served each answer in its request cache, as a baseline
    does: a run killed before its folder's record was written (no `served_models`) still
    refuses a resume answered by another model, writing nothing."""
    top = [{"token": "Yes", "logprob": -0.1}, {"token": "No", "logprob": -2.4}]
    served = _completion(top)
    out = tmp_path / "served"
    args = ["eval", "--backend", "openai", "--base-url", "", "--model", "served", "--data",
            str(SMALL), "--out", str(out), "--tasks", "qasem", "--no-progress"]  # fmt: skip
    with FakeJudgeServer() as server:
        args[4] = server.base_url
        server.script = {"": [("raw", served, "always")]}
        assert main(args) == 0
        predictions = out / "predictions" / "qasem.jsonl"
        config_file = out / "predictions" / "eval_config.json"
        lines = predictions.read_text().splitlines(keepends=True)
        config = json.loads(config_file.read_text())
        assert config["served_models"] == ["served-7b"] and len(lines) > 2
        del config["served_models"]  # killed before the record: its answers in the cache only
        config_file.write_text(json.dumps(config))
        predictions.write_text("".join(lines[:2]))
        cached = (out / "llm_cache.jsonl").read_text().splitlines(keepends=True)
        (out / "llm_cache.jsonl").write_text("".join(cached[:2]))
        server.script = {"": [("raw", served.replace("served-7b", "served-70b"), "always")]}
        assert main(args) == 1
        # (an example whose calls are all among the cached two may be written: served-7b's)
        assert set(predictions.read_text().splitlines(keepends=True)) <= set(lines)
        server.script = {"": [("raw", served, "always")]}
        assert main(args) == 0  # the same model finishes it
        assert len(predictions.read_text().splitlines()) == len(lines)


def test_a_limit_for_a_task_the_run_does_not_answer_is_refused(tmp_path, capsys):
    """`--limit final=3` where the run answers QASem alone (by --tasks, or because the method
    covers only QASem) would be read by nothing while QASem runs whole: one line, before
    anything runs. A spec naming QASem among others (shared by the demo's commands) is read."""
    base = ["baseline", "--method", "overlap", "--data", str(SMALL), "--no-progress"]
    for tasks in (["--tasks", "qasem"], []):
        out = tmp_path / f"run{len(tasks)}"
        assert main([*base, *tasks, "--limit", "final=3", "--out", str(out)]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--limit names final, none of which this run answers" in err[0]
        assert not (out / "predictions" / "qasem.jsonl").exists()
    assert main([*base, "--limit", "qasem=3,final=2", "--out", str(tmp_path / "ok")]) == 0


def test_the_pipeline_decomposes_checks_and_merges_with_its_calls_counted(tmp_path, capsys):
    out = tmp_path / "pipe"
    with FakeJudgeServer() as server:
        server.script = {
            "Break the sentence": [("ok", "- Fact one.\n- Fact two.")],
            "Fact: Fact one.": [("ok", "no\n- The year is wrong.\n- The place is not stated.")],
            "Fact: Fact two.": [("ok", "no\n- The year is not 2020.")],
            "remove duplicates": [("ok", "A. The year is wrong.\nB. The place is not stated.")],
        }
        assert _eval(out, server, "pipeline", "--tasks", "final") == 0
        trace_file = out / "predictions" / "final.trace.jsonl"
        written = trace_file.read_text()
        damages = ("[1]", '{"id": "x"}', '{"id": "x", "calls": "2"}', '{"id": "x", "calls": -7}')
        for damaged in (*damages, '{"id": "x", "calls": 1' + "0" * 400 + "}"):  # edited, resumed
            trace_file.write_text(written + damaged + "\n")
            capsys.readouterr()
            assert _eval(out, server, "pipeline", "--tasks", "final") == 1
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and re.search(r"final\.trace\.jsonl:\d+: ", err[0]), err
        trace_file.write_text(written)
    outputs = {r["id"]: r["output"] for r in _lines(out / "predictions" / "final.jsonl")}
    assert set(outputs.values()) == {"A. The year is wrong.\nB. The place is not stated."}
    traces = _lines(out / "predictions" / "final.trace.jsonl")
    sentences = {t["id"]: len(t["facts"]) // 2 for t in traces}  # two facts per sentence
    for trace in traces:  # sentences decomposed + 2 checks each + one merge
        assert trace["calls"] == sentences[trace["id"]] * 3 + 1
    assert _score(out)["run"]["llm_calls_per_example"]["final"] > 3


def test_two_step_with_the_oracle_and_a_malformed_step_2(tmp_path):
    out = tmp_path / "two"
    with FakeJudgeServer() as server:
        server.script = {"contains factually": [("ok", "I refuse to answer.")]}
        args = ["--tasks", "final", "--step1", "oracle", "--step2", "cot-hint"]
        assert _eval(out, server, "two-step", *args) == 0
    gold = {
        p.id: p.meta["descriptions"]
        for p in read_pairs(SMALL / "final" / "test.jsonl", task_names())
    }
    outputs = {r["id"]: r["output"] for r in _lines(out / "predictions" / "final.jsonl")}
    for pair_id, output in outputs.items():
        assert (output == "None") == (not gold[pair_id])
    results = _score(out)
    assert results["run"]["method"] == "two-step:oracle+cot-hint"
    # step 2 reasons, and "I refuse to answer." never reached its "Final Output:": no
    # description, counted apart (not read as prose)
    final = results["tasks"]["final"]
    assert final["n_without_final_output"] == sum(1 for g in gold.values() if g)
    assert final["n_unstructured"] == 0
    assert final["binary_recall"] == 0


def test_an_unknown_task_for_the_method_and_a_missing_model_are_clear(tmp_path, capsys):
    with FakeJudgeServer() as server:
        assert _eval(tmp_path / "x", server, "pipeline", "--tasks", "qasem") == 1
    assert "--method pipeline covers final, not qasem" in capsys.readouterr().err
    args = ["baseline", "--method", "e2e", "--data", str(SMALL), "--out", str(tmp_path / "y")]
    assert main(args) == 2  # a usage error, as `fincheck eval` without --model
    assert "--method needs --model" in capsys.readouterr().err


# ---------------------------------------------------------------------- local models


@pytest.fixture(scope="module")
def tiny_nli(tiny_base, tmp_path_factory) -> Path:
    """A random 2-layer BERT NLI classifier with the tiny tokenizer, built from a config."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(tiny_base)
    config = BertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=1024, num_labels=3,
        id2label={0: "contradiction", 1: "entailment", 2: "neutral"},
        label2id={"contradiction": 0, "entailment": 1, "neutral": 2},
    )  # fmt: skip
    out = tmp_path_factory.mktemp("nli") / "nli"
    BertForSequenceClassification(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.mark.parametrize(
    ("id2label", "flags", "entailment_index"),
    [
        ({0: "contradiction", 1: "entailment", 2: "neutral"}, [], 1),
        ({0: "REFUTES", 1: "NOT ENOUGH INFO", 2: "SUPPORTS"}, [], 2),
        ({0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"}, ["--nli-labels", "neutral,contradiction,entailment"], 2),
    ],
)  # fmt: skip
def test_fizz_reads_each_label_style_of_a_saved_nli_model(
    tiny_base, tmp_path, id2label, flags, entailment_index
):
    """A random NLI model saved with each label style: the entailment probability FIZZ uses is
    the softmax output at the right index, and the labels used are recorded."""
    import torch
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        BertConfig,
        BertForSequenceClassification,
    )

    from fincheck.eval.baselines.fizz import NLIScorer

    tokenizer = AutoTokenizer.from_pretrained(tiny_base)
    config = BertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=1024, num_labels=3, id2label=id2label,
        label2id={v: k for k, v in id2label.items()},
    )  # fmt: skip
    torch.manual_seed(0)
    folder = tmp_path / "nli"
    BertForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)

    labels = tuple(flags[1].split(",")) if flags else None
    scorer = NLIScorer(str(folder), "cpu", labels=labels)
    premise, hypothesis = "The library opens in 2027.", "The library opens in 2025."
    got = scorer([(premise, hypothesis)])[0]
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        probs = torch.softmax(
            model(**tokenizer(premise, hypothesis, return_tensors="pt")).logits, -1
        )[0]
    assert got.entailment == pytest.approx(probs[entailment_index].item(), abs=1e-6)

    out = tmp_path / "fizz"
    args = ["baseline", "--method", "fizz", "--model", str(tiny_base), "--data", str(SMALL),
            "--llm-max-tokens", "8", "--tasks", "fhsumbench", "--limit", "4", "--nli-model",
            str(folder), *flags, "--out", str(out), "--no-progress"]  # fmt: skip
    assert main(args) == 0
    config_seen = json.loads((out / "predictions" / "eval_config.json").read_text())
    assert config_seen["nli_labels"] == (list(labels) if labels else None)
    # the NLI model by its content: the same folder changed in place is another run's
    assert config_seen["nli_model"].startswith(f"{folder.name} sha256:")


def test_an_nli_model_that_scores_nan_is_one_line_not_a_label(tiny_nli, tmp_path):
    """FIZZ turns entailment probabilities into FHSumBench's labels: NaN from the NLI model
    (its head's weights NaN) would read as "not entailed", a label never computed."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from fincheck.errors import FincheckError
    from fincheck.eval.baselines.fizz import NLIScorer

    folder = tmp_path / "nli"
    shutil.copytree(tiny_nli, folder)
    tensors = load_file(folder / "model.safetensors")
    for name in [k for k in tensors if k.startswith("classifier")]:
        tensors[name] = torch.full_like(tensors[name], float("nan"))
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(FincheckError, match="NLI score is not a number"):
        NLIScorer(str(folder), "cpu")([("The sky is blue.", "The sky is green.")])


def test_unnamed_nli_labels_without_an_order_fail_clearly(tiny_base, tmp_path, capsys):
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(tiny_base)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=64, num_labels=3)  # fmt: skip
    BertForSequenceClassification(config).save_pretrained(tmp_path / "nli")
    tokenizer.save_pretrained(tmp_path / "nli")
    args = ["baseline", "--method", "fizz", "--model", str(tiny_base), "--data", str(SMALL),
            "--tasks", "fhsumbench", "--limit", "2", "--nli-model", str(tmp_path / "nli"),
            "--out", str(tmp_path / "fizz"), "--no-progress"]  # fmt: skip
    assert main(args) != 0
    assert "--nli-labels entailment,contradiction,neutral" in capsys.readouterr().err


@pytest.mark.slow  # 5 s: every method on the tiny model
def test_every_method_runs_on_a_local_model(tiny_base, tiny_nli, tmp_path):
    common = ["--model", str(tiny_base), "--data", str(SMALL), "--llm-max-tokens", "8"]
    for method, extra in (
        ("e2e", []),
        ("e2e-fewshot", []),
        ("e2e-cot", []),
        ("pipeline", []),
        ("two-step", ["--step1", "self"]),
        ("fizz", ["--nli-model", str(tiny_nli)]),
    ):
        out = tmp_path / method
        args = ["baseline", "--method", method, *common, "--out", str(out), "--no-progress", *extra]
        assert main(args) == 0, method
        results = _score(out)
        expected = {"pipeline": {"final"}, "two-step": {"final"}, "fizz": {"final", "fhsumbench"}}
        assert set(results["tasks"]) == expected.get(method, {"final", "qasem", "fhsumbench"})
    config = json.loads((tmp_path / "fizz" / "predictions" / "eval_config.json").read_text())
    assert {"fizz_threshold_final", "fizz_threshold_fhsumbench"} <= set(config)
    trace = _lines(tmp_path / "fizz" / "predictions" / "final.trace.jsonl")[0]
    assert trace["kept"] and trace["score"] == min(s["t"] for s in trace["scores"].values())


# ---------------------------------------------------------------------- word overlap


def test_word_overlap_is_the_share_of_the_answers_words_in_the_reference():
    from fincheck.eval.baselines.methods import word_overlap

    reference = "The council approved a budget of 4 million euros on Monday."
    assert word_overlap("4 million euros", reference) == 1.0
    assert word_overlap("5 million euros", reference) == 2 / 3
    assert word_overlap("the the budget, Tuesday", reference) == 3 / 4  # repeats count, case off
    assert word_overlap("—", reference) == 0.0


def test_overlap_runs_without_a_model_and_scores_like_p_yes(tmp_path, capsys):
    from fincheck.data.pairs import read_pairs
    from fincheck.eval.baselines.methods import Example, word_overlap

    out = tmp_path / "overlap"
    args = [
        "baseline",
        "--method",
        "overlap",
        "--data",
        str(SMALL),
        "--out",
        str(out),
        "--no-progress",
    ]
    assert main(args) == 0  # every task asked for: overlap covers QASem alone
    records = _lines(out / "predictions" / "qasem.jsonl")
    pairs = {p.id: p for p in read_pairs(SMALL / "qasem" / "test.jsonl", task_names())}
    assert sorted(r["id"] for r in records) == sorted(pairs)
    for r in records:
        fields = Example.of(pairs[r["id"]]).fields
        assert r["p_yes"] == word_overlap(fields["answer"], fields["text"])
        assert r["output"] == ("Yes" if r["p_yes"] >= 0.5 else "No")
    assert not (out / "predictions" / "final.jsonl").exists()
    assert "qasem" in _score(out)["tasks"]
    capsys.readouterr()
    for flag in (["--model", "m"], ["--backend", "openai"], ["--window", "512"]):
        assert main([*args[:3], *flag, *args[3:]]) == 2  # a usage error, never ignored
        assert "--method overlap; leave it out" in capsys.readouterr().err


def test_a_torn_last_trace_line_does_not_break_a_rerun(tmp_path):
    """A full disk (or a kill) mid-write leaves the trace's last line without its end: the rerun
    drops that partial record, finishes, and leaves a trace of whole JSON lines."""
    out = tmp_path / "overlap"
    args = [
        "baseline",
        "--method",
        "overlap",
        "--data",
        str(SMALL),
        "--out",
        str(out),
        "--no-progress",
    ]
    assert main(args) == 0
    trace = out / "predictions" / "qasem.trace.jsonl"
    predictions = out / "predictions" / "qasem.jsonl"
    data = trace.read_bytes()
    trace.write_bytes(data[:-15])  # the last record cut short
    lines = predictions.read_text().splitlines(keepends=True)
    predictions.write_text("".join(lines[:-1]))  # its prediction was not written either
    assert main(args) == 0
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len(records) == len(lines) and trace.read_text().endswith("\n")


@pytest.mark.parametrize("variant", ["e2e", "e2e-fewshot", "e2e-cot"])
def test_qasem_baselines_show_article_and_qa_only_as_the_paper(variant):
    """The paper's verifier sees the ARTICLE and the QA (QASem paper, Table 5): no response
    sentence in the query, nor in a worked example."""
    from fincheck.eval.baselines.methods import e2e_prompt
    from fincheck.tasks import all_tasks

    prompt = e2e_prompt("qasem", variant)
    assert "sentence" not in prompt.fields
    messages, _ = prompt.messages(text="ARTICLE TEXT", question="Who won?", answer="PSG")
    shown = "\n".join(m["content"] for m in messages)
    assert "sentence" not in shown.lower()
    # the detector's own prompt does show it, and every QASem report says so
    assert "response sentence" in all_tasks()["qasem"].comparability


def test_a_reasoning_answer_cut_before_its_final_output_is_marked():
    """Step 2's CoT answer hit its budget: before "Final Output:" it is marked "reasoning" (no
    descriptions to read), after it "answer"; cut_kind says the same for any FINAL CoT."""
    from fincheck.eval.baselines.final_methods import STEP1
    from fincheck.eval.baselines.methods import cut_kind

    class CutLLM(CountingLLM):
        last_cut = True

    example = final_examples()[0]
    llm = CutLLM({"Final answer": "Final answer: no", "": "1. The summary says 2025.\n2. The"})
    assert run_two_step(example, llm, STEP1["self"], "cot").cut == "reasoning"
    llm = CutLLM({"Final answer": "Final answer: no", "": "1. Checked.\nFinal Output:\nA. The"})
    assert run_two_step(example, llm, STEP1["self"], "cot").cut == "answer"
    assert cut_kind("1. step", None, True, "final") is None
    assert cut_kind("1. step", False, True, "final") is None
    assert cut_kind("A. partial", True, False, "final") == "answer"
    # a task whose reasoning answers carry no "Final Output:" label reads a cut one as it is
    assert cut_kind("1. step", True, True, "fhsumbench") == "answer"


def test_what_the_final_baselines_do_not_reproduce_is_said_where_users_meet_it(tmp_path, capsys):
    """The paper's TrueTeacher step 1 is refused by name, and every FINAL report says the paper
    chose the better of two prompt variants per model while fincheck runs one."""
    from fincheck.tasks import all_tasks

    args = ["baseline", "--method", "two-step", "--step1", "trueteacher", "--model", "m",
            "--data", str(SMALL), "--tasks", "final", "--out", str(tmp_path / "run")]  # fmt: skip
    assert main(args) != 0
    assert "TrueTeacher classifier is not offered" in capsys.readouterr().err
    assert "better of two prompt variants" in all_tasks()["final"].comparability


def test_an_endpoint_that_refuses_every_request_stops_and_says_so(tmp_path, capsys):
    """HTTP 400 on every call: no "next: fincheck score" for a run with no answer, a non-zero
    exit, and the client's breaker stops after a run of refusals instead of sending them all."""
    from fincheck.errors import FincheckError
    from fincheck.inference.llm import LLMCallError
    from fincheck.models.llm_clients import OpenAIChatClient

    with FakeJudgeServer() as server:
        server.script = {"": [("status", 400, {})]}
        assert _eval(tmp_path / "run", server, "e2e", "--tasks", "final") == 3
        out = capsys.readouterr()
        assert "next: fincheck score" not in out.out and "4 example(s) failed" in out.err

        client = OpenAIChatClient("fake-gpt", base_url=server.base_url, max_consecutive_refused=3)
        messages = [{"role": "user", "content": "hi"}]
        for _ in range(2):
            with pytest.raises(LLMCallError):
                client.complete(messages, {"max_tokens": 8})
        with pytest.raises(FincheckError, match="refused 3 requests in a row"):
            client.complete(messages, {"max_tokens": 8})


def test_an_unreachable_endpoint_is_named_with_the_callers_own_options(tmp_path, capsys):
    """`fincheck baseline` talks of --base-url and --timeout, never of the judge's options."""
    args = ["baseline", "--method", "e2e", "--backend", "openai", "--model", "m",
            "--base-url", "http://127.0.0.1:9/v1", "--timeout", "2", "--max-retries", "0",
            "--concurrency", "1", "--data", str(SMALL), "--out", str(tmp_path / "run"),
            "--no-progress"]  # fmt: skip
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "the endpoint http://127.0.0.1:9/v1/ is unreachable" in err
    assert "check --base-url" in err and "--timeout" in err and "--judge" not in err


@pytest.mark.parametrize(
    ("stop", "code", "said"), [("SIGINT", 130, "interrupted"), ("SIGTERM", 143, "terminated")]
)
def test_ctrl_c_stops_at_once_with_a_call_in_flight(tmp_path, stop, code, said):
    """An endpoint that holds every call: Ctrl-C ends the command within seconds (no wait for
    the calls in flight), exit 130, and nothing answered is lost; SIGTERM (`kill`, `timeout`)
    the same way, through the command's own way out, exit 143."""
    import signal
    import subprocess
    import sys
    import time

    fincheck = Path(sys.executable).parent / "fincheck"
    with FakeJudgeServer() as server:
        server.script = {"": [("sleep", 30, "A. late")]}
        process = subprocess.Popen(
            [str(fincheck), "baseline", "--method", "e2e", "--backend", "openai", "--model", "m",
             "--base-url", server.base_url, "--tasks", "final", "--data", str(SMALL),
             "--out", str(tmp_path / "run"), "--no-progress"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            # as from a terminal: a shell's background job (`cmd &`) starts with SIGINT ignored
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )  # fmt: skip
        deadline = time.time() + 20
        while not server.requests and time.time() < deadline:
            time.sleep(0.1)
        assert server.requests, "no call reached the server"
        started = time.time()
        process.send_signal(getattr(signal, stop))
        _, err = process.communicate(timeout=20)
        assert time.time() - started < 10
    assert process.returncode == code and f"fincheck baseline: {said}" in err


def test_a_served_detector_fits_its_prompts_with_the_tokenizer_as_a_local_eval_does(
    tiny_base, tmp_path
):
    """--tokenizer, --window and --max-input-tokens: the prompts sent are those a local eval
    with the same options builds (grounding text cut to fit), and the answers are asked with the
    budget fitted to the window (a quarter of it)."""
    from fincheck.models.loading import load_prompt_fitter

    out = tmp_path / "served"
    with FakeJudgeServer() as server:
        server.script = {"": [("ok", "Yes")]}
        code = main(["eval", "--backend", "openai", "--base-url", server.base_url, "--model",
                     "served", "--data", str(SMALL), "--out", str(out), "--tokenizer",
                     str(tiny_base), "--window", "512", "--max-input-tokens", "330",
                     "--tasks", "final", "--no-progress"])  # fmt: skip
        assert code == 0
    fitter = load_prompt_fitter(str(tiny_base), 512)
    sent = {json.dumps(r["messages"]) for r in server.requests}
    trimmed = 0
    for pair in read_pairs(SMALL / "final" / "test.jsonl", task_names()):
        fit = fitter.fit_for_answer(pair.prompt_messages, pair.meta["grounding_span"], 128, 330)
        assert json.dumps(fit.messages) in sent
        trimmed += fit.trimmed
    assert trimmed == 2  # two of the four prompts are longer than 330 tokens
    # each summary: its answer at the fitted budget, and its first word's share (p_yes, 1 token)
    assert sorted(r["max_tokens"] for r in server.requests) == [1] * 4 + [128] * 4
    config = json.loads((out / "predictions" / "eval_config.json").read_text())
    assert config["tokenizer"].startswith(f"{tiny_base.name} sha256:") and config["window"] == 512


def test_a_served_eval_resumed_after_its_tokenizer_changed_in_place_is_refused(
    tiny_base, tmp_path, capsys
):
    """--tokenizer names a folder by path; a new chat template written into it changes every
    prompt sent: a rerun finishing the stopped eval would mix the two prompt forms."""
    import shutil

    tokenizer = tmp_path / "tokenizer"
    shutil.copytree(tiny_base, tokenizer)
    out = tmp_path / "served"
    with FakeJudgeServer() as server:
        server.script = {"": [("ok", "Yes")] * 20}
        args = ["eval", "--backend", "openai", "--base-url", server.base_url, "--model",
                "served", "--data", str(SMALL), "--out", str(out), "--tokenizer",
                str(tokenizer), "--tasks", "final", "--no-progress"]  # fmt: skip
        assert main(args) == 0
        predictions = out / "predictions" / "final.jsonl"
        first = predictions.read_text().splitlines(keepends=True)[0]
        predictions.write_text(first)  # stopped after one prediction
        config_path = tokenizer / "tokenizer_config.json"
        config = json.loads(config_path.read_text())
        config["chat_template"] = "{% for m in messages %}### {{ m['content'] }}\n{% endfor %}"
        config_path.write_text(json.dumps(config))
        (tokenizer / "chat_template.jinja").unlink(missing_ok=True)
        capsys.readouterr()
        assert main(args) == 1
    err = capsys.readouterr().err
    # the tokenizer folder's content (its recorded identity), and what it fits prompts with
    assert "holds predictions of a different run (tokenizer" in err
    assert predictions.read_text() == first


def test_the_method_table_is_the_clis_choices_and_a_task_left_out_is_said(tmp_path, capsys):
    """`--method` offers the table's keys, nothing registers itself elsewhere; a method that
    does not cover every task of the run names those it leaves out (an error when --tasks
    named them)."""
    from fincheck.eval.baselines.registry import METHODS
    from fincheck.eval.options import BaselineOptions, parse_method

    assert [parse_method(name) for name in METHODS] == list(METHODS)
    assert "detector" not in METHODS  # a served detector is `fincheck eval --backend openai`
    out = tmp_path / "run"
    args = ["baseline", "--method", "overlap", "--data", str(SMALL), "--out", str(out)]
    assert main([*args, "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "--method overlap does not cover final, fhsumbench: left out" in printed
    assert [p.name for p in (out / "predictions").glob("*.jsonl") if "trace" not in p.name] == [
        "qasem.jsonl"
    ]
    assert main([*args[:-1], str(tmp_path / "named"), "--tasks", "qasem,final"]) == 1
    assert "--method overlap covers qasem, not final" in capsys.readouterr().err
    assert BaselineOptions.__dataclass_fields__.keys().isdisjoint({"tokenizer", "max_input_tokens"})
