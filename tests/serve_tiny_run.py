"""A tiny trained-run folder for the serve tests, built in seconds on the CPU.

Shape of what `fincheck train` leaves in `checkpoints/<run>/`: a LoRA adapter (safetensors),
the tokenizer with its chat template, the resolved recipe, the data manifest, and the
random-init base saved in `base_model/` (it exists nowhere else). The base is a 2-layer Llama
with a byte-level BPE tokenizer trained on the prompt files, so every character is encodable.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|pad|>", "<|im_start|>", "<|im_end|>"]


def build_tokenizer(vocab_size: int = 400):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from fincheck.prompting import PROMPT_DIR

    corpus = [p.read_text() for p in sorted(PROMPT_DIR.glob("*.txt"))]
    corpus += [
        "Yes",
        "No",
        "None",
        "A. The summary says",
        '{"Faithfulness": true, "Factuality": false}',
    ]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<|pad|>", eos_token="<|im_end|>", bos_token=None
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 512
    return fast


def build_tiny_run(root: Path, seed: int = 0, max_positions: int = 512) -> Path:
    """Write a run folder under `root` and return its path."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from fincheck.prompting import prompt_hashes

    run = root / "tiny-run"
    run.mkdir(parents=True)
    tokenizer = build_tokenizer()
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    base = LlamaForCausalLM(config)
    base.save_pretrained(run / "base_model", safe_serialization=True)
    tokenizer.save_pretrained(run / "base_model")
    lora = LoraConfig(
        r=4,
        lora_alpha=8,
        lora_dropout=0.0,
        target_modules=["q_proj", "v_proj"],
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(base, lora)
    # A trained adapter has a non-zero B; fresh LoRA has B = 0 (a no-op), which would make the
    # merge test vacuous. Give every B small random values instead.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.5)
    model.save_pretrained(run, safe_serialization=True)
    tokenizer.save_pretrained(run)
    cfg_path = run / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["base_model_name_or_path"] = str(run / "base_model")
    cfg_path.write_text(json.dumps(cfg, indent=2))
    hashes = prompt_hashes(("final", "qasem", "fhsumbench"))
    recipe = {
        "model_name_or_path": "tiny-random-llama",
        "tasks": list(hashes),
        "lora_r": 4,
        "lora_alpha": 8,
        "max_seq_length": max_positions,
        "learning_rate": 1e-3,
    }
    (run / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    manifest = {"fingerprint": "sha256:" + "ab" * 32, "prompt_hashes": hashes, "counts": {}}
    (run / "data_manifest.json").write_text(json.dumps(manifest, indent=2))
    return run
