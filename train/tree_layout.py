"""Tree packing's layout: training pairs that share a prompt prefix laid out in one sequence,
every shared prefix once.

Each QASem pair repeats its whole reference document: the 1,146 train QAs ask about 83
documents, so the plain rows hold 1.25M tokens (SmolLM2 tokenizer, no trimming) for 0.14M
distinct ones; FHSumBench's 493 summaries share 183 documents (0.39M tokens for 0.14M). Put the
prompts in the prefix tree that evaluation uses (`fincheck.inference.prefix_tree`) and lay each tree out
as one sequence, depth first:

    [instructions][document A][sentence 1][QA 1 + answer][QA 2 + answer][sentence 2][QA 3 + answer]

Every token sees exactly what it would see in its own pair, and nothing else:
  - attention: a token sees the earlier tokens of its own segment and every token of its
    ancestors. Laid out depth first, a segment's subtree is one contiguous run, so one integer
    per token says it all: `tree_end[k]`, the end of the subtree of k's segment, and
        query q sees key k  <=>  k <= q < tree_end[k]
    (a leaf's tokens end at the leaf: no other pair sees its QA or answer);
  - positions continue from each segment's parent, so each pair sees the positions it would
    see alone (a leaf that follows a sibling restarts where their parent ended);
  - labels: the answer and its end-of-turn token, as in an unpacked row; every segment starts
    with a prompt token, so the shifted label of a segment's last token is never a loss target
    across a segment boundary.
Per pair, loss and gradients are those of the pair alone (up to float reassociation:
tests/test_tree_packing.py checks 1e-5 in fp32).

A tree larger than the token budget (`tree_packing_max_tokens`) is split: a subtree that fits
stays whole; the pieces of one that does not (its leaves, its children's pieces) are packed
first-fit-decreasing into sequences that each repeat the subtree's prefix, so no pair is ever
dropped (`pack_rows` checks the count). Each pair fits alone (training fits pairs to max_length,
and the budget is at least that).

The attention that lets each token see only this: `fincheck.train.tree_attention`.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fincheck.errors import FincheckError
from fincheck.inference.prefix_tree import MIN_SHARED, PrefixNode, build_prefix_tree

IGNORE = -100
PAD_END = -1  # tree_end of a padding token: no query sees it (it sees itself only)


def prompt_length(labels: Sequence[int]) -> int:
    """Tokens before the first loss target: the prompt as the tree shares it."""
    return next((k for k, label in enumerate(labels) if label != IGNORE), len(labels))


@dataclass
class Piece:
    """Pairs (indices into the rows) that go into one sequence together, and its length when
    laid out: the distinct prefix tokens on their paths plus each pair's own rest."""

    rows: list[int]
    tokens: int


@dataclass
class _Node:
    """A tree node with what packing needs: its own tokens (beyond its parent) and the tokens
    of its whole subtree laid out."""

    node: PrefixNode
    own: int
    subtree: int
    children: list[_Node] = field(default_factory=list)


def _measure(node: PrefixNode, parent_depth: int, lengths: Sequence[int]) -> _Node:
    own = node.depth - parent_depth
    children = [_measure(c, node.depth, lengths) for c in node.children]
    leaves = sum(lengths[i] - node.depth for i in node.leaves)
    return _Node(node, own, own + leaves + sum(c.subtree for c in children), children)


def _pieces(m: _Node, path: int, budget: int, lengths: Sequence[int]) -> list[Piece]:
    """Pieces of `m`'s subtree, each at most `budget` tokens; `path` = tokens of m's ancestors
    and m itself (every piece of this subtree repeats them)."""
    if path - m.own + m.subtree <= budget:
        return [Piece(m.node.prompts(), path - m.own + m.subtree)]
    # Items below m: each leaf, and the pieces of each child subtree. Items share m's path.
    items = [Piece([i], path + lengths[i] - m.node.depth) for i in m.node.leaves]
    for child in m.children:
        items += _pieces(child, path + child.own, budget, lengths)
    items.sort(key=lambda p: -p.tokens)  # first fit decreasing; stable, so deterministic
    bins: list[Piece] = []
    for item in items:
        extra = item.tokens - path
        for b in bins:
            if b.tokens + extra <= budget:
                b.rows += item.rows
                b.tokens += extra
                break
        else:
            bins.append(Piece(list(item.rows), item.tokens))
    return bins


@dataclass
class Pack:
    """One training sequence: pairs laid out along their prefix tree."""

    input_ids: list[int]
    labels: list[int]
    position_ids: list[int]
    tree_end: list[int]
    pair_ids: list[str]

    def as_row(self) -> dict[str, Any]:
        return dict(vars(self))  # shallow: packs hold thousands of token ids


