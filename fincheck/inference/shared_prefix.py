"""Prompts that share a prefix run it once: the fast path of `fincheck eval`, the local judge and
the baselines.

An evaluation's prompts repeat themselves. Every prompt of a task starts with the same system
instructions (~130 tokens); QASem's 1,556 test QAs are asked over 97 reference documents, each
of whose responses has several sentences, each with several QAs; FHSumBench's 667 summaries
cover 227 documents. Fitted to a 1,024-token window (SmolLM2 tokens), the plain path prefills
1.40M QASem prompt tokens where 0.15M are distinct, 0.45M FHSumBench tokens for 0.14M, and 0.60M
FINAL tokens for 0.45M (the instructions alone).

So the token ids of the prompts are put in a prefix tree (`fincheck.inference.prefix_tree`, the one
training packs with too): a node is a prefix shared by all prompts below it. The tree is walked depth first: a node's prefix runs
once into a KV cache (the parent's cache, extended by the node's own tokens); the prompts that
end below the node without sharing more (its leaves) run only their own suffix from a copy of
that cache, `batch_size` at a time (`leaf_batches`), left-padded within the suffix. From the
suffix's last position come P(Yes)/(P(Yes)+P(No)) and the first greedy token; decoding goes on
token by token from the same cache, each row leaving the batch at its end-of-turn token.

Positions are those of the unpadded prompt and the attention mask hides the padding, so a
prompt's logits are the plain path's up to float reassociation: P(Yes) within 1e-5 in fp32,
and the same greedy text unless two tokens tie to within that rounding.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from fincheck.data.prompting import FirstWordShare
from fincheck.inference.generation import (
    answer_spellings,
    exact_answer_logits,
    greedy_tokens,
    output_head_inputs,
    stop_tokens,
    yes_share,
)
from fincheck.inference.prefix_tree import PrefixNode, build_prefix_tree


def cache_argument() -> str:
    """The forward argument (and output field) that carries the KV cache: transformers renamed
    `past_key_values` to `cache` within 5.x and drops the old name in 5.40; both are supported."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


@dataclass
class Answers:
    """One batch's answers: `indices` into the prompts, their greedy texts, and P(Yes) when
    asked."""

    indices: list[int]
    texts: list[str]
    p_yes: list[float] | None
    cut: list[bool]  # hit max_new_tokens without an end-of-turn token


def answer_prompts(
    model,
    tokenizer,
    prompts: Sequence[str],
    max_new_tokens: int,
    *,
    batch_size: int = 8,
    share: FirstWordShare | None = None,
) -> Iterator[Answers]:
    """Greedy answers to rendered prompts, batch by batch in the tree's order, every shared
    prefix run once.

    With `share` (the task's first-word share), p_yes comes from the first answer position (a
    spelling of several tokens is teacher-forced as an extra row). Where the word is the whole
    answer (`ends_answer`: QASem's Yes/No), an answer whose first token starts one stops
    there: p_yes is what is scored; any other answer is decoded on so a report can show what
    it says.
    """
    import torch

    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    runner = _TreeRunner(model, tokenizer, ids, max_new_tokens, max(1, batch_size), share)
    with torch.no_grad():
        yield from runner.walk(build_prefix_tree(ids), None, 0)


def answer_in_order(
    model,
    tokenizer,
    prompts: Sequence[str],
    max_new_tokens: int,
    *,
    batch_size: int = 8,
    share: FirstWordShare | None = None,
    answered: Callable[[int], object] | None = None,
) -> Answers:
    """`answer_prompts` collected in the prompts' order (`indices` 0..n-1); `answered(k)` after
    each batch of k answers (a progress bar's `update`)."""
    n = len(prompts)
    out = Answers(list(range(n)), [""] * n, [0.0] * n if share else None, [False] * n)
    for batch in answer_prompts(
        model, tokenizer, prompts, max_new_tokens, batch_size=batch_size, share=share
    ):
        for k, i in enumerate(batch.indices):
            out.texts[i], out.cut[i] = batch.texts[k], batch.cut[k]
            if out.p_yes is not None:
                out.p_yes[i] = batch.p_yes[k]
        if answered is not None:
            answered(len(batch.indices))
    return out


