"""What `run` says about its inputs: which defaults file its starting configuration came from, and the
column options custom task files need (on the synthetic setup: no language model loads)."""

from __future__ import annotations

import logging
import shutil

import optuna
import pytest
from reliability_helpers import sqlite_url

from ilge_search.study import StudyOptions, run_study
from ilge_search.testing import refuse_model_loads
from ilge_search.tuning import RECOMMENDED_DEFAULTS_PATH

DATA = dict(max_train=240, max_eval=100, max_epochs=2)


def options(synthetic, **flat) -> StudyOptions:
    return StudyOptions.from_flat(
        data_dir=synthetic.data_dir,
        cache_dir=synthetic.cache_dir,
        device="cpu",
        progress=False,
        threads=1,
        n_trials=1,
        final_seeds=0,
        **DATA,
        **flat,
    )


def test_a_user_defaults_file_is_named_in_one_line(synthetic, tmp_path, monkeypatch, caplog):
    synthetic.cache("trec", max_train=240, max_eval=100)
    url = sqlite_url(tmp_path / "s.db")
    monkeypatch.setenv("ILGE_SEARCH_DEFAULTS", str(tmp_path / "none.json"))
    with caplog.at_level(logging.WARNING), refuse_model_loads():
        run_study(synthetic.model, "trec", "deepset", storage=url, options=options(synthetic))
    assert not [r for r in caplog.records if "user defaults file" in r.getMessage()]  # the shipped ones: silent

    user = tmp_path / "mine.json"
    shutil.copyfile(RECOMMENDED_DEFAULTS_PATH, user)
    monkeypatch.setenv("ILGE_SEARCH_DEFAULTS", str(user))
    caplog.clear()
    with caplog.at_level(logging.WARNING), refuse_model_loads():
        run_study(synthetic.model, "trec", "deepset", storage=url, options=options(synthetic))
    (line,) = [r.getMessage() for r in caplog.records if "user defaults file" in r.getMessage()]
    assert f"read from the user defaults file {user} over the shipped defaults" in line and "\n" not in line
    assert len(optuna.load_study(study_name=optuna.get_all_study_names(url)[0], storage=url).trials) == 2


def test_recommend_names_a_study_with_foreign_parameters_and_the_fix(tmp_path):
    """Before: a study whose trials searched parameters outside the family's space failed `recommend` with a
    message that named neither the study nor a fix."""
    from click.testing import CliRunner

    from ilge_search.cli import cli
    from ilge_search.record import Identity
    from ilge_search.testing import FakeTrial, add_study

    url = sqlite_url(tmp_path / "s.db")
    good = [FakeTrial(0.7 + 0.01 * i, params={"lr": 10.0 ** -(3 + i), "hidden_dim": 128}) for i in range(3)]
    add_study(url, Identity("minilm-l6", "trec", "deepset"), trials=good)
    odd = [FakeTrial(0.6 + 0.01 * i, params={"lr": 1e-3, "x": float(i)}) for i in range(3)]
    study = add_study(url, Identity("minilm-l6", "sst2", "deepset"), trials=odd)
    result = CliRunner().invoke(
        cli, ["recommend", "--storage", url, "--family", "deepset", "--out", str(tmp_path / "d.json")]
    )
    assert "Traceback" not in result.output
    text = " ".join(result.output.split())
    assert f"{study.study_name}: left out, its trials have parameters ['x'] that the deepset search space" in text


def test_recommend_names_a_study_with_values_outside_the_space(tmp_path):
    """Before: "'64' not in (128, 256, 512)." with no study named."""
    from click.testing import CliRunner

    from ilge_search.cli import cli
    from ilge_search.record import Identity
    from ilge_search.testing import FakeTrial, add_study

    url = sqlite_url(tmp_path / "s.db")
    good = [FakeTrial(0.7 + 0.01 * i, params={"lr": 10.0 ** -(3 + i), "hidden_dim": 128}) for i in range(3)]
    add_study(url, Identity("minilm-l6", "trec", "deepset"), trials=good)
    odd = [FakeTrial(0.6 + 0.01 * i, params={"lr": 1e-3, "hidden_dim": 64}) for i in range(3)]
    study = add_study(url, Identity("minilm-l6", "sst2", "deepset"), trials=odd)
    result = CliRunner().invoke(
        cli, ["recommend", "--storage", url, "--family", "deepset", "--out", str(tmp_path / "d.json")]
    )
    assert "Traceback" not in result.output
    assert f"{study.study_name}: left out, its trials have a value outside it (trial 0: hidden_dim=64 is not one" in (
        " ".join(result.output.split())
    )


@pytest.mark.realmodel
@pytest.mark.slow
def test_quiet_hides_the_weight_loading_bar_of_a_real_model(tmp_path):
    """Before: `--quiet` still showed transformers' "Loading weights" bar (MiniLM-L6, in a subprocess). On a
    terminal (a pseudo-terminal here) only ``--quiet`` hides it; in a file it is always hidden, since its
    carriage-return redraws have no place in a log."""
    import subprocess

    from reliability_helpers import cli_command, labelled, subprocess_env, write_task

    task = write_task(tmp_path / "task", {"train": labelled(8, ["a", "b"]), "test": labelled(4, ["a", "b"], 60)})
    shown = {}
    env = subprocess_env()
    env.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)  # set in this process by an earlier in-process `--quiet` command
    for terminal, quiet in ((True, False), (True, True), (False, False)):
        args = ["embed", "--model", "minilm-l6", "--task", str(task), "--device", "cpu", "--split", "test"]
        args += ["--cache-dir", str(tmp_path / f"cache-{terminal}-{quiet}")] + (["--quiet"] if quiet else [])
        if terminal:
            code, err = _run_on_a_terminal(cli_command(*args), env)
        else:
            done = subprocess.run(cli_command(*args), capture_output=True, text=True, env=env, timeout=300)
            code, err = done.returncode, done.stderr
        assert code == 0, err
        shown[terminal, quiet] = "Loading weights" in err
    assert shown == {(True, False): True, (True, True): False, (False, False): False}


def _run_on_a_terminal(command: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run ``command`` with its stderr on a pseudo-terminal; its exit code and what it wrote there."""
    import fcntl
    import os
    import pty
    import struct
    import subprocess
    import termios

    master, replica = pty.openpty()
    # a new pseudo-terminal is 0 columns wide, into which tqdm draws nothing; 24 rows of 120 columns
    fcntl.ioctl(replica, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=replica, env=env)
    os.close(replica)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the process closed its end
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    return process.wait(timeout=300), b"".join(chunks).decode(errors="replace")
