"""A real OpenAI-compatible server, not a fake: `transformers serve` on loopback serving the
real SmolLM2-135M-Instruct, and fincheck's detector evaluated through it
(`fincheck eval --backend openai` without --method) beside the same model run locally.

What the real server does that the fakes do not: it takes the model's folder as its model
name, applies the chat template itself, returns no logprobs (QASem is then scored from the
answers' text, and the report says so), and reports `finish_reason: "length"` with its usage."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from fincheck.commands.cli import main

pytestmark = [pytest.mark.real_server, pytest.mark.real_weights, pytest.mark.slow]
SMALL = Path(__file__).parent / "assets" / "prepared"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(folder: Path, log: Path):
    """`transformers serve` on loopback with `folder`'s model preloaded; yields (base URL,
    model name: the folder, as this server names its models)."""
    port = free_port()
    cli = Path(sys.executable).parent / "transformers"
    with log.open("w") as out:
        process = subprocess.Popen(
            [str(cli), "serve", "--host", "127.0.0.1", "--port", str(port), "--device", "cpu",
             "--dtype", "float32", str(folder)],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                if process.poll() is not None or time.time() > deadline:
                    pytest.fail(f"transformers serve did not start:\n{log.read_text()[-2000:]}")
                time.sleep(1)
        yield f"http://127.0.0.1:{port}/v1", str(folder)
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def served(smollm2, tmp_path_factory):
    """The real SmolLM2-135M-Instruct served; (base URL, model name)."""
    with serving(smollm2, tmp_path_factory.mktemp("serve") / "serve.log") as endpoint:
        yield endpoint


def _outputs(run: Path, task: str) -> dict[str, dict]:
    lines = (run / "predictions" / f"{task}.jsonl").read_text().splitlines()
    return {r["id"]: r for r in map(json.loads, lines)}


def test_a_merged_adapter_served_answers_as_the_adapter_run_locally(smol_run, tmp_path):
    """First in this file: its own server runs alone (the shared one below may still be
    finishing an abandoned long answer). The path of a user who serves a trained detector: `fincheck merge`, then the merged
    folder behind the server, evaluated with --tokenizer ADAPTER_DIR (the prompts fitted to the
    adapter's training length as its local eval fits them) beside `fincheck eval --adapter`.
    Merged and served in fp32, as the local eval runs on a CPU: the same weights, so greedy
    answers agree token for token (a bf16 merge rounds every weight, and a long answer may then
    take another word where two were nearly tied)."""
    merged = tmp_path / "merged"
    assert main(["merge", "--adapter", str(smol_run), "--dtype", "fp32", "--out", str(merged)]) == 0
    served_run, local_run = tmp_path / "served", tmp_path / "local"
    common = ["--data", str(SMALL), "--tasks", "final,fhsumbench", "--no-progress"]
    with serving(merged, tmp_path / "serve.log") as (base_url, name):
        assert main(["eval", "--backend", "openai", "--base-url", base_url, "--model", name,
                     "--tokenizer", str(smol_run), "--timeout", "600", "--out", str(served_run),
                     *common]) == 0  # fmt: skip
    assert main(["eval", "--adapter", str(smol_run), "--device", "cpu", "--out", str(local_run),
                 *common]) == 0  # fmt: skip
    served_config = json.loads((served_run / "predictions" / "eval_config.json").read_text())
    local_config = json.loads((local_run / "predictions" / "eval_config.json").read_text())
    assert served_config["window"] == local_config["window"] == 384  # the training length
    for task in ("final", "fhsumbench"):
        local, remote = _outputs(local_run, task), _outputs(served_run, task)
        assert local.keys() == remote.keys()
        assert all(local[i]["output"] == remote[i]["output"] for i in local), task


def test_a_served_detector_answers_as_the_local_one(served, smollm2, tmp_path):
    base_url, name = served
    served_run, local_run = tmp_path / "served", tmp_path / "local"
    common = ["--data", str(SMALL), "--no-progress"]
    # a CPU server writes a 384-token FINAL answer in about a minute: more than the default 60 s
    assert main(["eval", "--backend", "openai", "--base-url", base_url, "--model", name,
                 "--timeout", "600", "--out", str(served_run), *common]) == 0  # fmt: skip
    assert main(["eval", "--model", str(smollm2), "--dtype", "fp32", "--device", "cpu",
                 "--out", str(local_run), *common]) == 0  # fmt: skip
    config = json.loads((served_run / "predictions" / "eval_config.json").read_text())
    assert config["backend"] == "openai" and "method" not in config  # the eval path, not a method
    # greedy decoding of the same weights and the same chat template: the same answers
    for task in ("final", "fhsumbench"):
        local, remote = _outputs(local_run, task), _outputs(served_run, task)
        assert local.keys() == remote.keys()
        assert all(local[i]["output"] == remote[i]["output"] for i in local), task
    # no logprobs from this server: QASem has no P(Yes), and its report says it scored the text
    qasem = _outputs(served_run, "qasem")
    assert all("p_yes" not in r for r in qasem.values())
    assert main(["score", "--data", str(SMALL), "--predictions", str(served_run / "predictions"),
                 "--out", str(served_run), "--no-progress"]) == 0  # fmt: skip
    results = json.loads((served_run / "results.json").read_text())
    assert results["tasks"]["qasem"]["overall"]["n_scored_from_text"] == len(qasem)
    assert "not comparable with the paper's AUC" in (served_run / "report.md").read_text()


def test_the_real_server_reports_cut_answers_and_their_usage(served):
    """finish_reason "length" with usage at the budget: read as cut; a short answer is not."""
    from fincheck.models.llm_clients import METHOD, OpenAIChatClient

    base_url, name = served
    client = OpenAIChatClient(name, base_url=base_url, caller=METHOD)
    messages = [{"role": "user", "content": "Describe the sea in three long paragraphs."}]
    long = client.complete(messages, {"max_tokens": 5, "temperature": 0.0})
    assert long.cut is True and long.text
    short = client.complete(
        [{"role": "user", "content": "Reply with the single word: yes"}],
        {"max_tokens": 64, "temperature": 0.0},
    )
    assert short.cut is False


def test_the_papers_methods_and_the_judge_run_against_the_real_server(served, tmp_path):
    """e2e-cot and the FactScore-style pipeline through the real endpoint, then the served model
    as FINAL's judge: a 135M judge rarely writes the JSON matching asked for, and that is
    reported, never read as a match (exit 3 past the failure threshold, results still written)."""
    base_url, name = served
    endpoint = ["--backend", "openai", "--base-url", base_url, "--model", name]
    common = ["--data", str(SMALL), "--tasks", "final", "--limit", "2", "--no-progress"]
    for method in ("e2e-cot", "pipeline"):
        out = tmp_path / method
        args = ["baseline", "--method", method, *endpoint, "--llm-max-tokens", "48", *common]
        assert main([*args, "--out", str(out)]) == 0, method
        records = list(_outputs(out, "final").values())
        assert len(records) == 2 and all(isinstance(r["output"], str) for r in records)
        if method == "e2e-cot":  # 48 tokens rarely reach "Final Output:": marked, not misread
            assert all(r.get("cut") in (None, "answer", "reasoning") for r in records)
    run = tmp_path / "e2e-cot"
    code = main(["score", "--data", str(SMALL), "--predictions", str(run / "predictions"),
                 "--out", str(run), "--judge", "openai", "--judge-base-url", base_url,
                 "--judge-model", name, "--no-judge-sanity", "--no-progress"])  # fmt: skip
    results = json.loads((run / "results.json").read_text())
    final = results["tasks"]["final"]
    judged = final["n_needing_judge"]
    assert code in (0, 3)
    assert (code == 3) == (judged > 0 and final["n_judge_failed"] / final["n"] > 0.02)
    assert final["judged_with"]["base_url"].startswith(base_url)
