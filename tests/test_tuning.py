import json

import optuna
import pytest

from ilge_search import build_aggregator, tuning
from ilge_search.encoders import baseline_families
from ilge_search.encoders.configs import CayleyConfig, DeepSetConfig, FCConfig, MLPLastConfig, ScalarMixConfig
from ilge_search.tuning import recommended_config, suggest_config

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _run(family, n_trials=30, **fixed):
    configs = {}

    def objective(trial):
        config = suggest_config(trial, family, **fixed)
        configs[trial.number] = config
        return config.lr * (1 + config.weight_decay)

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(objective, n_trials=n_trials)
    return study, configs


@pytest.mark.parametrize("family", ["cayley", "fc"])
def test_graph_space_and_conditional_parameters(family):
    study, configs = _run(family, n_trials=60)
    conv_types = set()
    for trial in study.trials:
        params, config = trial.params, configs[trial.number]
        conv_types.add(params["conv_type"])
        assert ("gin_mlp_layers" in params) == (params["conv_type"] == "gin")
        assert ("gat_heads" in params) == (params["conv_type"] == "gat")
        assert params["hidden_dim"] in (128, 256, 512) and 1 <= params["gnn_layers"] <= 3
        assert 0.0 <= params["dropout"] <= 0.5 and 1e-5 <= params["lr"] <= 1e-2
        assert 1e-6 <= params["weight_decay"] <= 1e-2 and params["pooling"] in ("mean", "sum")
        assert config.hidden_dim % config.gat_heads == 0 or config.conv_type != "gat"
        for name, value in params.items():
            assert getattr(config, name) == value
    assert conv_types == {"gin", "gcn", "gat"}
    dists = study.trials[0].distributions
    assert dists["lr"].log and dists["weight_decay"].log and not dists["dropout"].log
    assert dists["gnn_layers"] == optuna.distributions.IntDistribution(1, 3)


def test_deepset_space():
    study, configs = _run("deepset")
    for trial in study.trials:
        assert set(trial.params) == {
            "hidden_dim",
            "pre_pooling_layers",
            "post_pooling_layers",
            "pooling",
            "dropout",
            "lr",
            "weight_decay",
        }
        assert 0 <= trial.params["pre_pooling_layers"] <= 2 and 0 <= trial.params["post_pooling_layers"] <= 2
        assert isinstance(configs[trial.number], DeepSetConfig)


@pytest.mark.parametrize("family", baseline_families())
def test_baseline_spaces(family):
    study, configs = _run(family, n_trials=5)
    expected = {"lr", "weight_decay"} | ({"hidden_dim"} if family == "mlp-last" else set())
    assert all(set(t.params) == expected for t in study.trials)
    assert type(configs[0]).family == family


@pytest.mark.parametrize("family", ["cayley", "fc", "deepset", "mlp-last", "scalar-mix"])
def test_rebuilds_config_from_finished_trials(family):
    study, configs = _run(family, n_trials=15)
    assert suggest_config(study.best_trial, family) == configs[study.best_trial.number]
    for trial in study.trials:
        assert suggest_config(trial, family) == configs[trial.number]


def test_every_sampled_config_builds_an_aggregator():
    _study, configs = _run("cayley", n_trials=40)
    for config in configs.values():
        assert build_aggregator(config, 5, 8).out_dim == config.hidden_dim


def test_fixed_fields_are_not_searched():
    study, configs = _run("cayley", n_trials=10, conv_type="gat", epochs=7)
    for trial in study.trials:
        assert "conv_type" not in trial.params and "gat_heads" in trial.params
        assert configs[trial.number].epochs == 7 and configs[trial.number].conv_type == "gat"
    with pytest.raises(ValueError, match="unknown fields"):
        suggest_config(study.best_trial, "cayley", gnn_depth=2)


def test_wrong_family_for_a_finished_trial():
    study, _ = _run("cayley", n_trials=3)
    with pytest.raises(ValueError, match="cannot be read as a 'deepset' config"):
        suggest_config(study.best_trial, "deepset")


def test_unknown_family():
    study = optuna.create_study()
    with pytest.raises(ValueError, match="unknown family 'transformer'"):
        suggest_config(study.ask(), "transformer")
    with pytest.raises(ValueError, match="unknown family"):
        recommended_config("transformer")


