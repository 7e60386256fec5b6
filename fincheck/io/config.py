"""Options and recipes: typed dataclass fields, read from YAML, `--key=value` or a command's flags.

One mechanism for every command: a stage declares a dataclass whose fields carry a default and
their help (`config_field`). A recipe (prepare, train) is YAML plus `--key=value` overrides
(`load_config`); every other command's flags are generated from its options class
(`add_options`) and read back through the same type checks (`read_options`). Unknown keys and
values of the wrong type stop with a message naming the key (and the file).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import difflib
import enum
import functools
import inspect
import math
import types
import typing
from collections.abc import Callable, Sequence
from operator import ge, gt, le, lt
from pathlib import Path
from typing import Any, TypeVar

import yaml

from fincheck.errors import FincheckError, UsageError
from fincheck.io.jsonl import _SURROGATE, read_utf8_text

T = TypeVar("T")


REQUIRED: Any = dataclasses.MISSING  # a field without a default: its flag is required


def config_field(
    default: Any,
    help: str,
    *,
    flag: str | None = None,
    parse: Callable[[str], Any] | None = None,
    applies: dict[str, tuple[Any, ...]] | list[dict[str, tuple[Any, ...]]] | None = None,
    cli: bool = True,
    positional: bool = False,
    metavar: str | None = None,
    at_least: float | None = None,
    above: float | None = None,
    at_most: float | None = None,
    below: float | None = None,
) -> Any:
    """A dataclass field with its help text (mutable defaults are copied per instance).

    For a command's flags (`add_options`): `flag` names the flag when it is not the field's
    name (`--data` for `data_dir`); `parse` reads the flag's text when YAML's reading is not
    the right one (`final=512,qasem=4`); `applies` says which other options it is read with
    (`{"backend": ("local",)}`, or a list of such settings, any of which will do): given in
    another mode it is an error, never ignored; `cli=False`
    keeps a field off the command line (set by the code, not the user); `positional` makes it
    the command's operands (`fincheck compare RUN [RUN ...]`). `at_least`, `above`, `at_most`,
    `below`: the range of a number (checked wherever the value comes from, shown in --help).
    """
    bounds = {"at_least": at_least, "above": above, "at_most": at_most, "below": below}
    metadata = {
        "help": help,
        "flag": flag,
        "parse": parse,
        "applies": applies or {},
        "cli": cli,
        "positional": positional,
        "metavar": metavar,
        "bounds": {k: v for k, v in bounds.items() if v is not None},
    }
    if isinstance(default, (list, dict, tuple)):
        return dataclasses.field(
            default_factory=functools.partial(copy.copy, default), metadata=metadata
        )
    return dataclasses.field(default=default, metadata=metadata)


def declare_bounds(cls: type, bounds: dict[str, dict[str, float]]) -> None:
    """Give fields `cls` inherits a range, as `config_field`'s at_least/above/at_most/below
    do, on `cls`'s own copies of them: the base classes' fields stay as they are."""
    for name, limits in bounds.items():
        _redeclare(cls, name, bounds=limits)


def declare_applies(cls: type, names: Sequence[str], applies: dict[str, tuple[Any, ...]]) -> None:
    """Say, for fields `cls` inherits, which setting reads them, as `config_field`'s `applies`
    does (eval's model options: `--backend local`), on `cls`'s own copies of them."""
    for name in names:
        _redeclare(cls, name, applies=applies)


def _redeclare(cls: type, name: str, **metadata: Any) -> None:
    f = copy.copy(cls.__dataclass_fields__[name])
    f.metadata = types.MappingProxyType({**f.metadata, **metadata})
    cls.__dataclass_fields__[name] = f


_BOUND_HOLDS = {"at_least": ge, "above": gt, "at_most": le, "below": lt}


def describe_bounds(f: dataclasses.Field) -> str:
    """ "at least 1", "above 0 and below 1": a field's range in words ("" when it has none)."""
    bounds = f.metadata.get("bounds") or {}
    return " and ".join(
        f"{k.replace('_', ' ')} {v if isinstance(v, int) else f'{v:g}'}" for k, v in bounds.items()
    )


def check_bounds(value: Any, f: dataclasses.Field, key: str) -> Any:
    """`value` when it lies in the field's range (None passes: an optional field's "unset")."""
    bounds = f.metadata.get("bounds") or {}
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if not all(_BOUND_HOLDS[k](value, b) for k, b in bounds.items()):
        raise UsageError(f"{key}: must be {describe_bounds(f)}, got {value!r}")  # exit 2
    return value


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
        keys, values = args or (Any, Any)  # each entry checked as a field of its type is
        return {coerce(k, keys, key): coerce(v, values, f"{key}.{k}") for k, v in value.items()}
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
        with contextlib.suppress(ValueError):  # "1.5", "ten"
            if isinstance(value, (int, str)) and not isinstance(value, bool):
                return int(value)
        raise FincheckError(f"{key}: expected an integer, got {value!r}")
    if annotation is float:
        number = None
        with contextlib.suppress(TypeError, ValueError, OverflowError):  # a list, "ten", 10**400
            if not isinstance(value, bool):
                number = float(value)
        if number is None or not math.isfinite(number):  # nan, inf: no option means them
            raise UsageError(f"{key}: expected a finite number, got {value!r}")
        return number
    if annotation is Path:
        if not isinstance(value, (str, Path)):
            raise FincheckError(f"{key}: expected a path, got {value!r}")
        if not str(value).strip():  # Path("") is the current folder: never what was meant
            raise FincheckError(f"{key}: expected a path, got an empty string")
        return Path(value)
    if annotation is str:
        if isinstance(value, (dict, list)):
            raise FincheckError(f"{key}: expected a string, got {value!r}")
        return str(value)
    return value


def _unknown_key_error(cls: type, key: str, where: str, listing: str) -> FincheckError:
    names = list(field_types(cls))
    close = difflib.get_close_matches(key, names, n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    return FincheckError(
        f"{where}: unknown key {key!r} for {cls.__name__}.{hint} "
        + (listing or f"Valid keys: {', '.join(sorted(names))}.")
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


def _refused(problem: str, mark: Any) -> yaml.MarkedYAMLError:
    """A recipe refused at `mark`: read_yaml_mapping makes it `file:line: not valid YAML: ...`."""
    return yaml.constructor.ConstructorError(None, None, problem, mark)


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key given twice in one mapping is an error (PyYAML
    keeps the last silently, so a recipe's first `learning_rate:` would be ignored), and so is
    an alias (`*name`): no recipe needs one, and aliases of aliases make a few lines expand to
    billions of values (a "billion laughs") that every walk over the recipe would visit."""

    MAX_DEPTH = 64  # nesting; no recipe needs more than 3, and deeper would exhaust the stack

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _refused(f"aliases (*{event.anchor}) are not accepted here", event.start_mark)
        self._depth = getattr(self, "_depth", 0) + 1
        try:
            if self._depth > self.MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise _refused(f"nested deeper than {self.MAX_DEPTH} levels", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_yaml_int(self, node):
        try:
            return super().construct_yaml_int(node)
        except ValueError as e:  # past Python's integer digit limit (4,300 digits)
            said = " ".join(str(e).split())[:80]
            raise _refused(f"an integer that cannot be read ({said})", node.start_mark) from None

    def construct_scalar(self, node):
        value = super().construct_scalar(node)
        if isinstance(value, str) and _SURROGATE.search(value):  # an escape such as "\ud800"
            raise _refused("a string holding a lone surrogate escape", node.start_mark)
        return value

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line, mark = key_node.start_mark.line + 1, key_node.start_mark
            if not isinstance(key, str):  # a list, a mapping, a date or null as a key
                raise _refused(f"the key on line {line} is not a name ({type(key).__name__})", mark)
            if key in seen:
                raise _refused(
                    f"key {key!r} on line {line} was already given on line {seen[key]}", mark
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)

    def construct_undefined(self, node):
        tag = node.tag.replace("tag:yaml.org,2002:", "!!")
        raise _refused(
            f"the tag {tag} is not accepted here (only text, numbers, true/false, null, lists "
            "and mappings)",
            node.start_mark,
        )


# An allow-list of what a config may hold: text, numbers, true/false, null, lists and mappings.
# Every other tag (`!!binary`, `!!set`, `!!omap`, `!!timestamp`, ...) is refused with its line,
# where the safe loader would hand on bytes, sets or dates that a str() later turns into other
# text; a plain `2024-01-01` or `=` stays the text it is written as.
_YAML_TAGS = {
    f"tag:yaml.org,2002:{t}" for t in ("null", "bool", "int", "float", "str", "seq", "map")
}
_UniqueKeyLoader.yaml_constructors = {
    tag: construct
    for tag, construct in yaml.SafeLoader.yaml_constructors.items()
    if tag in _YAML_TAGS
}
_UniqueKeyLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag in _YAML_TAGS]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _UniqueKeyLoader.construct_yaml_int)
_UniqueKeyLoader.add_constructor(None, _UniqueKeyLoader.construct_undefined)


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """A YAML file whose top level is a mapping (empty file = {}), or a one-line error."""
    path = Path(path)
    try:
        loaded = yaml.load(read_utf8_text(path), Loader=_UniqueKeyLoader) or {}
    except yaml.MarkedYAMLError as e:  # `file:line: problem`, as every file error here
        mark = e.problem_mark or e.context_mark
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        said = " ".join(filter(None, (e.context, e.problem)))
        raise FincheckError(f"{where}: not valid YAML: {said}") from None
    except RecursionError:  # a flow collection nested past the stack, before composing
        raise FincheckError(f"{path}: not valid YAML: nested deeper than can be read") from None
    except yaml.YAMLError as e:
        raise FincheckError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
    if not isinstance(loaded, dict):
        raise FincheckError(f"{path}: the top level must be a mapping of key: value")
    return loaded


def config_values(
    cls: type,
    path: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    listing: str = "",
) -> dict[str, Any]:
    """The keys the YAML at `path` and then `overrides` (strings or values) set, each checked
    against its field's type; an unknown key is an error with the closest names (`listing`
    replaces the list of valid keys, for a class with many)."""
    types_ = field_types(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise FincheckError(f"config file not found: {path}")
        for key, value in read_yaml_mapping(path).items():
            if key not in types_:
                raise _unknown_key_error(cls, key, str(path), listing)
            where = f"{path}: {key}"
            values[key] = check_bounds(coerce(value, types_[key], where), fields[key], where)
    for key, value in (overrides or {}).items():
        if key not in types_:
            raise _unknown_key_error(cls, key, "command line", listing)
        if isinstance(value, str):
            value = text_value(value, types_[key])
        values[key] = check_bounds(coerce(value, types_[key], f"--{key}"), fields[key], f"--{key}")
    return values


def config_defaults(cls: type) -> dict[str, Any]:
    """Every field's default (fields without one are left out)."""
    defaults = {f.name: _field_default(f) for f in dataclasses.fields(cls) if f.init}
    return {k: v for k, v in defaults.items() if v is not REQUIRED}


def load_config(
    cls: type[T], path: str | Path | None = None, overrides: dict[str, Any] | None = None
) -> T:
    """Build `cls` from its defaults, then the YAML at `path`, then `overrides` (strings or values)."""
    return build_config(cls, config_values(cls, path, overrides))


def build_config(cls: type[T], values: dict[str, Any]) -> T:
    """`cls(**values)`, with what its checks raise as one line naming the class."""
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
        default = _field_default(f)
        default = "required" if default is REQUIRED else default
        type_name = getattr(types_[f.name], "__name__", None) or str(types_[f.name]).replace(
            "typing.", ""
        )
        bounds = f" ({describe_bounds(f)})" if describe_bounds(f) else ""
        lines.append(
            f"  --{f.name}  ({type_name}, default {default!r})\n      "
            f"{f.metadata.get('help', '')}{bounds}"
        )
    return "\n".join(lines)


def override_value(text: str) -> Any:
    """A `--key=value` string as YAML would read it (lists, mappings), except that only
    true/false are booleans: YAML 1.1 reads `no`, `off`, `yes`, `on` as booleans, and
    `--save_strategy=no` means the string "no". An empty value is None; text YAML cannot read
    stays text (the field's type check then names the key)."""
    if text == "":
        return None
    try:
        value = yaml.load(text, Loader=_UniqueKeyLoader)  # no aliases here either
    except (yaml.YAMLError, RecursionError):
        return text
    if isinstance(value, bool) and text.strip().lower() not in ("true", "false"):
        return text
    return value


def text_value(text: str, annotation: Any) -> Any:
    """A `--key=value` (or flag) text for a field of this type, before its type check: numbers
    stay text for int()/float() (YAML would read `010` as 8 and `1:30` as 90), a list is split
    on commas (or read as YAML's `[a, b]`), mappings and mixed types are read as YAML, and ""
    or null is None for an optional field ("" is an error for a path: never the current
    folder, nor stdout in place of a file)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    unset = ("null",) if args == [Path] else ("", "null")  # `--out ""` is no path, not "unset"
    if union and len(args) < len(typing.get_args(annotation)) and text.strip() in unset:
        return None
    plain = args[0] if union and len(args) == 1 else annotation
    origin = typing.get_origin(plain) or plain
    if origin in (list, tuple):
        return override_value(text) if text.lstrip().startswith("[") else text
    if origin is dict or plain is Any or (union and len(args) > 1):
        return override_value(text)
    return text


def flag_name(f: dataclasses.Field) -> str:
    """`--batch-size` for the field `batch_size` (or its own `flag`); `--no-progress` for a
    switch that turns off a field defaulting to true."""
    name = (f.metadata.get("flag") or f.name).replace("_", "-")
    if f.metadata.get("positional"):
        return name.upper()  # an operand: named as the usage line names it
    return f"--no-{name}" if f.default is True else f"--{name}"


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return REQUIRED


def _shown(value: Any) -> str:
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items()) or "none"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return "none" if value is None else str(plain_value(value))


def _choices(annotation: Any) -> tuple[Any, ...] | None:
    """A Literal's values (an optional one's too): argparse lists them and checks them."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        annotation = args[0] if len(args) == 1 else annotation
    return typing.get_args(annotation) if typing.get_origin(annotation) is typing.Literal else None


def add_options(parser: argparse.ArgumentParser, cls: type) -> None:
    """One flag per field of `cls`, with its help and default: `--batch-size` for `batch_size`;
    a boolean is a switch (`--trust-remote-code`, or
    `--no-progress` for one that defaults to true); a field without a default is a required
    flag. The fields each base class declares are grouped under its docstring's first line.
    Values stay text here: `read_options` checks them as a recipe's values are checked."""
    types_ = field_types(cls)
    owners = [c for c in cls.__mro__ if dataclasses.is_dataclass(c)]
    for owner in [owners[-1], *owners[:-1]]:  # the root first
        own = inspect.get_annotations(owner)
        doc = (owner.__doc__ or "").strip()
        group = parser  # `cls` itself, or a base with no docstring (dataclass writes one)
        if owner is not cls and not doc.startswith(owner.__name__):
            group = parser.add_argument_group(doc.splitlines()[0].rstrip("."))
        for f in dataclasses.fields(cls):
            if f.name in own and f.init and f.metadata.get("cli", True):
                _add_flag(group, f, types_[f.name], cls)


def _conditions(f: dataclasses.Field) -> list[dict[str, tuple[Any, ...]]]:
    """A field's `applies`: the settings under which it is read (any one of them)."""
    applies = f.metadata.get("applies") or []
    return [applies] if isinstance(applies, dict) else list(applies)


def _describe_conditions(f: dataclasses.Field, cls: type, joiner: str) -> str:
    fields = cls.__dataclass_fields__
    return ", or with ".join(
        " and ".join(
            f"{flag_name(fields[key])} {joiner.join(str(v) for v in allowed)}"
            for key, allowed in condition.items()
        )
        for condition in _conditions(f)
    )


def _add_flag(parser: Any, f: dataclasses.Field, annotation: Any, cls: type) -> None:
    name, default, choices = flag_name(f), _field_default(f), _choices(annotation)
    text = f.metadata.get("help", "")
    if f.metadata.get("positional"):
        many = typing.get_origin(annotation) in (list, tuple)
        required = default is REQUIRED
        # an optional single operand that is not given stays out of the namespace, as a flag
        # does (its choices are then checked by read_options: argparse would check the default)
        single = {"nargs": None} if required else {"nargs": "?", "default": argparse.SUPPRESS}
        if choices:
            text += f" ({', '.join(map(str, choices))})"
        parser.add_argument(
            f.name,
            **({"nargs": "+" if required else "*"} if many else single),
            choices=choices if required else None,
            metavar=name,
            help=text.replace("%", "%%"),
        )
        return
    if _conditions(f):
        text += f" [with {_describe_conditions(f, cls, '/')}]"
    if bounds := describe_bounds(f):
        text += f" ({bounds})"
    if annotation is bool:
        action = {"action": "store_const", "const": "false" if default is True else "true"}
    else:
        if default not in (REQUIRED, None) and "(default" not in text:
            text += f" (default: {_shown(default)})"
        metavar = f.metadata.get("metavar") or name.split("-")[-1].upper()
        action = {"choices": choices, "metavar": None if choices else metavar}
        if _is_per_task(annotation):
            action["action"] = _JoinRepeats
    parser.add_argument(
        name,
        dest=f.name,
        default=argparse.SUPPRESS,
        required=default is REQUIRED,
        help=text.replace("%", "%%"),
        **action,
    )


def _is_per_task(annotation: Any) -> bool:
    """A `task=value,...` option: its type holds a dict."""
    return dict in {typing.get_origin(a) or a for a in (annotation, *typing.get_args(annotation))}


class _JoinRepeats(argparse.Action):
    """A per-task option given twice (`--threshold qasem=0.6 --threshold final=0.7`) reads as one
    comma list, where argparse would keep the last alone and drop the others without a word; a
    task named twice is then refused as in one list."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None):
        before = getattr(namespace, self.dest, None)
        setattr(namespace, self.dest, f"{before},{values}" if before else values)


def read_options(cls: type[T], args: argparse.Namespace) -> T:
    """The options a command's flags name (`add_options`), checked like a recipe's keys: a
    value of the wrong type, or an option the chosen mode does not read, is an error naming
    the flag (a `UsageError`: exit 2, as argparse's own)."""
    types_ = field_types(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in vars(args) or not f.metadata.get("cli", True):
            continue
        raw, key, parse = getattr(args, f.name), flag_name(f), f.metadata.get("parse")
        try:
            if isinstance(raw, list):  # a positional's operands
                value = [parse(r) if parse else r for r in raw]
            else:
                value = parse(raw) if parse else text_value(raw, types_[f.name])
            values[f.name] = check_bounds(coerce(value, types_[f.name], key), f, key)
        except (ValueError, FincheckError) as e:
            message = str(e) if str(e).startswith(key) else f"{key}: {e}"
            raise UsageError(message) from None
    options = build_config(cls, values)
    for f in map(cls.__dataclass_fields__.get, values):  # the options given
        conditions = _conditions(f)
        if conditions and not any(
            all(getattr(options, key) in allowed for key, allowed in condition.items())
            for condition in conditions
        ):
            chosen = ", ".join(
                f"{flag_name(cls.__dataclass_fields__[key])} {getattr(options, key)}"
                for key in dict.fromkeys(k for c in conditions for k in c)
            )
            raise UsageError(
                f"{flag_name(f)}: read only with {_describe_conditions(f, cls, ' or ')}, not "
                f"{chosen}; leave it out"
            )
    return options


def close_flags(parser: argparse.ArgumentParser, unknown: list[str]) -> str:
    """'--bach-size (did you mean --batch-size?)' for each unknown flag: argparse only lists them.
    An unknown flag's value is not repeated ('--api-key=…'): it may be a key of no known shape."""
    known = [s for s in parser._option_string_actions if s.startswith("--")]
    out = []
    after_flag = False
    for arg in unknown:
        flag, has_value, _ = arg.partition("=")
        if after_flag and not arg.startswith("-"):
            out[-1] = out[-1].replace(" (", " … (", 1) if " (" in out[-1] else f"{out[-1]} …"
            after_flag = False
            continue
        shown = f"{flag}=…" if has_value and flag.startswith("-") else arg
        close = difflib.get_close_matches(flag, known, n=1) if flag.startswith("--") else []
        out.append(f"{shown} (did you mean {close[0]}?)" if close else shown)
        after_flag = flag.startswith("-") and not has_value
    return " ".join(out)
