"""Tree packing (`fincheck.train.tree_layout`, `fincheck.train.tree_attention`): the layout by hand, no token seeing another
branch, per-pair losses and one optimizer step equal to unpacked training, budgets that split
trees without losing a pair."""

from __future__ import annotations

from pathlib import Path

import pytest

from fincheck.errors import FincheckError
from fincheck.train.tree_attention import tree_attention_mask, visible
from fincheck.train.tree_batches import TreeCollator
from fincheck.train.tree_layout import IGNORE, pack_by_round, pack_rows

REPO = Path(__file__).resolve().parents[1]
SYSTEM = list(range(100, 140))  # 40 tokens of instructions
DOC_A, DOC_B = list(range(200, 260)), list(range(300, 350))


def row(pair_id: str, prompt: list[int], answer: list[int], tail: int = 1) -> dict:
    """A training row as `tokenize_pair` makes it: prompt, answer + end of turn (loss), then a
    template tail without loss."""
    return {
        "id": pair_id,
        "input_ids": prompt + answer + [9] * tail,
        "labels": [IGNORE] * len(prompt) + answer + [IGNORE] * tail,
    }


def two_documents() -> list[dict]:
    return [
        row("a1", SYSTEM + DOC_A + [1, 2], [7, 8]),
        row("a2", SYSTEM + DOC_A + [3], [7]),
        row("b1", SYSTEM + DOC_B + [4, 5], [8]),
        row("b2", SYSTEM + DOC_B + [6], [5, 6]),
    ]


def label_runs(labels: list[int]) -> list[list[int]]:
    """Positions of each contiguous run of loss targets: one run per pair, in pack order."""
    runs, current = [], []
    for k, label in enumerate(labels):
        if label != IGNORE:
            current.append(k)
        elif current:
            runs.append(current)
            current = []
    return [*runs, current] if current else runs


def test_each_shared_prefix_once_positions_from_the_parent_and_tree_end_by_hand():
    (pack,) = pack_rows(two_documents(), max_tokens=1000, min_shared=8)
    # system (40) once; doc A (60) once with its two QAs; doc B (50) once with its two
    assert len(pack.input_ids) == 40 + (60 + 5 + 3) + (50 + 4 + 4)
    assert pack.input_ids[:40] == SYSTEM
    assert sorted(pack.pair_ids) == ["a1", "a2", "b1", "b2"]
    # every pair's tokens appear with the positions they have alone
    for r in two_documents():
        prompt_len = r["labels"].index(next(x for x in r["labels"] if x != IGNORE))
        own = r["input_ids"][prompt_len - 1 :]  # its last prompt token, answer, tail
        starts = [
            k
            for k in range(len(pack.input_ids))
            if pack.input_ids[k : k + len(own)] == own
            and pack.position_ids[k : k + len(own)]
            == list(range(prompt_len - 1, len(r["input_ids"])))
        ]
        assert len(starts) == 1, r["id"]
    # the instructions are seen by the whole pack; doc A by its own subtree only
    assert set(pack.tree_end[:40]) == {len(pack.input_ids)}
    doc_a_start = pack.input_ids.index(200)
    assert pack.position_ids[doc_a_start] == 40
    assert set(pack.tree_end[doc_a_start : doc_a_start + 60]) == {doc_a_start + 60 + 5 + 3}
    # labels: exactly the answers' tokens, nothing of the shared prefixes
    assert sorted(
        pack.labels[k] for k in range(len(pack.labels)) if pack.labels[k] != IGNORE
    ) == sorted([7, 8, 7, 8, 5, 6])
    # every segment starts with a prompt token: no loss target across a segment boundary
    for k in range(1, len(pack.input_ids)):
        if pack.position_ids[k] != pack.position_ids[k - 1] + 1:
            assert pack.labels[k] == IGNORE


