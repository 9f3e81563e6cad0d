import dataclasses
import warnings

import pytest
import torch
from torch_geometric.data import Batch, Data
from torch_geometric.nn import global_mean_pool

import ilge_search
from ilge_search import (
    Aggregator,
    PerTokenAggregator,
    build_aggregator,
    build_per_token_aggregator,
)
from ilge_search.encoders import encoder_spec, registry
from ilge_search.encoders.configs import CayleyConfig, DeepSetConfig, FCConfig, LastLayerConfig, MLPLastConfig
from ilge_search.nn import LayerEncoder

L, D = 7, 12


@pytest.mark.parametrize("config", [CayleyConfig(hidden_dim=16), FCConfig(hidden_dim=32), DeepSetConfig(hidden_dim=8)])
def test_build_aggregator_exposes_sizes_and_config(config):
    agg = build_aggregator(config, num_layers=L, hidden_in=D)
    assert isinstance(agg, Aggregator) and isinstance(agg.encoder, LayerEncoder)
    assert (agg.num_layers, agg.hidden_in, agg.out_dim) == (L, D, config.hidden_dim)
    assert agg.config is config
    assert agg(torch.randn(3, L, D)).shape == (3, config.hidden_dim)


def test_public_names_are_importable_from_the_package():
    for name in [
        "build_aggregator",
        "build_per_token_aggregator",
        "Aggregator",
        "PerTokenAggregator",
        "num_layers_for",
        "hidden_size_for",
        "suggest_config",
        "recommended_config",
    ]:
        assert callable(getattr(ilge_search, name))


def test_baseline_families_dispatch_to_their_spec(monkeypatch):
    calls = []

    class Probe(LayerEncoder):
        def __init__(self, num_layers, hidden_in):
            super().__init__(num_layers, hidden_in)
            self.out_dim = hidden_in

        def reset_parameters(self):
            pass

        def forward(self, x):
            return x[:, -1]

    def fake_build(config, num_layers, hidden_in):
        calls.append((config, num_layers, hidden_in))
        return Probe(num_layers, hidden_in)

    spec = encoder_spec("last-layer")
    monkeypatch.setitem(registry._SPECS, spec.name, dataclasses.replace(spec, build=fake_build))
    config = LastLayerConfig()
    agg = build_aggregator(config, L, D)
    assert calls == [(config, L, D)]
    x = torch.randn(2, L, D)
    torch.testing.assert_close(agg(x), x[:, -1])


def test_real_baseline_is_wrapped():
    agg = build_aggregator(MLPLastConfig(hidden_dim=16), L, D)
    assert isinstance(agg.encoder, LayerEncoder)
    assert agg(torch.randn(2, L, D)).shape == (2, agg.out_dim)


@pytest.mark.parametrize(
    "shape",
    [(4, L + 1, D), (4, L, D - 1), (L, D), (2, 4, L, D), (4, L - 1, D + 1)],
)
def test_wrong_shape_states_expected_and_received(shape):
    agg = build_aggregator(CayleyConfig(hidden_dim=8), L, D)
    got = "(" + ", ".join(map(str, shape)) + ")"
    with pytest.raises(ValueError) as info:
        agg(torch.randn(*shape))
    message = str(info.value)
    assert f"expected input of shape (N, {L}, {D})" in message and f"got {got}" in message


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.float64, torch.complex64])
def test_other_dtypes_are_rejected(dtype):
    agg = build_aggregator(DeepSetConfig(hidden_dim=8), L, D)
    with pytest.raises(ValueError, match="float32, float16, bfloat16"):
        agg(torch.zeros(2, L, D, dtype=dtype))


def test_non_tensor_input_is_rejected():
    agg = build_aggregator(CayleyConfig(hidden_dim=8), L, D)
    with pytest.raises(ValueError, match=r"torch.Tensor"):
        agg([[0.0] * D] * L)


