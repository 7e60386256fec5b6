"""The errors a newcomer meets first: one line that says what happened and what to do, exit 1,
no traceback (unless --debug)."""

from __future__ import annotations

import errno
import math
import re
from pathlib import Path

import pytest

from fincheck.commands.cli import main


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err.strip()


def test_no_data_dir_and_no_network(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("FINCHECK_DATA_DIR", raising=False)
    monkeypatch.setenv("FINCHECK_CACHE_DIR", str(tmp_path / "cache"))
    from fincheck.io import sources

    def offline(*_args, **_kwargs):
        raise sources.urllib.error.URLError("Temporary failure in name resolution")

    monkeypatch.setattr(sources.urllib.request, "urlopen", offline)
    code, err = run_cli(capsys, "prepare", "--out", str(tmp_path / "out"))
    assert code == 1
    assert "could not download" in err and "--data-dir" in err and "FINCHECK_DATA_DIR" in err


def test_wrong_recipe_key_suggests_the_right_one(tmp_path, capsys):
    repo = Path(__file__).resolve().parents[1]
    code, err = run_cli(
        capsys, "train", "--config", str(repo / "configs/train/tiny-cpu.yaml"), "--lora_rr=4"
    )
    assert code == 1 and "unknown key 'lora_rr'" in err and "Did you mean lora_r" in err


def test_unknown_task(prepared_dir, tmp_path, capsys):
    argv = ["--model", "x", "--data", str(prepared_dir), "--tasks", "fianl", "--out", str(tmp_path)]
    code, err = run_cli(capsys, "eval", *argv)
    assert code == 2  # a usage error, as argparse's own
    assert "--tasks: unknown task(s) ['fianl']; choose from final,qasem,fhsumbench" in err
    code, err = run_cli(capsys, "prepare", "--out", str(tmp_path), "--tasks=fianl")
    assert code == 1 and "tasks must be a non-empty subset" in err


@pytest.mark.parametrize("command", ["eval", "detect", "merge"])
def test_missing_adapter(command, prepared_dir, tmp_path, capsys):
    missing = str(tmp_path / "no-such-adapter")
    extra = {
        "eval": ["--data", str(prepared_dir), "--out", str(tmp_path / "run")],
        "detect": ["--text", __file__, "--summary", __file__],
        "merge": ["--out", str(tmp_path / "merged")],
    }[command]
    code, err = run_cli(capsys, command, "--adapter", missing, *extra)
    assert code == 1 and missing in err and err.startswith(f"fincheck {command}: error:")


def test_out_of_disk_is_one_clear_line(data_dir, tmp_path, capsys, monkeypatch):
    from fincheck.data_prep import prepare

    def full_disk(*_args, **_kwargs):
        raise OSError(
            errno.ENOSPC, "No space left on device", str(tmp_path / "out" / "qasem" / "test.jsonl")
        )

    monkeypatch.setattr(prepare, "write_pairs", full_disk)
    code, err = run_cli(
        capsys,
        "prepare",
        "--data-dir",
        str(data_dir),
        "--out",
        str(tmp_path / "out"),
        "--tasks=qasem",
    )
    assert code == 1
    assert (
        err.startswith("fincheck prepare: error: out of disk space writing")
        and "Free some space" in err
        and "prepare starts over" in err
    )


def test_a_full_disk_mid_file_leaves_no_tmp_file(tmp_path, monkeypatch):
    """write_pairs writes a .tmp and renames it: a failure mid-write removes the .tmp."""
    from fincheck.data.pairs import read_pairs, write_pairs
    from fincheck.tasks import task_names

    small = Path(__file__).parent / "assets" / "prepared" / "qasem" / "test.jsonl"
    pairs = list(read_pairs(small, task_names()))

    def full_disk_after_two():
        for i, pair in enumerate(pairs):
            if i == 2:
                raise OSError(errno.ENOSPC, "No space left on device")
            yield pair

    out = tmp_path / "qasem" / "test.jsonl"
    with pytest.raises(OSError):
        write_pairs(out, full_disk_after_two())
    assert list((tmp_path / "qasem").iterdir()) == []


def test_debug_shows_the_traceback(tmp_path):
    from fincheck.errors import FincheckError

    with pytest.raises(FincheckError, match="data directory not found"):
        main(
            ["--debug", "prepare", "--data-dir", str(tmp_path / "missing"), "--out", str(tmp_path)]
        )


@pytest.mark.parametrize("inside", ["same", "inside", "around"])
def test_prepare_never_writes_over_its_inputs(tmp_path, capsys, inside):
    """--out equal to, inside, or around the data directory would overwrite the raw files."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(Path(__file__).parent / "assets" / "prepared", data / "x")  # any files
    before = sorted(p.read_bytes() for p in data.rglob("*") if p.is_file())
    out = {"same": data, "inside": data / "prepared", "around": tmp_path}[inside]
    code, err = run_cli(capsys, "prepare", "--data-dir", str(data), "--out", str(out))
    assert code == 1 and "overlaps the input" in err and "nothing was written" in err
    assert sorted(p.read_bytes() for p in data.rglob("*") if p.is_file()) == before


def test_prepare_never_writes_over_an_input_linked_into_its_output(tmp_path, capsys, data_dir):
    """A data folder whose qasem/ is a symlink into --out passes the folder check; its files,
    resolved, do not."""
    import shutil

    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    for name in ("defacto", "fhsumbench", "final"):
        if (data_dir / name).exists():
            (data / name).symlink_to(data_dir / name, target_is_directory=True)
    shutil.copytree(data_dir / "qasem", out / "qasem")
    (data / "qasem").symlink_to(out / "qasem", target_is_directory=True)
    before = {p.name: p.read_bytes() for p in (out / "qasem").iterdir()}
    code, err = run_cli(capsys, "prepare", "--data-dir", str(data), "--out", str(out))
    assert code == 1 and "overlaps the input" in err and "nothing was written" in err
    assert {p.name: p.read_bytes() for p in (out / "qasem").iterdir()} == before


def test_a_local_judge_that_does_not_exist_is_one_line(tmp_path, capsys):
    code, err = run_cli(
        capsys, "score", "--data", str(tmp_path), "--predictions", str(tmp_path),
        "--out", str(tmp_path / "o"), "--judge", "local", "--judge-model", str(tmp_path / "nope"),
    )  # fmt: skip
    assert (
        code == 1 and err == f"fincheck score: error: model folder not found: {tmp_path / 'nope'}"
    )


def test_a_hub_adapter_while_offline_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    code, err = run_cli(
        capsys, "detect", "--adapter", "some-org/some-adapter", "--text", __file__,
        "--summary", __file__,
    )  # fmt: skip
    assert code == 1
    assert err.startswith("fincheck detect: error: cannot download the adapter some-org/some-")
    assert "pass the adapter's local folder" in err and len(err.splitlines()) == 1


def test_a_base_with_its_own_code_names_the_option(tmp_path, capsys):
    import json

    base = tmp_path / "custom"
    base.mkdir()
    (base / "config.json").write_text(
        json.dumps(
            {
                "model_type": "custom_x",
                "architectures": ["XForCausalLM"],
                "auto_map": {
                    "AutoConfig": "configuration_x.XConfig",
                    "AutoModelForCausalLM": "modeling_x.XForCausalLM",
                },
            }
        )
    )
    prepared = Path(__file__).parent / "assets" / "prepared"
    code, err = run_cli(
        capsys, "eval", "--model", str(base), "--data", str(prepared), "--out",
        str(tmp_path / "o"), "--tasks", "qasem",
    )  # fmt: skip
    assert code == 1 and "add --trust-remote-code" in err and "trust_remote_code=True" not in err


@pytest.mark.parametrize(
    "config, said",
    [
        ({"hidden_size": 8}, "model_type"),
        ({"model_type": "llama", "hidden_size": "big", "num_attention_heads": 2,
          "num_hidden_layers": 1, "intermediate_size": 8, "vocab_size": 10}, "hidden_size"),
    ],
)  # fmt: skip
def test_a_config_transformers_cannot_build_is_one_line(tmp_path, capsys, config, said):
    import json

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    small = Path(__file__).parent / "assets" / "prepared"
    code, err = run_cli(capsys, "eval", "--model", str(model), "--data", str(small),
                        "--out", str(tmp_path / "run"), "--device", "cpu", "--no-progress")  # fmt: skip
    assert code == 1 and err.count("\n") <= 1
    assert "its config.json is not one transformers can build a model from" in err and said in err


def _unwritable_folder() -> Path:
    """A folder no process may write in, root included (file modes do not stop root): sysfs."""
    target = Path("/sys/fincheck-test")
    try:
        target.mkdir()
    except OSError:
        return target
    target.rmdir()
    pytest.skip("/sys takes new folders here")


def test_an_unwritable_models_cache_is_one_line(tmp_path, capsys, monkeypatch):
    """Real file systems, no simulation: a cache where nothing may be written, and a cache
    path that is a file."""
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for cache, said in [(_unwritable_folder(), "not permitted"), (a_file, "is a file")]:
        monkeypatch.setenv("FINCHECK_CACHE_DIR", str(cache))
        code, err = run_cli(capsys, "models", "fetch", "smollm2-135m-instruct")
        assert code == 1 and err.count("\n") <= 1, err
        assert str(cache) in err and said in err and "Traceback" not in err


@pytest.mark.parametrize("command", ["baseline", "score"])
def test_an_out_that_is_a_file_or_unwritable_is_one_line(command, tmp_path, capsys):
    small = Path(__file__).parent / "assets" / "prepared"
    args = {
        "baseline": ["baseline", "--method", "overlap", "--data", str(small), "--no-progress"],
        "score": ["score", "--data", str(small), "--predictions", str(tmp_path / "p" / "predictions"),
                  "--no-progress", "--bootstrap", "0"],
    }[command]  # fmt: skip
    if command == "score":
        assert main(["baseline", "--method", "overlap", "--data", str(small), "--out",
                     str(tmp_path / "p"), "--no-progress"]) == 0  # fmt: skip
        capsys.readouterr()
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for out in (a_file, _unwritable_folder() / "run"):
        code, err = run_cli(capsys, *args, "--out", str(out))
        assert code == 1 and err.count("\n") <= 1, err
        assert str(out.parent if out.parent != tmp_path else out) in err, err
        assert "Traceback" not in err
    assert a_file.read_text() == "x"


def test_detect_checks_its_out_before_the_model_runs(tmp_path, capsys):
    """An --out in a folder that takes no file is found before any model loads (the model named
    here does not exist: its error would come first otherwise)."""
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"id": "1", "text": "A text.", "summary": "A summary."}\n')
    out = _unwritable_folder() / "results.jsonl"
    code, err = run_cli(capsys, "detect", "--input", str(pairs), "--out", str(out),
                        "--adapter", str(tmp_path / "no-model"))  # fmt: skip
    assert code == 1 and err.count("\n") <= 1 and str(out) in err and "no-model" not in err


def test_a_base_without_a_chat_template_says_what_to_use_instead():
    """Gemma-3-270M (a base) has no template: the error names the ways that work."""
    from types import SimpleNamespace

    from fincheck.errors import FincheckError
    from fincheck.inference.generation import render_chat

    tokenizer = SimpleNamespace(chat_template=None, name_or_path="gemma-3-270m")
    with pytest.raises(
        FincheckError, match=r"gemma-3-270m has no chat template .*chat_template_path"
    ):
        render_chat(tokenizer, [{"role": "user", "content": "hi"}], add_generation_prompt=True)


@pytest.mark.parametrize("name", ["manifest.json", "eval_config.json", "recipe.yaml"])
def test_bad_bytes_in_a_json_or_yaml_file_name_the_file_and_the_byte(name, tmp_path):
    """A damaged file (a byte that is no UTF-8) is one line naming it, never a traceback."""
    from fincheck.errors import FincheckError
    from fincheck.io.config import read_yaml_mapping
    from fincheck.io.jsonl import read_json_object

    path = tmp_path / name
    path.write_bytes(
        b'{"a": 1,\n "b": "caf\xe9"}\n' if name.endswith("json") else b"a: 1\nb: caf\xe9\n"
    )
    reader = read_yaml_mapping if name.endswith("yaml") else read_json_object
    with pytest.raises(FincheckError, match=rf"{path}:2: not UTF-8 text \(byte 0xe9\)"):
        reader(path)


def test_a_key_given_twice_in_a_recipe_is_an_error_naming_both_lines(tmp_path):
    from fincheck.errors import FincheckError
    from fincheck.io.config import read_yaml_mapping

    path = tmp_path / "recipe.yaml"
    path.write_text("learning_rate: 1.0e-4\nmax_steps: 3\nlearning_rate: 2.0e-4\n")
    with pytest.raises(
        FincheckError, match="'learning_rate' on line 3 was already given on line 1"
    ):
        read_yaml_mapping(path)


@pytest.mark.parametrize(
    "text, said",
    [
        ("? [a, b]\n: 1\n", "the key on line 1 is not a name (list)"),
        ("{a: 1}: 2\n", "is not a name (dict)"),
        ("max_steps: 3\n3.5: 3\n", "the key on line 2 is not a name (float)"),
        ("~: 3\n", "is not a name (NoneType)"),
        ('run_name: "\\ud800x"\n', "lone surrogate"),
    ],
)
def test_a_key_that_is_no_name_or_a_lone_surrogate_is_one_line(tmp_path, text, said):
    """A config's keys are names: a list, mapping, number or null as a key (PyYAML builds them;
    a dict refuses the unhashable ones with a traceback) and a lone surrogate escape in a
    string (which no file or terminal can encode) are one line naming the file and line."""
    from fincheck.errors import FincheckError
    from fincheck.io.config import read_yaml_mapping

    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    with pytest.raises(FincheckError, match=re.escape(said)) as caught:
        read_yaml_mapping(path)
    assert str(caught.value).startswith(f"{path}:") and "\n" not in str(caught.value)


def test_training_never_writes_into_a_folder_that_is_not_its_own(tmp_path, monkeypatch):
    """An output_dir holding someone's files (the repository root: TRL's model card would
    replace README.md; `/`) is refused before anything is written; a new, empty or earlier
    run folder is used."""
    from fincheck.errors import FincheckError
    from fincheck.train.sft import load_training_recipe

    repo = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(repo)
    small = repo / "tests" / "assets" / "prepared"
    foreign = tmp_path / "project"
    foreign.mkdir()
    (foreign / "README.md").write_text("mine")
    root_like = tmp_path / "root"  # as `/` (a regression must not write into the real one)
    for name in ("bin", "etc", "home"):
        (root_like / name).mkdir(parents=True)
    for out in (foreign, root_like):
        with pytest.raises(FincheckError, match=f"output_dir {out} holds files fincheck did not"):
            load_training_recipe(repo / "configs" / "train" / "tiny-cpu.yaml",
                                 [f"--dataset_dir={small}", f"--output_dir={out}", "--deepspeed="])  # fmt: skip
    assert [p.name for p in foreign.iterdir()] == ["README.md"]


@pytest.mark.parametrize("out", ["", "foreign"])
def test_an_out_that_is_empty_or_someone_elses_folder_is_refused(
    out, tmp_path, capsys, monkeypatch
):
    """`--out ""` would be the current folder; a folder of other files is never mixed into."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    small = Path(__file__).parent / "assets" / "prepared"
    args = ["baseline", "--method", "overlap", "--data", str(small), "--no-progress", "--out", out]
    code, err = run_cli(capsys, *args)
    assert code in (1, 2) and err.count("\n") <= 1
    assert ("empty string" if not out else "holds files fincheck did not write (notes.txt)") in err
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["foreign", "notes.txt"]
    # fincheck's own folders stay usable: a new one, then the same again (resumed)
    assert main([*args[:-1], "mine"]) == 0 and main([*args[:-1], "mine"]) == 0


