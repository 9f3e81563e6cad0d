"""Synthetic layer embeddings whose structure is known: one chosen layer carries the label, the others are noise.

A test that trains on these knows the right answers without a language model:
the best single layer is :attr:`LayerSignal.layer`, a probe on any other layer
scores at chance, and an encoder that uses the signal layer scores well above it.

Each example's noise is drawn from a generator seeded by its own key (its text,
when one is given), so the same example gets the same features in every subset
of its task: a 240-example draw and the full training split agree row for row.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["LayerSignal", "SIMILARITY_RANK", "classification_features", "similarity_features", "row_generator"]

SIMILARITY_RANK = 8  # dimensions of the subspace sentence meanings live in (similarity features)


@dataclass(frozen=True)
class LayerSignal:
    """Where and how strongly synthetic features carry the label.

    Attributes:
        layer: the one layer whose features depend on the label (negative counts from the last).
        strength: the length of each class mean (classification) or of each sentence's meaning vector
            (similarity), in units of the per-feature noise. With 64 features, the default 6 gives a
            probe at the recommended learning rate 50-85% accuracy on six classes within 6-12 epochs and
            one at ten times that rate nearly 100%: trials differ, as they do on real embeddings.
        seed: draws the class means, and the noise of examples that have no key of their own.
    """

    layer: int = -1
    strength: float = 6.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.strength > 0:
            raise ValueError(f"strength must be above 0, got {self.strength}")

    def layer_index(self, num_layers: int) -> int:
        """The signal layer as an index in ``range(num_layers)``."""
        index = self.layer + num_layers if self.layer < 0 else self.layer
        if not 0 <= index < num_layers:
            raise ValueError(f"signal layer {self.layer} is outside the {num_layers} layers of these features")
        return index


def row_generator(key: str, seed: int) -> np.random.Generator:
    """A generator that depends only on ``key`` and ``seed`` (sha256, so it is the same in every process)."""
    digest = hashlib.sha256(f"{seed}\x00{key}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def _row_generators(count: int, keys: Sequence[str] | None, seed: int) -> list[np.random.Generator]:
    if keys is None:
        shared = np.random.default_rng(seed)
        return [shared] * count
    if len(keys) != count:
        raise ValueError(f"got {len(keys)} row keys for {count} rows; give one key per row")
    return [row_generator(key, seed) for key in keys]


def _class_means(num_classes: int, hidden_size: int, signal: LayerSignal) -> np.ndarray:
    """One direction per class, each of length ``signal.strength``."""
    means = np.random.default_rng(signal.seed).standard_normal((num_classes, hidden_size))
    return signal.strength * means / np.linalg.norm(means, axis=1, keepdims=True)


def classification_features(
    labels: ArrayLike,
    num_layers: int,
    hidden_size: int,
    signal: LayerSignal | None = None,
    *,
    row_keys: Sequence[str] | None = None,
) -> np.ndarray:
    """``(N, num_layers, hidden_size)`` float32 features for integer ``labels``.

    Every layer is standard normal noise; the signal layer adds the mean of the row's class. ``row_keys``
    (e.g. the texts) make each row's noise depend on its key alone.
    """
    signal = signal or LayerSignal()
    ids = np.asarray(labels, dtype=np.int64)
    if ids.ndim != 1 or (ids.size and ids.min() < 0):
        raise ValueError("labels must be a 1-d sequence of class ids >= 0")
    layer = signal.layer_index(num_layers)
    means = _class_means(int(ids.max(initial=0)) + 1, hidden_size, signal)
    out = np.empty((ids.size, num_layers, hidden_size), dtype=np.float32)
    for row, generator in enumerate(_row_generators(ids.size, row_keys, signal.seed)):
        out[row] = generator.standard_normal((num_layers, hidden_size))
        out[row, layer] += means[ids[row]]
    return out


def _meaning_basis(hidden_size: int, signal: LayerSignal) -> np.ndarray:
    """Orthonormal rows spanning the subspace in which sentences' meanings live (the same for every pair)."""
    rank = min(SIMILARITY_RANK, hidden_size)
    basis, _ = np.linalg.qr(np.random.default_rng(signal.seed + 1).standard_normal((hidden_size, rank)))
    return basis.T


def similarity_features(
    scores: ArrayLike,
    num_layers: int,
    hidden_size: int,
    signal: LayerSignal | None = None,
    *,
    score_range: tuple[float, float] = (0.0, 5.0),
    row_keys: Sequence[str] | None = None,
) -> np.ndarray:
    """``(N, 2, num_layers, hidden_size)`` float32 features of sentence pairs scored ``scores``.

    At the signal layer each sentence adds a meaning vector of length ``signal.strength`` from one small
    subspace shared by all pairs (:data:`SIMILARITY_RANK` dimensions, as semantic directions are in real
    embeddings); the cosine between a pair's two meanings is its score mapped linearly from ``score_range``
    to [-1, 1]. Every other layer, and the rest of the signal layer, is noise.
    """
    signal = signal or LayerSignal()
    gold = np.asarray(scores, dtype=np.float64)
    low, high = score_range
    if not high > low:
        raise ValueError(f"score_range must be (low, high) with high > low, got {score_range}")
    agreement = np.clip(2.0 * (gold - low) / (high - low) - 1.0, -1.0, 1.0)
    layer = signal.layer_index(num_layers)
    basis = _meaning_basis(hidden_size, signal)
    out = np.empty((gold.size, 2, num_layers, hidden_size), dtype=np.float32)
    for row, generator in enumerate(_row_generators(gold.size, row_keys, signal.seed)):
        out[row] = generator.standard_normal((2, num_layers, hidden_size))
        first, other = generator.standard_normal((2, basis.shape[0]))
        first /= np.linalg.norm(first)
        other -= (other @ first) * first  # orthogonal to the first meaning, so the cosine is exact
        other /= np.linalg.norm(other)
        second = agreement[row] * first + np.sqrt(1.0 - agreement[row] ** 2) * other
        out[row, 0, layer] += signal.strength * (first @ basis)
        out[row, 1, layer] += signal.strength * (second @ basis)
    return out