def test_no_token_sees_the_other_document():
    (pack,) = pack_rows(two_documents(), max_tokens=1000, min_shared=8)
    batch = TreeCollator(pad_token_id=0)([pack.as_row()])
    seen = visible(batch["tree_end"])[0]
    start_a, start_b, end = (
        pack.input_ids.index(200),
        pack.input_ids.index(300),
        len(pack.input_ids),
    )
    assert 40 == start_a < start_b  # instructions, then A's subtree, then B's
    branch_a, branch_b = range(start_a, start_b), range(start_b, end)
    assert not seen[list(branch_b)][:, list(branch_a)].any()  # B's tokens never see A's
    assert not seen[list(branch_a)][:, list(branch_b)].any()  # nor A's B's
    # each QA + answer (a leaf) is seen by nothing after it
    for run in label_runs(pack.labels):
        later = range(pack.tree_end[run[0]], end)
        assert not seen[list(later)][:, run].any()
    # the instructions are seen by every token
    assert seen[:, :40].sum() == sum(min(q + 1, 40) for q in range(end))


def test_the_other_branch_does_not_change_a_branchs_logits(tiny_base):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_base, dtype=torch.float32).eval()
    (pack,) = pack_rows(two_documents(), max_tokens=1000, min_shared=8)
    batch = TreeCollator(pad_token_id=0)([pack.as_row()])
    mask = tree_attention_mask(batch["tree_end"], "sdpa", torch.float32)
    other = batch["input_ids"].clone()
    doc_a = (other >= 200) & (other < 260)
    other[doc_a] = 250 - (other[doc_a] - 200)  # another document A
    with torch.no_grad():
        logits = model(
            batch["input_ids"], attention_mask=mask, position_ids=batch["position_ids"]
        ).logits
        changed = model(other, attention_mask=mask, position_ids=batch["position_ids"]).logits
    b = (batch["input_ids"][0] >= 300) & (batch["input_ids"][0] < 350)
    branch_b = torch.zeros_like(b)
    branch_b[int(b.nonzero()[0]) :] = True
    branch_b &= batch["tree_end"][0] <= int(batch["tree_end"][0][b].max())
    assert branch_b.sum() >= 50 + 8
    torch.testing.assert_close(logits[0, branch_b], changed[0, branch_b], rtol=0, atol=1e-6)
    assert (logits[0, doc_a[0]] - changed[0, doc_a[0]]).abs().max() > 1e-3  # A did change


def per_pair_losses(model, batch: dict, mask) -> list[float]:
    import torch

    with torch.no_grad():
        logits = model(
            batch["input_ids"], attention_mask=mask, position_ids=batch.get("position_ids")
        ).logits
    losses = torch.nn.functional.cross_entropy(
        logits[0, :-1], batch["labels"][0, 1:], ignore_index=IGNORE, reduction="none"
    )
    return [
        float(losses[[k - 1 for k in run]].mean())
        for run in label_runs(batch["labels"][0].tolist())
    ]


def check_packed_losses_equal_alone(
    model, rows: list[dict], max_tokens: int, relative: bool = False
) -> int:
    """Per pair: the mean answer-token loss inside its pack == the pair run alone, within 1e-5
    (`relative`: 1e-5 of the loss, for a 30-layer model whose fp32 GEMMs round differently
    with the sequence length)."""
    import torch

    packs = pack_rows(rows, max_tokens)
    by_id = {r["id"]: r for r in rows}
    checked = 0
    for pack in packs:
        batch = TreeCollator(pad_token_id=0)([pack.as_row()])
        mask = tree_attention_mask(batch["tree_end"], "sdpa", torch.float32)
        in_pack = per_pair_losses(model, batch, mask)
        assert len(in_pack) == len(pack.pair_ids)
        for pair_id, loss in zip(pack.pair_ids, in_pack, strict=True):
            r = by_id[pair_id]
            alone = per_pair_losses(
                model,
                {
                    "input_ids": torch.tensor([r["input_ids"]]),
                    "labels": torch.tensor([r["labels"]]),
                },
                None,
            )
            tolerance = 1e-5 * (max(1.0, abs(alone[0])) if relative else 1.0)
            assert abs(loss - alone[0]) <= tolerance, (pair_id, loss, alone)
            checked += 1
    return checked


def test_per_pair_loss_in_a_pack_equals_the_pair_alone_tiny(tiny_base):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_base, dtype=torch.float32).eval()
    rows = [
        *two_documents(),
        row("c1", [*SYSTEM, 11, 12, 13], [6]),
        row("a3", [*SYSTEM, *DOC_A, 1], [5]),
    ]
    assert check_packed_losses_equal_alone(model, rows, max_tokens=1000) == 6
    # split over several packs too
    assert check_packed_losses_equal_alone(model, rows, max_tokens=130) == 6


