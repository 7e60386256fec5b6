"""Run-folder safety without training: a fresh start never replaces a run, rotation keeps a
complete checkpoint, a full disk is named, and pickled state that would run code is refused."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from fincheck.errors import FincheckError
from fincheck.train.checkpoints import (
    COMPLETE_MARKER,
    guard_output_dir,
    is_out_of_space,
    mark_complete,
    out_of_space_message,
    rotate_checkpoints,
)
from fincheck.train.resume import check_state_files, weights_only_loads


def make_checkpoint(run: Path, step: int, complete: bool = True) -> Path:
    path = run / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "adapter_model.safetensors").write_bytes(b"x")
    if complete:
        mark_complete(path, {"step": step}, "max_steps: 10\n")
    return path


def test_a_fresh_start_refuses_a_folder_holding_a_run(tmp_path):
    run = tmp_path / "run"
    make_checkpoint(run, 20)
    with pytest.raises(FincheckError, match=r"resume_from_checkpoint=auto.*overwrite_output_dir"):
        guard_output_dir(run, resume=None, overwrite=False, main=True)
    assert (run / "checkpoint-20" / COMPLETE_MARKER).is_file()  # nothing touched
    guard_output_dir(run, resume="auto", overwrite=False, main=True)  # resuming is fine
    guard_output_dir(tmp_path / "new", resume=None, overwrite=False, main=True)  # so is empty
    guard_output_dir(run, resume=None, overwrite=True, main=True)  # asked for: starts over
    assert not (run / "checkpoint-20").exists()


def test_rotation_keeps_the_complete_checkpoint_until_the_new_one_is_complete(tmp_path):
    run = tmp_path / "run"
    make_checkpoint(run, 2)
    make_checkpoint(run, 4, complete=False)  # a save in progress (or killed mid-way)
    assert rotate_checkpoints(run, 1) == []  # the only complete checkpoint stays
    mark_complete(run / "checkpoint-4", {"step": 4}, "")
    assert rotate_checkpoints(run, 1) == [run / "checkpoint-2"]
    assert [p.name for p in run.iterdir()] == ["checkpoint-4"]


def test_each_node_that_saves_completes_and_rotates_its_own_checkpoints(tmp_path):
    """With `save_on_each_node` and no shared disk, each node's first process saves a copy:
    it, not only world rank 0, writes the record and rotates, or the other nodes' checkpoints
    would stay unfinished and pile up. On a shared disk the second finds the record written."""
    from types import SimpleNamespace

    from fincheck.train.callbacks import CompleteCheckpointCallback

    callback = CompleteCheckpointCallback({"run": "x"}, "max_steps: 10\n", keep=1)
    state = SimpleNamespace(global_step=4, best_model_checkpoint=None, is_world_process_zero=False)
    node_disk = tmp_path / "node1"
    make_checkpoint(node_disk, 2)
    make_checkpoint(node_disk, 4, complete=False)
    callback.on_save(SimpleNamespace(should_save=False, output_dir=str(node_disk)), state, None)
    assert not (node_disk / "checkpoint-4" / COMPLETE_MARKER).exists()  # not a saving process
    callback.on_save(SimpleNamespace(should_save=True, output_dir=str(node_disk)), state, None)
    record = (node_disk / "checkpoint-4" / COMPLETE_MARKER).read_bytes()
    assert json.loads(record)["step"] == 4
    assert [p.name for p in node_disk.iterdir()] == ["checkpoint-4"]
    callback.on_save(SimpleNamespace(should_save=True, output_dir=str(node_disk)), state, None)
    assert (node_disk / "checkpoint-4" / COMPLETE_MARKER).read_bytes() == record


def test_each_node_that_saves_writes_the_final_adapter_on_its_disk(tmp_path, monkeypatch):
    """With `save_on_each_node`, a node's first process (not world rank 0) gets the final
    adapter and the run record on its own disk, and a final save cut short before is made
    fresh, not reused. (A disk the nodes share is refused before the first step:
    `launch.check_each_saving_node_has_its_own_disk`.)"""
    from types import SimpleNamespace

    from fincheck.io.runs import load_run
    from fincheck.train import checkpoints

    def save_model(folder: str) -> None:
        (Path(folder) / "adapter_model.safetensors").write_bytes(b"w")
        (Path(folder) / "adapter_config.json").write_text('{"r": 4}')

    node_first = SimpleNamespace(should_save=True, process_index=1)  # not world rank 0
    wait = SimpleNamespace(wait_for_everyone=lambda: None)
    trainer = SimpleNamespace(args=node_first, save_model=save_model, accelerator=wait)
    monkeypatch.setattr(checkpoints, "recipe_to_yaml", lambda r: "max_steps: 4\n")
    recipe = SimpleNamespace(final_adapter_from_best=False, max_steps=4)

    node_disk = tmp_path / "node1"
    leftover = node_disk / checkpoints.FINAL_SAVE
    leftover.mkdir(parents=True)
    (leftover / "stale.bin").write_bytes(b"s")  # a final save killed before
    checkpoints.save_final_adapter(trainer, recipe, node_disk, None, {}, {"tasks": ["qasem"]})
    assert load_run(node_disk).tasks == ["qasem"] and not (node_disk / "stale.bin").exists()


def test_a_full_disk_is_named_with_the_checkpoint_still_complete(tmp_path):
    run = tmp_path / "run"
    make_checkpoint(run, 10)
    make_checkpoint(run, 20, complete=False)
    assert is_out_of_space(
        RuntimeError(
            "[enforce fail at inline_container.cc:626] . "
            "unexpected pos 64 vs 0 basic_ios::clear: iostream error"
        )
    )
    assert is_out_of_space(OSError(28, "No space left on device"))
    assert not is_out_of_space(RuntimeError("shape mismatch"))
    message = out_of_space_message(run, 20)
    assert message.startswith("no space left on ")
    assert "checkpoint-10 is still complete" in message and "resume_from_checkpoint=auto" in message


class RunsCode:
    """A pickle that runs a command when loaded, as a crafted state file would."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("tag", ["/tmp/elsewhere", "../other-run/global_step8", "global_step9"])
