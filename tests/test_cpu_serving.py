"""A fincheck adapter served on a CPU by llama.cpp: `fincheck export --gguf` (llama.cpp's own
converter, pinned), llama.cpp's OpenAI-compatible server on loopback (`python -m
llama_cpp.server`, with logprobs), and the same adapter run here. What a user relies on:

- the export records the adapter and base it came from, by content;
- served from a full-precision export (f32 here: llama.cpp's arithmetic, not a rounding of
  the weights), the detector's P(Yes) and flag score equal the local fp32 ones within 2e-3 and
  its greedy answers are the local ones (an f16 export's tolerance, 2e-3, and its greedy
  agreement are measured on the 0.5B detector: docs/serving.md);
- both servers a user may run, llama-cpp-python's (`python -m llama_cpp.server`) and
  llama.cpp's own C++ `llama-server`, give those scores and answers;
- `fincheck eval --backend openai` reads QASem's p_yes from the server's logprobs;
- a base the converter cannot take, a folder with no adapter and a server without logprobs
  are each one line.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from fincheck.commands.cli import main
from fincheck.errors import FincheckError

pytestmark = [pytest.mark.real_weights, pytest.mark.real_server, pytest.mark.slow]
SMALL = Path(__file__).parent / "assets" / "prepared"
# |served - local| P(Yes) for an f32 export against the fp32 adapter: below 1e-3 on CPUs with
# avx512, 0.0018 on one with AVX2 only (llama.cpp's kernels there); docs/serving.md's 2e-3
F32_TOLERANCE = 2e-3
DOC = (
    "The Riverside library opened in 1998 and lends about 40,000 books a year. Its reading "
    "room seats 120 people and stays open until 9 pm on weekdays."
)
SENTENCE = "The library, opened in 1998, seats 120 readers."
INPUTS = {
    "qasem": [
        {"text": DOC, "sentence": SENTENCE, "question": "When did the library open?",
         "answer": "in 1998"},
        {"text": DOC, "sentence": SENTENCE, "question": "How many readers does it seat?",
         "answer": "120"},
        {"text": DOC, "sentence": "It opened in 2005.", "question": "When did it open?",
         "answer": "in 2005"},
    ],
    "final": [
        {"text": DOC, "summary": "The library opened in 1998 and seats 120 people."},
        {"text": DOC, "summary": "The library opened in 2005 and has a cinema."},
    ],
}  # fmt: skip
INPUTS["fhsumbench"] = INPUTS["final"]


def llama_serving(gguf: Path, log: Path, *options: str, python: str = sys.executable):
    """llama-cpp-python's server on loopback with the export (and `options`), run by `python`
    (one with llama-cpp-python); yields its base URL."""
    options = options or ("--n_ctx", "2048")
    command = [python, "-m", "llama_cpp.server", "--model", str(gguf), *options, "--n_threads", "2"]
    return serving_on_loopback(command, log)


def llama_server_binary() -> Path:
    """llama.cpp's C++ server: $FINCHECK_LLAMA_SERVER (`make test` builds it and names it),
    else the one scripts/build_llama_server.py built, else the test is skipped."""
    from fincheck.serve.llama_server_build import built_llama_server

    named = os.environ.get("FINCHECK_LLAMA_SERVER")
    if named:
        assert Path(named).is_file(), f"$FINCHECK_LLAMA_SERVER={named} is no file"
        return Path(named)
    binary = built_llama_server()
    if binary is None:
        pytest.skip("no llama-server built (python scripts/build_llama_server.py)")
    return binary


def llama_server_serving(gguf: Path, log: Path, *options: str):
    """llama.cpp's C++ server on loopback with the export: one slot, no flash attention (its
    CPU kernel rounds queries to f16: FINAL's flag score 2.6e-3 off here), 2 threads."""
    options = options or ("-c", "2048", "-np", "1", "-fa", "off", "-cram", "0")
    command = [str(llama_server_binary()), "-m", str(gguf), *options, "-t", "2"]
    return serving_on_loopback(command, log)


