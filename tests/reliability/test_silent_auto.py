"""Auto studies, sweeps and the newest commands: each case that used to pass in silence, or with a message that
blamed the wrong thing, now says one line naming the real cause and a command that works (issue 50)."""

from __future__ import annotations

import logging

import optuna
from click.testing import CliRunner

from ilge_search.cli import cli
from ilge_search.study import StudyOptions, run_study
from ilge_search.testing import refuse_model_loads

DATA = dict(max_train=240, max_eval=100)


def _options(synthetic, **more) -> StudyOptions:
    flat = dict(
        n_trials=1, final_seeds=0, ensemble=0, max_epochs=2, device="cpu", threads=1, progress=False, seed=0, **DATA
    )
    flat.update(data_dir=synthetic.data_dir, cache_dir=synthetic.cache_dir)
    return StudyOptions.from_flat(**{**flat, **more})


def _auto(synthetic, url, **more):
    synthetic.cache("trec", **DATA)
    with refuse_model_loads():
        (result,) = run_study(synthetic.model, "trec", "auto", storage=url, options=_options(synthetic, **more))
    return result


def _warnings(caplog, needle: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if needle in r.getMessage()]


def test_an_auto_run_with_fewer_trials_than_methods_says_which_starts_wait(synthetic, tmp_path, caplog):
    url = f"sqlite:///{tmp_path / 's.db'}"
    with caplog.at_level(logging.WARNING, logger="ilge_search"):
        result = _auto(synthetic, url, methods="last-layer,mlp-last,best-layer")
    study = optuna.load_study(study_name=result.study_name, storage=url)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "WAITING", "WAITING"]
    (warned,) = _warnings(caplog, "start(s)")
    assert "2 method start(s) (mlp-last, best-layer) wait for a later run" in warned, warned
    assert "--n-trials 3" in warned


def test_an_auto_run_whose_budget_covers_every_start_says_nothing(synthetic, tmp_path, caplog):
    url = f"sqlite:///{tmp_path / 's.db'}"
    with caplog.at_level(logging.WARNING, logger="ilge_search"):
        _auto(synthetic, url, methods="last-layer,mlp-last", n_trials=2)
    assert not _warnings(caplog, "start(s)")


def test_the_same_methods_in_another_order_name_the_existing_study(synthetic, tmp_path, caplog):
    url = f"sqlite:///{tmp_path / 's.db'}"
    first = _auto(synthetic, url, methods="last-layer,mlp-last", n_trials=2)
    with caplog.at_level(logging.WARNING, logger="ilge_search"):
        second = _auto(synthetic, url, methods="mlp-last,last-layer", n_trials=2)
    assert second.study_name != first.study_name
    (warned,) = _warnings(caplog, "another order")
    assert repr(first.study_name) in warned
    assert "same methods in another order" in warned and "--methods last-layer,mlp-last" in warned, warned
    assert "trial 0" in warned


def _leaderboard(url: str, name: str):
    return CliRunner().invoke(cli, ["leaderboard", "--storage", url, "--study", name])


def test_leaderboard_of_an_auto_study_without_a_complete_trial_gives_advice_that_works(synthetic, tmp_path):
    from reliability_helpers import one_line_error

    url = f"sqlite:///{tmp_path / 's.db'}"
    result = _auto(synthetic, url, methods="last-layer,mlp-last", n_trials=0)
    message = one_line_error(_leaderboard(url, result.study_name))
    assert "--n-trials 0" not in message and "no complete trial" in message, message
    assert "--n-trials 2" in message


def test_an_auto_study_that_gets_no_leaderboard_is_told_why_by_run_and_by_leaderboard(synthetic, tmp_path, caplog):
    """Several objectives, or the paper protocol: `run` says up front why no leaderboard is made, and
    `leaderboard` gives the same reason and points at `studies` instead of a rerun that would make none."""
    from reliability_helpers import one_line_error

    url = f"sqlite:///{tmp_path / 's.db'}"
    for options, why in (
        (dict(objectives=("score", "params")), "several objectives (score, params)"),
        (dict(protocol="paper", samples_per_label=4), "paper protocol"),
    ):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="ilge_search"):
            result = _auto(synthetic, url, methods="last-layer,mlp-last", n_trials=2, final_seeds=1, **options)
        (warned,) = _warnings(caplog, "no leaderboard is made")
        assert why in warned and "ilge-search studies --storage" in warned, warned
        message = one_line_error(_leaderboard(url, result.study_name))
        assert why in message and "ilge-search studies --storage" in message, message
        assert "rerun" not in message


