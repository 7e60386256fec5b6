"""How `train/sft.py` runs under its launchers (`deepspeed`, `torchrun`, `accelerate`, SLURM's
per-node script, or none): the command line, each process's share of the CPU cores, a
one-process group for DeepSpeed outside a launcher, DeepSpeed's first CPU build said once, and
the checks every process of a launch makes together (one GPU each, one run on every rank) and
its leaving the group together at the end."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

from fincheck.errors import FincheckError
from fincheck.io.safe_files import write_text
from fincheck.train.recipe import SFTRecipe
from fincheck.train.resume import recipe_files

USAGE = "usage: train/sft.py --config RECIPE.yaml [--key=value ...]  (--help)"


def share_cpu_threads() -> None:
    """Several processes on one machine: give each its share of the cores.

    torchrun sets OMP_NUM_THREADS=1 itself, the `deepspeed` and `accelerate` launchers do not;
    with every process using all cores, tiny-cpu on 2 processes / 2 cores ran at 4.1K tokens/s
    instead of 10K. torch is imported by then (the recipe is TRL's), so the environment
    variable would come too late: torch.set_num_threads sizes the pool.
    """
    local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    if local > 1 and "OMP_NUM_THREADS" not in os.environ:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))


def single_process_group_env() -> None:
    """DeepSpeed outside a launcher (`fincheck train`, `python train/sft.py`): describe a
    one-process group in the environment, otherwise DeepSpeed goes looking for MPI."""
    if "WORLD_SIZE" in os.environ:
        return
    with socket.socket() as s:  # a TCP port nothing listens on now: the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )


def deepspeed_build_pending() -> Path | None:
    """Where DeepSpeed will compile its CPU communication kernel when it has not yet done so on
    this machine (it does, silently, on the first CPU run: minutes on 2 cores), else None."""
    import torch

    if torch.cuda.is_available():
        return None
    try:
        from torch.utils.cpp_extension import _get_build_directory

        folder = Path(_get_build_directory("deepspeed_shm_comm", verbose=False))
    except Exception:  # a private helper of torch: no notice rather than no training
        return None
    return None if (folder / "deepspeed_shm_comm.so").exists() else folder


def announce_deepspeed_build() -> None:
    folder = deepspeed_build_pending()
    if folder is not None and os.environ.get("LOCAL_RANK", "0") == "0":
        print(
            "DeepSpeed compiles its CPU communication kernel (deepspeed_shm_comm) on this first "
            f"run: about 1-3 minutes on 2 cores, once per machine (cached in {folder})",
            file=sys.stderr,
            flush=True,
        )


def check_one_gpu_per_process(n_gpu: int) -> None:
    """Tree packing needs one GPU per process: with several GPUs and no launcher the Trainer
    wraps the model in nn.DataParallel, which would split the logit positions along the batch
    and leave the attention mask on the first GPU."""
    if n_gpu > 1:
        raise FincheckError(
            f"tree_packing: this one process sees {n_gpu} GPUs; launch one process per GPU "
            f"(deepspeed --num_gpus {n_gpu} train/sft.py ..., or torchrun --nproc_per_node "
            f"{n_gpu}), or train on one: CUDA_VISIBLE_DEVICES=0"
        )


def recipe_identity(recipe: SFTRecipe) -> str:
    """Every key the recipe declares, as one digest: what all processes of a launch must share
    (a node started with another learning rate or another max_steps trains another run). The
    files it names (data mixture, DeepSpeed config, chat template) count by their content: two
    nodes may reach the same file by two paths, never hold two mixtures under one path."""
    files = {key: f"sha256:{sha}" for key, sha in recipe_files(recipe).items()}
    text = json.dumps({**recipe.declared, **files}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def check_one_run_on_every_rank(identity: dict[str, str]) -> None:
    """All processes of a launch, on every node, were started with the same recipe, prepared
    data and base: each rank compares its own with every other's, and each one that differs
    from rank 0's stops every rank before the first step (a node launched with another recipe
    or data would train a mix of two runs, or hang at the first collective)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, identity)
    differ = sorted(
        {key for other in gathered for key in identity if other[key] != gathered[0][key]}
    )
    if differ:
        ranks = [rank for rank, other in enumerate(gathered) if other != gathered[0]]
        raise FincheckError(
            f"the processes of this launch were not started with the same {' and '.join(differ)}"
            f" (rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} "
            f"differ{'' if len(ranks) > 1 else 's'} from rank 0): start every node with the same recipe, overrides, prepared data and base (this is "
            f"rank {dist.get_rank()}); nothing was trained"
        )


def check_each_saving_node_has_its_own_disk(recipe: SFTRecipe, output_dir: Path) -> None:
    """With `save_on_each_node`, each node's first process saves under the same names, which on
    a disk the nodes share would be one folder written by several nodes at once (transformers
    says so: not on shared storage). A file world rank 0 writes in the run folder, looked for
    by every other saving process, tells: a shared disk stops every rank before the first step."""
    import torch.distributed as dist

    if not recipe.save_on_each_node or not dist.is_available() or not dist.is_initialized():
        return
    probe = output_dir / f".fincheck-node-probe-{os.getpid()}-{dist.get_rank()}"
    probes = [str(probe)]
    dist.broadcast_object_list(probes, src=0)  # world rank 0's name, on every process
    if dist.get_rank() == 0:
        write_text(probes[0], "a file only world rank 0's disk should hold\n")
    dist.barrier()
    rank = dist.get_rank()
    sees = rank != 0 and recipe.should_save and Path(probes[0]).exists()
    seen: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(seen, sees)
    if rank == 0:
        Path(probes[0]).unlink()
    if any(seen):
        ranks = ", ".join(str(r) for r, saw in enumerate(seen) if saw)
        raise FincheckError(
            f"save_on_each_node: rank {ranks} (a node's first process) sees world rank 0's "
            f"files in {output_dir}, so the nodes share this disk and would write one checkpoint "
            "at once: leave save_on_each_node off on a shared disk; nothing was trained"
        )


def leave_process_group() -> None:
    """Every process leaves the group together at the end of a run: on several nodes the
    rendezvous store lives in node 0's launcher, which exits with its own workers; a worker of
    another node still holding the group would then abort (SIGABRT) on the lost connection,
    after a run that succeeded."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def split_config_arg(argv: list[str]) -> tuple[str | None, list[str]]:
    """(the recipe, the `--key=value` overrides) of a command line. The `deepspeed` launcher
    appends --local_rank=N; LOCAL_RANK in the environment says the same, so it is dropped."""
    parser = argparse.ArgumentParser(
        prog="train/sft.py", usage=USAGE.removeprefix("usage: "), add_help=False, allow_abbrev=False
    )
    parser.add_argument("--config")
    parser.add_argument("--local_rank", "--local-rank")
    known, rest = parser.parse_known_args(argv)
    return known.config, rest