@contextlib.contextmanager
def serving_on_loopback(command: list[str], log: Path):
    """`command` serving on a free loopback port (both servers spell --host and --port so);
    yields its base URL once it answers /v1/models."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with log.open("w") as out:
        process = subprocess.Popen(
            [*command, "--host", "127.0.0.1", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/models", timeout=2):
                    break
            except OSError:
                if process.poll() is not None or time.time() > deadline:
                    pytest.fail(f"{command[0]} did not start:\n{log.read_text()[-2000:]}")
                time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def export(run: Path, out: Path, *options: str) -> Path:
    assert main(["export", "--gguf", "--adapter", str(run), "--out", str(out), *options]) == 0
    return out / json.loads((out / "fincheck_export.json").read_text())["file"]


@pytest.fixture(scope="module")
def f32_export(smol_run, tmp_path_factory) -> Path:
    return export(smol_run, tmp_path_factory.mktemp("export") / "f32", "--type", "f32")


SERVERS = {"llama_cpp.server": llama_serving, "llama-server": llama_server_serving}


@pytest.fixture(scope="module", params=list(SERVERS))
def served_export(request, f32_export, tmp_path_factory):
    """The smol adapter exported in f32 and served by each server; (base URL, model name)."""
    log = tmp_path_factory.mktemp("server") / "server.log"
    with SERVERS[request.param](f32_export, log) as url:
        yield url, str(f32_export)


def test_the_export_records_the_adapter_and_base_it_came_from(smol_run, tmp_path, monkeypatch):
    """The default export: f16, one file and its record, named after the run's folder also when
    the adapter is given as `.` (it was named "-f16.gguf", and then not found)."""
    from gguf import GGUFReader
    from transformers import AutoTokenizer

    from fincheck.io.checksums import sha256_file
    from fincheck.io.runs import adapter_sha256

    monkeypatch.chdir(smol_run)
    gguf = export(Path("."), tmp_path / "f16")
    assert gguf.name == f"{smol_run.resolve().name}-f16.gguf"
    record = json.loads((gguf.parent / "fincheck_export.json").read_text())
    assert sorted(p.name for p in gguf.parent.iterdir()) == ["fincheck_export.json", gguf.name]
    assert record["type"] == "f16" and record["file_sha256"] == sha256_file(gguf)
    assert record["adapter_sha256"] == adapter_sha256(smol_run)
    assert record["base"] == "smollm2-135m-instruct" and len(record["base_content"]) == 64
    assert record["training_window"] == 384
    fields = GGUFReader(gguf).fields
    assert fields["general.architecture"].contents() == "llama"
    template = AutoTokenizer.from_pretrained(smol_run).chat_template
    assert fields["tokenizer.chat_template"].contents() == template  # the server renders it


def test_the_served_export_scores_as_the_adapter_run_here(smol_run, served_export):
    """The same inputs through `Detector` locally (fp32) and served (an f32 export): P(Yes)
    and FINAL's flag score within F32_TOLERANCE, and the same greedy answers."""
    from fincheck.detector import Detector

    url, model = served_export
    local = Detector.from_pretrained(adapter=smol_run, dtype="fp32", device="cpu")
    served = Detector.from_endpoint(url, model, tokenizer=smol_run)
    for task, records in INPUTS.items():
        here, there = local.detect(task, records), served.detect(task, records)
        for a, b in zip(here, there, strict=True):
            assert a["raw"] == b["raw"], task
            for score in ("p_yes", "flag_score"):
                if score in a:
                    assert abs(a[score] - b[score]) < F32_TOLERANCE, (task, a[score], b[score])


def test_eval_reads_qasem_p_yes_from_the_servers_logprobs(smol_run, served_export, tmp_path):
    url, model = served_export
    out = tmp_path / "served"
    assert main(["eval", "--backend", "openai", "--base-url", url, "--model", model,
                 "--tokenizer", str(smol_run), "--data", str(SMALL), "--tasks", "qasem",
                 "--concurrency", "1", "--no-progress", "--out", str(out)]) == 0  # fmt: skip
    lines = (out / "predictions" / "qasem.jsonl").read_text().splitlines()
    assert len(lines) == 6 and all(0 < json.loads(line)["p_yes"] < 1 for line in lines)