def test_a_small_budget_splits_trees_keeping_every_pair_once():
    rows = [row(f"a{k}", SYSTEM + DOC_A + [k % 7 + 1] * (k % 5 + 6), [7]) for k in range(20)]
    rows += [row(f"b{k}", SYSTEM + DOC_B + [k + 1], [8, 8]) for k in range(6)]
    rows += [row(f"c{k}", SYSTEM + [20 + k] * 30, [5]) for k in range(5)]
    budget = 250
    packs = pack_rows(rows, budget)
    ids = [i for p in packs for i in p.pair_ids]
    assert sorted(ids) == sorted(r["id"] for r in rows)  # each pair exactly once
    assert all(len(p.input_ids) <= budget for p in packs)
    # document B's subtree (40 + 50 + 6 x 4 = 114 tokens) fits a pack: it is never split
    holding_b = [p for p in packs if any(i.startswith("b") for i in p.pair_ids)]
    assert len(holding_b) == 1 and sum(i.startswith("b") for i in holding_b[0].pair_ids) == 6
    # document A's (40 + 60 + 20 QAs of 8-12 tokens) does not: each piece repeats the
    # instructions and A
    holding_a = [p for p in packs if any(i.startswith("a") for i in p.pair_ids)]
    assert len(holding_a) >= 2
    assert all(p.input_ids[:40] == SYSTEM for p in packs)
    assert sum(len(p.input_ids) for p in packs) < sum(len(r["input_ids"]) for r in rows) / 2


def test_a_pair_longer_than_the_budget_is_an_error_not_a_loss():
    from fincheck.errors import FincheckError

    with pytest.raises(FincheckError, match=r"longer than tree_packing_max_tokens=50.*a1"):
        pack_rows([row("a1", SYSTEM + DOC_A, [7])], max_tokens=50)


def test_a_repeated_pair_goes_into_another_round_not_twice_into_one_sequence():
    rows = two_documents()
    packs = pack_by_round([*rows, rows[0], rows[2]], max_tokens=1000)
    assert len(packs) == 2
    assert all(len(set(p.pair_ids)) == len(p.pair_ids) for p in packs)
    assert sorted(packs[1].pair_ids) == ["a1", "b1"]


def test_collator_pads_without_attention_to_or_from_padding():
    (pack,) = pack_rows(two_documents()[:2], max_tokens=1000, min_shared=8)
    short = pack_rows([row("x", [1, 2, 3], [4])], max_tokens=1000)[0]
    batch = TreeCollator(pad_token_id=0)([pack.as_row(), short.as_row()])
    n = len(pack.input_ids)
    assert batch["input_ids"].shape == (2, n)
    assert (batch["labels"][1, 5:] == IGNORE).all() and (batch["tree_end"][1, 5:] == -1).all()
    seen = visible(batch["tree_end"])[1]
    assert not seen[:5, 5:].any() and not seen[5:, :5].any()  # padding: itself only
    assert seen[5:, 5:].equal(__import__("torch").eye(n - 5, dtype=bool))


@pytest.fixture
def one_step(small_prepared, tmp_path, monkeypatch):
    """One optimizer step of tiny-cpu over every train pair of the small prepared set, packed or
    not; returns the LoRA weights after it (and before it, to see that it trained)."""
    import torch

    from fincheck.train.sft import build_trainer, load_training_recipe

    monkeypatch.chdir(REPO)
    mixture = tmp_path / "mix.yaml"
    mixture.write_text("min_grounding_kept: 0.0\n")

    def run(tree: bool, batch: int = 64, accumulation: int = 1) -> tuple[dict, dict, int]:
        recipe = load_training_recipe(
            REPO / "configs" / "train" / "tiny-cpu.yaml",
            [
                f"--dataset_dir={small_prepared}",
                f"--data_config={mixture}",
                f"--output_dir={tmp_path / ('tree' if tree else 'rows')}",
                "--deepspeed=",
                # one step holds every pair (or pack): batch x accumulation >= their number
                f"--per_device_train_batch_size={batch}",
                f"--gradient_accumulation_steps={accumulation}",
                "--max_steps=1",
                "--max_length=1024",
                "--learning_rate=0.01",
                "--optim=sgd",  # the update is the gradient itself: its error is not hidden
                f"--tree_packing={str(tree).lower()}",
                "--disable_tqdm=true",
                "--save_strategy=no",
            ],
        )
        torch.manual_seed(0)
        run_ = build_trainer(recipe)
        trainer = run_.trainer

        def lora() -> dict:
            return {
                n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n
            }

        before = lora()
        trainer.train()
        return before, lora(), len(trainer.train_dataset)

    return run


