"""fincheck.eval: predictions from a model (`fincheck eval`), figures from predictions (`fincheck score`).

Each task's metrics are also a local `evaluate` module in its task folder
(`fincheck/tasks/<task>/fincheck_<task>/`); `evaluate_module_path` finds one wherever the
package is installed:

    import evaluate
    from fincheck.eval import evaluate_module_path
    qasem = evaluate.load(evaluate_module_path("fincheck_qasem"))
"""

from __future__ import annotations

import inspect
from pathlib import Path


def evaluate_modules() -> dict[str, Path]:
    """{module name: its folder}: every registered task's `fincheck_<task>/` that holds one."""
    from fincheck.tasks import all_tasks

    folders = {
        f"fincheck_{name}": Path(inspect.getfile(type(task))).parent / f"fincheck_{name}"
        for name, task in all_tasks().items()
    }
    return {name: folder for name, folder in folders.items() if (folder / f"{name}.py").is_file()}


def evaluate_module_path(name: str) -> str:
    """Directory of a metric module for `evaluate.load` (a local path: no hub access)."""
    modules = evaluate_modules()
    if name not in modules:
        raise ValueError(f"unknown metric module {name!r}; choose from {tuple(modules)}")
    return str(modules[name])
