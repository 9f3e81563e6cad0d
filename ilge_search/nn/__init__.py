"""Layer encoders: ``(N, num_layers, hidden_in) -> (N, out_dim)`` modules behind :class:`LayerEncoder`.

One module per family: :mod:`.gnn` (Cayley and fully connected GNNs),
:mod:`.deepset` and :mod:`.baselines` (the layer-selection baselines). The
public way to build one from a config is :func:`ilge_search.build_aggregator`.
The GNN classes import PyTorch Geometric, so they load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._base import LayerEncoder
from .deepset import DeepSetEncoder

_LAZY = {
    "GNNEncoder": "gnn",
    "CayleyGNNEncoder": "gnn",
    "FCGNNEncoder": "gnn",
    "GNNStack": "gnn",
    "BatchedGraph": "gnn",
}

__all__ = ["LayerEncoder", "DeepSetEncoder", *_LAZY]


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'ilge_search.nn' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module_name}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))
