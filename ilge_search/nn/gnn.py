"""GNN encoders: each layer's embedding is a node of a fixed graph (Cayley or fully connected).

A batch of ``B`` samples is ``B`` disjoint copies of the fixed graph, numbered
*real-first*: the real nodes of all samples come first (``b * R + r``), the
virtual nodes after them (``B * R + b * (V - R) + (v - R)``). With that order:

- real-node inputs are the projection ``(B, R, D) -> (B * R, H)`` as is, and
  virtual nodes are a block of zeros appended behind them (never projected);
- "real nodes only" is the prefix ``[:B * R]``, so the last convolution only
  computes the real targets that are pooled, and the first GIN (and sparse GCN)
  convolution skips the all-zero virtual sources;
- the batched adjacency depends on ``B`` only, so it is built once per batch
  size and cached (:class:`BatchedGraph`).

GIN and GCN aggregate with a sparse CSR matrix product (float32/float64) or a
scatter over ``edge_index`` (other dtypes, which CPU sparse kernels lack); GAT
always uses ``edge_index``. All three are the PyTorch Geometric convolutions;
``tests/test_nn.py`` checks the result equals the textbook per-sample
``Batch.from_data_list`` path.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, TypeVar, cast

import torch
from torch import nn
from torch_geometric.nn import GATConv, GCNConv, GINConv, MessagePassing
from torch_geometric.nn.conv.gcn_conv import gcn_norm

from ..encoders.configs import CONV_TYPES, POOLINGS
from ..encoders.graphs import LayerGraph, cayley_graph, fully_connected_graph
from ..validation import check_choice, check_int
from ._base import LayerEncoder

__all__ = ["BatchedGraph", "GNNStack", "GNNStackSettings", "GNNEncoder", "CayleyGNNEncoder", "FCGNNEncoder"]

_SPARSE_DTYPES = (torch.float32, torch.float64)
T = TypeVar("T")
# a convolution's adjacency (CSR matrix or edge_index) with its bipartite size or edge weights, or None
Operator = tuple[torch.Tensor, "tuple[int, int] | torch.Tensor | None"]


def _csr(edge_index: torch.Tensor, values: torch.Tensor, num_sources: int, num_targets: int) -> torch.Tensor:
    """Adjacency ``(num_targets, num_sources)`` with rows = targets, as a CSR tensor."""
    row, col = edge_index[1], edge_index[0]
    perm = torch.argsort(row * max(num_sources, 1) + col)
    row, col, values = row[perm], col[perm], values[perm]
    crow = torch.zeros(num_targets + 1, dtype=torch.long, device=row.device)
    crow[1:] = torch.cumsum(torch.bincount(row, minlength=num_targets), 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "sparse CSR support is in beta state"
        return torch.sparse_csr_tensor(crow, col, values, (num_targets, num_sources), check_invariants=False)


class BatchedGraph:
    """``B`` copies of a fixed graph as one disconnected graph, numbered real-first.

    Args:
        edge_index: ``(2, E)`` edges of one copy (``V`` nodes, the first ``R`` real).
        num_nodes: ``V``.
        num_real: ``R``.
        batch_size: ``B``.
        node_mask: optional ``(B, R)`` bool; edges touching a ``False`` real node
            are dropped, so that node neither sends nor receives messages.

    The adjacency operators the convolutions need are built on first use and
    kept, so a cached ``BatchedGraph`` costs nothing after the first batch.
    """

    def __init__(
        self,
        edge_index: torch.Tensor,
        num_nodes: int,
        num_real: int,
        batch_size: int,
        node_mask: torch.Tensor | None = None,
    ) -> None:
        V, R, B = num_nodes, num_real, batch_size
        E = edge_index.size(1)
        sample = torch.arange(B, device=edge_index.device).repeat_interleave(E).view(1, -1)  # (1, B*E)
        ei = edge_index.repeat(1, B)  # (2, B*E)
        ei = torch.where(ei < R, sample * R + ei, B * R + sample * (V - R) + (ei - R))
        if node_mask is not None:
            keep_node = torch.cat(
                [node_mask.reshape(-1).to(torch.bool), node_mask.new_ones(B * (V - R), dtype=torch.bool)]
            )
            ei = ei[:, keep_node[ei[0]] & keep_node[ei[1]]]
        self.edge_index = ei
        self.batch_size = B
        self.num_real = B * R  # real nodes of the whole batch: ids [0, num_real)
        self.num_nodes = B * V
        self._operators: dict[tuple, object] = {}

    def _cached(self, key: tuple, build: Callable[[], T]) -> T:
        if key not in self._operators:
            self._operators[key] = build()
        return cast(T, self._operators[key])

    def gin_operator(self, real_sources: bool, real_targets: bool, dtype: torch.dtype) -> Operator:
        """``(adjacency, size)`` for ``GINConv((x_src, x_dst), adjacency, size)``."""
        n_src = self.num_real if real_sources else self.num_nodes
        n_dst = self.num_real if real_targets else self.num_nodes
        sparse = dtype in _SPARSE_DTYPES

        def build() -> Operator:
            ei = self.edge_index
            keep = torch.ones(ei.size(1), dtype=torch.bool, device=ei.device)
            if real_sources:
                keep &= ei[0] < n_src
            if real_targets:
                keep &= ei[1] < n_dst
            ei = ei[:, keep]
            if sparse:
                return _csr(ei, torch.ones(ei.size(1), dtype=dtype, device=ei.device), n_src, n_dst), None
            return ei, (n_src, n_dst)

        return self._cached(("gin", real_sources, real_targets, dtype if sparse else None), build)

    def gcn_operator(self, real_sources: bool, real_targets: bool, dtype: torch.dtype) -> Operator:
        """Symmetrically normalised adjacency with self-loops: ``(adjacency, edge_weight)``.

        Normalisation always uses the whole graph; with a sparse dtype the
        matrix is then cut to real sources and/or targets. The ``edge_index``
        form (other dtypes) is never cut: ``GCNConv`` takes no bipartite size.
        """
        sparse = dtype in _SPARSE_DTYPES
        real_sources, real_targets = real_sources and sparse, real_targets and sparse

        def build() -> Operator:
            ei, weight = gcn_norm(self.edge_index, None, self.num_nodes, add_self_loops=True, dtype=dtype)
            if not sparse:
                return ei, weight
            n_src = self.num_real if real_sources else self.num_nodes
            n_dst = self.num_real if real_targets else self.num_nodes
            keep = (ei[0] < n_src) & (ei[1] < n_dst)
            return _csr(ei[:, keep], weight[keep], n_src, n_dst), None

        return self._cached(("gcn", real_sources, real_targets, dtype), build)

    def gat_operator(self, real_targets: bool) -> torch.Tensor:
        """``edge_index`` without self-loops (GATConv adds them), optionally real targets only."""

        def build() -> torch.Tensor:
            ei = self.edge_index
            return ei[:, ei[1] < self.num_real] if real_targets else ei

        return self._cached(("gat", real_targets), build)


class GraphCache(OrderedDict):
    """Small LRU of :class:`BatchedGraph` objects; copies and pickles start empty."""

    def __init__(self, maxsize: int = 8) -> None:
        super().__init__()
        self.maxsize = maxsize

    def get_or_build(self, key: tuple, build: Callable[[], BatchedGraph]) -> BatchedGraph:
        if key in self:
            self.move_to_end(key)
            return self[key]
        value = self[key] = build()
        while len(self) > self.maxsize:
            self.popitem(last=False)
        return value

    def __deepcopy__(self, memo: dict) -> GraphCache:
        return type(self)(self.maxsize)

    def __reduce__(self) -> tuple[type, tuple[int]]:
        return (type(self), (self.maxsize,))


class GNNStack(nn.Module):
    r"""Input projection plus ``gnn_layers`` PyG convolutions over a :class:`BatchedGraph`.

    Real nodes are projected ``hidden_in -> hidden_dim``; virtual nodes start at
    zero. Each convolution is followed by ReLU and dropout. GIN uses an MLP of
    ``gin_mlp_layers`` linear layers (ReLU between them); GAT concatenates
    ``gat_heads`` heads of ``hidden_dim // gat_heads`` channels.

    Args:
        hidden_in: input width ``D``.
        hidden_dim: node width ``H``.
        conv_type: ``"gin"``, ``"gcn"`` or ``"gat"``.
        gnn_layers: number of convolutions.
        gin_mlp_layers: linear layers in each GIN MLP.
        gat_heads: attention heads per GAT layer.
        dropout: dropout after every convolution.

    Shapes:
        - input: ``x`` ``(B, R, hidden_in)`` real-node features and a
          :class:`BatchedGraph` of ``B`` copies with ``R`` real nodes each
        - output: ``(B * R, hidden_dim)`` real-node states, sample-major
    """

    def __init__(
        self,
        hidden_in: int,
        hidden_dim: int = 256,
        conv_type: str = "gin",
        gnn_layers: int = 1,
        gin_mlp_layers: int = 1,
        gat_heads: int = 4,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        check_choice("conv_type", conv_type, CONV_TYPES)
        for name, value in [
            ("hidden_in", hidden_in),
            ("hidden_dim", hidden_dim),
            ("gnn_layers", gnn_layers),
            ("gin_mlp_layers", gin_mlp_layers),
            ("gat_heads", gat_heads),
        ]:
            check_int(name, value)
        if conv_type == "gat" and hidden_dim % gat_heads:
            raise ValueError(f"hidden_dim ({hidden_dim}) must be divisible by gat_heads ({gat_heads})")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        self.hidden_in = hidden_in
        self.hidden_dim = hidden_dim
        self.conv_type = conv_type
        self.gnn_layers = gnn_layers
        self.gin_mlp_layers = gin_mlp_layers
        self.gat_heads = gat_heads
        self.dropout = dropout

        self.input_proj = nn.Linear(hidden_in, hidden_dim)
        self.convs = nn.ModuleList([self._make_conv() for _ in range(gnn_layers)])
        self.drop = nn.Dropout(dropout)
        self.reset_parameters()

    def _make_conv(self) -> nn.Module:
        H = self.hidden_dim
        if self.conv_type == "gin":
            layers: list[nn.Module] = []
            for i in range(self.gin_mlp_layers):
                if i:
                    layers.append(nn.ReLU())
                layers.append(nn.Linear(H, H))
            return GINConv(nn.Sequential(*layers))
        if self.conv_type == "gcn":
            return GCNConv(H, H, normalize=False)  # BatchedGraph supplies the normalised adjacency
        return GATConv(H, H // self.gat_heads, heads=self.gat_heads)

    def reset_parameters(self) -> None:
        self.input_proj.reset_parameters()
        for conv in self.convs:
            cast(MessagePassing, conv).reset_parameters()

    def _with_virtual(self, h_real: torch.Tensor, num_nodes: int) -> torch.Tensor:
        """Append the virtual nodes' rows: zeros, never projected from anything."""
        return torch.cat([h_real, h_real.new_zeros(num_nodes - h_real.size(0), self.hidden_dim)])

    def forward(self, x: torch.Tensor, graph: BatchedGraph) -> torch.Tensor:
        B, R, _ = x.shape
        n_real, n_all = graph.num_real, graph.num_nodes
        h = self.input_proj(x).reshape(B * R, self.hidden_dim)  # (B*R, H): real nodes only
        for i, conv in enumerate(self.convs):
            first, last = i == 0, i == len(self.convs) - 1
            # Before the first layer the virtual nodes are zero and send nothing, so GIN (and GCN on a
            # sparse matrix) take real sources only; the last layer computes the pooled real targets only.
            sparse = h.dtype in _SPARSE_DTYPES
            real_sources = first and (self.conv_type == "gin" or (self.conv_type == "gcn" and sparse))
            x_src = self._with_virtual(h, n_all) if first and not real_sources else h
            if self.conv_type == "gin":
                adj, size = graph.gin_operator(real_sources=first, real_targets=last, dtype=h.dtype)
                x_dst = x_src[:n_real] if last else (self._with_virtual(h, n_all) if first else x_src)
                out = conv((x_src, x_dst), adj, size=size)
            elif self.conv_type == "gcn":
                adj, weight = graph.gcn_operator(real_sources=real_sources, real_targets=last, dtype=h.dtype)
                out = conv(x_src, adj, weight)  # (n_real or n_all, H)
            else:
                adj = graph.gat_operator(real_targets=last)
                out = conv((x_src, x_src[:n_real]), adj, size=(n_all, n_real)) if last else conv(x_src, adj)
            h = self.drop(torch.relu(out))
        return h[:n_real]

    def __repr__(self) -> str:
        extra = {"gin": f", gin_mlp_layers={self.gin_mlp_layers}", "gat": f", gat_heads={self.gat_heads}"}
        return (
            f"{self.__class__.__name__}({self.hidden_in} -> {self.hidden_dim}, {self.conv_type}"
            f"{extra.get(self.conv_type, '')}, gnn_layers={self.gnn_layers}, dropout={self.dropout})"
        )


