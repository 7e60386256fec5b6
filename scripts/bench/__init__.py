"""Speed benchmarks as a library: each returns a report object the scripts print and the tests
read (`scripts/bench_*.py` are thin command lines over these).

    train_variants   LoRA SFT training speed, every variant (padding, packing, kernels, ZeRO)
    train_steps      one variant: its model, optimizer or ZeRO engine, timed steps, figures
    eval_speed       evaluation prefill and generation speed per task and mode
    train_launch     tokens/s of a real `train/sft.py` launch (deepspeed / torchrun)
    workload         models of real architectures from configs/models, data-shaped lengths
    flops            the FLOP and MFU arithmetic
    options          command-line options generated from a settings dataclass
"""
