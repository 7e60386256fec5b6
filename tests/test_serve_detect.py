"""`Detector` and `fincheck detect` on the tiny model: inputs built as in training, p(Yes)
computed by hand, trimming of long documents, batched = one by one, CLI in and out."""

from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path

import pytest
from serve_tiny_run import build_tiny_run

from fincheck.commands.cli import main
from fincheck.errors import FincheckError
from fincheck.models.loading import resolve_base
from fincheck.tasks import load_prompt

TEXT = (
    "The city council met on Monday and approved a budget of 4 million euros for the new "
    "library, which will open in 2026."
)
SUMMARY = "The council approved 5 million euros for a library on Friday."
SENTENCE = "The council approved 5 million euros."
LABELS = {"no_hallu", "factual_hallu", "non_factual_hallu", "invalid"}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_run(tmp_path_factory.mktemp("detect"))


@pytest.fixture(scope="module")
def detector(run_dir: Path):
    from fincheck.serve import Detector

    return Detector.from_pretrained(
        adapter=run_dir, device="cpu", max_new_tokens={"final": 24, "fhsumbench": 24}
    )


def test_default_base_is_the_runs_own_saved_base(detector, run_dir: Path):
    assert detector.run is not None
    assert resolve_base(detector.run) == str(run_dir / "base")
    assert detector.window == 1024  # the recipe's max_length, below the model's 4096 positions


def test_prompt_is_built_from_the_prompt_file_and_chat_template(detector):
    prompt, trimmed = detector.render("final", {"text": TEXT, "summary": SUMMARY}, 24)
    messages, _ = load_prompt("final").messages(text=TEXT, summary=SUMMARY)
    expected = detector.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    assert prompt == expected and not trimmed
    assert load_prompt("final").system in prompt and TEXT in prompt


def test_support_is_p_yes_over_yes_plus_no_at_the_first_position(detector):
    import torch

    from fincheck.data.prompting import NO_SPELLINGS, YES_SPELLINGS
    from fincheck.inference.generation import answer_spellings

    p = detector.support(TEXT, SENTENCE, "What did the council approve?", "5 million euros")
    prompt, _ = detector.render(
        "qasem",
        {
            "text": TEXT,
            "sentence": SENTENCE,
            "question": "What did the council approve?",
            "answer": "5 million euros",
        },
        8,
    )
    ids = detector.tokenizer(prompt, add_special_tokens=False)["input_ids"]

    def prob_of(seq: tuple[int, ...]) -> float:
        """P(seq | prompt) = product of next-token probabilities, one unpadded forward pass."""
        with torch.no_grad():
            logits = detector.model(input_ids=torch.tensor([ids + list(seq)])).logits[0].float()
        probs = torch.softmax(logits, -1)
        return math.prod(probs[len(ids) - 1 + k, tok].item() for k, tok in enumerate(seq))

    yes = sum(prob_of(s) for s in answer_spellings(detector.tokenizer, YES_SPELLINGS))
    no = sum(prob_of(s) for s in answer_spellings(detector.tokenizer, NO_SPELLINGS))
    assert p == pytest.approx(yes / (yes + no), abs=1e-5)
    assert 0.0 < p < 1.0


def test_describe_and_classify_return_parsed_outputs(detector):
    from fincheck.tasks.final.reader import parse_descriptions

    raw = detector.generate("final", [{"text": TEXT, "summary": SUMMARY}])[0]
    descriptions = detector.describe(TEXT, SUMMARY)
    assert descriptions == parse_descriptions(raw.text)
    assert all(isinstance(d, str) and d for d in descriptions)
    assert detector.classify(TEXT, SUMMARY) in LABELS