@dataclass(frozen=True)
class GNNStackSettings:
    """The message passing of a :class:`GNNEncoder`: its :class:`GNNStack`'s arguments besides the input width
    (checked there)."""

    conv_type: str = "gin"
    hidden_dim: int = 256
    gnn_layers: int = 1
    gin_mlp_layers: int = 1
    gat_heads: int = 4
    dropout: float = 0.1


class GNNEncoder(LayerEncoder):
    r"""Layer encoder: a GNN over a fixed graph whose first ``num_layers`` nodes are the layers.

    Layer ``i`` is node ``i``; the graph's remaining nodes are virtual (start at
    zero, pass messages, are not pooled). The graph is stored once as the
    ``edge_index`` buffer; batched copies of it are cached per batch size.

    Args:
        num_layers: ``L``, layers per sample (hidden layers + 1).
        hidden_in: ``D``, width of each layer's embedding.
        graph: a :class:`~ilge_search.encoders.graphs.LayerGraph` with ``num_real == num_layers``.
        stack: conv_type, hidden_dim, gnn_layers, gin_mlp_layers, gat_heads, dropout (:class:`GNNStack`).
        pooling: ``"mean"`` or ``"sum"`` over the real layer nodes.

    Shapes:
        - input: ``(N, num_layers, hidden_in)``
        - output: ``(N, hidden_dim)``
    """

    edge_index: torch.Tensor

    def __init__(
        self,
        num_layers: int,
        hidden_in: int,
        graph: LayerGraph,
        stack: GNNStackSettings = GNNStackSettings(),
        pooling: str = "mean",
    ) -> None:
        super().__init__(num_layers, hidden_in)
        if graph.num_real != num_layers:
            raise ValueError(f"graph has {graph.num_real} real nodes but num_layers is {num_layers}")
        check_choice("pooling", pooling, POOLINGS)
        self.conv_type = stack.conv_type
        self.hidden_dim = stack.hidden_dim
        self.gnn_layers = stack.gnn_layers
        self.gin_mlp_layers = stack.gin_mlp_layers
        self.gat_heads = stack.gat_heads
        self.pooling = pooling
        self.dropout = stack.dropout
        self.num_nodes = graph.num_nodes
        self.graph_kind = graph.kind
        self.out_dim = stack.hidden_dim
        self.register_buffer("edge_index", graph.edge_index.clone(), persistent=False)
        self.gnn = GNNStack(hidden_in, **asdict(stack))  # the settings are GNNStack's own argument names
        self._graph_cache = GraphCache()
        self.reset_parameters()

    @property
    def graph(self) -> LayerGraph:
        return LayerGraph(self.edge_index, self.num_nodes, self.num_layers, self.graph_kind)

    def reset_parameters(self) -> None:
        self.gnn.reset_parameters()

    def batched_graph(self, batch_size: int) -> BatchedGraph:
        """The cached ``batch_size`` copies of the graph (on the buffer's device)."""
        key = (batch_size, self.edge_index.device)
        return self._graph_cache.get_or_build(
            key, lambda: BatchedGraph(self.edge_index, self.num_nodes, self.num_layers, batch_size)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        N = x.size(0)
        h = self.gnn(x, self.batched_graph(N)).view(N, self.num_layers, self.hidden_dim)  # (N, L, H)
        return h.mean(dim=1) if self.pooling == "mean" else h.sum(dim=1)

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}({self.num_layers} layers -> {self.num_nodes} nodes, "
            f"{self.conv_type}, hidden_dim={self.hidden_dim}, gnn_layers={self.gnn_layers})"
        )


