"""Processes that die: the recommended trial is never lost, workers die with their parent, a trial whose
process is gone on this host is failed and retried at once, a SIGKILLed worker loses no trial, and a trial whose
worker died before its first heartbeat is failed and retried.

Real `ilge-search run` processes on the cached trec subset (minilm-l6), signalled with SIGINT or SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from reliability_helpers import (
    MODEL,
    cli_command,
    integrity,
    run_args,
    sqlite_url,
    subprocess_env,
    trial_states,
    trials,
    wait_for,
)

from ilge_search.study import StudyOptions, recommended_params, run_study

pytestmark = [pytest.mark.slow, pytest.mark.realmodel]


def worker_stamps(db: Path) -> dict[int, dict]:
    """``{trial number: its ilge_worker attr}`` of the RUNNING trials, read with plain sqlite3."""
    if not db.exists():
        return {}
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as conn:
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'trial_user_attributes'").fetchone() is None:
            return {}
        rows = conn.execute(
            "SELECT t.number, a.value_json FROM trials t JOIN trial_user_attributes a "
            "ON a.trial_id = t.trial_id WHERE a.key = 'ilge_worker' AND t.state = 'RUNNING'"
        )
        return {number: json.loads(value) for number, value in rows}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (killed, not yet reaped by whoever adopted it) does not run
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def training(db: Path, number: int | None = None):
    """A RUNNING trial that has reported an epoch (optionally: trial ``number``)."""
    return [
        n
        for n, (state, epochs) in trials(db).items()
        if state == "RUNNING" and epochs and (number is None or n == number)
    ]


# ----------------------------------------------------------------------------- the recommended trial


def test_ctrl_c_during_the_recommended_trial_does_not_lose_it(tmp_path, data_dir, trec_cached):
    """Before: trial 0 ended FAIL and the recommended configuration never ran."""
    db = tmp_path / "ctrl-c.db"
    args = run_args(db, data_dir, trec_cached, "--encoder", "cayley", "--max-epochs", "4")
    # SIGINT as a terminal delivers it, even when this test runs under a shell that started it in the background
    # (such a shell makes SIGINT ignored, and children keep an ignored signal)
    proc = subprocess.Popen(
        cli_command(*args, "--n-trials", "5"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert wait_for(lambda: training(db, 0), 240, proc, step=0.01), "trial 0 never started training"
        os.kill(proc.pid, signal.SIGINT)  # what Ctrl-C sends
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, stderr[-2000:]
    assert trials(db)[0][0] == "FAIL"

    rerun = subprocess.run(
        cli_command(*args, "--n-trials", "1"), capture_output=True, text=True, env=subprocess_env(), timeout=300
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    study = optuna.load_study(study_name=f"{MODEL}:trec:cayley:train240:eval160:ep4", storage=sqlite_url(db))
    first, retry = study.trials[0], study.trials[1]
    assert retry.system_attrs.get("failed_trial") == 0 and retry.state == TrialState.COMPLETE
    assert retry.params == first.params == recommended_params("cayley", 384, model=MODEL)
    assert retry.user_attrs["recommended"] is True
    assert integrity(db) == "ok"


def test_a_failing_recommended_trial_is_retried_up_to_max_retry(tmp_path, data_dir, trec_cached, monkeypatch):
    import ilge_search.engine as engine

    real_train = engine.train_encoder

    def broken(*args, **kwargs):
        raise RuntimeError("a fault in the trial")

    url = sqlite_url(tmp_path / "fault.db")
    options_storage = url
    options = dict(
        final_seeds=0,
        data_dir=data_dir,
        cache_dir=trec_cached,
        device="cpu",
        progress=False,
        max_retry=2,
        max_train=240,
        max_eval=160,
        max_epochs=3,
    )
    monkeypatch.setattr(engine, "train_encoder", broken)
    for _ in range(4):  # the first try and two retries fail; the fourth run finds no retry left
        with pytest.raises(RuntimeError, match="a fault in the trial"):
            run_study(
                MODEL,
                "trec",
                "mean-layers",
                storage=options_storage,
                options=StudyOptions.from_flat(n_trials=1, **options),
            )
    name = f"{MODEL}:trec:mean-layers:train240:eval160:ep3"
    study = optuna.load_study(study_name=name, storage=url)
    recommended = [t for t in study.trials if t.user_attrs.get("recommended")]
    assert [t.state for t in recommended] == [TrialState.FAIL] * 3  # tried, retried twice, then left alone
    assert all(t.params == recommended[0].params for t in recommended)
    assert len(study.trials) == 4  # the fourth run sampled a new trial instead

    # once the fault is gone, the next run starts with the recommended configuration again
    fresh_storage = sqlite_url(tmp_path / "fresh.db")
    fresh = dict(
        options,
    )
    with pytest.raises(RuntimeError):
        run_study(
            MODEL, "trec", "mean-layers", storage=fresh_storage, options=StudyOptions.from_flat(n_trials=1, **fresh)
        )
    monkeypatch.setattr(engine, "train_encoder", real_train)
    result = run_study(
        MODEL, "trec", "mean-layers", storage=fresh_storage, options=StudyOptions.from_flat(n_trials=2, **fresh)
    )[0]
    study = optuna.load_study(study_name=name, storage=fresh_storage)
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE]
    assert study.trials[1].params == study.trials[0].params and study.trials[1].user_attrs["recommended"]
    assert (result.n_complete, result.n_failed) == (2, 1)


# ----------------------------------------------------------------------------- killed processes


def test_workers_die_with_their_killed_parent(tmp_path, data_dir, trec_cached):
    """Before: SIGKILL of the parent of `--workers 2` left both workers training on as orphans."""
    db = tmp_path / "orphans.db"
    proc = subprocess.Popen(
        cli_command(
            *run_args(db, data_dir, trec_cached, "--encoder", "cayley", "--workers", "2", "--threads", "1"),
            "--n-trials",
            "40",
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
    )
    try:
        stamps = wait_for(
            lambda: (lambda s: s if len({v["pid"] for v in s.values()}) == 2 else None)(worker_stamps(db)), 240, proc
        )
        assert stamps, "two workers never ran trials at once"
        workers = {stamp["pid"] for stamp in stamps.values()}
        assert proc.pid not in workers
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    # a deadline for the workers to exit, not a timing claim: orphans would train on for minutes
    gone = wait_for(lambda: not any(alive(pid) for pid in workers), 30, step=0.1)
    assert gone, f"workers {[pid for pid in workers if alive(pid)]} outlived their parent"
    states = trials(db)
    assert all(states[number][0] == "FAIL" for number in stamps), states  # each marked its own trial FAIL
    assert not [n for n, (state, _) in states.items() if state == "RUNNING"]
    assert integrity(db) == "ok"


def test_a_trial_whose_process_died_on_this_host_is_retried_by_an_immediate_rerun(tmp_path, data_dir, trec_cached):
    """Before: with the default 60 s heartbeat the dead trial stayed RUNNING for 120 s, so an immediate rerun
    finished while it still counted."""
    db = tmp_path / "host.db"
    args = run_args(db, data_dir, trec_cached, "--encoder", "cayley", "--max-epochs", "4", "--heartbeat-interval", "60")
    proc = subprocess.Popen(
        cli_command(*args, "--n-trials", "50"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
    )
    try:
        mid = wait_for(
            lambda: any(s == "COMPLETE" for s, _ in trials(db).values()) and training(db), 240, proc, step=0.01
        )
        assert mid, "no trial was training"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    dead = [n for n, (state, _) in trials(db).items() if state == "RUNNING"]
    assert len(dead) == 1

    rerun = subprocess.run(
        cli_command(*args, "--n-trials", "1"), capture_output=True, text=True, env=subprocess_env(), timeout=300
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    # repaired at once by the process check, not by the heartbeat rule (its 120 s grace period has not passed:
    # the heartbeat rule would have left the trial RUNNING and said nothing)
    assert f"trial {dead[0]}: its process {proc.pid} on this host is gone; marked FAIL and re-queued" in rerun.stderr
    study = optuna.load_study(study_name=f"{MODEL}:trec:cayley:train240:eval160:ep4", storage=sqlite_url(db))
    assert study.trials[dead[0]].state == TrialState.FAIL
    retried = [t for t in study.trials if t.system_attrs.get("failed_trial") == dead[0]]
    assert len(retried) == 1 and retried[0].state == TrialState.COMPLETE
    assert retried[0].params == study.trials[dead[0]].params
    assert not [t for t in study.trials if t.state == TrialState.RUNNING]
    assert integrity(db) == "ok"


# ----------------------------------------------------------------------------- SIGKILL and heartbeats


def test_sigkilled_worker_loses_no_trial_and_its_trial_is_failed_and_retried(tmp_path, data_dir, trec_cached):
    db = tmp_path / "kill.db"
    options = run_args(db, data_dir, trec_cached, "--encoder", "cayley", "--heartbeat-interval", "1")
    proc = subprocess.Popen(
        cli_command(*options, "--n-trials", "50"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=subprocess_env(),
    )
    try:
        deadline = time.monotonic() + 240
        states: dict[int, str] = {}
        while time.monotonic() < deadline and proc.poll() is None:
            # mid-trial = a RUNNING trial that has already reported an epoch (so it is training, with heartbeats)
            states, training = _progress(db)
            if len([s for s in states.values() if s == "COMPLETE"]) >= 2 and training:
                break
            time.sleep(0.05)
        assert proc.poll() is None, f"the run ended before it could be killed: {proc.stderr.read()[-2000:]!r}"
        completed_before = {n for n, s in states.items() if s == "COMPLETE"}
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL

    after_kill = trial_states(db)
    dead = [n for n, s in after_kill.items() if s == "RUNNING"]
    assert len(dead) == 1, after_kill  # the trial the worker was in when it died
    assert completed_before <= {n for n, s in after_kill.items() if s == "COMPLETE"}
    assert integrity(db) == "ok"
    name = f"{MODEL}:trec:cayley:train240:eval160:ep6"
    values_before = {
        t.number: t.value
        for t in optuna.load_study(study_name=name, storage=sqlite_url(db)).trials
        if t.state == TrialState.COMPLETE
    }

    time.sleep(2.5)  # the dead trial's last heartbeat is now older than the grace period (2 x 1 s)
    rerun = subprocess.run(
        cli_command(*options, "--n-trials", "2"), capture_output=True, text=True, env=subprocess_env(), timeout=300
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]

    study = optuna.load_study(study_name=name, storage=sqlite_url(db))
    trials = {t.number: t for t in study.trials}
    assert trials[dead[0]].state == TrialState.FAIL
    retried = [t for t in study.trials if t.system_attrs.get("failed_trial") == dead[0]]
    assert len(retried) == 1 and retried[0].state == TrialState.COMPLETE
    assert retried[0].params == trials[dead[0]].params
    assert {n: trials[n].value for n in values_before} == values_before  # every finished trial, unchanged
    assert not [t for t in study.trials if t.state == TrialState.RUNNING]
    assert len(study.trials) == len(after_kill) + 2
    assert integrity(db) == "ok"


def _progress(db: Path):
    """Trial states and the RUNNING trials that reported at least one epoch (empty before the study exists)."""
    seen = trials(db)
    states = {number: state for number, (state, _) in seen.items()}
    return states, [number for number, (state, epochs) in seen.items() if state == "RUNNING" and epochs > 0]


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")
def test_a_trial_whose_worker_died_before_its_first_heartbeat_is_failed_and_retried(tmp_path, data_dir, trec_cached):
    """Optuna's stale-trial check only sees trials with a heartbeat; a worker killed between ``study.ask()``
    and its heartbeat thread's first beat (the sampler runs in between) must not leave a trial RUNNING forever."""
    from ilge_search.storage import open_storage
    from ilge_search.study import default_study_name
    from ilge_search.tuning import suggest_config

    url = sqlite_url(tmp_path / "orphan.db")
    options_storage = url
    options = dict(
        final_seeds=0,
        data_dir=data_dir,
        cache_dir=trec_cached,
        device="cpu",
        progress=False,
        heartbeat_interval=1,
        grace_period=2,
        max_train=240,
        max_eval=160,
        max_epochs=6,
    )
    run_study(
        MODEL, "trec", "last-layer", storage=options_storage, options=StudyOptions.from_flat(n_trials=1, **options)
    )
    name = default_study_name(MODEL, "trec", "last-layer", max_train=240, max_eval=160, max_epochs=6)
    study = optuna.load_study(study_name=name, storage=open_storage(url, heartbeat_interval=1, grace_period=2).rdb)
    orphan = study.ask()  # no heartbeat is ever recorded for it
    suggest_config(orphan, "last-layer")
    time.sleep(2.5)
    result = run_study(
        MODEL, "trec", "last-layer", storage=options_storage, options=StudyOptions.from_flat(n_trials=2, **options)
    )[0]
    study = optuna.load_study(study_name=name, storage=url)
    assert study.trials[orphan.number].state == TrialState.FAIL
    retried = [t for t in study.trials if t.system_attrs.get("failed_trial") == orphan.number]
    assert len(retried) == 1 and retried[0].state == TrialState.COMPLETE and retried[0].params == orphan.params
    assert (result.n_complete, result.n_failed) == (3, 1)
    assert not [t for t in study.trials if t.state == TrialState.RUNNING]
