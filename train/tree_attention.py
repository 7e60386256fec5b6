"""Tree attention: the attention kernel of tree-packed batches (`fincheck.train.tree_layout`
lays the packs out), and the forward pass and loss of such a batch (`tree_forward`).

The collator (`TreeCollator`) pads a batch of packs into rows and hands `tree_end` to the
trainer, which turns it into the mask the attention kernel takes (`tree_attention_mask`): a
boolean [B, 1, L, L] for SDPA (True = attend), an additive float mask for eager attention, a
FlexAttention `BlockMask` (blocks no query sees are skipped) where the model runs flex_attention.

SDPA with a dense mask computes every one of the L x L scores, masked or not; in a tree pack
most are masked (a QA sees its document, its sentence and itself, not the other QAs). So with
SDPA the model runs `fincheck_tree_sdpa` (`use_tree_attention`): queries in chunks of
`QUERY_CHUNK`, each against only the keys some query of the chunk sees (gathered), through
transformers' own SDPA function. Exact (the skipped scores are masked out either way; outputs
within 1e-7 in fp32), and on 2 CPU cores 1.8x faster per layer at 2,000 tokens, 2.5x at 3,000
(fwd+bwd, SmolLM2 shapes). Any other call of the model (generation, unpacked batches) goes to
plain SDPA.
"""

from __future__ import annotations

from typing import Any

from fincheck.errors import FincheckError
from fincheck.train.tree_layout import IGNORE

TREE_SDPA = "fincheck_tree_sdpa"  # the attention implementation of `use_tree_attention`
QUERY_CHUNK = 256  # 128-512 measured alike on 2 CPU cores; 256 tokens ~ one QA with its sentence
FLEX_BLOCK = 128  # FlexAttention's block size: flex rows are padded to a multiple of it


# ------------------------------------------------------------------------------ masks


def visible(tree_end):
    """[B, L] tree_end -> [B, L, L] boolean: query q sees key k (k <= q < tree_end[k]; a
    padding token sees itself only, so no row of the softmax is empty)."""
    import torch

    n = tree_end.shape[-1]
    k = torch.arange(n, device=tree_end.device)
    causal = k[None, :] <= k[:, None]  # [q, k]
    inside = k[:, None] < tree_end[:, None, :]  # [b, q, k]: q before the end of k's subtree
    return (causal[None] & inside) | torch.eye(n, dtype=torch.bool, device=tree_end.device)


def tree_attention_mask(tree_end, attn_implementation: str | None, dtype):
    """The mask the model's attention kernel takes, from tree_end (on its device)."""
    import torch

    if attn_implementation == "flex_attention":
        return tree_block_mask(tree_end)
    allowed = visible(tree_end)[:, None]
    if attn_implementation in (None, "sdpa", TREE_SDPA):
        return allowed
    if attn_implementation == "eager":
        mask = torch.zeros(allowed.shape, dtype=dtype, device=tree_end.device)
        return mask.masked_fill(~allowed, torch.finfo(dtype).min)
    raise FincheckError(
        f"tree packing needs attention that takes a custom mask (sdpa, eager, flex_attention), "
        f"not {attn_implementation!r}: set attn_implementation: sdpa (or flex_attention on a GPU)"
    )


