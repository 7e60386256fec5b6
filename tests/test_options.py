"""The one options mechanism: a command's flags generated from its options dataclass, read back
with the recipes' type checks."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import pytest

from fincheck.errors import UsageError
from fincheck.io.config import REQUIRED, add_options, config_field, load_config, read_options


@dataclass
class Options:
    data_dir: Path = config_field(REQUIRED, "input folder", flag="data")
    runs: list[Path] = config_field([], "operands", positional=True)
    batch_size: int = config_field(8, "rows per batch")
    names: list[str] | None = config_field(None, "comma list")
    progress: bool = config_field(True, "no bars")
    trust_remote_code: bool = config_field(False, "run their code")
    mode: str = config_field("fast", "fast or slow")
    depth: int | None = config_field(None, "slow mode's depth", applies={"mode": ("slow",)})


def parse(argv: list[str]) -> Options:
    parser = argparse.ArgumentParser(prog="x")
    add_options(parser, Options)
    return read_options(Options, parser.parse_args(argv))


def test_flags_take_the_fields_types_and_defaults():
    got = parse(["--data", "d", "r1", "r2", "--batch-size", "3", "--names", "a,b", "--no-progress"])
    assert got == Options(
        data_dir=Path("d"), runs=[Path("r1"), Path("r2")], batch_size=3, names=["a", "b"],
        progress=False,
    )  # fmt: skip
    assert parse(
        ["--data", "d", "--trust-remote-code", "--batch", "4"]
    ).trust_remote_code  # a prefix
    # numbers as int() reads them (YAML would read 010 as 8 and 1:30 as 90), words as words
    assert parse(["--data", "d", "--batch-size", "010"]).batch_size == 10
    assert parse(["--data", "d", "--names", "2024,base #1"]).names == ["2024", "base #1"]
    # what a flag leaves out keeps the default, as a YAML recipe without the key would
    assert parse(["--data", "d"]) == load_config(Options, None, {"data_dir": "d"})


def test_a_flag_value_of_the_wrong_type_names_the_flag():
    for bad in ("many", "1:30", "{"):
        with pytest.raises(UsageError, match=rf"--batch-size: expected an integer, got '{bad}'"):
            parse(["--data", "d", "--batch-size", bad])
    with pytest.raises(SystemExit):  # required, as argparse says
        parse([])


def test_an_option_of_another_mode_is_an_error_and_named_in_help(capsys):
    assert parse(["--data", "d", "--mode", "slow", "--depth", "3"]).depth == 3
    with pytest.raises(UsageError, match=r"--depth: read only with --mode slow, not --mode fast"):
        parse(["--data", "d", "--depth", "3"])
    parser = argparse.ArgumentParser(prog="x")
    add_options(parser, Options)
    text = " ".join(parser.format_help().split())
    assert "slow mode's depth [with --mode slow]" in text
    assert "rows per batch (default: 8)" in text


def test_a_misspelt_command_flag_names_the_closest(capsys):
    from fincheck.commands.cli import main

    with pytest.raises(SystemExit):
        main(["score", "--data", "d", "--predictions", "p", "--out", "o", "--judge-modle", "m"])
    assert "--judge-modle … (did you mean --judge-model?)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["baseline", "--method", "e2e", "--model", "m", "--backend", "openai", "--timeout", "-5"],
         "--timeout: must be above 0, got -5.0"),
        (["baseline", "--method", "e2e", "--model", "m", "--backend", "openai", "--timeout", "nan"],
         "--timeout: expected a finite number, got 'nan'"),
        (["baseline", "--method", "e2e", "--model", "m", "--backend", "openai", "--max-retries",
          "-1"], "--max-retries: must be at least 0, got -1"),
        (["eval", "--model", "m", "--batch-size", "0", "--no-prefix-reuse"],
         "--batch-size: must be at least 1, got 0"),
        (["score", "--predictions", "p", "--bootstrap", "-3"],
         "--bootstrap: must be at least 0, got -3"),
    ],
)  # fmt: skip
def test_a_number_out_of_its_range_is_a_usage_error_naming_the_flag(argv, said, tmp_path, capsys):
    """Values are range-checked where they are declared, for every command alike: a negative
    timeout, a NaN, a batch of 0 stop before anything runs (exit 2, one line)."""
    from fincheck.commands.cli import main

    small = Path(__file__).parent / "assets" / "prepared"
    assert main([*argv, "--data", str(small), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_the_range_is_shown_in_help(capsys):
    from fincheck.commands.cli import main

    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    assert "(at least 1)" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize(("flag", "value"), [("--concurrency", "0"), ("--window", "0")])
def test_a_baseline_s_counts_are_range_checked(flag, value, tmp_path, capsys):
    """No examples in flight, or a window of no tokens, is a usage error naming the flag, not
    a run that hangs or trims every prompt away."""
    from fincheck.commands.cli import main

    small = Path(__file__).parent / "assets" / "prepared"
    argv = ["baseline", "--method", "e2e", "--model", "m", "--data", str(small), "--out",
            str(tmp_path / "out"), flag, value]  # fmt: skip
    assert main(argv) == 2
    assert f"{flag}: must be at least 1, got 0" in capsys.readouterr().err


def test_a_loaded_models_flags_mean_the_same_in_eval_and_detect():
    """One options block for a model loaded here: `--max-new-tokens final=64` is read alike by
    `fincheck eval` and `fincheck detect`, and every shared flag has one help and one default."""
    import dataclasses

    from fincheck.eval.options import EvalOptions
    from fincheck.model_options import ModelOptions
    from fincheck.serve.commands import DetectOptions

    shared = {f.name for f in dataclasses.fields(ModelOptions)}
    assert shared >= {"batch_size", "max_new_tokens", "max_input_tokens", "window", "dtype"}
    for name in shared:
        ours = {f.name: f for f in dataclasses.fields(EvalOptions)}[name]
        theirs = {f.name: f for f in dataclasses.fields(DetectOptions)}[name]
        assert ours.metadata["help"] == theirs.metadata["help"], name
        assert ours.metadata["parse"] is theirs.metadata["parse"], name
    parsers = {}
    for command, cls in (("eval", EvalOptions), ("detect", DetectOptions)):
        parsers[command] = argparse.ArgumentParser(prog=command)
        add_options(parsers[command], cls)
    ev = read_options(EvalOptions, parsers["eval"].parse_args(
        ["--data", "d", "--out", "o", "--max-new-tokens", "final=64,fhsumbench=32"]))  # fmt: skip
    de = read_options(DetectOptions, parsers["detect"].parse_args(
        ["--adapter", "a", "--max-new-tokens", "final=64,fhsumbench=32"]))  # fmt: skip
    assert ev.max_new_tokens == de.max_new_tokens == {"final": 64, "fhsumbench": 32}
