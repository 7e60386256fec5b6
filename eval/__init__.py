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


def evaluate_module_path(name: str) -> str:
    """Directory of a metric module for `evaluate.load` (a local path: no hub access): every
    registered task's `fincheck_<task>/` that holds one."""
    from fincheck.tasks import all_tasks

    folders = {
        f"fincheck_{task}": Path(inspect.getfile(type(t))).parent / f"fincheck_{task}"
        for task, t in all_tasks().items()
    }
    modules = {module: f for module, f in folders.items() if (f / f"{module}.py").is_file()}
    if name not in modules:
        raise ValueError(f"unknown metric module {name!r}; choose from {tuple(modules)}")
    return str(modules[name])
