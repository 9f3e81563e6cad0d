"""``--encoder auto``: one study over methods and their settings, on synthetic embeddings (no model loads)."""

from __future__ import annotations

import optuna
import pytest

from ilge_search import run_study
from ilge_search.record import study_record, trial_config
from ilge_search.study import StudyOptions
from ilge_search.study.auto import METHOD_PARAM, auto_methods, suggest_auto
from ilge_search.study.identity import default_study_name
from ilge_search.testing import LayerSignal, refuse_model_loads

DATA = dict(max_train=240, max_eval=100)


def _options(synthetic, **more):
    flat = dict(
        n_trials=6,
        final_seeds=1,
        max_epochs=4,
        data_dir=synthetic.data_dir,
        cache_dir=synthetic.cache_dir,
        device="cpu",
        threads=1,
        progress=False,
        **DATA,
    )
    return StudyOptions.from_flat(**{**flat, **more})


def _run(synthetic, url, **more):
    synthetic.cache("trec", **DATA)
    with refuse_model_loads():
        (result,) = run_study(synthetic.model, "trec", "auto", storage=url, options=_options(synthetic, **more))
    return result, optuna.load_study(study_name=result.study_name, storage=url)


def test_methods_default_to_every_family_of_the_tasks_kind_and_are_checked():
    sentence = auto_methods(None, tagging=False)
    assert sentence[:3] == ("cayley", "fc", "deepset") and "last-layer" in sentence and "cayley-word" not in sentence
    assert "cayley-word" in auto_methods(None, tagging=True)
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        auto_methods(("cayley", "nope"), tagging=False)
    with pytest.raises(ValueError, match="cannot run on a sentence task"):
        auto_methods(("cayley-word",), tagging=False)
    assert default_study_name("m", "t", "auto", methods=sentence) == "m:t:auto"
    assert default_study_name("m", "t", "auto", methods=("fc", "last-layer")) == "m:t:auto:methods-fc+last-layer"


def test_every_methods_start_runs_first_and_a_trials_config_is_rebuilt_from_its_params(synthetic, tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    methods = "cayley,deepset,last-layer,mlp-last"
    result, study = _run(synthetic, url, methods=methods, final_seeds=0, ensemble=0)
    assert result.encoder == "auto" and study_record(study).identity.methods == tuple(methods.split(","))
    first = sorted(study.trials, key=lambda t: t.number)[:4]
    assert [t.params[METHOD_PARAM] for t in first] == methods.split(",")
    assert first[0].user_attrs.get("recommended") is True
    for trial in study.trials:
        method = trial.params[METHOD_PARAM]
        assert all(name == METHOD_PARAM or name.startswith(method + ":") for name in trial.params)
        rebuilt = suggest_auto(trial, methods.split(",")).replace(epochs=4)
        assert rebuilt == trial_config(trial)  # what final evaluation, ensembles and export read


def test_a_known_method_wins_where_only_it_can(synthetic, tmp_path):
    """The label sits in the first layer only: the last-layer probe is at chance, the best-layer probe finds it."""
    import dataclasses

    first_layer = dataclasses.replace(
        synthetic, signal=LayerSignal(layer=0, strength=12.0), cache_dir=tmp_path / "cache"
    )
    first_layer.cache("trec", **DATA)
    url = f"sqlite:///{tmp_path / 's.db'}"
    with refuse_model_loads():
        (result,) = run_study(
            synthetic.model,
            "trec",
            "auto",
            storage=url,
            options=_options(first_layer, methods="last-layer,best-layer", n_trials=4, ensemble=0),
        )
    study = optuna.load_study(study_name=result.study_name, storage=url)
    assert study.best_trial.params[METHOD_PARAM] == "best-layer"
    assert result.best_config["family"] == "best-layer" and result.test_mean > 0.5


def test_methods_are_part_of_the_identity_and_need_auto(synthetic, tmp_path):
    from ilge_search.study import StudyConflictError

    url = f"sqlite:///{tmp_path / 's.db'}"
    _run(synthetic, url, methods="last-layer,mlp-last", n_trials=2, final_seeds=0, study_name="mine")
    with pytest.raises(StudyConflictError, match="methods"):
        _run(synthetic, url, methods="last-layer", n_trials=1, final_seeds=0, study_name="mine")
    with refuse_model_loads(), pytest.raises(ValueError, match="--methods lists the methods of --encoder auto"):
        run_study(synthetic.model, "trec", "cayley", storage=url, options=_options(synthetic, methods="fc"))
