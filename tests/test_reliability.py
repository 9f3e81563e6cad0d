"""Reliability: a killed worker, a killed extraction, four workers on one SQLite file and bad input lose nothing.

The process tests run the real `ilge-search` CLI in subprocesses (minilm-l6 on a trec subset whose embeddings
are cached once per session) and kill them with SIGKILL, so no Python cleanup code gets to run.

Unit-level bad-input checks live next to their modules and are not repeated here: aggregator rank/L/D/dtype
(test_aggregator.py::test_wrong_shape_states_expected_and_received, ::test_other_dtypes_are_rejected), NaN/inf
and class ids vs num_classes (test_engine.py), labels that do not match the texts, unseen labels and corrupted
saved classifiers (test_classifier.py), invalid config values and unknown families (test_configs.py,
test_tuning.py), bad storage URLs and study-name reuse in the library (test_study.py), broken cache files
(test_cache.py). Here they are checked end to end through the CLI, together with the absence of side effects.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import optuna
import pytest
from click.testing import CliRunner
from optuna.trial import TrialState

from ilge_search.cache import EmbeddingCache, load_task_embeddings
from ilge_search.cli import cli
from ilge_search.study import StudyOptions

MODEL = "minilm-l6"
# the same subset as tests/test_study.py, so a full test session extracts it once
SMALL_OPTIONS = ["--max-train", "240", "--max-eval", "160", "--max-epochs", "6"]


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


def trial_states(db: Path) -> Dict[int, str]:
    """``{trial number: state}`` read with plain sqlite3 (what a second process sees mid-run)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as conn:
        return dict(conn.execute("SELECT number, state FROM trials ORDER BY number").fetchall())


def integrity(db: Path) -> str:
    with sqlite3.connect(db, timeout=30) as conn:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]


def cli_command(*args: str) -> List[str]:
    """The `ilge-search` entry point, run by this interpreter."""
    return [sys.executable, "-c", "from ilge_search.cli import cli; cli()", *args]


def subprocess_env() -> Dict[str, str]:
    return dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")


@pytest.fixture(scope="module")
def trec_cached(data_dir, cache_dir):
    """Train and validation embeddings of the trec subset, in the session cache (extracted at most once)."""
    from ilge_search.study.data import DataSpec, load_task_data

    task = load_task_data(DataSpec(model=MODEL, task="trec", max_train=240, max_eval=160, data_dir=str(data_dir)))
    load_task_embeddings(MODEL, task, cache_dir=cache_dir, splits=["train", "validation"], device="cpu", progress=False)
    return cache_dir


def run_options(db: Path, data_dir: Path, cache_dir: Path) -> List[str]:
    return [
        "run",
        "--model",
        MODEL,
        "--task",
        "trec",
        "--storage",
        sqlite_url(db),
        "--final-seeds",
        "0",
        "--pruner",
        "none",
        "--data-dir",
        str(data_dir),
        "--cache-dir",
        str(cache_dir),
        "--device",
        "cpu",
        "--quiet",
        *SMALL_OPTIONS,
    ]


# ----------------------------------------------------------------------------- killed processes