def test_a_latest_tag_outside_the_checkpoint_is_refused(tmp_path, tag):
    """DeepSpeed loads the folder its `latest` file names: it must be a global_step<N> of the
    checkpoint itself, or files never checked would be unpickled."""
    checkpoint = make_checkpoint(tmp_path / "run", 8)
    (checkpoint / "global_step8").mkdir()
    torch.save({"module": {"w": torch.ones(2)}}, checkpoint / "global_step8" / "states.pt")
    (checkpoint / "latest").write_text("global_step8")
    check_state_files(checkpoint)
    (checkpoint / "latest").write_text(tag)
    with pytest.raises(FincheckError, match="'latest' file names"):
        check_state_files(checkpoint)


def test_a_symlink_in_a_checkpoint_is_refused(tmp_path):
    """A global_stepN that links elsewhere was never descended into by the pickle check."""
    checkpoint = make_checkpoint(tmp_path / "run", 8)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    marker = tmp_path / "ran"
    torch.save({"module": RunsCode(marker)}, elsewhere / "mp_rank_00_model_states.pt")
    (checkpoint / "global_step8").symlink_to(elsewhere, target_is_directory=True)
    (checkpoint / "latest").write_text("global_step8")
    with pytest.raises(FincheckError, match="global_step8 is a symbolic link"):
        check_state_files(checkpoint)
    assert not marker.exists()


def test_state_files_that_would_run_code_are_refused_unloaded(tmp_path):
    checkpoint = make_checkpoint(tmp_path / "run", 8)
    state = checkpoint / "global_step8"
    state.mkdir()
    # What DeepSpeed and the Trainer write: tensors, numbers, numpy arrays (the RNG state).
    torch.save({"module": {"w": torch.ones(2)}, "rng": np.arange(3)}, state / "optim_states.pt")
    torch.save({"python": 1}, checkpoint / "rng_state.pth")
    check_state_files(checkpoint)

    marker = tmp_path / "ran"
    torch.save({"module": RunsCode(marker)}, state / "mp_rank_00_model_states.pt")
    with pytest.raises(FincheckError, match=r"mp_rank_00_model_states.pt would run code .*system"):
        check_state_files(checkpoint)
    assert not marker.exists()
    (state / "mp_rank_00_model_states.pt").write_bytes(b"\x80\x02}q\x00.")  # a bare old pickle
    with pytest.raises(FincheckError, match="not a torch checkpoint file"):
        check_state_files(checkpoint)