def test_fincheck_train_claims_its_output_dir_before_writing_the_tiny_base(
    tmp_path, capsys, monkeypatch
):
    """`fincheck train` writes the tiny random-init base into output_dir before training: the
    folder is claimed first, so the repository root or `/` are refused with nothing written
    (the base made them look like a run's, and TRL's model card replaced README.md)."""
    repo = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(repo)
    small = repo / "tests" / "assets" / "prepared"
    root_like = tmp_path / "repo"  # as the repository root (a regression must not touch it)
    (root_like / "checkpoints").mkdir(parents=True)
    (root_like / "README.md").write_text("mine")
    (root_like / "pyproject.toml").write_text("")
    config = str(repo / "configs" / "train" / "tiny-cpu.yaml")
    for out in (root_like, root_like / "new" / ".." / "checkpoints" / ".."):
        code, err = run_cli(capsys, "train", "--config", config, f"--dataset_dir={small}",
                            f"--output_dir={out}", "--deepspeed=", "--max_steps=1")  # fmt: skip
        assert code == 1 and "holds files fincheck did not write (README.md, checkpoints" in err
    assert sorted(p.name for p in root_like.rglob("*")) == ["README.md", "checkpoints",
                                                            "pyproject.toml"]  # fmt: skip
    assert (root_like / "README.md").read_text() == "mine"


