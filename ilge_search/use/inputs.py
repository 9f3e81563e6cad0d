"""The checks every estimator applies to what a user passes in (texts, sentence pairs, labels, embedding
arrays): each wrong input ends in one ``ValueError`` that names the argument and says what it must be."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..validation import check_items

__all__ = ["check_texts", "check_labels", "check_pairs", "check_features"]


def check_texts(texts: object, name: str = "texts") -> list[str]:
    texts = check_items(name, texts, "a list of strings", "text")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise ValueError(f"{name}[{i}] is {type(text).__name__}, expected str")
        if not text.strip():
            raise ValueError(f"{name}[{i}] is empty or whitespace only; remove it or give it some text")
    return texts


def check_labels(labels: Any, num_rows: int, name: str = "labels") -> np.ndarray:
    if labels is None:
        raise ValueError(f"{name} is None")
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {labels.shape}")
    if labels.shape[0] != num_rows:
        raise ValueError(f"got {num_rows} inputs but {labels.shape[0]} {name}; they must have the same length")
    if labels.dtype.kind == "f":
        if not np.all(np.isfinite(labels)) or not np.all(labels == np.round(labels)):
            raise ValueError(f"{name} must be class labels (ints or strings), got non-integer floats")
        labels = labels.astype(np.int64)
    elif labels.dtype.kind == "O":
        kinds = {type(v) for v in labels}
        if len(kinds) > 1:
            raise ValueError(f"{name} mix types {sorted(k.__name__ for k in kinds)}; use one label type")
        labels = np.asarray(labels.tolist())
    if labels.dtype.kind not in "iubU":
        raise ValueError(f"{name} must be ints or strings, got dtype {labels.dtype}")
    return labels


def check_pairs(pairs: Any, name: str = "pairs") -> list[str]:
    """``[(a, b), ...]`` -> the flat texts ``[a0, b0, a1, b1, ...]`` (as the embedding cache stores pairs)."""
    flat: list[str] = []
    for i, pair in enumerate(check_items(name, pairs, "a list of (sentence_a, sentence_b) pairs", "pair")):
        if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2:
            raise ValueError(f"{name}[{i}] must be a (sentence_a, sentence_b) pair, got {pair!r:.60}")
        for j, text in enumerate(pair):
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"{name}[{i}][{j}] is empty or not a string; give every pair two texts")
        flat.extend(pair)
    return flat


def check_features(X: Any, name: str = "X", pairs: bool = False) -> torch.Tensor:
    X = torch.as_tensor(X)
    shape = "(N, 2, num_layers, hidden)" if pairs else "(N, num_layers, hidden)"
    if not X.is_floating_point() or X.dim() != (4 if pairs else 3) or (pairs and X.shape[1] != 2):
        raise ValueError(f"{name} must be a float array of shape {shape}, got {X.dtype} {tuple(X.shape)}")
    if X.shape[0] == 0:
        raise ValueError(f"{name} is empty; pass at least one row")
    return X
