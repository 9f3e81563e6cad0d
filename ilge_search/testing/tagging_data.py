"""Synthetic tagging sets with a known answer: where in the (word, layer) grid each word's tag is written.

Every set is sentences of random length whose words carry a random *type* (one of
``num_types``), written as that type's centre into one layer of the word, with Gaussian
noise everywhere. Two tasks:

- :func:`middle_layer_tags`: a word's tag is its own type, and only a middle layer carries it;
  the last layer is noise, so a probe of the last layer is at chance and any encoder that
  reads every layer of the word can reach close to 100 %.
- :func:`neighbour_tags`: a word's tag is the type of the word before it (the first word of a
  sentence has its own tag, ``num_types``); a word's own layers say nothing about it, so an
  encoder that reads each word alone is at chance on every word after the first.

Features are float16, as the embedding cache stores them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["SyntheticWords", "middle_layer_tags", "neighbour_tags"]


@dataclass(frozen=True)
class SyntheticWords:
    """One synthetic split: ``features`` ``(W, L, D)`` float16, ``offsets`` ``(S + 1,)``, ``labels`` ``(W,)``,
    and each word's ``types``."""

    features: torch.Tensor
    offsets: np.ndarray
    labels: torch.Tensor
    types: np.ndarray

    @property
    def data(self) -> tuple[tuple[torch.Tensor, np.ndarray], torch.Tensor]:
        """``((features, offsets), labels)``, the engine's tagging dataset."""
        return (self.features, self.offsets), self.labels


@dataclass(frozen=True)
class _Grid:
    num_sentences: int
    num_layers: int
    hidden: int
    num_types: int
    layer: int
    lengths: tuple[int, int]
    noise: float


def _sentences(grid: _Grid, seed: int) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(12345).normal(size=(grid.num_types, grid.hidden))  # the same in every split
    lengths = rng.integers(grid.lengths[0], grid.lengths[1] + 1, size=grid.num_sentences)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    types = rng.integers(0, grid.num_types, size=int(offsets[-1]))
    features = rng.normal(scale=grid.noise, size=(int(offsets[-1]), grid.num_layers, grid.hidden))
    features[:, grid.layer] += centres[types]
    return torch.from_numpy(features.astype(np.float16)), offsets, types


def middle_layer_tags(
    num_sentences: int = 240,
    *,
    num_layers: int = 5,
    hidden: int = 16,
    num_types: int = 4,
    lengths: tuple[int, int] = (3, 10),
    seed: int = 0,
) -> SyntheticWords:
    """Tags written only into the middle layer (``num_layers // 2``) of the same word."""
    grid = _Grid(num_sentences, num_layers, hidden, num_types, num_layers // 2, lengths, noise=0.7)
    features, offsets, types = _sentences(grid, seed)
    return SyntheticWords(features, offsets, torch.from_numpy(types).long(), types)


def neighbour_tags(
    num_sentences: int = 240,
    *,
    num_layers: int = 5,
    hidden: int = 16,
    num_types: int = 4,
    lengths: tuple[int, int] = (3, 10),
    seed: int = 0,
) -> SyntheticWords:
    """Each word's tag is the previous word's type (written into the last layer); first words get tag
    ``num_types``."""
    grid = _Grid(num_sentences, num_layers, hidden, num_types, num_layers - 1, lengths, noise=0.5)
    features, offsets, types = _sentences(grid, seed)
    labels = np.empty_like(types)
    labels[1:] = types[:-1]
    labels[offsets[:-1]] = num_types  # a sentence's first word has no word before it
    return SyntheticWords(features, offsets, torch.from_numpy(labels).long(), types)
