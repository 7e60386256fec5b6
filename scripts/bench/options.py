"""A benchmark's command line: the flags of its settings dataclass (`fincheck.config`'s one
options mechanism, as every `fincheck` command), plus `--json-out`.

    parser = options_parser(TrainBenchSettings, __doc__)
    settings = settings_from_args(TrainBenchSettings, parser.parse_args(argv))
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fincheck.config import add_options, read_options

settings_from_args = read_options


def options_parser(cls: type, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_options(parser, cls)
    parser.add_argument("--json-out", type=Path, help="also write the report as JSON here")
    return parser
