"""Cross-validated objectives, selection rules, the search gain and the validation-to-test gap (issue 18).

Everything here runs on small synthetic features (no model loads): the folds, the objective with
``cv`` (fold scores, pruning steps), the one-SE rule, the final evaluation under both rules, the
identity and names of cv studies, the sweep keys, and the tables that show the gain.
"""

from __future__ import annotations

import math
import statistics

import numpy as np
import optuna
import pytest
import torch
from optuna.trial import TrialState, create_trial

from ilge_search.encoders import config_from_dict
from ilge_search.study import StudyOptions, default_study_name, format_results, load_sweep, study_result
from ilge_search.study.data import StudyData
from ilge_search.study.final import FinalSettings, final_evaluation, final_is_current
from ilge_search.study.folds import check_cv, cross_validate, stratified_folds
from ilge_search.study.identity import StudyConflictError, check_identity, run_identity
from ilge_search.study.selection import select_trial, standard_error, start_trial
from ilge_search.study.trial import TrialObjective, recommended_params

optuna.logging.set_verbosity(optuna.logging.WARNING)

LAYERS, DIM, CLASSES = 3, 8, 3


def synthetic(n: int, seed: int) -> tuple:
    """(features (n, L, D) float16, labels): each class a Gaussian around its own centre (the same centres in
    every split), separable but not trivially."""
    centres = np.random.default_rng(7).normal(size=(CLASSES, LAYERS, DIM)) * 0.6
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % CLASSES
    features = centres[labels] + rng.normal(size=(n, LAYERS, DIM))
    return torch.tensor(features, dtype=torch.float16), torch.tensor(labels)


def study_data(n_train: int = 90, n_eval: int = 60) -> StudyData:
    return StudyData(
        task_kind="classification",
        metric="accuracy",
        train=synthetic(n_train, 0),
        validation=synthetic(n_eval, 1),
        test=synthetic(n_eval, 2),
        num_layers=LAYERS,
        hidden_size=DIM,
        num_classes=CLASSES,
        label_names=["a", "b", "c"],
        split_sizes={"train": n_train, "validation": n_eval, "test": n_eval},
        cache_keys={},
    )


def new_study(cv=None, pruner=None, encoder="mlp-last"):
    study = optuna.create_study(
        direction="maximize", pruner=pruner or optuna.pruners.NopPruner(), sampler=optuna.samplers.RandomSampler(seed=0)
    )
    for key, value in {
        "cv": cv,
        "data_seed": 0,
        "metric": "accuracy",
        "direction": "maximize",
        "encoder": encoder,
        "split_sizes": {"train": 90, "validation": 60, "test": 60},
    }.items():
        study.set_user_attr(key, value)
    study.enqueue_trial(recommended_params(encoder, DIM), user_attrs={"recommended": True})
    return study


# ----------------------------------------------------------------------------- folds


def test_stratified_folds_partition_the_data_with_each_class_in_proportion():
    labels = np.array([0] * 50 + [1] * 30 + [2] * 20)
    folds = stratified_folds(labels, 5, seed=3)
    assert sorted(np.concatenate(folds).tolist()) == list(range(100))  # disjoint and covering
    assert [len(f) for f in folds] == [20] * 5
    for fold in folds:
        assert np.bincount(labels[fold], minlength=3).tolist() == [10, 6, 4]
    again = stratified_folds(labels, 5, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(folds, again, strict=True))  # the same folds every trial
    assert not all(np.array_equal(a, b) for a, b in zip(folds, stratified_folds(labels, 5, seed=4), strict=True))


def test_similarity_folds_are_stratified_on_binned_scores():
    scores = np.linspace(0.0, 5.0, 200)
    folds = stratified_folds(scores, 4, seed=0, task_kind="similarity")
    assert sorted(len(f) for f in folds) == [50] * 4
    for fold in folds:  # every score decile is in every fold, in proportion
        deciles = np.bincount((scores[fold] / 5.0 * 9.999).astype(int), minlength=10)
        assert deciles.min() == deciles.max() == 5


def test_cv_must_be_two_or_more_and_at_most_the_training_size():
    assert check_cv(None) is None and check_cv(5, 10) == 5
    with pytest.raises(ValueError, match="cv must be"):
        check_cv(1)
    with pytest.raises(ValueError, match="--cv 20 needs at least 20 training examples; the training split has 12"):
        check_cv(20, 12)
    with pytest.raises(ValueError, match="cv"):
        StudyOptions.from_flat(cv=1)
    with pytest.raises(ValueError, match="select"):
        StudyOptions.from_flat(select="worst")


