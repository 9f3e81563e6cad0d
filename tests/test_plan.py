"""Dry runs (`run --dry-run`, `sweep --dry-run`, plan_run): the plan, its measured estimate, nothing written.

On the synthetic setup: the tiny model's cache keys hold synthetic features (no model loads), and a cold cache
is timed by extracting a few texts with the tiny model itself.
"""

from __future__ import annotations

import logging
import math

import optuna
import pytest
from click.testing import CliRunner

from ilge_search.cli import cli
from ilge_search.embeddings.cache import EmbeddingCache
from ilge_search.study import StudyOptions, plan_run, run_study
from ilge_search.study import plan as plan_module
from ilge_search.study.sweep import estimate_sweep
from ilge_search.tuning import recommended_config

DATA = dict(max_train=240, max_eval=100)
SMALL = dict(**DATA, max_epochs=4)


def common(synthetic, cache_dir=None):
    return dict(
        data_dir=synthetic.data_dir,
        cache_dir=cache_dir or synthetic.cache_dir,
        device="cpu",
        threads=1,
        progress=False,
        **SMALL,
    )


@pytest.fixture()
def warm(synthetic):
    """The trec subset's synthetic embeddings in the session cache: every split a run reads is cached."""
    synthetic.cache("trec", **DATA)
    return synthetic


def test_a_cold_cache_is_timed_by_extracting_a_few_texts_and_nothing_is_written(tmp_path, synthetic):
    cache = tmp_path / "cache"
    db = tmp_path / "studies.db"
    plan = plan_run(
        synthetic.model,
        "trec",
        "cayley",
        storage=f"sqlite:///{db}",
        options=StudyOptions.from_flat(
            n_trials=3, final_seeds=1, **{**common(synthetic, cache), "max_train": 60, "max_eval": 40}
        ),
    )
    assert plan.split_sizes == {"train": 60, "validation": 40, "test": 40}
    assert plan.cached == {"train": False, "validation": False, "test": False}
    assert plan.texts_to_embed == 140 and plan.extraction_seconds > 0
    assert (plan.num_layers, plan.hidden_size) == (5, 64)  # measured on the loaded (tiny) model
    assert "random features" in plan.calibration
    assert plan.seconds > plan.extraction_seconds and math.isfinite(plan.seconds)
    (study,) = plan.studies
    assert (study.study_name, study.exists, study.trials, study.epochs, study.runs("final")) == (
        f"{synthetic.model}:trec:cayley:train60:eval40:ep4",
        False,
        3,
        4,
        2,
    )
    # 3 trials, 1 at a time, then 1 final seed for the selected trial and 1 for the start configuration, and the
    # default ensemble's 2 members beyond the selected trial (whose final model it reuses), 1 seed each
    assert study.runs("ensemble") == 2
    assert study.seconds == pytest.approx(7 * study.trial_seconds)
    assert not db.exists() and not (tmp_path / "artifacts").exists()
    assert EmbeddingCache(cache).ls() == []  # measured, never stored


def test_the_estimate_is_the_calibrated_trial_times_the_trainings_of_the_run(tmp_path, warm, monkeypatch):
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    # one trial: the start configuration the estimate is calibrated on (searched trials may be larger: the
    # estimate says it assumes every trial costs what the start costs, and the README says so)
    options = StudyOptions.from_flat(n_trials=1, final_seeds=1, seed=0, **{**common(warm), "max_epochs": 12})
    plan = plan_run(warm.model, "trec", "cayley", storage=url, options=options)
    assert plan.cached == {"train": True, "validation": True, "test": True}
    assert plan.texts_to_embed == 0 and plan.extraction_seconds == 0 and "cached features" in plan.calibration
    (study,) = plan.studies
    # 1 final seed; the one trial is the start configuration, so the final evaluation retrains it once
    assert (study.trials, study.epochs, study.runs("final")) == (1, 12, 1)
    assert 0 < study.trial_seconds < math.inf and plan.calibration_seconds > 0
    assert study.seconds == pytest.approx(2 * study.trial_seconds) and plan.seconds == pytest.approx(study.seconds)
    assert not (tmp_path / "studies.db").exists()

    # what is timed, and how the timings add up: a fixed measurement makes the arithmetic exact
    timed = []

    def measured(encoder, config, train, validation, check, plan, device):
        timed.append((encoder, config, len(train[1]), len(validation[1])))
        return 0.5, 0.25  # set-up seconds, seconds per epoch on the full splits

    monkeypatch.setattr(plan_module, "_time_config", measured)
    fixed = plan_run(warm.model, "trec", "cayley", storage=url, options=options)
    start = recommended_config("cayley", source="regenerated").replace(epochs=12)
    assert [(e, c.to_dict()) for e, c, _, _ in timed] == [("cayley", start.to_dict())]  # the start configuration
    assert timed[0][2:] == (min(240, plan_module.CALIBRATION_ROWS), 100)  # the cached rows
    assert fixed.studies[0].trial_seconds == 0.5 + 12 * 0.25
    assert fixed.studies[0].seconds == 2 * 3.5 and fixed.seconds == 2 * 3.5
    monkeypatch.undo()

    run_study(warm.model, "trec", "cayley", storage=url, options=options)
    # the same command again: the study exists and would get 1 more trial; a cap that it already holds adds none
    names = [s.study_name for s in optuna.get_all_study_summaries(url)]
    again = plan_run(warm.model, "trec", "cayley", storage=url, calibrate=False, options=options)
    assert (again.studies[0].exists, again.studies[0].finished, again.studies[0].trials) == (True, 1, 1)
    assert math.isnan(again.seconds) and math.isnan(again.studies[0].seconds)  # no calibration, no estimate
    capped = plan_run(
        warm.model,
        "trec",
        "cayley",
        storage=url,
        calibrate=False,
        options=options.replace(n_trials=None, total_trials=1),
    )
    assert (capped.studies[0].trials, capped.studies[0].runs("final")) == (0, 0)
    assert [s.study_name for s in optuna.get_all_study_summaries(url)] == names
    assert len(optuna.load_study(study_name=names[0], storage=url).trials) == 1  # no trial added by a plan


