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
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_PORT=${MASTER_PORT:-29500}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
# On SIGTERM torchrun waits this long for its workers (finish the step, save) before killing them.
export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=${TORCH_ELASTIC_SHUTDOWN_TIMEOUT:-240}
mkdir -p logs

# `srun` starts one torchrun per node; each torchrun starts GPUS_PER_NODE workers. `exec` inside
# bash -c lets SIGTERM reach torchrun, which forwards it to the workers.
srun --kill-on-bad-exit=1 bash -c "exec torchrun \
    --nnodes=$SLURM_JOB_NUM_NODES \
    --nproc_per_node=$GPUS_PER_NODE \
    --node_rank=\$SLURM_NODEID \
    --rdzv_backend=c10d \
    --rdzv_endpoint=$MASTER_ADDR:$MASTER_PORT \
    --rdzv_id=$SLURM_JOB_ID \
    train/sft.py --config $RECIPE --resume_from_checkpoint=auto $*"
