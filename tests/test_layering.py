"""One-way stairs: core (`fincheck/`) <- stages (data_prep, train, eval, serve) <- commands
(the CLI, each stage's `commands.py`, the benchmarks and scripts); inside the core, the ranked
floors of `FLOORS` (and eval's of `EVAL_FLOORS`), and no import circle at all. Read from the source of every non-test
module: each import, at the top or inside a function, type-only ones too, in every spelling
(`import a.b`, `from a import b` where b is a module, relative imports, and
`importlib.import_module` of a constant string)."""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable, Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {  # folder -> the package it installs as (pyproject.toml's package-dir)
    "fincheck": "fincheck",
    "data_prep": "fincheck.data_prep",
    "train": "fincheck.train",
    "eval": "fincheck.eval",
    "serve": "fincheck.serve",
    "scripts/bench": "bench",  # not installed: on the path of scripts and tests
}
STAGES = ("data_prep", "train", "eval", "serve")
COMMAND_MODULES = ("fincheck.commands.cli", "fincheck.commands.models", "fincheck.serve.detect_cli")

# Arrows still pointing up, each with why. The test fails when one is added and when one is
# fixed (then delete its line), so this list only shrinks.
KNOWN: dict[tuple[str, str], str] = {}

# The core's floors, lowest first, each a folder or a module directly under fincheck/: a core
# module imports modules of its own floor or lower ones only, and never in a circle.
FLOOR_ORDER = "errors < io < metrics < data < inference < models < tasks < model_options < detector"
FLOORS = FLOOR_ORDER.split(" < ")
# Inside eval/: the papers' methods (baselines/) below the rest, which may use them: the loop
# (runner.py), its two answerers (generate.py: the detector, baseline.py: a paper's method),
# scoring and reporting.
EVAL_FLOORS = ("fincheck.eval.baselines", "fincheck.eval")


def module_name(path: Path) -> str:
    relative = path.relative_to(REPO)
    for folder, package in sorted(PACKAGES.items(), key=lambda kv: -len(kv[0])):
        if relative.parts[: len(Path(folder).parts)] == Path(folder).parts:
            rest = relative.parts[len(Path(folder).parts) :]
            parts = [p for p in (*rest[:-1], Path(rest[-1]).stem) if p != "__init__"]
            return ".".join([package, *parts])
    return "scripts." + relative.stem  # scripts/*.py: commands


def layer(module: str) -> tuple[int, str]:
    """(rank, name): 0 core, 1 a stage (each its own), 2 commands."""
    if (
        module.startswith("scripts.")
        or module.split(".")[0] == "bench"
        or module in COMMAND_MODULES
    ):
        return 2, "commands"
    if module.endswith(".commands"):
        return 2, "commands"
    for stage in STAGES:
        if module == f"fincheck.{stage}" or module.startswith(f"fincheck.{stage}."):
            return 1, stage
    return 0, "core"


def modules() -> list[Path]:
    paths = [*REPO.glob("scripts/*.py")]
    for folder in PACKAGES:
        paths += (REPO / folder).rglob("*.py")
    return sorted(paths)


def _package_of(here: str, is_package: bool) -> str:
    return here if is_package else here.rpartition(".")[0]


def _relative(name: str | None, level: int, package: str) -> str:
    """The absolute name of a relative import (`from ..x import y`, level 2) made in `package`."""
    base = package.split(".")
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join([*base, *([name] if name else [])])


def imports_of(source: str, here: str, known: Iterable[str], is_package: bool = False) -> set[str]:
    """The fincheck modules the module `here` imports, read from its source. `from a import b`
    counts a.b when that is a module (`known`), else a; a relative import is resolved against
    `here`'s package; `importlib.import_module("...")` (or a bare `import_module`) counts a
    constant string (relative ones against a constant `package=`)."""
    known = set(known)
    package = _package_of(here, is_package)
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = _relative(node.module, node.level, package) if node.level else node.module
            for alias in node.names:
                found.add(sub if (sub := f"{module}.{alias.name}") in known else module)
        elif isinstance(node, ast.Call) and _is_import_module(node.func) and node.args:
            name = node.args[0]
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                found.add(_import_module_target(name.value, node.keywords))
    ours = ("fincheck", "bench")  # the installed package, and the benchmarks beside it
    return {name for name in found if name in ours or name.startswith(tuple(f"{o}." for o in ours))}


def _is_import_module(func: ast.expr) -> bool:
    return (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
        isinstance(func, ast.Name) and func.id in ("import_module", "__import__")
    )


def _import_module_target(name: str, keywords: list[ast.keyword]) -> str:
    if not name.startswith("."):
        return name
    package = next(
        (
            k.value.value
            for k in keywords
            if k.arg == "package" and isinstance(k.value, ast.Constant)
        ),
        "",
    )
    level = len(name) - len(name.lstrip("."))
    return _relative(name.lstrip(".") or None, level, package)


