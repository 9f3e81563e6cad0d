"""The fixed graphs ILGE encoders pass messages over.

Cayley graph of SL(2, Z_n)
--------------------------
The nodes are the 2x2 integer matrices with determinant 1 modulo ``n``; there
are ``n^3 * prod_{p | n} (1 - 1/p^2)`` of them (6, 24, 48, 120, 144, ... for
n = 2, 3, 4, 5, 6, ...). Node ``g`` is joined to ``g @ s`` for the four
generators ``s`` in ``A = [[1, 1], [0, 1]]``, ``B = [[1, 0], [1, 1]]``,
``A^-1`` and ``B^-1``. The generating set is closed under inverses, so the
graph is undirected; the edge list stores every neighbouring pair exactly once
per direction, without self-loops. For ``n >= 3`` the four products are
distinct and every node has exactly 4 neighbours; for ``n = 2`` ``A == A^-1``
and ``B == B^-1``, so nodes have 2 neighbours.

``n`` is the smallest value with ``|SL(2, Z_n)| >= num_layers`` (25 layers ->
n = 4, 48 nodes; 37 layers -> 48 nodes as well).

How layers are assigned to nodes
--------------------------------
Nodes are numbered in breadth-first order from the identity matrix, exploring
the generators in the order ``A, B, A^-1, B^-1``. Layer ``i`` (0 = the
embedding layer, ``num_layers - 1`` = the last hidden layer) is node ``i``.
So the embedding layer sits at the identity, consecutive layers stay within a
few hops of each other, and the nodes ``num_layers .. num_nodes - 1`` (the
ones furthest from the identity in BFS order) are *virtual*: encoders start
them at zero, let them carry messages, and leave them out of pooling.

For the per-token aggregator the same construction is used with
``num_real = seq_len * num_layers`` real nodes, token-major: the node of
(token ``t``, layer ``l``) is ``t * num_layers + l``.

Fully connected graph
---------------------
``fully_connected_graph(num_layers)`` joins every ordered pair of distinct
layers (no self-loops, no virtual nodes), ``L * (L - 1)`` directed edges.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from ..validation import check_int

__all__ = [
    "LayerGraph",
    "sl2_order",
    "sl2_elements",
    "cayley_modulus_for",
    "cayley_graph",
    "fully_connected_graph",
    "GENERATORS",
]

# A, B, A^-1, B^-1 as (a, b, c, d) for the matrix [[a, b], [c, d]] over the integers.
GENERATORS: tuple[tuple[int, int, int, int], ...] = (
    (1, 1, 0, 1),
    (1, 0, 1, 1),
    (1, -1, 0, 1),
    (1, 0, -1, 1),
)


@dataclass(frozen=True, eq=False)
class LayerGraph:
    """A fixed graph whose first ``num_real`` nodes hold real inputs.

    Attributes:
        edge_index: ``(2, E)`` int64, row 0 = source, row 1 = target; sorted,
            symmetric, without duplicates or self-loops.
        num_nodes: all nodes, virtual ones included.
        num_real: nodes ``0 .. num_real - 1`` are real; the rest are virtual.
        kind: ``"cayley"`` or ``"fc"``.
        modulus: ``n`` of SL(2, Z_n) for Cayley graphs, else ``None``.
    """

    edge_index: torch.Tensor
    num_nodes: int
    num_real: int
    kind: str
    modulus: int | None = None

    @property
    def num_virtual(self) -> int:
        return self.num_nodes - self.num_real

    @property
    def num_edges(self) -> int:
        return int(self.edge_index.size(1))

    def degrees(self) -> torch.Tensor:
        return torch.bincount(self.edge_index[0], minlength=self.num_nodes)

    def __repr__(self) -> str:
        group = f", SL(2, Z_{self.modulus})" if self.modulus is not None else ""
        return (
            f"LayerGraph({self.kind}{group}, num_nodes={self.num_nodes}, "
            f"num_real={self.num_real}, num_edges={self.num_edges})"
        )


def _prime_factors(n: int) -> list[int]:
    factors, p = [], 2
    while p * p <= n:
        if n % p == 0:
            factors.append(p)
            while n % p == 0:
                n //= p
        p += 1
    if n > 1:
        factors.append(n)
    return factors


def sl2_order(n: int) -> int:
    """``|SL(2, Z_n)| = n^3 * prod_{p | n} (1 - 1/p^2)`` in exact integer arithmetic."""
    check_int("n", n, minimum=2)
    order = n**3
    for p in _prime_factors(n):
        order = order // (p * p) * (p * p - 1)
    return order


def cayley_modulus_for(num_nodes: int) -> int:
    """Smallest ``n >= 2`` with ``|SL(2, Z_n)| >= num_nodes``."""
    check_int("num_nodes", num_nodes)
    n = 2
    while sl2_order(n) < num_nodes:
        n += 1
    return n


def _multiply(elems: np.ndarray, gen: tuple[int, int, int, int], n: int) -> np.ndarray:
    """Right-multiply every matrix in ``elems`` (K, 4) by ``gen`` modulo n."""
    a, b, c, d = elems.T
    ga, gb, gc, gd = gen
    return np.stack([a * ga + b * gc, a * gb + b * gd, c * ga + d * gc, c * gb + d * gd], axis=1) % n


def _encode(elems: np.ndarray, n: int) -> np.ndarray:
    a, b, c, d = elems.T
    return ((a * n + b) * n + c) * n + d


@lru_cache(maxsize=32)
def _sl2_bfs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Elements (K, 4) in BFS order from the identity, and the (K, 4) neighbour table."""
    identity = np.array([[1, 0, 0, 1]], dtype=np.int64) % n
    seen = np.zeros(n**4, dtype=bool)
    seen[_encode(identity, n)] = True
    order, frontier = [identity], identity
    while len(frontier):
        # candidates in (parent order, generator order), first occurrence wins
        cand = np.stack([_multiply(frontier, g, n) for g in GENERATORS], axis=1).reshape(-1, 4)
        codes = _encode(cand, n)
        _, first = np.unique(codes, return_index=True)
        first.sort()
        cand, codes = cand[first], codes[first]
        new = ~seen[codes]
        frontier = cand[new]
        seen[codes[new]] = True
        if len(frontier):
            order.append(frontier)
    elems = np.concatenate(order)
    codes = _encode(elems, n)
    sorter = np.argsort(codes)
    neighbours = np.stack(
        [sorter[np.searchsorted(codes, _encode(_multiply(elems, g, n), n), sorter=sorter)] for g in GENERATORS],
        axis=1,
    )
    elems.setflags(write=False)
    neighbours.setflags(write=False)
    return elems, neighbours