# ----------------------------------------------------------------------------- the cross-validated objective


def test_a_cv_trial_is_the_mean_of_its_fold_scores_reported_per_fold_epoch():
    data = study_data()
    study = new_study(cv=3)
    study.optimize(TrialObjective("mlp-last", data, seed=0, device="cpu", max_epochs=3), n_trials=1)
    trial = study.trials[0]
    folds = trial.user_attrs["fold_scores"]
    assert len(folds) == 3 and trial.value == pytest.approx(statistics.fmean(folds))
    assert trial.user_attrs["val_metric"] == pytest.approx(trial.value)
    # step = fold * epochs + epoch: 3 folds x 3 epochs, each value a fold's score after that epoch
    assert sorted(trial.intermediate_values) == list(range(1, 10))
    for fold, score in enumerate(folds):
        per_epoch = [trial.intermediate_values[fold * 3 + e] for e in range(1, 4)]
        assert max(per_epoch) == pytest.approx(score)
    # the folds are those of the training split only, seeded by the study's data_seed
    config = config_from_dict(study.trials[0].user_attrs["config"])
    direct = cross_validate(
        config,
        data.train,
        stratified_folds(data.train[1], 3, seed=0),
        task_kind="classification",
        num_classes=CLASSES,
        seed=0,
        device="cpu",
    )
    assert direct.fold_scores == pytest.approx(study.trials[0].user_attrs["fold_scores"])


def test_median_pruning_still_prunes_cv_trials_at_comparable_steps():
    data = study_data()
    # steps below 5 are the warm-up: the first fold (4 epochs); a prune can only come in a later fold
    pruner = optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=5)
    study = new_study(cv=3, pruner=pruner)
    good = {"hidden_dim": 128, "lr": 1e-2, "weight_decay": 1e-6}
    study.enqueue_trial(good)
    study.enqueue_trial({"hidden_dim": 128, "lr": 1e-5, "weight_decay": 1e-6})  # learns nothing in 4 epochs
    study.optimize(TrialObjective("mlp-last", data, seed=0, device="cpu", max_epochs=4), n_trials=4)
    pruned = [t for t in study.trials if t.state == TrialState.PRUNED]
    assert pruned and pruned[0].params["lr"] == pytest.approx(1e-5)
    trial = pruned[0]
    last = max(trial.intermediate_values)
    assert last > 4 and trial.user_attrs["pruned_fold"] == (last - 1) // 4 + 1 >= 2
    assert "fold_scores" not in trial.user_attrs


def test_a_similarity_config_is_cross_validated_on_score_bins_with_one_score_scale():
    from ilge_search.tuning import recommended_config

    rng = np.random.default_rng(0)
    base = rng.normal(size=(48, 1, LAYERS, DIM))
    noise = rng.uniform(0.0, 2.0, size=48)  # pairs further apart score lower
    pairs = np.concatenate([base, base + noise[:, None, None, None] * rng.normal(size=base.shape)], axis=1)
    scores = torch.tensor(5.0 - 2.5 * noise, dtype=torch.float32)
    folds = stratified_folds(scores, 3, seed=0, task_kind="similarity")
    result = cross_validate(
        recommended_config("mean-layers").replace(epochs=2),
        (torch.tensor(pairs, dtype=torch.float16), scores),
        folds,
        task_kind="similarity",
        num_classes=None,
        seed=0,
        device="cpu",
    )
    assert len(result.fold_scores) == 3 and all(-1.0 <= s <= 1.0 for s in result.fold_scores)
    assert result.mean == pytest.approx(statistics.fmean(result.fold_scores))


def test_without_cv_the_objective_scores_the_validation_split_as_before():
    data = study_data()
    study = new_study(cv=None)
    study.optimize(TrialObjective("mlp-last", data, seed=0, device="cpu", max_epochs=3), n_trials=1)
    trial = study.trials[0]
    assert "fold_scores" not in trial.user_attrs
    assert sorted(trial.intermediate_values) == [1, 2, 3]
    assert max(trial.intermediate_values.values()) == pytest.approx(trial.value)


# ----------------------------------------------------------------------------- selection


