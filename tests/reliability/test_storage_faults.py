"""Storage faults end with one line and exit status 1 or 2, and leave nothing half-written.

A fresh SQLite file opened by four processes at once, a storage on a full filesystem (a tiny tmpfs, filled
while trials run), a read-only storage folder, a study name longer than a storage keeps, an empty
``--storage`` and a dashboard asked to listen beyond loopback. The filesystem cases mount a tmpfs, which
needs root; they skip with the reason elsewhere.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner
from optuna.trial import TrialState
from reliability_helpers import (
    MODEL,
    cli_command,
    fill,
    integrity,
    remount_read_only,
    run_args,
    sqlite_url,
    subprocess_env,
    tmpfs,
    trials,
    wait_for,
)

from ilge_search.cli import cli

# ----------------------------------------------------------------------------- the schema-creation race

OPENER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from ilge_search.storage import open_storage
    import optuna

    gates, me, count, urls = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    for attempt, url in enumerate(urls):
        gate = gates / str(attempt)
        gate.mkdir(exist_ok=True)
        (gate / me).touch()
        while len(list(gate.iterdir())) < count:   # all processes open the storage in the same instant
            time.sleep(0.001)
        try:
            storage = open_storage(url, heartbeat_interval=60)
            optuna.create_study(study_name="study-" + me, storage=storage.rdb)
            print("ok", flush=True)
        except Exception as exc:
            print(f"{type(exc).__name__}: {exc}"[:300].replace(chr(10), " "), flush=True)
""")


def open_together(urls: list, gates: Path, count: int = 4) -> list:
    """``count`` processes open each of ``urls`` at once (one after the other); per URL, what each printed."""
    gates.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", OPENER, str(gates), str(i), str(count), *urls],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=subprocess_env(),
        )
        for i in range(count)
    ]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err[-2000:]
        outputs.append(out.strip().splitlines())
    return [[lines[i] for lines in outputs] for i in range(len(urls))]


@pytest.mark.slow  # 16 processes, each importing optuna
def test_four_processes_opening_one_fresh_sqlite_file_all_succeed(tmp_path):
    """Before: 0 of 4 tries had all four succeed ("table studies already exists", "UNIQUE constraint failed:
    alembic_version.version_num")."""
    dbs = [tmp_path / f"fresh{attempt}.db" for attempt in range(4)]
    results = open_together([sqlite_url(db) for db in dbs], tmp_path / "gates")
    assert results == [["ok"] * 4] * 4, results
    for db in dbs:
        assert len(optuna.get_all_study_summaries(sqlite_url(db))) == 4
        assert integrity(db) == "ok"


@pytest.mark.slow  # 4 processes, each importing optuna
@pytest.mark.postgres
def test_four_processes_opening_one_fresh_postgresql_database_all_succeed(postgres_url, tmp_path):
    results = open_together([postgres_url], tmp_path / "gates")
    assert results == [["ok"] * 4], results
    assert len(optuna.get_all_study_summaries(postgres_url)) == 4


# ----------------------------------------------------------------------------- full and read-only filesystems