@pytest.mark.slow
@pytest.mark.realmodel
def test_sigkilled_worker_loses_no_trial_and_its_trial_is_failed_and_retried(tmp_path, data_dir, trec_cached):
    db = tmp_path / "kill.db"
    options = run_options(db, data_dir, trec_cached) + ["--encoder", "cayley", "--heartbeat-interval", "1"]
    proc = subprocess.Popen(
        cli_command(*options, "--n-trials", "50"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=subprocess_env(),
    )
    try:
        deadline = time.monotonic() + 240
        states: Dict[int, str] = {}
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
    if not db.exists():
        return {}, []
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as conn:
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'trial_intermediate_values'").fetchone() is None:
            return {}, []
        states = dict(conn.execute("SELECT number, state FROM trials").fetchall())
        training = [
            row[0]
            for row in conn.execute(
                "SELECT DISTINCT t.number FROM trials t JOIN trial_intermediate_values v ON v.trial_id = t.trial_id "
                "WHERE t.state = 'RUNNING'"
            )
        ]
    return states, training


@pytest.mark.slow
@pytest.mark.realmodel
def test_sigkill_during_extraction_leaves_no_entry_that_reads_as_valid(tmp_path, data_dir):
    rows = [json.loads(line) for line in (data_dir / "trec" / "train.jsonl").read_text().splitlines()[:600]]
    task_file = tmp_path / "questions.jsonl"
    task_file.write_text("".join(json.dumps({"text": r["text"], "label": r["label"]}) + "\n" for r in rows))
    cache_dir = tmp_path / "cache"
    embed = cli_command(
        "embed",
        "--model",
        MODEL,
        "--task",
        str(task_file),
        "--split",
        "train",
        "--batch-size",
        "2",
        "--cache-dir",
        str(cache_dir),
        "--device",
        "cpu",
        "--quiet",
    )
    proc = subprocess.Popen(embed, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=subprocess_env())
    embeddings = cache_dir / "embeddings"
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if embeddings.is_dir() and list(embeddings.glob(".*.tmp-*")):
                break  # the data file is being written, batch by batch
            time.sleep(0.02)
        time.sleep(0.3)
        assert proc.poll() is None, "the extraction finished before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
        proc.stderr.close()
    assert list(embeddings.glob(".*.tmp-*"))  # the half-written file is there, under its temporary name
    assert EmbeddingCache(cache_dir).ls() == []  # and nothing reads as an entry

    rerun = subprocess.run(embed, capture_output=True, text=True, env=subprocess_env(), timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "train      extracted" in rerun.stdout and "cache hit" not in rerun.stdout
    entries = EmbeddingCache(cache_dir).ls()
    assert [(e.split, e.shape[1:]) for e in entries] == [("train", (7, 384))]
    assert f"features {'x'.join(map(str, entries[0].shape))} float16" in rerun.stdout
    assert EmbeddingCache(cache_dir)._read(entries[0].key) is not None  # size, header and checksum valid


# ----------------------------------------------------------------------------- concurrency


@pytest.mark.slow
@pytest.mark.realmodel
def test_four_workers_on_one_sqlite_file_finish_every_trial(tmp_path, data_dir, trec_cached):
    db = tmp_path / "four.db"
    result = subprocess.run(
        cli_command(
            *run_options(db, data_dir, trec_cached), "--encoder", "last-layer", "--workers", "4", "--n-trials", "8"
        ),
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "database is locked" not in result.stderr + result.stdout
    states = trial_states(db)
    assert sorted(states) == list(range(8))
    assert set(states.values()) == {"COMPLETE"}
    study = optuna.load_study(study_name=f"{MODEL}:trec:last-layer:train240:eval160:ep6", storage=sqlite_url(db))
    assert all(t.user_attrs.get("val_metric") is not None for t in study.trials)
    assert integrity(db) == "ok"


# ----------------------------------------------------------------------------- bad input, end to end


def _write_jsonl(path: Path, rows: List[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


GOOD_ROWS = [{"text": f"question number {i}", "label": "ab"[i % 2]} for i in range(20)]


class TestBadInputHasClearMessageAndNoSideEffects:
    """``ilge-search run`` with one bad input: exit 1, a message naming the problem, no model loaded, no cache
    entry written, no study created or changed."""

    @pytest.fixture(autouse=True)
    def _no_model_loads(self, no_model_loads):
        """Every case must fail before any model or tokenizer loads."""

    @pytest.fixture()
    def paths(self, tmp_path, data_dir):
        """A storage that already holds one trec study, an empty cache and a few broken task files."""
        db = tmp_path / "s.db"
        study = optuna.create_study(study_name="mine", storage=sqlite_url(db), direction="maximize")
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
        study.add_trial(optuna.trial.create_trial(value=0.5, params={}, distributions={}))
        _write_jsonl(tmp_path / "columns.jsonl", [{"sentence": r["text"], "label": r["label"]} for r in GOOD_ROWS])
        _write_jsonl(
            tmp_path / "empty.jsonl", [dict(r, text="" if i == 3 else r["text"]) for i, r in enumerate(GOOD_ROWS)]
        )
        _write_jsonl(tmp_path / "unseen" / "train.jsonl", GOOD_ROWS)
        _write_jsonl(tmp_path / "unseen" / "test.jsonl", [{"text": "a new one", "label": "c"}])
        _write_jsonl(
            tmp_path / "nolabel.jsonl", [dict(r, label=None) if i == 5 else r for i, r in enumerate(GOOD_ROWS)]
        )
        return {"db": db, "cache": tmp_path / "cache", "dir": tmp_path, "data": data_dir}

    CASES = {
        "unknown model": (["--model", "no-such-model"], "is not a local folder, not an alias"),
        "unknown task": (["--task", "no_such_task"], "unknown task 'no_such_task'"),
        "missing column": (["--task", "{dir}/columns.jsonl"], "no column 'text' (columns present: sentence, label)"),
        "empty text": (["--task", "{dir}/empty.jsonl"], "empty text(s) at row(s) 4"),
        "label not in train": (["--task", "{dir}/unseen"], "label(s) that the train split does not have: 'c'"),
        "missing label": (["--task", "{dir}/nolabel.jsonl"], "column 'label' has 1 missing label(s) at row(s) 6"),
        "unreachable storage": (
            ["--storage", "postgresql://postgres@127.0.0.1:1/none"],
            # the storage is named as the user wrote it (storage.open_storage)
            (
                "cannot open the study storage postgresql://postgres@127.0.0.1:1/none: connection to server",
                "Check the URL, that the database server is running",
            ),
        ),
        "name reused for another task": (
            ["--task", "sst2", "--study-name", "mine"],
            "task: stored 'trec', requested 'sst2'",
        ),
        "name reused for another model": (
            ["--model", "smollm2-135m", "--study-name", "mine"],
            "model: stored 'minilm-l6', requested 'smollm2-135m'",
        ),
        "negative trials": (["--n-trials", "-1"], "Invalid value for '--n-trials'"),
        "zero workers": (["--workers", "0"], "Invalid value for '--workers'"),
        "unknown encoder": (["--encoder", "transformer"], "unknown encoder 'transformer'"),
        "shots on a similarity task": (["--task", "stsb", "--shots", "4"], "needs a classification task"),
    }

    @pytest.mark.parametrize("case", list(CASES))
    def test_run(self, case, paths):
        overrides, message = self.CASES[case]
        overrides = [item.format(dir=paths["dir"]) for item in overrides]
        base = {
            "--model": MODEL,
            "--task": "trec",
            "--storage": sqlite_url(paths["db"]),
            "--data-dir": str(paths["data"]),
            "--cache-dir": str(paths["cache"]),
            "--device": "cpu",
            "--n-trials": "1",
            "--final-seeds": "0",
        }
        flags = [item for item in overrides[::2]]
        args = ["run", "--quiet"]
        for key, value in base.items():
            if key not in flags:
                args += [key, value]
        args += overrides
        studies_before = self._studies(paths["db"])

        result = CliRunner().invoke(cli, args)

        messages = (message,) if isinstance(message, str) else message
        assert result.exit_code == (2 if messages[0].startswith("Invalid value") else 1), (
            result.output,
            result.exception,
        )
        assert all(part in " ".join(result.output.split()) for part in messages), result.output
        assert "Traceback" not in result.output
        assert not paths["cache"].exists() or not list(paths["cache"].rglob("*.safetensors"))
        assert self._studies(paths["db"]) == studies_before  # no study created, none changed

    @staticmethod
    def _studies(db: Path):
        storage = optuna.storages.RDBStorage(sqlite_url(db))
        return sorted(
            (s.study_name, s.n_trials, json.dumps(s.user_attrs, sort_keys=True))
            for s in optuna.get_all_study_summaries(storage)
        )


@pytest.mark.slow
@pytest.mark.realmodel
@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")
def test_a_trial_whose_worker_died_before_its_first_heartbeat_is_failed_and_retried(tmp_path, data_dir, trec_cached):
    """Optuna's stale-trial check only sees trials with a heartbeat; a worker killed between ``study.ask()``
    and its heartbeat thread's first beat (the sampler runs in between) must not leave a trial RUNNING forever."""
    from ilge_search.storage import open_storage
    from ilge_search.study import default_study_name, run_study
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
