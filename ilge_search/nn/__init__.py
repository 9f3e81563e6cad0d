"""Layer encoders: ``(N, num_layers, hidden_in) -> (N, out_dim)`` modules behind :class:`LayerEncoder`.

One module per family: :mod:`.gnn` (Cayley and fully connected GNNs; it imports PyTorch Geometric, so it
loads only when a GNN is built), :mod:`.deepset` and :mod:`.baselines` (the layer-selection baselines).
The public way to build one from a config is :func:`ilge_search.build_aggregator`.
"""

from __future__ import annotations

from ._base import LayerEncoder
from .deepset import DeepSetEncoder

__all__ = ["LayerEncoder", "DeepSetEncoder"]