def leaf_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Batches of positions into `lengths`, longest first: similar lengths together, so little
    padding (`walk_order` then mixes them)."""
    order = sorted(range(len(lengths)), key=lambda k: -lengths[k])
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def walk_order(batches: list[list[int]], children: list[PrefixNode]) -> list:
    """A node's leaf batches and children in the order the walk visits them: the longest batch
    first (an out-of-memory shows at once), then the rest in a seeded random order, so the rate
    a progress bar sees is steady and its ETA right after a few batches. In length order it
    would drift by the ratio of the longest prompt to the shortest; leaves before children would
    start slow (a leaf runs its whole suffix, often a document, where a child's prompts share
    theirs) and overstate the ETA by up to the sharing factor."""
    rest: list = [*batches[1:], *children]
    random.Random(len(rest)).shuffle(rest)
    return [*batches[:1], *rest]


class _TreeRunner:
    """The depth-first walk of one prefix tree: caches, suffix batches, greedy decoding."""

    def __init__(
        self,
        model,
        tokenizer,
        ids,
        max_new_tokens: int,
        batch_size: int,
        share: FirstWordShare | None = None,
    ):
        self.model, self.tokenizer, self.ids = model, tokenizer, ids
        self.max_new_tokens, self.batch_size, self.share = max_new_tokens, batch_size, share
        self.device = model.device
        self.cache_arg = cache_argument()
        self.yes = answer_spellings(tokenizer, share.yes) if share else []
        self.no = answer_spellings(tokenizer, share.no) if share else []
        # spellings of several tokens are teacher-forced: one extra row per (prompt, spelling)
        self.longer = [s for s in (*self.yes, *self.no) if len(s) > 1]
        self.keep = max([1, *(len(s) for s in self.longer)])  # logits positions to compute
        # a first token that starts the answer word ends an answer that is only that word
        ends = bool(share and share.ends_answer)
        self.answer_starts = {s[0] for s in (*self.yes, *self.no)} if ends else set()
        eos = stop_tokens(model, tokenizer)
        self.eos = set(eos if isinstance(eos, list) else [eos])
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def walk(self, node: PrefixNode, cache: Any, cached: int) -> Iterator[Answers]:
        """Answers below `node`; `cache` holds the first `cached` tokens of its prompts."""
        if node.depth > cached:
            cache = self.extend(cache, cached, self.ids[node.prompts()[0]][cached : node.depth])
            cached = node.depth
        batches = leaf_batches([len(self.ids[i]) for i in node.leaves], self.batch_size)
        for unit in walk_order(batches, node.children):
            if isinstance(unit, PrefixNode):
                yield from self.walk(unit, cache, cached)
            else:
                yield self.answer([node.leaves[k] for k in unit], cache, cached)

    def extend(self, cache: Any, cached: int, tokens: list[int]) -> Any:
        """A new cache: `cache` (not modified) plus `tokens` at positions cached, cached+1, ..."""
        import torch

        ids = torch.tensor([tokens], device=self.device)
        positions = torch.arange(cached, cached + len(tokens), device=self.device)[None]
        return self.forward(copy.deepcopy(cache), 1, input_ids=ids, position_ids=positions)[1]

    def forward(self, cache: Any, keep: int, **inputs: Any) -> tuple[Any, Any]:
        """(logits of the last `keep` positions, the cache grown by `inputs`): every pass of
        the walk, the KV cache passed under the name the installed transformers uses."""
        out = self.model(**inputs, **{self.cache_arg: cache}, use_cache=True, logits_to_keep=keep)
        return out.logits, out[self.cache_arg]

    def answer(self, members: list[int], cache: Any, cached: int) -> Answers:
        """One batch of prompts that share the cached prefix: their suffixes in one forward
        pass, P(Yes) when asked, then greedy decoding."""
        import torch

        dev, n = self.device, len(members)
        rows = [self.ids[i][cached:] for i in members]
        rows += [self.ids[i][cached:] + list(s) for i in members for s in self.longer]
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), self.pad, dtype=torch.long, device=dev)
        suffix_mask = torch.zeros((len(rows), width), dtype=torch.long, device=dev)
        for r, row in enumerate(rows):
            input_ids[r, width - len(row) :] = torch.tensor(row, device=dev)
            suffix_mask[r, width - len(row) :] = 1
        mask = torch.cat([suffix_mask.new_ones((len(rows), cached)), suffix_mask], dim=1)
        positions = cached + (suffix_mask.cumsum(-1) - 1).clamp(min=0)
        if cache is not None:
            cache = copy.deepcopy(cache)
            cache.batch_repeat_interleave(len(rows))
        with output_head_inputs(self.model) as hidden:
            logits, cache = self.forward(
                cache, self.keep, input_ids=input_ids, attention_mask=mask, position_ids=positions
            )
        last = logits[:n, -1]
        p_yes = None
        if self.share:  # the answer position's logits in fp32 (`exact_answer_logits`)
            spellings = [*self.yes, *self.no]
            first = exact_answer_logits(self.model, hidden[0][:n, -1], spellings, last)
            p_yes = self.p_yes(first, logits[n:])
        if len(rows) > n:
            cache.batch_select_indices(torch.arange(n, device=dev))
        texts, cut = self.decode(greedy_tokens(last), cache, mask[:n], positions[:n, -1])
        return Answers(members, texts, p_yes, cut)

    def p_yes(self, last, extra) -> list[float]:
        """P(Yes)/(P(Yes)+P(No)) per member from its last position and its spelling rows:
        row k * len(longer) + i of `extra` is member k's suffix followed by longer[i]."""
        stride = len(self.longer)

        def continuation(seq: tuple[int, ...]):
            rows = extra[self.longer.index(seq) :: stride]
            return rows[:, -len(seq) : -1]  # the positions that predict seq[1:]

        return yes_share(last, self.yes, self.no, continuation)

    def decode(self, next_ids, cache, mask, last_position) -> tuple[list[str], list[bool]]:
        """Greedy tokens from `next_ids` on, each row leaving the batch at an end-of-turn token,
        after `max_new_tokens`, or (Yes/No tasks) after a first token that starts Yes or No.
        Also which rows were cut: still running when the budget ran out."""
        import torch

        rows = list(range(len(next_ids)))  # batch row -> member
        generated: list[list[int]] = [[] for _ in rows]
        cut = [False] * len(rows)
        for step in range(self.max_new_tokens):
            keep = []
            for r, member in enumerate(rows):
                token = int(next_ids[r])
                generated[member].append(token)  # an end-of-turn token too, as `generate` keeps
                # it (decoding skips it when it is a special token, as end-of-turn tokens are)
                if token in self.eos:
                    continue
                if not (step == 0 and token in self.answer_starts):
                    keep.append(r)
            if not keep:
                break
            if step == self.max_new_tokens - 1:
                for r in keep:
                    cut[rows[r]] = True
                break
            if len(keep) < len(rows):  # finished rows leave the batch
                index = torch.tensor(keep, device=mask.device)
                cache.batch_select_indices(index)
                next_ids, mask, last_position = next_ids[index], mask[index], last_position[index]
                rows = [rows[r] for r in keep]
            mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=1)
            last_position = last_position + 1
            logits, cache = self.forward(
                cache,
                1,
                input_ids=next_ids[:, None],
                attention_mask=mask,
                position_ids=last_position[:, None],
            )
            next_ids = greedy_tokens(logits[:, -1])
        return [self.tokenizer.decode(t, skip_special_tokens=True).strip() for t in generated], cut