def _add(study, number_value, params, *, recommended=False, folds=None, state=TrialState.COMPLETE):
    attrs = {
        "num_trainable_params": params,
        "config": {"family": "mlp-last", "hidden_dim": 128, "lr": 1e-3, "weight_decay": 1e-4, "epochs": 3},
    }
    if recommended:
        attrs["recommended"] = True
    if folds is not None:
        attrs["fold_scores"] = folds
    study.add_trial(
        create_trial(
            value=number_value if state == TrialState.COMPLETE else None,
            state=state,
            user_attrs=attrs,
            params={},
            distributions={},
        )
    )


def _bare_study(n_validation=400):
    study = optuna.create_study(direction="maximize")
    study.set_user_attr("metric", "accuracy")
    study.set_user_attr("split_sizes", {"validation": n_validation})
    return study


def test_standard_error_over_folds_or_from_the_validation_size():
    study = _bare_study()
    _add(study, 0.5, 10, folds=[0.4, 0.5, 0.6])
    _add(study, 0.5, 10)
    cv, plain = study.trials
    assert standard_error(cv, "accuracy", 400) == pytest.approx(0.1 / math.sqrt(3))
    assert standard_error(plain, "accuracy", 400) == pytest.approx(math.sqrt(0.25 / 400))  # binomial: 2.5 points
    assert standard_error(plain, "spearman", 403) == pytest.approx(0.75 * math.sqrt(1.06 / 400))
    assert standard_error(plain, "accuracy", None) == 0.0


def test_one_se_picks_the_fewest_parameters_within_one_standard_error():
    study = _bare_study(n_validation=400)  # SE of the best (0.80): sqrt(0.8 * 0.2 / 400) = 0.02
    _add(study, 0.770, 500, recommended=True)  # trial 0: outside the band (0.03 below)
    _add(study, 0.800, 900)  # the best
    _add(study, 0.785, 300)  # inside the band, fewest parameters: chosen
    _add(study, 0.790, 600)
    _add(study, 0.70, 100, state=TrialState.PRUNED)  # never a candidate
    assert select_trial(study, "best").number == 1
    assert select_trial(study, "one-se").number == 2


def test_the_start_configuration_wins_ties_and_a_wider_band_with_folds():
    study = _bare_study()
    _add(study, 0.78, 300, recommended=True, folds=[0.7, 0.78, 0.86])
    _add(study, 0.80, 300, folds=[0.72, 0.80, 0.88])  # SE = 0.08 / sqrt(3) = 0.046: trial 0 is inside
    _add(study, 0.79, 900, folds=[0.79, 0.79, 0.79])
    assert select_trial(study, "one-se").number == 0  # equal parameters: the start wins
    assert start_trial(study).number == 0
    with pytest.raises(ValueError, match="select"):
        select_trial(study, "median")


# ----------------------------------------------------------------------------- final evaluation


@pytest.fixture()
def evaluated_study():
    """A 4-trial study on synthetic data; trial 0 (the start) trains badly (lr 1e-5), so the search gains."""
    data = study_data()
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    for key, value in {
        "metric": "accuracy",
        "direction": "maximize",
        "data_seed": 0,
        "split_sizes": data.split_sizes,
    }.items():
        study.set_user_attr(key, value)
    study.enqueue_trial({"hidden_dim": 128, "lr": 1e-5, "weight_decay": 1e-6}, user_attrs={"recommended": True})
    study.enqueue_trial({"hidden_dim": 512, "lr": 1e-2, "weight_decay": 1e-6})
    study.enqueue_trial({"hidden_dim": 128, "lr": 1e-2, "weight_decay": 1e-6})
    study.optimize(TrialObjective("mlp-last", data, seed=0, device="cpu", max_epochs=3), n_trials=3)
    return study, data


