"""Processes SIGKILLed in the middle of a shared study: one during a trial, one during a stage after the search.

Three ``run`` processes share one auto study on PostgreSQL (the test server); two ``sweep`` processes share one
grid on SQLite. A hook module (written next to the test's files, imported before the CLI) makes a chosen
process stop in a trial or in a stage and say so in a file, so each kill lands where it must. The survivor and
a rerun of the same command end with every trial finished, every method's start complete, and one final
evaluation, one ensemble and one leaderboard that agree with each other. Synthetic embeddings: no model loads.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import optuna
import pytest
from reliability_helpers import wait_for

from ilge_search.record import ensemble_record, leaderboard_record, study_record, trial_config, trial_record

DATA = dict(max_train=240, max_eval=100)
METHODS = "last-layer,mlp-last"

HOOK = '''
"""Stop in a trial or a stage (ILGE_TEST_HANG: "trial" or a stage's name), after writing this pid to
ILGE_TEST_HANG_FILE, until killed."""
import os
import time
from pathlib import Path

WHERE = os.environ.get("ILGE_TEST_HANG")


def _hang(*args, **kwargs):
    Path(os.environ["ILGE_TEST_HANG_FILE"]).write_text(str(os.getpid()))
    while True:
        time.sleep(0.2)


if WHERE == "trial":
    from ilge_search.study.trial import TrialObjective

    TrialObjective.__call__ = _hang
elif WHERE:
    from ilge_search.study.stages import registered_stages

    type(next(s for s in registered_stages() if s.name == WHERE)).run = _hang
'''


def _command(hooks: Path, *args: str) -> list[str]:
    code = "import kill_hook; from ilge_search.cli import main; main()"
    return [sys.executable, "-c", code, *args]


def _env(hooks: Path, where: str | None = None, mark: Path | None = None) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(hooks), env.get("PYTHONPATH", "")) if p)
    env.pop("ILGE_TEST_HANG", None)
    if where is not None:
        env.update(ILGE_TEST_HANG=where, ILGE_TEST_HANG_FILE=str(mark))
    return env


def _hooks(tmp_path: Path) -> Path:
    folder = tmp_path / "hooks"
    folder.mkdir()
    (folder / "kill_hook.py").write_text(textwrap.dedent(HOOK))
    return folder


def _kill_when_marked(process: subprocess.Popen, mark: Path, timeout: float = 120) -> None:
    """SIGKILL ``process`` once it wrote ``mark`` (it is then stopped where the hook holds it)."""
    reached = wait_for(mark.exists, timeout, process)
    if process.poll() is None:
        os.kill(process.pid, signal.SIGKILL)
    output = process.communicate(timeout=30)[0]
    assert reached, f"never reached its hang: {output[-2000:]}"
    assert process.returncode == -signal.SIGKILL


def _finish(process: subprocess.Popen, timeout: float = 120) -> str:
    try:
        output = process.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    assert process.returncode == 0, output[-3000:]
    return output


def _check_consistent(study: optuna.Study) -> None:
    """No trial RUNNING, every method's start complete, and one final evaluation, ensemble and leaderboard
    that agree: the leaderboard's selected trial is the final one, its ensemble the stored one, and its
    methods those of the complete trials."""
    states = {t.number: t.state.name for t in study.trials}
    assert set(states.values()) <= {"COMPLETE", "PRUNED", "FAIL"}, states
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    started = {trial_config(t).family for t in complete if trial_record(t).recommended}
    assert started == set(METHODS.split(",")), states
    final = study_record(study).final
    ensemble = ensemble_record(study)
    board = leaderboard_record(study)
    assert final is not None and ensemble is not None and board is not None
    assert ensemble.candidates is not None and set(ensemble.candidates) == {t.number for t in complete}
    selected = board.row("selected")
    assert selected is not None and set(selected.members) == {str(final.trial)}
    stored = ensemble.ensemble
    row = board.row("ensemble")
    assert stored is not None and row is not None and row.members == {str(k): int(v) for k, v in stored.members.items()}
    assert {r.name for r in board.rows if r.kind == "method"} == {trial_config(t).family for t in complete}


def _run_args(synthetic, storage: str, tmp_path: Path) -> list[str]:
    return [
        "run",
        *("--model", synthetic.model, "--task", "trec", "--encoder", "auto", "--methods", METHODS),
        *("--storage", storage, "--final-seeds", "1", "--ensemble", "2", "--max-epochs", "2"),
        *("--max-train", str(DATA["max_train"]), "--max-eval", str(DATA["max_eval"])),
        *("--data-dir", str(synthetic.data_dir), "--cache-dir", str(synthetic.cache_dir)),
        *("--artifact-dir", str(tmp_path / "artifacts"), "--device", "cpu", "--threads", "1", "--quiet"),
    ]


@pytest.mark.postgres
def test_three_processes_on_one_auto_study_survive_kills_in_a_trial_and_in_a_stage(synthetic, postgres_url, tmp_path):
    synthetic.cache("trec", **DATA)
    hooks = _hooks(tmp_path)
    args = _run_args(synthetic, postgres_url, tmp_path)
    in_trial, in_stage = tmp_path / "in-trial", tmp_path / "in-stage"
    spawn = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    trial_victim = subprocess.Popen(
        _command(hooks, *args, "--n-trials", "1", "--seed", "0"), env=_env(hooks, "trial", in_trial), **spawn
    )
    stage_victim = subprocess.Popen(
        _command(hooks, *args, "--n-trials", "2", "--seed", "1"), env=_env(hooks, "ensemble", in_stage), **spawn
    )
    survivor = subprocess.Popen(_command(hooks, *args, "--n-trials", "2", "--seed", "2"), env=_env(hooks), **spawn)
    try:
        _kill_when_marked(trial_victim, in_trial)
        _kill_when_marked(stage_victim, in_stage)
        _finish(survivor)
    finally:
        for process in (trial_victim, stage_victim, survivor):
            if process.poll() is None:
                process.kill()
    _finish(subprocess.Popen(_command(hooks, *args, "--n-trials", "1"), env=_env(hooks), **spawn))
    (summary,) = optuna.get_all_study_summaries(postgres_url)
    _check_consistent(optuna.load_study(study_name=summary.study_name, storage=postgres_url))


def test_two_sweep_processes_on_sqlite_survive_a_kill_in_a_trial_and_in_a_stage(synthetic, tmp_path):
    """Two ``sweep`` processes on one grid: one SIGKILLed in a trial, the other in the ensemble stage after its
    search; a rerun of the sweep ends the grid's study finished and consistent."""
    synthetic.cache("trec", **DATA)
    hooks = _hooks(tmp_path)
    url = f"sqlite:///{tmp_path / 's.db'}"
    grid = tmp_path / "grid.toml"
    methods = ", ".join(f'"{m}"' for m in METHODS.split(","))
    grid.write_text(
        f'storage = "{url}"\nmodels = ["{synthetic.model}"]\nencoders = ["auto"]\nmethods = [{methods}]\n'
        f"final_seeds = 1\nensemble = 2\nthreads = 1\nmax_epochs = 2\nmax_train = {DATA['max_train']}\n"
        f"max_eval = {DATA['max_eval']}\n[trials]\ndefault = 4\n[tasks.trec]\n"
    )
    args = ["sweep", str(grid), "--data-dir", str(synthetic.data_dir), "--cache-dir", str(synthetic.cache_dir)]
    args += ["--artifact-dir", str(tmp_path / "artifacts"), "--device", "cpu", "--quiet"]
    in_trial, in_stage = tmp_path / "in-trial", tmp_path / "in-stage"
    spawn = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    trial_victim = subprocess.Popen(_command(hooks, *args), env=_env(hooks, "trial", in_trial), **spawn)
    stage_victim = subprocess.Popen(_command(hooks, *args), env=_env(hooks, "ensemble", in_stage), **spawn)
    try:
        _kill_when_marked(trial_victim, in_trial)
        _kill_when_marked(stage_victim, in_stage)
    finally:
        for process in (trial_victim, stage_victim):
            if process.poll() is None:
                process.kill()
    _finish(subprocess.Popen(_command(hooks, *args), env=_env(hooks), **spawn))
    (summary,) = optuna.get_all_study_summaries(url)
    _check_consistent(optuna.load_study(study_name=summary.study_name, storage=url))
