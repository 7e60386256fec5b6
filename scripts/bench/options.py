"""A benchmark's command line: the flags of its settings dataclass (`fincheck.io.config`'s one
options mechanism, as every `fincheck` command), plus `--json-out`.

    parser = options_parser(TrainBenchSettings, __doc__)
    settings = settings_from_args(TrainBenchSettings, parser.parse_args(argv))
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fincheck.errors import FincheckError
from fincheck.io.config import add_options, read_options


def settings_from_args(cls: type, args: argparse.Namespace) -> Any:
    """The settings the flags name; a bad value is one line and exit 2, as argparse's own."""
    try:
        return read_options(cls, args)
    except FincheckError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def options_parser(cls: type, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_options(parser, cls)
    parser.add_argument("--json-out", type=Path, help="also write the report as JSON here")
    return parser


@dataclass(frozen=True)
class Bench:
    """One benchmark: its settings, what it measures (shown in --help), how it runs, and its
    report as text with whether its checks passed."""

    settings: type
    doc: str
    run: Callable[[Any], Any]
    text: Callable[[Any], tuple[str, bool]]

    def parser(self, script_doc: str) -> argparse.ArgumentParser:
        return options_parser(self.settings, script_doc + "\n" + self.doc)

    def main(self, script: str, script_doc: str, argv: list[str] | None = None) -> int:
        """Parse, run, print the report (and write it with --json-out); exit 1 when one of its
        checks failed."""
        argv = sys.argv[1:] if argv is None else argv
        args = self.parser(script_doc).parse_args(argv)
        settings = settings_from_args(self.settings, args)
        try:
            report = self.run(settings)
        except ValueError as e:
            raise SystemExit(str(e)) from None
        text, ok = self.text(report)
        print("\n" + text)
        if args.json_out:
            command = " ".join([script, *argv])
            args.json_out.parent.mkdir(parents=True, exist_ok=True)
            report_json = json.dumps(report.to_json(command), indent=2, default=str)
            args.json_out.write_text(report_json + "\n")
            print(f"wrote {args.json_out}")
        return 0 if ok else 1
