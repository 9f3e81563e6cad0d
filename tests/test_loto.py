"""Leave one task out on a tiny storage of real studies: Cayley studies on stsb and trec on the synthetic setup
(no model loads)."""

from __future__ import annotations

import json
import shutil
import statistics

import optuna
import pytest
from click.testing import CliRunner

from ilge_search import tuning
from ilge_search.cli import cli
from ilge_search.defaults.loto import leave_one_task_out, start_config, stored_loto
from ilge_search.encoders import builtin_start
from ilge_search.encoders.configs import CayleyConfig
from ilge_search.record import LotoRecord
from ilge_search.report import build_report
from ilge_search.report.defaults_page import recommend_defaults
from ilge_search.study import StudyOptions
from ilge_search.study.retraining import TrainingSetup

DATA = dict(max_train=240, max_eval=100)
SMALL = dict(**DATA, max_epochs=2)
SUFFIX = "train240:eval100:ep2"
TASKS = ("stsb", "trec")


def study_options(synthetic, **flat):
    folders = dict(data_dir=synthetic.data_dir, cache_dir=synthetic.cache_dir)
    return StudyOptions.from_flat(device="cpu", threads=1, progress=False, seed=0, **folders, **SMALL, **flat)


@pytest.fixture(scope="module")
def studies(tmp_path_factory, synthetic):
    from ilge_search.study import run_study
    from ilge_search.testing import refuse_model_loads

    url = f"sqlite:///{tmp_path_factory.mktemp('loto') / 'studies.db'}"
    for task in TASKS:
        synthetic.cache(task, **DATA)
        with refuse_model_loads():
            run_study(
                synthetic.model,
                task,
                "cayley",
                storage=url,
                options=study_options(synthetic, n_trials=2, final_seeds=0),
            )
    return url


@pytest.fixture(scope="module")
def evaluated(studies, synthetic, tmp_path_factory):
    """The storage after one leave-one-task-out run with 2 seeds (a copy: the studies fixture stays clean)."""
    from ilge_search.testing import refuse_model_loads

    copy = tmp_path_factory.mktemp("loto-run") / "studies.db"
    shutil.copyfile(studies.removeprefix("sqlite:///"), copy)
    url = f"sqlite:///{copy}"
    with refuse_model_loads():
        result = leave_one_task_out(
            url,
            final_seeds=2,
            setup=TrainingSetup(synthetic.data_dir, synthetic.cache_dir, "cpu", threads=1, progress=False),
        )
    return url, result


def study_attrs(url, task):
    return next(s.user_attrs for s in optuna.get_all_study_summaries(url) if s.user_attrs.get("task") == task)


