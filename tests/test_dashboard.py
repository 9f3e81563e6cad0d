"""Notes, the artifact store and the dashboard server; end to end with a real study and headless Chromium."""

from __future__ import annotations

import json
import queue
import re
import subprocess
import sys
import threading
import time
import urllib.request

import optuna
import pytest
from click.testing import CliRunner
from optuna_dashboard import get_note

from ilge_search.cli import cli
from ilge_search.record import StudyRecord
from ilge_search.report.dashboard import (
    DirectoriesArtifactStore,
    dashboard_artifact_dirs,
    make_dashboard_app,
    serve_dashboard,
)
from ilge_search.study import StorageError, StudyOptions, artifact_dir_for
from ilge_search.study.notes import (
    TrialCounts,
    TrialOutcome,
    study_note_markdown,
    trial_note_markdown,
    write_notes,
    write_study_note,
    write_trial_note,
)

MODEL = "minilm-l6"
SMALL = dict(max_train=240, max_eval=100, max_epochs=6)  # the subset of tests/test_study.py: its cache entries


def sqlite_url(path) -> str:
    return f"sqlite:///{path}"


def trial_note(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> str:
    return get_note(optuna.trial.Trial(study, trial._trial_id))


# ----------------------------------------------------------------------------- Markdown


def test_trial_note_shows_scores_and_marks_tuned_fields():
    config = {"family": "cayley", "conv_type": "gin", "hidden_dim": 256, "lr": 0.0012345, "pooling": "a|b"}
    text = trial_note_markdown(
        4,
        config,
        metric="accuracy",
        outcome=TrialOutcome(val_metric=0.8125, num_trainable_params=123456, epochs_run=6, best_epoch=5, seconds=1.234),
        tuned=["lr", "hidden_dim"],
        recommended=True,
    )
    lines = text.splitlines()
    assert lines[0] == "## Trial 4 · cayley · complete"
    assert "recommended configuration" in text
    assert "| validation accuracy | trainable parameters | epochs | seconds |" in lines
    assert "| 0.8125 (epoch 5) | 123,456 | 6 | 1.23 |" in lines
    assert "| hidden_dim | 256 | ✓ |" in lines and "| lr | 0.001234 | ✓ |" in lines
    assert "| conv_type | gin |  |" in lines
    assert "| pooling | a\\|b |  |" in lines  # a pipe cannot break the table
    assert not any(line.startswith("| family") for line in lines)  # it is in the title

    pruned = trial_note_markdown(
        5, {"family": "fc"}, metric="spearman", state="pruned", outcome=TrialOutcome(epochs_run=2)
    )
    assert pruned.startswith("## Trial 5 · fc · pruned")
    assert "Pruned after epoch 2" in pruned and "| - | - | 2 | - |" in pruned


def test_study_note_has_mean_std_per_seed_and_artifact_links():
    attrs = {
        "model": MODEL,
        "task": "trec",
        "encoder": "fc",
        "metric": "accuracy",
        "task_kind": "classification",
        "num_layers": 7,
        "hidden_size": 384,
        "num_classes": 6,
        "split_sizes": {"train": 240, "test": 160},
        "max_train": 240,
    }
    counts = TrialCounts(complete=5, pruned=1, best_trial=2, best_value=0.75)
    before = study_note_markdown(StudyRecord.from_attrs("s", attrs), counts, study_id=3)
    assert before.splitlines()[0] == "## minilm-l6 · trec · fc"
    assert "7 hidden states × 384" in before and "train 240, test 160" in before and "max train 240" in before
    assert "Trials: 5 complete, 1 pruned, 0 failed." in before
    assert "Best validation accuracy: **0.7500** (trial 2)." in before
    assert "No final evaluation yet" in before

    attrs.update(
        final_test_scores=[0.8, 0.9],
        final_test_mean=0.85,
        final_test_std=0.0707,
        final_seeds=[1000, 1001],
        final_val_scores=[0.7, 0.75],
        final_trial=2,
        final_artifact_seed=1001,
        final_artifacts={"weights": "w-1", "config": "c-2"},
    )
    after = study_note_markdown(StudyRecord.from_attrs("s", attrs), study_id=3)
    assert "**0.8500 ± 0.0707** over 2 seeds" in after and "trial 2's configuration" in after
    assert "| 1000 | 0.7000 | 0.8000 |  |" in after and "| 1001 | 0.7500 | 0.9000 | ✓ |" in after
    assert "[weights](/artifacts/3/w-1)" in after and "[config](/artifacts/3/c-2)" in after


# ----------------------------------------------------------------------------- notes in a storage


def _fake_runner_study(url: str) -> optuna.Study:
    """A study with the user attrs the study runner records (the trials do no training)."""
    study = optuna.create_study(study_name="notes", storage=url, direction="maximize")
    study.set_user_attr("metric", "accuracy")

    def objective(trial):
        lr = trial.suggest_float("lr", 1e-4, 1e-2, log=True)
        trial.set_user_attr("config", {"family": "fc", "lr": lr, "hidden_dim": 128})
        for key, value in {
            "val_metric": 0.5 + trial.number / 10,
            "num_trainable_params": 1000 + trial.number,
            "epochs_run": 3,
            "best_epoch": 2,
            "seconds": 0.5,
        }.items():
            trial.set_user_attr(key, value)
        if trial.number == 2:
            raise optuna.TrialPruned()
        return 0.5 + trial.number / 10

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study.optimize(objective, n_trials=3)
    return study


def test_write_notes_backfills_each_finished_trial_once_and_the_study(tmp_path):
    study = _fake_runner_study(sqlite_url(tmp_path / "s.db"))
    assert write_notes(study) == 3
    for trial in study.trials:
        note = trial_note(study, trial)
        assert note.startswith(f"## Trial {trial.number} · fc · {trial.state.name.lower()}")
        assert f"| {0.5 + trial.number / 10:.4f} (epoch 2) | {1000 + trial.number:,} | 3 | 0.50 |" in note
        assert "| lr |" in note and "✓" in note
    assert "Best validation accuracy: **0.6000** (trial 1)." in get_note(study)

    assert write_notes(study) == 0  # nothing missing
    assert write_notes(study, overwrite=True) == 3
    body = write_trial_note(study, study.trials[0], state="fail")
    assert trial_note(study, study.trials[0]) == body and "· fail" in body
    assert write_study_note(study) == get_note(study)


def test_a_live_trial_gets_its_note_inside_the_objective(tmp_path):
    study = optuna.create_study(storage=sqlite_url(tmp_path / "s.db"), direction="maximize")

    def objective(trial):
        trial.set_user_attr("config", {"family": "deepset", "lr": trial.suggest_float("lr", 0.001, 0.01)})
        trial.set_user_attr("val_metric", 0.25)
        write_trial_note(study, trial, metric="spearman")
        return 0.25

    study.optimize(objective, n_trials=1)
    assert "| validation spearman |" in trial_note(study, study.trials[0])
    assert "| 0.2500 |" in trial_note(study, study.trials[0])


# ----------------------------------------------------------------------------- artifact store


def test_directories_artifact_store_reads_everywhere_and_writes_first(tmp_path):
    import io

    from optuna.artifacts.exceptions import ArtifactNotFound

    first, second = tmp_path / "first", tmp_path / "second"
    second.mkdir()
    (second / "abc-1").write_bytes(b"weights")
    store = DirectoriesArtifactStore([first, second])
    assert store.open_reader("abc-1").read() == b"weights"
    store.write("def-2", io.BytesIO(b"figure"))
    assert (first / "def-2").read_bytes() == b"figure"
    store.remove("abc-1")
    assert not (second / "abc-1").exists()
    with pytest.raises(ArtifactNotFound):
        store.open_reader("abc-1")
    with pytest.raises(ValueError):
        store.open_reader("../outside")


def test_artifact_dirs_follow_the_runner_and_the_recorded_dirs(tmp_path):
    url = sqlite_url(tmp_path / "s.db")
    study = optuna.create_study(study_name="a", storage=url)
    elsewhere = tmp_path / "shared" / "artifacts"
    elsewhere.mkdir(parents=True)
    study.set_user_attr("artifact_dir", str(elsewhere))
    optuna.create_study(study_name="b", storage=url).set_user_attr("artifact_dir", str(tmp_path / "gone"))
    storage = optuna.storages.RDBStorage(url)
    assert dashboard_artifact_dirs(url, storage) == [artifact_dir_for(url), elsewhere.resolve()]
    assert dashboard_artifact_dirs(url, storage, tmp_path / "x") == [(tmp_path / "x").resolve()]


# ----------------------------------------------------------------------------- server errors


def test_a_missing_sqlite_file_is_refused_not_created(tmp_path):
    with pytest.raises(StorageError, match="no study storage"):
        make_dashboard_app(sqlite_url(tmp_path / "absent.db"))
    result = CliRunner().invoke(cli, ["dashboard", "--storage", sqlite_url(tmp_path / "absent.db")])
    assert result.exit_code == 1 and "no study storage" in result.output
    assert not (tmp_path / "absent.db").exists()


def test_a_port_in_use_is_a_clear_error(tmp_path):
    import socket

    url = sqlite_url(tmp_path / "s.db")
    optuna.create_study(storage=url)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ValueError, match=f"cannot listen on 127.0.0.1:{port}.*another --port"):
            serve_dashboard(url, port=port, echo=lambda line: None)
    with pytest.raises(ValueError, match="cannot resolve host"):
        serve_dashboard(url, host="no-such-host.invalid", port=0, allow_remote=True, echo=lambda line: None)


