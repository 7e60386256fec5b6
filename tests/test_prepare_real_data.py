"""`fincheck prepare` on the real benchmark files: counts, labels, splits, leakage, determinism.

Every expectation here is recomputed from the raw files, independently of the converters.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from fincheck.data.pairs import SPLITS, read_pairs
from fincheck.data_prep.prepare import PrepareConfig, run_prepare
from fincheck.tasks import task_names

TASKS = ("final", "qasem", "fhsumbench")


def raw_jsonl(path: Path) -> list[dict]:
    return [
        json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
    ]


def pairs_of(out: Path, task: str, split: str) -> list:
    path = out / task / f"{split}.jsonl"
    return list(read_pairs(path, task_names())) if path.exists() else []


def manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def test_qasem_counts_and_majority_labels(prepared_dir: Path, data_dir: Path) -> None:
    test_pairs = pairs_of(prepared_dir, "qasem", "test")
    assert len(test_pairs) == 1556  # evaluation split is never filtered
    raw = raw_jsonl(data_dir / "qasem" / "test.jsonl")
    # independent majority: 1 = NOT supported, so >= 2 ones of 3 -> "No"
    expected = Counter(
        "No" if sum(qa["annotations"]) >= 2 else "Yes" for r in raw for qa in r["qas"]
    )
    assert Counter(p.target for p in test_pairs) == expected == Counter({"Yes": 1025, "No": 531})
    for pair in test_pairs:
        assert pair.target == ("No" if sum(pair.meta["annotations"]) >= 2 else "Yes")
        assert pair.meta["dataset"] in {"cliff", "factscore", "verifiability"}
        for key in ("response_id", "sent_id", "qa_id", "predicate", "annotations"):
            assert key in pair.meta
    by_subset = Counter(p.meta["dataset"] for p in test_pairs)
    assert by_subset == Counter(r["dataset"] for r in raw for _ in r["qas"])
    before = manifest(prepared_dir)["counts_before_guard"]["qasem"]
    assert before["train"]["pairs"] + before["dev"]["pairs"] == 1542


def test_qasem_input_holds_sentence_question_answer(prepared_dir: Path, data_dir: Path) -> None:
    raw = raw_jsonl(data_dir / "qasem" / "test.jsonl")[0]
    qa = raw["qas"][0]
    pair = next(
        p
        for p in pairs_of(prepared_dir, "qasem", "test")
        if p.meta["source_line"] == 1 and p.meta["qa_id"] == qa["qa_id"]
    )
    user = pair.user_content
    assert f"Question: {qa['question']}" in user and f"Answer: {qa['answer']}" in user
    assert " 's " not in pair.grounding and " ." not in pair.grounding  # detokenized readably


def test_qasem_dev_split_grouped_by_source(prepared_dir: Path) -> None:
    """Several models' responses about one source share its document: the split keeps a
    source (subset:source id) on one side, so no dev QA asks about a training document."""
    train = pairs_of(prepared_dir, "qasem", "train")
    dev = pairs_of(prepared_dir, "qasem", "dev")
    assert (len(train), len(dev)) == (1114, 248)

    def sources(pairs):
        return {p.meta["response_id"].rsplit(":", 1)[0] for p in pairs}

    assert (len(sources(train)), len(sources(dev))) == (36, 7)
    assert not sources(train) & sources(dev)
    assert not {p.grounding for p in train} & {p.grounding for p in dev}
    assert {p.meta["source_split"] for p in train + dev} == {"dev"}


def test_fhsumbench_split_keeps_documents_together(prepared_dir: Path, data_dir: Path) -> None:
    raw = json.loads((data_dir / "fhsumbench" / "FHSumBench_data.json").read_text())
    source_of = {f"fhsumbench-{r['id']}": r["source"] for r in raw}
    label_of = {f"fhsumbench-{r['id']}": r["label"] for r in raw}
    assert len(raw) == 1336 and len(set(source_of.values())) == 466
    docs = {}
    for split in SPLITS:
        for pair in pairs_of(prepared_dir, "fhsumbench", split):
            docs.setdefault(source_of[pair.id], set()).add(split)
            expected = {
                "no_hallu": (True, True),
                "factual_hallu": (False, True),
                "non_factual_hallu": (False, False),
            }[label_of[pair.id]]
            judgement = json.loads(pair.target)
            assert (judgement["Faithfulness"], judgement["Factuality"]) == expected
    assert all(len(splits) == 1 for splits in docs.values())
    counts = manifest(prepared_dir)["counts_before_guard"]["fhsumbench"]
    total = sum(counts[s]["pairs"] for s in SPLITS)
    assert total == 1336
    assert counts["test"]["pairs"] == pytest.approx(0.5 * 1336, abs=25)


def test_final_from_defacto(prepared_dir: Path, data_dir: Path) -> None:
    raw = {r["doc_id"]: r for r in raw_jsonl(data_dir / "defacto" / "test.jsonl")}
    test = pairs_of(prepared_dir, "final", "test")
    assert len(test) == 1075
    for pair in test:
        record = raw[pair.meta["doc_id"]]
        assert pair.meta["summary"] == record["candidate"] and pair.grounding == record["article"]
        if record["has_error"]:
            lines = pair.target.split("\n")
            assert all(re.match(r"^[A-Z]+\. \S", line) for line in lines)
            assert len(lines) == len(pair.meta["descriptions"]) >= 1
        else:
            assert pair.target == "None"
    notes = manifest(prepared_dir)["notes"]["defacto_explanations"]
    assert notes["test"]["inconsistent"] == 779
    assert 0 < notes["test"]["split_into_several"] < 779


def test_a_detector_that_writes_its_targets_is_read_as_written(prepared_dir: Path) -> None:
    """What fincheck trains a detector to write, fincheck score must read back: every FINAL
    target, read as a model's answer, gives the descriptions it lists, but for the 11 of 2,551
    that word no problem ("A. This was a dual effort by scientists in both countries."), name
    none ("It attributes the quote ...") or report only an omission ("It leaves out ..."):
    those a reader cannot tell from restated facts or from "nothing to report", so they are
    counted apart (or as none), never guessed. An omission said with "nothing" ("A. Nothing
    mentioned about Ed Sheeran ...", "There's nothing about entertainment stories.") is a
    listed description, not a denial."""
    from fincheck.tasks.final.reader import listed_descriptions, read_descriptions

    read_otherwise = []
    n = 0
    for split in SPLITS:
        for pair in pairs_of(prepared_dir, "final", split):
            n += 1
            if read_descriptions(pair.target).items != listed_descriptions(pair.target):
                read_otherwise.append(pair.id)
    assert n == 2551 and len(read_otherwise) == 11, read_otherwise
    assert not {"defacto-train-2407", "defacto-test-44"} & set(read_otherwise)


def test_no_training_document_is_an_evaluation_document(prepared_dir: Path) -> None:
    def norm(text: str) -> str:
        return " ".join(re.sub(r"[^0-9a-z]+", " ", text.lower()).split())

    evaluation = {norm(p.grounding) for task in TASKS for p in pairs_of(prepared_dir, task, "test")}
    for task in TASKS:
        for split in ("train", "dev"):
            for pair in pairs_of(prepared_dir, task, split):
                assert norm(pair.grounding) not in evaluation, pair.id
    dropped = manifest(prepared_dir)["contamination"]["dropped"]
    # XSum documents shared across benchmarks, found by the guard
    assert dropped.get("qasem->final", 0) > 0 and dropped.get("fhsumbench->final", 0) > 0
    # and no training document is a dev document (what is chosen on dev is not memorised)
    dev = {norm(p.grounding) for task in TASKS for p in pairs_of(prepared_dir, task, "dev")}
    for task in TASKS:
        assert not {norm(p.grounding) for p in pairs_of(prepared_dir, task, "train")} & dev
    assert manifest(prepared_dir)["contamination"]["dev"]["dropped"] == {"final->final": 1}


def test_final_file_items_remove_their_defacto_twins(tmp_path: Path, data_dir: Path) -> None:
    config = PrepareConfig(
        final_file=str(data_dir / "final" / "paper_examples.jsonl"), tasks=["final"]
    )
    run_prepare(config, data_dir, tmp_path, progress=False, log=lambda _: None)
    test = pairs_of(tmp_path, "final", "test")
    assert [p.id for p in test] == [
        "defacto-train-815",
        "defacto-train-2185",
        "defacto-train-264",
        "defacto-test-89",
    ]
    assert test[3].target == "None" and test[0].target.startswith(
        "A. The summary says the events took place in Peru"
    )
    train_ids = {p.id for p in pairs_of(tmp_path, "final", "train")}
    assert not {"defacto-train-815", "defacto-train-2185", "defacto-train-264"} & train_ids
    assert len(train_ids) == 1000 - 3 - 1  # the three, and one that shares a dev document
    assert manifest(tmp_path)["contamination"]["dropped"] == {"final->final": 3}
    assert manifest(tmp_path)["contamination"]["dev"]["dropped"] == {"final->final": 1}


@pytest.mark.slow  # runs prepare again on the real files
def test_eval_all_config_trains_on_no_fhsumbench(tmp_path: Path, data_dir: Path) -> None:
    from fincheck.io.config import load_config

    repo = Path(__file__).resolve().parents[1]
    config = load_config(PrepareConfig, repo / "configs" / "prepare" / "paper-eval.yaml")
    run_prepare(config, data_dir, tmp_path, progress=False, log=lambda _: None)
    assert len(pairs_of(tmp_path, "fhsumbench", "test")) == 1336
    assert not (tmp_path / "fhsumbench" / "train.jsonl").exists()


@pytest.mark.slow  # runs prepare again on the real files
def test_outputs_are_byte_identical_and_loadable(
    tmp_path: Path, data_dir: Path, prepared_dir: Path
) -> None:
    run_prepare(PrepareConfig(), data_dir, tmp_path, progress=False, log=lambda _: None)
    files = sorted(p.relative_to(prepared_dir) for p in prepared_dir.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    for rel in files:
        assert (prepared_dir / rel).read_bytes() == (tmp_path / rel).read_bytes(), rel
    import datasets

    ds = datasets.load_dataset(
        "json", data_files=str(prepared_dir / "qasem" / "test.jsonl"), split="train"
    )
    assert len(ds) == 1556 and ds[0]["messages"][-1]["role"] == "assistant"


def test_manifest_records_inputs_prompts_and_counts(prepared_dir: Path) -> None:
    m = manifest(prepared_dir)
    assert set(m["inputs"]) == {
        "qasem/dev.jsonl",
        "qasem/test.jsonl",
        "fhsumbench/FHSumBench_data.json",
        "defacto/train.jsonl",
        "defacto/val.jsonl",
        "defacto/test.jsonl",
    }
    assert set(m["prompt_hashes"]) == {"final", "qasem", "fhsumbench"}
    for rel, info in m["files"].items():
        assert sum(1 for _ in (prepared_dir / rel).open()) == info["pairs"]
    assert m["counts"]["qasem"]["test"]["labels"] == {"No": 531, "Yes": 1025}
