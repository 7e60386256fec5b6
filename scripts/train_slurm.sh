#!/bin/bash
# Multi-node LoRA SFT under SLURM: one torchrun per node, 8 GPUs each, rendezvous on node 0.
#
#   sbatch --nodes=2 scripts/train_slurm.sh configs/train/qwen2.5-7b-instruct.yaml \
#       --dataset_dir=/shared/prepared --gradient_accumulation_steps=1
#
# Global batch = per_device_train_batch_size x gradient_accumulation_steps x (nodes x 8).
# Preemption: SLURM sends SIGTERM before killing (see --signal below); the workers save a
# checkpoint at the next step and exit 143 (torchrun itself then exits 1: its own status, see
# docs/reliability.md). With --requeue the job restarts and --resume_from_checkpoint=auto picks
# up the last complete checkpoint.
#SBATCH --job-name=fincheck-sft
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=64
#SBATCH --time=12:00:00
#SBATCH --signal=TERM@300
#SBATCH --requeue
#SBATCH --output=logs/%x-%j.out
set -euo pipefail

RECIPE=${1:?usage: sbatch scripts/train_slurm.sh RECIPE.yaml [--key=value ...]}
shift
export GPUS_PER_NODE=${GPUS_PER_NODE:-8}
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_PORT=${MASTER_PORT:-29500}
mkdir -p logs

# `srun` starts one scripts/train_node.sh per node (SLURM sets SLURM_NODEID, SLURM_JOB_NUM_NODES,
# SLURM_JOB_ID there); each starts one torchrun with GPUS_PER_NODE workers.
srun --kill-on-bad-exit=1 scripts/train_node.sh "$RECIPE" "$@"