def test_resuming_on_re_prepared_data_is_refused(tmp_path):
    """Data re-prepared in place: other pairs, another order; the resumed run would go on as
    if nothing changed."""
    import json

    from fincheck.train.checkpoints import COMPLETE_MARKER
    from fincheck.train.resume import check_resume_compatible

    checkpoint = tmp_path / "checkpoint-4"
    checkpoint.mkdir()
    (checkpoint / COMPLETE_MARKER).write_text(
        json.dumps({"base_fingerprint": "b", "data_fingerprint": "a" * 64, "world_size": 1})
    )
    check_resume_compatible(checkpoint, [], "b", 1, "a" * 64)  # the same data: resumes
    # a checkpoint recorded its base by its config.json before its files: still resumes
    check_resume_compatible(checkpoint, [], "b" * 64, 1, "a" * 64, base_config_fp="b")
    with pytest.raises(FincheckError, match="the base model's files differ"):
        check_resume_compatible(checkpoint, [], "b" * 64, 1, "a" * 64, base_config_fp="x")
    with pytest.raises(FincheckError, match="the prepared data differs"):
        check_resume_compatible(checkpoint, [], "b", 1, "c" * 64)


def test_stale_allreduce_buffers_of_killed_runs_are_swept(tmp_path, monkeypatch):
    """A run killed with -9 leaves its 66 MB /dev/shm segment (any port): at the next start,
    those no live process maps and older than a minute go; a mapped one, or a fresh one, stays."""
    import mmap
    import time

    from fincheck.train import host_memory

    uid = os.getuid()
    names = [f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_{port}_0" for port in (1, 2, 3)]
    for name in names:
        (tmp_path / name).write_bytes(b"\0" * 4096)
    old = time.time() - 3600
    for name in names[:2]:
        os.utime(tmp_path / name, (old, old))
    (tmp_path / "someone_else").write_bytes(b"x")
    with (tmp_path / names[1]).open("r+b") as f, mmap.mmap(f.fileno(), 4096):  # a live run's
        removed = host_memory.sweep_stale_allreduce_buffers(shm=tmp_path)
    assert removed == [names[0]]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*names[1:], "someone_else"])


def test_the_sweep_leaves_links_alone_and_does_not_stop_training(tmp_path):
    """A name that is a link (dangling, or to a file elsewhere) is not a segment a run left:
    the sweep neither follows it nor fails on it (a traceback at training start)."""
    import time

    from fincheck.train import host_memory

    prefix = f"deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = elsewhere / "keep.bin"
    target.write_bytes(b"keep")
    old = time.time() - 3600
    os.utime(target, (old, old))
    shm = tmp_path / "shm"
    shm.mkdir()
    (shm / f"{prefix}1_0").symlink_to(tmp_path / "gone")
    (shm / f"{prefix}2_0").symlink_to(target)
    (shm / f"{prefix}3_0").write_bytes(b"\0" * 16)
    os.utime(shm / f"{prefix}3_0", (old, old))
    assert host_memory.sweep_stale_allreduce_buffers(shm=shm) == [f"{prefix}3_0"]
    assert sorted(p.name for p in shm.iterdir()) == [f"{prefix}1_0", f"{prefix}2_0"]
    assert target.read_bytes() == b"keep"


def test_a_name_reached_through_an_allowed_module_is_refused(tmp_path):
    """The allow-list holds exact names: a global spelled through an allowed module's attributes
    (numpy.dtypes._add_dtype_helper.__builtins__.get) is not one of them."""
    checkpoint = make_checkpoint(tmp_path / "run", 8)
    state = checkpoint / "global_step8"
    state.mkdir()
    path = state / "mp_rank_00_model_states.pt"
    torch.save({"module": {"w": torch.ones(2)}}, path)
    check_state_files(checkpoint)

    # the same zip with data.pkl replaced: STACK_GLOBAL of a dotted name, called
    # GLOBAL of a dotted name (protocol 4 resolves it attribute by attribute: builtins' get),
    # called with "eval": what the next REDUCE would run code with
    eval_name = b"X" + len(b"eval").to_bytes(4, "little") + b"eval"
    payload = b"\x80\x04cnumpy.dtypes\n_add_dtype_helper.__builtins__.get\n" + eval_name + b"\x85R."
    rewrite_pickle(path, payload)
    with pytest.raises(FincheckError, match=r"would run code .*numpy\.dtypes\._add_dtype_helper"):
        check_state_files(checkpoint)
    with weights_only_loads(), pytest.raises(pickle.UnpicklingError):  # and it never loads
        torch.load(path, weights_only=False)


