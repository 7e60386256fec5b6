"""Tree packs as micro-batches (`fincheck.train.tree_batches`): every pack once per epoch, ranks
given alike tokens, one shape per run for FlexAttention, and the FlexAttention block mask equal
to torch's own construction; the attention kernel a tree-packed recipe gets on this machine."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest
from tree_exactness import synthetic_rows

from fincheck.errors import FincheckError
from fincheck.train.tree_attention import tree_attention_for, tree_block_mask
from fincheck.train.tree_batches import (
    PackBatchSampler,
    TreeCollator,
    plan_steps,
    rank_token_spread,
)
from fincheck.train.tree_layout import IGNORE, pack_rows

REPO = Path(__file__).resolve().parents[1]


def packed_lengths(seed: int = 0, budget: int = 8192) -> list[int]:
    """Pack lengths shaped like `pack_rows` output: first-fit-decreasing fills the packs close
    to the budget (the prepared mixture, Qwen2.5 tokens: 92 packs of 6,604-8,192 tokens), and
    leaves at most one less than half full, the split's rest."""
    rng = random.Random(seed)
    full = [budget - rng.randint(0, budget // 5) for _ in range(44)]
    return [*full, rng.randint(budget // 8, budget // 2)]


def test_every_pack_is_trained_once_per_epoch_in_steps_the_trainer_can_count():
    lengths = packed_lengths()
    plan = plan_steps(lengths, rows=2, world=2, accumulation=3, seed=42, epoch=0)
    trained = [i for step in plan for micro in step for batch in micro for i in batch]
    assert Counter(trained) == Counter(range(len(lengths)))  # once each, none repeated
    # 45 packs, 12 per optimizer step: 3 full steps of 3 micro-steps, then 9 packs in a last
    # step of ceil(9 / 4) = 3 micro-steps; no micro-batch above 2 packs
    assert [len(step) for step in plan] == [3, 3, 3, 3]
    assert all(len(batch) <= 2 for step in plan for micro in step for batch in micro)
    shortest = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))[36:]
    # the remainder (the shortest packs) is the last step, not shuffled into the epoch
    assert sorted(i for micro in plan[-1] for b in micro for i in b) == sorted(shortest)
    even = plan_steps(lengths[:36], rows=2, world=2, accumulation=3, seed=42, epoch=1)
    assert min(lengths[:36]) in [lengths[i] for micro in even[-1] for b in micro for i in b]
    sampler = PackBatchSampler(lengths, rows=2, world=2, rank=1, accumulation=3, seed=42)
    assert len(sampler) == len(list(sampler)) == 12  # micro-batches per rank per epoch


def test_a_tail_smaller_than_the_ranks_leaves_a_rank_an_empty_micro_batch_never_a_repeat():
    plan = plan_steps([500, 400, 300], rows=1, world=2, accumulation=1, seed=0, epoch=0)
    assert plan[-1] == [[[2], []]]  # 3 packs on 2 ranks: the last step's rank 1 pads
    ranks = [PackBatchSampler([500, 400, 300], 1, 2, r, 1, 0) for r in (0, 1)]
    assert [len(s) for s in ranks] == [2, 2]
    assert sorted(i for s in ranks for b in s for i in b) == [0, 1, 2]


def test_ranks_get_alike_tokens_per_step_by_hand_and_on_pack_shaped_lengths():
    # by hand: 10, 9, 8, 7 on 2 ranks, 2 micro-steps of 1: 10 -> r0, 9 -> r1, 8 -> r1 (9 < 10),
    # 7 -> r0: 17 tokens each; micro-step 0 holds each rank's longest (10 | 9), then (7 | 8)
    (step,) = plan_steps([10, 9, 8, 7], rows=1, world=2, accumulation=2, seed=0, epoch=0)
    assert step == [[[0], [1]], [[3], [2]]]
    assert rank_token_spread(step, [10, 9, 8, 7]) == 0.0
    # every step but the epoch's last, which holds the shortest packs (and the remainder, where
    # a rank may have none: it idles rather than train a pack twice)
    for seed in range(5):
        lengths = packed_lengths(seed)
        for world, rows, accumulation in ((2, 1, 1), (2, 1, 4), (4, 2, 2), (8, 1, 2)):
            plan = plan_steps(lengths, rows, world, accumulation, seed, epoch=1)
            worst = max(rank_token_spread(step, lengths) for step in plan[:-1])
            assert worst <= 0.10, (seed, world, rows, accumulation, worst)


def test_the_order_is_reshuffled_each_epoch_and_the_same_on_every_rank_and_rerun():
    lengths = packed_lengths()
    first = plan_steps(lengths, 1, 2, 1, seed=42, epoch=0)
    assert first == plan_steps(lengths, 1, 2, 1, seed=42, epoch=0)  # a resume sees this order
    assert first != plan_steps(lengths, 1, 2, 1, seed=42, epoch=1)
    sampler = PackBatchSampler(lengths, 1, 2, 0, 1, seed=42)
    epoch0 = list(sampler)
    sampler.set_epoch(1)
    assert list(sampler) != epoch0


def test_flex_batches_have_one_shape_with_padding_rows_and_the_logit_positions():
    packs = [
        {"input_ids": [5, 6, 7, 8], "labels": [IGNORE, IGNORE, 7, 8], "position_ids": [0, 1, 2, 3],
         "tree_end": [4, 4, 4, 4]},
        {"input_ids": [5, 6], "labels": [IGNORE, 6], "position_ids": [0, 1], "tree_end": [2, 2]},
    ]  # fmt: skip
    collate = TreeCollator(pad_token_id=0, length=256, rows=3)
    batch = collate(packs)
    assert {k: tuple(v.shape) for k, v in batch.items() if k != "logit_positions"} == {
        "input_ids": (3, 256), "labels": (3, 256), "position_ids": (3, 256), "tree_end": (3, 256)
    }  # fmt: skip
    assert (batch["tree_end"][2] == -1).all() and (batch["labels"][2] == IGNORE).all()
    assert batch["logit_positions"].tolist() == [0, 1, 2]  # they predict labels at 1, 2, 3
    empty = collate([])  # a rank with no pack left in the epoch's last step
    assert tuple(empty["input_ids"].shape) == (3, 256) and empty["logit_positions"].numel() == 0
    with pytest.raises(FincheckError, match="exceeds the row length 2"):
        TreeCollator(pad_token_id=0, length=2)(packs)
    assert tuple(TreeCollator(pad_token_id=0)(packs)["input_ids"].shape) == (2, 4)  # sdpa: longest


def test_the_flex_block_mask_equals_torchs_own_from_the_dense_mask():
    import torch
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask

    for seed in range(4):
        packs = pack_rows(synthetic_rows(vocab=900, seed=seed, documents=8), 700)
        tree_end = TreeCollator(0, pad_to_multiple_of=128)([p.as_row() for p in packs[:3]])[
            "tree_end"
        ]
        rows, n = tree_end.shape

        def mask_mod(b, h, q, k, tree_end=tree_end):
            return ((k <= q) & (q < tree_end[b, k])) | (q == k)

        ours, torchs = (
            tree_block_mask(tree_end),
            create_block_mask(mask_mod, rows, None, n, n, "cpu"),
        )
        assert torch.equal(ours.to_dense(), torchs.to_dense())  # the blocks visited

        def full_blocks(mask: BlockMask, n: int = n):
            return BlockMask.from_kv_blocks(
                mask.full_kv_num_blocks, mask.full_kv_indices, BLOCK_SIZE=128, seq_lengths=(n, n)
            ).to_dense()

        assert torch.equal(full_blocks(ours), full_blocks(torchs))  # the blocks left unmasked
        assert 0 < int(ours.full_kv_num_blocks.sum()) < int(ours.kv_num_blocks.sum()) + 100
    with pytest.raises(FincheckError, match="multiple of 128"):
        tree_block_mask(torch.zeros(1, 100, dtype=torch.long))


def test_tree_packing_trains_with_flex_on_a_gpu_and_chunked_sdpa_on_the_cpu():
    assert tree_attention_for(None, cuda=True) == ("flex_attention", None)
    assert tree_attention_for("flex_attention", cuda=True) == ("flex_attention", None)
    assert tree_attention_for("sdpa", cuda=True) == ("sdpa", None)  # asked for: kept
    assert tree_attention_for(None, cuda=False) == ("sdpa", None)
    kernel, note = tree_attention_for("flex_attention", cuda=False)
    assert kernel == "sdpa" and "no backward pass on the CPU" in note and "\n" not in note
    assert tree_attention_for("eager", cuda=False) == ("eager", None)


def test_a_gpu_recipe_on_a_cpu_falls_back_to_chunked_sdpa_and_records_what_it_declared():
    import torch

    if torch.cuda.is_available():
        pytest.skip(
            "on a GPU the recipe trains with flex_attention (tests/test_tree_packing_gpu.py)"
        )
    from fincheck.train.recipe import load_recipe, recipe_to_yaml

    recipe = load_recipe(
        REPO / "configs" / "train" / "qwen2.5-0.5b-instruct.yaml",
        ["--precision=fp32", "--torch_dtype=fp32", "--deepspeed=", f"--output_dir={REPO}/x"],
    )
    assert recipe.tree_packing and recipe.attn_implementation == "sdpa"
    assert "flex_attention has no backward pass on the CPU" in recipe.attention_note
    assert "attn_implementation: flex_attention" in recipe_to_yaml(recipe)  # a GPU resume keeps it


def test_flex_runs_give_evaluation_the_training_shape_and_refuse_data_parallel_in_one_process():
    import torch

    from fincheck.train.launch import check_one_gpu_per_process
    from fincheck.train.recipe import load_recipe
    from fincheck.train.tree_batches import tree_collator

    if torch.cuda.is_available():
        pytest.skip("the recipe is built for this machine: on a GPU it already runs flex")
    recipe = load_recipe(
        REPO / "configs" / "train" / "qwen2.5-0.5b-instruct.yaml",
        ["--precision=fp32", "--torch_dtype=fp32", "--deepspeed=", f"--output_dir={REPO}/x",
         "--per_device_train_batch_size=2"],
    )  # fmt: skip
    collate = tree_collator(recipe, 0, "flex_attention")
    assert (collate.length, collate.rows) == (8192, 2)
    assert recipe.per_device_eval_batch_size == 2  # eval batches: the same [2, 8192] shape
    check_one_gpu_per_process(1)
    with pytest.raises(FincheckError, match=r"one process per GPU .*CUDA_VISIBLE_DEVICES=0"):
        check_one_gpu_per_process(4)
