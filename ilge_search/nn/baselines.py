"""Layer baselines: the simple ways of turning ``(N, L, D)`` into one vector.

Every baseline is a :class:`~ilge_search.nn._base.LayerEncoder`, so the one
training engine puts the same linear head on top of it as on an ILGE encoder:
``last-layer`` + head is a linear probe on the last layer, ``mlp-last`` + head
an MLP classifier, and so on. :func:`build_baseline` maps a baseline config to
its module through the family's registered spec, as
:func:`ilge_search.encoders.aggregator.build_aggregator` does.

All baselines take ``dropout``; it is applied to the vector handed to the
head (the default configs use ``dropout=0.0``, i.e. a plain probe).
"""

from __future__ import annotations

import torch
from torch import nn

from ..encoders.configs import EncoderConfig
from ..encoders.registry import baseline_families, encoder_spec
from ._base import LayerEncoder

__all__ = [
    "LastLayer",
    "BestLayer",
    "MeanLayers",
    "ScalarMix",
    "MLPLast",
    "build_baseline",
]


def _check_dropout(dropout: float) -> float:
    if not 0.0 <= float(dropout) < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
    return float(dropout)


class _LayerReadout(LayerEncoder):
    """A baseline that reads one ``(N, D)`` vector off the layers, then applies dropout.

    Subclasses implement :meth:`readout`; the output width is always ``hidden_in``.
    """

    def __init__(self, num_layers: int, hidden_in: int, dropout: float = 0.0) -> None:
        super().__init__(num_layers, hidden_in)
        self.dropout = _check_dropout(dropout)
        self.out_dim = self.hidden_in

    def reset_parameters(self) -> None:
        pass  # the parameter-free readouts have nothing to learn

    def readout(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.dropout(self.readout(x), self.dropout, self.training)  # (N, D)

    def extra_repr_args(self) -> str:
        return ""

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}(num_layers={self.num_layers}, hidden_in={self.hidden_in}"
            f"{self.extra_repr_args()})"
        )


class LastLayer(_LayerReadout):
    r"""Returns the last layer's embedding, :math:`h_{L-1}` (no parameters).

    Args:
        num_layers: number of layers ``L`` (embedding layer included).
        hidden_in: hidden size ``D``.
        dropout: dropout on the output.

    Shapes:
        - input: ``(N, L, D)``
        - output: ``(N, D)``
    """

    def readout(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, -1]  # (N, L, D) -> (N, D)


class BestLayer(_LayerReadout):
    r"""Returns one fixed layer, :math:`h_{\text{layer}}` (no parameters).

    Which layer is best is decided on validation data by
    :func:`ilge_search.engine.select_best_layer`; this module only reads it.

    Args:
        num_layers: number of layers ``L``.
        hidden_in: hidden size ``D``.
        layer: index in ``[-L, L)``; negative indices count from the last layer
            and are stored normalised to ``[0, L)``.
        dropout: dropout on the output.

    Shapes:
        - input: ``(N, L, D)``
        - output: ``(N, D)``
    """

    def __init__(self, num_layers: int, hidden_in: int, layer: int | None, dropout: float = 0.0) -> None:
        super().__init__(num_layers, hidden_in, dropout)
        if layer is None:
            raise ValueError(
                "BestLayerConfig.layer is None: choose the layer on validation data with "
                "ilge_search.engine.select_best_layer(...), or set layer=<index> explicitly"
            )
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise ValueError(f"layer must be an integer index, got {layer!r}")
        if not -self.num_layers <= layer < self.num_layers:
            raise ValueError(
                f"layer={layer} is out of range for a model with {self.num_layers} layers; "
                f"use an index in [{-self.num_layers}, {self.num_layers - 1}]"
            )
        self.layer = layer % self.num_layers

    def readout(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, self.layer]  # (N, L, D) -> (N, D)

    def extra_repr_args(self) -> str:
        return f", layer={self.layer}"


class MeanLayers(_LayerReadout):
    r"""The unweighted mean of all layers, :math:`\frac{1}{L}\sum_l h_l` (no parameters).

    Shapes:
        - input: ``(N, L, D)``
        - output: ``(N, D)``
    """

    def readout(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=1)  # (N, L, D) -> (N, D)