@pytest.mark.parametrize(
    "argv",
    [
        ["merge", "--adapter", "run", "--out", ""],
        ["detect", "--adapter", "run", "--input", "in.jsonl", "--out", ""],
        ["publish", "--checkpoint", "run", "--repo-id", "a/b", "--dry-run", ""],
        ["publish", "--checkpoint", "run", "--repo-id", "a/b", "--results", ""],
    ],
)
def test_an_empty_output_path_is_a_usage_error_for_every_command(argv, capsys):
    """`--out ""` is no path: merge would write into the current folder, detect print to
    stdout, and `publish --dry-run ""` would upload for real."""
    code, err = run_cli(capsys, *argv)
    assert code == 2 and f"{argv[-2]}: expected a path, got an empty string" in err


def test_merge_finds_an_unwritable_out_before_loading_the_model(tmp_path, capsys):
    """A path under a file (ENOTDIR: the test runs as root, for whom chmod proves nothing) is
    one line naming it, before the adapter is even read."""
    (tmp_path / "afile").write_text("")
    out = tmp_path / "afile" / "merged"
    code, err = run_cli(capsys, "merge", "--adapter", str(tmp_path / "no-run"), "--out", str(out))
    assert code == 1 and f"{tmp_path / 'afile'} (a file is in the way of a folder" in err


@pytest.mark.parametrize(
    "error",
    [
        b"\xff".decode,  # UnicodeDecodeError
        lambda: __import__("json").loads('{"a": '),
        lambda: __import__("yaml").safe_load("a: [1"),
    ],
)
def test_a_library_s_decoding_error_is_one_line(error, capsys, monkeypatch):
    """A JSON, YAML or UTF-8 error from a reader that does not name its file (a library's) is
    still one line, not a traceback; --debug shows it whole."""
    from fincheck.commands import models as models_command

    def damaged(*args, **kwargs):
        error()

    monkeypatch.setattr(models_command, "fetch_model", damaged)
    code, err = run_cli(capsys, "models", "fetch", "qwen3-tokenizer")
    assert code == 1 and err.count("\n") == 0
    assert "error: a file is damaged or not" in err and "--debug shows which" in err
    with pytest.raises(Exception):  # noqa: B017 (three kinds, each whole)
        main(["--debug", "models", "fetch", "qwen3-tokenizer"])


