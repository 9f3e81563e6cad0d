"""`ilge-search run`, `studies` and `sweep` through click's CliRunner."""

from __future__ import annotations

import json

import optuna
import pytest
from click.testing import CliRunner

from ilge_search.cli import cli


def invoke(*args: str):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def test_run_help_lists_every_option():
    result = invoke("run", "--help")
    assert result.exit_code == 0
    for option in ("--model", "--task", "--encoder", "--n-trials", "--timeout", "--storage", "--study-name",
                   "--sampler", "--pruner", "--seed", "--workers", "--final-seeds", "--shots", "--data-dir",
                   "--total-trials", "--cache-dir", "--device", "--max-epochs", "--max-train"):
        assert option in result.output


def test_bad_options_are_click_errors_naming_the_value(tmp_path):
    result = invoke("run", "--model", "minilm-l6", "--task", "trec", "--sampler", "bayes")
    assert result.exit_code == 2 and "bayes" in result.output
    result = invoke("run", "--model", "minilm-l6", "--task", "trec", "--encoder", "gnn", "--storage",
                    f"sqlite:///{tmp_path / 's.db'}", "--cache-dir", tmp_path / "c")
    assert result.exit_code == 1 and "unknown encoder 'gnn'" in result.output
    result = invoke("run", "--model", "minilm-l6", "--task", "trec", "--storage", "postgresql://u@127.0.0.1:1/x")
    assert result.exit_code == 1 and "cannot open the study storage" in result.output


def test_studies_on_a_missing_storage_says_what_to_do(tmp_path):
    result = invoke("studies", "--storage", f"sqlite:///{tmp_path / 'none.db'}")
    assert result.exit_code == 1 and "no study storage" in result.output


def test_sweep_dry_run_lists_the_plan(tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text('models = ["minilm-l6"]\nencoders = ["fc", "mlp-last"]\n[trials]\ndefault = 5\n[tasks.trec]\n')
    result = invoke("sweep", grid, "--dry-run", "--no-estimate", "--storage", f"sqlite:///{tmp_path / 's.db'}")
    assert result.exit_code == 0
    assert "minilm-l6:trec:fc" in result.output and "minilm-l6:trec:mlp-last" in result.output
    grid.write_text('models = ["minilm-l6"]\n[trials]\ndefault = 5\n[tasks.nope]\n')
    result = invoke("sweep", grid, "--dry-run")
    assert result.exit_code == 1 and "unknown task 'nope'" in result.output


@pytest.mark.slow
@pytest.mark.realmodel
def test_run_then_studies_then_name_reuse(tmp_path, data_dir, cache_dir):
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    common = ["--data-dir", data_dir, "--cache-dir", cache_dir, "--device", "cpu", "--storage", url]
    small = ["--max-train", 200, "--max-eval", 150, "--max-epochs", 5, "--threads", 1]
    result = invoke("run", "-m", "minilm-l6", "-t", "trec", "-e", "last-layer", "-e", "mean-layers",
                    "--n-trials", 3, "--final-seeds", 2, "--sampler", "random", "--pruner", "hyperband", "--quiet",
                    *small, *common)
    assert result.exit_code == 0, result.output
    names = ["minilm-l6:trec:last-layer:train200:eval150:ep5", "minilm-l6:trec:mean-layers:train200:eval150:ep5"]
    for name in names:
        line = next(line for line in result.output.splitlines() if line.startswith(name))
        assert "(2 seeds)" in line
        study = optuna.load_study(study_name=name, storage=url)
        assert len(study.trials) == 3 and study.trials[0].user_attrs["recommended"]

    listed = invoke("studies", "--storage", url, "--format", "json")
    assert listed.exit_code == 0
    rows = {row["study"]: row for row in json.loads(listed.output)}
    assert set(rows) == set(names)
    for name in names:
        study = optuna.load_study(study_name=name, storage=url)
        assert rows[name]["trials"] == 3 and rows[name]["seeds"] == 2
        assert rows[name]["test_mean"] == pytest.approx(study.user_attrs["final_test_mean"])
        assert rows[name]["best_val"] == pytest.approx(study.best_value)
    table = invoke("studies", "--storage", url)
    assert table.exit_code == 0 and names[0] in table.output and "test_mean" in table.output

    # the same name for another task: refused, nothing added
    result = invoke("run", "-m", "minilm-l6", "-t", "sst2", "-e", "last-layer", "--study-name", names[0],
                    "--n-trials", 1, *small, *common)
    assert result.exit_code == 1
    assert "already exists for a different setting" in result.output and "task: stored 'trec'" in result.output
    assert len(optuna.load_study(study_name=names[0], storage=url).trials) == 3

    # --total-trials without --n-trials tops the study up to the cap, however many trials it holds
    result = invoke("run", "-m", "minilm-l6", "-t", "trec", "-e", "last-layer", "--total-trials", 5,
                    "--final-seeds", 0, "--quiet", *small, *common)
    assert result.exit_code == 0, result.output
    assert len(optuna.load_study(study_name=names[0], storage=url).trials) == 5