class _FixedGraphEncoder(GNNEncoder):
    """A :class:`GNNEncoder` over the graph ``graph_of(num_layers)``."""

    @staticmethod
    def graph_of(num_real: int, /) -> LayerGraph:
        raise NotImplementedError

    def __init__(self, num_layers: int, hidden_in: int, *, pooling: str = "mean", **stack: Any) -> None:
        """``stack``: the fields of a :class:`GNNStackSettings` (a config's names for them)."""
        check_int("num_layers", num_layers)
        graph = type(self).graph_of(num_layers)
        super().__init__(num_layers, hidden_in, graph, GNNStackSettings(**stack), pooling)


class CayleyGNNEncoder(_FixedGraphEncoder):
    """:class:`GNNEncoder` over the Cayley graph of the smallest SL(2, Z_n) with ``num_layers`` nodes.

    Shapes:
        - input: ``(N, num_layers, hidden_in)``
        - output: ``(N, hidden_dim)``
    """

    graph_of = staticmethod(cayley_graph)


class FCGNNEncoder(_FixedGraphEncoder):
    """:class:`GNNEncoder` over the fully connected graph of the layers (no virtual nodes).

    Shapes:
        - input: ``(N, num_layers, hidden_in)``
        - output: ``(N, hidden_dim)``
    """

    graph_of = staticmethod(fully_connected_graph)