def lay_out(tree: PrefixNode, rows: Sequence[dict[str, Any]], chosen: set[int]) -> Pack:
    """The sequence of the `chosen` rows along `tree`: depth first, each node's own tokens
    once, then its chosen leaves (each its rest: prompt suffix, answer, template tail), then
    its children that hold chosen rows."""
    pack = Pack([], [], [], [], [])

    def visit(node: PrefixNode, parent_depth: int) -> None:
        held = [i for i in node.prompts() if i in chosen]
        if not held:
            return
        start = len(pack.input_ids)
        own = node.depth - parent_depth
        pack.input_ids += rows[held[0]]["input_ids"][parent_depth : node.depth]
        pack.labels += [IGNORE] * own
        pack.position_ids += list(range(parent_depth, node.depth))
        pack.tree_end += [0] * own  # filled in once the subtree is laid out
        for i in node.leaves:
            if i not in chosen:
                continue
            row = rows[i]
            rest = len(row["input_ids"]) - node.depth
            pack.input_ids += row["input_ids"][node.depth :]
            pack.labels += row["labels"][node.depth :]
            pack.position_ids += list(range(node.depth, len(row["input_ids"])))
            pack.tree_end += [len(pack.input_ids)] * rest  # a leaf's tokens end at the leaf
            pack.pair_ids.append(row.get("id", str(i)))
        for child in node.children:
            visit(child, node.depth)
        # the node's own tokens are seen by its whole subtree, which ends here
        pack.tree_end[start : start + own] = [len(pack.input_ids)] * own

    visit(tree, 0)
    return pack


def pack_rows(
    rows: Sequence[dict[str, Any]], max_tokens: int, min_shared: int = MIN_SHARED
) -> list[Pack]:
    """Training rows (input_ids, labels, id) -> packs of at most `max_tokens` tokens.

    The prompts (everything before the first loss target) go into one prefix tree; its pieces
    (`_pieces`) become packs. Every row lands in exactly one pack."""
    if not rows:
        return []
    prompts = [r["input_ids"][: prompt_length(r["labels"])] for r in rows]
    lengths = [len(r["input_ids"]) for r in rows]
    too_long = [r.get("id", str(i)) for i, r in enumerate(rows) if lengths[i] > max_tokens]
    if too_long:
        raise FincheckError(
            f"tree packing: {len(too_long)} pair(s) longer than tree_packing_max_tokens="
            f"{max_tokens} (first: {too_long[0]}); set it to at least max_length"
        )
    tree = build_prefix_tree(prompts, min_shared)
    measured = _measure(tree, 0, lengths)
    pieces = _pieces(measured, measured.own, max_tokens, lengths)
    packs = [lay_out(tree, rows, set(p.rows)) for p in pieces]
    placed = sum(len(p.pair_ids) for p in packs)
    if placed != len(rows):  # a bug, never a silent loss
        raise FincheckError(f"tree packing placed {placed} of {len(rows)} pairs")
    return packs


def pack_by_round(rows: Sequence[dict[str, Any]], max_tokens: int) -> list[Pack]:
    """`pack_rows` per repetition round: a pair that the mixture repeats (weight > 1,
    oversampled labels) goes once into each round's trees, never twice into one sequence."""
    rounds: defaultdict[int, list[dict[str, Any]]] = defaultdict(list)
    seen: Counter[str] = Counter()
    for row in rows:
        rounds[seen[row["id"]]].append(row)  # a pair's k-th copy goes into round k
        seen[row["id"]] += 1
    return [pack for group in rounds.values() for pack in pack_rows(group, max_tokens)]


def packing_stats(rows: Sequence[dict[str, Any]], packs: Sequence[Pack]) -> dict[str, Any]:
    """What packing saved: tokens of the plain rows and of the packs."""
    row_tokens = sum(len(r["input_ids"]) for r in rows)
    packed_tokens = sum(len(p.input_ids) for p in packs)
    return {
        "pairs": len(rows),
        "packs": len(packs),
        "row_tokens": row_tokens,
        "packed_tokens": packed_tokens,
        "token_ratio": round(row_tokens / max(1, packed_tokens), 2),
    }


def pack_splits(
    train_rows: Sequence[dict[str, Any]], eval_rows: Sequence[dict[str, Any]], max_tokens: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """The training mixture and the dev rows as tree packs (dataset rows), with the counts the
    run logs and records (`data.tree_packing` in fincheck_run.json)."""
    train_packs = pack_by_round(train_rows, max_tokens)
    eval_packs = pack_by_round(eval_rows, max_tokens)
    stats = {
        "max_tokens": max_tokens,
        "train": packing_stats(train_rows, train_packs),
        "eval": packing_stats(eval_rows, eval_packs),
    }
    return [p.as_row() for p in train_packs], [p.as_row() for p in eval_packs], stats


def logit_positions(labels):
    """The positions whose next token is a loss target in some row (position k predicts the
    token at k + 1): the only ones whose logits the loss needs."""
    return (labels[:, 1:] != IGNORE).any(0).nonzero()[:, 0]