def test_detect_finds_an_unwritable_out_before_the_model_runs(tmp_path, capsys):
    """A --out in a folder nobody may write (sysfs: real, root included) or under a file is one
    line naming it, before the adapter is read: no model run whose results are then lost."""
    (tmp_path / "afile").write_text("")
    (tmp_path / "in.jsonl").write_text('{"text": "a", "summary": "b"}\n')
    for out, said in [
        (_unwritable_folder() / "out.jsonl", "fincheck-test"),
        (tmp_path / "afile" / "out.jsonl", "afile is a file, not a folder"),
    ]:
        code, err = run_cli(capsys, "detect", "--adapter", str(tmp_path / "no-run"), "--input",
                            str(tmp_path / "in.jsonl"), "--out", str(out))  # fmt: skip
        assert code == 1 and err.count("\n") == 0 and said in err, err
        assert "no-run" not in err


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("lora_r: [8\n", "2: not valid YAML: while parsing a flow sequence expected ','"),
        ("lora_r: 8\nlora_r: 16\n", "2: not valid YAML: key 'lora_r' on line 2 was already"),
        ("a: 1\n  b: 2\n", "2: not valid YAML: mapping values are not allowed here"),
        # bounded like JSON: deep nesting (block or flow) and integers past Python's digit limit
        (
            "a:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 100)),
            "64: not valid YAML: nested deeper than 64 levels",
        ),
        ("a: " + "[" * 5_000 + "]" * 5_000 + "\n", "1: not valid YAML: nested deeper than 64"),
        ("lora_r: " + "1" * 5_000 + "\n", "1: not valid YAML: an integer that cannot be read"),
    ],
)
def test_a_recipe_that_is_no_yaml_is_one_line_naming_file_and_line(text, said, tmp_path, capsys):
    """`file:line: problem`, as every other file error; not PyYAML's multi-line report about
    "<unicode string>"."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text(text)
    code, err = run_cli(capsys, "train", "--config", str(recipe))
    assert code == 1 and err.startswith(f"fincheck train: error: {recipe}:{said}")
    assert "unicode string" not in err


def test_one_familiar_name_does_not_make_a_folder_fincheck_s(tmp_path, capsys):
    """A folder of the user's that happens to hold a report.md (eval and score write one) or
    a recipe.yaml (a run writes one) is refused: only a folder holding nothing but what the
    command writes, or marked by fincheck, is its own. An older run folder (its
    fincheck_run.json) and an older eval folder (only eval's outputs) stay usable."""
    from fincheck.errors import FincheckError
    from fincheck.io.out_lock import EVAL_OUTPUTS, claim_out_dir
    from fincheck.io.runs import RUN_METADATA
    from fincheck.train.checkpoints import RUN_FOLDER_NAMES

    thesis = tmp_path / "thesis"
    thesis.mkdir()
    (thesis / "report.md").write_text("mine")
    (thesis / "chapter1.tex").write_text("mine")
    with pytest.raises(FincheckError, match=r"holds files fincheck did not write \(chapter1.tex\)"):
        claim_out_dir(thesis, "--out", "eval", EVAL_OUTPUTS)
    (thesis / "recipe.yaml").write_text("mine")
    with pytest.raises(FincheckError, match="fincheck did not write"):
        claim_out_dir(thesis, "output_dir", "train", RUN_FOLDER_NAMES, marks=(RUN_METADATA,))
    assert sorted(p.name for p in thesis.iterdir()) == ["chapter1.tex", "recipe.yaml", "report.md"]
    old_eval = tmp_path / "old-eval"
    (old_eval / "predictions").mkdir(parents=True)
    (old_eval / "results.json").write_text("{}")
    assert claim_out_dir(old_eval, "--out", "eval", EVAL_OUTPUTS) == old_eval
    old_run = tmp_path / "old-run"
    old_run.mkdir()
    for name in (RUN_METADATA, "README.md", "tokenizer.json", "training_args.bin"):
        (old_run / name).write_text("")
    assert claim_out_dir(old_run, "output_dir", "train", RUN_FOLDER_NAMES, marks=(RUN_METADATA,))


@pytest.mark.parametrize("name", ["manifest.json", "predictions/eval_config.json"])
def test_a_cut_json_file_is_one_line_naming_its_line(name, tmp_path, capsys):
    """A manifest.json or eval_config.json cut short (a full disk, a copy stopped) names the
    file and the line where JSON stops making sense, and says it looks cut short."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(Path(__file__).parent / "assets" / "prepared", data)
    run = tmp_path / "run"
    assert main(["baseline", "--method", "overlap", "--data", str(data), "--out", str(run),
                 "--no-progress"]) == 0  # fmt: skip
    capsys.readouterr()
    broken = (data if name == "manifest.json" else run) / name
    broken.write_text(broken.read_text()[:40])
    code, err = run_cli(capsys, "score", "--data", str(data), "--predictions",
                        str(run / "predictions"), "--out", str(run))  # fmt: skip
    assert code == 1 and err.startswith(f"fincheck score: error: {broken}:")
    assert "not valid JSON" in err and "the file looks cut short" in err


def test_detect_out_with_one_text_and_summary_is_never_ignored(tmp_path, capsys):
    """--out is where --input's JSONL results go; with --text/--summary (one JSON object on
    stdout) it was ignored silently and the file never written: a usage error now."""
    (tmp_path / "t.txt").write_text("a")
    code, err = run_cli(capsys, "detect", "--adapter", str(tmp_path / "no-run"), "--text",
                        str(tmp_path / "t.txt"), "--summary", str(tmp_path / "t.txt"), "--out",
                        str(tmp_path / "r.jsonl"))  # fmt: skip
    assert code == 2 and "--out: read only with --input" in err
    assert not (tmp_path / "r.jsonl").exists()


def test_a_command_writes_only_into_its_own_kind_of_folder(tmp_path):
    """A folder is marked with the kind of command that wrote it: eval never writes into a
    prepared-data folder or a training run, prepare never into a run."""
    from fincheck.errors import FincheckError
    from fincheck.io.out_lock import EVAL_OUTPUTS, claim_out_dir, hold_out_dir

    prepared = claim_out_dir(tmp_path / "prepared", "--out", "prepare", ("manifest.json",))
    (prepared / "manifest.json").write_text("{}")
    with pytest.raises(FincheckError, match="is a folder `fincheck prepare` writes; eval writes"):
        claim_out_dir(prepared, "--out", "eval", EVAL_OUTPUTS)
    run = claim_out_dir(tmp_path / "run", "output_dir", "train")
    with (
        pytest.raises(FincheckError, match="`fincheck train` writes; prepare writes only"),
        hold_out_dir(run, "fincheck prepare", "prepare", ("manifest.json",)),
    ):
        pass
    assert (run / ".fincheck-out").read_text() == "train\n"
    assert claim_out_dir(run, "output_dir", "train") == run  # its own kind: claimed again


def test_no_write_follows_a_link_planted_in_an_output_folder(tmp_path):
    """report.md -> a file outside: the folder is refused before anything is written, and the
    file outside keeps its contents; the lock file is never opened through a link either."""
    from fincheck.errors import FincheckError
    from fincheck.io.out_lock import LOCK_FILE, claim_out_dir, hold_out_dir

    outside = tmp_path / "bashrc"
    outside.write_text("mine")
    out = claim_out_dir(tmp_path / "eval", "--out", "eval")
    (out / "report.md").symlink_to(outside)
    with (
        pytest.raises(FincheckError, match=r"report\.md is a symbolic link"),
        hold_out_dir(out, "fincheck score"),
    ):
        pass
    (out / "report.md").unlink()
    (out / "predictions").mkdir()
    (out / "predictions" / "qasem.jsonl").symlink_to(outside)  # deeper too
    with pytest.raises(FincheckError, match=r"qasem\.jsonl is a symbolic link"):
        claim_out_dir(out, "--out", "eval")
    (out / "predictions" / "qasem.jsonl").unlink()
    (out / LOCK_FILE).symlink_to(outside)
    with (
        pytest.raises(FincheckError, match="is a symbolic link"),
        hold_out_dir(out, "fincheck eval"),
    ):
        pass
    assert outside.read_text() == "mine"


def test_one_writer_per_folder_for_every_writing_command(tmp_path):
    """The writer lock every writing command takes (prepare, train, eval, baseline, score): a
    second writer into the folder is refused at once and names the first."""
    from fincheck.errors import FincheckError
    from fincheck.io.out_lock import claim_out_dir, hold_out_dir, lock_out_dir

    run = claim_out_dir(tmp_path / "run", "output_dir", "train")
    held = lock_out_dir(run, "fincheck train")
    with pytest.raises(FincheckError, match=r"in use by fincheck train \(pid \d+\)"):
        lock_out_dir(run, "fincheck train")
    held.close()  # the first run ends: the folder is free
    lock_out_dir(run, "fincheck train").close()
    with hold_out_dir(
        tmp_path / "prepared", "fincheck prepare", "prepare", ("manifest.json",)
    ) as p:
        (p / "manifest.json").write_text("{}")
        with (
            pytest.raises(FincheckError, match="in use by fincheck prepare"),
            hold_out_dir(p, "fincheck prepare", "prepare", ("manifest.json",)),
        ):
            pass


DEEP = "[" * 200_000  # past Python's recursion limit
HUGE = '{"n": ' + "1" * 5_000 + "}"  # past its integer digit limit
LONE = '{"id": "b", "output": "x\\udc80y"}'  # a lone surrogate: JSON allows it, no character
# valid JSON 600 deep, which Python reads, and which crashed the recursive helpers after it
# (a FINAL item's `origin` copied into a pair's meta, the redaction of a record)
NESTED = '{"id": "c", "origin": ' + '{"a": ' * 600 + "1" + "}" * 601
# a key given twice: which value counts is no reader's to guess (the last, in Python's reader)
REPEATED = '{"id": "d", "Faithfulness": true, "p_yes": 0.5, "Faithfulness": false, "p_yes": 0.99}'


@pytest.mark.parametrize(
    "text",
    [DEEP, HUGE, LONE, NESTED, REPEATED],
    ids=["deep", "huge-int", "lone-surrogate", "nested", "repeated-key"],
)
def test_json_that_cannot_be_read_is_one_error_in_every_reader(text, tmp_path):
    """One JSON reader for text fincheck did not write: nesting 200,000 deep, a 5,000-digit
    integer or a lone surrogate escape is an unreadable answer or a one-line error naming the file, never a traceback --
    a model's reply (judge, FINAL, FHSumBench), a prepared or detect input line, a
    predictions file, a request cache, a JSON file."""
    import json

    from fincheck.errors import FincheckError
    from fincheck.inference.llm import RequestCache
    from fincheck.io.jsonl import iter_json_objects, loads, read_json_object
    from fincheck.tasks.fhsumbench.metrics import lenient_judgement
    from fincheck.tasks.final.judge import MatchingParseError, parse_matching
    from fincheck.tasks.final.reader import read_descriptions

    with pytest.raises(json.JSONDecodeError):
        loads(text)
    with pytest.raises(MatchingParseError):
        parse_matching("{" + text[1:] if text.startswith("[") else text, ["a"], ["b"])
    assert lenient_judgement(text) is None
    read_descriptions(text)  # read as some answer or none, without raising
    lines = tmp_path / "in.jsonl"
    lines.write_text('{"id": "a"}\n' + text + "\n")
    with pytest.raises(FincheckError, match=r"in\.jsonl:2"):
        list(iter_json_objects(lines))
    whole = tmp_path / "x.json"
    whole.write_text(text)
    with pytest.raises(FincheckError, match=r"x\.json:1: not valid JSON"):
        read_json_object(whole)
    cache = tmp_path / "cache.jsonl"
    cache.write_text(json.dumps({"key": "k", "response": "r"}) + "\n" + text + "\n")
    assert RequestCache(cache).get("k") == "r"  # the damaged line is skipped, the rest kept


def test_no_write_goes_through_a_hard_link_a_fifo_or_a_symlink(tmp_path):
    """One way to open a file for writing: a lock file, a request cache, detect's --out and its
    partial file are refused when planted as a hard link to someone's file, a FIFO (refused at
    once, not waited on) or a symbolic link; the victim is untouched."""
    import os

    from fincheck.errors import FincheckError
    from fincheck.inference.llm import RequestCache
    from fincheck.io.out_lock import LOCK_FILE, lock_out_dir
    from fincheck.io.safe_files import claimed_output_file

    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    out = tmp_path / "out"
    out.mkdir()
    os.link(victim, out / LOCK_FILE)
    with pytest.raises(FincheckError, match="a hard-linked file"):
        lock_out_dir(out, "fincheck eval")
    for planted in ("hard", "fifo", "symlink"):
        cache = tmp_path / f"cache-{planted}.jsonl"
        {"hard": lambda p: os.link(victim, p), "fifo": os.mkfifo,
         "symlink": lambda p: p.symlink_to(victim)}[planted](cache)  # fmt: skip
        with pytest.raises(FincheckError, match="never through a link"):
            RequestCache(cache).put("k", "answer")  # refused as it is read, or written
        results = tmp_path / f"results-{planted}.jsonl"
        partial = results.with_name(results.name + ".partial")
        {"hard": lambda p: os.link(victim, p), "fifo": os.mkfifo,
         "symlink": lambda p: p.symlink_to(victim)}[planted](partial)  # fmt: skip
        with (
            pytest.raises(FincheckError, match="never through a link"),
            claimed_output_file(results, "--out"),
        ):
            pass
    assert victim.read_text() == "keep me\n"


def test_a_fifo_where_a_file_is_read_is_one_line_not_a_wait(tmp_path, small_prepared, capsys):
    """A FIFO (or a folder) where a command reads a file: predictions, a JSON record, compare's
    earlier output it would replace. One line at once, never a wait for a writer that never
    comes (an alarm fails the test instead of hanging it)."""
    import os
    import shutil
    import signal

    from fincheck.errors import FincheckError
    from fincheck.io.jsonl import iter_json_objects, read_json_object

    def waited(signum, frame):
        raise AssertionError("waited on a FIFO")

    fifo = tmp_path / "x.jsonl"
    os.mkfifo(fifo)
    previous = signal.signal(signal.SIGALRM, waited)
    signal.alarm(30)
    try:
        for read in (lambda p: list(iter_json_objects(p)), read_json_object):
            for planted in (fifo, tmp_path):
                with pytest.raises(FincheckError, match="not a regular file"):
                    read(planted)
        (tmp_path / "predictions").mkdir()
        os.mkfifo(tmp_path / "predictions" / "qasem.jsonl")
        score = ["score", "--data", str(small_prepared), "--predictions"]
        assert main([*score, str(tmp_path / "predictions"), "--out", str(tmp_path / "s")]) == 1
        assert "qasem.jsonl: not a regular file" in capsys.readouterr().err
        data = tmp_path / "data"  # a prepared folder whose manifest is a FIFO: not "no manifest"
        shutil.copytree(small_prepared, data)
        (data / "manifest.json").unlink()
        os.mkfifo(data / "manifest.json")
        answers = tmp_path / "answers"  # predictions to score: the word overlap's, no model
        baseline = ["baseline", "--method", "overlap", "--data", str(small_prepared)]
        assert main([*baseline, "--out", str(answers), "--no-progress"]) == 0
        scored = ["score", "--data", str(data), "--predictions", str(answers / "predictions")]
        assert main([*scored, "--out", str(tmp_path / "m"), "--no-progress"]) == 1
        assert "manifest.json: not a regular file" in capsys.readouterr().err
        (tmp_path / "o").mkdir()
        os.mkfifo(tmp_path / "o" / "c.json")
        runs = [str(tmp_path / "s"), str(tmp_path / "s")]
        assert main(["compare", *runs, "--names", "a,b", "--out", str(tmp_path / "o" / "c.md")])
        assert "are not an earlier `fincheck compare` output" in capsys.readouterr().err
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_one_writer_per_output_file_and_nothing_overwritten(tmp_path):
    """`detect --out F` twice at once: the second is refused while the first writes; the first
    moves its complete output into place; a file that appeared meanwhile is never replaced."""
    from fincheck.errors import FincheckError
    from fincheck.io.safe_files import claimed_output_file

    results = tmp_path / "results.jsonl"
    with claimed_output_file(results, "--out") as first:
        first.write('{"id": "1"}\n')
        with (
            pytest.raises(FincheckError, match="being written by another fincheck command"),
            claimed_output_file(results, "--out"),
        ):
            pass
    assert results.read_text() == '{"id": "1"}\n'
    assert not results.with_name("results.jsonl.partial").exists()
    with (
        pytest.raises(FincheckError, match="exists; pick a new file"),
        claimed_output_file(results, "--out"),
    ):
        pass
    other = tmp_path / "other.jsonl"
    with (
        pytest.raises(FincheckError, match="appeared while this command ran"),
        claimed_output_file(other, "--out") as f,
    ):
        f.write("mine\n")
        other.write_text("someone else's\n")
    assert other.read_text() == "someone else's\n"
    assert (tmp_path / "other.jsonl.partial").read_text() == "mine\n"


def test_an_output_file_is_published_from_the_file_its_command_holds(tmp_path):
    """The partial file's name is not trusted at the end: swapped for a link while the command
    wrote, the output still lands at PATH as a regular file and the link's target is untouched;
    removed and taken by a second writer, each writer keeps its own output (the first at PATH,
    the second beside it) and neither removes the other's partial file."""
    from fincheck.errors import FincheckError
    from fincheck.io.safe_files import claimed_output_file

    victim, results = tmp_path / "victim.txt", tmp_path / "swapped.jsonl"
    victim.write_text("VICTIM\n")
    with claimed_output_file(results, "--out") as f:
        f.write("mine\n")
        partial = tmp_path / "swapped.jsonl.partial"
        partial.unlink()
        partial.symlink_to(victim)
    assert results.read_text() == "mine\n" and not results.is_symlink()
    assert victim.read_text() == "VICTIM\n" and partial.is_symlink()  # not ours: left alone

    results = tmp_path / "taken.jsonl"
    partial = tmp_path / "taken.jsonl.partial"
    with claimed_output_file(results, "--out") as first:
        first.write("first\n")
        partial.unlink()  # the first writer's lock now guards no name
        second = claimed_output_file(results, "--out")
        f2 = second.__enter__()
        f2.write("second\n")
    assert results.read_text() == "first\n"
    assert partial.exists()  # the second writer's, still being written
    with pytest.raises(
        FincheckError, match=r"appeared while this command ran; .* kept in .*partial"
    ):
        second.__exit__(None, None, None)
    assert results.read_text() == "first\n" and partial.read_text() == "second\n"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("taken")) == [
        "taken.jsonl",
        "taken.jsonl.partial",
    ]


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("--lora_target_modules=[nope_proj]", "the LoRA setup on"),
        ("--attn_implementation=flash_attention_2", "the base does not load for training"),
        ("--attn_implementation=bogus", "the base does not load for training"),
    ],
)
def test_peft_and_attention_setup_errors_are_one_line(
    override, said, prepared_dir, tmp_path, capsys
):
    """A library's error while training sets up (PEFT finds no target module, an attention
    kernel that is not installed or not known) is one line naming what to change."""
    repo = Path(__file__).resolve().parents[1]
    code, err = run_cli(
        capsys, "train", "--config", str(repo / "configs/train/tiny-cpu.yaml"),
        f"--dataset_dir={prepared_dir}", f"--output_dir={tmp_path / 'run'}", "--max_steps=1",
        "--deepspeed=", override,
    )  # fmt: skip
    last = err.splitlines()[-1]
    assert code == 1 and last.startswith("fincheck train: error: ") and said in last


