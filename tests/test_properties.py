"""Property tests (hypothesis) for the aggregators: what must hold for every input, not one example.

- batch independence: in eval mode a sample's output does not depend on the other samples in its batch;
- padding: per-token and sequence outputs ignore whatever sits at padded positions;
- symmetry: relabelling the Cayley graph's virtual nodes changes nothing, and the encoders that treat the
  layers as a set (DeepSet, GNN over the fully connected graph) ignore the order of the layers.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ilge_search import build_aggregator, build_per_token_aggregator
from ilge_search.encoders.configs import CayleyConfig, DeepSetConfig, FCConfig
from ilge_search.encoders.graphs import LayerGraph, cayley_graph
from ilge_search.nn.gnn import GNNEncoder, GNNStackSettings

PROPERTY = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TOLERANCE = dict(rtol=1e-4, atol=1e-5)
CONVS = st.sampled_from(["gin", "gcn", "gat"])
POOLINGS = st.sampled_from(["mean", "sum"])


def _graph_config(family: str, conv_type: str, pooling: str, gnn_layers: int):
    cls = CayleyConfig if family == "cayley" else FCConfig
    return cls(conv_type=conv_type, hidden_dim=8, gnn_layers=gnn_layers, pooling=pooling, dropout=0.3)


def _seeded_eval(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    module.reset_parameters()
    return module.eval()


@st.composite
def encoder_configs(draw):
    family = draw(st.sampled_from(["cayley", "fc", "deepset"]))
    if family == "deepset":
        return DeepSetConfig(
            hidden_dim=8,
            pre_pooling_layers=draw(st.integers(0, 2)),
            post_pooling_layers=draw(st.integers(0, 2)),
            pooling=draw(POOLINGS),
            dropout=0.3,
        )
    return _graph_config(family, draw(CONVS), draw(POOLINGS), draw(st.integers(1, 2)))


@PROPERTY
@given(config=encoder_configs(), num_layers=st.integers(1, 9), batch=st.integers(2, 6), seed=st.integers(0, 2**16))
def test_eval_outputs_do_not_depend_on_the_rest_of_the_batch(config, num_layers, batch, seed):
    agg = _seeded_eval(build_aggregator(config, num_layers, 5), seed)
    x = torch.randn(batch, num_layers, 5, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        together = agg(x)
        alone = torch.cat([agg(x[i : i + 1]) for i in range(batch)])
        shuffled = torch.randperm(batch, generator=torch.Generator().manual_seed(seed + 1))
        reordered = agg(x[shuffled])
    torch.testing.assert_close(together, alone, **TOLERANCE)
    torch.testing.assert_close(reordered, together[shuffled], **TOLERANCE)


@st.composite
def padded_batches(draw):
    """Token embeddings, a 0/1 mask with at least one real token per row, and garbage for the padding."""
    batch, seq_len = draw(st.integers(1, 3)), draw(st.integers(1, 5))
    lengths = draw(st.lists(st.integers(1, seq_len), min_size=batch, max_size=batch))
    mask = torch.tensor([[1] * n + [0] * (seq_len - n) for n in lengths])
    # padding is not always at the end: rotate each row by a drawn amount
    shifts = draw(st.lists(st.integers(0, seq_len - 1), min_size=batch, max_size=batch))
    mask = torch.stack([row.roll(shift) for row, shift in zip(mask, shifts, strict=True)])
    return mask, draw(st.integers(0, 2**16))


@PROPERTY
@given(
    family=st.sampled_from(["cayley", "fc"]),
    conv_type=CONVS,
    pooling=POOLINGS,
    output_mode=st.sampled_from(["per_token", "sequence"]),
    padded=padded_batches(),
    garbage_scale=st.sampled_from([0.0, 1.0, 1e3]),
)
def test_per_token_outputs_ignore_padded_positions(family, conv_type, pooling, output_mode, padded, garbage_scale):
    mask, seed = padded
    L, D = 3, 4
    agg = _seeded_eval(
        build_per_token_aggregator(_graph_config(family, conv_type, pooling, 2), L, D, output_mode=output_mode), seed
    )
    generator = torch.Generator().manual_seed(seed)
    B, T = mask.shape
    x = torch.randn(B, T, L, D, generator=generator)
    garbage = garbage_scale * torch.randn(B, T, L, D, generator=generator)
    padded_x = torch.where(mask.bool()[:, :, None, None], x, garbage)
    with torch.no_grad():
        clean = agg(x, mask)
        noisy = agg(padded_x, mask)
        # each sample alone, cut down to its real tokens, without any mask; for the fully connected graph
        # that is the same graph as the masked one (a Cayley graph of fewer nodes is a different graph)
        alone = [agg(x[i : i + 1, mask[i].bool()]) for i in range(B)]
    torch.testing.assert_close(noisy, clean, **TOLERANCE)
    for i in range(B):
        real = mask[i].bool()
        if output_mode == "per_token":
            assert torch.count_nonzero(clean[i, ~real]) == 0
        if family == "fc":
            torch.testing.assert_close(
                clean[i, real] if output_mode == "per_token" else clean[i], alone[i][0], **TOLERANCE
            )


def _relabel_virtual(graph: LayerGraph, permutation: torch.Tensor) -> LayerGraph:
    """The same graph with virtual node ``num_real + i`` renamed ``num_real + permutation[i]``."""
    mapping = torch.cat([torch.arange(graph.num_real), graph.num_real + permutation])
    edges = mapping[graph.edge_index]
    order = torch.argsort(edges[0] * graph.num_nodes + edges[1])  # keep the documented sorted edge order
    return LayerGraph(edges[:, order].contiguous(), graph.num_nodes, graph.num_real, graph.kind, graph.modulus)


@PROPERTY
@given(
    num_layers=st.sampled_from([5, 7, 13, 25]),
    conv_type=CONVS,
    pooling=POOLINGS,
    gnn_layers=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_relabelling_cayley_virtual_nodes_changes_nothing(num_layers, conv_type, pooling, gnn_layers, seed):
    graph = cayley_graph(num_layers)
    assert graph.num_virtual > 0  # 5, 7, 13 and 25 layers all leave virtual nodes in SL(2, Z_n)
    permutation = torch.randperm(graph.num_virtual, generator=torch.Generator().manual_seed(seed))
    relabelled = _relabel_virtual(graph, permutation)
    assert not torch.equal(relabelled.edge_index, graph.edge_index) or graph.num_virtual == 1
    stack = GNNStackSettings(conv_type=conv_type, hidden_dim=8, gnn_layers=gnn_layers, dropout=0.0)
    original = _seeded_eval(GNNEncoder(num_layers, 6, graph, stack, pooling), seed)
    renamed = GNNEncoder(num_layers, 6, relabelled, stack, pooling).eval()
    renamed.load_state_dict(original.state_dict())
    x = torch.randn(3, num_layers, 6, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        torch.testing.assert_close(renamed(x), original(x), **TOLERANCE)


@PROPERTY
@given(
    family=st.sampled_from(["fc", "deepset"]),
    conv_type=CONVS,
    pooling=POOLINGS,
    num_layers=st.integers(2, 9),
    seed=st.integers(0, 2**16),
)
def test_set_encoders_ignore_the_order_of_the_layers(family, conv_type, pooling, num_layers, seed):
    config = (
        DeepSetConfig(hidden_dim=8, pooling=pooling)
        if family == "deepset"
        else _graph_config("fc", conv_type, pooling, 2)
    )
    agg = _seeded_eval(build_aggregator(config, num_layers, 5), seed)
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(4, num_layers, 5, generator=generator)
    permutation = torch.randperm(num_layers, generator=generator)
    with torch.no_grad():
        torch.testing.assert_close(agg(x[:, permutation]), agg(x), **TOLERANCE)


def test_the_cayley_encoder_does_depend_on_the_order_of_the_layers():
    """The contrast to the set encoders: a sparse graph breaks layer symmetry (else the test above proves little)."""
    agg = _seeded_eval(build_aggregator(CayleyConfig(hidden_dim=8, gnn_layers=2), 7, 5), 0)
    x = torch.randn(4, 7, 5, generator=torch.Generator().manual_seed(0))
    permutation = torch.tensor([6, 0, 3, 1, 5, 2, 4])
    with torch.no_grad():
        assert not torch.allclose(agg(x[:, permutation]), agg(x), **TOLERANCE)


@pytest.mark.parametrize("family", ["cayley", "fc", "deepset"])
def test_dropout_is_active_in_train_mode(family):
    """Eval mode is what makes the batch property hold: in train mode the same input gives other outputs."""
    config = (
        DeepSetConfig(hidden_dim=8, dropout=0.5)
        if family == "deepset"
        else (CayleyConfig if family == "cayley" else FCConfig)(hidden_dim=8, dropout=0.5)
    )
    agg = build_aggregator(config, 7, 5).train()
    x = torch.randn(4, 7, 5)
    assert not torch.equal(agg(x), agg(x))
