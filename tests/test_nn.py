import pytest
import torch
from torch_geometric.data import Batch, Data
from torch_geometric.nn import GCNConv, global_add_pool, global_mean_pool

from ilge_search import build_aggregator
from ilge_search.encoders.configs import CayleyConfig, DeepSetConfig, FCConfig
from ilge_search.encoders.graphs import cayley_graph
from ilge_search.nn import DeepSetEncoder, LayerEncoder
from ilge_search.nn import gnn as gnn_module
from ilge_search.nn.gnn import CayleyGNNEncoder, FCGNNEncoder, GNNEncoder
from ilge_search.testing import LayerEncoderContract

# --- the contract, for every family and conv type --------------------------------------------------


class TestCayleyGIN(LayerEncoderContract):
    def make_config(self):
        return CayleyConfig(hidden_dim=16)


class TestCayleyGINDeep(LayerEncoderContract):
    num_layers = 25

    def make_config(self):
        return CayleyConfig(hidden_dim=16, gnn_layers=3, gin_mlp_layers=2, pooling="sum")


class TestCayleyGCN(LayerEncoderContract):
    def make_config(self):
        return CayleyConfig(conv_type="gcn", hidden_dim=16, gnn_layers=2)


class TestCayleyGAT(LayerEncoderContract):
    def make_config(self):
        return CayleyConfig(conv_type="gat", hidden_dim=16, gat_heads=2, gnn_layers=2)


class TestFCGIN(LayerEncoderContract):
    def make_config(self):
        return FCConfig(hidden_dim=16, gnn_layers=2)


class TestFCGCN(LayerEncoderContract):
    def make_config(self):
        return FCConfig(conv_type="gcn", hidden_dim=16, pooling="sum")


class TestFCGAT(LayerEncoderContract):
    def make_config(self):
        return FCConfig(conv_type="gat", hidden_dim=16, gat_heads=4)


class TestDeepSet(LayerEncoderContract):
    def make_config(self):
        return DeepSetConfig(hidden_dim=16)


class TestDeepSetNoHiddenLayers(LayerEncoderContract):
    def make_config(self):
        return DeepSetConfig(hidden_dim=16, pre_pooling_layers=0, post_pooling_layers=0, pooling="sum")


# --- the fast batched path equals the textbook per-sample path --------------------------------------


def textbook_forward(encoder: GNNEncoder, x: torch.Tensor) -> torch.Tensor:
    """One PyG Data per sample, Batch.from_data_list, the same convolutions, pooling over real nodes."""
    stack = encoder.gnn
    V, L, H = encoder.num_nodes, encoder.num_layers, stack.hidden_dim
    data_list = []
    for sample in x:
        h = torch.cat([stack.input_proj(sample), torch.zeros(V - L, H)])  # virtual nodes start at zero
        data_list.append(Data(x=h, edge_index=encoder.edge_index, real=torch.arange(V) < L))
    batch = Batch.from_data_list(data_list)
    h = batch.x
    for conv in stack.convs:
        if stack.conv_type == "gcn":  # ours gets a pre-normalised adjacency; the textbook conv normalises itself
            textbook_conv = GCNConv(H, H)
            textbook_conv.load_state_dict(conv.state_dict())
            h = textbook_conv(h, batch.edge_index)
        else:
            h = conv(h, batch.edge_index)
        h = torch.relu(h)
    pool = global_mean_pool if encoder.pooling == "mean" else global_add_pool
    return pool(h[batch.real], batch.batch[batch.real])


ENCODER_CASES = [
    (CayleyGNNEncoder, dict(conv_type="gin")),
    (CayleyGNNEncoder, dict(conv_type="gin", gnn_layers=3, gin_mlp_layers=2, pooling="sum")),
    (CayleyGNNEncoder, dict(conv_type="gcn")),
    (CayleyGNNEncoder, dict(conv_type="gcn", gnn_layers=2)),
    (CayleyGNNEncoder, dict(conv_type="gat", gat_heads=4)),
    (CayleyGNNEncoder, dict(conv_type="gat", gat_heads=2, gnn_layers=3)),
    (FCGNNEncoder, dict(conv_type="gin", gnn_layers=2)),
    (FCGNNEncoder, dict(conv_type="gcn", gnn_layers=2)),
    (FCGNNEncoder, dict(conv_type="gat", gnn_layers=2)),
]


