"""fincheck's detector as a metric of the RAG evaluators, with the real libraries: DeepEval's
`evaluate` and Ragas' `evaluate` run the metrics on a trained adapter, and their scores are
exactly 1 - `fincheck detect`'s FINAL flag score for the same (context, answer) pairs; the
reason is the description list; a test case without a grounding text is one line.

DeepEval's and Ragas' own pins (openai<2, click<8.4) differ from the rest of fincheck's, so
`make test` runs this file in a venv of its own (`make rag-venv`: .venv-rag); elsewhere it is
skipped. With $FINCHECK_LLAMA_SERVER_PYTHON (a Python with llama-cpp-python, set by `make
test`), the metrics also run on a served export."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from test_cpu_serving import llama_serving

from fincheck.commands.cli import main
from fincheck.errors import FincheckError

os.environ.setdefault("DEEPEVAL_TELEMETRY_OPT_OUT", "YES")  # no network here: no telemetry
os.environ.setdefault("RAGAS_DO_NOT_TRACK", "true")
deepeval = pytest.importorskip("deepeval", reason="the rag extra lives in .venv-rag")
ragas = pytest.importorskip("ragas", reason="the rag extra lives in .venv-rag")
pytestmark = [pytest.mark.real_weights, pytest.mark.slow]

CONTEXT = [
    "The Riverside library opened in 1998 and lends about 40,000 books a year.",
    "Its reading room seats 120 people and stays open until 9 pm on weekdays.",
]
ANSWERS = [
    "The library opened in 1998 and seats 120 people.",
    "The library opened in 2005 and has a cinema.",
]


@pytest.fixture(scope="module")
def detector(smol_run):
    from fincheck.detector import Detector

    return Detector.from_pretrained(adapter=smol_run, dtype="fp32", device="cpu")


@pytest.fixture(scope="module")
def detect_scores(smol_run, tmp_path_factory) -> list[dict]:
    """`fincheck detect` on the (context, answer) pairs, one call per pair as a metric asks."""
    folder = tmp_path_factory.mktemp("detect")
    records = []
    for n, answer in enumerate(ANSWERS):
        pairs, out = folder / f"pairs{n}.jsonl", folder / f"out{n}.jsonl"
        pairs.write_text(json.dumps({"text": "\n\n".join(CONTEXT), "summary": answer}) + "\n")
        assert main(["detect", "--adapter", str(smol_run), "--dtype", "fp32", "--device", "cpu",
                     "--input", str(pairs), "--out", str(out)]) == 0  # fmt: skip
        records += [r for r in map(json.loads, out.read_text().splitlines()) if "flag_score" in r]
    return records


def test_the_deepeval_metric_is_fincheck_detect_through_deepeval(
    detector, detect_scores, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # deepeval.evaluate keeps its cache in .deepeval/ of the cwd
    from deepeval import evaluate
    from deepeval.test_case import LLMTestCase

    from fincheck.serve.rag_metrics.deepeval_metric import FincheckMetric

    cases = [LLMTestCase(input="?", actual_output=a, retrieval_context=CONTEXT) for a in ANSWERS]
    metric = FincheckMetric(detector, threshold=0.5)
    for case, expected in zip(cases, detect_scores, strict=True):
        assert metric.measure(case) == 1.0 - expected["flag_score"]  # exactly
        assert metric.is_successful() == (metric.score >= 0.5)
        assert metric.descriptions == expected["descriptions"]
        assert all(d in metric.reason for d in expected["descriptions"])
    result = evaluate(cases, [FincheckMetric(detector)])  # the library's own runner
    scores = [t.metrics_data[0].score for t in result.test_results]
    assert sorted(scores) == sorted(1.0 - r["flag_score"] for r in detect_scores)


def test_the_ragas_metric_is_fincheck_detect_through_ragas(detector, detect_scores):
    from ragas import EvaluationDataset, evaluate

    from fincheck.serve.rag_metrics.ragas_metric import FincheckSupport

    dataset = EvaluationDataset.from_list(
        [{"user_input": "?", "response": a, "retrieved_contexts": CONTEXT} for a in ANSWERS]
    )
    result = evaluate(dataset, [FincheckSupport(detector=detector)], show_progress=False)
    scores = list(result.to_pandas()["fincheck_support"])
    assert scores == [1.0 - r["flag_score"] for r in detect_scores]


def test_a_test_case_without_a_grounding_text_is_one_line(detector):
    import asyncio

    from deepeval.test_case import LLMTestCase
    from ragas import SingleTurnSample

    from fincheck.serve.rag_metrics.deepeval_metric import FincheckMetric
    from fincheck.serve.rag_metrics.ragas_metric import FincheckSupport

    with pytest.raises(FincheckError, match="needs a grounding text") as deepeval_error:
        FincheckMetric(detector).measure(LLMTestCase(input="?", actual_output=ANSWERS[0]))
    sample = SingleTurnSample(user_input="?", response=ANSWERS[0], retrieved_contexts=[" "])
    with pytest.raises(FincheckError, match="needs a grounding text") as ragas_error:
        asyncio.run(FincheckSupport(detector=detector).single_turn_ascore(sample))
    for error in (deepeval_error, ragas_error):
        assert "\n" not in str(error.value)


def test_the_metrics_run_on_a_served_export(smol_run, detect_scores, tmp_path):
    """The export served by llama.cpp (f32: its scores are the local ones within 2e-3, the
    tolerance docs/serving.md states; 1.5e-3 measured on an AVX2-only CPU)."""
    python = os.environ.get("FINCHECK_LLAMA_SERVER_PYTHON")
    if not python:
        pytest.skip("no Python with llama-cpp-python named by $FINCHECK_LLAMA_SERVER_PYTHON")
    from deepeval.test_case import LLMTestCase

    from fincheck.detector import Detector
    from fincheck.serve.rag_metrics.deepeval_metric import FincheckMetric

    out = tmp_path / "f32"
    command = [python, "-m", "fincheck.commands.cli", "export", "--gguf", "--adapter",
               str(smol_run), "--type", "f32", "--out", str(out)]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True)
    gguf = out / json.loads((out / "fincheck_export.json").read_text())["file"]
    with llama_serving(gguf, tmp_path / "server.log", python=python) as url:
        served = FincheckMetric(Detector.from_endpoint(url, str(gguf), tokenizer=smol_run))
        for answer, expected in zip(ANSWERS, detect_scores, strict=True):
            case = LLMTestCase(input="?", actual_output=answer, retrieval_context=CONTEXT)
            assert abs(served.measure(case) - (1.0 - expected["flag_score"])) < 2e-3
            assert served.descriptions == expected["descriptions"]


def test_the_cards_metric_snippet_runs_as_written(smol_run, detect_scores, tmp_path):
    """The model card's DeepEval / Ragas block, on the demo adapter's published folder: the
    metrics it builds score as `fincheck detect`."""
    import re

    from deepeval.test_case import LLMTestCase

    repo = tmp_path / "repo"
    assert main(["publish", "--checkpoint", str(smol_run), "--repo-id", "me/run",
                 "--dry-run", str(repo)]) == 0  # fmt: skip
    card = (repo / "README.md").read_text()
    block = re.search(r"As a metric of DeepEval.*?```python\n(.*?)```", card, flags=re.S).group(1)
    names: dict = {}
    exec(block.replace("me/run", str(smol_run)), names)  # the card's code, the adapter for its id
    case = LLMTestCase(input="?", actual_output=ANSWERS[1], retrieval_context=CONTEXT)
    assert names["deepeval_metric"].measure(case) == 1.0 - detect_scores[1]["flag_score"]
    assert names["ragas_metric"].detector is names["detector"]
