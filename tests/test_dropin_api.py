"""Code written for the published ``ilge`` package runs unchanged on ``ilge_search``.

The published README (``../shared/spec/ilge-seed-PKG-INFO.txt``) and its documented
signatures: the examples are copied with only ``ilge`` -> ``ilge_search`` changed
(the aggregator and tuning examples of its README run in ``test_seed_readme_examples.py``).
Where the published package raises ``TypeError`` for an argument of the wrong type,
so does ``ilge_search`` (``ArgumentTypeError`` is also a ``ValueError``, for the CLI).
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch

import ilge_search
from ilge_search import (
    CayleyConfig,
    DeepSetConfig,
    FCConfig,
    ILGEClassifier,
    build_aggregator,
    build_per_token_aggregator,
    hidden_size_for,
    num_layers_for,
)
from ilge_search.validation import ArgumentTypeError


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)


def _parameters(func):
    return [(p.name, p.default) for p in inspect.signature(func).parameters.values()]


# ----------------------------------------------------------------------------- documented signatures

EMPTY = inspect.Parameter.empty


def test_published_signatures():
    assert _parameters(build_aggregator) == [("config", EMPTY), ("num_layers", EMPTY), ("hidden_in", EMPTY)]
    assert _parameters(build_per_token_aggregator) == [
        ("config", EMPTY),
        ("num_layers", EMPTY),
        ("hidden_in", EMPTY),
        ("token_pooling", "mean"),
        ("output_mode", "per_token"),
    ]
    for func in (num_layers_for, hidden_size_for):
        assert _parameters(func) == [("model_or_name", EMPTY), ("trust_remote_code", False)]
    names = [name for name, _ in _parameters(ILGEClassifier.__init__)]
    assert names[1:3] == ["base_model", "config"] and "num_classes" in names and "token_pooling" in names
    assert [n for n, _ in _parameters(ILGEClassifier.fit)][1:] == ["texts", "labels", "val_texts", "val_labels"]
    for method in ("predict", "predict_proba", "score", "save", "load", "unload_llm"):
        assert callable(getattr(ILGEClassifier, method))
    published = [
        "ILGEClassifier",
        "CayleyConfig",
        "FCConfig",
        "DeepSetConfig",
        "Aggregator",
        "PerTokenAggregator",
        "build_aggregator",
        "build_per_token_aggregator",
        "num_layers_for",
        "hidden_size_for",
    ]
    assert all(hasattr(ilge_search, name) for name in published)
    from ilge_search import tuning  # `from ilge import tuning` / `ilge.tuning.suggest_config`

    assert callable(tuning.suggest_config) and callable(tuning.recommended_config)


# ----------------------------------------------------------------------------- num_layers_for / hidden_size_for


def test_config_like_objects_and_models_with_a_config():
    config = SimpleNamespace(num_hidden_layers=24, hidden_size=1024)  # not a PretrainedConfig
    assert (num_layers_for(config), hidden_size_for(config)) == (25, 1024)
    model = SimpleNamespace(config=config)  # anything whose .config has the fields
    assert (num_layers_for(model), hidden_size_for(model)) == (25, 1024)
    assert num_layers_for(SimpleNamespace(num_hidden_layers=3)) == 4  # only the field asked for is needed


def test_a_real_transformers_model_and_config():
    from transformers import BertConfig, BertModel

    config = BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64)
    model = BertModel(config)
    assert (num_layers_for(model), hidden_size_for(model), num_layers_for(config)) == (3, 32, 3)
    assert num_layers_for("Qwen/Qwen3-8B-Base", trust_remote_code=True) == 37


@pytest.mark.parametrize("not_a_model", [3, 2.5, None, object(), ["a"], SimpleNamespace(config=None)])
def test_things_that_are_not_models_raise_type_error(not_a_model):
    for func in (num_layers_for, hidden_size_for):
        with pytest.raises(TypeError, match="num_hidden_layers"):
            func(not_a_model)
    with pytest.raises(ValueError):  # and the CLI's one-line error still catches it
        num_layers_for(not_a_model)


def test_unknown_names_stay_value_errors(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(ValueError) as info:
        num_layers_for("acme/never-published-7b")
    assert not isinstance(info.value, TypeError)


# ----------------------------------------------------------------------------- aggregators


def test_published_docstring_examples():
    # ilge.aggregator.build_aggregator's docstring
    agg = build_aggregator(CayleyConfig(), num_layers=25, hidden_in=1024)
    x = torch.randn(8, 25, 1024)
    assert agg(x).shape == torch.Size([8, 256]) and agg.out_dim == 256
    # ilge.aggregator.build_per_token_aggregator's docstring
    cfg = CayleyConfig(conv_type="gat", gat_heads=4, gnn_layers=2)
    agg = build_per_token_aggregator(cfg, num_layers=13, hidden_in=480)
    x = torch.randn(2, 16, 13, 480)
    assert agg(x).shape == torch.Size([2, 16, 256])
    agg = build_per_token_aggregator(cfg, num_layers=13, hidden_in=480, output_mode="sequence")
    x = torch.randn(4, 16, 13, 480)
    assert agg(x).shape == torch.Size([4, 256])


def test_token_pooling_pools_each_tokens_layer_nodes():
    config = CayleyConfig(conv_type="gcn", hidden_dim=16)
    L, D = 5, 12
    x = torch.randn(2, 3, L, D)
    mean = build_per_token_aggregator(config, L, D, "mean", "per_token").eval()  # the published positional order
    total = build_per_token_aggregator(config, L, D, token_pooling="sum").eval()
    total.load_state_dict(mean.state_dict())
    with torch.no_grad():
        assert torch.allclose(total(x), mean(x) * L, atol=1e-5)
    # the sequence output pools every real node as config.pooling says; token_pooling does not touch it
    seq_mean = build_per_token_aggregator(config, L, D, token_pooling="sum", output_mode="sequence").eval()
    seq_mean.load_state_dict(mean.state_dict())
    with torch.no_grad():
        assert torch.allclose(seq_mean(x), mean(x).mean(dim=1), atol=1e-5)
    with pytest.raises(ValueError, match="token_pooling"):
        build_per_token_aggregator(config, L, D, token_pooling="max")


def test_wrong_config_types_raise_type_error_as_published():
    with pytest.raises(TypeError, match="config must be"):
        build_aggregator({"family": "cayley"}, 7, 384)
    with pytest.raises(TypeError, match="graph family"):
        build_per_token_aggregator(DeepSetConfig(), 7, 384)
    with pytest.raises(TypeError):
        build_per_token_aggregator("cayley", 7, 384)
    assert issubclass(ArgumentTypeError, TypeError) and issubclass(ArgumentTypeError, ValueError)


def test_documented_extensions():
    # the published package raises TypeError for both; ilge_search documents them as extensions (README)
    agg = build_per_token_aggregator(FCConfig(hidden_dim=8), 3, 6, output_mode="sequence")
    assert agg(torch.randn(2, 4, 3, 6)).shape == (2, 8) and agg.graph_kind == "fc"
    from ilge_search import LastLayerConfig

    assert build_aggregator(LastLayerConfig(), 3, 6)(torch.randn(2, 3, 6)).shape[0] == 2


# ----------------------------------------------------------------------------- configs and the classifier


def test_configuration_reference_and_conv_types():
    config = CayleyConfig(
        conv_type="gin",
        hidden_dim=256,
        gnn_layers=1,
        gin_mlp_layers=1,
        gat_heads=4,
        pooling="mean",
        dropout=0.1,
        lr=1e-3,
        weight_decay=1e-4,
        batch_size=64,
        epochs=50,
    )
    assert config == CayleyConfig()  # the documented values are the defaults
    assert (
        FCConfig(
            conv_type="gin",
            hidden_dim=256,
            gnn_layers=1,
            gin_mlp_layers=1,
            gat_heads=4,
            pooling="mean",
            dropout=0.1,
            lr=1e-3,
            weight_decay=1e-4,
            batch_size=64,
            epochs=50,
        )
        == FCConfig()
    )
    deepset = DeepSetConfig(pre_pooling_layers=2, post_pooling_layers=1)
    assert build_aggregator(deepset, 7, 32)(torch.randn(3, 7, 32)).shape == (3, deepset.hidden_dim)
    for config in (
        CayleyConfig(conv_type="gat", gat_heads=4),
        CayleyConfig(conv_type="gin", gin_mlp_layers=2),
        CayleyConfig(conv_type="gcn"),
    ):
        assert build_aggregator(config, 7, 32)(torch.randn(3, 7, 32)).shape == (3, 256)


def test_classifier_constructor_as_published(no_model_loads):
    clf = ILGEClassifier("EleutherAI/pythia-410m", CayleyConfig(), num_classes=6)
    assert (clf.base_model, clf.num_classes, clf.token_pooling) == ("EleutherAI/pythia-410m", 6, "mean")
    for pooling in ("last", "first", "mean_including_padding"):
        assert ILGEClassifier("minilm-l6", CayleyConfig(), token_pooling=pooling).token_pooling == pooling
    with pytest.raises(TypeError, match="config must be"):  # before any model loads
        ILGEClassifier("minilm-l6", config=42).fit(["a b", "c d"], [0, 1])


@pytest.mark.slow
@pytest.mark.realmodel
def test_classifier_example_runs(data_dir, cache_dir):
    from ilge_search.tasks.core import load_task, subsample

    task = subsample(load_task("trec", data_dir), n=120, seed=0)
    train_texts, train_labels = task["train"].texts, task["train"].labels.tolist()
    test_texts, test_labels = task["test"].texts, task["test"].labels.tolist()
    # --- README example (import changed from ilge; a small offline model instead of Pythia-410m) ---
    from ilge_search import CayleyConfig, ILGEClassifier

    clf = ILGEClassifier("minilm-l6", CayleyConfig(epochs=15), num_classes=6, cache_dir=cache_dir, device="cpu")
    clf.fit(train_texts, train_labels)
    preds = clf.predict(test_texts)
    acc = clf.score(test_texts, test_labels)
    # --- end of example ---
    assert len(preds) == len(test_texts) and set(preds.tolist()) <= set(range(6))
    assert acc == pytest.approx(sum(int(p == t) for p, t in zip(preds, test_labels, strict=True)) / len(test_labels))
    assert acc > 0.4, acc  # 6 classes: chance is about 0.17
    assert clf.predict_proba(test_texts[:3]).shape == (3, 6)
