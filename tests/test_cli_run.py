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
    for option in (
        "--model",
        "--task",
        "--encoder",
        "--n-trials",
        "--timeout",
        "--storage",
        "--study-name",
        "--sampler",
        "--pruner",
        "--seed",
        "--workers",
        "--final-seeds",
        "--shots",
        "--data-dir",
        "--total-trials",
        "--cache-dir",
        "--device",
        "--max-epochs",
        "--max-train",
    ):
        assert option in result.output


def test_bad_options_are_click_errors_naming_the_value(tmp_path, synthetic_data_dir):
    result = invoke("run", "--model", "minilm-l6", "--task", "trec", "--sampler", "bayes")
    assert result.exit_code == 2 and "bayes" in result.output
    result = invoke(
        "run",
        "--model",
        "minilm-l6",
        "--task",
        "trec",
        "--encoder",
        "gnn",
        "--storage",
        f"sqlite:///{tmp_path / 's.db'}",
        "--cache-dir",
        tmp_path / "c",
    )
    assert result.exit_code == 1 and "unknown encoder 'gnn'" in result.output
    # the storage is opened once the data is read and the settings fit it
    unreachable = ("--storage", "postgresql://u@127.0.0.1:1/x", "--data-dir", str(synthetic_data_dir))
    result = invoke("run", "--model", "minilm-l6", "--task", "trec", *unreachable)
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
    assert ":cv" not in result.output
    # --cv names other studies: the dry run lists the ones the run would make
    result = invoke(
        "sweep",
        grid,
        "--dry-run",
        "--no-estimate",
        "--cv",
        5,
        "--select",
        "best",
        "--storage",
        f"sqlite:///{tmp_path / 's.db'}",
    )
    assert result.exit_code == 0, result.output
    names = [line.split()[0] for line in result.output.splitlines()[1:]]
    assert len(names) == 2 and all(name.startswith("minilm-l6:trec:") and ":cv5" in name for name in names)
    assert not (tmp_path / "s.db").exists()
    grid.write_text('models = ["minilm-l6"]\n[trials]\ndefault = 5\n[tasks.nope]\n')
    result = invoke("sweep", grid, "--dry-run")
    assert result.exit_code == 1 and "unknown task 'nope'" in result.output


def test_run_then_studies_then_name_reuse(tmp_path, synthetic, no_model_loads):
    synthetic.cache("trec", max_train=200, max_eval=150)  # what the runs read: no model loads
    model = synthetic.model
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    common = ["--data-dir", synthetic.data_dir, "--cache-dir", synthetic.cache_dir, "--device", "cpu", "--storage", url]
    small = ["--max-train", 200, "--max-eval", 150, "--max-epochs", 5, "--threads", 1]
    result = invoke(
        "run",
        "-m",
        model,
        "-t",
        "trec",
        "-e",
        "last-layer",
        "-e",
        "mean-layers",
        "--n-trials",
        3,
        "--final-seeds",
        2,
        "--sampler",
        "random",
        "--pruner",
        "hyperband",
        "--quiet",
        *small,
        *common,
    )
    assert result.exit_code == 0, result.output
    names = [f"{model}:trec:last-layer:train200:eval150:ep5", f"{model}:trec:mean-layers:train200:eval150:ep5"]
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
    result = invoke(
        "run",
        "-m",
        model,
        "-t",
        "sst2",
        "-e",
        "last-layer",
        "--study-name",
        names[0],
        "--n-trials",
        1,
        *small,
        *common,
    )
    assert result.exit_code == 1
    assert "already exists for a different setting" in result.output and "task: stored 'trec'" in result.output
    assert len(optuna.load_study(study_name=names[0], storage=url).trials) == 3

    # --total-trials without --n-trials tops the study up to the cap, however many trials it holds
    result = invoke(
        "run",
        "-m",
        model,
        "-t",
        "trec",
        "-e",
        "last-layer",
        "--total-trials",
        5,
        "--final-seeds",
        0,
        "--quiet",
        *small,
        *common,
    )
    assert result.exit_code == 0, result.output
    assert len(optuna.load_study(study_name=names[0], storage=url).trials) == 5