def test_double_module_accepts_its_own_dtype():
    agg = build_aggregator(CayleyConfig(hidden_dim=8), L, D).double()
    out = agg(torch.randn(2, L, D, dtype=torch.float64))
    assert out.dtype == torch.float64
    assert agg(torch.randn(2, L, D)).dtype == torch.float64  # float32 input cast up


@pytest.mark.parametrize(
    "args, match",
    [
        ((CayleyConfig(), 0, D), "num_layers"),
        ((CayleyConfig(), L, -1), "hidden_in"),
        ((CayleyConfig(), 7.0, D), "num_layers"),
        (({"family": "cayley"}, L, D), "config must be"),
    ],
)
def test_bad_build_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        build_aggregator(*args)


def test_empty_batch():
    agg = build_aggregator(CayleyConfig(hidden_dim=8), L, D)
    assert agg(torch.randn(0, L, D)).shape == (0, 8)


# --- per-token aggregator ------------------------------------------------------------------------------

B, T = 3, 5


def _per_token(conv_type="gin", output_mode="per_token", family=CayleyConfig, **kw):
    torch.manual_seed(0)
    config = family(conv_type=conv_type, hidden_dim=16, **kw)
    return build_per_token_aggregator(config, num_layers=L, hidden_in=D, output_mode=output_mode)


@pytest.mark.parametrize("output_mode, shape", [("per_token", (B, T, 16)), ("sequence", (B, 16))])
@pytest.mark.parametrize("conv_type", ["gin", "gcn", "gat"])
@pytest.mark.parametrize("family", [CayleyConfig, FCConfig])
def test_per_token_shapes_and_gradients(output_mode, shape, conv_type, family):
    agg = _per_token(conv_type, output_mode, family, gnn_layers=2)
    assert isinstance(agg, PerTokenAggregator) and agg.out_dim == 16
    out = agg(torch.randn(B, T, L, D, dtype=torch.bfloat16))
    assert out.shape == shape and out.dtype == torch.float32
    (out * torch.randn_like(out)).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in agg.parameters())


def test_per_token_graph_covers_all_token_layer_nodes():
    agg = _per_token()
    graph = agg.graph_for(T)
    assert graph.num_real == T * L == 35 and graph.num_nodes == 48  # SL(2, Z_4)
    assert agg.graph_for(T) is graph  # cached per sequence length
    assert agg.graph_for(T + 1).num_real == (T + 1) * L


@pytest.mark.parametrize("conv_type", ["gin", "gcn", "gat"])
@pytest.mark.parametrize("output_mode", ["per_token", "sequence"])
def test_padding_changes_nothing(conv_type, output_mode):
    agg = _per_token(conv_type, output_mode, gnn_layers=2).eval()
    x = torch.randn(B, T, L, D)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[0, 3:] = 0  # right padding
    mask[1, :2] = 0  # left padding
    noisy = x.clone()
    noisy[mask == 0] = 100 * torch.randn_like(noisy[mask == 0])
    with torch.no_grad():
        out, out_noisy = agg(x, attention_mask=mask), agg(noisy, attention_mask=mask)
        unmasked = agg(x)
    torch.testing.assert_close(out_noisy, out)
    torch.testing.assert_close(out[2], unmasked[2])  # an unpadded sample is unaffected by others' masks
    assert not torch.allclose(out[0], unmasked[0], atol=1e-4)  # the mask did cut sample 0's graph
    if output_mode == "per_token":
        assert out[mask == 0].abs().sum() == 0  # padding positions are zero