def rewrite_pickle(path: Path, payload: bytes) -> None:
    """Replace the pickle inside a torch zip checkpoint, keeping its layout."""
    import zipfile

    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    name = next(n for n in members if n.endswith("/data.pkl"))
    members[name] = payload
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for n, data in members.items():
            z.writestr(n, data)


def test_resume_loads_are_weights_only_with_the_exact_globals(tmp_path):
    """What DeepSpeed loads with full unpickling goes through the weights-only unpickler in the
    training block: its own records load, a crafted file fails to load and runs nothing."""
    import numpy as np
    from deepspeed.runtime.zero.config import ZeroStageEnum

    good = tmp_path / "good.pt"
    torch.save({"stage": ZeroStageEnum.gradients, "rng": np.arange(3), "s": np.float64(1.5)}, good)
    marker = tmp_path / "ran"
    bad = tmp_path / "bad.pt"
    torch.save({"module": RunsCode(marker)}, bad)
    with weights_only_loads():
        loaded = torch.load(good, weights_only=False)  # DeepSpeed's spelling
        assert loaded["stage"] == ZeroStageEnum.gradients and loaded["rng"].tolist() == [0, 1, 2]
        with pytest.raises(pickle.UnpicklingError):
            torch.load(bad, weights_only=False)
    assert not marker.exists()
    assert torch.load.__name__ == "load"  # restored


def test_the_newest_trainer_state_is_the_highest_step_not_the_last_name(tmp_path):
    """checkpoint-1000 is newer than checkpoint-999 (a sort by name says the opposite): what the
    demo, the GPU check and the training plot read."""
    from fincheck.io.runs import newest_trainer_state

    assert newest_trainer_state(tmp_path) is None
    for step in (999, 1000, 20):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(
            json.dumps({"global_step": step})
        )
    (tmp_path / "checkpoint-1001").mkdir()  # a save cut before its state was written
    assert newest_trainer_state(tmp_path)["global_step"] == 1000


def test_a_checkpoint_whose_files_changed_since_its_record_is_passed_over(tmp_path, capsys):
    """A checkpoint's record, written last, lists its files with their sha256: `auto` resumes
    from the newest checkpoint whose files still match (an adapter cut short by a full disk or a
    copy, an optimizer state edited), a named one is refused naming the file."""
    from fincheck.train.resume import resolve_resume

    run = tmp_path / "run"
    make_checkpoint(run, 2)
    newest = make_checkpoint(run, 4)
    (newest / "global_step4").mkdir()
    (newest / "global_step4" / "optim_states.pt").write_bytes(b"state")
    mark_complete(newest, {"step": 4}, "max_steps: 10\n")
    listed = json.loads((newest / COMPLETE_MARKER).read_text())["files"]
    assert set(listed) == {
        "adapter_model.safetensors",
        "recipe.yaml",
        "global_step4/optim_states.pt",
    }
    assert resolve_resume("auto", run) == newest
    (newest / "latest").write_text("global_step9")  # added since: DeepSpeed would read it
    assert resolve_resume("auto", run) == run / "checkpoint-2"
    (newest / "latest").unlink()
    record = (newest / COMPLETE_MARKER).read_text()  # a record of another shape: passed over
    (newest / COMPLETE_MARKER).write_text(json.dumps({**json.loads(record), "data_fingerprint": 5}))
    assert resolve_resume("auto", run) == run / "checkpoint-2"
    assert "data_fingerprint is an integer, not a text" in capsys.readouterr().err
    (newest / COMPLETE_MARKER).write_text(record)
    (newest / "global_step4" / "optim_states.pt").write_bytes(b"stat")  # same size, changed
    assert resolve_resume("auto", run) == run / "checkpoint-2"
    assert "global_step4/optim_states.pt missing or changed" in capsys.readouterr().err
    with pytest.raises(
        FincheckError, match=r"optim_states\.pt missing, changed or added since its"
    ):
        resolve_resume(str(newest), run)
    (run / "checkpoint-2" / "adapter_model.safetensors").write_bytes(b"")  # none left whole
    with pytest.raises(FincheckError, match=r"every complete checkpoint in .* has files missing"):
        resolve_resume("auto", run)


