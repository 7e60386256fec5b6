"""Tree packing on a GPU (`gpu` marker; skipped without CUDA): FlexAttention, the kernel every
GPU recipe trains with, gives each answer token the loss of its pair run alone, and a training
step the same LoRA gradients, in fp32. `scripts/gpu_check.py` runs these first."""

from __future__ import annotations

import pytest
from tree_exactness import max_gradient_difference, max_token_loss_difference, synthetic_rows

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def lora_model(config, attn: str, device: str = "cuda"):
    """A random-init model of `config` with LoRA on every linear layer, B random too (at its
    zero init no gradient reaches A: half the adapter would go unchecked)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    config._attn_implementation = attn
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear")
    model = get_peft_model(model, lora)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.02)
    return model


@pytest.fixture(params=["tiny", "qwen2.5-0.5b"])
def config(request):
    """The tiny test model and the Qwen2.5-0.5B architecture (configs/models/), random init."""
    from bench.workload import load_model_config

    return load_model_config(request.param)


def test_flex_attention_gives_each_answer_token_the_loss_of_its_pair_alone(config):
    model = lora_model(config, "flex_attention").eval()
    rows = synthetic_rows(config.vocab_size, seed=1)
    assert max_token_loss_difference(model, rows, budget=1024, device="cuda") <= 1e-5


def test_flex_attention_gives_a_step_the_lora_gradients_of_the_pairs_alone(config):
    model = lora_model(config, "flex_attention").train()
    rows = synthetic_rows(config.vocab_size, seed=2)
    assert max_gradient_difference(model, rows, budget=1024, device="cuda") <= 1e-5