def test_a_damaged_base_is_one_line_naming_its_file(tiny_base, prepared_dir, tmp_path, capsys):
    """A base whose weights were cut short (a full disk, a copy stopped) is one line naming
    the file, for eval as for every command that loads a base."""
    import shutil

    base = tmp_path / "base"
    shutil.copytree(tiny_base, base)
    weights = base / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    code, err = run_cli(
        capsys, "eval", "--model", str(base), "--data", str(prepared_dir), "--tasks", "qasem",
        "--limit", "2", "--out", str(tmp_path / "eval"), "--no-progress",
    )  # fmt: skip
    assert code == 1 and f"{weights} is not a safetensors file, or is cut short" in err


def test_a_base_without_its_tokenizer_files_is_one_line(tiny_base, prepared_dir, tmp_path, capsys):
    """A base folder whose tokenizer files are missing loads an empty tokenizer: refused in one
    line naming the folder, not an empty prompt met as a traceback inside the model."""
    import shutil

    base = tmp_path / "base"
    shutil.copytree(tiny_base, base)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (base / name).unlink()
    code, err = run_cli(
        capsys, "eval", "--model", str(base), "--data", str(prepared_dir), "--tasks", "qasem",
        "--limit", "2", "--out", str(tmp_path / "eval"), "--no-progress",
    )  # fmt: skip
    last = err.strip().splitlines()[-1]  # after the weights' progress bar
    assert code == 1 and "Traceback" not in err
    assert last.startswith(f"fincheck eval: error: {base}: its tokenizer turns text into no")