def test_a_run_folder_is_loaded_only_with_the_files_its_record_lists(tmp_path):
    """fincheck_run.json, written last, lists the final save's files: a run whose adapter was
    cut short or whose recipe was edited since is one line naming the file and the resume
    that writes it again; the resume of a completed run writes them again from its checkpoint."""
    from types import SimpleNamespace

    from fincheck.io.runs import load_run
    from fincheck.train.checkpoints import finish_completed_run, write_run_files

    run = tmp_path / "run"
    checkpoint = make_checkpoint(run, 4)
    (checkpoint / "adapter_config.json").write_text('{"r": 4}')
    (checkpoint / "trainer_state.json").write_text('{"global_step": 4}')
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        (run / name).write_bytes((checkpoint / name).read_bytes())
    write_run_files(run, "max_steps: 4\n", {"fingerprint": "f"}, {"tasks": ["qasem"]})
    record = json.loads((run / "fincheck_run.json").read_text())
    assert set(record["files"]) == {
        "adapter_model.safetensors",
        "adapter_config.json",
        "recipe.yaml",
        "data_manifest.json",
    }
    assert load_run(run).tasks == ["qasem"]
    (run / "adapter_model.safetensors").write_bytes(b"")  # cut short
    (run / "recipe.yaml").write_text("max_steps: 5\n")  # edited
    with pytest.raises(FincheckError) as caught:
        load_run(run)
    message = str(caught.value)
    assert (
        "adapter_model.safetensors, recipe.yaml missing, changed or added since its fincheck_run.json"
        in message
    )
    assert "--resume_from_checkpoint=auto" in message and "\n" not in message
    recipe = SimpleNamespace(final_adapter_from_best=False, max_steps=4)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("fincheck.train.checkpoints.recipe_to_yaml", lambda r: "max_steps: 4\n")
        finish_completed_run(checkpoint, 4, run, recipe, {"fingerprint": "f"}, {"tasks": ["qasem"]})
    assert (run / "adapter_model.safetensors").read_bytes() == b"x"
    assert load_run(run).tasks == ["qasem"]
    # both ways: a tokenizer file or a chat template added since is not loaded unnoticed
    (run / "chat_template.jinja").write_text("{{ messages }}")
    with pytest.raises(FincheckError, match=r"chat_template\.jinja missing, changed or added"):
        load_run(run)


def test_a_training_output_without_its_record_is_not_read_as_a_bare_adapter(tmp_path):
    """A run folder whose final save was killed before fincheck_run.json (its recipe.yaml and
    data_manifest.json may be an earlier run's, left by --overwrite_output_dir), and a
    checkpoint killed before its record, are refused by every command that loads them, naming
    what finishes them; a bare PEFT folder (no training output) still loads."""
    from fincheck.io.out_lock import OWN_MARKER
    from fincheck.io.runs import load_run

    run = tmp_path / "run"
    unfinished = make_checkpoint(run, 2, complete=False)
    (unfinished / "adapter_config.json").write_text('{"r": 4}')
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        (run / name).write_bytes((unfinished / name).read_bytes())
    (run / "recipe.yaml").write_text("lora_r: 8\n")  # an earlier run's
    (run / OWN_MARKER).write_text("train")
    with pytest.raises(FincheckError) as caught:
        load_run(run)
    assert "a training run that did not finish (no fincheck_run.json)" in str(caught.value)
    assert "--resume_from_checkpoint=auto" in str(caught.value)
    with pytest.raises(FincheckError, match=r"a training checkpoint that did not finish .*another"):
        load_run(unfinished)
    (tmp_path / "latest").symlink_to(unfinished, target_is_directory=True)
    with pytest.MonkeyPatch.context() as mp:  # given as a link to it, or as "." from inside it
        for given in (tmp_path / "latest", Path(".")):
            mp.chdir(unfinished)
            with pytest.raises(FincheckError, match=r"a training checkpoint that did not finish"):
                load_run(given)
    (run / OWN_MARKER).unlink()  # a bare PEFT folder: nothing says it is a training output
    assert load_run(run).adapter_config == {"r": 4}


def test_a_checkpoint_given_as_dot_belongs_to_its_run(tmp_path, monkeypatch):
    """`--adapter .` inside checkpoint-<step>/ reads the run it belongs to (a base saved in the
    run is found there), not "." again: Path(".").parent is "."."""
    from fincheck.io.runs import load_run

    run = tmp_path / "run"
    checkpoint = run / "checkpoint-4"
    checkpoint.mkdir(parents=True)
    (checkpoint / "adapter_model.safetensors").write_bytes(b"x")
    (checkpoint / "adapter_config.json").write_text('{"r": 4}')
    mark_complete(checkpoint, {"step": 4}, "max_steps: 10\n")
    monkeypatch.chdir(checkpoint)
    assert load_run(".").root == run