# ----------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def small_study(tmp_path_factory, synthetic):
    """A real 3-trial fc study on the synthetic trec subset with 2 final seeds (weights uploaded; no model
    loads)."""
    from ilge_search.study import run_study
    from ilge_search.testing import refuse_model_loads

    root = tmp_path_factory.mktemp("dashboard")
    url = sqlite_url(root / "studies.db")
    notes_while_running = {}

    def note_so_far(study, trial):  # runs right after each trial, long before the run ends
        notes_while_running[trial.number] = trial_note(study, trial)

    synthetic.cache("trec", max_train=SMALL["max_train"], max_eval=SMALL["max_eval"])
    options = StudyOptions.from_flat(
        n_trials=3,
        final_seeds=2,
        ensemble=0,
        seed=0,
        data_dir=synthetic.data_dir,
        cache_dir=synthetic.cache_dir,
        device="cpu",
        progress=False,
        **SMALL,
    )
    with refuse_model_loads():
        result = run_study(synthetic.model, "trec", "fc", storage=url, callbacks=[note_so_far], options=options)[0]
    return root, url, result, notes_while_running


def test_each_trial_has_its_note_as_soon_as_it_finishes(small_study):
    _root, url, result, notes_while_running = small_study
    study = optuna.load_study(study_name=result.study_name, storage=url)
    assert sorted(notes_while_running) == [0, 1, 2]
    for trial in study.trials:
        assert notes_while_running[trial.number] == trial_note(study, trial)  # the live note is the final one
        assert (
            f"| {trial.user_attrs['val_metric']:.4f} (epoch {trial.user_attrs['best_epoch']})"
            in (notes_while_running[trial.number])
        )


