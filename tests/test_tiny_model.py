"""The tiny test model and tokenizer: loadable with plain transformers, deterministic, no download."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from fincheck.train.tiny_model import (
    CHAT_TEMPLATE_FILE,
    EOS_TOKEN,
    PAD_TOKEN,
    TOKENIZER_FILE,
    build_tiny_model,
    build_tiny_tokenizer,
    save_tiny_base,
    train_tiny_tokenizer,
)

TEXTS = [
    "The company reported a profit of $4.1 billion in 2019.",
    "Привет, мир! 你好，世界 🙂\tend",
    '{"Faithfulness": true, "Factuality": false}',
    "A. first\nB. second\n\n  trailing   spaces ",
]
MESSAGES = [
    {"role": "system", "content": "You check facts."},
    {"role": "user", "content": "Document: the sky is green.\nSummary: the sky is blue."},
    {"role": "assistant", "content": "A. The summary says blue; the document says green."},
]


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    return save_tiny_base(tmp_path_factory.mktemp("tiny") / "base")


def test_saved_base_loads_with_auto_classes_and_matches_builder(base_dir):
    model = AutoModelForCausalLM.from_pretrained(base_dir)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    ours = build_tiny_tokenizer()
    assert model.config.model_type == "qwen2"
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 64
    assert model.config.vocab_size == len(ours) == 1024
    for text in TEXTS:
        assert tokenizer(text)["input_ids"] == ours(text)["input_ids"]
    assert tokenizer.apply_chat_template(MESSAGES) == ours.apply_chat_template(MESSAGES)
    expected = build_tiny_model(seed=0).state_dict()
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0)


def test_special_tokens_eos_distinct_from_pad():
    tokenizer = build_tiny_tokenizer()
    assert tokenizer.eos_token == EOS_TOKEN and tokenizer.pad_token == PAD_TOKEN
    assert tokenizer.eos_token_id != tokenizer.pad_token_id
    assert tokenizer.bos_token is None  # nothing is prepended: the chat template says it all
    # Each special token is one id, never split into bytes.
    for token in ("<|im_start|>", EOS_TOKEN, PAD_TOKEN):
        assert len(tokenizer(token)["input_ids"]) == 1


def test_chat_template_comes_from_file_and_is_chatml():
    tokenizer = build_tiny_tokenizer()
    assert tokenizer.chat_template == CHAT_TEMPLATE_FILE.read_text(encoding="utf-8")
    text = tokenizer.apply_chat_template(MESSAGES[:2], tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nYou check facts.<|im_end|>\n"
        "<|im_start|>user\nDocument: the sky is green.\nSummary: the sky is blue.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_any_text_round_trips_through_bytes():
    tokenizer = build_tiny_tokenizer()
    for text in TEXTS:
        ids = tokenizer(text)["input_ids"]
        assert tokenizer.decode(ids) == text


def test_model_weights_are_seeded():
    a = build_tiny_model(seed=0).state_dict()
    b = build_tiny_model(seed=0).state_dict()
    c = build_tiny_model(seed=1).state_dict()
    name = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(a[name], b[name])
    assert not torch.equal(a[name], c[name])


def test_shipped_tokenizer_is_what_the_build_script_trains():
    shipped = json.loads(TOKENIZER_FILE.read_text(encoding="utf-8"))
    rebuilt = json.loads(train_tiny_tokenizer().to_str())
    assert rebuilt["model"]["vocab"] == shipped["model"]["vocab"]
    assert rebuilt["model"]["merges"] == shipped["model"]["merges"]
    assert TOKENIZER_FILE.stat().st_size < 100_000
