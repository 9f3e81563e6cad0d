"""Scores the engine selects and reports by: correlations for similarity, accuracy and macro-F1 for classes."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

__all__ = ["pearson", "spearman", "macro_f1", "class_metrics", "check_label_range", "check_finite", "ArrayLike"]

ArrayLike = torch.Tensor | np.ndarray


def check_label_range(labels: torch.Tensor, num_classes: int, name: str) -> None:
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high >= num_classes:
        raise ValueError(f"{name} labels must be class ids in [0, {num_classes}), found values in [{low}, {high}]")


def check_finite(features: torch.Tensor, name: str, what: str = "features", unit: str = "row") -> None:
    """Refuse NaN or inf; chunked, so that a large float16 (or memory-mapped) set never needs a full-size copy."""
    for start in range(0, features.shape[0], 4096):
        if not torch.isfinite(features[start : start + 4096]).all():
            raise ValueError(
                f"{name} {what} contain NaN or inf (first bad block starts at {unit} {start}); "
                "the embedding cache may be corrupt: clear it and extract again"
            )


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties get the mean of the ranks they span."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    last_rank = np.cumsum(counts)
    average_rank = last_rank - (counts - 1) / 2.0
    return average_rank[inverse.reshape(-1)]


def pearson(x: ArrayLike, y: ArrayLike) -> float:
    """Pearson correlation; 0.0 when either vector is constant (undefined)."""
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    if x.shape != y.shape:
        raise ValueError(f"pearson: vectors differ in length ({x.size} vs {y.size})")
    x = x - x.mean()
    y = y - y.mean()
    denom = math.sqrt(float((x * x).sum()) * float((y * y).sum()))
    return float((x * y).sum() / denom) if denom > 0 else 0.0


def spearman(x: ArrayLike, y: ArrayLike) -> float:
    """Spearman rank correlation (ties averaged); 0.0 when either vector is constant."""
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    return pearson(_average_ranks(x), _average_ranks(y))


def macro_f1(y_true: ArrayLike, y_pred: ArrayLike) -> float:
    """Unweighted mean of per-class F1 over the classes present in ``y_true`` or ``y_pred``."""
    y_true = torch.as_tensor(y_true).long().reshape(-1)
    y_pred = torch.as_tensor(y_pred).long().reshape(-1)
    num_classes = int(max(y_true.max(), y_pred.max())) + 1
    tp = torch.bincount(y_true[y_true == y_pred], minlength=num_classes).double()
    true_count = torch.bincount(y_true, minlength=num_classes).double()
    pred_count = torch.bincount(y_pred, minlength=num_classes).double()
    present = (true_count + pred_count) > 0
    f1 = 2 * tp[present] / (true_count[present] + pred_count[present])  # 2tp / (2tp + fp + fn)
    return float(f1.mean())


def class_metrics(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """``loss`` (cross-entropy), ``accuracy`` and ``macro_f1`` of logits ``(N, C)`` against class ids ``(N,)``:
    texts for classification, words for tagging."""
    predicted = logits.argmax(dim=1)
    return {
        "loss": float(nn.functional.cross_entropy(logits, labels.long())),
        "accuracy": float((predicted == labels).double().mean()),
        "macro_f1": macro_f1(labels, predicted),
    }
