"""Results: per-class metrics from a confusion matrix, metrics.jsonl, report.json and plots.

Everything here takes plain Python data (lists, dicts), so it is cheap to test and the
numbers in report.json are exactly the numbers in the plots.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Sequence, Tuple

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
REPORT_FILE = "report.json"


def per_class_metrics(confusion: Sequence[Sequence[int]], classes: Sequence[str]) -> Dict[str, Dict[str, float]]:
    """Precision, recall, F1 and support per class; rows are true classes, columns predicted."""
    k = len(classes)
    result: Dict[str, Dict[str, float]] = {}
    for i, name in enumerate(classes):
        tp = confusion[i][i]
        predicted = sum(confusion[r][i] for r in range(k))
        actual = sum(confusion[i])
        precision = tp / predicted if predicted else 0.0
        recall = tp / actual if actual else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        result[name] = {
            "precision": round(precision, 6),
            "recall": round(recall, 6),
            "f1": round(f1, 6),
            "support": int(actual),
        }
    return result


def write_json_atomic(obj: Any, path: Path) -> None:
    """Write JSON through a temp file and rename, so readers never see half a report."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def rewrite_metrics(path: Path, rows: List[Dict[str, Any]]) -> None:
    """Make metrics.jsonl hold exactly `rows` (used on resume: rows written after the last
    checkpoint belong to an epoch that will run again)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, path)


def append_metrics(path: Path, row: Dict[str, Any]) -> None:
    """Append one epoch row."""
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def plot_learning_curves(history: List[Dict[str, Any]], path: Path) -> None:
    """Loss and accuracy per epoch, train and validation, as one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [r["epoch"] for r in history]
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    ax_loss.plot(epochs, [r["train_loss"] for r in history], "o-", label="train")
    ax_loss.plot(epochs, [r["val_loss"] for r in history], "o-", label="validation")
    ax_loss.set_xlabel("epoch")
    ax_loss.set_ylabel("loss")
    ax_loss.legend()
    ax_acc.plot(epochs, [r["train_accuracy"] for r in history], "o-", label="train")
    ax_acc.plot(epochs, [r["val_accuracy"] for r in history], "o-", label="validation")
    ax_acc.set_xlabel("epoch")
    ax_acc.set_ylabel("accuracy")
    ax_acc.set_ylim(0, 1.02)
    ax_acc.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_confusion(confusion: Sequence[Sequence[int]], classes: Sequence[str], path: Path) -> None:
    """The test confusion matrix as a labelled heat map."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = len(classes)
    size = min(20.0, 3.0 + 0.45 * k)
    fig, ax = plt.subplots(figsize=(size, size))
    im = ax.imshow(confusion, cmap="Blues")
    ax.set_xticks(range(k))
    ax.set_yticks(range(k))
    ax.set_xticklabels(classes, rotation=90 if k > 6 else 0)
    ax.set_yticklabels(classes)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    if k <= 30:  # numbers stop being readable beyond that
        top = max((max(row) for row in confusion), default=0)
        for i in range(k):
            for j in range(k):
                value = confusion[i][j]
                ax.text(j, i, str(value), ha="center", va="center", color="white" if value > top / 2 else "black")
    fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_plots(
    out: Path, history: List[Dict[str, Any]], confusion: Sequence[Sequence[int]], classes: Sequence[str]
) -> List[str]:
    """Both plots; a plotting failure is logged, never fatal (the numbers are in report.json)."""
    written: List[str] = []
    plots: Tuple[Tuple[str, Callable[[Path], None]], ...] = (
        ("learning_curves.png", lambda p: plot_learning_curves(history, p)),
        ("confusion_matrix.png", lambda p: plot_confusion(confusion, classes, p)),
    )
    for name, fn in plots:
        try:
            fn(out / name)
            written.append(name)
        except Exception as err:  # matplotlib missing or a backend problem
            log.warning("could not write %s: %s", name, err)
    return written
