"""The public aggregators: a config plus ``(num_layers, hidden_in)`` in, an ``nn.Module`` out.

- :func:`build_aggregator` -> :class:`Aggregator`: ``(N, L, D) -> (N, out_dim)``,
  one vector per sample from its per-layer embeddings. Works for every family
  (Cayley, FC, DeepSet and the layer baselines).
- :func:`build_per_token_aggregator` -> :class:`PerTokenAggregator`:
  ``(B, T, L, D) -> (B, T, out_dim)`` or ``(B, out_dim)``, one graph over all
  ``T * L`` (token, layer) nodes of a sample (Cayley or FC families).

Both check the input once (rank, sizes, dtype) and cast it to the module's
dtype, so the encoders behind them can assume well-formed input.

Compatibility with the published ``ilge`` package: the factories keep its
signatures (``build_per_token_aggregator(config, num_layers, hidden_in,
token_pooling="mean", output_mode="per_token")``) and raise ``TypeError`` where
it does for a config of the wrong type (:class:`~ilge_search.validation.ArgumentTypeError`,
also a ``ValueError``). Two documented extensions accept more than it does:
``build_aggregator`` takes the layer-baseline configs, and the per-token graph
may be fully connected (``FCConfig``); a ``DeepSetConfig`` there is a ``TypeError``.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from ..nn._base import LayerEncoder
from ..nn.gnn import BatchedGraph, GNNStack, GraphCache
from ..validation import ArgumentTypeError, check_choice, check_int
from . import encoder_spec
from .configs import CayleyConfig, EncoderConfig, FCConfig
from .graphs import cayley_graph, fully_connected_graph

__all__ = [
    "Aggregator",
    "PerTokenAggregator",
    "build_aggregator",
    "build_per_token_aggregator",
    "build_layer_encoder",
    "INPUT_DTYPES",
    "PER_TOKEN_WARN_NODES",
]

INPUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
OUTPUT_MODES = ("per_token", "sequence")
PER_TOKEN_POOLINGS = ("mean", "sum")  # how "per_token" output pools each token's layer nodes
PER_TOKEN_WARN_NODES = 2000


def _check_size(name: str, value) -> int:
    try:
        return check_int(name, value)
    except ValueError as exc:
        raise ValueError(f"{exc}; use num_layers_for(model) / hidden_size_for(model)") from None


def _check_config(config) -> EncoderConfig:
    if not isinstance(config, EncoderConfig):
        raise ArgumentTypeError(f"config must be an encoder config such as CayleyConfig(), got {type(config).__name__}")
    return config


def build_layer_encoder(config: EncoderConfig, num_layers: int, hidden_in: int) -> LayerEncoder:
    """The bare :class:`~ilge_search.nn.LayerEncoder` for ``config`` (no input checks around it): its
    family's registered builder (:func:`ilge_search.encoders.register_encoder`)."""
    _check_config(config)
    _check_size("num_layers", num_layers)
    _check_size("hidden_in", hidden_in)
    return encoder_spec(config.family).build(config, num_layers, hidden_in)


def _module_dtype(module: nn.Module) -> torch.dtype:
    for tensor in list(module.parameters()) + list(module.buffers()):
        if tensor.is_floating_point():
            return tensor.dtype
    return torch.float32


def _check_dtype(x: torch.Tensor, module_dtype: torch.dtype) -> None:
    if x.dtype not in INPUT_DTYPES and x.dtype != module_dtype:
        allowed = ", ".join(str(d).replace("torch.", "") for d in INPUT_DTYPES)
        raise ValueError(f"expected a {allowed} tensor, got dtype {x.dtype}")


def _shape_str(shape) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ")"