def sl2_elements(n: int) -> np.ndarray:
    """All of SL(2, Z_n) as ``(K, 4)`` rows ``(a, b, c, d)``, numbered as the graph's nodes."""
    sl2_order(n)  # validates n
    return _sl2_bfs(n)[0]


def _simple_edge_index(src: np.ndarray, dst: np.ndarray, num_nodes: int) -> torch.Tensor:
    keep = src != dst
    codes = np.unique(src[keep].astype(np.int64) * num_nodes + dst[keep])  # sorted, deduplicated
    return torch.from_numpy(np.stack([codes // num_nodes, codes % num_nodes])).long()


def cayley_graph(num_real: int) -> LayerGraph:
    """Cayley graph of the smallest SL(2, Z_n) with at least ``num_real`` nodes (see module docs)."""
    n = cayley_modulus_for(num_real)
    elems, neighbours = _sl2_bfs(n)
    num_nodes = len(elems)
    src = np.repeat(np.arange(num_nodes), len(GENERATORS))
    edge_index = _simple_edge_index(src, neighbours.reshape(-1), num_nodes)
    return LayerGraph(edge_index, num_nodes=num_nodes, num_real=num_real, kind="cayley", modulus=n)


def fully_connected_graph(num_real: int) -> LayerGraph:
    """Every ordered pair of distinct nodes, no virtual nodes."""
    check_int("num_real", num_real)
    src, dst = np.meshgrid(np.arange(num_real), np.arange(num_real), indexing="ij")
    edge_index = _simple_edge_index(src.reshape(-1), dst.reshape(-1), num_real)
    return LayerGraph(edge_index, num_nodes=num_real, num_real=num_real, kind="fc")
