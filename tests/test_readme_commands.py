"""Every command in the README works as written: each is parsed by the real parser (or its
recipe is loaded: the dry form of a training launch), so the docs cannot drift from the code."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from fincheck.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
FINCHECK = Path(sys.executable).parent / "fincheck"


def readme_commands() -> list[str]:
    """Shell lines of the README's ```bash blocks, continuations joined, comments dropped."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
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


COMMANDS = readme_commands()


def test_readme_starts_with_the_two_setup_commands():
    assert COMMANDS[:2] == ["make demo", "make test"]


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command_parses(command: str, monkeypatch, tmp_path):
    argv = strip_env(shlex.split(command))
    program = argv[0]
    if program == "make":
        result = subprocess.run(["make", "-n", *argv[1:]], cwd=REPO, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
    elif program == "fincheck":
        args, extra = build_parser().parse_known_args(argv[1:])  # argparse errors exit non-zero
        assert args.command, command
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
    else:
        pytest.fail(f"README command of an unknown kind: {command}")


def check_overrides(command: str, config: Path | None, extra: list[str]) -> None:
    from fincheck.config import load_config, parse_overrides

    if command == "prepare":
        from fincheck.data_prep.prepare import PrepareConfig

        load_config(PrepareConfig, config, parse_overrides(extra))
    elif command == "train":
        from fincheck.train.recipe import load_recipe

        load_recipe(REPO / config if config else None, extra)
    else:
        pytest.fail(f"fincheck {command} got overrides {extra}")


def check_train_args(args: list[str], monkeypatch) -> None:
    from fincheck.train.recipe import load_recipe
    from fincheck.train.sft import split_config_arg

    monkeypatch.chdir(REPO)  # recipes name their DeepSpeed config relative to the repo
    config, overrides = split_config_arg(args)
    assert (REPO / config).is_file(), config
    load_recipe(config, overrides)


@pytest.mark.parametrize(
    "subcommand", sorted({c.split()[1] for c in COMMANDS if c.startswith("fincheck ")})
)
def test_each_subcommand_help_runs(subcommand: str):
    result = subprocess.run([str(FINCHECK), subcommand, "--help"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "example" in result.stdout.lower()


def test_sft_help_lists_recipe_keys():
    result = subprocess.run(
        [sys.executable, "train/sft.py", "--help"], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert "--dataset_dir" in result.stdout and "--deepspeed" in result.stdout