def test_one_optimizer_step_packed_equals_unpacked(one_step):
    import torch

    before_rows, after_rows, n_rows = one_step(tree=False)
    before_tree, after_tree, n_packs = one_step(tree=True)
    assert n_packs < n_rows  # the QASem and FHSumBench pairs share documents
    for name in before_rows:
        torch.testing.assert_close(before_rows[name], before_tree[name], rtol=0, atol=0)
    moved = max(float((after_rows[n] - before_rows[n]).abs().max()) for n in after_rows)
    assert moved > 1e-4  # the step trained
    for name in after_rows:
        torch.testing.assert_close(after_tree[name], after_rows[name], rtol=0, atol=1e-5)
    # the same step accumulated over one pack per micro-batch: the loss is normalised by the
    # target tokens of the whole step (num_items_in_batch), not per micro-batch
    _, after_accumulated, _ = one_step(tree=True, batch=1, accumulation=64)
    for name in after_rows:
        torch.testing.assert_close(after_accumulated[name], after_rows[name], rtol=0, atol=1e-5)


@pytest.mark.real_weights
def test_per_pair_loss_in_a_pack_equals_the_pair_alone_smollm2(smollm2, prepared_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from fincheck.data.pairs import sample_documents
    from fincheck.tasks.prepared import read_split
    from fincheck.train.data import training_row

    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    pairs = sample_documents(read_split(prepared_dir, "qasem", "train"), 12, seed=3)
    pairs += sample_documents(read_split(prepared_dir, "fhsumbench", "train"), 4, seed=3)
    rows = [r for p in pairs if (r := training_row(p, tokenizer, 512)[0])]
    assert len(rows) >= 14
    packs = pack_rows(rows, 1024)
    assert len(packs) < len(rows) / 3  # documents shared: far fewer sequences than pairs
    # measured: largest difference 1.1e-5 on a loss of 2.17 (5e-6 of it), median 3.6e-6
    assert check_packed_losses_equal_alone(model, rows, 1024, relative=True) == len(rows)


def test_chunked_tree_attention_equals_dense_sdpa_in_loss_and_gradients(tiny_base):
    """`use_tree_attention`: query chunks over the keys they see == SDPA over the dense mask."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from fincheck.train import tree_attention
    from fincheck.train.tree_attention import tree_forward, use_tree_attention

    rows = [row(f"a{k}", SYSTEM + DOC_A + [k + 1] * 20, [7, 8]) for k in range(12)]
    rows += [row(f"b{k}", SYSTEM + DOC_B + [k + 30] * 25, [5]) for k in range(10)]
    packs = [p.as_row() for p in pack_rows(rows, max_tokens=2000)]
    batch = TreeCollator(pad_token_id=0)(packs)
    assert batch["input_ids"].shape[1] > 2 * tree_attention.QUERY_CHUNK // 4

    def run(chunked: bool, monkeypatch_chunk: int = 64):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(tiny_base, dtype=torch.float32)
        model = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear"))
        for name, p in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.02)  # not the zero init: gradients reach lora_A
        if chunked:
            use_tree_attention(model)
        loss = tree_forward(model, batch)[0]
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return (
            float(loss),
            grads,
            tree_attention.decoder_backbone(model).config._attn_implementation,
        )

    chunk, split = tree_attention.QUERY_CHUNK, tree_attention.query_chunks
    calls: list[int] = []

    def counted(mask):
        chunks = split(mask)
        calls.append(len(chunks))
        return chunks

    tree_attention.QUERY_CHUNK = 64  # several chunks in this short pack
    tree_attention.query_chunks = counted
    try:
        loss_c, grads_c, impl = run(True)
    finally:
        tree_attention.QUERY_CHUNK, tree_attention.query_chunks = chunk, split
    assert calls and min(calls) > 1  # the chunked kernel ran, in several chunks
    loss_d, grads_d, plain = run(False)
    assert impl == tree_attention.TREE_SDPA and plain == "sdpa"
    assert abs(loss_c - loss_d) <= 1e-6
    assert grads_c.keys() == grads_d.keys() and grads_d
    for name in grads_d:
        torch.testing.assert_close(grads_c[name], grads_d[name], rtol=1e-5, atol=1e-7)


def test_eager_attention_takes_the_additive_tree_mask(tiny_base):
    import torch
    from transformers import AutoModelForCausalLM

    from fincheck.train.tree_attention import tree_forward

    rows = [*two_documents(), row("c1", [*SYSTEM, 11, 12, 13], [6])]
    batch = TreeCollator(pad_token_id=0)([p.as_row() for p in pack_rows(rows, 1000, 8)])
    losses = {}
    for impl in ("sdpa", "eager"):
        model = AutoModelForCausalLM.from_pretrained(
            tiny_base, dtype=torch.float32, attn_implementation=impl
        ).eval()
        with torch.no_grad():
            losses[impl] = float(tree_forward(model, batch)[0])
    assert abs(losses["eager"] - losses["sdpa"]) <= 1e-5


def test_a_model_with_a_sliding_window_shorter_than_a_pack_is_refused():
    from types import SimpleNamespace

    from fincheck.train.tree_attention import check_no_sliding_window

    gemma3 = SimpleNamespace(
        sliding_window=512, layer_types=["sliding_attention", "full_attention"]
    )
    with pytest.raises(FincheckError, match="sliding window of 512 tokens"):
        check_no_sliding_window(gemma3, 2048)
    check_no_sliding_window(gemma3, 512)  # a pack within the window sees what a pair alone sees
    qwen2 = SimpleNamespace(sliding_window=4096, use_sliding_window=False, layer_types=[])
    check_no_sliding_window(qwen2, 8192)  # declared but not used


@pytest.mark.slow
def test_flex_attention_forward_on_the_cpu_gives_each_pair_its_own_loss(tiny_base):
    """FlexAttention trains on a GPU only (no backward on the CPU), but its forward runs here:
    the block mask built from tree_end (`tree_block_mask`), through transformers' flex path,
    gives every answer token of two-pack batches the loss of its pair alone. The compile of
    the CPU kernel takes about 30 s."""
    import torch
    from transformers import AutoModelForCausalLM
    from tree_exactness import max_token_loss_difference, synthetic_rows

    model = AutoModelForCausalLM.from_pretrained(
        tiny_base, dtype=torch.float32, attn_implementation="flex_attention"
    ).eval()
    rows = synthetic_rows(model.config.vocab_size, seed=3)
    assert max_token_loss_difference(model, rows, budget=600, device="cpu") <= 1e-5


def test_a_step_on_tree_batches_gives_the_lora_gradients_of_the_pairs_alone_cpu():
    """The GPU tier's gradient check (tests/test_tree_packing_gpu.py) with the CPU's kernel,
    the chunked SDPA: the same helper, so the GPU run tests FlexAttention, not the helper."""
    from test_tree_packing_gpu import lora_model
    from tree_exactness import max_gradient_difference, synthetic_rows

    from bench.workload import load_model_config
    from fincheck.train.tree_attention import use_tree_attention

    config = load_model_config("tiny")
    model = lora_model(config, "sdpa", device="cpu").train()
    use_tree_attention(model)
    rows = synthetic_rows(config.vocab_size, seed=2)
    assert max_gradient_difference(model, rows, budget=1024, device="cpu") <= 1e-5


def test_the_pairs_of_a_batch_are_counted_by_their_answers_packed_or_padded():
    """pairs/s in the training log counts answer runs: one per pair in a tree pack (each answer
    follows its own prompt tokens), one per row of a padded batch, none in padding."""
    import torch

    from fincheck.train.trainer import answer_runs

    packs = pack_rows([*two_documents(), row("c1", [*SYSTEM, 11, 12, 13], [6])], 1000, 8)
    batch = TreeCollator(pad_token_id=0, rows=3)([p.as_row() for p in packs])
    assert int(answer_runs(batch["labels"])) == 5
    padded = torch.tensor([[IGNORE, 5, 6, IGNORE], [IGNORE, IGNORE, 7, IGNORE]])
    assert int(answer_runs(padded)) == 2
