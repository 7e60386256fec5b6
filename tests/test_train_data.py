"""Training data: loss only on the target (+ EOS) on real prepared pairs, trimming, mixture."""

from __future__ import annotations

from pathlib import Path

import pytest

from fincheck.data.pairs import Pair, read_pairs
from fincheck.errors import FincheckError
from fincheck.inference.generation import count_tokens, render_chat
from fincheck.tasks import task_names
from fincheck.train.data import DataMixture, fit_pair, mix_pairs

TASKS = task_names()


def chat_length(tokenizer, messages) -> int:
    """Tokens of the whole conversation through the chat template (what training sees)."""
    return count_tokens(tokenizer, render_chat(tokenizer, messages, add_generation_prompt=False))


REPO = Path(__file__).resolve().parents[1]


def tiny_tokenizer():
    from fincheck.train.tiny_model import build_tiny_tokenizer

    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def masked_run(prepared_dir, tmp_path_factory, monkeypatch_module):
    """A tiny-cpu trainer on 4 real prepared pairs of each task (TRL's own tokenization)."""
    from fincheck.train.sft import build_trainer, load_training_recipe

    tmp = tmp_path_factory.mktemp("mask")
    mixture = tmp / "mix.yaml"
    mixture.write_text(
        "max_examples: {final: 4, qasem: 4, fhsumbench: 4}\nmin_grounding_kept: 0.0\n"
    )
    monkeypatch_module.chdir(REPO)
    recipe = load_training_recipe(
        REPO / "configs/train/tiny-cpu.yaml",
        [
            f"--dataset_dir={prepared_dir}",
            f"--data_config={mixture}",
            f"--output_dir={tmp / 'run'}",
            "--deepspeed=",
        ],
    )
    return build_trainer(recipe)


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_labels_cover_exactly_the_target_and_eos_for_every_task(masked_run, prepared_dir):
    trainer = masked_run.trainer
    tok = trainer.processing_class
    assert tok.pad_token_id != tok.eos_token_id
    rows = trainer.train_dataset
    assert {row["task"] for row in rows} == set(TASKS)
    targets = {
        p.id: p.target
        for task in TASKS
        for p in read_pairs(Path(prepared_dir) / task / "train.jsonl", task_names())
    }
    for row in rows:
        ids, labels = row["input_ids"], row["labels"]
        trained_at = [i for i, label in enumerate(labels) if label != -100]
        n, end = trained_at[0], trained_at[-1] + 1
        assert trained_at == list(range(n, end)), f"{row['id']}: one contiguous answer"
        assert tok.decode(ids[:n]).endswith("<|im_start|>assistant\n")  # the generation prompt
        assert labels[n:end] == ids[n:end]
        # exactly the answer and the token that ends its turn: ChatML's trailing newline is
        # not trained, the system/user tokens are not either
        assert tok.decode(ids[n:end]) == targets[row["id"]] + "<|im_end|>"
        assert tok.decode(ids[end:]) == "\n"
        assert tok.pad_token_id not in ids


def test_collated_batch_pads_with_pad_and_ignores_padding(masked_run):
    trainer = masked_run.trainer
    tok = trainer.processing_class
    rows = [trainer.train_dataset[i] for i in range(len(trainer.train_dataset))]
    rows.sort(key=lambda r: len(r["input_ids"]))
    short, long = rows[0], rows[-1]
    assert len(short["input_ids"]) < len(long["input_ids"])
    batch = trainer.data_collator(
        [
            {k: short[k] for k in ("input_ids", "labels")},
            {k: long[k] for k in ("input_ids", "labels")},
        ]
    )
    n = len(short["input_ids"])
    assert batch["input_ids"][0, n:].eq(tok.pad_token_id).all()
    assert batch["labels"][0, n:].eq(-100).all()
    assert batch["attention_mask"][0, n:].eq(0).all()
    # The EOS of the short example is still a target: padding did not swallow it.
    assert tok.eos_token_id in batch["labels"][0, :n].tolist()


def test_every_pair_fits_max_length(masked_run):
    assert (
        max(len(r["input_ids"]) for r in masked_run.trainer.train_dataset)
        <= masked_run.recipe.max_length
    )
    fit = masked_run.metadata["data"]["fit"]
    assert sum(v["trimmed"] for v in fit.values()) > 0  # real articles exceed 512 tiny tokens


@pytest.fixture(scope="module")
def long_pair(prepared_dir) -> Pair:
    tok = tiny_tokenizer()
    pairs = list(read_pairs(Path(prepared_dir) / "final" / "train.jsonl", task_names()))
    return max(pairs[:50], key=lambda p: chat_length(tok, p.messages))


def test_trim_cuts_only_the_grounding_text(long_pair):
    tok = tiny_tokenizer()
    before = chat_length(tok, long_pair.messages)
    out, status = fit_pair(long_pair, tok, before - 100)
    assert status == "trimmed"
    assert chat_length(tok, out.messages) <= before - 100
    assert out.target == long_pair.target
    assert out.messages[0] == long_pair.messages[0]  # system prompt untouched
    s, e = long_pair.meta["grounding_span"]
    s2, e2 = out.meta["grounding_span"]
    assert s2 == s and out.user_content[:s] == long_pair.user_content[:s]
    assert out.user_content[e2:] == long_pair.user_content[e:]  # summary / question untouched
    assert out.grounding.endswith(" [...]")
    assert long_pair.grounding.startswith(out.grounding[: -len(" [...]")])


