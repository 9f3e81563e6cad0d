"""Several separate `ilge-search run` processes sharing one study on PostgreSQL (the multi-node recipe)."""

from __future__ import annotations

import os
import subprocess
import sys

import optuna
import pytest
from optuna.trial import TrialState

from ilge_search.study import default_study_name, recommended_params
from ilge_search.study.data import DataSpec, load_study_data

MODEL = "minilm-l6"
SMALL = dict(max_train=240, max_eval=160, max_epochs=4)
WORKERS = 3
SHARES = (3, 2, 2)  # trials each process adds
TOTAL = sum(SHARES)


def _cache_files(cache_dir):
    folder = cache_dir / "embeddings"
    return {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} if folder.is_dir() else {}


def _run_processes(encoder, shares, postgres_url, data_dir, cache_dir, tmp_path):
    """``len(shares)`` separate ``run`` processes on one study, process ``i`` adding ``shares[i]`` trials."""
    command = [
        sys.executable,
        "-c",
        "from ilge_search.cli import main; main()",
        "run",
        "--model",
        MODEL,
        "--task",
        "trec",
        "--encoder",
        encoder,
        "--storage",
        postgres_url,
        "--pruner",
        "none",
        "--final-seeds",
        "1",
        "--max-train",
        str(SMALL["max_train"]),
        "--max-eval",
        str(SMALL["max_eval"]),
        "--max-epochs",
        str(SMALL["max_epochs"]),
        "--artifact-dir",
        str(tmp_path / "artifacts"),
        "--cache-dir",
        str(cache_dir),
        "--data-dir",
        str(data_dir),
        "--device",
        "cpu",
        "--quiet",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")  # three processes on two cores
    processes = [
        subprocess.Popen(
            [*command, "--seed", str(i), "--n-trials", str(share)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for i, share in enumerate(shares)
    ]
    outputs = []
    for process in processes:
        try:
            outputs.append(process.communicate(timeout=240)[0])
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            raise
    for process, output in zip(processes, outputs, strict=True):
        assert process.returncode == 0, output[-3000:]
    return outputs


def _cache_once(data_dir, cache_dir):
    """The embeddings cached up front, in the cache every worker shares; the cache's files."""
    spec = DataSpec(
        model=MODEL,
        task="trec",
        max_train=SMALL["max_train"],
        max_eval=SMALL["max_eval"],
        data_dir=str(data_dir),
        cache_dir=str(cache_dir),
        device="cpu",
    )
    load_study_data(spec, with_test=True, progress=False)
    cached = _cache_files(cache_dir)
    assert cached
    return cached


@pytest.mark.slow
@pytest.mark.realmodel
@pytest.mark.postgres
def test_three_worker_processes_share_one_study(postgres_url, data_dir, cache_dir, tmp_path):
    cached = _cache_once(data_dir, cache_dir)  # embeddings cached once, up front

    _run_processes("fc", SHARES, postgres_url, data_dir, cache_dir, tmp_path)

    name = default_study_name(MODEL, "trec", "fc", **{k: SMALL[k] for k in ("max_train", "max_eval", "max_epochs")})
    study = optuna.load_study(study_name=name, storage=postgres_url)
    trials = study.trials
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    # exactly the requested number, however the three processes interleaved
    assert len(complete) == TOTAL
    assert len(trials) == TOTAL  # nothing failed, nothing ran twice
    numbers = [t.number for t in trials]
    assert sorted(numbers) == list(range(len(trials)))  # unique, no gaps
    # the recommended configuration ran once, first
    recommended = [t for t in trials if t.user_attrs.get("recommended")]
    assert len(recommended) == 1 and recommended[0].number == 0 and recommended[0].state == TrialState.COMPLETE
    assert recommended[0].params == recommended_params("fc", hidden_size=384)
    assert sum(t.params == recommended[0].params for t in trials) == 1

    # identity recorded once; the final evaluation ran on the study's best trial
    attrs = study.user_attrs
    assert (attrs["model"], attrs["task"], attrs["encoder"]) == (MODEL, "trec", "fc")
    assert attrs["final_trial"] in numbers and len(attrs["final_test_scores"]) == 1

    # each trial's dashboard note was written once, by the process that ran it; the study's has its test score
    from optuna_dashboard import get_note

    for trial in trials:
        assert get_note(optuna.trial.Trial(study, trial._trial_id)).startswith(f"## Trial {trial.number} · fc · ")
    assert "over 1 seed:" in get_note(study)

    # no worker extracted again: the cache files are the ones written up front
    assert _cache_files(cache_dir) == cached


@pytest.mark.slow
@pytest.mark.realmodel
@pytest.mark.postgres
def test_three_processes_share_one_auto_study(postgres_url, data_dir, cache_dir, tmp_path):
    # every method's start is queued once, whichever process creates the study, and run by exactly one process
    from ilge_search.record import leaderboard_record
    from ilge_search.study.auto import METHOD_PARAM, auto_methods

    cached = _cache_once(data_dir, cache_dir)
    methods = auto_methods(None, tagging=False)
    shares = (3, 3, 3)
    outputs = _run_processes("auto", shares, postgres_url, data_dir, cache_dir, tmp_path)

    name = default_study_name(MODEL, "trec", "auto", **{k: SMALL[k] for k in ("max_train", "max_eval", "max_epochs")})
    study = optuna.load_study(study_name=name, storage=postgres_url)
    trials = study.trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * sum(shares)
    assert sorted(t.number for t in trials) == list(range(sum(shares)))
    starts = [t.params[METHOD_PARAM] for t in trials[: len(methods)]]
    assert sorted(starts) == sorted(methods)  # each method's start ran once, before any searched trial
    assert study.user_attrs["encoder"] == "auto"
    # the final evaluation, the ensemble and the leaderboard ran once, on the finished study
    board = leaderboard_record(study)
    assert board is not None
    assert {row.name for row in board.rows if row.kind == "method"} == set(methods)
    assert len(board.seeds) == 1  # --final-seeds 1
    assert any("vs best layer" in output for output in outputs)  # a process printed it
    assert _cache_files(cache_dir) == cached
