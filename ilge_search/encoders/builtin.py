"""The built-in encoder families, registered in one place.

Each family's config class is in :mod:`ilge_search.encoders.configs` and its module in
:mod:`ilge_search.nn`; here is the rest of it: its builder, search space, start, report label, role,
task kinds and whether it trains in shared passes. The modules load on first build (the GNNs import
PyTorch Geometric).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from .configs import (
    BestLayerConfig,
    CayleyConfig,
    CayleyWordConfig,
    DeepSetConfig,
    EncoderConfig,
    FCConfig,
    FieldValues,
    LastLayerConfig,
    MeanLayersConfig,
    MLPLastConfig,
    ScalarMixConfig,
)
from .registry import EncoderSpec, ModuleBuilder, Picker, register_encoder

if TYPE_CHECKING:
    from ..nn import LayerEncoder

__all__ = ["HIDDEN_DIMS", "GAT_HEADS", "BUILTIN_SPECS"]

HIDDEN_DIMS = (128, 256, 512)
GAT_HEADS = (2, 4, 8)

# The published package's documented defaults: lr 1e-3 for small models (up to 3B parameters,
# models.LARGE_MODEL_PARAMS), 1e-4 for large ones; one GNN layer of width 256 for both.
_GRAPH_START = {
    "small": {"lr": 1e-3, "gnn_layers": 1, "hidden_dim": 256},
    "large": {"lr": 1e-4, "gnn_layers": 1, "hidden_dim": 256},
}
_PLAIN_START = {bucket: {"lr": values["lr"]} for bucket, values in _GRAPH_START.items()}
_WIDTH_START = {bucket: {"lr": values["lr"], "hidden_dim": 256} for bucket, values in _GRAPH_START.items()}


_GRAPH_FIELDS = ("conv_type", "hidden_dim", "gnn_layers", "gin_mlp_layers", "gat_heads", "pooling", "dropout")
_DEEPSET_FIELDS = ("hidden_dim", "pre_pooling_layers", "post_pooling_layers", "pooling", "dropout")


def _fields(config: EncoderConfig, names: tuple[str, ...]) -> FieldValues:
    return {name: getattr(config, name) for name in names}


# the nn modules load on first build: they import torch, and the GNNs PyTorch Geometric
def _gnn() -> ModuleType:
    from ..nn import gnn  # cycle: nn reads the configs and the registry of this package

    return gnn


def _deepset() -> ModuleType:
    from ..nn import deepset  # cycle: nn reads the configs and the registry of this package

    return deepset


def _baselines() -> ModuleType:
    from ..nn import baselines  # cycle: nn reads the configs and the registry of this package

    return baselines


def _module(load: Callable[[], ModuleType], class_name: str, fields: tuple[str, ...] = ("dropout",)) -> ModuleBuilder:
    """Builds ``class_name`` of the loaded module from ``(num_layers, hidden_in)`` and the config's ``fields``."""

    def build(config: EncoderConfig, num_layers: int, hidden_in: int) -> LayerEncoder:
        module: LayerEncoder = getattr(load(), class_name)(num_layers, hidden_in, **_fields(config, fields))
        return module

    return build


def _search_graph(pick: Picker) -> None:
    conv_type = pick.categorical("conv_type", ["gin", "gcn", "gat"])
    pick.categorical("hidden_dim", list(HIDDEN_DIMS))
    pick.integer("gnn_layers", 1, 3)
    if conv_type == "gin":
        pick.integer("gin_mlp_layers", 1, 2)
    if conv_type == "gat":
        pick.categorical("gat_heads", list(GAT_HEADS))
    pick.categorical("pooling", ["mean", "sum"])
    pick.real("dropout", 0.0, 0.5)


def _search_deepset(pick: Picker) -> None:
    pick.categorical("hidden_dim", list(HIDDEN_DIMS))
    pick.integer("pre_pooling_layers", 0, 2)
    pick.integer("post_pooling_layers", 0, 2)
    pick.categorical("pooling", ["mean", "sum"])
    pick.real("dropout", 0.0, 0.5)


def _search_width(pick: Picker) -> None:
    pick.categorical("hidden_dim", list(HIDDEN_DIMS))


def _graph(config_class: type[EncoderConfig], class_name: str, label: str, rank: int, **more: Any) -> EncoderSpec:
    build = _module(_gnn, class_name, _GRAPH_FIELDS)
    return EncoderSpec(
        config_class.family, config_class, build, _search_graph, _GRAPH_START, label, **more, report_rank=rank
    )


def _probe(
    config_class: type[EncoderConfig], class_name: str, label: str, rank: int, fields: tuple[str, ...] = ("dropout",)
) -> EncoderSpec:
    build = _module(_baselines, class_name, fields)
    return EncoderSpec(
        config_class.family,
        config_class,
        build,
        start=_PLAIN_START,
        label=label,
        role="baseline",
        report_rank=rank,
        batched=True,
    )


# report_rank orders the report's columns: the baselines, then the ILGE families. The modules draw random numbers
# only in dropout, which a pass of train_many replays (batched); cayley-word's tagging models train one at a time.
BUILTIN_SPECS: tuple[EncoderSpec, ...] = (
    _graph(CayleyConfig, "CayleyGNNEncoder", "Cayley", 80, token_label="Cayley per sentence", batched=True),
    _graph(CayleyWordConfig, "CayleyGNNEncoder", "Cayley per word", 60, kinds=("token",)),
    _graph(FCConfig, "FCGNNEncoder", "FC", 70, batched=True),
    EncoderSpec(
        "deepset",
        DeepSetConfig,
        _module(_deepset, "DeepSetEncoder", _DEEPSET_FIELDS),
        _search_deepset,
        _WIDTH_START,
        "DeepSet",
        report_rank=50,
        batched=True,
    ),
    _probe(LastLayerConfig, "LastLayer", "Last layer", 0),
    _probe(BestLayerConfig, "BestLayer", "Best layer", 10, ("layer", "dropout")),
    _probe(MeanLayersConfig, "MeanLayers", "Mean layers", 20),
    _probe(ScalarMixConfig, "ScalarMix", "Scalar mix", 30),
    dataclasses.replace(
        _probe(MLPLastConfig, "MLPLast", "MLP (last)", 40, ("hidden_dim", "mlp_layers", "dropout")),
        start=_WIDTH_START,
        search=_search_width,
    ),
)

for _spec in BUILTIN_SPECS:
    register_encoder(_spec)