def test_final_evaluation_records_the_gain_over_the_start_and_the_gap(evaluated_study, monkeypatch):
    study, data = evaluated_study
    final_evaluation(
        study,
        data,
        FinalSettings(
            encoder="mlp-last",
            seeds=[1000, 1001],
            device="cpu",
            max_epochs=3,
            select="best",
            progress=False,
        ),
    )
    attrs = study.user_attrs
    best = study.best_trial
    assert attrs["final_select"] == "best" and attrs["final_trial"] == best.number != 0
    assert attrs["final_start_trial"] == 0 and len(attrs["final_start_test_scores"]) == 2
    assert attrs["final_search_gain"] == pytest.approx(attrs["final_test_mean"] - attrs["final_start_test_mean"])
    assert attrs["final_search_gain"] > 0.2  # lr 1e-5 for 3 epochs is near chance
    assert attrs["final_val_test_gap"] == pytest.approx(best.value - attrs["final_test_mean"])
    assert final_is_current(study, [1000, 1001], 3, "best")
    assert not final_is_current(study, [1000, 1001], 3, "one-se")  # a change of rule is noticed
    assert not final_is_current(study, [1000, 1001, 1002], 3, "best")

    # one-se: the smaller of the two good trials; the start's scores are reused, not retrained
    calls = []
    import ilge_search.engine as engine

    real = engine.train_encoder
    monkeypatch.setattr(engine, "train_encoder", lambda *a, **k: calls.append(1) or real(*a, **k))
    real_many = engine.train_many  # the seeds trained in one pass
    monkeypatch.setattr(
        engine, "train_many", lambda jobs, *a, **k: calls.extend([1] * len(jobs)) or real_many(jobs, *a, **k)
    )
    final_evaluation(
        study,
        data,
        FinalSettings(
            encoder="mlp-last",
            seeds=[1000, 1001],
            device="cpu",
            max_epochs=3,
            select="one-se",
            progress=False,
        ),
    )
    chosen = select_trial(study, "one-se")
    assert study.user_attrs["final_trial"] == chosen.number and study.user_attrs["final_select"] == "one-se"
    assert len(calls) == (0 if chosen.number == best.number else 2)
    assert study.user_attrs["final_start_test_scores"] == attrs["final_start_test_scores"]
    assert set(study.user_attrs["final_by_rule"]) == {"best", "one-se"}
    assert final_is_current(study, [1000, 1001], 3, "one-se")

    # back to best: restored from final_by_rule without any training
    calls.clear()
    final_evaluation(
        study,
        data,
        FinalSettings(
            encoder="mlp-last",
            seeds=[1000, 1001],
            device="cpu",
            max_epochs=3,
            select="best",
            progress=False,
        ),
    )
    assert not calls and study.user_attrs["final_test_scores"] == attrs["final_test_scores"]
    assert final_is_current(study, [1000, 1001], 3, "best")

    result = study_result(study)
    assert result.search_gain == pytest.approx(attrs["final_search_gain"]) and result.select == "best"
    table = format_results([result])
    assert "search gain" in table and f"{attrs['final_search_gain']:+.4f}" in table


def test_when_the_start_is_selected_its_scores_are_reused_and_the_gain_is_zero(evaluated_study, monkeypatch):
    study, data = evaluated_study
    import ilge_search.engine as engine
    import ilge_search.study.final as final

    monkeypatch.setattr(final, "select_trial", lambda study, rule: study.trials[0])  # a rule that keeps the start
    calls = []

    real = engine.train_encoder
    monkeypatch.setattr(engine, "train_encoder", lambda *a, **k: calls.append(1) or real(*a, **k))
    real_many = engine.train_many  # the seeds trained in one pass
    monkeypatch.setattr(
        engine, "train_many", lambda jobs, *a, **k: calls.extend([1] * len(jobs)) or real_many(jobs, *a, **k)
    )
    final_evaluation(
        study,
        data,
        FinalSettings(
            encoder="mlp-last",
            seeds=[1000, 1001],
            device="cpu",
            max_epochs=3,
            select="one-se",
            progress=False,
        ),
    )
    attrs = study.user_attrs
    assert attrs["final_trial"] == 0 and attrs["final_search_gain"] == 0.0 and len(calls) == 2
    assert attrs["final_start_test_scores"] == attrs["final_test_scores"]


def test_a_legacy_final_evaluation_counts_as_best_and_shows_no_gain():
    study = _bare_study()
    _add(study, 0.8, 10, recommended=True)
    for key, value in {
        "final_test_mean": 0.7,
        "final_test_std": 0.01,
        "final_test_scores": [0.69, 0.71],
        "final_seeds": [1000, 1001],
        "final_trial": 0,
        "final_max_epochs": 10,
    }.items():
        study.set_user_attr(key, value)
    assert final_is_current(study, [1000, 1001], 10, "best")
    assert not final_is_current(study, [1000, 1001], 10, "one-se")
    result = study_result(study)
    assert result.search_gain is None and result.select == "best"
    assert format_results([result]).splitlines()[1].rstrip().endswith("-")


# ----------------------------------------------------------------------------- identity, names, sweeps


