"""Launched by tests/test_train_distributed.py under `deepspeed --num_gpus 2` with ZeRO-3:
train tiny-cpu, save, then gather the partitioned LoRA weights in memory and compare them with
the saved adapter_model.safetensors. Writes the comparison to <output_dir>/zero3_check.json.

    deepspeed --num_gpus 2 tests/zero3_adapter_check.py --config configs/train/tiny-cpu.yaml \
        --deepspeed=configs/deepspeed/zero3.json --dataset_dir=... --output_dir=...
"""

from __future__ import annotations

import json
import sys

import deepspeed
import torch
from safetensors.torch import load_file

from fincheck.train.launch import split_config_arg
from fincheck.train.sft import build_trainer, load_training_recipe, train_and_save


def main() -> int:
    argv = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]
    config, rest = split_config_arg(argv)
    run = build_trainer(load_training_recipe(config, rest))
    status = train_and_save(run)
    model = run.trainer.model
    lora = {n: p for n, p in model.named_parameters() if "lora_" in n}
    partitioned = all(hasattr(p, "ds_id") for p in lora.values())
    with deepspeed.zero.GatheredParameters(list(lora.values()), modifier_rank=None):
        in_memory = {n.replace(".default", ""): p.detach().clone().float() for n, p in lora.items()}
    if run.trainer.args.process_index == 0:
        saved = load_file(str(run.output_dir / "adapter_model.safetensors"))
        report = {
            "status": status,
            "partitioned": partitioned,
            "saved_keys": sorted(saved),
            "memory_keys": sorted(in_memory),
            "empty": [k for k, t in saved.items() if t.numel() == 0],
            "max_abs_diff": max(
                (saved[k].float() - in_memory[k]).abs().max().item()
                for k in saved
                if k in in_memory
            ),
            "lora_B_abs_sum": sum(t.abs().sum().item() for k, t in saved.items() if "lora_B" in k),
            "shapes_equal": all(
                saved[k].shape == in_memory[k].shape for k in saved if k in in_memory
            ),
        }
        (run.output_dir / "zero3_check.json").write_text(json.dumps(report, indent=2))
    torch.distributed.barrier()
    return status


if __name__ == "__main__":
    sys.exit(main())
