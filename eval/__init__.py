"""fincheck.eval: predictions from a model (`fincheck eval`), figures from predictions (`fincheck score`).

The metrics are also local `evaluate` modules; `evaluate_module_path` finds them wherever the
package is installed:

    import evaluate
    from fincheck.eval import evaluate_module_path
    qasem = evaluate.load(evaluate_module_path("fincheck_qasem"))
"""

from __future__ import annotations

from pathlib import Path

EVALUATE_MODULES = ("fincheck_qasem", "fincheck_fhsumbench", "fincheck_final")


def evaluate_module_path(name: str) -> str:
    """Directory of a metric module for `evaluate.load` (a local path: no hub access)."""
    if name not in EVALUATE_MODULES:
        raise ValueError(f"unknown metric module {name!r}; choose from {EVALUATE_MODULES}")
    return str(Path(__file__).parent / "evaluate_metrics" / name)


def metric_info(description: str, predictions: str, references: str):
    """A metric module's `evaluate.MetricInfo`: its docstring, and the value types (`datasets`
    names) of its predictions and references."""
    import datasets
    import evaluate

    features = {"predictions": predictions, "references": references}
    return evaluate.MetricInfo(
        description=description,
        citation="",
        inputs_description=description,
        features=datasets.Features({k: datasets.Value(v) for k, v in features.items()}),
    )
