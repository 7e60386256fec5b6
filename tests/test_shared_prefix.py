"""The shared-prefix path (`fincheck.inference.shared_prefix`): the prefix tree by hand, and its answers
against the plain `generate` path on the tiny model: the same greedy texts, the same P(Yes)."""

from __future__ import annotations

import pytest

from fincheck.inference.prefix_tree import PrefixNode, build_prefix_tree, count_prefill_tokens
from fincheck.inference.shared_prefix import leaf_batches, walk_order


def _shape(node: PrefixNode) -> tuple:
    return (node.depth, sorted(node.leaves), [_shape(c) for c in node.children])


def test_the_tree_shares_documents_and_sentences_and_leaves_each_prompt_a_token():
    system, doc_a, doc_b = list(range(100, 140)), list(range(200, 300)), list(range(300, 400))
    sent_1, sent_2 = list(range(500, 540)), list(range(600, 640))
    ids = [
        system + doc_a + sent_1 + [1, 2],  # 0 \
        system + doc_a + sent_1 + [3, 4],  # 1  } doc A, sentence 1
        system + doc_a + sent_1 + [5],  # 2   /
        system + doc_a + sent_2 + [1],  # 3  doc A, sentence 2
        system + doc_a + sent_2 + [2],  # 4
        system + doc_b + [7, 8],  # 5  doc B alone: a leaf of the root
        system + doc_a + sent_1 + [5],  # 6  a duplicate of 2
    ]
    tree = build_prefix_tree(ids)
    assert _shape(tree) == (
        40,  # the system prompt, shared by all; doc B's one prompt is a leaf of it
        [5],
        [
            (
                140,  # + doc A
                [],
                # + each sentence; the duplicates 2 and 6 share all but their last token, which
                # the cap leaves them, so they stay leaves of sentence 1
                [(180, [0, 1, 2, 6], []), (180, [3, 4], [])],
            )
        ],
    )
    # the system prompt once, doc B's prompt beyond it, doc A once, each sentence once, suffixes
    assert count_prefill_tokens(ids, tree) == 40 + 102 + 100 + (40 + 6) + (40 + 2)
    assert sum(map(len, ids)) == 1230  # what the plain path runs


@pytest.mark.parametrize(
    "ids",
    [
        [[1, 2, 3]],
        [[1, 2, 3], [1, 2, 3]],
        [[1, 2], [1, 2, 3, 4]],
        [[5] * 40 + [1], [5] * 40 + [2], [6]],
        [[*range(50), k] for k in range(5)] + [list(range(50))],
    ],
)
def test_every_prompt_is_answered_once_with_a_suffix_of_its_own(ids):
    tree = build_prefix_tree(ids)
    assert sorted(tree.prompts()) == list(range(len(ids)))

    def check(node: PrefixNode, parent: int) -> None:
        assert node.depth >= parent
        for i in node.prompts():
            assert ids[i][: node.depth] == ids[node.prompts()[0]][: node.depth]
            assert len(ids[i]) > node.depth  # its last position is its own
        for child in node.children:
            check(child, node.depth)

    check(tree, 0)
    assert build_prefix_tree([]).prompts() == []


# ------------------------------------------------------------------------ against the plain path

import torch  # noqa: E402

from fincheck.data.pairs import read_pairs  # noqa: E402
from fincheck.data.prompting import YES_NO, YES_SPELLINGS  # noqa: E402
from fincheck.inference import generation as inference  # noqa: E402
from fincheck.inference.shared_prefix import answer_prompts  # noqa: E402
from fincheck.models.loading import LoadOptions, load_model  # noqa: E402
from fincheck.tasks import get_task, task_names  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tiny_base):
    loaded = load_model(str(tiny_base), options=LoadOptions(device="cpu"))
    return loaded.model, loaded.tokenizer


def _prompts(tokenizer, small_prepared, task: str) -> list[str]:
    """Rendered prompts that share at three depths: the task's instructions, a document (two
    documents, each with three summaries), and nothing (the other task's prompts)."""
    pairs = list(read_pairs(small_prepared / task / "test.jsonl", task_names()))
    if task == "qasem":  # 6 QAs over 3 documents: shared as they come
        messages = [p.prompt_messages for p in pairs]
    else:
        parts = [p.user_content.split("\n\nSummary:\n") for p in pairs]
        heads = list(dict.fromkeys(head for head, _ in parts))[:2]
        tails = list(dict.fromkeys(tail for _, tail in parts))[:3]
        assert len(heads) == 2 and len(tails) == 3
        system = pairs[0].prompt_messages[0]
        messages = [
            [system, {"role": "user", "content": f"{head}\n\nSummary:\n{tail}"}]
            for head in heads
            for tail in tails
        ]
    return [inference.render_chat(tokenizer, m, add_generation_prompt=True) for m in messages]


