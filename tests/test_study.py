"""The study runner: storage and argument checks, then studies on the synthetic setup (no model loads) and one
real-model study on an stsb subset with minilm-l6."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from ilge_search.encoders import config_from_dict
from ilge_search.record import ensemble_record
from ilge_search.storage import open_storage
from ilge_search.study import (
    StorageError,
    StudyConflictError,
    StudyOptions,
    artifact_dir_for,
    default_study_name,
    list_studies,
    make_pruner,
    make_sampler,
    recommended_params,
    resolve_encoders,
    run_study,
)
from ilge_search.study.selection import DEFAULT_SELECT, select_trial
from ilge_search.study.workers import split_trials
from ilge_search.testing import LayerSignal, refuse_model_loads

MODEL = "minilm-l6"  # argument checks resolve it (no weights load); one real-model study below


def sqlite_url(path) -> str:
    return f"sqlite:///{path}"


# ----------------------------------------------------------------------------- fast checks


def test_resolve_encoders_expands_all_in_order_and_rejects_unknown():
    assert resolve_encoders("all") == [
        "cayley",
        "fc",
        "deepset",
        "last-layer",
        "best-layer",
        "mean-layers",
        "scalar-mix",
        "mlp-last",
    ]
    assert resolve_encoders(["fc", "cayley", "fc"]) == ["fc", "cayley"]
    with pytest.raises(ValueError, match="unknown encoder 'gcn'"):
        resolve_encoders(["gcn"])


def test_default_study_name_encodes_every_identity_option():
    assert default_study_name("minilm-l6", "trec", "cayley") == "minilm-l6:trec:cayley"
    assert default_study_name("m", "t", "fc", shots=8, max_train=300, max_eval=200, max_epochs=5) == (
        "m:t:fc:8shot:train300:eval200:ep5"
    )


@pytest.mark.parametrize("n, workers", [(6, 2), (7, 2), (5, 3), (2, 4), (100, 7)])
def test_split_trials_sums_to_the_request_exactly(n, workers):
    counts = split_trials(n, workers)
    assert sum(counts) == n
    assert len(counts) == min(n, workers)
    assert max(counts) - min(counts) <= 1


def test_samplers_and_pruners_by_name():
    assert isinstance(make_sampler("tpe", 1), optuna.samplers.TPESampler)
    assert isinstance(make_sampler("random", 1), optuna.samplers.RandomSampler)
    assert isinstance(make_sampler("gp", 1), optuna.samplers.GPSampler)
    median = make_pruner("median")
    assert (median._n_startup_trials, median._n_warmup_steps) == (5, 10)
    assert make_pruner("median", max_epochs=6)._n_warmup_steps == 3
    assert isinstance(make_pruner("hyperband", 20), optuna.pruners.HyperbandPruner)
    assert isinstance(make_pruner("none"), optuna.pruners.NopPruner)
    with pytest.raises(ValueError, match="unknown sampler"):
        make_sampler("cmaes")
    with pytest.raises(ValueError, match="unknown pruner"):
        make_pruner("asha")


def test_sqlite_storage_gets_busy_timeout_heartbeat_and_its_folder(tmp_path):
    url = sqlite_url(tmp_path / "deep" / "er" / "s.db")
    storage = open_storage(url, heartbeat_interval=5).rdb
    assert (tmp_path / "deep" / "er" / "s.db").exists()
    assert storage.engine_kwargs["connect_args"]["timeout"] == 60
    assert storage.heartbeat_interval == 5 and storage.grace_period == 10
    assert isinstance(storage.heartbeat_stale_trial_callback, optuna.storages.RetryHeartbeatStaleTrialCallback)
    assert artifact_dir_for(url) == (tmp_path / "deep" / "er" / "artifacts").resolve()
    assert artifact_dir_for(url, tmp_path / "a") == (tmp_path / "a").resolve()


def _ask_three(url, barrier, queue):  # runs in a spawned process
    study = optuna.load_study(study_name="race", storage=open_storage(url, heartbeat_interval=None).rdb)
    barrier.wait()
    queue.put([study.ask().number for _ in range(3)])


@pytest.mark.slow  # four spawned processes
def test_sqlite_workers_never_pop_the_same_enqueued_trial(tmp_path):
    # with pysqlite's deferred transactions, four processes asking at once all got trial 0
    import multiprocessing

    url = sqlite_url(tmp_path / "race.db")
    study = optuna.create_study(study_name="race", storage=open_storage(url, heartbeat_interval=None).rdb)
    for x in range(12):
        study.enqueue_trial({"x": x})
    context = multiprocessing.get_context("spawn")
    barrier, queue = context.Barrier(4), context.Queue()
    processes = [context.Process(target=_ask_three, args=(url, barrier, queue)) for _ in range(4)]
    for process in processes:
        process.start()
    popped = sorted(number for _ in processes for number in queue.get(timeout=120))
    for process in processes:
        process.join()
    assert popped == list(range(12))


@pytest.mark.parametrize(
    "url, message",
    [
        ("not a url", "not a database URL"),
        ("postgresql+psycopg2://nobody@127.0.0.1:1/none", "cannot open the study storage"),
        ("mysql+nosuchdriver://u:secret@127.0.0.1/db", "no database driver"),
        ("mysql://u:secret@127.0.0.1/db", "no database driver"),
    ],
)
def test_bad_storage_urls_are_clear_errors(url, message):
    with pytest.raises(StorageError) as info:
        open_storage(url)
    assert message in str(info.value)
    assert "secret" not in str(info.value)


def test_bad_arguments_fail_before_any_model_loads(tmp_path, data_dir):
    cache = tmp_path / "cache"
    common_storage = sqlite_url(tmp_path / "s.db")
    common = dict(data_dir=data_dir, cache_dir=cache)
    with pytest.raises(ValueError, match="unknown encoder"):
        run_study(MODEL, "trec", ["gnn"], storage=common_storage, options=StudyOptions.from_flat(**common))
    with pytest.raises(ValueError, match="unknown sampler"):
        run_study(MODEL, "trec", storage=common_storage, options=StudyOptions.from_flat(sampler="bayes", **common))
    with pytest.raises(ValueError, match="give n_trials, total_trials or a timeout"):
        run_study(MODEL, "trec", storage=common_storage, options=StudyOptions.from_flat(n_trials=None, **common))
    with pytest.raises(ValueError, match="exactly one encoder"):
        run_study(
            MODEL,
            "trec",
            ["fc", "cayley"],
            storage=common_storage,
            options=StudyOptions.from_flat(study_name="x", **common),
        )
    with pytest.raises(ValueError, match="unknown task"):
        run_study(MODEL, "no_such_task", storage=common_storage, options=StudyOptions.from_flat(**common))
    with pytest.raises(ValueError, match="not an alias"):
        run_study("no-such-model", "trec", storage=common_storage, options=StudyOptions.from_flat(**common))
    with pytest.raises(ValueError, match="classification task"):
        run_study(MODEL, "stsb", storage=common_storage, options=StudyOptions.from_flat(shots=4, **common))
    assert not cache.exists() or not any(cache.rglob("*.safetensors"))


def test_a_study_name_reused_for_another_task_is_refused_before_extraction(tmp_path, data_dir):
    url = sqlite_url(tmp_path / "s.db")
    study = optuna.create_study(study_name="mine", storage=url, direction="maximize")
    for key, value in {
        "model": MODEL,
        "task": "trec",
        "encoder": "cayley",
        "shots": None,
        "max_train": None,
        "max_eval": None,
        "max_epochs": None,
        "data_seed": 0,
        "ilge_search_ready": True,
    }.items():
        study.set_user_attr(key, value)
    cache = tmp_path / "cache"
    with pytest.raises(StudyConflictError) as info:
        run_study(
            MODEL,
            "sst2",
            "cayley",
            storage=url,
            options=StudyOptions.from_flat(study_name="mine", data_dir=data_dir, cache_dir=cache),
        )
    assert "task: stored 'trec', requested 'sst2'" in str(info.value)
    assert not cache.exists() or not any(cache.rglob("*.safetensors"))

    foreign = optuna.create_study(study_name="foreign", storage=url)
    foreign.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=1)
    with pytest.raises(StudyConflictError, match="not created by ilge-search"):
        run_study(
            MODEL,
            "trec",
            "cayley",
            storage=url,
            options=StudyOptions.from_flat(study_name="foreign", data_dir=data_dir, cache_dir=cache),
        )


def test_listing_a_missing_sqlite_file_says_so(tmp_path):
    with pytest.raises(StorageError, match="no study storage"):
        list_studies(sqlite_url(tmp_path / "absent.db"))
    assert not (tmp_path / "absent.db").exists()


# ----------------------------------------------------------------------------- studies on synthetic embeddings

# The runner's whole path (task loading, fingerprints, cache lookup, engine, final evaluation) on the synthetic
# setup: the tiny model's cache keys hold features whose label sits in the last of 5 layers; no model loads.
DATA = dict(max_train=240, max_eval=100)
SMALL = dict(**DATA, max_epochs=6)


def synthetic_options(synthetic, **flat) -> StudyOptions:
    """Options of a study on the synthetic setup (its data and cache folders, on CPU, quiet; no ensemble unless
    asked for: tests/test_ensemble.py covers it, and it would add its retraining to every study here)."""
    flat = {"ensemble": 0, **flat}
    return StudyOptions.from_flat(
        data_dir=synthetic.data_dir, cache_dir=synthetic.cache_dir, device="cpu", progress=False, threads=1, **flat
    )


@pytest.fixture(scope="module")
def trec_study(tmp_path_factory, synthetic):
    """One 6-trial cayley study on the synthetic trec subset, shared by the checks below."""
    synthetic.cache("trec", **DATA)
    url = sqlite_url(tmp_path_factory.mktemp("study") / "studies.db")
    with refuse_model_loads():
        results = run_study(
            synthetic.model,
            "trec",
            "cayley",
            storage=url,
            options=synthetic_options(synthetic, n_trials=6, final_seeds=2, seed=0, **SMALL),
        )
    return url, results[0]


def test_six_trial_study_completes_with_its_records(trec_study, synthetic):
    url, result = trec_study
    study = optuna.load_study(study_name=result.study_name, storage=url)
    assert result.study_name == f"{synthetic.model}:trec:cayley:train240:eval100:ep6"
    assert len(study.trials) == 6 and result.n_finished == 6 and result.n_failed == 0
    attrs = study.user_attrs
    assert (attrs["model"], attrs["task"], attrs["encoder"]) == (synthetic.model, "trec", "cayley")
    assert (attrs["num_layers"], attrs["hidden_size"], attrs["num_classes"]) == (5, 64, 6)
    assert attrs["split_sizes"] == {"train": 240, "validation": 100, "test": 100}
    assert attrs["task_kind"] == "classification" and attrs["metric"] == "accuracy"
    assert attrs["direction"] == "maximize" and study.direction == optuna.study.StudyDirection.MAXIMIZE
    assert attrs["cache_keys"] == synthetic.cache("trec", **DATA)  # the entries written for it, nothing else
    assert attrs["ilge_search_version"] and attrs["model_revision"].startswith("sha256:")
    for trial in study.trials:
        if trial.state == TrialState.COMPLETE:
            config = config_from_dict(trial.user_attrs["config"])
            assert config.family == "cayley" and config.epochs <= 6
            assert trial.value == pytest.approx(trial.user_attrs["val_metric"])
            assert trial.user_attrs["num_trainable_params"] > 0 and trial.user_attrs["seconds"] > 0
            assert 1 <= trial.user_attrs["best_epoch"] <= trial.user_attrs["epochs_run"] <= 6
            # one validation value reported per epoch, and the best of them is the trial's value
            assert sorted(trial.intermediate_values) == list(range(1, trial.user_attrs["epochs_run"] + 1))
            assert max(trial.intermediate_values.values()) == pytest.approx(trial.value)
            assert 0.0 <= trial.value <= 1.0


def test_first_trial_is_the_recommended_config(trec_study):
    url, result = trec_study
    study = optuna.load_study(study_name=result.study_name, storage=url)
    first = study.trials[0]
    assert first.user_attrs.get("recommended") is True
    assert first.params == recommended_params("cayley", hidden_size=64)
    assert sum(bool(t.user_attrs.get("recommended")) for t in study.trials) == 1
    from ilge_search.tuning import recommended_config

    expected = recommended_config("cayley", source="regenerated").to_dict()
    stored = first.user_attrs["config"]
    assert {k: v for k, v in stored.items() if k != "epochs"} == {k: v for k, v in expected.items() if k != "epochs"}


def test_final_test_scores_and_weights_artifact(trec_study, tmp_path, synthetic, no_model_loads):
    from optuna.artifacts import download_artifact
    from safetensors.torch import load_file

    from ilge_search.embeddings.cache import load_task_embeddings
    from ilge_search.engine import build_model, evaluate

    url, result = trec_study
    study = optuna.load_study(study_name=result.study_name, storage=url)
    attrs = study.user_attrs
    scores = attrs["final_test_scores"]
    assert len(scores) == 2 and attrs["final_seeds"] == [1000, 1001]
    assert attrs["final_test_mean"] == pytest.approx(statistics.fmean(scores))
    assert attrs["final_test_std"] == pytest.approx(statistics.stdev(scores))
    selected = select_trial(study, DEFAULT_SELECT)  # the trial the default selection rule retrains
    assert attrs["final_trial"] == selected.number and attrs["final_select"] == DEFAULT_SELECT
    assert attrs["final_config"] == selected.user_attrs["config"]
    assert all(1 / 6 < s <= 1.0 for s in scores)  # better than chance on 6 classes
    assert result.test_scores == scores and result.test_mean == attrs["final_test_mean"]

    # the artifact rebuilds a model that reproduces its seed's test score
    store = open_storage(url).artifact_store()
    weights, meta = tmp_path / "model.safetensors", tmp_path / "config.json"
    download_artifact(artifact_store=store, artifact_id=attrs["final_artifacts"]["weights"], file_path=str(weights))
    download_artifact(artifact_store=store, artifact_id=attrs["final_artifacts"]["config"], file_path=str(meta))
    info = json.loads(meta.read_text())
    assert info["model"] == synthetic.model and info["task"] == "trec" and info["seed"] in attrs["final_seeds"]
    model = build_model(
        config_from_dict(info["config"]), info["num_layers"], info["hidden_size"], "classification", info["num_classes"]
    )
    model.load_state_dict(load_file(str(weights)))
    from ilge_search.study.data import load_task_data

    task = load_task_data(synthetic.spec("trec", **DATA))
    assert json.loads(json.dumps(task.label_names)) == info["label_names"]
    test = load_task_embeddings(synthetic.model, task, splits=["test"], cache_dir=synthetic.cache_dir, progress=False)
    score = evaluate(model, test.splits["test"].features, test.splits["test"].labels)["accuracy"]
    assert score == pytest.approx(scores[attrs["final_seeds"].index(info["seed"])], abs=1e-6)


def test_rerunning_resumes_and_adds_trials(trec_study, synthetic, no_model_loads):
    url, result = trec_study
    again = run_study(
        synthetic.model,
        "trec",
        "cayley",
        storage=url,
        options=synthetic_options(synthetic, n_trials=3, final_seeds=2, **SMALL),
    )[0]
    study = optuna.load_study(study_name=result.study_name, storage=url)
    assert len(study.trials) == 9 and again.n_finished == 9
    assert [t.number for t in study.trials] == list(range(9))
    assert sum(bool(t.user_attrs.get("recommended")) for t in study.trials) == 1
    assert study.user_attrs["final_trial"] == select_trial(study, DEFAULT_SELECT).number
    assert listed_row(url, result.study_name)["trials"] == 9


def listed_row(url, name):
    frame = list_studies(url)
    return frame[frame["study"] == name].iloc[0]


@pytest.mark.slow  # two worker processes
def test_two_workers_on_sqlite_run_exactly_the_requested_trials(tmp_path, synthetic, trec_study):
    url = sqlite_url(tmp_path / "workers.db")
    result = run_study(
        synthetic.model,
        "trec",
        "deepset",
        storage=url,
        options=synthetic_options(synthetic, n_trials=7, workers=2, final_seeds=1, seed=3, **SMALL),
    )[0]
    study = optuna.load_study(study_name=result.study_name, storage=url)
    states = [t.state for t in study.trials]
    assert len(states) == 7 and all(s in (TrialState.COMPLETE, TrialState.PRUNED) for s in states)
    assert sorted(t.number for t in study.trials) == list(range(7))
    recommended = [t for t in study.trials if t.user_attrs.get("recommended")]
    assert len(recommended) == 1 and recommended[0].number == 0
    assert len(study.user_attrs["final_test_scores"]) == 1


@pytest.mark.slow  # two worker processes
def test_total_trials_is_one_cap_across_calls_and_workers(tmp_path, synthetic, trec_study):
    url = sqlite_url(tmp_path / "capped.db")

    def run(**flat):
        options = synthetic_options(synthetic, final_seeds=0, pruner="none", **SMALL, **flat)
        return run_study(synthetic.model, "trec", "deepset", storage=url, options=options)

    name = run(n_trials=None, total_trials=3)[0].study_name
    study = optuna.load_study(study_name=name, storage=url)
    assert len(study.trials) == 3  # no n_trials: ran until the cap
    run(n_trials=5, total_trials=3)  # already at the cap: adds none
    assert len(study.trials) == 3
    run(n_trials=5, total_trials=4)  # the cap wins over n_trials
    assert len(study.trials) == 4
    # two processes: each stops once finished + running trials reach the cap
    run(n_trials=None, total_trials=8, workers=2)
    states = [t.state for t in study.trials]
    assert all(s == TrialState.COMPLETE for s in states)
    assert 8 <= len(states) <= 9  # at most one over: both workers may start a trial in the same instant
    assert sorted(t.number for t in study.trials) == list(range(len(states)))
    with pytest.raises(ValueError, match="total_trials"):
        run(n_trials=None, total_trials=0)


def test_similarity_study_records_spearman_and_zero_shot_scores(tmp_path, synthetic, no_model_loads):
    synthetic.cache("stsb", **DATA, zero_shot_tasks=["sick_r"])
    url = sqlite_url(tmp_path / "sts.db")
    result = run_study(
        synthetic.model,
        "stsb",
        "last-layer",  # the meanings sit in the last layer: its probe learns them within the 6 epochs
        storage=url,
        options=synthetic_options(synthetic, n_trials=3, final_seeds=2, zero_shot_tasks=["sick_r"], **SMALL),
    )[0]
    study = optuna.load_study(study_name=result.study_name, storage=url)
    attrs = study.user_attrs
    assert attrs["metric"] == result.metric == "spearman" and attrs["task_kind"] == "similarity"
    assert attrs["num_classes"] is None
    assert len(study.trials) == 3
    assert all(-1.0 <= t.value <= 1.0 for t in study.trials if t.state == TrialState.COMPLETE)
    # the pairs' similarity in the signal layer follows their score: the encoder learns it
    assert result.test_mean > 0.3 and len(result.test_scores) == 2
    # every final seed's encoder also scored zero-shot on SICK-R's test split
    zero_shot = attrs["final_zero_shot"]["sick_r"]
    assert len(zero_shot["scores"]) == 2 and zero_shot["mean"] == pytest.approx(statistics.fmean(zero_shot["scores"]))
    assert zero_shot["mean"] > 0.3


@pytest.mark.slow
@pytest.mark.realmodel
def test_a_real_similarity_model_correlates_on_a_tiny_stsb_subset(tmp_path, data_dir, cache_dir):
    url = sqlite_url(tmp_path / "sts.db")
    options = StudyOptions.from_flat(
        n_trials=3,
        final_seeds=2,
        zero_shot_tasks=["sick_r"],
        data_dir=data_dir,
        cache_dir=cache_dir,
        device="cpu",
        progress=False,
        threads=1,
        max_train=240,
        max_eval=160,
        max_epochs=6,
    )
    result = run_study(MODEL, "stsb", "deepset", storage=url, options=options)[0]
    study = optuna.load_study(study_name=result.study_name, storage=url)
    # MiniLM is a sentence-similarity model: even a tiny subset correlates clearly
    assert result.metric == "spearman" and result.test_mean > 0.3 and len(result.test_scores) == 2
    assert study.user_attrs["final_zero_shot"]["sick_r"]["mean"] > 0.3
    # the default ensemble: up to 5 picks among the 3 trials, its members retrained with the 2 final seeds
    ensemble = ensemble_record(study)
    assert ensemble is not None and ensemble.size == 5 and ensemble.ensemble is not None
    assert len(ensemble.ensemble.test_scores) == 2 and ensemble.ensemble.test_mean > 0.3
    assert ensemble.mix == "mean of the members' predicted cosine similarities"
    assert ensemble.selected_test_scores == result.test_scores  # beside the selected trial, same seeds


def test_best_layer_trials_pick_the_layer_that_carries_the_label(tmp_path, synthetic, no_model_loads):
    # the label in layer 2 of 5 (its own cache: the session cache holds the last-layer signal)
    setup = dataclasses.replace(synthetic, cache_dir=tmp_path / "cache", signal=LayerSignal(layer=2))
    setup.cache("trec", **DATA)
    url = sqlite_url(tmp_path / "best.db")
    result = run_study(
        setup.model,
        "trec",
        "best-layer",
        storage=url,
        options=synthetic_options(setup, n_trials=2, final_seeds=1, sampler="gp", **SMALL),
    )[0]
    study = optuna.load_study(study_name=result.study_name, storage=url)
    for trial in study.trials:
        scores = trial.user_attrs["layer_scores"]
        assert len(scores) == 5
        assert trial.user_attrs["layer"] == max(range(5), key=lambda i: (scores[i], -i)) == 2
        assert trial.user_attrs["config"]["layer"] == trial.user_attrs["layer"]
        assert trial.value == pytest.approx(max(scores))
    best = study.best_trial.user_attrs["layer_scores"]  # the signal layer well above every noise layer
    assert min(best[2] - score for i, score in enumerate(best) if i != 2) > 0.2
    assert study.user_attrs["final_config"]["layer"] == select_trial(study, DEFAULT_SELECT).user_attrs["layer"]


def test_few_shot_study_trains_on_k_examples_per_label(tmp_path, synthetic, no_model_loads):
    synthetic.cache("trec", shots=4, max_eval=100)
    url = sqlite_url(tmp_path / "shots.db")
    result = run_study(
        synthetic.model,
        "trec",
        "last-layer",
        storage=url,
        options=synthetic_options(synthetic, n_trials=2, shots=4, max_eval=100, max_epochs=6, final_seeds=1),
    )[0]
    assert result.study_name == f"{synthetic.model}:trec:last-layer:4shot:eval100:ep6"
    attrs = optuna.load_study(study_name=result.study_name, storage=url).user_attrs
    assert attrs["shots"] == 4 and attrs["split_sizes"]["train"] == 4 * 6
    assert attrs["split_sizes"]["validation"] == 100 and result.test_mean is not None


def test_ctrl_c_fails_the_running_trial_and_a_rerun_resumes(tmp_path, synthetic, monkeypatch, no_model_loads):
    from ilge_search.study.trial import TrialObjective

    url = sqlite_url(tmp_path / "int.db")
    real_trial = TrialObjective.__call__

    def interrupted_in_the_third_trial(self, trial):
        if trial.number == 2:
            raise KeyboardInterrupt
        return real_trial(self, trial)

    monkeypatch.setattr(TrialObjective, "__call__", interrupted_in_the_third_trial)
    synthetic.cache("trec", **DATA)
    options = dict(final_seeds=1, **SMALL)
    with pytest.raises(KeyboardInterrupt):
        run_study(
            synthetic.model,
            "trec",
            "mean-layers",
            storage=url,
            options=synthetic_options(synthetic, n_trials=5, **options),
        )
    name = default_study_name(synthetic.model, "trec", "mean-layers", **SMALL)
    study = optuna.load_study(study_name=name, storage=url)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.FAIL]
    assert "final_test_mean" not in study.user_attrs

    monkeypatch.setattr(TrialObjective, "__call__", real_trial)
    result = run_study(
        synthetic.model, "trec", "mean-layers", storage=url, options=synthetic_options(synthetic, n_trials=2, **options)
    )[0]
    assert (result.n_complete, result.n_failed) == (4, 1)
    assert result.test_mean is not None


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
def test_a_dead_workers_trial_is_failed_and_retried_via_heartbeat(tmp_path, synthetic, trec_study, no_model_loads):
    url = sqlite_url(tmp_path / "hb.db")
    options = dict(final_seeds=0, heartbeat_interval=1, grace_period=2, **SMALL)
    run_study(
        synthetic.model, "trec", "last-layer", storage=url, options=synthetic_options(synthetic, n_trials=1, **options)
    )
    name = default_study_name(synthetic.model, "trec", "last-layer", **SMALL)
    # a worker that asked for a trial, beat once and died
    study = optuna.load_study(study_name=name, storage=open_storage(url, heartbeat_interval=1, grace_period=2).rdb)
    from ilge_search.tuning import suggest_config

    dead = study.ask()
    suggest_config(dead, "last-layer")
    study._storage.record_heartbeat(dead._trial_id)
    time.sleep(3)  # past the grace period: the heartbeat is stale
    result = run_study(
        synthetic.model, "trec", "last-layer", storage=url, options=synthetic_options(synthetic, n_trials=2, **options)
    )[0]
    study = optuna.load_study(study_name=name, storage=url)
    assert study.trials[dead.number].state == TrialState.FAIL
    retried = [t for t in study.trials if t.system_attrs.get("failed_trial") == dead.number]
    assert len(retried) == 1 and retried[0].state == TrialState.COMPLETE
    assert retried[0].params == dead.params
    assert result.n_complete == 3 and result.n_failed == 1
    assert not [t for t in study.trials if t.state == TrialState.RUNNING]
    assert math.isfinite(study.best_value)


@pytest.mark.slow  # two worker processes
@pytest.mark.postgres
def test_plain_postgresql_url_with_two_workers(postgres_url, synthetic, trec_study):
    url = postgres_url.replace("postgresql+psycopg2://", "postgresql://")  # as users write it
    result = run_study(
        synthetic.model,
        "trec",
        "last-layer",
        storage=url,
        options=synthetic_options(synthetic, n_trials=4, workers=2, final_seeds=1, **SMALL),
    )[0]
    study = optuna.load_study(study_name=result.study_name, storage=open_storage(url, heartbeat_interval=None).rdb)
    assert sorted(t.number for t in study.trials) == [0, 1, 2, 3]
    assert all(t.state == TrialState.COMPLETE for t in study.trials)
    assert [t.number for t in study.trials if t.user_attrs.get("recommended")] == [0]
    assert study.user_attrs["task"] == "trec" and len(study.user_attrs["final_test_scores"]) == 1
    assert artifact_dir_for(url) == (Path("studies") / "artifacts").resolve()
