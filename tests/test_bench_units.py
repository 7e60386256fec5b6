"""FLOP arithmetic and benchmark workload: hand-computed values and cross-checks against the
real modules (PEFT's LoRA parameter count, the model's linear weights)."""

from __future__ import annotations

import pytest

from bench import workload as wl
from bench.flops import ModelShape, device_peak_tflops, mfu
from fincheck.errors import FincheckError


def test_qwen25_15b_matmul_params_hand_computed():
    shape = ModelShape.from_config(wl.load_model_config("qwen2.5-1.5b"))
    # per layer: q 1536², k/v 1536·256 each, o 1536², gate/up/down 1536·8960 each
    per_layer = 2 * 1536 * 1536 + 2 * 1536 * 256 + 3 * 1536 * 8960
    assert per_layer == 46_792_704
    assert shape.matmul_params() == 28 * per_layer + 151_936 * 1536 == 1_543_569_408
    # r=16: r·(in+out) summed over q,k,v,o,gate,up,down = 16·41,216 per layer
    assert shape.lora_params(16) == 28 * 16 * (3072 + 1792 + 1792 + 3072 + 3 * 10496) == 18_464_768
    # causal attention forward, one 2,048-token sequence: 2·L²·(12·128)·28
    assert shape.attention_forward_flops(2048) == 2 * 2048**2 * 1536 * 28


def test_an_mfu_by_the_lora_convention_hand_computed():
    """45k tokens/s of Qwen2.5-1.5B at seq 2,048 is ~31% MFU on an H100 by the LoRA convention:
    (4·N + 6·N_lora) per token, plus 3 x the causal attention forward per sequence."""
    shape = ModelShape.from_config(wl.load_model_config("qwen2.5-1.5b"))
    per_token = 4 * shape.matmul_params() + 6 * shape.lora_params(16)
    per_token += 3 * shape.attention_forward_flops(2048) / 2048
    assert 0.30 < mfu(per_token * 45_000, 1.0, device_peak_tflops("NVIDIA H100 80GB HBM3")) < 0.33


def test_counts_match_the_real_tiny_model_and_peft():
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    config = wl.load_model_config("tiny")
    shape = ModelShape.from_config(config)
    model = AutoModelForCausalLM.from_config(config)
    linears = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert shape.matmul_params() == linears  # the layers' projections + the (untied) LM head
    peft = get_peft_model(model, LoraConfig(r=16, target_modules="all-linear"))
    assert shape.lora_params(16) == sum(p.numel() for p in peft.parameters() if p.requires_grad)


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


def test_device_peaks():
    assert device_peak_tflops("NVIDIA H100 80GB HBM3") == 989.4
    assert device_peak_tflops("NVIDIA H200") == 989.4
    assert device_peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert device_peak_tflops("some CPU") is None
    assert mfu(1e12, 1.0, None) is None


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
