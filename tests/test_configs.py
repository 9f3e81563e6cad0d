import dataclasses

import pytest

from ilge_search.encoders import config_class_for, config_classes, config_from_dict
from ilge_search.encoders import configs as C


def test_seed_defaults():
    cfg = C.CayleyConfig()
    assert (cfg.conv_type, cfg.hidden_dim, cfg.gnn_layers, cfg.gin_mlp_layers, cfg.gat_heads) == ("gin", 256, 1, 1, 4)
    training = (cfg.pooling, cfg.dropout, cfg.lr, cfg.weight_decay, cfg.batch_size, cfg.epochs)
    assert training == ("mean", 0.1, 1e-3, 1e-4, 64, 50)
    assert {f.name for f in dataclasses.fields(C.FCConfig)} == {f.name for f in dataclasses.fields(C.CayleyConfig)}
    ds = C.DeepSetConfig()
    assert (ds.pre_pooling_layers, ds.post_pooling_layers) == (1, 1)


@pytest.mark.parametrize(
    "cls, kwargs, field",
    [
        (C.CayleyConfig, {"conv_type": "sage"}, "conv_type"),
        (C.FCConfig, {"pooling": "max"}, "pooling"),
        (C.CayleyConfig, {"hidden_dim": 0}, "hidden_dim"),
        (C.CayleyConfig, {"gnn_layers": -1}, "gnn_layers"),
        (C.CayleyConfig, {"dropout": 1.0}, "dropout"),
        (C.CayleyConfig, {"dropout": -0.1}, "dropout"),
        (C.DeepSetConfig, {"pre_pooling_layers": -1}, "pre_pooling_layers"),
        (C.DeepSetConfig, {"pooling": "max"}, "pooling"),
        (C.CayleyConfig, {"lr": 0}, "lr"),
        (C.MLPLastConfig, {"hidden_dim": 1.5}, "hidden_dim"),
        (C.CayleyConfig, {"conv_type": "gat", "hidden_dim": 130, "gat_heads": 4}, "hidden_dim"),
    ],
)
def test_invalid_values_name_the_field(cls, kwargs, field):
    with pytest.raises(ValueError, match=field):
        cls(**kwargs)


def test_invalid_choice_lists_allowed_values():
    with pytest.raises(ValueError, match=r"\['gin', 'gcn', 'gat'\]"):
        C.CayleyConfig(conv_type="sage")


@pytest.mark.parametrize("family", sorted(config_classes()))
def test_round_trip(family):
    cfg = config_class_for(family)()
    again = config_from_dict(cfg.to_dict())
    assert again == cfg and type(again) is type(cfg)


def test_from_dict_errors():
    with pytest.raises(ValueError, match="unknown family"):
        config_from_dict({"family": "transformer"})
    with pytest.raises(ValueError, match="unknown fields"):
        config_from_dict({"family": "cayley", "gnn_depth": 2})
