"""The narrow base class every layer encoder (ILGE family or baseline) implements."""

from __future__ import annotations

import abc

import torch
from torch import nn


class LayerEncoder(nn.Module, abc.ABC):
    """Maps per-layer embeddings ``(N, L, D)`` to one vector per sample ``(N, out_dim)``.

    Subclasses store their hyperparameters under their own names, build their
    submodules, and end ``__init__`` with :meth:`reset_parameters`. Input
    validation (rank, L, D, dtype) happens once in the public
    :class:`~ilge_search.encoders.aggregator.Aggregator` wrapper, so ``forward`` here may
    assume a floating tensor of the right shape in the module's own dtype.

    Shapes:
        - input: ``(N, num_layers, hidden_in)``
        - output: ``(N, out_dim)``
    """

    num_layers: int
    hidden_in: int
    out_dim: int

    def __init__(self, num_layers: int, hidden_in: int) -> None:
        super().__init__()
        if num_layers <= 0 or hidden_in <= 0:
            raise ValueError(f"num_layers and hidden_in must be positive, got {num_layers} and {hidden_in}")
        self.num_layers = int(num_layers)
        self.hidden_in = int(hidden_in)

    @abc.abstractmethod
    def reset_parameters(self) -> None:
        """Re-initialise every learnable parameter."""

    @abc.abstractmethod
    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (N, L, D) -> (N, out_dim)
        ...
