"""FLOP counts and device peaks for model-FLOP utilisation (MFU), as pure functions.

Two conventions are reported side by side, because LoRA changes the arithmetic:

* LoRA convention (what the hardware must do for LoRA SFT), per trained-on token:
      forward          2·N        (every matmul weight, once: multiply + add)
      backward         2·N        (gradients w.r.t. activations only: the base weights are
                                   frozen, so the 2·N of weight gradients is skipped)
      adapters         6·N_lora   (the usual fwd + both backward passes of the LoRA A/B matrices)
  plus attention (score and value matmuls, which have no weights):
      forward per sequence of length L, per layer = 2·L²·d_attn  (QKᵀ 2·L²·d and A·V 2·L²·d,
      halved because a causal mask leaves half of the L×L scores to compute)
      training = 3 × forward (backward needs dQ, dK and dV: twice the forward).
* Full fine-tuning convention 6·N·tokens (weights and activations both get gradients),
  the number most frameworks print; for LoRA it overstates the work by ~1.5x.

N counts matmul weights only: the q/k/v/o and MLP projections of every layer plus the LM head
(vocab × hidden, counted even when tied to the embedding, because its matmul runs). The
embedding lookup, norms and biases do no matmul and are left out. Tokens are real tokens only:
padding is never counted, so a padded batch shows the FLOPs it wasted as lower MFU.
Gradient checkpointing recomputes the forward; that recompute is not counted (MFU, not HFU).
"""

from __future__ import annotations

from dataclasses import dataclass

# Dense (no sparsity) bf16 tensor-core peaks from the vendors' data sheets, in TFLOP/s.
# Matched against torch.cuda.get_device_name() in this order (first substring wins).
DEVICE_PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("GH200", 989.4),
    ("H200", 989.4),  # same compute as the H100 SXM, more and faster memory
    ("H100", 989.4),  # H100 SXM5 (reported as "NVIDIA H100 80GB HBM3")
    ("A100", 312.0),
    ("L40S", 362.0),
    ("A10G", 70.0),
    ("L4", 121.0),
)


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder-only transformer that its FLOPs depend on."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def from_config(cls, config) -> ModelShape:
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(
            hidden=config.hidden_size,
            layers=config.num_hidden_layers,
            heads=heads,
            kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            intermediate=config.intermediate_size,
            vocab=config.vocab_size,
        )

    @property
    def attn_dim(self) -> int:
        return self.heads * self.head_dim

    def linear_shapes(self) -> list[tuple[int, int]]:
        """(in, out) of the per-layer linears LoRA's all-linear targets: q, k, v, o, gate, up, down."""
        h, d_q, d_kv, ff = (
            self.hidden,
            self.attn_dim,
            self.kv_heads * self.head_dim,
            self.intermediate,
        )
        return [(h, d_q), (h, d_kv), (h, d_kv), (d_q, h), (h, ff), (h, ff), (ff, h)]

    def matmul_params(self) -> int:
        """N: weights that multiply every token (all layers' linears + the LM head)."""
        per_layer = sum(i * o for i, o in self.linear_shapes())
        return self.layers * per_layer + self.vocab * self.hidden

    def lora_params(self, rank: int) -> int:
        """Trainable parameters of LoRA rank `rank` on every linear of every layer (not the head)."""
        return self.layers * sum(rank * (i + o) for i, o in self.linear_shapes())

    def attention_forward_flops(self, seq_len: int) -> int:
        """Causal attention score + value matmuls of one sequence, all layers, forward only."""
        return 2 * seq_len * seq_len * self.attn_dim * self.layers


def device_peak_tflops(device_name: str) -> float | None:
    """Dense bf16 peak of a known GPU by name, or None (CPU, unknown GPU)."""
    return next((peak for key, peak in DEVICE_PEAK_BF16_TFLOPS if key in device_name), None)


def mfu(flops: float, seconds: float, peak_tflops: float | None) -> float | None:
    """Model-FLOP utilisation in [0, 1], or None when the peak is unknown."""
    if not peak_tflops or seconds <= 0:
        return None
    return flops / seconds / (peak_tflops * 1e12)
