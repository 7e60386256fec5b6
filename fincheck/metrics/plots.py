"""PNG plots for the report: confusion matrices and ROC curves (matplotlib, Agg backend)."""

from __future__ import annotations

import io
from pathlib import Path

from fincheck.io.safe_files import write_bytes


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_confusion(
    counts: list[list[int]],
    labels: list[str],
    title: str,
    path: Path,
    gold_labels: list[str] | None = None,
) -> Path:
    """Rows = gold, columns = predicted, each cell annotated with its count. `gold_labels`: the
    rows to draw when gold takes fewer values than predictions (no gold is ever "invalid")."""
    plt = _pyplot()
    rows = [labels.index(g) for g in gold_labels] if gold_labels else list(range(len(labels)))
    counts = [counts[i] for i in rows]
    fig, ax = plt.subplots(figsize=(1.4 * len(labels) + 2, 1.2 * len(rows) + 1.5))
    ax.imshow(counts, cmap="Blues")
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
    ax.set_yticks(range(len(rows)), [labels[i] for i in rows])
    ax.set_xlabel("predicted")
    ax.set_ylabel("gold")
    ax.set_title(title)
    peak = max((max(row) for row in counts), default=0)
    for i, row in enumerate(counts):
        for j, value in enumerate(row):
            color = "white" if peak and value > peak / 2 else "black"
            ax.text(j, i, str(value), ha="center", va="center", color=color)
    return _save(plt, fig, path)


def plot_confusion_figure(confusion: dict, title: str, path: Path, **kw) -> Path:
    """`plot_confusion` of a task's `{"counts", "labels"}` confusion figure."""
    return plot_confusion(confusion["counts"], confusion["labels"], title, path, **kw)


def plot_roc(
    curves: dict[str, tuple[list[float], list[float], float]], title: str, path: Path
) -> Path:
    """One ROC curve per name: (false-positive rates, true-positive rates, AUC)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 5))
    for name, (fpr, tpr, auc) in curves.items():
        ax.plot(fpr, tpr, label=f"{name} (AUC {auc:.3f})")
    ax.plot([0, 1], [0, 1], linestyle="--", color="grey", linewidth=1)
    ax.set_xlabel("false-positive rate (unsupported called supported)")
    ax.set_ylabel("true-positive rate (supported called supported)")
    ax.set_title(title)
    ax.legend(loc="lower right")
    return _save(plt, fig, path)


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    image = io.BytesIO()
    fig.savefig(image, dpi=100, format=path.suffix.lstrip(".") or "png")
    plt.close(fig)
    write_bytes(path, image.getvalue())
    return path