def test_a_server_without_logprobs_is_one_line_for_a_served_detector(smol_run, smollm2, tmp_path):
    """`transformers serve` returns no logprobs: a served detector cannot read a score."""
    from test_real_server import serving

    from fincheck.detector import Detector

    with serving(smollm2, tmp_path / "serve.log") as (url, name):
        served = Detector.from_endpoint(url, name, tokenizer=smol_run)
        with pytest.raises(FincheckError, match="returns no logprobs") as error:
            served.support("The cat sat.", "The cat sat.", "Who sat?", "the cat")
    assert "\n" not in str(error.value) and "llama_cpp.server" in str(error.value)


def test_a_base_the_converter_cannot_take_is_one_line(tiny_base, tmp_path, capsys):
    """The random-init test base has a tokenizer of its own, which llama.cpp's converter does
    not know: one line with the converter's reason, and no export folder left behind."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    adapter = tmp_path / "adapter"
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_base), LoraConfig(r=2))
    model.save_pretrained(adapter)
    out = tmp_path / "export"
    assert main(["export", "--gguf", "--adapter", str(adapter), "--out", str(out)]) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and "cannot convert this base" in errors[0], errors
    assert "pre-tokenizer was not recognized" in errors[0]  # the converter's own reason
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["adapter"]


def test_the_cards_cpu_serving_snippet_runs_as_written(smol_run, tmp_path):
    """The model card's llama.cpp block, on the demo adapter's published folder: its export,
    its server (the built llama-server, on a free port) and its eval, the data and output
    folders the only changes."""
    repo = tmp_path / "repo"
    assert main(["publish", "--checkpoint", str(smol_run), "--repo-id", "me/run",
                 "--dry-run", str(repo)]) == 0  # fmt: skip
    card = (repo / "README.md").read_text()
    block = re.search(r"served by llama\.cpp.*?```bash\n(.*?)```", card, flags=re.S).group(1)
    # the adapter folder (named "run", as the repo) for its hub id, whose base is a hub id too
    block = block.replace("me/run", str(smol_run)).replace("detector-gguf", str(tmp_path / "gguf"))
    export_line, serve_line, eval_line = map(shlex.split, block.strip().splitlines())
    assert export_line[0] == "fincheck" and main(export_line[1:]) == 0
    assert serve_line[0] == "llama-server" and serve_line[-1] == "&"
    served = dict(zip(serve_line[1:-1:2], serve_line[2:-1:2], strict=True))
    gguf = Path(served.pop("-m"))
    assert gguf.is_file() and served.pop("--port") == "8080"
    options = [item for pair in served.items() for item in pair]  # -c, -np, -fa, --alias
    with llama_server_serving(gguf, tmp_path / "server.log", *options) as url:
        args = [url if a == "http://127.0.0.1:8080/v1" else a for a in eval_line[1:]]
        args[args.index("--data") + 1] = str(SMALL)
        args[args.index("--out") + 1] = str(tmp_path / "served")
        assert main([*args, "--tasks", "qasem", "--no-progress"]) == 0
    lines = (tmp_path / "served" / "predictions" / "qasem.jsonl").read_text().splitlines()
    assert len(lines) == 6 and all(json.loads(line)["p_yes"] is not None for line in lines)


def test_a_converter_import_this_python_lacks_says_what_to_install(monkeypatch, tmp_path):
    """The converter runs in this Python: a package it imports that is not installed (the
    tokenizer library of SentencePiece bases) is named with the extra that holds it, rather
    than called a base the converter cannot convert."""
    import subprocess

    from fincheck.serve import llama_cpp_converter

    failed = subprocess.CompletedProcess(
        [],
        1,
        "",
        "Traceback (most recent call last):\n  ...\n"
        "ModuleNotFoundError: No module named 'sentencepiece'\n",
    )
    monkeypatch.setattr(llama_cpp_converter, "converter_dir", lambda: tmp_path)
    monkeypatch.setattr(llama_cpp_converter.subprocess, "run", lambda *a, **k: failed)
    with pytest.raises(FincheckError) as error:
        llama_cpp_converter.convert(tmp_path / "model", tmp_path / "m.gguf", "f16")
    assert "No module named 'sentencepiece'" in str(error.value)
    assert "pip install 'fincheck[llama-cpp]'" in str(error.value)
    assert "cannot convert this base" not in str(error.value)
