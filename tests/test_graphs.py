from collections import deque
from fractions import Fraction

import numpy as np
import pytest
import torch

from ilge_search.encoders.graphs import (
    GENERATORS,
    cayley_graph,
    cayley_modulus_for,
    fully_connected_graph,
    sl2_elements,
    sl2_order,
)

KNOWN_ORDERS = {2: 6, 3: 24, 4: 48, 5: 120, 6: 144, 7: 336, 8: 384, 9: 648, 10: 720}


def _formula(n):
    primes = [p for p in range(2, n + 1) if n % p == 0 and all(p % q for q in range(2, p))]
    value = Fraction(n**3)
    for p in primes:
        value *= 1 - Fraction(1, p * p)
    return value


@pytest.mark.parametrize("n", range(2, 11))
def test_group_order_matches_formula_and_enumeration(n):
    assert _formula(n) == sl2_order(n) == KNOWN_ORDERS[n]
    elems = sl2_elements(n)
    assert elems.shape == (sl2_order(n), 4)
    a, b, c, d = elems.T
    assert np.all((a * d - b * c) % n == 1)
    assert np.all((elems >= 0) & (elems < n))
    assert len({tuple(row) for row in elems.tolist()}) == len(elems)  # distinct matrices
    assert tuple(elems[0]) == (1, 0, 0, 1)  # node 0 (the embedding layer) is the identity


@pytest.mark.parametrize(
    "num_layers, num_nodes",
    [(1, 6), (6, 6), (7, 24), (13, 24), (23, 24), (24, 24), (25, 48), (31, 48), (33, 48), (37, 48), (49, 120)],
)
def test_smallest_group_with_enough_nodes(num_layers, num_nodes):
    graph = cayley_graph(num_layers)
    assert graph.num_nodes == num_nodes
    assert graph.num_real == num_layers and graph.num_virtual == num_nodes - num_layers
    n = graph.modulus
    assert sl2_order(n) >= num_layers and (n == 2 or sl2_order(n - 1) < num_layers)
    assert cayley_modulus_for(num_layers) == n


def _adjacency_sets(graph):
    neighbours = [set() for _ in range(graph.num_nodes)]
    for s, t in graph.edge_index.t().tolist():
        neighbours[s].add(t)
    return neighbours


def _connected(graph):
    neighbours = _adjacency_sets(graph)
    seen, queue = {0}, deque([0])
    while queue:
        for v in neighbours[queue.popleft()] - seen:
            seen.add(v)
            queue.append(v)
    return len(seen) == graph.num_nodes


@pytest.mark.parametrize("num_layers", [7, 25, 100, 200, 400, 500])  # n = 3, 4, 5, 7, 9, 10
def test_cayley_graph_is_simple_symmetric_connected_4_regular(num_layers):
    graph = cayley_graph(num_layers)
    ei = graph.edge_index
    assert ei.dtype == torch.long and ei.shape == (2, 4 * graph.num_nodes)
    pairs = [tuple(p) for p in ei.t().tolist()]
    assert len(set(pairs)) == len(pairs), "duplicated edges"
    assert all(s != t for s, t in pairs), "self-loops"
    assert set(pairs) == {(t, s) for s, t in pairs}, "not symmetric"
    assert graph.degrees().tolist() == [4] * graph.num_nodes
    assert _connected(graph)


def test_n2_graph_is_simple_with_degree_2():
    graph = cayley_graph(5)  # SL(2, Z_2): A == A^-1 and B == B^-1, duplicates must be merged
    pairs = [tuple(p) for p in graph.edge_index.t().tolist()]
    assert graph.num_nodes == 6 and len(set(pairs)) == len(pairs) == 12
    assert graph.degrees().tolist() == [2] * 6
    assert _connected(graph)


@pytest.mark.parametrize("num_layers", [7, 25, 130])
def test_edges_are_right_multiplication_by_the_generators(num_layers):
    graph = cayley_graph(num_layers)
    n = graph.modulus
    elems = [tuple(row) for row in sl2_elements(n).tolist()]
    index = {g: i for i, g in enumerate(elems)}
    neighbours = _adjacency_sets(graph)
    for i, (a, b, c, d) in enumerate(elems):
        expected = set()
        for ga, gb, gc, gd in GENERATORS:
            prod = ((a * ga + b * gc) % n, (a * gb + b * gd) % n, (c * ga + d * gc) % n, (c * gb + d * gd) % n)
            expected.add(index[prod])
        assert neighbours[i] == expected


def test_layers_follow_breadth_first_order_from_the_identity():
    graph = cayley_graph(37)
    neighbours = _adjacency_sets(graph)
    dist = {0: 0}
    queue = deque([0])
    while queue:
        u = queue.popleft()
        for v in sorted(neighbours[u]):
            if v not in dist:
                dist[v] = dist[u] + 1
                queue.append(v)
    hops = [dist[i] for i in range(graph.num_nodes)]
    assert hops == sorted(hops)  # real layers are the nodes closest to the identity
    assert hops[:5] == [0, 1, 1, 1, 1]


@pytest.mark.parametrize("num_layers", [1, 2, 7, 25])
def test_fully_connected_graph(num_layers):
    graph = fully_connected_graph(num_layers)
    pairs = {tuple(p) for p in graph.edge_index.t().tolist()}
    assert graph.num_nodes == graph.num_real == num_layers and graph.num_virtual == 0
    assert pairs == {(i, j) for i in range(num_layers) for j in range(num_layers) if i != j}
    assert graph.num_edges == num_layers * (num_layers - 1)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "7"])
def test_invalid_sizes_raise(bad):
    with pytest.raises(ValueError):
        cayley_graph(bad)
    with pytest.raises(ValueError):
        fully_connected_graph(bad)


def test_invalid_modulus_raises():
    with pytest.raises(ValueError, match="n must be an integer >= 2"):
        sl2_order(1)


def test_repr():
    assert repr(cayley_graph(25)) == "LayerGraph(cayley, SL(2, Z_4), num_nodes=48, num_real=25, num_edges=192)"
    assert repr(fully_connected_graph(3)) == "LayerGraph(fc, num_nodes=3, num_real=3, num_edges=6)"