def tree_block_mask(tree_end):
    """The FlexAttention `BlockMask` of a tree batch, from block arithmetic on `tree_end`.

    `create_block_mask` would evaluate the mask at every (query, key) pair: an L x L grid per
    row (67M entries for one 8,192-token pack, int64 intermediates of 0.5 GB). A block of
    queries [i0, i1) and keys [j0, j1) needs less:
      - it is visited when some key k of it is seen by some query of it: k's visible queries
        are [k, tree_end[k]) (and k itself, for padding), so  max(k, i0) < min(tree_end[k], i1)
        for some k -- an [rows, query blocks, L] test, 64 x smaller than the grid;
      - it is full (the kernel skips the mask there) when every query sees every key: the last
        key precedes the first query (j1 - 1 <= i0) and every key's subtree outlasts the last
        query (i1 <= min tree_end over the block).
    Inside the visited blocks that are not full the kernel applies `mask_mod`, the same rule
    as `visible`. Needs L to be a multiple of FLEX_BLOCK (the collator pads flex rows so)."""
    import torch
    from torch.nn.attention.flex_attention import BlockMask

    rows, n = tree_end.shape
    if n % FLEX_BLOCK:
        raise FincheckError(
            f"flex_attention rows must be a multiple of {FLEX_BLOCK} tokens, not {n} (the tree "
            "collator pads them so when the model runs flex_attention)"
        )
    blocks = n // FLEX_BLOCK
    device = tree_end.device
    k = torch.arange(n, device=device)
    first_q = torch.arange(blocks, device=device) * FLEX_BLOCK  # i0 of each query block
    seen = torch.maximum(k[None, :], first_q[:, None])[None] < torch.minimum(  # [rows, qb, L]
        tree_end[:, None, :], (first_q + FLEX_BLOCK)[None, :, None]
    )
    visited = seen.view(rows, blocks, blocks, FLEX_BLOCK).any(-1)  # [rows, qb, kb]
    visited |= torch.eye(blocks, dtype=torch.bool, device=device)  # q == k: padding sees itself
    last_k = first_q + FLEX_BLOCK - 1  # j1 - 1 of each key block
    subtree_end = tree_end.view(rows, blocks, FLEX_BLOCK).amin(-1)  # [rows, kb]
    full = (last_k[None, :] <= first_q[:, None])[None] & (
        (first_q + FLEX_BLOCK)[None, :, None] <= subtree_end[:, None, :]
    )
    partial = visited & ~full

    def as_kv(mask):  # [rows, qb, kb] -> counts [rows, 1, qb], indices [rows, 1, qb, kb]
        counts = mask.sum(-1, dtype=torch.int32)[:, None]
        order = torch.argsort(mask.to(torch.int8), dim=-1, descending=True, stable=True)
        return counts, order.to(torch.int32)[:, None]

    def mask_mod(b, h, q, kv):
        return ((kv <= q) & (q < tree_end[b, kv])) | (q == kv)

    return BlockMask.from_kv_blocks(
        *as_kv(partial), *as_kv(full), BLOCK_SIZE=FLEX_BLOCK, mask_mod=mask_mod, seq_lengths=(n, n)
    )


def decoder_backbone(model: Any) -> Any:
    """The transformer under the LM head, through DeepSpeed/DDP and PEFT wrappers: whose
    attention implementation the mask is built for."""
    while hasattr(model, "module"):
        model = model.module
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    return model.base_model


def tree_forward(model: Any, batch: dict[str, Any], num_items: Any = None):
    """A tree-packed batch through the model: the tree attention mask from `tree_end`, logits
    only at the positions whose next token is a target (a pack is mostly shared prompt: a
    2,000-token QASem pack holds about 30 answer tokens, and scoring every position is a
    fifth of a CPU step), the loss summed over target tokens / `num_items` (default: this
    batch's target tokens).

    Returns (loss, outputs, logits [rows, kept, vocab] in fp32, gold [rows, kept], valid: the
    flattened gold positions that are targets)."""
    import torch

    tree_end, labels = batch["tree_end"], batch["labels"]
    backbone = decoder_backbone(model)
    attn = backbone.config._attn_implementation  # the kernel run: transformers has no public getter
    mask = tree_attention_mask(tree_end, attn, next(backbone.parameters()).dtype)
    keep = batch["logit_positions"]  # computed by the collator, on the CPU
    chunked = {"tree_chunks": query_chunks(mask)} if attn == TREE_SDPA else {}
    outputs = model(
        input_ids=batch["input_ids"],
        position_ids=batch["position_ids"],
        attention_mask=mask,
        use_cache=False,
        logits_to_keep=keep,
        **chunked,
    )
    logits = outputs.logits.float()
    gold = labels[:, keep + 1]
    per_token = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), gold.flatten(), ignore_index=IGNORE, reduction="none"
    )
    valid = gold.flatten() != IGNORE
    n_items = num_items if num_items is not None else valid.sum()
    loss = per_token.sum() / torch.as_tensor(n_items).clamp(min=1)
    return loss, outputs, logits, gold, valid


