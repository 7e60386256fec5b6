"""One-way stairs: core (`fincheck/`) <- stages (data_prep, train, eval, serve) <- commands
(the CLI, each stage's `commands.py`, the benchmarks and scripts). Read from the source of every
non-test module: each import, at the top or inside a function, and type-only ones too."""

from __future__ import annotations

import ast
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
COMMAND_MODULES = ("fincheck.cli", "fincheck.serve.detect_cli")

# Arrows still pointing up, each with why. The test fails when one is added and when one is
# fixed (then delete its line), so this list only shrinks.
KNOWN: dict[tuple[str, str], str] = {}


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
    if module.startswith(("scripts.", "bench")) or module in COMMAND_MODULES:
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
    return sorted(p for p in paths if "evaluate_metrics" not in p.parts)


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name == "fincheck" or name.startswith("fincheck.")}


def upward_imports() -> dict[tuple[str, str], str]:
    wrong = {}
    for path in modules():
        here = module_name(path)
        rank, name = layer(here)
        for target in imports(path):
            target_rank, target_name = layer(target)
            if target_rank > rank:
                wrong[here, target] = f"{name} imports {target_name}"
            elif rank == target_rank == 1 and name != target_name:
                wrong[here, target] = f"stage {name} imports stage {target_name}"
    return wrong


def test_the_layer_map_reads_every_module():
    """Every installed package folder is read, and the map names each module's layer as the
    docs say (a wrong map would let any import through)."""
    names = {module_name(p) for p in modules()}
    assert {"fincheck.inference", "fincheck.tasks.qasem", "fincheck.eval.generate"} <= names
    assert layer("fincheck.tasks.qasem.metrics") == (0, "core")
    assert layer("fincheck.eval.score") == (1, "eval")
    assert layer("fincheck.eval.commands") == layer("bench.workload") == (2, "commands")
    assert len(names) >= 90


def test_imports_point_down_only():
    wrong = upward_imports()
    unexplained = {edge: why for edge, why in wrong.items() if edge not in KNOWN}
    assert unexplained == {}, "\n".join(f"{a} -> {b}: {why}" for (a, b), why in unexplained.items())
    fixed = set(KNOWN) - set(wrong)
    assert not fixed, f"fixed, delete from KNOWN: {fixed}"