@pytest.mark.slow
@pytest.mark.realmodel
def test_a_storage_on_a_full_filesystem_stops_with_one_line_and_loses_nothing(tmp_path, data_dir, trec_cached):
    """Before: a traceback ending in `AssertionError: Should not reach.` and a trial left RUNNING."""
    with tmpfs(tmp_path / "small", "2m") as small:
        db = small / "studies.db"
        args = run_args(db, data_dir, trec_cached, "--encoder", "cayley", "--max-epochs", "3")
        proc = subprocess.Popen(
            cli_command(*args, "--n-trials", "200"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=subprocess_env(),
        )
        try:

            def mid_trial():  # a trial completed, and the next one is training (it has reported an epoch)
                states = trials(db).values()
                return any(s == "COMPLETE" for s, _ in states) and any(s == "RUNNING" and e for s, e in states)

            assert wait_for(mid_trial, 240, proc, step=0.01), "no trial was training"
            filler = fill(small)
            _, stderr = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == 1, stderr[-3000:]
        lines = stderr.strip().splitlines()
        assert lines[-1].startswith(
            f"Error: cannot write the study storage {sqlite_url(db)}: the database or its "
            "disk is full. Free space on its filesystem"
        ), stderr[-3000:]
        assert "Traceback" not in stderr and "Should not reach" not in stderr
        after_fault = trials(db)
        complete = {n for n, (s, _) in after_fault.items() if s == "COMPLETE"}
        assert integrity(db) == "ok"

        filler.unlink()  # space again: the same command resumes
        rerun = subprocess.run(
            cli_command(*args, "--n-trials", "1"), capture_output=True, text=True, env=subprocess_env(), timeout=300
        )
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        study = optuna.load_study(study_name=f"{MODEL}:trec:cayley:train240:eval160:ep3", storage=sqlite_url(db))
        assert complete <= {t.number for t in study.trials if t.state == TrialState.COMPLETE}
        assert not [t for t in study.trials if t.state == TrialState.RUNNING]  # the interrupted trial was failed
        interrupted = [n for n, (s, _) in after_fault.items() if s in ("RUNNING", "FAIL")]
        assert len(interrupted) == 1, after_fault  # the trial the full disk stopped half-way
        assert study.trials[interrupted[0]].state == TrialState.FAIL  # ... failed, and retried with its parameters
        retries = [t for t in study.trials if t.system_attrs.get("failed_trial") == interrupted[0]]
        assert len(retries) == 1 and retries[0].params == study.trials[interrupted[0]].params
        assert retries[0].state == TrialState.COMPLETE
        assert integrity(db) == "ok"


def test_a_read_only_storage_folder_is_refused_before_any_model_loads(tmp_path, data_dir, no_model_loads):
    """Before: an OSError traceback after the whole extraction."""
    with tmpfs(tmp_path / "ro", "1m") as folder:
        db = folder / "studies.db"
        storage = optuna.storages.RDBStorage(sqlite_url(db))
        optuna.create_study(study_name="kept", storage=storage)
        storage.engine.dispose()  # no open file, or the remount is refused as busy
        remount_read_only(folder)
        cache = tmp_path / "cache"
        result = CliRunner().invoke(
            cli,
            [
                "run",
                "--model",
                MODEL,
                "--task",
                "trec",
                "--storage",
                sqlite_url(db),
                "--data-dir",
                str(data_dir),
                "--cache-dir",
                str(cache),
                "--device",
                "cpu",
                "--n-trials",
                "1",
                "--quiet",
            ],
        )
        assert result.exit_code == 1, (result.output, result.exception)
        assert (
            f"Error: cannot write the study storage {sqlite_url(db)}: the study storage folder {folder} is not "
            "writable (Read-only file system); make it writable or pass another --storage"
            in " ".join(result.output.split())
        )
        assert len(result.output.strip().splitlines()) == 1
        assert not cache.exists()  # nothing extracted
        assert [s.study_name for s in optuna.get_all_study_summaries(sqlite_url(db))] == ["kept"]


# ----------------------------------------------------------------------------- bad storage arguments


def test_a_study_name_longer_than_a_storage_keeps_is_refused_up_front(tmp_path, no_model_loads):
    result = CliRunner().invoke(
        cli,
        [
            "run",
            "--model",
            MODEL,
            "--task",
            "trec",
            "--study-name",
            "x" * 600,
            "--storage",
            sqlite_url(tmp_path / "s.db"),
            "--quiet",
        ],
    )
    assert result.exit_code == 1
    assert (
        "Error: the study name has 600 characters; a study storage keeps at most 512. Pass a shorter "
        "--study-name" in result.output
    )
    assert not (tmp_path / "s.db").exists()


@pytest.mark.postgres
def test_a_long_study_name_on_postgresql_is_a_clear_error_not_a_traceback(postgres_url, data_dir, no_model_loads):
    """Before: `StringDataRightTruncation` traceback from the server."""
    result = CliRunner().invoke(
        cli,
        [
            "run",
            "--model",
            MODEL,
            "--task",
            "trec",
            "--study-name",
            "y" * 600,
            "--storage",
            postgres_url,
            "--data-dir",
            str(data_dir),
            "--quiet",
        ],
    )
    assert result.exit_code == 1 and "keeps at most 512" in result.output
    assert optuna.get_all_study_summaries(postgres_url) == []


def test_an_empty_storage_url_is_refused_not_replaced_by_the_default(tmp_path, monkeypatch, no_model_loads):
    """Before: `--storage ''` silently created ./studies/ilge.db."""
    monkeypatch.chdir(tmp_path)
    for command in (["run", "--model", MODEL, "--task", "trec", "--quiet"], ["studies"], ["dashboard"]):
        result = CliRunner().invoke(cli, [*command, "--storage", ""])
        assert result.exit_code == 1, (command, result.output)
        assert "Error: the storage URL is empty; give one such as sqlite:///studies/ilge.db" in result.output
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- dashboard


def test_the_dashboard_listens_beyond_loopback_only_when_allowed(tmp_path):
    url = sqlite_url(tmp_path / "s.db")
    optuna.create_study(study_name="one", storage=url)
    refused = CliRunner().invoke(cli, ["dashboard", "--storage", url, "--host", "0.0.0.0", "--port", "0"])
    assert refused.exit_code == 1
    assert (
        "--host 0.0.0.0 would let anyone who can reach this machine read, edit and delete studies" in refused.output
        and "pass --allow-remote" in refused.output
    )

    proc = subprocess.Popen(
        cli_command("dashboard", "--storage", url, "--host", "0.0.0.0", "--port", "0", "--allow-remote"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=subprocess_env(),
    )
    try:
        lines = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any("optuna-dashboard on http://0.0.0.0:" in x for x in lines):
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
        assert any(line.startswith("warning: the dashboard listens on 0.0.0.0, not loopback") for line in lines), lines
        assert any("optuna-dashboard on http://0.0.0.0:" in line for line in lines), lines
        os.kill(proc.pid, signal.SIGTERM)
        rest, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0 and "dashboard stopped" in rest


# ----------------------------------------------------------------------------- four workers on one file


@pytest.mark.slow
@pytest.mark.realmodel
def test_four_workers_on_one_sqlite_file_finish_every_trial(tmp_path, data_dir, trec_cached):
    db = tmp_path / "four.db"
    result = subprocess.run(
        cli_command(
            *run_args(db, data_dir, trec_cached, "--encoder", "last-layer", "--workers", "4", "--n-trials", "8")
        ),
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "database is locked" not in result.stderr + result.stdout
    states = {number: state for number, (state, _) in trials(db).items()}
    assert sorted(states) == list(range(8))
    assert set(states.values()) == {"COMPLETE"}
    study = optuna.load_study(study_name=f"{MODEL}:trec:last-layer:train240:eval160:ep6", storage=sqlite_url(db))
    assert all(t.user_attrs.get("val_metric") is not None for t in study.trials)
    assert integrity(db) == "ok"