def test_each_task_is_scored_with_defaults_regenerated_without_it(evaluated, synthetic, tmp_path, no_model_loads):
    import torch

    from ilge_search.engine import evaluate, train_encoder
    from ilge_search.storage import open_storage
    from ilge_search.study.stored import load_training_data

    url, result = evaluated
    # one training per configuration: a task whose regenerated defaults equal the built-in ones trains once
    distinct = sum(1 if r["regenerated_config"] == r["builtin_config"] else 2 for _, r in result.rows.iterrows())
    assert result.trained == distinct >= 2 and result.missing == [] and list(result.rows["task"]) == list(TASKS)
    assert {(v.family, v.bucket) for v in result.verdicts.values()} == {("cayley", "small")}
    opened = open_storage(url, must_exist=True)
    for task in TASKS:
        other = next(t for t in TASKS if t != task)
        row = result.rows[result.rows["task"] == task].iloc[0]
        unit = "acc. %" if task == "trec" else "Spearman ×100"
        assert row["unit"] == unit
        assert row["seeds"] == [1000, 1001] and row["regenerated_from"] == 1
        # the built-in defaults: the published package's, as a study's first trial trains them (epochs capped)
        builtin = CayleyConfig(lr=1e-3, gnn_layers=1, hidden_dim=256, epochs=2)
        assert row["builtin_config"] == builtin.to_dict()
        # the regenerated ones are what `recommend --exclude-task` derives from the other task's study alone
        values = recommend_defaults(url, tmp_path / f"no-{task}.json", None, families=["cayley"], exclude_tasks=[task])[
            "families"
        ]["cayley"]["small"]
        assert (
            row["regenerated_config"]
            == start_config("cayley", {"lr": 1e-3, "gnn_layers": 1, "hidden_dim": 256, **values}, 2).to_dict()
        )
        assert (
            values != {}
            and f"{synthetic.model}:{other}:cayley:{SUFFIX}"
            in json.loads((tmp_path / f"no-{task}.json").read_text())["metadata"]["studies"]["cayley/small"]
        )
        # stored on the study whose data it used
        assert len(study_attrs(url, task)[LotoRecord.ATTR]) == 1
        if task != "trec":
            continue
        # the numbers are those of the one engine trained directly with the same seeds on the study's data
        study = opened.load_study(row["study"])
        data = load_training_data(
            study, with_test=True, data_dir=synthetic.data_dir, cache_dir=synthetic.cache_dir, device="cpu"
        )
        assert data.split_sizes == {"train": 240, "validation": 100, "test": 100}
        # (the regenerated configuration: the built-in one goes through the same code)
        for column, config in (
            ("regenerated", CayleyConfig(**{k: v for k, v in row["regenerated_config"].items() if k != "family"})),
        ):
            direct = []
            threads = torch.get_num_threads()
            torch.set_num_threads(1)  # as the evaluation trained (threads=1): the same sums in the same order
            try:
                for seed in (1000, 1001):
                    trained = train_encoder(
                        config,
                        data.train,
                        data.validation,
                        task_kind=data.task_kind,
                        num_classes=data.num_classes,
                        seed=seed,
                        device="cpu",
                    )
                    direct.append(100 * evaluate(trained.model, *data.test, task_kind=data.task_kind)["accuracy"])
            finally:
                torch.set_num_threads(threads)
            assert row[f"{column}_scores"] == pytest.approx(direct, abs=1e-9)
            assert row[f"{column}_mean"] == pytest.approx(statistics.fmean(direct))
            assert row[f"{column}_std"] == pytest.approx(statistics.stdev(direct))
        assert row["difference"] == pytest.approx(row["regenerated_mean"] - row["builtin_mean"])
    verdict = result.verdicts[("cayley", "small")]
    assert verdict.mean_difference == pytest.approx(result.rows["difference"].mean())
    assert verdict.regenerated_win == (verdict.evidence.passes and not verdict.setting)  # a clear win as it ships
    assert verdict.evidence.comparison.interval.estimate == pytest.approx(verdict.mean_difference)


def test_a_rerun_trains_nothing_and_stale_records_are_not_used(evaluated, monkeypatch, synthetic):
    from ilge_search import engine

    url, first = evaluated

    def refuse(*args, **kwargs):
        raise AssertionError("retrained")

    monkeypatch.setattr(engine, "train_encoder", refuse)
    monkeypatch.setattr(engine, "train_many", refuse)  # the seeds trained in one pass
    again = leave_one_task_out(
        url,
        final_seeds=2,
        setup=TrainingSetup(synthetic.data_dir, synthetic.cache_dir, "cpu", progress=False),
    )
    assert again.trained == 0
    assert again.rows[["builtin_mean", "regenerated_mean"]].equals(first.rows[["builtin_mean", "regenerated_mean"]])
    assert stored_loto(url).rows["difference"].tolist() == first.rows["difference"].tolist()
    # other built-in defaults are another configuration: the stored records no longer count
    changed = {"small": {"lr": 3e-3, "gnn_layers": 1, "hidden_dim": 256}}
    monkeypatch.setattr(
        "ilge_search.defaults.loto.builtin_start",
        lambda family, bucket: dict(changed.get(bucket, {})) if family == "cayley" else builtin_start(family, bucket),
    )
    stale = stored_loto(url)
    model = synthetic.model
    assert stale.rows.empty and sorted(stale.missing) == [f"{model}/stsb/cayley", f"{model}/trec/cayley"]


