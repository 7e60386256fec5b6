"""A tiny trained-run folder for the serve tests, built in about a second on the CPU.

Shape of what `fincheck train` leaves in `checkpoints/<run>/`: a LoRA adapter (safetensors),
the tokenizer with its chat template, the resolved recipe, the data manifest, and the
random-init base saved in `base/`, recorded in `fincheck_run.json` as `fincheck train` does (it exists nowhere else). The base and tokenizer are
the project's tiny Qwen2 (`fincheck.train.tiny_model`); the adapter is untrained LoRA with
random B matrices (fresh LoRA has B = 0, a no-op that would make merge tests vacuous).
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml


def build_tiny_run(root: Path, seed: int = 0, max_length: int = 1024) -> Path:
    """Write a run folder under `root` and return its path."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from fincheck.io.checksums import folder_sha256
    from fincheck.tasks import prompt_hashes
    from fincheck.train.tiny_model import save_tiny_base

    run = root / "tiny-run"
    run.mkdir(parents=True)
    save_tiny_base(run / "base", seed=seed)
    base = AutoModelForCausalLM.from_pretrained(run / "base")
    tokenizer = AutoTokenizer.from_pretrained(run / "base")
    torch.manual_seed(seed)
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
    cfg["base_model_name_or_path"] = str(run / "base")  # PEFT records the absolute path
    cfg_path.write_text(json.dumps(cfg, indent=2))
    hashes = prompt_hashes(("final", "qasem", "fhsumbench"))
    recipe = {
        "model_name_or_path": "tiny-random-qwen2",
        "tasks": list(hashes),
        "lora_r": 4,
        "lora_alpha": 8,
        "max_length": max_length,
        "learning_rate": 1e-3,
    }
    (run / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    manifest = {"fingerprint": "sha256:" + "ab" * 32, "prompt_hashes": hashes, "counts": {}}
    (run / "data_manifest.json").write_text(json.dumps(manifest, indent=2))
    metadata = {
        "base_model": "base",
        "base_fingerprint": folder_sha256(run / "base"),  # the base inside the run, by content
        "recipe_fingerprint": "ef" * 8,
        "data_fingerprint": manifest["fingerprint"],
        "prompt_hashes": hashes,
    }
    (run / "fincheck_run.json").write_text(json.dumps(metadata, indent=2))
    return run
