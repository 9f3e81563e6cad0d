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


# ----------------------------------------------------------------------------- --time-limit


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _timed_trial(number: int, value: float, seconds: float, **attrs):
    trial = optuna.trial.create_trial(value=value, user_attrs={"seconds": seconds, **attrs})
    trial.number = number
    return trial


def test_durations_read_as_seconds():
    from ilge_search.study.budget import parse_duration

    assert parse_duration("10m") == 600 and parse_duration("90s") == 90 and parse_duration("1.5h") == 5400
    assert parse_duration(" 45 ") == 45 and parse_duration(30) == 30 and parse_duration(None) is None
    for bad in ("ten minutes", "0", "-5m", "5d"):
        with pytest.raises(ValueError, match="time_limit"):
            parse_duration(bad)
    assert StudyOptions.from_flat(time_limit="2m", n_trials=None).search.time_limit == 120


def test_the_search_stops_when_the_time_left_is_what_the_stages_need():
    from ilge_search.study.budget import SAFETY, STAGE_OVERHEAD_SECONDS, TimeBudget

    clock = FakeClock()
    budget = TimeBudget(deadline=clock.now + 100, seeds=2, ensemble_size=3, clock=clock)
    assert budget.reserve([]) == 0 and not budget.should_stop([])  # nothing measured: the first trial runs
    trials = [
        _timed_trial(0, 0.5, 4.0),  # the start
        _timed_trial(1, 0.9, 2.0),
        _timed_trial(2, 0.8, 6.0, layer_scores=[0.1, 0.2]),  # a best-layer trial: the probe's cost
        _timed_trial(3, 0.7, 1.0),
    ]
    # final: 2 seeds x (the best trial 2.0 + the start 4.0); ensemble: 2 seeds x (the next two by value, 6.0 and
    # 1.0, + the probe 6.0)
    final = 2 * (2.0 + 4.0)
    ensemble = 2 * (6.0 + 1.0 + 6.0)
    assert budget.reserve(trials) == pytest.approx((final + ensemble) * SAFETY + STAGE_OVERHEAD_SECONDS)
    reserve = budget.reserve(trials)
    clock.now = budget.deadline - reserve - 1  # a second more than the stages need: a zero-second trial fits
    assert not budget.should_stop(trials)
    clock.now = budget.deadline - reserve + 1
    assert budget.should_stop(trials)
    without = TimeBudget(deadline=budget.deadline, seeds=0, ensemble_size=0, clock=clock)
    assert without.reserve(trials) == 0  # no final seeds: the search may use all of it


def test_a_time_limited_auto_run_ends_within_the_limit(synthetic, tmp_path):
    import time

    url = f"sqlite:///{tmp_path / 's.db'}"
    limit = 30.0
    synthetic.cache("trec", **DATA)
    started = time.perf_counter()
    with refuse_model_loads():
        (result,) = run_study(
            synthetic.model,
            "trec",
            "auto",
            storage=url,
            options=_options(synthetic, n_trials=None, time_limit=limit, final_seeds=2),
        )
    took = time.perf_counter() - started
    assert 0.6 * limit <= took <= 1.1 * limit, took
    assert result.n_complete >= 2 and result.test_mean is not None and result.ensemble is not None
