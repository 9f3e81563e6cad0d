"""A trial whose worker died before its objective started is failed and retried, not left RUNNING for good.

Found on a loaded machine: Optuna's heartbeat thread could not start (``RuntimeError: can't start new
thread``), the worker died, and its trial stayed RUNNING with no worker record and no heartbeat; ``studies``
counted it and it counted against ``--total-trials``. Every trial is now stamped with its process the moment
it is created (:func:`ilge_search.record.worker.owner_stamping`), so the next run on this host fails it at once.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import optuna
import pytest
from reliability_helpers import subprocess_env

from ilge_search.record import WORKER_ATTR, owner_stamping
from ilge_search.storage import fail_stale_trials, open_storage

WORKER = textwrap.dedent(
    """
    import sys, threading, optuna
    from ilge_search.record import owner_stamping
    from ilge_search.storage import open_storage

    storage = open_storage(sys.argv[1], heartbeat_interval=60)
    sampler = optuna.samplers.RandomSampler(seed=0)
    if sys.argv[2] == "stamped":
        sampler = owner_stamping(sampler)
    study = optuna.load_study(study_name="s", storage=storage.rdb, sampler=sampler)

    def no_thread(self):
        raise RuntimeError("can't start new thread")

    threading.Thread.start = no_thread  # the heartbeat thread is the first thread a trial starts
    study.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=1)
    """
)


def died_before_its_objective(tmp_path, how: str):
    url = f"sqlite:///{tmp_path / 's.db'}"
    storage = open_storage(url, heartbeat_interval=60)
    study = optuna.create_study(study_name="s", storage=storage.rdb)
    done = subprocess.run(
        [sys.executable, "-c", WORKER, url, how], capture_output=True, text=True, env=subprocess_env(), timeout=120
    )
    assert done.returncode != 0 and "can't start new thread" in done.stderr
    (trial,) = study.get_trials()
    assert trial.state == optuna.trial.TrialState.RUNNING
    return study, storage, trial


def test_a_worker_that_died_before_its_heartbeat_thread_started_leaves_a_trial_the_next_run_fails(tmp_path):
    study, storage, trial = died_before_its_objective(tmp_path, "stamped")
    assert trial.user_attrs[WORKER_ATTR]["trial"] == trial.number  # stamped before anything could run
    fail_stale_trials(study, storage)
    states = [t.state for t in study.get_trials()]
    assert states == [optuna.trial.TrialState.FAIL, optuna.trial.TrialState.WAITING]  # failed and re-queued


def test_without_the_stamp_the_trial_would_stay_running(tmp_path):
    """The case as it was: nothing tells a live worker from a dead one until the heartbeat grace passes."""
    study, storage, trial = died_before_its_objective(tmp_path, "plain")
    assert WORKER_ATTR not in trial.user_attrs
    fail_stale_trials(study, storage)
    assert [t.state for t in study.get_trials()] == [optuna.trial.TrialState.RUNNING]


def test_the_stamping_sampler_samples_as_its_inner_sampler():
    plain = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    stamped = optuna.create_study(sampler=owner_stamping(optuna.samplers.RandomSampler(seed=3)))
    for study in (plain, stamped):
        study.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=4)
    assert [t.params for t in plain.trials] == [t.params for t in stamped.trials]
    assert all(t.user_attrs[WORKER_ATTR]["trial"] == t.number for t in stamped.trials)
    assert "RandomSampler" in repr(stamped.sampler)


@pytest.mark.parametrize("sampler", [None])
def test_no_sampler_means_optunas_default(sampler):
    assert isinstance(owner_stamping(sampler).inner, optuna.samplers.TPESampler)