@pytest.mark.parametrize("cls, hparams", ENCODER_CASES)
def test_batched_path_equals_batch_from_data_list(cls, hparams):
    num_layers = 25 if cls is CayleyGNNEncoder else 7
    torch.manual_seed(0)
    encoder = cls(num_layers, 20, hidden_dim=16, **hparams).eval()
    x = torch.randn(6, num_layers, 20)
    with torch.no_grad():
        torch.testing.assert_close(encoder(x), textbook_forward(encoder, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cls, hparams", ENCODER_CASES)
def test_scatter_path_equals_sparse_path(cls, hparams, monkeypatch):
    """Dtypes without CPU sparse kernels use edge_index scatter; both must agree."""
    torch.manual_seed(0)
    encoder = cls(13, 20, hidden_dim=16, **hparams).eval()
    x = torch.randn(5, 13, 20)
    with torch.no_grad():
        sparse = encoder(x)
        monkeypatch.setattr(gnn_module, "_SPARSE_DTYPES", ())
        encoder._graph_cache.clear()
        scatter = encoder(x)
    torch.testing.assert_close(scatter, sparse, rtol=1e-5, atol=1e-5)


def test_half_precision_module_runs_and_tracks_float32():
    torch.manual_seed(0)
    agg = build_aggregator(CayleyConfig(hidden_dim=32, gnn_layers=2), 25, 64).eval()
    x = torch.randn(4, 25, 64)
    with torch.no_grad():
        reference = agg(x)
        out = agg.to(torch.bfloat16)(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), reference, rtol=0.05, atol=0.05)


# --- virtual nodes ----------------------------------------------------------------------------------


def _node_states(encoder, x):
    """All node states (N, V, H) after the convolutions, from the textbook path."""
    stack = encoder.gnn
    V, L, H = encoder.num_nodes, encoder.num_layers, stack.hidden_dim
    h = torch.cat([stack.input_proj(x), torch.zeros(x.size(0), V - L, H)], dim=1)
    batch = Batch.from_data_list([Data(x=s, edge_index=encoder.edge_index) for s in h])
    out = batch.x
    for conv in stack.convs:
        out = torch.relu(conv(out, batch.edge_index))
    return out.view(x.size(0), V, H)


@pytest.mark.parametrize("pooling", ["mean", "sum"])
def test_virtual_nodes_are_excluded_from_pooling(pooling):
    torch.manual_seed(0)
    encoder = CayleyGNNEncoder(25, 12, hidden_dim=8, gnn_layers=2, pooling=pooling).eval()
    assert encoder.num_nodes == 48
    x = torch.randn(3, 25, 12)
    with torch.no_grad():
        states = _node_states(encoder, x)
        out = encoder(x)
    pool = (lambda t: t.mean(dim=1)) if pooling == "mean" else (lambda t: t.sum(dim=1))
    torch.testing.assert_close(out, pool(states[:, :25]), rtol=1e-5, atol=1e-5)
    assert states[:, 25:].abs().sum() > 0  # virtual nodes hold non-zero states that pooling ignored
    assert not torch.allclose(out, pool(states), atol=1e-3)


def test_virtual_nodes_carry_messages():
    """With 2 layers, cutting the virtual nodes out of the graph changes the output."""
    torch.manual_seed(0)
    encoder = CayleyGNNEncoder(7, 12, hidden_dim=8, gnn_layers=2).eval()  # 7 real + 17 virtual nodes
    x = torch.randn(2, 7, 12)
    with torch.no_grad():
        full = encoder(x)
        ei = encoder.edge_index
        encoder.edge_index = ei[:, (ei < 7).all(dim=0)]
        encoder._graph_cache.clear()
        cut = encoder(x)
    assert not torch.allclose(full, cut, atol=1e-4)


def test_virtual_nodes_start_at_zero_not_projected():
    """The input projection's bias is not given to virtual nodes: a 1-layer GIN real node sees
    exactly its real neighbours' projections."""
    torch.manual_seed(0)
    encoder = CayleyGNNEncoder(7, 4, hidden_dim=6, gnn_layers=1, pooling="sum").eval()
    with torch.no_grad():
        encoder.gnn.input_proj.bias.fill_(5.0)
        x = torch.zeros(1, 7, 4)
        conv = encoder.gnn.convs[0]
        proj = encoder.gnn.input_proj.bias
        ei = encoder.edge_index
        expected = torch.zeros(6)
        for node in range(7):
            real_neighbours = int(((ei[1] == node) & (ei[0] < 7)).sum())
            expected += torch.relu(conv.nn((1 + real_neighbours) * proj))
        torch.testing.assert_close(encoder(x)[0], expected)


# --- module conventions -------------------------------------------------------------------------------


def test_default_cayley_parameter_count():
    agg = build_aggregator(CayleyConfig(), num_layers=25, hidden_in=1024)
    trainable = sum(p.numel() for p in agg.parameters() if p.requires_grad)
    # projection 1024*256 + 256, one GIN MLP layer 256*256 + 256
    assert trainable == 328_192
    assert 300_000 <= trainable <= 600_000


def test_hyperparameters_are_stored_under_their_own_names():
    enc = CayleyGNNEncoder(
        25, 32, conv_type="gat", hidden_dim=16, gnn_layers=2, gat_heads=2, pooling="sum", dropout=0.2
    )
    assert (enc.conv_type, enc.hidden_dim, enc.gnn_layers, enc.gat_heads, enc.pooling, enc.dropout) == (
        "gat",
        16,
        2,
        2,
        "sum",
        0.2,
    )
    assert (enc.num_layers, enc.hidden_in, enc.out_dim, enc.num_nodes) == (25, 32, 16, 48)
    ds = DeepSetEncoder(5, 8, hidden_dim=4, pre_pooling_layers=2, post_pooling_layers=0)
    assert (ds.pre_pooling_layers, ds.post_pooling_layers, ds.out_dim) == (2, 0, 4)
    assert isinstance(enc, LayerEncoder) and isinstance(ds, LayerEncoder)


def test_graph_is_a_buffer_built_once():
    enc = CayleyGNNEncoder(25, 8, hidden_dim=4)
    assert "edge_index" in dict(enc.named_buffers())
    assert "edge_index" not in enc.state_dict()  # rebuilt from num_layers, not stored in checkpoints
    torch.testing.assert_close(enc.edge_index, cayley_graph(25).edge_index)
    first = enc.batched_graph(3)
    enc(torch.randn(3, 25, 8))
    enc(torch.randn(3, 25, 8))
    assert enc.batched_graph(3) is first  # cached per batch size


def test_reprs():
    expected = "CayleyGNNEncoder(25 layers -> 48 nodes, gin, hidden_dim=256, gnn_layers=1)"
    assert repr(CayleyGNNEncoder(25, 1024)) == expected
    assert (
        repr(FCGNNEncoder(7, 8, conv_type="gat", hidden_dim=16, gnn_layers=2))
        == "FCGNNEncoder(7 layers -> 7 nodes, gat, hidden_dim=16, gnn_layers=2)"
    )
    assert (
        repr(DeepSetEncoder(7, 8))
        == "DeepSetEncoder(7 layers, hidden_dim=256, pre_pooling_layers=1, post_pooling_layers=1, pooling=mean)"
    )
    assert (
        repr(CayleyGNNEncoder(7, 8, hidden_dim=16).gnn)
        == "GNNStack(8 -> 16, gin, gin_mlp_layers=1, gnn_layers=1, dropout=0.1)"
    )
    assert (
        repr(build_aggregator(CayleyConfig(), 25, 1024))
        == "Aggregator(CayleyGNNEncoder(25 layers -> 48 nodes, gin, hidden_dim=256, gnn_layers=1), out_dim=256)"
    )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(conv_type="sage"), "conv_type"),
        (dict(pooling="max"), "pooling"),
        (dict(hidden_dim=0), "hidden_dim"),
        (dict(conv_type="gat", hidden_dim=10, gat_heads=4), "divisible"),
        (dict(dropout=1.0), "dropout"),
    ],
)
def test_invalid_hyperparameters_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CayleyGNNEncoder(7, 8, **kwargs)


def test_dropout_is_active_in_train_mode_only():
    torch.manual_seed(0)
    agg = build_aggregator(CayleyConfig(hidden_dim=32, dropout=0.5), 7, 8)
    x = torch.randn(4, 7, 8)
    agg.train()
    assert not torch.allclose(agg(x), agg(x))
    agg.eval()
    torch.testing.assert_close(agg(x), agg(x))