# ------------------------------------------------------------------------------ attention


def query_chunks(mask) -> list[tuple[int, int, Any, Any]]:
    """Per chunk of queries of a [B, 1, L, L] boolean mask: (start, end, the key positions
    any of its queries sees, the mask restricted to those keys). Built once per batch, used by
    every layer."""
    n = mask.shape[-1]
    chunks = []
    for start in range(0, n, QUERY_CHUNK):
        rows = mask[:, :, start : start + QUERY_CHUNK]
        keys = rows.any(dim=2).any(dim=1).any(dim=0).nonzero()[:, 0]
        chunks.append((start, min(n, start + QUERY_CHUNK), keys, rows.index_select(3, keys)))
    return chunks


def tree_sdpa_attention(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs
):
    """transformers' SDPA attention, by query chunks over the keys they see when the call
    brings `tree_chunks` (`query_chunks` of its tree mask); plain SDPA otherwise."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    chunks = kwargs.pop("tree_chunks", None)
    if chunks is None or key.shape[2] != query.shape[2]:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout, scaling, **kwargs
        )
    outputs = []
    for start, end, keys, mask in chunks:
        out, _ = sdpa_attention_forward(
            module,
            query[:, :, start:end],
            key.index_select(2, keys),
            value.index_select(2, keys),
            mask,
            dropout,
            scaling,
            **kwargs,
        )
        outputs.append(out)  # [B, chunk, heads, dim]
    return torch.cat(outputs, dim=1), None


def tree_attention_for(requested: str | None, cuda: bool) -> tuple[str, str | None]:
    """The attention kernel a tree-packed run trains with, and one line for the log when it is
    not the one the recipe names.

    On a GPU, FlexAttention: its block-sparse kernel skips the blocks no query sees (an H100
    trained Qwen2.5-0.5B on QASem packs at 202 pairs/s with it, 39 with chunked SDPA). It has no
    backward pass on the CPU, where the chunked SDPA (`fincheck_tree_sdpa`) trains instead:
    exact too, the same loss."""
    if requested not in (None, "flex_attention"):
        return requested, None
    if cuda:
        return "flex_attention", None
    note = (
        "tree packing: flex_attention has no backward pass on the CPU; training with the chunked "
        "SDPA tree attention instead (exact: the same loss per pair)"
    )
    return "sdpa", note if requested else None


def check_no_sliding_window(config: Any, budget: int) -> None:
    """Refuse a model whose layers attend through a sliding window shorter than a pack: the
    tree mask would let those layers see keys a pair alone would not (Gemma 3: 512)."""
    config = getattr(config, "text_config", None) or config
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None) or []
    sliding = "sliding_attention" in layer_types or bool(getattr(config, "use_sliding_window", 0))
    if sliding and window and window < budget:
        raise FincheckError(
            f"tree_packing: this model's layers attend through a sliding window of {window} "
            f"tokens, shorter than a pack (tree_packing_max_tokens={budget}); the tree mask does "
            "not apply the window, so a pair would not see what it sees alone. Set "
            "tree_packing: false for this model"
        )


def use_tree_attention(model: Any) -> None:
    """Run an SDPA model's attention through `tree_sdpa_attention` (registered once with
    transformers, with SDPA's mask builder for its other calls)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(TREE_SDPA, tree_sdpa_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(TREE_SDPA, sdpa_mask)
    if decoder_backbone(model).config._attn_implementation == "sdpa":  # no public getter
        model.set_attn_implementation(TREE_SDPA)