@pytest.mark.parametrize("value", ["float99", 12, ["bfloat16"], "config.json that is no JSON"])
def test_a_config_that_does_not_load_is_blamed_on_it_on_every_route(
    value, tiny_base, data_dir, tmp_path, capsys
):
    """The tokenizer reads config.json too: a `torch_dtype` that names no dtype was reported as
    "its tokenizer files do not load", or as a traceback in training and FIZZ. Every route to a
    model's tokenizer (eval, a served eval's `--tokenizer`, train's base and its
    `tokenizer_name_or_path`, FIZZ's NLI model, prepare's token counter) gives one line naming
    config.json."""
    import json
    import shutil

    base = tmp_path / "base"
    shutil.copytree(tiny_base, base)
    config = json.loads((base / "config.json").read_text())
    config.pop("dtype", None)
    text = json.dumps({**config, "torch_dtype": value})
    (base / "config.json").write_text(text if "JSON" not in str(value) else "{not json")
    small = str(Path(__file__).parent / "assets" / "prepared")
    served = ["--backend", "openai", "--model", "m", "--base-url", "http://127.0.0.1:9/v1"]
    trained = ["--config", "configs/train/tiny-cpu.yaml", "--data_config=configs/data/tiny.yaml"]
    trained += [f"--dataset_dir={small}", "--deepspeed="]
    fizz = ["--method", "fizz", "--model", str(tiny_base), "--data", small, "--limit", "1"]
    counted = ["--tasks=[qasem]", "--max_pair_tokens=2048"]
    routes = {
        "eval": ["--model", str(base), "--data", small, "--tasks", "qasem", "--limit", "2"],
        "served eval": [*served, "--tokenizer", str(base), "--data", small, "--tasks", "qasem"],
        "train": [*trained, f"--model_name_or_path={base}"],
        "its tokenizer train": [*trained, f"--tokenizer_name_or_path={base}"],
        "fizz baseline": [*fizz, "--tasks", "fhsumbench", "--nli-model", str(base)],
        "its token counter prepare": [f"--data-dir={data_dir}", *counted, f"--tokenizer={base}"],
    }
    for route, argv in routes.items():
        command = route.split()[-1]
        out = [f"--output_dir={tmp_path / 'run'}"] if command == "train" else []
        out = out or ["--out", str(tmp_path / route.replace(" ", "-"))]
        code, err = run_cli(capsys, command, *argv, *out)
        last = err.strip().splitlines()[-1]
        assert code == 1 and "Traceback" not in err, (route, err)
        assert "its config.json" in last and "tokenizer files" not in last, (route, err)


def test_a_tokenizer_that_does_not_load_is_one_line_on_every_route(tiny_base, tmp_path, capsys):
    """A tokenizer.json the tokenizers library cannot read (a model type it has none of): one
    line naming the folder on train's `tokenizer_name_or_path` and FIZZ's NLI model too, as on
    eval's, never a KeyError traceback."""
    import shutil

    folder = tmp_path / "tk"
    shutil.copytree(tiny_base, folder)
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "Nope"}}')
    small = str(Path(__file__).parent / "assets" / "prepared")
    trained = ["--config", "configs/train/tiny-cpu.yaml", "--data_config=configs/data/tiny.yaml"]
    trained += [f"--dataset_dir={small}", "--deepspeed=", f"--output_dir={tmp_path / 'run'}"]
    fizz = ["--method", "fizz", "--model", str(tiny_base), "--data", small, "--limit", "1"]
    routes = {
        "train": [*trained, f"--tokenizer_name_or_path={folder}"],
        "baseline": [
            *fizz,
            "--tasks",
            "fhsumbench",
            "--nli-model",
            str(folder),
            "--out",
            str(tmp_path / "f"),
        ],
    }
    for command, argv in routes.items():
        code, err = run_cli(capsys, command, *argv)
        assert (
            code == 1 and "Traceback" not in err and str(folder) in err.strip().splitlines()[-1]
        ), err


def test_a_base_whose_config_is_a_folder_is_one_line_naming_it(
    tiny_base, prepared_dir, tmp_path, capsys
):
    """A model file of the wrong kind (config.json a folder) is named as such, not read as a
    config transformers cannot build a model from."""
    import shutil

    base = tmp_path / "base"
    shutil.copytree(tiny_base, base)
    (base / "config.json").unlink()
    (base / "config.json").mkdir()
    code, err = run_cli(
        capsys, "eval", "--model", str(base), "--data", str(prepared_dir), "--tasks", "qasem",
        "--limit", "2", "--out", str(tmp_path / "eval"), "--no-progress",
    )  # fmt: skip
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert f"{base / 'config.json'}: a folder (or no plain file) where the model's file" in err


