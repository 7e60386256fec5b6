"""What a task's `evaluate` module (`fincheck/tasks/<task>/fincheck_<task>/`) says about itself:
its docstring and the value types of its predictions and references."""

from __future__ import annotations


def metric_info(description: str, predictions: str, references: str):
    """A metric module's `evaluate.MetricInfo` (`predictions`, `references`: `datasets` value
    type names)."""
    import datasets
    import evaluate

    features = {"predictions": predictions, "references": references}
    return evaluate.MetricInfo(
        description=description,
        citation="",
        inputs_description=description,
        features=datasets.Features({k: datasets.Value(v) for k, v in features.items()}),
    )