def test_cv_is_part_of_the_study_identity_and_name():
    name = default_study_name("minilm-l6", "trec", "cayley", max_train=500, cv=5)
    assert name == "minilm-l6:trec:cayley:train500:cv5"
    plain = run_identity("minilm-l6", "trec", "cayley", StudyOptions()).to_attrs()
    cv = run_identity("minilm-l6", "trec", "cayley", StudyOptions.from_flat(cv=5)).to_attrs()
    assert plain["cv"] is None and cv["cv"] == 5
    data_keys = {"label_names": ["a"], "data_fingerprints": {"train": "x"}}
    stored = {**plain, **data_keys}
    with pytest.raises(StudyConflictError, match="cv: stored None, requested 5"):
        check_identity("s", stored, {**cv, **data_keys})
    legacy = {k: v for k, v in stored.items() if k != "cv"}  # made before cv existed: a no-cv study
    assert check_identity("s", legacy, {**plain, **data_keys}) is False


def test_sweep_grids_take_cv_globally_and_per_task_and_select(tmp_path):
    grid = tmp_path / "grid.toml"
    grid.write_text(
        'models = ["minilm-l6"]\nencoders = ["cayley"]\ncv = 5\nselect = "one-se"\nmax_train = 500\n'
        "[trials]\ndefault = 2\n[tasks.trec]\n[tasks.sst2]\ncv = 3\n"
    )
    sweep = load_sweep(grid)
    names = {e.task: e.study_name for e in sweep.entries}
    assert names == {"trec": "minilm-l6:trec:cayley:train500:cv5", "sst2": "minilm-l6:sst2:cayley:train500:cv3"}
    assert sweep.study_options().final.select == "one-se"
    grid.write_text('models = ["minilm-l6"]\nencoders = ["cayley"]\n[trials]\ndefault = 2\n[tasks.trec]\ncv = 1\n')
    with pytest.raises(ValueError, match=r"\[tasks.trec\]: cv must be"):
        load_sweep(grid)
    grid.write_text(
        'models = ["minilm-l6"]\nencoders = ["cayley"]\nselect = "max"\n[trials]\ndefault = 2\n[tasks.trec]\n'
    )
    with pytest.raises(ValueError, match="select"):
        load_sweep(grid)


def test_the_cli_offers_the_selection_rules_of_the_library():
    from ilge_search.cli import cli
    from ilge_search.study.selection import DEFAULT_SELECT, SELECTION_RULES

    for command in ("run", "sweep"):
        option = next(p for p in cli.commands[command].params if p.name == "select")
        assert tuple(option.type.choices) == SELECTION_RULES and f"[default: {DEFAULT_SELECT}]" in option.help


# ----------------------------------------------------------------------------- report tables


def _stored_study(url, name, *, cv=None, max_train=500, by_rule=None, legacy=False, encoder="cayley"):
    study = optuna.create_study(study_name=name, storage=url, direction="maximize")
    for key, value in {
        "model": "minilm-l6",
        "task": "trec",
        "encoder": encoder,
        "metric": "accuracy",
        "max_train": max_train,
        "cv": cv,
        "split_sizes": {"validation": 400},
    }.items():
        study.set_user_attr(key, value)
    study.add_trial(
        create_trial(
            value=0.8, user_attrs={"recommended": True, "num_trainable_params": 10, "seconds": 4.0, "config": {}}
        )
    )
    study.add_trial(create_trial(value=0.84, user_attrs={"num_trainable_params": 20, "seconds": 6.0, "config": {}}))
    final = {
        "final_test_mean": 0.7,
        "final_test_std": 0.01,
        "final_test_scores": [0.69, 0.71],
        "final_seeds": [1000, 1001],
        "final_trial": 1,
        "final_max_epochs": 10,
    }
    if not legacy:
        final.update(
            final_select="one-se",
            final_search_gain=-0.03,
            final_val_test_gap=0.14,
            final_start_test_mean=0.73,
            final_by_rule=by_rule,
        )
    for key, value in final.items():
        study.set_user_attr(key, value)


