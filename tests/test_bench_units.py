"""The benchmarks' workload: architectures of configs/models/ at their published sizes, and the
prepared data's token lengths, estimated and exact."""

from __future__ import annotations

import pytest

from bench import workload as wl
from fincheck.errors import FincheckError


def test_real_architectures_have_their_published_sizes():
    import torch
    from transformers import AutoModelForCausalLM

    for name, total in (
        ("qwen2.5-0.5b", 494_032_768),
        ("qwen2.5-1.5b", 1_543_714_304),
        ("llama-3.2-1b", 1_235_814_400),
    ):
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(wl.load_model_config(name))
        assert sum(p.numel() for p in model.parameters()) == total, name


def test_lengths_estimate(tmp_path):
    messages = [{"role": "system", "content": "x" * 8}, {"role": "user", "content": "y" * 9}]
    assert wl.estimate_tokens(messages) == 5 + 2 * 5  # ceil(17 / 4) + 5 per message
    assert wl.estimate_tokens(messages, add_generation_prompt=True) == 5 + 10 + 3


def test_unknown_model_and_missing_prepared_dir_say_what_to_do(tmp_path):
    with pytest.raises(FincheckError, match=r"known: .*qwen2\.5-1\.5b"):
        wl.load_model_config("qwen9")
    with pytest.raises(FincheckError, match="fincheck prepare"):
        wl.prepared_lengths(tmp_path, "train")


def test_count_tokens_uses_the_chat_template():
    from fincheck.train.tiny_model import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    messages = [
        {"role": "system", "content": "Check facts."},
        {"role": "user", "content": "Is it so?"},
    ]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    expected = len(tokenizer(rendered, add_special_tokens=False)["input_ids"])
    assert wl.count_tokens(tokenizer, messages, add_generation_prompt=True) == expected