def test_a_two_objective_run_names_its_objectives_retrains_its_front_and_exports_any_trial(
    tmp_path, synthetic, caplog, no_model_loads
):
    """`run --objective score --objective params` on the synthetic trec: a multi-objective study (two directions,
    named objectives, no pruning and one line saying so), its final front, and `export --trial N`."""
    import logging

    from ilge_search.study.selection import front_trials, study_front

    synthetic.cache("trec", max_train=200, max_eval=200)  # what the run and the exports read: no model loads
    model = synthetic.model
    url = f"sqlite:///{tmp_path / 'mo.db'}"
    common = ["--data-dir", synthetic.data_dir, "--cache-dir", synthetic.cache_dir, "--device", "cpu", "--storage", url]
    small = ["--max-train", 200, "--max-eval", 200, "--max-epochs", 2, "--threads", 1]
    with caplog.at_level(logging.WARNING, logger="ilge_search.study"):
        result = invoke(
            "run",
            "-m",
            model,
            "-t",
            "trec",
            "-e",
            "cayley",
            "--objective",
            "score",
            "--objective",
            "params",
            "--n-trials",
            4,
            "--final-seeds",
            2,
            "--final-front",
            3,
            "--sampler",
            "random",
            "--quiet",
            *small,
            *common,
        )
    assert result.exit_code == 0, result.output
    name = f"{model}:trec:cayley:train200:eval200:ep2:obj-params"
    pruning = [r.getMessage() for r in caplog.records if "pruning is off" in r.getMessage()]
    assert pruning == [
        "pruning is off: Optuna cannot prune a multi-objective study (objectives score+params), so "
        "--pruner median is not used"
    ]
    study = optuna.load_study(study_name=name, storage=url)
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE"]
    assert study.metric_names == ["accuracy", "params"]
    for trial in study.trials:
        assert trial.state.name == "COMPLETE" and trial.intermediate_values == {}
        assert trial.values[1] == trial.user_attrs["num_trainable_params"] and trial.user_attrs["latency_ms"] > 0
    attrs = study.user_attrs
    records = attrs["final_front"]
    assert [r["trial"] for r in records] == [t.number for t in front_trials(study_front(study), 3)]
    assert attrs["objectives"] == ["score", "params"] and attrs["final_select"] == "front"
    assert attrs["final_trial"] == records[0]["trial"] and attrs["final_test_scores"] == records[0]["test_scores"]
    assert all(len(r["test_scores"]) == 2 and r["artifacts"] for r in records)
    assert f"final front of {name}" in result.output

    # the multi-objective study never takes single-objective trials under its name
    refused = invoke(
        "run", "-m", model, "-t", "trec", "-e", "cayley", "--study-name", name, "--n-trials", 1, *small, *common
    )
    assert refused.exit_code == 1 and "objectives: stored ['score', 'params'], requested ['score']" in refused.output

    # export --trial: a front trial gives the weights its final evaluation kept; another complete trial is retrained
    last = records[-1]
    exported = invoke("export", "--study", name, "--trial", last["trial"], "--out", tmp_path / "front", *common)
    assert exported.exit_code == 0, exported.output
    meta = json.loads((tmp_path / "front" / "ilge_classifier.json").read_text())
    provenance = meta["provenance"]
    assert provenance["trial"] == last["trial"] and provenance["source"] == "final evaluation"
    assert provenance["seed"] == last["artifact_seed"]
    assert provenance["test_score"] == last["test_scores"][attrs["final_seeds"].index(last["artifact_seed"])]
    others = [t.number for t in study.trials if t.number not in {r["trial"] for r in records}]
    if others:
        exported = invoke("export", "--study", name, "--trial", others[0], "--out", tmp_path / "other", *common)
        assert exported.exit_code == 0, exported.output
        assert f"retrained model of trial {others[0]}, seed 0" in exported.output
    missing = invoke("export", "--study", name, "--trial", 99, "--out", tmp_path / "none", *common)
    assert missing.exit_code == 1 and missing.output.count("\n") == 1
    assert "has no trial 99 (its trials are 0-3); pass --trial with a complete one" in missing.output
    assert not (tmp_path / "none").exists()