class Aggregator(nn.Module):
    r"""``(N, num_layers, hidden_in) -> (N, out_dim)`` around one :class:`~ilge_search.nn.LayerEncoder`.

    Checks the input (a float32, float16 or bfloat16 tensor of the expected
    shape; anything else raises :class:`ValueError` with the expected and the
    received shape) and casts it to the encoder's dtype.

    Attributes:
        encoder: the wrapped layer encoder.
        config: the config it was built from.
        num_layers, hidden_in: the expected ``L`` and ``D``.
        out_dim: width of the output, for sizing a task head.

    Shapes:
        - input: ``(N, num_layers, hidden_in)``
        - output: ``(N, out_dim)``
    """

    def __init__(self, encoder: LayerEncoder, config: EncoderConfig) -> None:
        super().__init__()
        self.encoder = encoder
        self.config = config
        self.num_layers = encoder.num_layers
        self.hidden_in = encoder.hidden_in
        self.out_dim = encoder.out_dim

    def reset_parameters(self) -> None:
        self.encoder.reset_parameters()

    def check_input(self, x: torch.Tensor) -> torch.Tensor:
        """Validate ``x`` and return it in the module's dtype."""
        if not isinstance(x, torch.Tensor):
            raise ValueError(
                f"expected a torch.Tensor of shape (N, {self.num_layers}, {self.hidden_in}), got {type(x).__name__}"
            )
        dtype = _module_dtype(self)
        _check_dtype(x, dtype)
        if x.dim() != 3 or x.shape[1:] != (self.num_layers, self.hidden_in):
            raise ValueError(
                f"expected input of shape (N, {self.num_layers}, {self.hidden_in}) = (batch, num_layers, hidden_in), "
                f"got {_shape_str(x.shape)}; num_layers counts the embedding layer "
                "(num_hidden_layers + 1, see num_layers_for(model))"
            )
        return x.to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(self.check_input(x))

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.encoder!r}, out_dim={self.out_dim})"


def build_aggregator(config: EncoderConfig, num_layers: int, hidden_in: int) -> Aggregator:
    """An :class:`Aggregator` for any family: Cayley, FC, DeepSet or a layer baseline.

    Args:
        config: e.g. ``CayleyConfig()``; its architecture fields are used, the
            training fields (``lr``, ``epochs``...) are for the training engine.
        num_layers: hidden layers + 1 (the embedding layer); ``num_layers_for(model)``.
        hidden_in: the backbone's hidden size; ``hidden_size_for(model)``.
    """
    return Aggregator(build_layer_encoder(config, num_layers, hidden_in), config)


