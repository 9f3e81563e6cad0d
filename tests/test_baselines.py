import pytest
import torch

from ilge_search.encoders import baseline_families, config_class_for
from ilge_search.encoders import configs as C
from ilge_search.nn.baselines import BestLayer, LastLayer, MeanLayers, MLPLast, ScalarMix, build_baseline
from ilge_search.testing import LayerEncoderContract

L, D = 7, 12


@pytest.fixture()
def x():
    return torch.randn(5, L, D, generator=torch.Generator().manual_seed(0))


def test_last_layer_returns_the_last_layer(x):
    enc = LastLayer(L, D)
    assert enc.out_dim == D
    assert torch.equal(enc(x), x[:, -1])
    assert sum(p.numel() for p in enc.parameters()) == 0
    assert repr(enc) == "LastLayer(num_layers=7, hidden_in=12)"


@pytest.mark.parametrize("layer, index", [(0, 0), (3, 3), (-1, 6), (-7, 0)])
def test_best_layer_returns_the_chosen_layer(x, layer, index):
    enc = BestLayer(L, D, layer=layer)
    assert enc.layer == index
    assert torch.equal(enc(x), x[:, index])
    assert repr(enc) == f"BestLayer(num_layers=7, hidden_in=12, layer={index})"


@pytest.mark.parametrize("layer", [7, -8, 100])
def test_best_layer_rejects_out_of_range_layer(layer):
    with pytest.raises(ValueError, match=r"out of range .*\[-7, 6\]"):
        BestLayer(L, D, layer=layer)


def test_best_layer_config_without_layer_cannot_be_built():
    with pytest.raises(ValueError, match="select_best_layer"):
        build_baseline(C.BestLayerConfig(), L, D)
    with pytest.raises(ValueError, match="out of range"):
        build_baseline(C.BestLayerConfig(layer=9), L, D)


def test_mean_layers_is_the_mean(x):
    enc = MeanLayers(L, D)
    torch.testing.assert_close(enc(x), x.mean(dim=1))
    assert repr(enc) == "MeanLayers(num_layers=7, hidden_in=12)"


def test_scalar_mix_starts_uniform_and_learns_weights(x):
    enc = ScalarMix(L, D)
    assert repr(enc) == "ScalarMix(num_layers=7, hidden_in=12)"
    torch.testing.assert_close(enc.layer_weights(), torch.full((L,), 1.0 / L))
    assert enc.gamma.item() == 1.0
    torch.testing.assert_close(enc(x), x.mean(dim=1))  # uniform mix with gamma 1 == mean
    with torch.no_grad():
        enc.layer_logits.copy_(torch.tensor([0.0] * (L - 1) + [50.0]))
        enc.gamma.fill_(2.0)
    torch.testing.assert_close(enc(x), 2.0 * x[:, -1])
    enc.reset_parameters()
    torch.testing.assert_close(enc(x), x.mean(dim=1))
    assert sum(p.numel() for p in enc.parameters()) == L + 1


def test_scalar_mix_gradients_reach_the_weights(x):
    enc = ScalarMix(L, D)
    enc(x).pow(2).sum().backward()
    assert enc.layer_logits.grad is not None and enc.layer_logits.grad.abs().sum() > 0
    assert enc.gamma.grad is not None and enc.gamma.grad.abs().sum() > 0


def test_mlp_last_reads_only_the_last_layer(x):
    torch.manual_seed(0)
    enc = MLPLast(L, D, hidden_dim=16, mlp_layers=2, dropout=0.0)
    assert enc.out_dim == 16
    assert repr(enc) == "MLPLast(num_layers=7, hidden_in=12, hidden_dim=16, mlp_layers=2)"
    linears = [m for m in enc.mlp if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(12, 16), (16, 16)]
    changed = x.clone()
    changed[:, :-1] = 0.0  # every layer but the last
    torch.testing.assert_close(enc(changed), enc(x))
    assert (enc(x) >= 0).all()  # ReLU output


def test_mlp_last_reset_parameters_reinitialises():
    torch.manual_seed(0)
    enc = MLPLast(L, D, hidden_dim=8)
    before = enc.mlp[0].weight.clone()
    enc.reset_parameters()
    assert not torch.equal(before, enc.mlp[0].weight)


def test_dropout_only_in_training(x):
    enc = LastLayer(L, D, dropout=0.5)
    enc.eval()
    assert torch.equal(enc(x), x[:, -1])
    enc.train()
    torch.manual_seed(0)
    assert not torch.equal(enc(x), x[:, -1])


@pytest.mark.parametrize(
    "config, cls, out_dim",
    [
        (C.LastLayerConfig(), LastLayer, D),
        (C.BestLayerConfig(layer=-2), BestLayer, D),
        (C.MeanLayersConfig(), MeanLayers, D),
        (C.ScalarMixConfig(), ScalarMix, D),
        (C.MLPLastConfig(hidden_dim=32, mlp_layers=1), MLPLast, 32),
    ],
)
def test_build_baseline_maps_every_baseline_family(config, cls, out_dim, x):
    enc = build_baseline(config, L, D)
    assert type(enc) is cls
    assert enc.out_dim == out_dim
    assert enc(x).shape == (5, out_dim)


def test_build_baseline_rejects_encoder_families():
    with pytest.raises(ValueError, match="not a baseline"):
        build_baseline(C.CayleyConfig(), L, D)


def test_every_baseline_family_is_covered():
    built = set()
    for family in baseline_families():
        config = config_class_for(family)()
        if family == "best-layer":
            config = config.replace(layer=0)
        built.add(build_baseline(config, L, D).__class__)
    assert len(built) == len(baseline_families())


# --------------------------------------------------------------------------- the encoder contract


class TestLastLayerContract(LayerEncoderContract):
    def make_config(self):
        return C.LastLayerConfig()


class TestBestLayerContract(LayerEncoderContract):
    def make_config(self):
        return C.BestLayerConfig(layer=-3)


class TestMeanLayersContract(LayerEncoderContract):
    def make_config(self):
        return C.MeanLayersConfig()


class TestScalarMixContract(LayerEncoderContract):
    def make_config(self):
        return C.ScalarMixConfig()


class TestMLPLastContract(LayerEncoderContract):
    def make_config(self):
        return C.MLPLastConfig(hidden_dim=16, mlp_layers=2)


class TestMLPLastWithDropoutContract(LayerEncoderContract):
    def make_config(self):
        return C.MLPLastConfig(hidden_dim=8, mlp_layers=1, dropout=0.3)
