"""DeepSet encoder: the layers as an unordered set, with no interaction before pooling."""

from __future__ import annotations

import torch
from torch import nn

from ..encoders.configs import POOLINGS
from ..validation import check_choice, check_int
from ._base import LayerEncoder

__all__ = ["DeepSetEncoder"]


class DeepSetEncoder(LayerEncoder):
    r"""``rho(pool_l phi(x_l))``: a per-layer MLP, mean/sum over layers, then an MLP.

    ``phi`` is the projection ``hidden_in -> hidden_dim`` followed by
    ``pre_pooling_layers`` more ``hidden_dim -> hidden_dim`` layers; ``rho`` is
    ``post_pooling_layers`` ``hidden_dim -> hidden_dim`` layers (0 means the
    pooled vector is the output). Every linear layer is followed by ReLU and
    dropout. The output does not depend on the order of the layers.

    Args:
        num_layers: ``L``, layers per sample.
        hidden_in: ``D``, width of each layer's embedding.
        hidden_dim: width of ``phi`` and ``rho`` and of the output.
        pre_pooling_layers: hidden layers of ``phi`` after the projection.
        post_pooling_layers: layers of ``rho``.
        pooling: ``"mean"`` or ``"sum"`` over layers.
        dropout: dropout after every linear layer.

    Shapes:
        - input: ``(N, num_layers, hidden_in)``
        - output: ``(N, hidden_dim)``
    """

    def __init__(
        self,
        num_layers: int,
        hidden_in: int,
        hidden_dim: int = 256,
        pre_pooling_layers: int = 1,
        post_pooling_layers: int = 1,
        pooling: str = "mean",
        dropout: float = 0.1,
    ) -> None:
        super().__init__(num_layers, hidden_in)
        check_choice("pooling", pooling, POOLINGS)
        for name, value, low in [
            ("hidden_dim", hidden_dim, 1),
            ("pre_pooling_layers", pre_pooling_layers, 0),
            ("post_pooling_layers", post_pooling_layers, 0),
        ]:
            check_int(name, value, minimum=low)
        self.hidden_dim = hidden_dim
        self.pre_pooling_layers = pre_pooling_layers
        self.post_pooling_layers = post_pooling_layers
        self.pooling = pooling
        self.dropout = dropout
        self.out_dim = hidden_dim

        self.input_proj = nn.Linear(hidden_in, hidden_dim)
        self.pre = nn.ModuleList([nn.Linear(hidden_dim, hidden_dim) for _ in range(pre_pooling_layers)])
        self.post = nn.ModuleList([nn.Linear(hidden_dim, hidden_dim) for _ in range(post_pooling_layers)])
        self.drop = nn.Dropout(dropout)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for layer in [self.input_proj, *self.pre, *self.post]:
            layer.reset_parameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(torch.relu(self.input_proj(x)))  # (N, L, H)
        for layer in self.pre:
            h = self.drop(torch.relu(layer(h)))
        h = h.mean(dim=1) if self.pooling == "mean" else h.sum(dim=1)  # (N, H)
        for layer in self.post:
            h = self.drop(torch.relu(layer(h)))
        return h

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}({self.num_layers} layers, hidden_dim={self.hidden_dim}, "
            f"pre_pooling_layers={self.pre_pooling_layers}, post_pooling_layers={self.post_pooling_layers}, "
            f"pooling={self.pooling})"
        )
