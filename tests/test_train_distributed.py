"""2-process DeepSpeed runs of tiny-cpu on the CPU (gloo): ZeRO-2 and ZeRO-3 smoke runs, the
ZeRO-3 adapter holds the real gathered weights, and a resumed run repeats the uninterrupted
run's per-step losses."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fincheck.models.loading import load_adapter_model
from fincheck.train.checkpoints import COMPLETE_MARKER

REPO = Path(__file__).resolve().parents[1]
TINY = "configs/train/tiny-cpu.yaml"
STEPS = 24

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def deepspeed_launch(
    script: str, *args: str, timeout: int = 600, check: bool = True
) -> subprocess.CompletedProcess:
    """`deepspeed --num_gpus 2 SCRIPT ARGS` (the README's launch line), on a free port."""
    launcher = Path(sys.executable).parent / "deepspeed"
    port = free_port()
    cmd = [
        str(launcher) if launcher.exists() else "deepspeed",
        "--num_gpus",
        "2",
        "--master_port",
        str(port),
        script,
        *args,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    if script == "train/sft.py" and proc.returncode == 0:
        # DeepSpeed's CPU allreduce files (RAM until reboot) are removed at a normal exit; a rank
        # the launcher kills after another failed cannot remove its own
        assert not list(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{port}_*"))
    return proc


def step_losses(checkpoint: Path) -> dict[int, float]:
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    return {e["step"]: e["loss"] for e in state["log_history"] if "loss" in e}


@pytest.fixture(scope="module")
def mixture(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("mix") / "mix.yaml"
    path.write_text(
        "max_examples: {final: 16, qasem: 16, fhsumbench: 16}\nmin_grounding_kept: 0.0\n"
    )
    return path


def common_args(prepared_dir: Path, mixture: Path, out: Path) -> list[str]:
    return [
        "--config",
        TINY,
        f"--dataset_dir={prepared_dir}",
        f"--data_config={mixture}",
        f"--output_dir={out}",
        "--per_device_train_batch_size=2",
        f"--max_steps={STEPS}",
        "--save_steps=8",
        "--save_total_limit=3",
    ]


@pytest.fixture(scope="module")
def zero2_run(prepared_dir, mixture, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("zero2") / "run"
    deepspeed_launch(
        "train/sft.py",
        *common_args(prepared_dir, mixture, out),
        "--deepspeed=configs/deepspeed/zero2.json",
    )
    return out


def test_zero2_two_processes_train_and_save_a_loadable_adapter(zero2_run):
    losses = step_losses(zero2_run / f"checkpoint-{STEPS}")
    assert sorted(losses) == list(range(1, STEPS + 1))
    first, last = (
        sum(losses[s] for s in range(1, 7)) / 6,
        sum(losses[s] for s in range(STEPS - 5, STEPS + 1)) / 6,
    )
    assert last < first - 0.05, losses
    meta = json.loads((zero2_run / "fincheck_run.json").read_text())
    assert meta["world_size"] == 2
    assert sorted(zero2_run.rglob("README.md")) == []  # no library's template card
    import torch

    model, _ = load_adapter_model(zero2_run, dtype=torch.float32)
    lora_b = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert lora_b and all(p.abs().sum() > 0 for p in lora_b)  # trained, not the zero init


def test_resume_auto_repeats_the_uninterrupted_losses_with_two_processes(
    zero2_run, prepared_dir, mixture, tmp_path
):
    copy = tmp_path / "run"
    shutil.copytree(zero2_run, copy)
    # As if the job had been killed while writing checkpoint-24: `auto` must take checkpoint-16.
    (copy / f"checkpoint-{STEPS}" / COMPLETE_MARKER).unlink()
    proc = deepspeed_launch(
        "train/sft.py",
        *common_args(prepared_dir, mixture, copy),
        "--deepspeed=configs/deepspeed/zero2.json",
        "--resume_from_checkpoint=auto",
    )
    assert f"resuming from {copy / 'checkpoint-16'}" in proc.stderr
    expected, resumed = (
        step_losses(zero2_run / f"checkpoint-{STEPS}"),
        step_losses(copy / f"checkpoint-{STEPS}"),
    )
    assert sorted(resumed) == list(range(1, STEPS + 1))
    for step in range(17, STEPS + 1):
        assert abs(resumed[step] - expected[step]) <= 1e-5, (step, resumed[step], expected[step])


def test_resuming_with_another_number_of_processes_is_one_clear_line(
    zero2_run, prepared_dir, mixture, tmp_path
):
    copy = tmp_path / "run"
    shutil.copytree(zero2_run, copy)
    shutil.rmtree(copy / f"checkpoint-{STEPS}")
    fincheck = Path(sys.executable).parent / "fincheck"
    proc = subprocess.run(
        [
            str(fincheck),
            "train",
            *common_args(prepared_dir, mixture, copy),
            "--deepspeed=configs/deepspeed/zero2.json",
            "--resume_from_checkpoint=auto",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "saved by 2 processes and this run has 1" in proc.stderr
    assert "Traceback" not in proc.stderr


class RunsCode:
    """A pickle that runs a command when loaded, as a crafted state file would."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_resume_refuses_a_crafted_deepspeed_state_file_without_running_it(
    zero2_run, prepared_dir, mixture, tmp_path
):
    import torch

    copy = tmp_path / "run"
    shutil.copytree(zero2_run, copy)
    shutil.rmtree(copy / f"checkpoint-{STEPS}")  # resume from checkpoint-16
    marker = tmp_path / "code-ran"
    state = copy / "checkpoint-16" / "global_step16" / "mp_rank_00_model_states.pt"
    assert state.is_file()
    torch.save({"module": RunsCode(marker)}, state)
    # the attacker also lists the crafted file in the checkpoint's record (a file that does not
    # match its record is passed over before any check: test_train_checkpoints.py)
    record_path = copy / "checkpoint-16" / "fincheck_complete.json"
    record = json.loads(record_path.read_text())
    name = "global_step16/mp_rank_00_model_states.pt"
    record["files"][name] = hashlib.sha256(state.read_bytes()).hexdigest()
    record_path.write_text(json.dumps(record))
    proc = deepspeed_launch(
        "train/sft.py",
        *common_args(prepared_dir, mixture, copy),
        "--deepspeed=configs/deepspeed/zero2.json",
        "--resume_from_checkpoint=auto",
        check=False,
    )
    assert proc.returncode != 0
    assert "mp_rank_00_model_states.pt would run code" in proc.stderr
    assert not marker.exists()


def test_zero3_two_processes_save_the_gathered_adapter(prepared_dir, mixture, tmp_path):
    out = tmp_path / "run"
    args = common_args(prepared_dir, mixture, out)
    args[args.index(f"--max_steps={STEPS}")] = "--max_steps=16"
    deepspeed_launch(
        "tests/zero3_adapter_check.py", *args, "--deepspeed=configs/deepspeed/zero3.json"
    )
    report = json.loads((out / "zero3_check.json").read_text())
    assert report["status"] == 0
    assert report["partitioned"], (
        "the LoRA weights were not ZeRO-3 partitioned: the check proves nothing"
    )
    assert report["saved_keys"] == report["memory_keys"] and len(report["saved_keys"]) == 28
    assert report["empty"] == [] and report["shapes_equal"]
    assert report["max_abs_diff"] == 0.0
    assert report["lora_B_abs_sum"] > 0
    losses = step_losses(out / "checkpoint-16")
    assert sum(losses[s] for s in range(13, 17)) < sum(losses[s] for s in range(1, 5)), losses


def test_sigterm_to_torchrun_saves_one_complete_checkpoint_across_both_processes(
    prepared_dir, mixture, tmp_path
):
    """Preemption of a 2-process job: torchrun forwards SIGTERM to both workers, which agree on
    the step, save it together and stop."""
    import signal

    out = tmp_path / "run"
    torchrun = Path(sys.executable).parent / "torchrun"
    cmd = [
        str(torchrun) if torchrun.exists() else "torchrun",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
        "train/sft.py",
        *common_args(prepared_dir, mixture, out),
        "--max_steps=400",
        "--save_steps=1000",
    ]
    proc = subprocess.Popen(
        cmd, cwd=REPO, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    )
    for line in proc.stderr:
        if "step 3/400 | loss" in line:
            proc.send_signal(signal.SIGTERM)
            break
    _, rest = proc.communicate(timeout=180)
    assert "stopped by SIGTERM after step" in rest, rest[-3000:]
    saved = [p for p in out.glob("checkpoint-*")]
    assert len(saved) == 1 and (saved[0] / COMPLETE_MARKER).is_file()
    step = int(saved[0].name.split("-")[1])
    assert 3 <= step < 400
    assert {p.name for p in saved[0].glob("rng_state_*.pth")} == {
        "rng_state_0.pth",
        "rng_state_1.pth",
    }


def test_killing_the_deepspeed_launcher_stops_both_ranks_with_a_checkpoint(
    prepared_dir, mixture, tmp_path
):
    """`kill <deepspeed pid>`: DeepSpeed's runner dies at once and forwards nothing; the ranks
    notice their launcher is gone, save one complete checkpoint together and exit."""
    import signal
    import time

    out = tmp_path / "run"
    launcher = Path(sys.executable).parent / "deepspeed"
    cmd = [
        str(launcher) if launcher.exists() else "deepspeed",
        "--num_gpus",
        "2",
        "--master_port",
        str(free_port()),
        "train/sft.py",
        *common_args(prepared_dir, mixture, out),
        "--max_steps=400",
        "--save_steps=1000",
        "--deepspeed=configs/deepspeed/zero2.json",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    )
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "step 3/400 | loss" in line:
            proc.send_signal(signal.SIGTERM)
            break
    assert proc.wait(timeout=10) == -signal.SIGTERM  # the shell reports 143
    # The ranks still hold the pipe: it closes only when every one of them has exited.
    start = time.monotonic()
    rest = proc.stderr.read()
    assert time.monotonic() - start < 150, "the ranks outlived their launcher"
    assert "its launcher exiting" in rest, "".join(seen[-10:]) + rest[-3000:]
    saved = list(out.glob("checkpoint-*"))
    assert len(saved) == 1 and (saved[0] / COMPLETE_MARKER).is_file(), rest[-3000:]
    assert {p.name for p in saved[0].glob("rng_state_*.pth")} == {
        "rng_state_0.pth",
        "rng_state_1.pth",
    }


# ---------------------------------------------------------------- tree packing, 2 processes


@pytest.fixture(scope="module")
def tree_mixture(tmp_path_factory) -> Path:
    """Whole documents: QASem QAs and FHSumBench summaries that share them, as packing sees."""
    path = tmp_path_factory.mktemp("treemix") / "mix.yaml"
    path.write_text(
        "tasks: [qasem, fhsumbench]\nmax_examples: {qasem: 30, fhsumbench: 10}\n"
        "whole_documents: true\nmin_grounding_kept: 0.0\n"
    )
    return path


def tree_args(prepared_dir: Path, mixture: Path, out: Path) -> list[str]:
    """Tree-packed tiny-cpu, with QASem's dev figures every 8 steps (dealt out by document to
    the two processes under ZeRO-2, answered by both in step under ZeRO-3)."""
    args = common_args(prepared_dir, mixture, out)
    args[args.index("--per_device_train_batch_size=2")] = "--per_device_train_batch_size=1"
    return [*args, "--tree_packing=true", "--tree_packing_max_tokens=1024", "--eval_steps=8",
            "--eval_max_examples=4", "--dev_figures=[qasem]", "--dev_figures_limit={qasem: 40}"]  # fmt: skip


def dev_figures(checkpoint: Path) -> dict[int, float]:
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    return {e["step"]: e["eval_qasem_auc"] for e in state["log_history"] if "eval_qasem_auc" in e}


@pytest.fixture(scope="module")
def zero2_tree_run(prepared_dir, tree_mixture, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("zero2tree") / "run"
    deepspeed_launch(
        "train/sft.py",
        *tree_args(prepared_dir, tree_mixture, out),
        "--deepspeed=configs/deepspeed/zero2.json",
    )
    return out


def test_tree_packed_zero2_run_trains_and_resumes_to_the_same_losses(
    zero2_tree_run, prepared_dir, tree_mixture, tmp_path
):
    meta = json.loads((zero2_tree_run / "fincheck_run.json").read_text())
    packing = meta["data"]["tree_packing"]["train"]
    assert packing["pairs"] > 2 * packing["packs"]  # documents shared: sequences hold pairs
    assert meta["attn_implementation"] == "fincheck_tree_sdpa"  # the CPU's tree kernel
    expected = step_losses(zero2_tree_run / f"checkpoint-{STEPS}")
    assert sorted(expected) == list(range(1, STEPS + 1))
    assert sorted(dev_figures(zero2_tree_run / f"checkpoint-{STEPS}")) == [8, 16, 24]
    written = zero2_tree_run / "dev-predictions"  # the answers behind each evaluation's figures
    assert sorted(p.name for p in written.iterdir()) == ["step-16", "step-24", "step-8"]
    answers = [json.loads(line) for line in (written / "step-24" / "qasem.jsonl").open()]
    assert answers and len({a["id"] for a in answers}) == len(answers)  # both ranks' shares
    assert all(0.0 <= a["p_yes"] <= 1.0 for a in answers)
    first, last = sum(expected[s] for s in range(1, 7)), sum(expected[s] for s in range(19, 25))
    assert last < first, expected
    copy = tmp_path / "run"
    shutil.copytree(zero2_tree_run, copy)
    shutil.rmtree(copy / f"checkpoint-{STEPS}")  # killed after checkpoint-16
    proc = deepspeed_launch(
        "train/sft.py",
        *tree_args(prepared_dir, tree_mixture, copy),
        "--deepspeed=configs/deepspeed/zero2.json",
        "--resume_from_checkpoint=auto",
    )
    assert f"resuming from {copy / 'checkpoint-16'}" in proc.stderr
    resumed = step_losses(copy / f"checkpoint-{STEPS}")
    for step in range(17, STEPS + 1):
        assert abs(resumed[step] - expected[step]) <= 1e-5, (step, resumed[step], expected[step])
    # the dev figures of the resumed run's step 24 are those of the uninterrupted run's
    after = dev_figures(copy / f"checkpoint-{STEPS}")[24]
    assert abs(after - dev_figures(zero2_tree_run / f"checkpoint-{STEPS}")[24]) <= 1e-4


def test_tree_packed_zero3_run_saves_the_gathered_adapter(prepared_dir, tree_mixture, tmp_path):
    out = tmp_path / "run"
    args = tree_args(prepared_dir, tree_mixture, out)
    args[args.index(f"--max_steps={STEPS}")] = "--max_steps=8"
    deepspeed_launch(
        "tests/zero3_adapter_check.py", *args, "--deepspeed=configs/deepspeed/zero3.json"
    )
    report = json.loads((out / "zero3_check.json").read_text())
    assert report["status"] == 0 and report["partitioned"]
    assert report["max_abs_diff"] == 0.0 and report["lora_B_abs_sum"] > 0
    meta = json.loads((out / "fincheck_run.json").read_text())
    assert meta["data"]["tree_packing"]["train"]["packs"] > 0
    assert sorted(dev_figures(out / "checkpoint-8")) == [8]  # both ranks answered, in step


def test_tree_packed_ranks_train_alike_tokens_each_step(zero2_tree_run):
    """Packs are dealt to the two processes by tokens: every optimizer step's
    `rank_token_spread` (1 - fewest / most real tokens of a rank) is within 10%, but for the
    last step of an epoch, which holds the shortest packs and the remainder (a rank may have
    none left: it idles rather than train a pack twice)."""
    meta = json.loads((zero2_tree_run / "fincheck_run.json").read_text())
    packs = meta["data"]["tree_packing"]["train"]["packs"]
    steps_per_epoch = -(-packs // 2)  # one pack per process per step, no accumulation
    state = json.loads((zero2_tree_run / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())
    spread = {e["step"]: e["rank_token_spread"] for e in state["log_history"] if "loss" in e}
    assert sorted(spread) == list(range(1, STEPS + 1))
    inside = {s: v for s, v in spread.items() if s % steps_per_epoch}
    assert len(inside) >= STEPS // 2 and max(inside.values()) <= 0.10, spread


def lora_weights(run: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run / "adapter_model.safetensors"))


def test_tree_packed_accumulated_step_on_two_processes_equals_the_unpacked_step(
    prepared_dir, tmp_path
):
    """One optimizer step over the same 16 pairs on 2 processes (ZeRO-2): unpacked, 4 pairs per
    micro-batch x 2 accumulated x 2 processes, and tree-packed, one pack per micro-batch, up to
    8 accumulated per process (a process may get fewer packs than the other). The loss is the
    mean over the answer tokens of the whole step either way, so the LoRA weights after it
    agree (SGD and no clipping: the update is the gradient itself)."""
    import torch

    mixture = tmp_path / "mix.yaml"
    mixture.write_text("tasks: [qasem, fhsumbench]\nmax_examples: {qasem: 12, fhsumbench: 4}\n"
                       "min_grounding_kept: 0.0\n")  # fmt: skip
    common = [
        "--config", TINY, f"--dataset_dir={prepared_dir}", f"--data_config={mixture}",
        "--max_steps=1", "--save_strategy=no", "--optim=sgd", "--learning_rate=0.01",
        "--max_grad_norm=0", "--deepspeed=configs/deepspeed/zero2.json",
    ]  # fmt: skip
    rows, tree = tmp_path / "rows", tmp_path / "tree"
    deepspeed_launch("train/sft.py", *common, f"--output_dir={rows}",
                     "--per_device_train_batch_size=4", "--gradient_accumulation_steps=2")  # fmt: skip
    deepspeed_launch("train/sft.py", *common, f"--output_dir={tree}", "--tree_packing=true",
                     "--tree_packing_max_tokens=1024", "--per_device_train_batch_size=1",
                     "--gradient_accumulation_steps=8")  # fmt: skip
    meta = json.loads((tree / "fincheck_run.json").read_text())
    assert meta["data"]["train_examples"] == {"qasem": 12, "fhsumbench": 4}  # nothing dropped
    packs = meta["data"]["tree_packing"]["train"]["packs"]
    assert 2 < packs <= 16  # one step holds them all, several per process
    unpacked, packed = lora_weights(rows), lora_weights(tree)
    moved = max(float(w.abs().max()) for n, w in unpacked.items() if "lora_B" in n)
    assert moved > 1e-4  # B starts at zero: the step trained
    for name, weight in unpacked.items():
        torch.testing.assert_close(packed[name], weight, rtol=0, atol=1e-5)


# ------------------------------------------------------------------ two nodes on loopback


def launch_nodes(commands: list[list[str]], envs: list[dict[str, str]], timeout: int = 600):
    """One launcher per node, started together (as a scheduler starts them), all waited for."""
    procs = [
        subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1", **env},
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for cmd, env in zip(commands, envs, strict=True)
    ]  # fmt: skip
    return [(p.wait(timeout=timeout), p.stdout.read()) for p in procs]


def node_args(prepared_dir: Path, mixture: Path, out: Path, *extra: str) -> list[str]:
    return [f"--dataset_dir={prepared_dir}", f"--data_config={mixture}", f"--output_dir={out}",
            "--per_device_train_batch_size=2", "--max_steps=4", "--save_steps=4", *extra]  # fmt: skip


def deepspeed_nodes(out: Path, prepared_dir: Path, mixture: Path, tmp_path: Path):
    """The README's DeepSpeed multi-node form, each node started by its own launcher without
    ssh (`--no_ssh --node_rank`), two one-slot nodes of a hostfile on 127.0.0.1."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-0 slots=1\nnode-1 slots=1\n")
    launcher = Path(sys.executable).parent / "deepspeed"
    port = str(free_port())
    commands = [
        [str(launcher), "--hostfile", str(hostfile), "--no_ssh", "--node_rank", str(rank),
         "--master_addr", "127.0.0.1", "--master_port", port, "train/sft.py", "--config", TINY,
         *node_args(prepared_dir, mixture, out)]
        for rank in (0, 1)
    ]  # fmt: skip
    return launch_nodes(commands, [{}, {}])


def slurm_nodes(out: Path, prepared_dir: Path, mixture: Path, *extra_per_node: list[str]):
    """scripts/train_slurm.sh's per-node line (scripts/train_node.sh: torchrun with the c10d
    rendezvous), with the variables SLURM sets on each node."""
    port, job = str(free_port()), f"test-{os.getpid()}"
    extra_per_node = extra_per_node or ([], [])
    commands = [
        ["scripts/train_node.sh", TINY, *node_args(prepared_dir, mixture, out, *extra)]
        for extra in extra_per_node
    ]
    envs = [
        {"SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": str(rank), "SLURM_JOB_ID": job,
         "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "GPUS_PER_NODE": "1",
         "TORCHRUN": str(Path(sys.executable).parent / "torchrun")}
        for rank in (0, 1)
    ]  # fmt: skip
    return launch_nodes(commands, envs)


def test_two_nodes_on_loopback_train_the_losses_of_one_node(prepared_dir, mixture, tmp_path):
    """Both multi-node forms of the README, two nodes of one process each on loopback, train
    step for step the losses of one node with 2 processes, and every process exits 0 (node 1's
    workers used to abort when node 0's launcher took the rendezvous store down at the end)."""
    one = tmp_path / "one"
    deepspeed_launch("train/sft.py", "--config", TINY, *node_args(prepared_dir, mixture, one))
    expected = step_losses(one / "checkpoint-4")
    assert sorted(expected) == [1, 2, 3, 4]
    for name, launch in (("deepspeed", deepspeed_nodes), ("slurm", slurm_nodes)):
        out = tmp_path / name
        args = (
            (out, prepared_dir, mixture, tmp_path)
            if name == "deepspeed"
            else (out, prepared_dir, mixture)
        )
        results = launch(*args)
        for status, log in results:
            assert status == 0 and "SIGABRT" not in log, log[-3000:]
        losses = step_losses(out / "checkpoint-4")
        assert losses == pytest.approx(expected, abs=1e-6), name
        assert json.loads((out / "fincheck_run.json").read_text())["world_size"] == 2


@pytest.mark.parametrize("differ", ["recipe", "prepared data", "base"])
def test_a_node_started_with_another_recipe_or_data_stops_every_rank(
    differ, prepared_dir, small_prepared, tiny_base, mixture, tmp_path
):
    """Node 1 launched with another learning rate, another prepared folder, or a base whose
    weights differ under the same config.json: every rank stops before the first step, saying
    which differs; nothing is trained."""
    from safetensors.torch import load_file, save_file

    own: list[str] = []
    other = ["--learning_rate=0.01"] if differ == "recipe" else [f"--dataset_dir={small_prepared}"]
    if differ == "base":  # two copies of one base, one weight changed in the second
        copies = [tmp_path / "base0", tmp_path / "base1"]
        for copy in copies:
            shutil.copytree(tiny_base, copy)
        weights = copies[1] / "model.safetensors"
        tensors = load_file(weights)
        name = sorted(tensors)[0]
        tensors[name] = tensors[name] + 1
        save_file(tensors, weights, metadata={"format": "pt"})
        own, other = ([f"--model_name_or_path={c}"] for c in copies)
    out = tmp_path / "run"
    results = slurm_nodes(out, prepared_dir, mixture, own, other)
    for status, log in results:
        assert status != 0, log[-2000:]
        assert f"were not started with the same {differ}" in log, log[-3000:]
    assert not list(out.glob("checkpoint-*"))


def two_nodes(out: str, cwds: tuple[Path, Path], timeout: int = 300) -> list[tuple[int, str]]:
    """Two one-process "nodes" on this machine (torchrun --nnodes=2), each in its own working
    folder: a relative --output_dir lands on a disk of each node's own, an absolute one on a
    shared disk. (exit status, stderr) of each node."""
    port, torchrun = free_port(), Path(sys.executable).parent / "torchrun"
    args = [f"--config={REPO / TINY}", f"--dataset_dir={REPO / 'tests' / 'assets' / 'prepared'}"]
    args += [f"--data_config={REPO / 'configs' / 'data' / 'tiny.yaml'}", f"--output_dir={out}"]
    args += ["--save_on_each_node=true", "--max_steps=4", "--save_steps=2", "--deepspeed="]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    nodes = []
    for rank, cwd in enumerate(cwds):
        launch = [str(torchrun), "--nnodes=2", f"--node_rank={rank}", "--nproc_per_node=1"]
        launch += ["--master_addr=127.0.0.1", f"--master_port={port}", str(REPO / "train/sft.py")]
        with open(cwd / "stderr.txt", "w") as stderr:  # a pipe could fill and stall the run
            nodes.append(subprocess.Popen([*launch, *args], cwd=cwd, env=env, stderr=stderr))
    status = [node.wait(timeout) for node in nodes]
    return [(s, (cwd / "stderr.txt").read_text()) for s, cwd in zip(status, cwds, strict=True)]


def test_save_on_each_node_gives_each_node_its_final_adapter_and_refuses_a_shared_disk(tmp_path):
    """`save_on_each_node` across two nodes: each node's run folder, on its own disk, ends with
    its complete checkpoints and the final adapter with its record (not world rank 0's alone).
    On a disk both share, both would write one folder at once: every rank stops, before the
    first step, in one line."""
    from fincheck.io.runs import load_run

    cwds = (tmp_path / "node0", tmp_path / "node1")
    for cwd in cwds:
        cwd.mkdir()
    assert [status for status, _ in two_nodes("run", cwds)] == [0, 0]
    for cwd in cwds:
        assert (
            load_run(cwd / "run").tasks
            and (cwd / "run" / "checkpoint-4" / COMPLETE_MARKER).is_file()
        )
    shared = tmp_path / "shared" / "run"
    ended = two_nodes(str(shared), cwds)
    assert [status for status, _ in ended] == [1, 1]
    message = "sees world rank 0's files in " + str(shared)
    assert message in ended[0][1] + ended[1][1] and not list(shared.glob("checkpoint-*"))