def _answers(model, tokenizer, prompts, max_new_tokens, share, batch_size=2, cut=None):
    texts, p_yes = [None] * len(prompts), [None] * len(prompts)
    sizes = []
    for batch in answer_prompts(
        model, tokenizer, prompts, max_new_tokens, batch_size=batch_size, share=share
    ):
        sizes.append(len(batch.indices))
        for k, i in enumerate(batch.indices):
            texts[i] = batch.texts[k]
            p_yes[i] = batch.p_yes[k] if share else None
            if cut is not None:
                cut[i] = batch.cut[k]
    return texts, p_yes, sizes


@pytest.mark.parametrize("task", ["final", "fhsumbench"])
def test_generated_texts_are_the_plain_paths(tiny, small_prepared, task):
    model, tokenizer = tiny
    prompts = _prompts(tokenizer, small_prepared, task)
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    tree = build_prefix_tree(ids)
    assert len(tree.children) == 2  # one node per document, below the instructions
    assert count_prefill_tokens(ids, tree) < sum(map(len, ids)) / 2
    share = get_task(task).first_word_share  # FINAL: p_yes read, the list written on
    texts, p_yes, sizes = _answers(model, tokenizer, prompts, 6, share=share)
    assert sorted(sizes) == [1, 1, 2, 2]  # two batches of <= 2 under each document
    for k, (prompt, text) in enumerate(zip(prompts, texts, strict=True)):
        alone, plain_p = inference.generate_batch(model, tokenizer, [prompt], 6, share)
        assert text == alone[0]
        if share:
            assert p_yes[k] == pytest.approx(plain_p[0], abs=1e-5)
    assert (share is None) == (task == "fhsumbench")


def _generated_ids(model, tokenizer, prompt: str, max_new_tokens: int) -> list[int]:
    enc = tokenizer([prompt], return_tensors="pt", add_special_tokens=False)
    config = inference.greedy_config(model, tokenizer, max_new_tokens)
    with torch.no_grad():
        out = model.generate(**enc, generation_config=config)
    return out.sequences[0, enc["input_ids"].shape[1] :].tolist()


def test_rows_leave_the_batch_at_their_end_of_turn_token(tiny, small_prepared):
    """The end-of-turn token set to one the rows write at different steps (or never): rows
    leave their batch at different steps, and every text is still the plain path's."""
    model, tokenizer = tiny
    prompts = _prompts(tokenizer, small_prepared, "fhsumbench")
    generated = [_generated_ids(model, tokenizer, p, 24) for p in prompts]

    def stop_steps(token: int) -> list[int | None]:
        return [ids.index(token) if token in ids else None for ids in generated]

    stop = max({t for ids in generated for t in ids}, key=lambda t: len(set(stop_steps(t))))
    assert len(set(stop_steps(stop))) >= 3  # e.g. rows stopping at steps 9 and 15, and never
    saved = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = [stop]
    try:
        expected = [inference.generate_batch(model, tokenizer, [p], 24)[0][0] for p in prompts]
        cut = [None] * len(prompts)
        texts, _, _ = _answers(model, tokenizer, prompts, 24, None, batch_size=3, cut=cut)
    finally:
        model.generation_config.eos_token_id = saved
    assert texts == expected
    # cut: still writing when the 24-token budget ran out (no end-of-turn token in it)
    assert cut == [step is None for step in stop_steps(stop)]
    assert True in cut and False in cut


def test_p_yes_is_the_plain_paths(tiny, small_prepared):
    """QASem: P(Yes) within 1e-5 of the plain path (the tiny tokenizer spells Yes/No in one
    token and in several, so both the first position and the teacher-forced rows are used)."""
    model, tokenizer = tiny
    spellings = inference.answer_spellings(tokenizer, YES_SPELLINGS)
    assert any(len(s) > 1 for s in spellings) and any(len(s) == 1 for s in spellings)
    prompts = _prompts(tokenizer, small_prepared, "qasem")
    texts, p_yes, _ = _answers(model, tokenizer, prompts, 4, share=YES_NO)
    for prompt, text, value in zip(prompts, texts, p_yes, strict=True):
        plain_text, plain_p = inference.generate_batch(model, tokenizer, [prompt], 4, YES_NO)
        assert value == pytest.approx(plain_p[0], abs=1e-5)
        assert plain_text[0].startswith(text) and text  # stops after Yes/No, else writes on


def test_leaf_batches_hold_similar_lengths_the_longest_first():
    lengths = [5, 90, 7, 60, 88, 6, 59, 91, 8]
    assert leaf_batches(lengths, 3) == [[7, 1, 4], [3, 6, 8], [2, 5, 0]]  # 91 90 88 | 60 59 8 | ...


def test_walk_order_keeps_the_longest_batch_first_and_mixes_the_rest():
    batches = [[k] for k in range(10)]
    children = [PrefixNode(40, [k]) for k in range(10, 20)]
    order = walk_order(batches, children)
    assert order[0] == [0]
    assert sorted(map(id, order)) == sorted(map(id, [*batches, *children]))
    first_half = order[1:10]  # leaves and children mixed, not leaves first
    assert any(isinstance(u, PrefixNode) for u in first_half)
    assert any(not isinstance(u, PrefixNode) for u in first_half)
    assert walk_order(batches, children) == order  # seeded