def test_the_report_shows_gain_and_gap_and_a_dash_for_studies_without_them(tmp_path):
    from ilge_search.report.data import collect_records
    from ilge_search.report.tables import selection_frame, selection_rows, selection_summary_rows, studies_rows

    url = f"sqlite:///{tmp_path / 'r.db'}"
    rule = {
        "final_trial": 1,
        "final_test_mean": 0.70,
        "final_test_std": 0.01,
        "final_test_scores": [0.69, 0.71],
        "final_start_test_mean": 0.73,
        "final_search_gain": -0.03,
        "final_val_test_gap": 0.14,
    }
    _stored_study(url, "legacy", legacy=True, max_train=2000)
    _stored_study(
        url,
        "cv",
        cv=5,
        by_rule={"best": rule, "one-se": {**rule, "final_trial": 0, "final_test_mean": 0.73, "final_search_gain": 0.0}},
    )
    records, duplicates, _ = collect_records(url)
    every = records + duplicates
    header, rows = studies_rows(every)
    text = {row[0].text: [cell.text for cell in row] for row in rows}
    assert header[-3:] == ["final trial (rule)", "val − test", "search gain"]
    assert text["legacy"][-3:] == ["1 (best)", "—", "—"]
    assert text["cv"][-3:] == ["1 (one-se)", "+14.00", "-3.00"]  # a negative gain, plainly
    assert "cv=5" in text["cv"][1]

    frame = selection_frame(every)
    assert set(frame["study"]) == {"cv"} and list(frame["rule"]) == ["best", "one-se"]
    assert frame["trial_seconds"].tolist() == [5.0, 5.0]
    _, rows = selection_rows(frame)
    cells = [cell.text for cell in rows[0]]
    assert cells[:6] == ["minilm-l6", "trec", "500", "5", "acc. %", "73.00"]
    assert cells[6:10] == ["70.00 ± 1.00 (1)", "73.00 ± 1.00 (0)", "-3.00", "+0.00"]
    assert rows[0][7].bold and not rows[0][6].bold
    _, summary = selection_summary_rows(frame)
    assert [[c.text for c in row][:7] for row in summary] == [
        ["500", "5", "best", "1", "70.00", "-3.00", "1 of 1"],
        ["500", "5", "one-se", "1", "73.00", "+0.00", "0 of 1"],
    ]


def test_the_rule_table_has_one_row_per_study_and_leaves_out_studies_of_one_rule(tmp_path):
    from ilge_search.report.data import collect_records
    from ilge_search.report.tables import selection_frame, selection_rows

    url = f"sqlite:///{tmp_path / 'r.db'}"
    rule = {
        "final_trial": 1,
        "final_test_mean": 0.70,
        "final_test_std": 0.01,
        "final_test_scores": [0.69, 0.71],
        "final_start_test_mean": 0.73,
        "final_search_gain": -0.03,
        "final_val_test_gap": 0.14,
    }
    both = {"best": rule, "one-se": {**rule, "final_trial": 0, "final_test_mean": 0.73, "final_search_gain": 0.0}}
    # two encoders with the same model, task, size and cv: their rows must not merge
    _stored_study(url, "cayley", by_rule=both)
    _stored_study(
        url, "fc", by_rule={"best": {**rule, "final_test_mean": 0.60, "final_start_test_mean": 0.61}}, encoder="fc"
    )  # one rule: nothing to compare
    _stored_study(
        url,
        "deepset",
        by_rule={name: {**kept, "final_start_test_mean": 0.5} for name, kept in both.items()},
        encoder="deepset",
    )
    records, duplicates, _ = collect_records(url)
    frame = selection_frame(records + duplicates)
    assert set(frame["study"]) == {"cayley", "deepset"}
    header, rows = selection_rows(frame)
    assert header[:4] == ["model", "task", "encoder", "train"] and header.index("start") == 6
    text = {row[2].text: [cell.text for cell in row] for row in rows}
    assert len(rows) == 2 and text["Cayley"][6] == "73.00" and text["DeepSet"][6] == "50.00"


def test_a_best_layer_trials_time_is_every_layers_probe(monkeypatch):
    # what retraining it costs, as the time budget reads it: the probe of every layer, not the chosen layer's run
    import time

    from ilge_search import engine
    from ilge_search.record import TrialRecord

    real = engine.select_best_layer

    def slow(*args, **kwargs):
        time.sleep(0.3)  # stands for the probes of the other layers
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "select_best_layer", slow)
    study = new_study(encoder="best-layer")
    study.optimize(TrialObjective("best-layer", study_data(), seed=0, device="cpu", max_epochs=2), n_trials=1)
    record = TrialRecord.from_attrs(study.trials[0].user_attrs)
    assert record.layer is not None and record.seconds >= 0.3
    assert 0 < record.cpu_seconds < record.seconds  # the sleep used no CPU
