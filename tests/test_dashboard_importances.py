"""The dashboard's parameter importances (``ilge_search.report.dashboard.param_importances``, served in place of
optuna-dashboard's route): no warning for a conditional parameter active in a single trial (before: an Optuna
UserWarning per page view) and an empty answer, not a division by zero, for a study without parameters."""

from __future__ import annotations

import json
import warnings
import wsgiref.util

import optuna
import pytest

from ilge_search.report.dashboard import make_dashboard_app


def _get(app, path):
    environ: dict = {}
    wsgiref.util.setup_testing_defaults(environ)
    environ["PATH_INFO"] = path
    status = []
    body = b"".join(app(environ, lambda s, headers, exc_info=None: status.append(s)))
    return status[0], json.loads(body)


def _conditional(trial):
    encoder = trial.suggest_categorical("encoder", ["gin", "deepset"]) if trial.number else "gin"
    lr = trial.suggest_float("lr", 1e-4, 1e-1, log=True)
    if trial.number == 0:  # a conditional parameter: active in one trial only
        trial.suggest_int("gin_mlp_layers", 1, 3)
    return lr * (2.0 if encoder == "gin" else 1.0)


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = f"sqlite:///{tmp_path_factory.mktemp('dashboard') / 's.db'}"
    sampler = optuna.samplers.RandomSampler(seed=0)
    optuna.create_study(storage=url, study_name="conditional", direction="maximize", sampler=sampler).optimize(
        _conditional, n_trials=12
    )
    optuna.create_study(storage=url, study_name="no-params").optimize(lambda trial: 1.0, n_trials=3)
    two = optuna.create_study(storage=url, study_name="two", directions=["maximize", "minimize"], sampler=sampler)
    two.optimize(lambda t: (t.suggest_float("x", 0, 1), t.suggest_int("size", 1, 9)), n_trials=12)
    optuna.create_study(storage=url, study_name="tied", sampler=sampler).optimize(
        lambda t: t.suggest_float("x", 0, 1) * 0, n_trials=4
    )
    return url, {s.study_name: s._study_id for s in optuna.get_all_study_summaries(url)}


def _importances(storage, tmp_path, name):
    url, ids = storage
    app = make_dashboard_app(url, artifact_dir=tmp_path / "artifacts")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        status, body = _get(app, f"/api/studies/{ids[name]}/param_importances")
    assert [str(w.message) for w in caught] == []
    assert status == "200 OK", body
    return body["param_importances"]


def test_a_parameter_active_in_one_trial_is_left_out_without_a_warning(storage, tmp_path, capfd):
    [objective] = _importances(storage, tmp_path, "conditional")
    names = {row["name"]: row for row in objective}
    assert "gin_mlp_layers" not in names and "encoder" not in names  # one trial in a regime: not judged
    assert names["lr"]["distribution"] == "FloatDistribution"
    assert sum(row["importance"] for row in objective) == pytest.approx(1.0)
    assert "Warning" not in capfd.readouterr().err


def test_a_study_without_parameters_answers_an_empty_list(storage, tmp_path):
    assert _importances(storage, tmp_path, "no-params") == [[]]


def test_each_objective_of_a_multi_objective_study_gets_its_importances(storage, tmp_path):
    objectives = _importances(storage, tmp_path, "two")
    assert len(objectives) == 2
    for objective in objectives:
        assert {row["name"] for row in objective} == {"x", "size"}
        assert sum(row["importance"] for row in objective) == pytest.approx(1.0)


def test_trials_that_all_score_the_same_give_equal_importances(storage, tmp_path):
    [objective] = _importances(storage, tmp_path, "tied")
    assert objective == [{"name": "x", "importance": 1.0, "distribution": "FloatDistribution"}]


def test_an_unknown_study_is_404_and_other_routes_are_the_dashboards(storage, tmp_path):
    url, _ = storage
    app = make_dashboard_app(url, artifact_dir=tmp_path / "artifacts")
    status, body = _get(app, "/api/studies/999/param_importances")
    assert status.startswith("404") and "999" in body["reason"]
    status, body = _get(app, "/api/studies")
    assert status == "200 OK" and len(body["study_summaries"]) == 4
