"""YAML recipes whose keys are typed dataclass fields, with `--key=value` overrides.

One mechanism for every stage: a stage declares a dataclass whose fields carry a default and
`metadata={"help": ...}`; a YAML file sets some of them; `--key=value` on the command line wins.
Unknown keys and values of the wrong type stop with a message naming the key and the file.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from fincheck.errors import FincheckError

T = TypeVar("T")


def config_field(default: Any, help: str, **kwargs: Any) -> Any:
    """A dataclass field with its help text (mutable defaults are copied per instance)."""
    if isinstance(default, (list, dict, tuple)):
        value = default
        return dataclasses.field(
            default_factory=lambda: _copy(value), metadata={"help": help}, **kwargs
        )
    return dataclasses.field(default=default, metadata={"help": help}, **kwargs)


def _copy(value: Any) -> Any:
    return type(value)(value) if not isinstance(value, dict) else dict(value)


def field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


def coerce(value: Any, annotation: Any, key: str) -> Any:
    """Check (and gently convert) a YAML value against a field's type annotation."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(value, arg, key)
            except FincheckError as e:
                errors.append(str(e))
        raise FincheckError(errors[0] if errors else f"{key}: cannot be null")
    if origin is typing.Literal:
        if value not in args:
            raise FincheckError(f"{key}: {value!r} is not one of {list(args)}")
        return value
    if origin in (list, tuple):
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise FincheckError(f"{key}: expected a list, got {value!r}")
        inner = args[0] if args else Any
        items = [coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise FincheckError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        try:
            return annotation(value)
        except ValueError:
            raise FincheckError(
                f"{key}: {value!r} not in {[m.value for m in annotation]}"
            ) from None
    if annotation is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise FincheckError(f"{key}: expected true/false, got {value!r}")
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise FincheckError(f"{key}: expected an integer, got {value!r}")
        try:
            return int(value)
        except ValueError:
            raise FincheckError(f"{key}: expected an integer, got {value!r}") from None
    if annotation is float:
        if isinstance(value, bool):
            raise FincheckError(f"{key}: expected a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise FincheckError(f"{key}: expected a number, got {value!r}") from None
    if annotation is str:
        if isinstance(value, (dict, list)):
            raise FincheckError(f"{key}: expected a string, got {value!r}")
        return str(value)
    return value


def _unknown_key_error(cls: type, key: str, where: str) -> FincheckError:
    names = list(field_types(cls))
    close = difflib.get_close_matches(key, names, n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    return FincheckError(
        f"{where}: unknown key {key!r} for {cls.__name__}.{hint} "
        f"Valid keys: {', '.join(sorted(names))}."
    )


def parse_overrides(args: list[str]) -> dict[str, str]:
    """`--key=value` / `--key value` pairs -> {key: raw string}."""
    out: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--"):
            raise FincheckError(f"expected --key=value, got {arg!r}")
        body = arg[2:]
        if "=" in body:
            key, value = body.split("=", 1)
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            key, value = body, args[i + 1]
            i += 1
        else:
            key, value = body, "true"
        out[key.replace("-", "_")] = value
        i += 1
    return out


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """A YAML file whose top level is a mapping (empty file = {}), or a one-line error."""
    path = Path(path)
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise FincheckError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(loaded, dict):
        raise FincheckError(f"{path}: the top level must be a mapping of key: value")
    return loaded


def load_config(
    cls: type[T], path: str | Path | None = None, overrides: dict[str, Any] | None = None
) -> T:
    """Build `cls` from its defaults, then the YAML at `path`, then `overrides` (strings or values)."""
    types_ = field_types(cls)
    values: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise FincheckError(f"config file not found: {path}")
        loaded = read_yaml_mapping(path)
        for key, value in loaded.items():
            if key not in types_:
                raise _unknown_key_error(cls, key, str(path))
            values[key] = coerce(value, types_[key], f"{path}: {key}")
    for key, value in (overrides or {}).items():
        if key not in types_:
            raise _unknown_key_error(cls, key, "command line")
        if isinstance(value, str) and types_[key] is not str:
            value = override_value(value)
        values[key] = coerce(value, types_[key], f"--{key}")
    try:
        return cls(**values)
    except (TypeError, ValueError) as e:
        raise FincheckError(f"{cls.__name__}: {e}") from None


def plain_value(value: Any) -> Any:
    """A JSON/YAML-ready value: tuples as lists, enums as their values, paths as strings."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [plain_value(x) for x in value]
    if isinstance(value, dict):
        return {k: plain_value(x) for k, x in value.items()}
    if isinstance(value, Path):
        return str(value)
    return value


def config_to_dict(config: Any) -> dict[str, Any]:
    """A JSON-ready view of a config (tuples as lists, enums as values)."""
    return {f.name: plain_value(getattr(config, f.name)) for f in dataclasses.fields(config)}


def describe_config(cls: type) -> str:
    """`key (type, default X): help` lines for --help."""
    lines = []
    types_ = field_types(cls)
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = "required"
        type_name = getattr(types_[f.name], "__name__", None) or str(types_[f.name]).replace(
            "typing.", ""
        )
        lines.append(
            f"  --{f.name}  ({type_name}, default {default!r})\n      {f.metadata.get('help', '')}"
        )
    return "\n".join(lines)


def override_value(text: str) -> Any:
    """A `--key=value` string as YAML would read it (numbers, lists, booleans), except that only
    true/false are booleans: YAML 1.1 reads `no`, `off`, `yes`, `on` as booleans, and
    `--save_strategy=no` means the string "no". An empty value is None."""
    if text == "":
        return None
    value = yaml.safe_load(text)
    if isinstance(value, bool) and text.strip().lower() not in ("true", "false"):
        return text
    return value