class ScalarMix(_LayerReadout):
    r"""ELMo's scalar mix, :math:`\gamma \sum_l \mathrm{softmax}(w)_l\, h_l`.

    ``w`` starts at zero (a uniform mix, i.e. the mean of the layers) and
    ``gamma`` at one, so before training this equals :class:`MeanLayers`.

    Args:
        num_layers: number of layers ``L``.
        hidden_in: hidden size ``D``.
        dropout: dropout on the output.

    Shapes:
        - input: ``(N, L, D)``
        - output: ``(N, D)``
    """

    def __init__(self, num_layers: int, hidden_in: int, dropout: float = 0.0) -> None:
        super().__init__(num_layers, hidden_in, dropout)
        self.layer_logits = nn.Parameter(torch.empty(self.num_layers))
        self.gamma = nn.Parameter(torch.empty(1))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.layer_logits)
        nn.init.ones_(self.gamma)

    def layer_weights(self) -> torch.Tensor:
        """The current mixing weights ``softmax(w)``, shape ``(L,)``."""
        return torch.softmax(self.layer_logits, dim=0)

    def readout(self, x: torch.Tensor) -> torch.Tensor:
        weights = self.layer_weights().to(x.dtype)  # (L,)
        return self.gamma.to(x.dtype) * torch.einsum("nld,l->nd", x, weights)  # (N, D)


class MLPLast(LayerEncoder):
    r"""An MLP on the last layer: ``mlp_layers`` blocks of Linear -> ReLU -> Dropout.

    With the engine's linear head on top this is an MLP classifier with
    ``mlp_layers`` hidden layers of width ``hidden_dim``.

    Args:
        num_layers: number of layers ``L``.
        hidden_in: hidden size ``D``.
        hidden_dim: width of every hidden layer (and ``out_dim``).
        mlp_layers: number of hidden layers (>= 1).
        dropout: dropout after every hidden layer.

    Shapes:
        - input: ``(N, L, D)``
        - output: ``(N, hidden_dim)``
    """

    def __init__(
        self, num_layers: int, hidden_in: int, hidden_dim: int = 256, mlp_layers: int = 1, dropout: float = 0.1
    ) -> None:
        super().__init__(num_layers, hidden_in)
        if hidden_dim <= 0 or mlp_layers <= 0:
            raise ValueError(f"hidden_dim and mlp_layers must be positive, got {hidden_dim} and {mlp_layers}")
        self.hidden_dim = int(hidden_dim)
        self.mlp_layers = int(mlp_layers)
        self.dropout = _check_dropout(dropout)
        self.out_dim = self.hidden_dim
        blocks: list[nn.Module] = []
        width = self.hidden_in
        for _ in range(self.mlp_layers):
            blocks += [nn.Linear(width, self.hidden_dim), nn.ReLU(), nn.Dropout(self.dropout)]
            width = self.hidden_dim
        self.mlp = nn.Sequential(*blocks)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for module in self.mlp:
            if isinstance(module, nn.Linear):
                module.reset_parameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x[:, -1])  # (N, D) -> (N, hidden_dim)

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}(num_layers={self.num_layers}, hidden_in={self.hidden_in}, "
            f"hidden_dim={self.hidden_dim}, mlp_layers={self.mlp_layers})"
        )


def build_baseline(config: EncoderConfig, num_layers: int, hidden_in: int) -> LayerEncoder:
    """Build the baseline module for a baseline config: its family's registered builder.

    ``BestLayerConfig(layer=None)`` cannot be built: the layer has to be chosen
    on validation data first with :func:`ilge_search.engine.select_best_layer`
    (or set explicitly, e.g. ``BestLayerConfig(layer=-2)``).
    """
    spec = encoder_spec(config.family)
    if spec.role != "baseline":
        raise ValueError(
            f"{type(config).__name__} (family {config.family!r}) is not a baseline; "
            f"baseline families are {list(baseline_families())}"
        )
    return spec.build(config, num_layers, hidden_in)