def test_export_ensemble_of_a_tagging_auto_study_names_the_real_cause(tmp_path):
    from ilge_search.record import DataRecord, Identity
    from ilge_search.testing.store import add_study

    url = f"sqlite:///{tmp_path / 's.db'}"
    identity = Identity(model="minilm-l6", task="pos", encoder="auto", word_pooling="first", methods=("last-layer",))
    study = add_study(url, identity, data=DataRecord(task_kind="tagging", metric="accuracy"))
    args = ["export", "--storage", url, "--study", study.study_name, "--out", str(tmp_path / "out"), "--ensemble"]
    refused = CliRunner().invoke(cli, args)
    assert refused.exit_code == 2 and "Traceback" not in refused.output  # a usage error, as before
    (message,) = [line for line in refused.output.splitlines() if line.startswith("Error: ")]
    assert "is a tagging study, and tagging studies have no ensemble" in message and "drop --ensemble" in message
    assert "--retrain" not in message and "--trial" not in message, message
    assert not (tmp_path / "out").exists()


def _grid(folder, top: str = "", task: str = "", name: str = "trec") -> str:
    grid = folder / "grid.toml"
    grid.write_text(
        f'storage = "sqlite:///{folder / "s.db"}"\nmodels = ["minilm-l6"]\nencoders = ["auto"]\n{top}\n'
        f"[trials]\ndefault = 1\n[tasks.{name}]\n{task}\n"
    )
    return str(grid)


def _snapshot(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"" for p in sorted(folder.rglob("*"))}


def test_grid_methods_errors_name_the_toml_key_and_its_table_once(tmp_path):
    from reliability_helpers import one_line_error

    def refused(**where) -> str:
        return one_line_error(CliRunner().invoke(cli, ["sweep", _grid(tmp_path, **where), "--dry-run"]))

    grid = f"{tmp_path / 'grid.toml'}"
    message = refused(top='methods = "cayley,last-layer"')
    assert message.startswith(f"Error: {grid}: methods must be a list of method names") and "--methods" not in message
    assert 'methods = ["cayley", "last-layer"]' in message
    message = refused(task='methods = ["cayley", "nope"]')
    assert message == (
        f"Error: {grid} [tasks.trec]: unknown method 'nope' in methods; expected some of last-layer, best-layer, "
        "mean-layers, scalar-mix, mlp-last, cayley, fc, deepset"
    )
    assert refused(top="methods = []") == f"Error: {grid}: methods must be a non-empty list of strings, got []"
    message = refused(task="methods = []")
    assert message == f"Error: {grid} [tasks.trec]: methods must be a non-empty list of strings, got []"
    assert refused(task='methods = ["cayley-word"]').endswith(
        "method 'cayley-word' cannot run on a sentence task; "
        "expected some of last-layer, best-layer, mean-layers, scalar-mix, mlp-last, cayley, fc, deepset"
    )


def test_a_refused_sweep_leaves_its_folder_byte_for_byte_unchanged(tmp_path):
    empty = tmp_path / "no-data"
    empty.mkdir()
    for where in (dict(task='methods = ["cayley", "nope"]'), dict()):  # a bad method; then a task not in --data-dir
        grid = _grid(tmp_path, **where)
        before = _snapshot(tmp_path)
        result = CliRunner().invoke(cli, ["sweep", grid, "--data-dir", str(empty), "--cache-dir", str(empty)])
        assert "Error: " in result.output and result.exit_code == 1, result.output
        assert _snapshot(tmp_path) == before  # no .db, no .db.lock, no artifact folder


def test_ctrl_c_in_shipping_check_says_what_is_kept_and_that_a_rerun_resumes(tmp_path, monkeypatch):
    from ilge_search.defaults import shipping_check

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(shipping_check, "shipping_check", interrupted)
    url = f"sqlite:///{tmp_path / 's.db'}"
    result = CliRunner().invoke(cli, ["shipping-check", "--storage", url])
    assert result.exit_code == 130 and "Aborted!" not in result.output, result.output
    assert "stored cells are kept" in result.output and "rerun the same command to resume" in result.output
