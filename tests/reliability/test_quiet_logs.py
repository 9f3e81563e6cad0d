"""Logs a file can hold: with stderr redirected to a file, progress bars write whole lines (never a carriage
return), a bounded number of them whatever they count (``ilge_search/progress.py``), and the model loading's
own bars are hidden there."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from reliability_helpers import cli_command, subprocess_env

from ilge_search.progress import MILESTONES, BarSpec, LineBar, new_bar, note, steps


def test_a_bar_in_a_file_writes_at_most_a_line_per_tenth_and_no_carriage_return(capsys):
    bar = new_bar(BarSpec("embed tiny", 10_000, "text"))
    assert isinstance(bar, LineBar)  # capsys's stderr is no terminal
    for _ in range(10_000):
        bar.update(1)
    bar.close()
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = err.splitlines()
    assert len(lines) == MILESTONES and lines[-1].startswith("embed tiny: 10000/10000 text")


def test_each_of_a_few_steps_gets_its_line_with_the_postfix_set_before_it(capsys):
    bar = new_bar(BarSpec("study", 3, "trial"))
    for best in (0.5, 0.7, 0.7):
        bar.set_postfix_str(f"best accuracy {best}")
        bar.update(1)
    bar.close()  # nothing new since the last line: no repeat
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" (")[0] for line in lines] == [
        "study: 1/3 trial, best accuracy 0.5",
        "study: 2/3 trial, best accuracy 0.7",
        "study: 3/3 trial, best accuracy 0.7",
    ]


def test_transient_and_disabled_bars_write_nothing_to_a_file_and_notes_are_lines(capsys):
    assert list(steps(range(50), BarSpec("train gin", unit="epoch", transient=True))) == list(range(50))
    with new_bar(BarSpec("hidden", 5, enabled=False)) as bar:
        bar.update(5)
    with new_bar(BarSpec("never started", 0)):
        pass
    note("ilge-search: waiting for another process")
    assert capsys.readouterr().err == "ilge-search: waiting for another process\n"


def test_a_bar_without_a_total_writes_only_when_it_closes(capsys):
    with new_bar(BarSpec("search", None, "trial")) as bar:
        for _ in range(100):
            bar.update(1)
    assert capsys.readouterr().err.splitlines()[0].startswith("search: 100 trial")


def _stderr_of(tmp_path: Path, *args: object) -> str:
    log = tmp_path / "stderr.log"
    with open(log, "w") as handle:
        done = subprocess.run(
            cli_command(*map(str, args)), stdout=subprocess.PIPE, stderr=handle, env=subprocess_env(), timeout=240
        )
    text = log.read_bytes().decode()  # read_text() would turn each "\r" into a newline
    assert done.returncode == 0, text
    return text


@pytest.mark.slow  # a CLI subprocess: torch's import and the run take 10-30 s on 2 shared cores
def test_a_study_logged_to_a_file_has_no_carriage_returns_and_few_lines(tmp_path, synthetic):
    synthetic.cache("trec", max_train=200, max_eval=100)
    err = _stderr_of(
        tmp_path,
        "run",
        *("--model", synthetic.model, "--task", "trec", "--encoder", "mean-layers", "--n-trials", 4),
        *("--max-train", 200, "--max-eval", 100, "--max-epochs", 3, "--final-seeds", 2, "--threads", 1),
        *("--data-dir", synthetic.data_dir, "--cache-dir", synthetic.cache_dir, "--device", "cpu"),
        *("--storage", f"sqlite:///{tmp_path / 's.db'}"),
    )
    assert "\r" not in err
    lines = err.splitlines()
    assert len(lines) < 40, err  # 4 trial lines, the runner's log lines; no epoch or seed bars in a file
    assert sum(" trial, best " in line or line.endswith(" trial") or "/4 trial" in line for line in lines) == 4, err


@pytest.mark.slow  # a CLI subprocess: torch's import and the run take 10-30 s on 2 shared cores
def test_an_extraction_logged_to_a_file_has_no_carriage_returns_and_few_lines(tmp_path, synthetic):
    err = _stderr_of(
        tmp_path,
        "embed",
        *("--model", synthetic.model, "--task", "trec", "--split", "validation", "--batch-size", 4),
        *("--data-dir", synthetic.data_dir, "--cache-dir", tmp_path / "cache", "--device", "cpu"),
    )
    assert "\r" not in err and "Loading weights" not in err
    bar_lines = [line for line in err.splitlines() if line.startswith("embed ")]
    assert 0 < len(bar_lines) <= MILESTONES + 1, err  # one bar (one split) of at most 11 lines


def test_only_the_progress_module_makes_bars():
    package = Path(__file__).resolve().parents[2] / "ilge_search"
    users = [
        str(path.relative_to(package))
        for path in sorted(package.rglob("*.py"))
        if path.name != "progress.py" and "tqdm" in path.read_text(encoding="utf-8")
    ]
    assert not users, f"make bars with ilge_search.progress (new_bar, steps, note), not tqdm: {users}"


def test_predict_hides_the_model_loading_bars_unless_verbose(tmp_path, monkeypatch):
    from click.testing import CliRunner

    import ilge_search.cli.use as use
    import ilge_search.use.predict as predict
    from ilge_search.cli import cli

    hidden = []
    monkeypatch.setattr(use, "quiet_model_loading", lambda: hidden.append(True))
    monkeypatch.setattr(predict, "predict_file", lambda *a, **k: predict.PredictSummary(0, None, "classification", 0.0))
    (tmp_path / "in.txt").write_text("a text\n")
    for verbose in (False, True):
        hidden.clear()
        args = ["predict", str(tmp_path), "--input", str(tmp_path / "in.txt")] + (["--verbose"] if verbose else [])
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output
        assert hidden == ([] if verbose else [True])