def test_a_traceback_printed_with_debug_holds_no_held_secret(tmp_path):
    """`--debug` prints Python's traceback after main has put its redacting streams back: the
    process's excepthook redacts it too, so an endpoint's credentials in the error never show;
    on the launcher's route as under `fincheck`."""
    import subprocess
    import sys

    url = "http://user:pw-7766554433@127.0.0.1:9/v1?subscription-key=QUERYSECRET-1234"
    # the launcher's entry point (`deepspeed train/sft.py`) re-raises what it cannot say in
    # one line: its traceback goes through the same hook
    script = (
        "import sys\n"
        "from fincheck.train import sft\n"
        "from fincheck.io.secrets import hold_url_secrets\n"
        f"hold_url_secrets({url!r})\n"
        "def unreachable(*a, **k):\n"
        f"    raise RuntimeError('could not reach ' + {url!r})\n"
        "sft.load_training_recipe = unreachable\n"
        "sys.exit(sft.main(['--config', 'recipe.yaml']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 1 and "RuntimeError: could not reach http://" in proc.stderr
    assert "pw-7766554433" not in proc.stderr and "QUERYSECRET-1234" not in proc.stderr


def test_the_process_list_shows_the_command_line_without_the_held_secrets():
    """An endpoint URL given on the command line (its userinfo, a key in its query string) is
    redacted in what the system shows for the process (`/proc/<pid>/cmdline`, which `ps`
    reads) once the run holds it, as in `sys.argv`; a command line with no secret is left as
    it was."""
    import subprocess
    import sys

    url = "http://user:pw-7766554433@127.0.0.1:9/v1?subscription-key=QUERYSECRET-1234"
    script = (
        "import sys\n"
        "from fincheck.io.secrets import hold_url_secrets\n"
        "hold_url_secrets(sys.argv[-1])\n"
        "print(open('/proc/self/cmdline', 'rb').read().decode())\n"
    )
    shown = subprocess.run(
        [sys.executable, "-c", script, "--base-url", url], capture_output=True, text=True
    ).stdout
    assert "--base-url 'http://<redacted>@127.0.0.1:9/v1?subscription-key=<redacted>'" in shown
    assert "pw-7766554433" not in shown and "QUERYSECRET-1234" not in shown
    plain = "http://127.0.0.1:9/v1"
    shown = subprocess.run(
        [sys.executable, "-c", script, "--base-url", plain], capture_output=True, text=True
    ).stdout
    assert shown.split("\0") == [sys.executable, "-c", script, "--base-url", plain, "\n"]


def test_an_export_is_one_line_without_an_adapter_or_a_format(tmp_path, capsys):
    """`fincheck export` of a folder with no adapter, or without naming the format: one line,
    before anything is merged or downloaded, and no export folder left behind."""
    empty, out = tmp_path / "run", tmp_path / "export"
    empty.mkdir()
    code, err = run_cli(capsys, "export", "--gguf", "--adapter", str(empty), "--out", str(out))
    assert code == 1 and "no adapter_config.json" in err and len(err.splitlines()) == 1
    code, err = run_cli(capsys, "export", "--adapter", str(empty), "--out", str(out))
    assert code == 2 and "--gguf" in err
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["run"]


def test_building_llama_server_without_cmake_is_one_line(tmp_path, monkeypatch):
    """No cmake (or no compiler) on PATH: one line naming it and the way around it (a
    llama-server of one's own), before anything is downloaded or built."""
    from fincheck.errors import FincheckError
    from fincheck.serve import llama_server_build

    monkeypatch.setenv("FINCHECK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(llama_server_build.shutil, "which", lambda program: None)
    monkeypatch.setattr(
        llama_server_build, "resolve_source", lambda *a, **k: pytest.fail("fetched")
    )
    with pytest.raises(FincheckError, match="needs cmake on PATH") as error:
        llama_server_build.build_llama_server(jobs=1)
    assert "\n" not in str(error.value) and "llama-server of your own" in str(error.value)
    assert not (tmp_path / "cache").exists()


def test_the_installed_command_runs_in_a_fresh_process(tmp_path):
    """The console script in a new interpreter, with nothing imported before it (in-process
    tests share modules other tests loaded: a lazily loaded library submodule passes there and
    fails here): a command that reaches the code past argument parsing exits 0."""
    import subprocess
    import sys

    script = Path(sys.executable).parent / "fincheck"
    env = {"PATH": str(Path(sys.executable).parent), "HOME": str(tmp_path)}
    env["FINCHECK_CACHE_DIR"] = str(tmp_path / "cache")
    done = subprocess.run(
        [str(script), "models", "list"], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "qwen2.5-coder-0.5b-instruct" in done.stdout


def test_loading_a_model_from_python_reads_the_hub_with_bounds(tmp_path):
    """The Python API's routes (`Detector.from_pretrained`, `from_endpoint`, the scripts) all
    import the model loader: in a fresh interpreter that import alone bounds the hub's replies
    and switches huggingface_hub's own Xet client off."""
    import subprocess
    import sys

    probe = (
        "import fincheck.detector, huggingface_hub\n"
        "from huggingface_hub import constants\n"
        "assert constants.HF_HUB_DISABLE_XET\n"
        "assert getattr(huggingface_hub.get_session(), 'bounds_hub', False)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("[" * 100_000, r"sheet\.jsonl:1: "),  # nested past the recursion limit
        ('{"summary": ' + "9" * 5000 + "}", r"sheet\.jsonl:1: "),  # past the digit limit
        ('{"summary": "\\ud800"}', r"sheet\.jsonl:1: .*lone surrogate"),
        (b'{"summary": "caf\xe9"}', r"sheet\.jsonl:1: .*not UTF-8"),
    ],
)
def test_a_judge_check_set_is_read_by_the_one_reader(tmp_path, text, said):
    """--judge-check's hand matches are read as every JSONL file is: bounded, each line's text
    checked once, a byte-order mark skipped; what cannot be read is one line at file:line."""
    from fincheck.errors import FincheckError
    from fincheck.tasks.final.judge_sanity import read_sanity_set

    sheet = tmp_path / "sheet.jsonl"
    sheet.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(FincheckError, match=said):
        read_sanity_set(sheet)
    sheet.write_bytes(b"\xef\xbb\xbf" + b'{"summary": 1}\n')  # a BOM is no part of the record
    with pytest.raises(FincheckError, match=r"sheet\.jsonl:1: summary: expected a str"):
        read_sanity_set(sheet)


def test_a_chat_template_file_is_read_as_utf8_text_without_its_bom(tiny_base, tmp_path):
    """chat_template_path saved by an editor with a byte-order mark: the template starts at its
    first character (a BOM would open every training prompt); one not in UTF-8 is one line
    naming the file and the line."""
    from fincheck.errors import FincheckError
    from fincheck.train.model import load_tokenizer
    from fincheck.train.recipe import load_recipe

    template = tmp_path / "template.jinja"
    template.write_bytes(b"\xef\xbb\xbf{% for m in messages %}{{ m['content'] }}{% endfor %}")
    config = Path(__file__).resolve().parents[1] / "configs" / "train" / "tiny-cpu.yaml"
    recipe = load_recipe(config, [f"--chat_template_path={template}", "--deepspeed="])
    assert load_tokenizer(recipe, str(tiny_base)).chat_template.startswith("{% for")
    template.write_bytes(b"{# caf\xe9 #}")
    with pytest.raises(FincheckError, match=r"template\.jinja:1: not UTF-8"):
        load_tokenizer(recipe, str(tiny_base))


def test_a_fifo_on_every_other_read_route_is_one_line_not_a_wait(tmp_path, monkeypatch):
    """The routes a second hostile round found reading around the one regular-file check: a
    resumed predictions file, eval's own records, a checkpoint's `latest`, the saved hub token
    a dry run reads. Each is one line at once (an alarm fails the test instead of hanging it);
    a record that is a FIFO is never read as "no record"."""
    import os
    import signal

    import huggingface_hub.constants

    from fincheck.errors import FincheckError
    from fincheck.eval.predictions import PredictionWriter, read_eval_config, read_eval_summary
    from fincheck.serve.publish import held_token
    from fincheck.train.resume import check_checkpoint_layout

    def waited(signum, frame):
        raise AssertionError("waited on a FIFO")

    from fincheck.data.raw_records import iter_records
    from fincheck.io.checksums import sha256_file
    from fincheck.io.safe_files import copy_file

    names = ("qasem.jsonl", "eval_config.json", "eval_summary.json", "latest", "token")
    from fincheck.io.jsonl import drop_torn_last_line
    from fincheck.serve.detect_cli import _read_text, read_inputs
    from fincheck.tasks.final.judge_sanity import read_sanity_set
    from fincheck.train.recipe import read_recipe_values

    for name in (
        *names,
        "final.jsonl",
        "weights",
        "source",
        "input.jsonl",
        "text.txt",
        "check.jsonl",
        "trace.jsonl",
        "accelerate.json",
    ):
        os.mkfifo(tmp_path / name)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "token"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    routes = {
        "qasem.jsonl": lambda: PredictionWriter(tmp_path / "qasem.jsonl", "qasem"),
        "eval_config.json": lambda: read_eval_config(tmp_path),
        "eval_summary.json": lambda: read_eval_summary(tmp_path),
        "latest": lambda: check_checkpoint_layout(tmp_path),
        "token": held_token,
        # a FINAL file, a file's digest, a file copied (each opened where it was checked)
        "final.jsonl": lambda: list(iter_records(tmp_path / "final.jsonl")),
        "weights": lambda: sha256_file(tmp_path / "weights"),
        "source": lambda: copy_file(tmp_path / "source", tmp_path / "copied"),
        # detect's input and text files and the judge-check set: a FIFO, not "not found"
        "input.jsonl": lambda: read_inputs(tmp_path / "input.jsonl"),
        "text.txt": lambda: _read_text(str(tmp_path / "text.txt")),
        "check.jsonl": lambda: read_sanity_set(tmp_path / "check.jsonl"),
        "trace.jsonl": lambda: drop_torn_last_line(tmp_path / "trace.jsonl"),  # a resumed log
        # a trainer key naming a JSON file transformers would open itself
        "accelerate.json": lambda: read_recipe_values(
            None, [f"--accelerator_config={tmp_path / 'accelerate.json'}"]
        ),
    }
    previous = signal.signal(signal.SIGALRM, waited)
    signal.alarm(30)
    try:
        for name, route in routes.items():
            with pytest.raises(FincheckError, match=f"{name}: (not a|no) regular file"):
                route()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize(
    ("record", "edit", "said"),
    [
        ("manifest.json", {"files": None}, "files is null, not an object"),
        ("manifest.json", {"files": [1]}, "files is a list, not an object"),
        ("manifest.json", {"counts": 5}, "counts is an integer, not an object"),
        ("fincheck_run.json", {"data": {"train_examples": ["q"]}}, r"data\.train_examples is a"),
        ("data_manifest.json", {"prompt_hashes": "abc"}, "prompt_hashes is a text"),
        ("adapter_config.json", {"base_model_name_or_path": 5}, "base_model_name_or_path is an"),
        ("fincheck_run.json", {"data": "x"}, "data is a text, not an object"),
        ("fincheck_run.json", {"prompt_hashes": 5}, "prompt_hashes is an integer"),
        (
            "fincheck_run.json",
            {"chat_template_kwargs": {"x": math.nan}},
            r"chat_template_kwargs\.x is nan, not a finite",
        ),
    ],
)
def test_a_record_edited_into_another_shape_is_one_line(
    small_prepared, record, edit, said, tmp_path
):
    """A prepared folder's manifest and a run's record are read for what they vouch for (the
    split files' sha256, the tasks and prompts of the run): a record edited to list none, or
    holding a value of another shape, is one line naming it, never a record that vouches for
    nothing or a traceback in the card."""
    import json
    import shutil

    from fincheck.errors import FincheckError
    from fincheck.io.runs import load_run
    from fincheck.tasks.prepared import read_manifest

    if record == "manifest.json":
        folder = tmp_path / "prepared"
        shutil.copytree(small_prepared, folder)
        read = read_manifest
    else:
        folder = tmp_path / "run"
        shutil.copytree(
            Path(__file__).parents[1] / "docs/bench/qwen2.5-0.5b-three-tasks-cpu/detector", folder
        )
        read = load_run
    path = folder / record
    path.write_text(json.dumps({**json.loads(path.read_text()), **edit}))
    with pytest.raises(FincheckError, match=f"{record}: {said}"):
        read(folder)


def test_every_line_a_command_prints_is_redacted_from_its_first(capsys):
    """The redacting streams stand before the command line is parsed, so a usage error quoting
    a token (an option misspelt) is redacted; a library's logging handler made before, holding
    the stream of its import (huggingface_hub's), prints through them; an option spelt in part
    is not taken for a longer one (`--api-key` for `--api-key-env`, with the key as a variable's
    name)."""
    import logging
    import sys

    from fincheck.io.secrets import _HELD, hold_secret, redacted_output

    token = "hf_" + "abcdefghij" * 3
    with pytest.raises(SystemExit) as usage:
        main(["publish", "--checkpoint", "c", "--repo-id", "a/b", "--hub-token", token])
    assert usage.value.code == 2
    err = capsys.readouterr().err
    assert "--hub-token …" in err and token not in err
    with pytest.raises(SystemExit):
        main(["eval", "--data", "d", "--out", "o", "--backend", "openai", "--model", "m",
              "--api-key=no-known-shape-0123456789", "--api-token", "k3y-of-no-shape"])  # fmt: skip
    err = capsys.readouterr().err
    assert "unrecognized arguments: --api-key=… (did you mean --api-key-env?) --api-token …" in err
    assert "no-known-shape" not in err and "k3y" not in err
    library = logging.getLogger("a_library_imported_before")
    handler = logging.StreamHandler(sys.stderr)  # as huggingface_hub makes its own, on import
    library.addHandler(handler)
    try:
        hold_secret("held-value-4455667788")
        with redacted_output():
            library.warning("retrying https://mirror/api?k=held-value-4455667788")
        assert handler.stream is sys.stderr  # given back as it was
    finally:
        library.removeHandler(handler)
        _HELD.discard("held-value-4455667788")
    assert "held-value" not in capsys.readouterr().err


def test_a_command_line_value_that_is_no_utf8_is_one_line(tmp_path, capsys):
    """A file name or value of bytes that are not UTF-8 (Python carries them as lone
    surrogates) is refused as the command starts, naming the argument, not written into a
    report as a traceback."""
    with pytest.raises(SystemExit) as usage:
        main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--names", "x\udcff,y"])
    assert usage.value.code == 2
    assert "argument 5 ('x\\\\udcff,y') holds bytes that are not UTF-8 text" in (
        capsys.readouterr().err
    )


def test_the_launchers_entry_point_prints_errors_as_fincheck_train_does(monkeypatch, capsys):
    """`deepspeed train/sft.py --config ...` (the multi-node route): a file system error is the
    same one line as under `fincheck train`, not a traceback on every rank."""
    from fincheck.train import sft

    def refused(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", "/readonly/run")

    monkeypatch.setattr(sft, "load_training_recipe", refused)
    assert sft.main(["--config", "recipe.yaml"]) == 1
    assert "train/sft.py: error: Permission denied: /readonly/run (not writable" in (
        capsys.readouterr().err
    )


def test_a_folder_of_the_user_s_is_refused_for_what_it_is_before_it_is_walked(tmp_path):
    """`--out ~` (a folder of the user's, holding links deep inside: a virtual environment's
    python) is refused as a folder of files fincheck did not write, at once, not after a walk
    of the whole tree that names some link found there."""
    from fincheck.errors import FincheckError
    from fincheck.io.out_lock import claim_out_dir

    home = tmp_path / "home"
    (home / "project" / ".venv" / "bin").mkdir(parents=True)
    (home / "project" / ".venv" / "bin" / "python").symlink_to("/usr/bin/python3")
    (home / "notes.txt").write_text("mine")
    with pytest.raises(FincheckError, match="holds files fincheck did not write"):
        claim_out_dir(home, "--out", "eval")


def test_a_command_terminated_as_it_starts_exits_143_in_one_line():
    """SIGTERM (or Ctrl-C) before the command itself runs, while its parser is being built:
    one line and exit 143, as later, not a traceback and exit 1."""
    import subprocess
    import sys

    script = (
        "import os, signal, sys\n"
        "from fincheck.commands import cli\n"
        "cli.check_command_line = lambda argv: os.kill(os.getpid(), signal.SIGTERM)\n"
        "sys.argv = ['fincheck', 'models', 'list']\n"
        "cli.console()\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert (proc.returncode, proc.stderr) == (143, "fincheck: terminated\n")
