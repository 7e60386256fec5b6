"""A bf16 model's answer scores come from the answer position's hidden state times the head's
rows in fp32 (`exact_answer_logits`): its own logits are rounded to steps of 0.125-0.25 and tie.
A model whose logits are not its head's product (a scale or cap not known here) keeps its own."""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from fincheck.inference.generation import exact_answer_logits, output_head_inputs  # noqa: E402
from fincheck.train.tiny_model import TINY_MODEL_SHAPE  # noqa: E402

SPELLINGS = [(5,), (7, 9), (11,)]  # first tokens 5, 7, 11


def _bf16_model():
    torch.manual_seed(0)
    config = transformers.Qwen2Config(vocab_size=97, **TINY_MODEL_SHAPE)
    model = transformers.Qwen2ForCausalLM(config).to(torch.bfloat16).eval()
    with torch.no_grad():  # logits of a real model's size (16-32), where bf16 steps are 0.125
        model.lm_head.weight.mul_(40)
    return model


def _answer_position(model):
    ids = torch.randint(0, 97, (6, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), output_head_inputs(model) as hidden:
        rounded = model(input_ids=ids).logits[:, -1]
    return hidden[0][:, -1], rounded


@torch.no_grad()
def test_answer_logits_are_the_hidden_state_times_the_head_in_fp32():
    model = _bf16_model()
    hidden, rounded = _answer_position(model)
    exact = exact_answer_logits(model, hidden, SPELLINGS, rounded)
    assert exact.dtype == torch.float32 and exact.shape == rounded.shape
    weights = model.lm_head.weight
    for token in (5, 7, 11):
        by_hand = hidden.float() @ weights[token].float()
        assert torch.allclose(exact[:, token], by_hand, atol=1e-4)  # up to summation order
    others = [t for t in range(97) if t not in (5, 7, 11)]
    assert torch.isinf(exact[:, others]).all()
    gap = (exact[:, [5, 7, 11]] - rounded[:, [5, 7, 11]].float()).abs()
    assert gap.max() <= 0.25 and gap.max() > 0  # within bf16's rounding, and not the same
    share = torch.softmax(exact, -1)[:, 5] / torch.softmax(exact, -1)[:, [5, 11]].sum(-1)
    by_hand = torch.sigmoid(exact[:, 5] - exact[:, 11])  # the normaliser cancels
    assert torch.allclose(share, by_hand)


def test_a_model_whose_logits_are_not_its_heads_product_keeps_its_own(caplog):
    model = _bf16_model()
    hidden, rounded = _answer_position(model)
    model.config.final_logit_softcapping = 2.0  # a cap Qwen2's forward never applies
    with caplog.at_level(logging.WARNING):
        kept = exact_answer_logits(model, hidden, SPELLINGS, rounded)
    assert kept is rounded and "not its head's product" in caplog.text
