#!/bin/bash
# One node of a multi-node run: one torchrun that starts this node's workers and meets the other
# nodes at MASTER_ADDR:MASTER_PORT. scripts/train_slurm.sh runs it on every node with srun; any
# other scheduler (or a test on loopback) runs it once per node with these variables set:
#
#   SLURM_JOB_NUM_NODES  nodes in the run          SLURM_NODEID  this node's rank (0 ... N-1)
#   SLURM_JOB_ID         the rendezvous id         MASTER_ADDR   node 0's address
#   MASTER_PORT          (default 29500)           GPUS_PER_NODE workers per node (default 8)
#
#   scripts/train_node.sh configs/train/qwen2.5-7b-instruct.yaml --dataset_dir=/shared/prepared
#
# Every node must be started with the same recipe, overrides and prepared data: the workers
# compare them before the first step and all stop if one differs.
set -euo pipefail

RECIPE=${1:?usage: scripts/train_node.sh RECIPE.yaml [--key=value ...]}
shift
: "${SLURM_JOB_NUM_NODES:?} ${SLURM_NODEID:?} ${SLURM_JOB_ID:?} ${MASTER_ADDR:?}"
# On SIGTERM torchrun waits this long for its workers (finish the step, save) before killing them.
export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=${TORCH_ELASTIC_SHUTDOWN_TIMEOUT:-240}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
cd "$(dirname "$0")/.."
# `exec`: SIGTERM reaches torchrun, which forwards it to the workers.
exec "${TORCHRUN:-torchrun}" \
    --nnodes="$SLURM_JOB_NUM_NODES" \
    --nproc_per_node="${GPUS_PER_NODE:-8}" \
    --node_rank="$SLURM_NODEID" \
    --rdzv_backend=c10d \
    --rdzv_endpoint="$MASTER_ADDR:${MASTER_PORT:-29500}" \
    --rdzv_id="$SLURM_JOB_ID" \
    train/sft.py --config "$RECIPE" --resume_from_checkpoint=auto "$@"