def test_batched_equals_one_by_one(detector):
    items = [
        (TEXT, SUMMARY),
        (TEXT + " It was a rainy day in the city.", "A library opens in 2026."),
    ]
    qas = [
        (TEXT, SENTENCE, "Who approved something?", "The council"),
        (TEXT, SENTENCE, "How much was approved?", "5 million euros"),
    ]
    assert detector.describe_batch(items) == [detector.describe(*i) for i in items]
    assert detector.classify_batch(items) == [detector.classify(*i) for i in items]
    batched = detector.support_batch(qas)
    single = [detector.support(*q) for q in qas]
    assert batched == pytest.approx(single, abs=1e-4)


def test_long_document_is_trimmed_on_the_grounding_text_with_a_warning(run_dir: Path, caplog):
    from fincheck.serve import Detector

    small = Detector.from_pretrained(
        adapter=run_dir, device="cpu", max_input_tokens=400, max_new_tokens={"final": 8}
    )
    long_text = " ".join(f"Sentence {i} says the council met on day {i}." for i in range(200))
    with caplog.at_level(logging.WARNING):
        prompt, trimmed = small.render("final", {"text": long_text, "summary": SUMMARY}, 8)
    assert trimmed and "document of" in caplog.text and "trimmed to fit" in caplog.text
    ids = small.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert len(ids) <= 400  # --max-input-tokens bounds the prompt, as in `fincheck eval`
    # Instructions and summary intact; the document kept from its start, cut at a word boundary
    # and marked with data-prep's trim marker (the cut training used).
    from fincheck.data.trimming import TRIM_MARKER

    assert SUMMARY in prompt and load_prompt("final").system in prompt
    kept = prompt.split("Text:\n", 1)[1].split("\n\nSummary:", 1)[0]
    assert kept.endswith(TRIM_MARKER)
    kept = kept[: -len(TRIM_MARKER)]
    assert long_text.startswith(kept) and 0 < len(kept) < len(long_text)
    assert long_text[len(kept)] == " "
    out = small.generate("final", [{"text": long_text, "summary": SUMMARY}])[0]
    assert out.trimmed


def test_input_too_long_without_the_document_is_a_clear_error(run_dir: Path):
    from fincheck.serve import Detector

    small = Detector.from_pretrained(adapter=run_dir, device="cpu", max_input_tokens=200)
    with pytest.raises(
        FincheckError,
        match=r"^final does not fit in 200 prompt tokens \(--max-input-tokens\) even with its "
        r"grounding text cut away: lower --max-new-tokens",
    ):
        small.render("final", {"text": TEXT, "summary": "word " * 400}, 8)


def test_pickle_only_adapter_is_refused(run_dir: Path, tmp_path: Path):
    from fincheck.serve import Detector

    bad = tmp_path / "pickled"
    bad.mkdir()
    shutil.copy(run_dir / "adapter_config.json", bad)
    (bad / "adapter_model.bin").write_bytes(b"not loaded")
    with pytest.raises(FincheckError, match="pickle files are not loaded"):
        Detector.from_pretrained(adapter=bad, device="cpu")


def test_cli_single_pair_prints_json(run_dir: Path, tmp_path: Path, capsys):
    (tmp_path / "t.txt").write_text(TEXT)
    (tmp_path / "s.txt").write_text(SUMMARY)
    code = main(
        [
            "detect",
            "--adapter",
            str(run_dir),
            "--text",
            str(tmp_path / "t.txt"),
            "--summary",
            str(tmp_path / "s.txt"),
            "--max-new-tokens",
            "16",
            "--device",
            "cpu",
        ]
    )
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["label"] in LABELS
    assert isinstance(result["descriptions"], list)
    # a random model's answer is rarely a list or a clear "none": then no verdict, said so
    if result["consistent"] is None:
        assert result["descriptions"] == [] and "no verdict" in result["warning"]
    else:
        assert result["consistent"] == (result["descriptions"] == [])
    assert result["trimmed"] is False