def imports(path: Path, known: Iterable[str] | None = None) -> set[str]:
    here = module_name(path)
    known = {module_name(p) for p in modules()} if known is None else known
    return imports_of(path.read_text(encoding="utf-8"), here, known, path.name == "__init__.py")


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """module -> the fincheck modules it imports (itself left out), for every non-test module
    (read once; callers that plant an import make a new dict)."""
    paths = modules()
    known = {module_name(p) for p in paths}
    return {(here := module_name(p)): imports(p, known) - {here} for p in paths}


def upward_imports(graph: Mapping[str, set[str]] | None = None) -> dict[tuple[str, str], str]:
    wrong = {}
    for here, targets in (import_graph() if graph is None else graph).items():
        rank, name = layer(here)
        for target in targets:
            target_rank, target_name = layer(target)
            if target_rank > rank:
                wrong[here, target] = f"{name} imports {target_name}"
            elif rank == target_rank == 1 and name != target_name:
                wrong[here, target] = f"stage {name} imports stage {target_name}"
    return wrong


def is_core(module: str) -> bool:
    return layer(module) == (0, "core")


def floor(module: str) -> int | None:
    """The core module's floor (0 lowest): where its folder (or itself) stands in `FLOORS`;
    the package `fincheck` (its version) stands with the lowest. None outside them."""
    parts = module.split(".")
    if parts == ["fincheck"]:
        return 0
    return FLOORS.index(parts[1]) if len(parts) > 1 and parts[1] in FLOORS else None


def eval_floor(module: str) -> int | None:
    """An eval module's floor in `EVAL_FLOORS` (0 lowest), None outside eval."""
    for rank, package in enumerate(EVAL_FLOORS):
        if module == package or module.startswith(package + "."):
            return rank
    return None


def core_graph(graph: Mapping[str, set[str]] | None = None) -> dict[str, set[str]]:
    graph = import_graph() if graph is None else graph
    return {m: {t for t in ts if is_core(t)} for m, ts in graph.items() if is_core(m)}


def floor_violations(graph: Mapping[str, set[str]] | None = None) -> dict[tuple[str, str], str]:
    """(module, what it imports): a core module importing one of a higher floor, or an eval
    module one of a higher floor of eval."""
    wrong = {}
    for here, targets in (import_graph() if graph is None else graph).items():
        for target in targets:
            for rank in (floor, eval_floor):
                if None not in (rank(here), rank(target)) and rank(target) > rank(here):
                    wrong[here, target] = f"floor {rank(here)} imports floor {rank(target)}"
    return wrong


def import_circles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (or a module importing itself),
    each sorted: every import circle, found by Tarjan's algorithm (iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    circles = []
    nodes = set(graph) | {t for ts in graph.values() for t in ts}
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    circles.append(sorted(component))
    return sorted(circles)


def test_the_layer_map_reads_every_module():
    """Every installed package folder is read, and the map names each module's layer as the
    docs say (a wrong map would let any import through)."""
    names = {module_name(p) for p in modules()}
    assert {
        "fincheck.inference.generation",
        "fincheck.tasks.qasem",
        "fincheck.eval.generate",
    } <= names
    assert layer("fincheck.tasks.qasem.metrics") == (0, "core")
    assert layer("fincheck.eval.score") == (1, "eval")
    assert layer("fincheck.eval.commands") == layer("bench.workload") == (2, "commands")
    assert layer("fincheck.commands.models") == (2, "commands")
    assert len(names) >= 90


def test_imports_point_down_only():
    wrong = upward_imports()
    unexplained = {edge: why for edge, why in wrong.items() if edge not in KNOWN}
    assert unexplained == {}, "\n".join(f"{a} -> {b}: {why}" for (a, b), why in unexplained.items())
    fixed = set(KNOWN) - set(wrong)
    assert not fixed, f"fixed, delete from KNOWN: {fixed}"


def test_every_core_module_stands_on_a_floor():
    """Every folder and module under fincheck/ is a floor (the command line aside): a new one
    is given its place in `FLOORS`, and no floor is stale."""
    core = sorted(m for m in import_graph() if is_core(m))
    assert [m for m in core if floor(m) is None] == []
    under = {p.stem for p in (REPO / "fincheck").iterdir() if p.suffix == ".py" or p.is_dir()}
    assert sorted(under - {"__init__", "__pycache__", "commands"}) == sorted(FLOORS)
    assert all(eval_floor(m) is not None for m in import_graph() if m.startswith("fincheck.eval."))


def test_modules_import_their_own_floor_or_lower_ones():
    wrong = floor_violations()
    assert wrong == {}, "\n".join(f"{a} -> {b}: {why}" for (a, b), why in wrong.items())