def test_masked_sample_equals_textbook_subgraph():
    """Padding nodes are cut out of the sample's graph: same as a per-sample graph without their edges."""
    agg = _per_token("gin", "sequence", gnn_layers=2).eval()
    x = torch.randn(2, T, L, D)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    graph = agg.graph_for(T)
    stack = agg.gnn
    data_list = []
    for sample, sample_mask in zip(x, mask, strict=True):
        real = sample_mask.repeat_interleave(L).bool()  # (T*L,)
        valid = torch.cat([real, torch.ones(graph.num_virtual, dtype=torch.bool)])
        ei = graph.edge_index[:, valid[graph.edge_index].all(dim=0)]
        h = torch.cat([stack.input_proj(sample.reshape(T * L, D)), torch.zeros(graph.num_virtual, 16)])
        pooled = torch.cat([real, torch.zeros(graph.num_virtual, dtype=torch.bool)])
        data_list.append(Data(x=h, edge_index=ei, pooled=pooled))
    batch = Batch.from_data_list(data_list)
    h = batch.x
    with torch.no_grad():
        for conv in stack.convs:
            h = torch.relu(conv(h, batch.edge_index))
        expected = global_mean_pool(h[batch.pooled], batch.batch[batch.pooled])
        torch.testing.assert_close(agg(x, attention_mask=mask), expected, rtol=1e-5, atol=1e-5)


def test_sequence_pooling_is_the_mean_of_real_token_outputs():
    per_token = _per_token("gcn", "per_token").eval()
    sequence = _per_token("gcn", "sequence").eval()
    sequence.load_state_dict(per_token.state_dict())
    x = torch.randn(B, T, L, D)
    mask = torch.ones(B, T)
    mask[0, 4:] = 0
    with torch.no_grad():
        tokens = per_token(x, attention_mask=mask)
        expected = tokens.sum(dim=1) / mask.sum(dim=1, keepdim=True)
        torch.testing.assert_close(sequence(x, attention_mask=mask), expected)


def test_per_token_batch_independence_with_masks():
    agg = _per_token("gat", "per_token").eval()
    x = torch.randn(4, T, L, D)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [0, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    with torch.no_grad():
        full = agg(x, attention_mask=mask)
        singles = torch.cat([agg(x[i : i + 1], attention_mask=mask[i : i + 1]) for i in range(4)])
    torch.testing.assert_close(singles, full, rtol=1e-4, atol=1e-5)


def test_warns_above_2000_nodes():
    agg = build_per_token_aggregator(CayleyConfig(hidden_dim=8), num_layers=25, hidden_in=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        agg(torch.randn(1, 80, 25, 4))  # 2,000 nodes: no warning
    with pytest.warns(UserWarning, match="2025 nodes"):
        agg(torch.randn(1, 81, 25, 4))


@pytest.mark.parametrize(
    "x_shape, mask, match",
    [
        ((B, T, L + 1, D), None, r"expected input of shape \(B, T, 7, 12\).*got \(3, 5, 8, 12\)"),
        ((B, L, D), None, r"got \(3, 7, 12\)"),
        ((B, 0, L, D), None, "T >= 1"),
        ((B, T, L, D), torch.ones(B, T + 1), r"attention_mask must have shape \(B, T\) = \(3, 5\)"),
        ((B, T, L, D), torch.full((B, T), 2), "0/1"),
        ((B, T, L, D), torch.tensor([[1] * T, [0] * T, [1] * T]), r"no real token in sample\(s\) \[1\]"),
    ],
)
def test_per_token_bad_input(x_shape, mask, match):
    agg = _per_token()
    with pytest.raises(ValueError, match=match):
        agg(torch.randn(*x_shape), attention_mask=mask)


def test_per_token_bad_arguments():
    with pytest.raises(ValueError, match="graph family"):
        build_per_token_aggregator(DeepSetConfig(), L, D)
    with pytest.raises(ValueError, match="output_mode"):
        build_per_token_aggregator(CayleyConfig(), L, D, output_mode="tokens")
    with pytest.raises(ValueError, match="num_layers"):
        build_per_token_aggregator(CayleyConfig(), 0, D)


def test_per_token_repr():
    agg = build_per_token_aggregator(CayleyConfig(conv_type="gcn", gnn_layers=2), 37, 4096, output_mode="sequence")
    assert repr(agg) == (
        "PerTokenAggregator(cayley, gcn, num_layers=37, hidden_dim=256, gnn_layers=2, output_mode='sequence')"
    )