class PerTokenAggregator(nn.Module):
    r"""One graph per sample over all ``T * L`` (token, layer) nodes.

    Node ``t * L + l`` holds token ``t``'s layer ``l``; the graph is the Cayley
    graph of the smallest SL(2, Z_n) with at least ``T * L`` nodes (``CayleyConfig``,
    extra nodes virtual) or the fully connected graph (``FCConfig``). It is
    built once per sequence length and cached; batched copies are cached per
    batch size. A warning is issued above 2,000 real nodes.

    ``attention_mask`` ``(B, T)`` (1 = real token, 0 = padding) cuts padding
    tokens' nodes out of that sample's graph (their edges are dropped), so
    padding changes neither the real tokens' outputs nor the sequence pooling;
    per-token outputs at padding positions are zero. A sample without any real
    token raises :class:`ValueError`.

    Args:
        config: ``CayleyConfig`` or ``FCConfig``.
        num_layers, hidden_in: ``L`` and ``D``.
        token_pooling: ``"mean"`` or ``"sum"``: how ``"per_token"`` output pools each
            token's ``L`` layer nodes after message passing (the published package's argument).
        output_mode: ``"per_token"`` (one vector per token, pooled by ``token_pooling``) or
            ``"sequence"`` (all real nodes of the sample pooled as ``config.pooling`` says).

    Shapes:
        - input: ``x`` ``(B, T, num_layers, hidden_in)``, ``attention_mask`` ``(B, T)`` (optional)
        - output: ``(B, T, out_dim)`` for ``"per_token"``, ``(B, out_dim)`` for ``"sequence"``
    """

    def __init__(
        self,
        config: CayleyConfig | FCConfig,
        num_layers: int,
        hidden_in: int,
        token_pooling: str = "mean",
        output_mode: str = "per_token",
    ) -> None:
        super().__init__()
        _check_config(config)
        if not isinstance(config, (CayleyConfig, FCConfig)):
            raise ArgumentTypeError(
                f"per-token aggregation needs a graph family (CayleyConfig or FCConfig), got {type(config).__name__}"
            )
        check_choice("token_pooling", token_pooling, PER_TOKEN_POOLINGS)
        check_choice("output_mode", output_mode, OUTPUT_MODES)

        self.config = config
        self.num_layers = _check_size("num_layers", num_layers)
        self.hidden_in = _check_size("hidden_in", hidden_in)
        self.output_mode = output_mode
        self.token_pooling = token_pooling
        self.pooling = config.pooling
        self.graph_kind = config.family
        self.out_dim = config.hidden_dim
        self.gnn = GNNStack(
            hidden_in,
            config.hidden_dim,
            config.conv_type,
            config.gnn_layers,
            config.gin_mlp_layers,
            config.gat_heads,
            config.dropout,
        )
        self._graphs = GraphCache(maxsize=32)  # seq_len -> LayerGraph
        self._batched = GraphCache(maxsize=8)  # (seq_len, batch, device) -> BatchedGraph
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.gnn.reset_parameters()

    def graph_for(self, seq_len: int):
        """The :class:`~ilge_search.encoders.graphs.LayerGraph` of ``seq_len * num_layers`` real nodes (cached)."""

        def build():
            num_real = seq_len * self.num_layers
            if num_real > PER_TOKEN_WARN_NODES:
                warnings.warn(
                    f"per-token graph has {num_real} nodes (seq_len {seq_len} x {self.num_layers} layers), "
                    f"more than {PER_TOKEN_WARN_NODES}; shorten or chunk the sequences to keep it fast",
                    stacklevel=4,
                )
            return (cayley_graph if self.graph_kind == "cayley" else fully_connected_graph)(num_real)

        return self._graphs.get_or_build((seq_len,), build)

    def _check_inputs(self, x: torch.Tensor, attention_mask: torch.Tensor | None):
        L, D = self.num_layers, self.hidden_in
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"expected a torch.Tensor of shape (B, T, {L}, {D}), got {type(x).__name__}")
        dtype = _module_dtype(self)
        _check_dtype(x, dtype)
        if x.dim() != 4 or x.shape[2:] != (L, D) or x.size(1) == 0:
            raise ValueError(
                f"expected input of shape (B, T, {L}, {D}) = (batch, seq_len, num_layers, hidden_in) "
                f"with T >= 1, got {_shape_str(x.shape)}"
            )
        if attention_mask is None:
            return x.to(dtype), None
        if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != x.shape[:2]:
            got = (
                _shape_str(attention_mask.shape)
                if isinstance(attention_mask, torch.Tensor)
                else type(attention_mask).__name__
            )
            raise ValueError(f"attention_mask must have shape (B, T) = {_shape_str(x.shape[:2])}, got {got}")
        mask = attention_mask.to(torch.bool)
        if not torch.equal(mask.to(attention_mask.dtype), attention_mask):
            raise ValueError("attention_mask must hold only 0/1 (or False/True) values")
        empty = (~mask.any(dim=1)).nonzero().flatten().tolist()
        if empty:
            raise ValueError(f"attention_mask marks no real token in sample(s) {empty[:10]}; drop those samples")
        return x.to(dtype), (None if bool(mask.all()) else mask.to(x.device))

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:

        x, mask = self._check_inputs(x, attention_mask)
        B, T, L, D = x.shape
        H = self.out_dim
        graph = self.graph_for(T)
        nodes = x.reshape(B, T * L, D)  # token-major: node t * L + l
        if mask is None:
            batched = self._batched.get_or_build(
                (T, B, x.device),
                lambda: BatchedGraph(graph.edge_index.to(x.device), graph.num_nodes, graph.num_real, B),
            )
        else:
            node_mask = mask.repeat_interleave(L, dim=1)  # (B, T*L)
            batched = BatchedGraph(graph.edge_index.to(x.device), graph.num_nodes, graph.num_real, B, node_mask)
        h = self.gnn(nodes, batched).view(B, T, L, H)  # (B, T, L, H)
        if self.output_mode == "per_token":
            tokens = h.mean(dim=2) if self.token_pooling == "mean" else h.sum(dim=2)  # (B, T, H)
            return tokens if mask is None else tokens * mask.unsqueeze(-1).to(tokens.dtype)
        if mask is None:
            return h.mean(dim=(1, 2)) if self.pooling == "mean" else h.sum(dim=(1, 2))
        weights = mask.to(h.dtype).view(B, T, 1, 1)
        total = (h * weights).sum(dim=(1, 2))  # (B, H)
        if self.pooling == "sum":
            return total
        return total / (weights.sum(dim=(1, 2)) * L)

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}({self.graph_kind}, {self.config.conv_type}, "
            f"num_layers={self.num_layers}, hidden_dim={self.out_dim}, gnn_layers={self.config.gnn_layers}, "
            f"output_mode={self.output_mode!r})"
        )


def build_per_token_aggregator(
    config: CayleyConfig | FCConfig,
    num_layers: int,
    hidden_in: int,
    token_pooling: str = "mean",
    output_mode: str = "per_token",
) -> PerTokenAggregator:
    """A :class:`PerTokenAggregator`: ``(B, T, L, D) -> (B, T, out_dim)`` or ``(B, out_dim)``.

    The published package's signature: ``token_pooling`` (``"mean"``/``"sum"``) pools each
    token's layer nodes for ``output_mode="per_token"``; ``"sequence"`` pools every real node
    of a sample as ``config.pooling`` says.
    """
    return PerTokenAggregator(config, num_layers, hidden_in, token_pooling=token_pooling, output_mode=output_mode)