def _get_json(url: str):
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.status == 200
        return json.loads(response.read())


def _start_dashboard(url: str):
    """``ilge-search dashboard --port 0`` as a subprocess; returns it and the URL it printed."""
    command = [
        sys.executable,
        "-c",
        "from ilge_search.cli import main; main()",
        "dashboard",
        "--storage",
        url,
        "--port",
        "0",
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True)
    reader.start()
    deadline = time.monotonic() + 60
    seen = []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            if process.poll() is not None:
                break
            continue
        seen.append(line)
        match = re.search(r"optuna-dashboard on (http://127\.0\.0\.1:\d+)/dashboard", line)
        if match:
            return process, match.group(1), lines, reader
    process.kill()
    pytest.fail(f"the dashboard did not start: {''.join(seen)}")


def _wait_until_answering(base: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            _get_json(f"{base}/api/meta")
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.mark.slow  # a dashboard process and a headless browser
def test_dashboard_serves_the_study_notes_and_weights_and_renders_in_chromium(
    small_study, tmp_path, synthetic, chromium
):
    root, url, result, _ = small_study

    process, base, output, reader = _start_dashboard(url)
    try:
        _wait_until_answering(base)
        assert _get_json(f"{base}/api/meta")["artifact_is_available"] is True

        # the study and its user attrs through the JSON API
        summaries = _get_json(f"{base}/api/studies")["study_summaries"]
        [summary] = [s for s in summaries if s["study_name"] == result.study_name]
        attrs = {a["key"]: a["value"] for a in summary["user_attrs"]}
        expected = (synthetic.model, "trec", "fc", "accuracy")
        assert (attrs["model"], attrs["task"], attrs["encoder"], attrs["metric"]) == expected
        assert float(attrs["final_test_mean"]) == pytest.approx(result.test_mean)
        study_id = summary["study_id"]

        # every finished trial carries its note; the study note has the final test scores
        detail = _get_json(f"{base}/api/studies/{study_id}")
        assert detail["name"] == result.study_name and len(detail["trials"]) == 3
        for trial in detail["trials"]:
            note = trial["note"]["body"]
            user = {a["key"]: a["value"] for a in trial["user_attrs"]}
            assert note.startswith(f"## Trial {trial['number']} · fc · {trial['state'].lower()}")
            assert f"{int(user['num_trainable_params']):,}" in note and "### Configuration" in note
            if trial["state"] == "Complete":
                assert f"| {float(user['val_metric']):.4f} (epoch {user['best_epoch']})" in note
        study_note = detail["note"]["body"]
        assert f"**{result.test_mean:.4f} ± {result.test_std:.4f}** over 2 seeds" in study_note
        weights_id = result.artifacts["weights"]
        assert f"(/artifacts/{study_id}/{weights_id})" in study_note

        # the weights download through the link in the note, byte for byte
        with urllib.request.urlopen(f"{base}/artifacts/{study_id}/{weights_id}", timeout=30) as response:
            downloaded = response.read()
        assert downloaded == (root / "artifacts" / weights_id).read_bytes() and len(downloaded) > 1000

        # the study page renders in a real browser
        profile = tmp_path / "chromium-profile"
        page = subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                "--virtual-time-budget=15000",
                "--dump-dom",
                f"{base}/dashboard/studies/{study_id}",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        dom = page.stdout
        assert result.study_name in dom, page.stderr[-2000:]
        assert "Study User Attributes" in dom and "Study Artifacts" in dom
    finally:
        process.terminate()
        try:
            code = process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
    assert code == 0
    reader.join(timeout=10)
    rest = []
    while not output.empty():
        rest.append(output.get())
    assert "dashboard stopped" in "".join(rest)
