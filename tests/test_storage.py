"""The one storage entrance: the same behaviour on every storage kind (SQLite file, PostgreSQL)."""

from __future__ import annotations

import datetime
import os
import pickle

import optuna
import pytest
from optuna.trial import TrialState

from ilge_search.record import WORKER_ATTR, owner_stamping
from ilge_search.storage import (
    Storage,
    StorageError,
    artifact_dir_for,
    count_trials,
    fail_stale_trials,
    finished_trial_count,
    hide_password,
    open_storage,
)


@pytest.fixture(params=["sqlite", "postgresql"])
def storage_url(request, tmp_path):
    """Runs a test once per storage kind, as Optuna's StorageSupplier does."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'studies' / 'ilge.db'}"
    return request.getfixturevalue("postgres_url")


def _objective(trial):
    value = trial.suggest_float("x", 0, 1)
    if trial.number == 1:
        raise optuna.TrialPruned()
    if trial.number == 2:
        raise RuntimeError("a failed trial")
    return value


def test_open_storage_counts_trials_in_the_documented_states(storage_url):
    storage = open_storage(storage_url)
    assert isinstance(storage, Storage) and storage.load_study("absent") is None
    study = optuna.create_study(study_name="s", storage=storage.rdb)
    study.optimize(_objective, n_trials=4, catch=(RuntimeError,))
    assert finished_trial_count(study) == 3  # complete (2) + pruned (1): what budgets count
    assert count_trials(study, ("COMPLETE", "PRUNED", "FAIL")) == 4  # ended: what progress counts
    assert storage.load_study("s").study_name == "s"
    assert [s.study_name for s in storage.study_summaries()] == ["s"]


def test_storage_pickles_by_reopening(storage_url, tmp_path):
    storage = open_storage(storage_url, artifact_dir=tmp_path / "art", heartbeat_interval=5)
    optuna.create_study(study_name="p", storage=storage.rdb)
    copy = pickle.loads(pickle.dumps(storage))
    assert copy.url == storage.url and copy.artifact_dir == storage.artifact_dir
    assert copy.heartbeat_interval == 5 and copy.rdb is not storage.rdb
    assert copy.load_study("p") is not None


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")
def test_a_trial_that_never_sent_a_heartbeat_is_failed_and_retried(storage_url):
    storage = open_storage(storage_url, heartbeat_interval=1, grace_period=2)
    study = optuna.create_study(study_name="h", storage=storage.rdb)
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})  # a worker died right after ask()
    fail_stale_trials(study, storage)
    assert study.trials[0].state == TrialState.RUNNING  # still inside the grace period
    old = datetime.datetime.now() - datetime.timedelta(seconds=30)
    with storage.rdb.engine.begin() as connection:
        connection.exec_driver_sql(
            f"UPDATE trials SET datetime_start = '{old.isoformat(' ')}' WHERE trial_id = {trial._trial_id}"
        )
    fail_stale_trials(study, storage)
    states = [t.state for t in study.trials]
    assert states == [TrialState.FAIL, TrialState.WAITING]  # failed once, re-queued with the same params
    assert study.trials[1].params == study.trials[0].params


def test_missing_sqlite_file_is_refused_only_when_it_must_exist(tmp_path):
    url = f"sqlite:///{tmp_path / 'none' / 'x.db'}"
    with pytest.raises(StorageError, match="no study storage at"):
        open_storage(url, must_exist=True)
    assert not (tmp_path / "none").exists()  # a reader creates nothing
    open_storage(url)
    assert (tmp_path / "none" / "x.db").is_file()  # a writer creates the file and its folder
    open_storage(url, must_exist=True)


@pytest.mark.parametrize(
    "url, message",
    [
        ("not a url", "not a database URL"),
        ("mysql+nosuchdriver://u:secret@127.0.0.1/db", "no database driver"),
        ("postgresql+psycopg2://nobody:secret@127.0.0.1:1/none", "cannot open the study storage"),
    ],
)
def test_bad_urls_say_what_is_wrong_and_hide_the_password(url, message):
    with pytest.raises(StorageError, match=message) as info:
        open_storage(url)
    assert "secret" not in str(info.value)


def test_hide_password_and_artifact_dirs(tmp_path):
    assert hide_password("postgresql://u:secret@h/db") == "postgresql://u:***@h/db"
    assert hide_password("not a url") == "not a url"
    assert artifact_dir_for(f"sqlite:///{tmp_path}/a.db") == tmp_path.resolve() / "artifacts"
    assert artifact_dir_for("postgresql://u@h/db", tmp_path / "x") == (tmp_path / "x").resolve()
    assert artifact_dir_for("postgresql://u@h/db").name == "artifacts"
    assert open_storage("sqlite:///:memory:").is_in_memory


def test_each_trial_is_stamped_once_as_it_is_created_and_a_finished_trials_handle_is_left_alone(storage_url):
    """The owner stamp has one writer (``stamp_worker``, called by the ``owner_stamping`` sampler): a trial
    carries its own number and this process before its objective runs; a ``Trial`` handle made later for a
    finished trial (as the dashboard notes do) neither fails nor changes it."""
    storage = open_storage(storage_url)
    study = optuna.create_study(
        study_name="stamped", storage=storage.rdb, sampler=owner_stamping(optuna.samplers.RandomSampler(seed=0))
    )
    seen = []

    def objective(trial):
        seen.append(study._storage.get_trial(trial._trial_id).user_attrs.get(WORKER_ATTR))
        return trial.suggest_float("x", 0, 1)

    study.optimize(objective, n_trials=2)
    assert [(stamp["trial"], stamp["pid"]) for stamp in seen] == [(0, os.getpid()), (1, os.getpid())]
    finished = study.trials[0]
    assert finished.user_attrs[WORKER_ATTR] == seen[0]
    optuna.trial.Trial(study, finished._trial_id)  # before_trial runs on a COMPLETE trial: no error
    assert study.trials[0].user_attrs == finished.user_attrs and study.trials[0].state == TrialState.COMPLETE


def test_a_study_is_copied_once_whole_and_a_cut_short_copy_is_made_again(tmp_path):
    from ilge_search.storage import StorageError, copy_study_once

    source, target = (open_storage(f"sqlite:///{tmp_path / name}") for name in ("a.db", "b.db"))
    study = optuna.create_study(study_name="s", storage=source.rdb, direction="maximize")
    study.set_user_attr("identity", {"task": "trec"})
    for value in (0.5, 0.7):
        study.add_trial(optuna.trial.create_trial(value=value, user_attrs={"config": {"lr": value}}))
    assert copy_study_once(source, target, "s") is True
    copy = target.load_study("s")
    assert [t.value for t in copy.trials] == [0.5, 0.7] and copy.user_attrs == {"identity": {"task": "trec"}}
    assert copy.trials[1].user_attrs == {"config": {"lr": 0.7}} and copy.direction == study.direction
    copy.add_trial(optuna.trial.create_trial(value=0.9))  # resumed in the target: a rerun keeps it
    assert copy_study_once(source, target, "s") is False and len(target.load_study("s").trials) == 3
    # a copy cut short (its mark still says partial) is deleted and made again
    target.rdb.set_study_system_attr(copy._study_id, "ilge_copied_from", f"partial copy of {source.shown_url}")
    assert copy_study_once(source, target, "s") is True and len(target.load_study("s").trials) == 2
    with pytest.raises(StorageError, match="has no study 'missing' to copy"):
        copy_study_once(source, target, "missing")
