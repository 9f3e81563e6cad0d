"""The built-in encoder families, registered in one place.

Each family's config class is in :mod:`ilge_search.encoders.configs` (its role and task kinds in
``FAMILY_INDEX``), its module in :mod:`ilge_search.nn`; here are its builder, search space, start
and report label. The modules load on first build (the GNNs import PyTorch Geometric).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from .configs import FAMILY_INDEX, CayleyConfig, DeepSetConfig, EncoderConfig, FCConfig, FieldValues
from .registry import EncoderSpec, ModuleBuilder, Picker, register_encoder

if TYPE_CHECKING:  # the modules load on first build
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


def _build_graph(config: CayleyConfig | FCConfig, num_layers: int, hidden_in: int) -> LayerEncoder:
    from ..nn.gnn import CayleyGNNEncoder, FCGNNEncoder

    cls = FCGNNEncoder if config.family == "fc" else CayleyGNNEncoder
    return cls(num_layers, hidden_in, **_fields(config, _GRAPH_FIELDS))


def _build_deepset(config: DeepSetConfig, num_layers: int, hidden_in: int) -> LayerEncoder:
    from ..nn.deepset import DeepSetEncoder

    return DeepSetEncoder(num_layers, hidden_in, **_fields(config, _DEEPSET_FIELDS))


def _build_baseline(config: EncoderConfig, num_layers: int, hidden_in: int) -> LayerEncoder:
    from ..nn.baselines import build_baseline

    return build_baseline(config, num_layers, hidden_in)


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


def _builtin(
    name: str,
    build: ModuleBuilder,
    label: str,
    rank: int,
    start: Mapping[str, FieldValues],
    search: Callable[[Picker], None] | None = None,
    token_label: str | None = None,
) -> EncoderSpec:
    """A built-in spec; its class, role and kinds are the config layer's ``FAMILY_INDEX`` entry."""
    entry = FAMILY_INDEX[name]
    spec = EncoderSpec(
        name,
        entry.config_class,
        build,
        start=start,
        label=label,
        role=entry.role,
        kinds=entry.kinds,
        report_rank=rank,
        token_label=token_label,
    )
    return spec if search is None else dataclasses.replace(spec, search=search)


# report_rank orders the report's columns: the baselines, then the ILGE families
BUILTIN_SPECS: tuple[EncoderSpec, ...] = (
    _builtin("cayley", _build_graph, "Cayley", 80, _GRAPH_START, _search_graph, token_label="Cayley per sentence"),
    _builtin("cayley-word", _build_graph, "Cayley per word", 60, _GRAPH_START, _search_graph),
    _builtin("fc", _build_graph, "FC", 70, _GRAPH_START, _search_graph),
    _builtin("deepset", _build_deepset, "DeepSet", 50, _WIDTH_START, _search_deepset),
    _builtin("last-layer", _build_baseline, "Last layer", 0, _PLAIN_START),
    _builtin("best-layer", _build_baseline, "Best layer", 10, _PLAIN_START),
    _builtin("mean-layers", _build_baseline, "Mean layers", 20, _PLAIN_START),
    _builtin("scalar-mix", _build_baseline, "Scalar mix", 30, _PLAIN_START),
    _builtin("mlp-last", _build_baseline, "MLP (last)", 40, _WIDTH_START, _search_width),
)

for _spec in BUILTIN_SPECS:
    register_encoder(_spec)