def test_pairs_that_cannot_fit_are_dropped(long_pair):
    tok = tiny_tokenizer()
    assert fit_pair(long_pair, tok, 40) == (None, "dropped")  # instructions alone exceed it
    before = chat_length(tok, long_pair.messages)
    assert fit_pair(long_pair, tok, before - 100, min_grounding_kept=0.999) == (None, "dropped")
    assert fit_pair(long_pair, tok, before) == (long_pair, "kept")


def _pairs(task: str, n: int) -> list[Pair]:
    return [
        Pair(
            f"{task}-{i}",
            task,
            "train",
            [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
        )
        for i in range(n)
    ]


def test_mixture_weights_and_caps():
    by_task = {
        "final": _pairs("final", 10),
        "qasem": _pairs("qasem", 3),
        "fhsumbench": _pairs("fhsumbench", 4),
    }
    mixture = DataMixture(
        weights={"final": 0.5, "qasem": 2.0, "fhsumbench": 1.0}, max_examples={"fhsumbench": 3}
    )
    mixed = mix_pairs(by_task, mixture, seed=1)
    counts = {t: sum(p.task == t for p in mixed) for t in by_task}
    assert counts == {"final": 5, "qasem": 6, "fhsumbench": 3}
    assert sorted(p.id for p in mixed if p.task == "qasem") == sorted(
        ["qasem-0", "qasem-1", "qasem-2"] * 2
    )
    assert [p.id for p in mix_pairs(by_task, mixture, seed=1)] == [p.id for p in mixed]
    assert [p.id for p in mix_pairs(by_task, mixture, seed=2)] != [p.id for p in mixed]


def test_mixture_rejects_unknown_tasks():
    with pytest.raises(FincheckError, match="unknown task"):
        DataMixture(tasks=["final", "summaries"])


def _labelled(task: str, labels: list[str], documents: list[int]) -> list[Pair]:
    """Pairs with a gold label and a grounding text shared by the pairs of one document."""
    out = []
    for i, (label, doc) in enumerate(zip(labels, documents, strict=True)):
        text = f"Document {doc} says something."
        user = f"Reference text:\n{text}\n\nQuestion {i}"
        out.append(
            Pair(
                f"{task}-{i}",
                task,
                "train",
                [{"role": "user", "content": user}, {"role": "assistant", "content": label}],
                {"label": label, "grounding_span": [16, 16 + len(text)]},
            )
        )
    return out


def test_balanced_labels_repeat_the_minority_until_it_matches_the_majority():
    pairs = _labelled("qasem", ["Yes"] * 7 + ["No"] * 3, list(range(10)))
    mixed = mix_pairs({"qasem": pairs}, DataMixture(tasks=["qasem"], balance_labels=["qasem"]), 0)
    labels = [p.meta["label"] for p in mixed]
    assert labels.count("Yes") == labels.count("No") == 7
    assert sorted({p.id for p in mixed}) == sorted(p.id for p in pairs)  # every pair kept
    no_ids = [p.id for p in mixed if p.meta["label"] == "No"]
    assert sorted(no_ids.count(i) for i in set(no_ids)) == [2, 2, 3]  # repeated in turn


def test_balancing_a_task_without_one_gold_label_per_pair_is_an_error():
    with pytest.raises(FincheckError, match="balance_labels names final, but final/final-0"):
        mix_pairs(
            {"final": _pairs("final", 2)}, DataMixture(tasks=["final"], balance_labels=["final"]), 0
        )


def test_whole_document_caps_never_cut_a_document():
    documents = [0, 0, 0, 1, 1, 2, 2, 2, 2, 3]
    pairs = _labelled("qasem", ["Yes"] * 10, documents)
    for seed in range(5):
        mixture = DataMixture(tasks=["qasem"], max_examples={"qasem": 4}, whole_documents=True)
        mixed = mix_pairs({"qasem": pairs}, mixture, seed)
        keys = {p.document_key for p in mixed}
        whole = [p for p in pairs if p.document_key in keys]
        assert sorted(p.id for p in mixed) == sorted(p.id for p in whole)
        assert 4 <= len(mixed) < 4 + 4  # stops at the first document past the cap
        half = mix_pairs(
            {"qasem": pairs},
            DataMixture(tasks=["qasem"], weights={"qasem": 0.5}, whole_documents=True),
            seed,
        )
        assert 5 <= len(half) < 5 + 4  # round(0.5 x 10) pairs, whole documents
        assert all(
            sum(q.document_key == p.document_key for q in half)
            == sum(q.document_key == p.document_key for q in pairs)
            for p in half
        )


def test_balancing_comes_after_the_cap_so_the_cap_cannot_undo_it():
    pairs = _labelled("qasem", ["Yes"] * 7 + ["No"] * 3, list(range(10)))
    mixture = DataMixture(tasks=["qasem"], max_examples={"qasem": 6}, balance_labels=["qasem"])
    for seed in range(5):
        labels = [p.meta["label"] for p in mix_pairs({"qasem": pairs}, mixture, seed)]
        assert labels.count("Yes") == labels.count("No") >= 3  # 6 capped, then balanced


def test_a_zero_cap_or_weight_takes_nothing_even_by_whole_documents():
    pairs = _labelled("qasem", ["Yes"] * 4, [0, 0, 0, 0])  # one document: no boundary to stop at
    for mixture in (
        DataMixture(tasks=["qasem"], max_examples={"qasem": 0}, whole_documents=True),
        DataMixture(tasks=["qasem"], weights={"qasem": 0.1}, whole_documents=True),
    ):
        assert mix_pairs({"qasem": pairs}, mixture, 0) == []