def test_a_dry_run_refuses_what_the_run_refuses_with_the_same_message(tmp_path, warm, no_model_loads):
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    options = dict(n_trials=1, final_seeds=0, **common(warm))
    run_study(
        warm.model, "trec", "last-layer", storage=url, options=StudyOptions.from_flat(study_name="taken", **options)
    )
    bad = [
        dict(task="no-such-task"),
        dict(model="no-such-model"),
        dict(encoders=["last-layer"], study_name="taken", max_train=200),  # same name, other data setting
        dict(encoders=["cayley", "fc"], study_name="one"),
    ]
    for case in bad:
        keywords = {**options, **case}
        where = [keywords.pop("model", warm.model), keywords.pop("task", "trec"), keywords.pop("encoders", ["cayley"])]
        messages = []
        for call in (run_study, plan_run):
            with pytest.raises(ValueError) as caught:
                call(*where, storage=url, options=StudyOptions.from_flat(**keywords))
            messages.append(str(caught.value))
        assert messages[0] == messages[1], case
    with pytest.raises(ValueError, match="max_epochs"):
        plan_run(warm.model, "trec", storage=url, options=StudyOptions.from_flat(**{**options, "max_epochs": 0}))


def test_run_dry_run_prints_the_plan_and_creates_nothing(tmp_path, warm, no_model_loads):
    db = tmp_path / "cli.db"
    args = [
        "run",
        "--model",
        warm.model,
        "--task",
        "trec",
        "--encoder",
        "cayley",
        "--encoder",
        "last-layer",
        "--n-trials",
        "4",
        "--max-train",
        "240",
        "--max-eval",
        "100",
        "--max-epochs",
        "4",
        "--threads",
        "1",
        "--storage",
        f"sqlite:///{db}",
        "--data-dir",
        str(warm.data_dir),
        "--cache-dir",
        str(warm.cache_dir),
        "--device",
        "cpu",
        "--dry-run",
    ]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "dry run: nothing is created or written" in out
    assert "data after the caps: train 240, validation 100, test 100" in out
    assert "embedding cache: train cached, validation cached, test cached" in out
    rows = {line.split()[0]: " ".join(line.split()[1:]) for line in out.splitlines() if line.startswith("  ")}
    for encoder in ("cayley", "last-layer"):
        assert rows[f"{warm.model}:trec:{encoder}:train240:eval100:ep4"].startswith(
            "new; +4 trials x up to 4 epochs, final 6 retrainings, ensemble up to 9 retrainings ~"
        ), out
    assert "estimated wall time" in out and not db.exists()

    bad = CliRunner().invoke(cli, [*args[:-1], "--task", "no-such-task", "--dry-run"])
    assert bad.exit_code == 1 and bad.output.count("\n") == 1 and "no-such-task" in bad.output


def test_sweep_dry_run_estimates_what_is_left_of_each_budget(tmp_path, warm, no_model_loads):
    grid = tmp_path / "grid.toml"
    grid.write_text(
        f'models = ["{warm.model}"]\nencoders = ["last-layer", "mean-layers"]\nmax_epochs = 4\n'
        "max_train = 240\nmax_eval = 100\nthreads = 1\n[trials]\ndefault = 2\nmean-layers = 3\n"
        "[tasks.trec]\n"
    )
    url = f"sqlite:///{tmp_path / 'sweep.db'}"
    (plan,) = estimate_sweep(grid, storage=url, data_dir=warm.data_dir, cache_dir=warm.cache_dir, device="cpu")
    assert [(s.encoder, s.trials, s.exists) for s in plan.studies] == [
        ("last-layer", 2, False),
        ("mean-layers", 3, False),
    ]
    assert math.isfinite(plan.seconds) and not (tmp_path / "sweep.db").exists()

    result = CliRunner().invoke(
        cli,
        [
            "sweep",
            str(grid),
            "--dry-run",
            "--storage",
            url,
            "--data-dir",
            str(warm.data_dir),
            "--cache-dir",
            str(warm.cache_dir),
            "--device",
            "cpu",
        ],
    )
    assert result.exit_code == 0, result.output
    assert f"{warm.model}:trec:mean-layers:train240:eval100:ep4" in result.output  # the budget table
    assert "new; +3 trials x up to 4 epochs" in result.output and "sweep total: estimated wall time" in result.output
    assert not (tmp_path / "sweep.db").exists()


def test_a_long_run_logs_its_estimate_at_the_start(tmp_path, warm, monkeypatch, caplog, no_model_loads):
    monkeypatch.setattr(plan_module, "LONG_RUN_SECONDS", 0.0)  # every run counts as long
    with caplog.at_level(logging.INFO, logger="ilge_search.study"):
        run_study(
            warm.model,
            "trec",
            "last-layer",
            storage=f"sqlite:///{tmp_path / 's.db'}",
            options=StudyOptions.from_flat(n_trials=1, final_seeds=0, **common(warm)),
        )
    lines = [r.getMessage() for r in caplog.records if "estimated wall time" in r.getMessage()]
    assert len(lines) == 1 and "1 study, 1 trials of up to 4 epochs on 240 training texts" in lines[0]
