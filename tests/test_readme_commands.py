"""Every command in the README and in docs/*.md works as written: each is parsed by the real
parser (or its recipe is checked: the dry form of a training launch; a script's options are
parsed by the script), so the docs cannot drift from the code."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from fincheck.commands.cli import build_parser
from fincheck.io.config import read_options

REPO = Path(__file__).resolve().parents[1]
FINCHECK = Path(sys.executable).parent / "fincheck"


def doc_commands(path: Path) -> list[str]:
    """Shell lines of a document's ```bash blocks, continuations joined, comments dropped."""
    text = path.read_text(encoding="utf-8")
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def strip_env(argv: list[str]) -> list[str]:
    while argv and re.match(r"^[A-Z_]+=", argv[0]):
        argv = argv[1:]
    return argv


COMMANDS = doc_commands(REPO / "README.md")
DOCS = sorted((REPO / "docs").glob("*.md"))
DOC_COMMANDS = [
    pytest.param(c, id=f"{p.name}: {c[:60]}")
    for p in [REPO / "README.md", *DOCS]
    for c in doc_commands(p)
]


def test_readme_starts_with_the_two_setup_commands():
    assert COMMANDS[:2] == ["make demo", "make test"]


@pytest.mark.parametrize("command", DOC_COMMANDS)
def test_doc_command_parses(command: str, monkeypatch, tmp_path):
    argv = strip_env(shlex.split(command))
    program = argv[0]
    if program == "make":
        result = subprocess.run(["make", "-n", *argv[1:]], cwd=REPO, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
    elif program == "fincheck":
        args, extra = build_parser().parse_known_args(argv[1:])  # argparse errors exit non-zero
        assert args.command, command
        if getattr(args, "options", None):  # its values are of the right type and mode
            read_options(args.options, args)
        if extra:
            assert getattr(args, "accepts_overrides", False), f"unknown options {extra}"
            check_overrides(args.command, getattr(args, "config", None), extra)
    elif program in ("deepspeed", "torchrun", "accelerate"):
        script = argv.index("train/sft.py")
        assert (REPO / "train" / "sft.py").is_file()
        if "--hostfile" in argv:
            assert (REPO / argv[argv.index("--hostfile") + 1]).is_file()
        check_train_args(argv[script + 1 :], monkeypatch)
    elif program == "sbatch":
        script = next(a for a in argv if a.endswith(".sh"))
        assert subprocess.run(["bash", "-n", str(REPO / script)]).returncode == 0
        rest = argv[argv.index(script) + 1 :]
        check_train_args(["--config", rest[0], *rest[1:]], monkeypatch)
    elif program in ("python", "python3") and argv[1].startswith("scripts/"):
        check_script_args(argv[1], argv[2:])
    elif program in ("python", "python3") and argv[1:3] == ["-m", "llama_cpp.server"]:
        # llama.cpp's server (the `llama-cpp` extra): each flag one of its settings
        settings = pytest.importorskip("llama_cpp.server.settings")
        known = {*settings.ModelSettings.model_fields, *settings.ServerSettings.model_fields}
        flags = {a[2:] for a in argv[3:] if a.startswith("--")}
        assert flags <= known, f"not llama_cpp.server flags: {sorted(flags - known)}"
    elif program == "llama-server":  # llama.cpp's C++ server: each flag in its own --help
        check_llama_server_flags([a for a in argv[1:] if a.startswith("-")])
    elif program in ("pip", "cd", "export"):
        pass  # environment set-up lines
    elif program in ("transformers", "vllm"):
        assert argv[1] == "serve", command  # the servers a detector is evaluated behind
    else:
        pytest.fail(f"documented command of an unknown kind: {command}")


def check_llama_server_flags(flags: list[str]) -> None:
    import os

    from fincheck.serve.llama_server_build import built_llama_server

    binary = os.environ.get("FINCHECK_LLAMA_SERVER") or built_llama_server()
    if not binary:
        pytest.skip("no llama-server built (python scripts/build_llama_server.py)")
    usage = subprocess.run([binary, "--help"], capture_output=True, text=True).stdout
    documented = set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", usage))
    assert set(flags) <= documented, f"not llama-server flags: {sorted(set(flags) - documented)}"


def check_overrides(command: str, config: Path | None, extra: list[str]) -> None:
    from fincheck.io.config import load_config, parse_overrides

    if command == "prepare":
        from fincheck.data_prep.prepare import PrepareConfig

        load_config(PrepareConfig, config, parse_overrides(extra))
    elif command == "train":
        from fincheck.train.recipe import read_recipe_values

        read_recipe_values(REPO / config if config else None, extra)
    else:
        pytest.fail(f"fincheck {command} got overrides {extra}")


def check_train_args(args: list[str], monkeypatch) -> None:
    from fincheck.train.launch import split_config_arg
    from fincheck.train.recipe import read_recipe_values

    monkeypatch.chdir(REPO)  # recipes name their DeepSpeed config relative to the repo
    config, overrides = split_config_arg(args)
    assert (REPO / config).is_file(), config
    read_recipe_values(config, overrides)  # checked, not built: GPU recipes on a CPU machine


def check_script_args(script: str, args: list[str]) -> None:
    """A script's options parse (its parser is built from the same settings it runs with)."""
    import importlib.util
    import sys as _sys

    path = REPO / script
    assert path.is_file(), script
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    _sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    parser = getattr(module, "build_parser", None)
    if parser is None:
        pytest.skip(f"{script} has no build_parser() to check its options")
    parser().parse_args(args)


@pytest.mark.parametrize(
    "subcommand", sorted({c.split()[1] for c in COMMANDS if c.startswith("fincheck ")})
)
def test_each_subcommand_help_runs(subcommand: str):
    result = subprocess.run([str(FINCHECK), subcommand, "--help"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "example" in result.stdout.lower()


def test_sft_help_lists_recipe_keys(capsys):
    from fincheck.train.sft import main as sft_main

    assert sft_main(["--help"]) == 0
    text = capsys.readouterr().out
    assert "--dataset_dir" in text and "--deepspeed" in text
    assert "--use_liger_kernel" in text  # TRL's own keys are recipe keys too


def test_every_test_docs_reliability_names_exists():
    """docs/reliability.md promises behaviour "held by" named tests: each must exist."""
    import re

    text = (REPO / "docs" / "reliability.md").read_text()
    current = None
    named = []
    for file, test in re.findall(r"`(test_[a-z_]+\.py)?(?:::(test_[a-z0-9_]+))?`", text):
        current = file or current
        if test:
            named.append((current, test))
        elif file:
            assert (REPO / "tests" / file).is_file(), file
    assert len(named) >= 30
    for file, test in named:
        source = (REPO / "tests" / file).read_text()
        assert f"def {test}(" in source, f"{file}::{test} named in docs/reliability.md"