def test_no_import_circle_in_the_core():
    """No circle at all, not even inside one layer (one would be held open by a late import)."""
    assert import_circles(core_graph()) == []


# ---------------------------------------------------------------- each guard fails when broken


PLANTED = """\
from __future__ import annotations

import importlib
from importlib import import_module

from fincheck import eval, __version__
from . import models
from .models import wheels
from .tasks.base import Task


def late():
    import fincheck.train.sft
    from fincheck.tasks import get_task

    importlib.import_module("fincheck.eval.score")
    import_module(".commands", package="fincheck.data_prep")
    return importlib.import_module(computed_name())  # not a constant: unknowable
"""


def test_the_reader_sees_every_spelling_of_an_import():
    known = {module_name(p) for p in modules()}
    found = imports_of(PLANTED, "fincheck.errors", known)
    assert found == {
        "fincheck",  # __version__ is no module: the package itself
        "fincheck.eval",  # `from fincheck import eval`: the module fincheck.eval
        "fincheck.models",  # `from . import models`, in the package fincheck: a sub-package
        "fincheck.models.wheels",  # `from .models import wheels`
        "fincheck.tasks.base",  # `from .tasks.base import Task`
        "fincheck.train.sft",  # inside a function
        "fincheck.tasks",  # inside a function
        "fincheck.eval.score",  # importlib.import_module("...")
        "fincheck.data_prep.commands",  # import_module(".x", package="...")
    }
    # in a package's __init__, `.` is the package itself; `..` its parent
    inside = imports_of(
        "from . import base\nfrom .. import errors\n", "fincheck.tasks", known, True
    )
    assert inside == {"fincheck.tasks.base", "fincheck.errors"}
    deeper = imports_of("from ..base import Task\n", "fincheck.tasks.qasem.convert", known)
    assert deeper == {"fincheck.tasks.base"}


def test_a_planted_upward_import_fails_in_a_copy_of_the_tree(tmp_path):
    """A core module that imports a stage (each spelling, in a copy of a real module) is caught
    by the stairs test's function."""
    real = REPO / "fincheck" / "errors.py"
    known = {module_name(p) for p in modules()}
    graph = import_graph()
    for spelling in (
        "from fincheck import eval\n",
        "from . import eval\n",
        "def f():\n    import importlib\n    importlib.import_module('fincheck.eval.score')\n",
    ):
        copy = tmp_path / "errors.py"
        copy.write_text(real.read_text(encoding="utf-8") + "\n" + spelling, encoding="utf-8")
        planted = {
            **graph,
            "fincheck.errors": imports_of(copy.read_text(), "fincheck.errors", known),
        }
        wrong = upward_imports(planted)
        assert [edge for edge in wrong if edge[0] == "fincheck.errors"], spelling
        assert all(
            why == "core imports eval"
            for edge, why in wrong.items()
            if edge[0] == "fincheck.errors"
        )


def test_a_planted_higher_layer_import_and_circle_fail():
    """pairs looking the registry up late again (the circle this test file was written
    against): both the rank test and the circle test report it."""
    graph = import_graph()
    planted = {**graph, "fincheck.data.pairs": graph["fincheck.data.pairs"] | {"fincheck.tasks"}}
    assert floor_violations(planted) == {
        ("fincheck.data.pairs", "fincheck.tasks"): "floor 3 imports floor 6"
    }
    circles = import_circles(core_graph(planted))
    assert len(circles) == 1 and {
        "fincheck.data.pairs",
        "fincheck.tasks",
        "fincheck.tasks.base",
    } <= set(circles[0])


def test_a_method_importing_evals_loop_is_a_higher_floor():
    """eval's methods stand below its loop: FIZZ recording its threshold itself (the import
    that once ran back up) is caught."""
    graph = import_graph()
    fizz = "fincheck.eval.baselines.fizz"
    planted = {**graph, fizz: graph[fizz] | {"fincheck.eval.predictions"}}
    assert floor_violations(planted) == {
        (fizz, "fincheck.eval.predictions"): "floor 0 imports floor 1"
    }


def test_the_circle_finder_on_synthetic_graphs():
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_circles({"a": {"a"}}) == [["a"]]  # a module importing itself
    two = {"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": {"c"}, "e": {"a", "d"}}
    assert import_circles(two) == [["a", "b"], ["c", "d"]]


def test_a_stage_importing_a_benchmark_is_caught():
    """The benchmarks are not installed (`bench.*`, beside the scripts) but still commands: a
    stage that imports one points up."""
    known = {module_name(p) for p in modules()}
    graph = import_graph()
    planted = {**graph, "fincheck.eval.score": imports_of("import bench.workload\n", "x", known)}
    assert (
        upward_imports(planted)["fincheck.eval.score", "bench.workload"] == "eval imports commands"
    )