# --- recommended_config ----------------------------------------------------------------------------------


@pytest.fixture
def no_defaults_file(monkeypatch, tmp_path):
    monkeypatch.setattr(tuning, "RECOMMENDED_DEFAULTS_PATH", tmp_path / "absent.json")
    monkeypatch.setenv("ILGE_SEARCH_DEFAULTS", str(tmp_path / "no-user-file.json"))  # nor a user's own file


def test_builtin_recommendations(no_defaults_file):
    small, large = recommended_config("cayley"), recommended_config("cayley", model_size_hint="large")
    assert isinstance(small, CayleyConfig) and (small.lr, large.lr) == (1e-3, 1e-4)
    assert small.gnn_layers == large.gnn_layers == 1 and small.hidden_dim == large.hidden_dim == 256
    assert isinstance(recommended_config("fc"), FCConfig)
    assert isinstance(recommended_config("deepset"), DeepSetConfig)
    assert recommended_config("deepset", "large").lr == 1e-4
    assert isinstance(recommended_config("scalar-mix", "large"), ScalarMixConfig)
    assert recommended_config("scalar-mix", "large").lr == 1e-4
    assert isinstance(recommended_config("mlp-last"), MLPLastConfig)


def test_unknown_hint(no_defaults_file):
    with pytest.raises(ValueError, match=r"model_size_hint must be one of \['small', 'large'\]"):
        recommended_config("cayley", model_size_hint="huge")


def _write(tmp_path, monkeypatch, content):
    path = tmp_path / "recommended_defaults.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    monkeypatch.setattr(tuning, "RECOMMENDED_DEFAULTS_PATH", path)
    monkeypatch.setenv("ILGE_SEARCH_DEFAULTS", str(tmp_path / "no-user-file.json"))
    return path


def test_defaults_file_overrides_builtin(tmp_path, monkeypatch):
    _write(
        tmp_path,
        monkeypatch,
        {
            "format_version": 1,
            "metadata": {"source": "test"},
            "families": {"cayley": {"large": {"lr": 3e-4, "conv_type": "gat", "gat_heads": 8}}},
        },
    )
    large = recommended_config("cayley", "large", source="regenerated")
    assert (large.lr, large.conv_type, large.gat_heads, large.hidden_dim) == (3e-4, "gat", 8, 256)
    assert recommended_config("cayley", "small", source="regenerated").lr == 1e-3  # bucket not in the file: built-in
    assert recommended_config("deepset", source="regenerated").lr == 1e-3  # family not in the file: built-in


@pytest.mark.parametrize(
    "content, match",
    [
        ("{not json", "cannot read recommended defaults"),
        ({"format_version": 1, "cayley": {}}, "'families' mapping"),
        ({"format_version": 2, "families": {}}, "format_version 2"),
        ({"format_version": 1, "families": {"rnn": {}}}, "unknown family 'rnn'"),
        ({"format_version": 1, "families": {"cayley": {"medium": {}}}}, "buckets are"),
        ({"format_version": 1, "families": {"cayley": {"small": {"gnn_depth": 2}}}}, "unknown fields"),
    ],
)
def test_broken_defaults_file(tmp_path, monkeypatch, content, match):
    path = _write(tmp_path, monkeypatch, content)
    with pytest.raises(ValueError, match=match) as info:
        recommended_config("cayley", source="regenerated")
    assert str(path) in str(info.value)


def test_the_source_of_recommended_config(tmp_path, monkeypatch):
    _write(
        tmp_path,
        monkeypatch,
        {"format_version": 1, "metadata": {}, "families": {"cayley": {"small": {"lr": 3e-4, "conv_type": "gcn"}}}},
    )
    published = recommended_config("cayley")
    assert (published.lr, published.conv_type) == (1e-3, "gin")  # the published package's values
    regenerated = recommended_config("cayley", source="regenerated")
    assert (regenerated.lr, regenerated.conv_type) == (3e-4, "gcn")
    with pytest.raises(ValueError, match="source"):
        recommended_config("cayley", source="shipped")
    with pytest.raises(ValueError, match="defaults_path is read only with source='regenerated'"):
        recommended_config("cayley", defaults_path=tmp_path / "x.json")
