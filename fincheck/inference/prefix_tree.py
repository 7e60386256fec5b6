"""The prefix tree of token sequences: one structure for evaluation and training.

Prompts repeat themselves. Every prompt of a task starts with the same instructions; QASem's
QAs are asked over a few reference documents, each with several response sentences, each with
several QAs; FHSumBench's summaries share their documents. Put the prompts' token ids in a radix
tree and each shared prefix is a node that the prompts below it share:

    root ─ instructions ─┬─ document A ─┬─ sentence 1 ─┬─ QA 1   (leaves: each prompt's own rest)
                         │              │              └─ QA 2
                         │              └─ sentence 2 ── QA 3
                         └─ document B ── ...

Evaluation (`fincheck.inference.shared_prefix`) runs each node once into a KV cache and each leaf from a
copy of it; training (`fincheck.train.tree_layout`) lays a tree out as one sequence, each node
once, with an attention mask that lets every token see only its ancestors. Both build the tree
here, with `build_prefix_tree`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

# A node gets a cache of its own only when it shares this many tokens beyond its parent: a
# shorter extension costs a forward pass and a cache copy for little saved prefill.
MIN_SHARED = 32


@dataclass
class PrefixNode:
    """`depth` tokens shared by every prompt below; `leaves` run their suffix from this node's
    cache, `children` extend it."""

    depth: int
    leaves: list[int] = field(default_factory=list)
    children: list[PrefixNode] = field(default_factory=list)

    def prompts(self) -> list[int]:
        """Every prompt below this node."""
        return [*self.leaves, *(i for child in self.children for i in child.prompts())]


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    differences = (k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    return next(differences, min(len(a), len(b)))  # none: the shorter one is the prefix


def build_prefix_tree(ids: Sequence[Sequence[int]], min_shared: int = MIN_SHARED) -> PrefixNode:
    """The prefix tree of tokenized prompts (indices into `ids`).

    Sorted lexicographically, prompts that share a prefix are neighbours, and the prefix a run
    of neighbours shares is the smallest common prefix of adjacent pairs in it. A node's depth
    is that minimum, capped so that each prompt keeps at least one token of its own (its last
    position gives the answer's logits); runs that share more become children, unless they
    share fewer than `min_shared` tokens more, in which case their prompts and children belong
    to this node.
    """
    if not ids:
        return PrefixNode(0)
    order = sorted(range(len(ids)), key=lambda i: ids[i])
    lcp = [common_prefix_length(ids[a], ids[b]) for a, b in itertools.pairwise(order)]
    return _subtree(ids, order, lcp, 0, len(order), min_shared, floor=0)


def _subtree(ids, order, lcp, lo: int, hi: int, min_shared: int, floor: int) -> PrefixNode:
    shortest = min(len(ids[order[k]]) for k in range(lo, hi))
    shared = min(lcp[lo : hi - 1], default=shortest)  # default: a single prompt
    node = PrefixNode(max(floor, min(shared, shortest - 1)))
    start = lo
    for k in range(lo, hi):
        if k < hi - 1 and lcp[k] > node.depth:
            continue  # order[k + 1] shares more than this node with order[k]: same run
        if k == start:
            node.leaves.append(order[k])
        elif k - start == hi - lo - 1:  # all share more, but the cap leaves them one token each
            node.leaves.extend(order[start : k + 1])
        else:
            child = _subtree(ids, order, lcp, start, k + 1, min_shared, node.depth)
            if child.depth - node.depth >= min_shared:
                node.children.append(child)
            else:
                node.leaves.extend(child.leaves)
                node.children.extend(child.children)
        start = k + 1
    return node


def count_prefill_tokens(ids: Sequence[Sequence[int]], tree: PrefixNode) -> int:
    """Prompt tokens the tree walk runs through the model (the plain path: sum of lengths)."""

    def walk(node: PrefixNode, parent_depth: int) -> int:
        own = node.depth - parent_depth if node.depth > parent_depth else 0
        suffixes = sum(len(ids[i]) - node.depth for i in node.leaves)
        return own + suffixes + sum(walk(child, node.depth) for child in node.children)

    return walk(tree, 0)