def test_the_report_and_the_shipping_rule_use_the_stored_table(evaluated, studies, tmp_path, monkeypatch, synthetic):
    url, result = evaluated
    report = build_report(url, tmp_path / "report", figures=False, progress=False)
    text = report.files["markdown"].read_text()
    section = text.split("## Defaults on tasks they never saw\n", 1)[1].split("\n## ", 1)[0]
    for row in result.rows.itertuples():
        assert f"| {synthetic.model} | {row.task} | cayley | {row.unit} | 2 |" in section
        assert f"{row.builtin_mean:.2f} ± {row.builtin_std:.2f}" in section
        assert f"{row.difference:+.2f}" in section
    verdict = result.verdicts[("cayley", "small")]
    assert f"{verdict.mean_difference:+.2f}" in section

    stand_in = tmp_path / "package" / "recommended_defaults.json"  # never the real package file in a test
    stand_in.parent.mkdir()
    monkeypatch.setattr(tuning, "RECOMMENDED_DEFAULTS_PATH", stand_in)
    page = tmp_path / "defaults.md"
    # without the evaluation nothing is shipped: one line that says what to run
    refused = CliRunner().invoke(cli, ["recommend", "--storage", studies, "--update-shipped"])
    assert refused.exit_code == 1 and "ilge-search loto --storage" in refused.output and not stand_in.exists()
    shipped = CliRunner().invoke(cli, ["recommend", "--storage", url, "--update-shipped", "--report", str(page)])
    assert shipped.exit_code == 0, shipped.output
    written = json.loads(stand_in.read_text())
    regenerated = recommend_defaults(url, tmp_path / "user.json", None)["families"]["cayley"]
    if verdict.regenerated_win:
        assert written["families"] == {"cayley": regenerated}
        assert written["metadata"]["shipping"]["cayley/small"].startswith("regenerated")
    else:  # the built-in defaults stay: the family is left out of the shipped file
        assert written["families"] == {}
        assert written["metadata"]["shipping"]["cayley/small"].startswith("built-in kept")
    assert written["metadata"]["leave_one_task_out"]["cayley/small"]["regenerated_win"] == verdict.regenerated_win
    markdown = page.read_text()
    assert "## On tasks they never saw" in markdown and f"{verdict.mean_difference:+.2f}" in markdown
    assert ("beat the built-in" if verdict.regenerated_win else "do not beat the built-in") in markdown


def test_loto_errors_are_one_line(tmp_path):
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    optuna.create_study(study_name="x", storage=url)
    result = CliRunner().invoke(cli, ["loto", "--storage", url, "--task", "trec"])
    assert result.exit_code == 1 and "no cayley/fc/deepset study of task(s) ['trec']" in result.output
    assert "Traceback" not in result.output
    missing = CliRunner().invoke(cli, ["loto", "--storage", f"sqlite:///{tmp_path / 'none.db'}"])
    assert missing.exit_code == 1 and not (tmp_path / "none.db").exists()
    with pytest.raises(ValueError, match="unknown families"):
        stored_loto(url, families=["mlp-last"])


def test_paper_protocol_studies_are_not_evaluation_targets(studies, synthetic, tmp_path, no_model_loads):
    from ilge_search.defaults.loto import _targets
    from ilge_search.study import run_study

    copy = tmp_path / "studies.db"
    shutil.copyfile(studies.removeprefix("sqlite:///"), copy)
    url = f"sqlite:///{copy}"
    # more trials than the matched trec study (2), and its name sorts after: preferred, were it a candidate
    options = study_options(synthetic, n_trials=3, final_seeds=0, protocol="paper")
    run_study(synthetic.model, "trec", "cayley", storage=url, options=options)
    names = [s.study_name for s in optuna.get_all_study_summaries(url)]
    assert f"{synthetic.model}:trec:cayley:{SUFFIX}:paper" in names
    targets, _, tasks = _targets(url, ("cayley",), (), ())
    assert tasks == list(TASKS)
    assert {t.task: t.study for t in targets} == {task: f"{synthetic.model}:{task}:cayley:{SUFFIX}" for task in TASKS}