def test_cli_jsonl_in_jsonl_out_in_input_order(run_dir: Path, tmp_path: Path):
    lines = [
        {"id": "a", "text": TEXT, "summary": SUMMARY},
        {
            "id": "q1",
            "text": TEXT,
            "sentence": SENTENCE,
            "question": "Who approved?",
            "answer": "The council",
        },
        {"text": TEXT, "summary": "A library opens in 2026."},
    ]
    src = tmp_path / "pairs.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "results.jsonl"
    assert (
        main(
            [
                "detect",
                "--adapter",
                str(run_dir),
                "--input",
                str(src),
                "--out",
                str(out),
                "--max-new-tokens",
                "8",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    results = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["id"] for r in results] == ["a", "q1", "3"]
    assert results[0]["label"] in LABELS and isinstance(results[0]["descriptions"], list)
    assert 0.0 <= results[1]["p_yes"] <= 1.0
    assert results[1]["supported"] == (results[1]["p_yes"] >= 0.5)
    assert "descriptions" not in results[1]


def test_cli_bad_input_line_names_file_line_and_field(run_dir: Path, tmp_path: Path, capsys):
    src = tmp_path / "bad.jsonl"
    src.write_text(
        json.dumps({"text": TEXT, "summary": SUMMARY}) + "\n" + json.dumps({"text": TEXT}) + "\n"
    )
    assert main(["detect", "--adapter", str(run_dir), "--input", str(src)]) == 1
    assert f"{src}:2: summary: missing" in capsys.readouterr().err


def test_cli_duplicate_ids_are_refused_with_both_lines(run_dir: Path, tmp_path: Path, capsys):
    src = tmp_path / "dup.jsonl"
    line = {"id": "a1", "text": TEXT, "summary": SUMMARY}
    src.write_text("\n".join(json.dumps(x) for x in (line, {**line, "id": "b"}, line)) + "\n")
    assert main(["detect", "--adapter", str(run_dir), "--input", str(src)]) == 1
    assert f"{src}:3: id: 'a1' repeats line 1: ids must be unique" in capsys.readouterr().err


@pytest.mark.parametrize("id_text", ["NaN", "1e999", "-Infinity", "1.5", "true", "[1]"])
def test_an_input_id_that_is_no_string_or_integer_is_one_line(
    run_dir: Path, tmp_path: Path, capsys, id_text
):
    """An id is written back with each result: NaN or Infinity (which Python's JSON reads)
    would make the output no JSON, a float or a list no id a reader can match."""
    src = tmp_path / "ids.jsonl"
    body = json.dumps({"text": TEXT, "summary": SUMMARY})[1:]
    src.write_text('{"id": ' + id_text + ", " + body + "\n")
    assert main(["detect", "--adapter", str(run_dir), "--input", str(src)]) == 1
    assert f"{src}:1: id: expected a string or an integer" in capsys.readouterr().err


def test_cli_needs_one_input_form(run_dir: Path, capsys):
    assert main(["detect", "--adapter", str(run_dir)]) == 1
    assert "either --text FILE --summary FILE, or --input" in capsys.readouterr().err


def test_hub_adapter_id_fetches_the_published_repo_without_pickles(
    run_dir: Path, tmp_path: Path, monkeypatch
):
    """`Detector.from_pretrained(adapter="org/name")` (the card's snippet): the hub download is
    faked by copying a dry-run publish folder through huggingface_hub's own pattern filter."""
    from huggingface_hub.utils import filter_repo_objects

    from fincheck.serve import Detector
    from fincheck.serve.publish import PublishOptions, publish

    repo = tmp_path / "repo"
    publish(PublishOptions(run_dir, "me/tiny-detector", dry_run=repo))
    (repo / "training_args.bin").write_bytes(b"a pickle that must never be fetched")
    calls = []

    def fake_snapshot_download(repo_id: str, allow_patterns: list[str]) -> str:
        calls.append(repo_id)
        names = [p.relative_to(repo).as_posix() for p in repo.rglob("*") if p.is_file()]
        cache = tmp_path / "cache"
        for name in filter_repo_objects(names, allow_patterns=allow_patterns):
            (cache / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(repo / name, cache / name)
        return str(cache)

    monkeypatch.setattr("huggingface_hub.snapshot_download", fake_snapshot_download)
    detector = Detector.from_pretrained(
        adapter="me/tiny-detector", device="cpu", max_new_tokens={"fhsumbench": 8}
    )
    assert calls == ["me/tiny-detector"]
    assert not (tmp_path / "cache" / "training_args.bin").exists()
    assert (tmp_path / "cache" / "base" / "model.safetensors").is_file()
    assert resolve_base(detector.run) == str(tmp_path / "cache" / "base")
    assert detector.classify(TEXT, SUMMARY) in LABELS
    # `fincheck eval` takes the same hub id (its base read from the downloaded run)
    from fincheck.commands.cli import main

    small = Path(__file__).parent / "assets" / "prepared"
    out = tmp_path / "eval"
    argv = ["eval", "--adapter", "me/tiny-detector", "--data", str(small), "--tasks", "fhsumbench",
            "--limit", "1", "--max-new-tokens", "8", "--device", "cpu", "--out", str(out),
            "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    assert len((out / "predictions" / "fhsumbench.jsonl").read_text().splitlines()) == 1


def test_a_hub_that_never_delivers_the_adapter_is_given_up_on_at_the_deadline(monkeypatch):
    """`detect --adapter org/name` with a hub that stalls: one line at the download's deadline
    (the whole call, however its reads go), not a wait without end."""
    import time

    from fincheck.models import loading

    monkeypatch.setattr("huggingface_hub.snapshot_download", lambda *a, **k: time.sleep(60))
    monkeypatch.setattr(loading, "HUB_ADAPTER_DEADLINE_S", 0.5)
    start = time.monotonic()
    with pytest.raises(FincheckError, match=r"did not deliver the adapter me/slow within 0 s"):
        loading.local_adapter_dir("me/slow")
    assert time.monotonic() - start < 5


def test_an_empty_final_answer_is_no_verdict_not_consistent():
    from fincheck.tasks import all_tasks

    final = all_tasks()["final"]
    empty = final.detect_output("  \n", None)
    assert empty["consistent"] is None and "empty" in empty["warning"]
    assert final.detect_output("None", None) == {"descriptions": [], "consistent": True}
    flagged = final.detect_output("A. The year is wrong.", None)
    assert flagged == {"descriptions": ["The year is wrong."], "consistent": False}


def test_a_dev_threshold_holds_back_a_final_list_and_moves_qasem_s_cut():
    from fincheck.tasks import all_tasks

    final, qasem = all_tasks()["final"], all_tasks()["qasem"]
    listed = "A. The year is wrong."
    assert final.detect_output(listed, 0.69, 0.7) == {
        "descriptions": [],
        "consistent": True,
        "held_back": ["The year is wrong."],
        "flag_score": 0.69,
    }
    kept = final.detect_output(listed, 0.71, 0.7)
    assert kept["consistent"] is False and kept["flag_score"] == 0.71
    assert final.detect_output(listed, None, 0.7)["consistent"] is False  # no score: the text
    assert qasem.detect_output("Yes", 0.6)["supported"] is True  # the paper's 0.5
    assert qasem.detect_output("Yes", 0.6, 0.65)["supported"] is False


def test_cli_threshold_is_read_per_task(run_dir: Path, tmp_path: Path, capsys):
    """`fincheck detect --threshold final=T,qasem=T`: the same answers, read at the thresholds
    (just above each score here: the list held back, the QA unsupported)."""
    src = tmp_path / "pairs.jsonl"
    qa = {"text": TEXT, "sentence": SENTENCE, "question": "Who approved?", "answer": "The council"}
    src.write_text("".join(json.dumps(x) + "\n" for x in ({"text": TEXT, "summary": SUMMARY}, qa)))
    args = ["detect", "--adapter", str(run_dir), "--input", str(src), "--max-new-tokens", "8"]
    assert main([*args, "--out", str(tmp_path / "a.jsonl")]) == 0
    plain = [json.loads(x) for x in (tmp_path / "a.jsonl").read_text().splitlines()]
    flag, p_yes = plain[0]["flag_score"], plain[1]["p_yes"]
    # given once a task (argparse alone would keep the last flag and drop the first unsaid)
    above = ["--threshold", f"final={min(flag + 1e-4, 0.9999)}"]
    above += ["--threshold", f"qasem={min(p_yes + 1e-4, 0.9999)}"]
    assert main([*args, *above, "--out", str(tmp_path / "b.jsonl")]) == 0
    read = [json.loads(x) for x in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert read[0]["consistent"] is True and read[0]["descriptions"] == []
    assert read[0]["held_back"] == plain[0]["descriptions"] and read[0]["raw"] == plain[0]["raw"]
    assert read[1]["supported"] is False and read[1]["p_yes"] == p_yes
    assert main([*args, "--threshold", "fhsumbench=0.5"]) == 2  # no p_yes to threshold
    assert "fhsumbench has no p_yes to threshold" in capsys.readouterr().err
    assert main([*args, "--threshold", "qasem=0.5", "--threshold", "qasem=0.6"]) == 2
    assert "qasem=0.6: qasem was already given a value" in capsys.readouterr().err


def test_non_utf8_input_and_a_missing_out_folder_are_one_line_before_any_model(tmp_path, capsys):
    """Checked before the model loads (the model here does not even exist): nothing is lost."""
    from fincheck.commands.cli import main

    latin = tmp_path / "text.txt"
    latin.write_bytes("Caf\xe9 opened in 2020.\n".encode("latin-1"))
    (tmp_path / "summary.txt").write_text("It opened.")
    common = ["detect", "--adapter", str(tmp_path / "no-adapter"), "--device", "cpu"]
    assert main([*common, "--text", str(latin), "--summary", str(tmp_path / "summary.txt")]) == 1
    assert f"{latin}:1: not UTF-8 text (byte 0xe9)" in capsys.readouterr().err

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_bytes(b'{"id": "a", "text": "ok", "summary": "ok"}\n{"id": "b", "text": "\xff"}\n')
    assert main([*common, "--input", str(pairs)]) == 1
    assert f"{pairs}:2: <encoding>: not UTF-8 text (byte 0xff at column 22)" in (
        capsys.readouterr().err
    )

    good = tmp_path / "good.jsonl"
    good.write_text('{"id": "a", "text": "ok", "summary": "ok"}\n')
    out = tmp_path / "missing" / "out.jsonl"
    assert main([*common, "--input", str(good), "--out", str(out)]) == 1
    assert "does not exist; create it first" in capsys.readouterr().err

    dangling = tmp_path / "dangling.jsonl"  # a link to a file in a folder that does not exist
    dangling.symlink_to(tmp_path / "missing" / "out.jsonl")
    assert main([*common, "--input", str(good), "--out", str(dangling)]) == 1
    assert f"--out {dangling} exists; pick a new file" in capsys.readouterr().err
    assert not (tmp_path / "missing").exists()


def test_a_command_prints_fincheck_s_progress_and_only_a_library_s_warnings():
    """The commands' log set-up shows fincheck's own INFO lines but a library's only from
    WARNING up: torch's FakeTensor cache statistics (INFO, at exit) used to follow a detect
    interrupted during torch's import."""
    import subprocess
    import sys

    script = (
        "import logging\n"
        "from fincheck.io.messages import show_progress_lines\n"
        "show_progress_lines('%(name)s: %(message)s')\n"
        "logging.getLogger('torch._subclasses.fake_tensor').info('FakeTensor cache stats:')\n"
        "logging.getLogger('fincheck.train').info('step 1')\n"
        "logging.getLogger('httpx').warning('a warning')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "fincheck.train: step 1\nhttpx: a warning\n"
