"""The exactness check of tree packing, shared by the CPU tests and the GPU tier: every answer
token's loss, and the LoRA gradients of a training step, from tree-packed batches (the kernel
the model runs: chunked SDPA, eager or FlexAttention) against the same pairs run alone."""

from __future__ import annotations

import random
from typing import Any

from fincheck.train.tree_attention import FLEX_BLOCK, decoder_backbone, tree_forward
from fincheck.train.tree_batches import TreeCollator
from fincheck.train.tree_layout import IGNORE, pack_rows


def synthetic_rows(vocab: int, seed: int = 0, documents: int = 4) -> list[dict[str, Any]]:
    """QASem-shaped rows of random token ids: shared instructions, documents asked several
    questions, short answers and a template tail (no tokenizer needed)."""
    rng = random.Random(seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(n)]

    system, rows = ids(40), []
    for d in range(documents):
        document = ids(rng.randint(60, 300))
        for q in range(rng.randint(2, 5)):
            prompt, answer = [*system, *document, *ids(rng.randint(4, 30))], ids(rng.randint(1, 4))
            rows.append({"id": f"{d}-{q}", "input_ids": [*prompt, *answer, 2],
                         "labels": [IGNORE] * len(prompt) + answer + [IGNORE]})  # fmt: skip
    return rows


def tree_batches(rows: list[dict], budget: int, flex: bool, rows_per_batch: int = 2) -> list[dict]:
    """The rows packed and collated as training collates them (flex: one fixed shape)."""
    packs = [p.as_row() for p in pack_rows(rows, budget)]
    collate = (
        TreeCollator(0, length=-(-budget // FLEX_BLOCK) * FLEX_BLOCK, rows=rows_per_batch)
        if flex
        else TreeCollator(0)
    )
    return [
        {**collate(packs[k : k + rows_per_batch]), "_ids": [p["pair_ids"] for p in packs[k : k + rows_per_batch]]}
        for k in range(0, len(packs), rows_per_batch)
    ]  # fmt: skip


def alone_token_losses(model: Any, row: dict, device: Any):
    """Per answer token, the loss of the pair run alone (plain causal attention)."""
    import torch

    ids = torch.tensor([row["input_ids"]], device=device)
    labels = torch.tensor([row["labels"]], device=device)[:, 1:]
    logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()
    losses = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE, reduction="none"
    )
    return losses[labels.flatten() != IGNORE]


def packed_token_losses(model: Any, batch: dict, device: Any):
    """Per answer token of a tree batch, in pack order (row by row, left to right)."""
    import torch

    inputs = {k: v.to(device) for k, v in batch.items() if not k.startswith("_")}
    _, _, logits, gold, valid = tree_forward(model, inputs)
    losses = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), gold.flatten(), ignore_index=IGNORE, reduction="none"
    )
    return losses[valid]  # row by row, each row's pairs in pack order


def max_token_loss_difference(model: Any, rows: list[dict], budget: int, device: Any) -> float:
    """Largest |loss in a pack - loss alone| over every answer token (no gradients)."""
    import torch

    flex = decoder_backbone(model).config._attn_implementation == "flex_attention"
    by_id = {r["id"]: r for r in rows}
    worst, checked = 0.0, 0
    with torch.no_grad():
        for batch in tree_batches(rows, budget, flex):
            packed = packed_token_losses(model, batch, device)
            alone = torch.cat(
                [alone_token_losses(model, by_id[i], device) for ids in batch["_ids"] for i in ids]
            )
            assert packed.shape == alone.shape, (packed.shape, alone.shape)
            worst = max(worst, float((packed - alone).abs().max()))
            checked += int(alone.numel())
    assert checked == sum(sum(x != IGNORE for x in r["labels"]) for r in rows)
    return worst


def lora_gradients(model: Any, losses: list) -> dict[str, Any]:
    """The LoRA gradients of the summed losses (then cleared)."""
    import torch

    sum(losses).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    assert grads and all("lora_" in n for n in grads)
    return {n: g.to(torch.float64) for n, g in grads.items()}


def max_gradient_difference(model: Any, rows: list[dict], budget: int, device: Any) -> float:
    """Largest |LoRA gradient from tree batches - from the pairs alone|, relative to the
    largest gradient: the summed answer-token loss of every row, both ways."""
    flex = decoder_backbone(model).config._attn_implementation == "flex_attention"
    packed = lora_gradients(
        model,
        [packed_token_losses(model, b, device).sum() for b in tree_batches(rows, budget, flex)],
    )
    alone = lora_gradients(model, [alone_token_losses(model, r, device).sum() for r in rows])
    scale = max(float(g.abs().max()) for g in alone.values())
    assert scale > 0
    return max(float((packed[n] - alone[n]).abs().max()) for n in alone) / scale
