"""Command-line options generated from a benchmark's settings dataclass, so each option is
declared once (as a field with its default and help) and the scripts stay thin.

    parser = options_parser(TrainBenchSettings, __doc__)
    settings = settings_from_args(TrainBenchSettings, parser.parse_args(argv))
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def _base_type(annotation: Any) -> Any:
    """`int | None` -> int; `list[str] | None` -> list."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        annotation = args[0]
    return typing.get_origin(annotation) or annotation


def options_parser(cls: type, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        flags = ["--" + f.name.replace("_", "-")]
        if "_" in f.name:
            flags.append("--" + f.name)  # both spellings, as `fincheck` recipe overrides use _
        kind = _base_type(hints[f.name])
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        shown = ",".join(default) if isinstance(default, list) else default
        text = f.metadata.get("help", "")
        if kind is bool:
            parser.add_argument(*flags, action="store_true", help=text)
            continue
        convert = {list: str, Path: Path}.get(kind, kind)
        parser.add_argument(
            *flags,
            dest=f.name,
            type=convert,
            default=None,
            help=f"{text} (default: {shown})".replace("%", "%%"),
        )
    parser.add_argument("--json-out", type=Path, help="also write the report as JSON here")
    return parser


def settings_from_args(cls: type[T], args: argparse.Namespace) -> T:
    """The settings the options name; options not given keep the dataclass defaults."""
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        value = getattr(args, f.name)
        if value is None:
            continue
        if _base_type(hints[f.name]) is list and isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        values[f.name] = value
    return cls(**values)
