"""The shipping check: a stored matrix's left-out checks retrained in the setting that ships.

A tiny storage of real studies (Cayley on stsb and trec, for two model folders holding the same tiny model, so that
both left-out checks have folds; synthetic embeddings, no model loads), its matrix trained with the studies' epoch
cap of 2, then the check: only the built-in defaults and each fold's default on the held-out problems, trained with
the configuration's own epochs and early stopping, in a study of their own.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import optuna
import pytest
from click.testing import CliRunner

from ilge_search.cli import cli
from ilge_search.defaults.portfolio import BUILTIN, PortfolioRequest, TrainingSetup
from ilge_search.defaults.shipping_check import (
    ShippingCheckRequest,
    check_cells,
    fold_defaults,
    shipped_epochs,
    shipping_check,
    shipping_evidence,
    stored_shipping_check,
)
from ilge_search.defaults.transfer import portfolio, stored_portfolio
from ilge_search.record import portfolio_study_name, shipping_check_study_name, stored_cells
from ilge_search.storage import open_storage
from ilge_search.study import StudyOptions

pytestmark = pytest.mark.slow  # real studies and a matrix first: about a minute on 2 cores

DATA = dict(max_train=240, max_eval=100)
TASKS = ("stsb", "trec")
REQUEST = PortfolioRequest(top_k=1, seeds=2, size=2)
MATRIX = portfolio_study_name("cayley", "small")
CHECK = shipping_check_study_name("cayley", "small", 50)


def _setup(synthetic) -> TrainingSetup:
    return TrainingSetup(synthetic.data_dir, synthetic.cache_dir, "cpu", threads=1, progress=False)


def _copy(url: str, target) -> str:
    shutil.copyfile(url.removeprefix("sqlite:///"), target)
    return f"sqlite:///{target}"


def _names(url: str) -> list[str]:
    return [s.study_name for s in optuna.get_all_study_summaries(url)]


@pytest.fixture(scope="module")
def matrix(tmp_path_factory, synthetic, tiny_model):
    """Studies of two model folders x two tasks and their complete matrix with its left-out checks."""
    from ilge_search.study import run_study
    from ilge_search.testing import refuse_model_loads

    folder = tmp_path_factory.mktemp("second-model") / "tiny-bert-b"
    shutil.copytree(tiny_model, folder)
    url = f"sqlite:///{tmp_path_factory.mktemp('shipping') / 'studies.db'}"
    options = StudyOptions.from_flat(
        device="cpu",
        threads=1,
        progress=False,
        seed=0,
        max_epochs=2,
        n_trials=3,
        final_seeds=0,
        data_dir=synthetic.data_dir,
        cache_dir=synthetic.cache_dir,
        **DATA,
    )
    with refuse_model_loads():
        for setup in (synthetic, dataclasses.replace(synthetic, model=str(folder))):
            for task in TASKS:
                setup.cache(task, **DATA)
                run_study(setup.model, task, "cayley", storage=url, options=options)
        portfolio(url, REQUEST, _setup(synthetic), check=True)
    return url


@pytest.fixture(scope="module")
def checked(matrix, synthetic, tmp_path_factory):
    """The shipping check trained on a copy of the matrix's storage: (url, check, the matrix's trials before)."""
    from ilge_search.testing import refuse_model_loads

    url = _copy(matrix, tmp_path_factory.mktemp("checked") / "studies.db")
    before = len(open_storage(url).existing_study(MATRIX).get_trials(deepcopy=False))
    with refuse_model_loads():
        check = shipping_check(url, setup=_setup(synthetic), workers=1)
    return url, check, before


def test_the_dry_run_plans_only_the_rules_cells_and_creates_nothing(matrix, synthetic, tmp_path):
    url = _copy(matrix, tmp_path / "studies.db")
    result = stored_portfolio(url, "cayley", "small")
    choices = fold_defaults(result)
    assert sorted({f.kind for f, _ in choices}) == ["model", "task"] and len(choices) == 4
    builtin = next(i for i, c in enumerate(result.candidates) if c.name == BUILTIN)
    pairs = {(c, p) for fold, default in choices for p in fold.held for c in (builtin, default)}
    dry = shipping_check(url, dry_run=True)
    assert len(dry.cells) == len(pairs) * REQUEST.seeds == dry.missing  # two configurations per problem at most
    assert {(c.candidate, c.problem) for c in dry.cells} == pairs
    assert dry.estimated_seconds > 0 and dry.trained == 0
    assert CHECK not in _names(url) and stored_shipping_check(url, result) is None
    # the evidence is still the matrix's own, and says how it was capped
    evidence = shipping_evidence(url, result)
    assert evidence.check is None and "epochs capped at 2" in evidence.setting
    assert not evidence.verdict()[0]


def test_the_check_trains_its_cells_as_the_defaults_ship_in_their_own_study(checked, synthetic):
    from ilge_search.engine import train_encoder
    from ilge_search.study.stored import load_training_data

    url, check, before = checked
    assert check.complete and check.trained == len(check.cells) and check.setting == ""
    assert check.epochs == shipped_epochs("cayley") == 50 and check.study == CHECK
    opened = open_storage(url, must_exist=True)
    assert len(opened.existing_study(MATRIX).get_trials(deepcopy=False)) == before  # nothing into the matrix
    done, _ = stored_cells(opened.existing_study(CHECK))
    assert len(done) == len(check.cells)
    assert all(cell.key["config"]["epochs"] == 50 for cell in done.values())
    # early stopping ends a run 10 epochs after its best one: every cell ran past the matrix's cap of 2
    assert all(2 < cell.scores.epochs_run <= 50 for cell in done.values())
    # a stored cell is what the one engine gives for that config, seed and data
    cell = check.cells[0]
    problem = check.result.problems[cell.problem]
    data = load_training_data(
        opened.existing_study(problem.study), data_dir=synthetic.data_dir, cache_dir=synthetic.cache_dir
    )
    again = train_encoder(cell.config, data.train, data.validation, task_kind=data.task_kind, seed=cell.key.seed)
    assert done[cell.key.digest].scores.validation == pytest.approx(again.best_val_metric, abs=1e-6)
    # one row per fold and held-out problem, the difference in the direction of improvement
    rows = check.held_out.rows
    assert len(rows) == sum(len(f.held) for f, _ in check.choices) == 8
    for row in rows:
        assert row["portfolio_default_diff"] == pytest.approx(row["portfolio_default"] - row["builtin"])
        assert "marginal" not in row and "portfolio_best" not in row
    assert set(check.held_out.verdicts) == {("task", "portfolio_default"), ("model", "portfolio_default")}


def test_a_rerun_trains_nothing_and_the_rule_reads_the_check(checked, synthetic, monkeypatch):
    import ilge_search.engine as engine
    from ilge_search.defaults.shipping_check import portfolio_defaults
    from ilge_search.record import stored_shipping_check as stored_record

    def refuse(*args, **kwargs):
        raise AssertionError("a stored cell was trained again")

    monkeypatch.setattr(engine, "train_encoder", refuse)
    monkeypatch.setattr(engine, "train_many", refuse)
    url, first, _ = checked
    again = shipping_check(url, setup=_setup(synthetic))
    assert again.trained == 0 and again.held_out.rows == first.held_out.rows
    record = stored_record(open_storage(url).existing_study(CHECK))
    assert record["epochs"] == 50 and record["matrix"] == MATRIX and record["matrix_epochs"] == [2]
    assert [c["default"] for c in record["choices"]] == [first.result.candidates[d].name for _, d in first.choices]
    evidence = shipping_evidence(url, first.result)
    assert evidence.check is not None and evidence.setting == ""
    assert evidence.held_out is not None and evidence.held_out.rows == first.held_out.rows
    _, shipping = portfolio_defaults(url, {"cayley": {"small": {}}}, update_shipped=True)
    why = shipping["cayley/small"]
    assert "held-out problems trained with 50 epochs and early stopping" in why
    assert "epochs capped at 2, not in the setting that ships" not in why
    assert "leave one task out:" in why and "leave one model out:" in why


def test_cells_of_other_epochs_go_to_another_study_and_say_they_were_capped(checked, synthetic, tmp_path):
    from ilge_search.testing import refuse_model_loads

    url = _copy(checked[0].removeprefix("sqlite:///"), tmp_path / "studies.db")
    with refuse_model_loads():
        capped = shipping_check(url, ShippingCheckRequest(epochs=3), _setup(synthetic))
    assert capped.study == shipping_check_study_name("cayley", "small", 3) and capped.complete
    assert capped.setting.startswith("measured with epochs capped at 3, not in the setting that ships: 50 epochs")
    opened = open_storage(url, must_exist=True)
    assert all(c.key["config"]["epochs"] == 3 for c in stored_cells(opened.existing_study(capped.study))[0].values())
    assert len(stored_cells(opened.existing_study(CHECK))[0]) == len(checked[1].cells)  # the 50-epoch study as it was
    assert {c.key.digest for c in capped.cells}.isdisjoint(c.key.digest for c in checked[1].cells)
    # the rule reads the check in the setting that ships, not the capped one
    assert shipping_evidence(url, capped.result).check.epochs == 50


def test_a_check_not_yet_complete_leaves_the_matrix_rows_deciding(matrix, synthetic, tmp_path):
    from ilge_search.defaults.transfer import train_in_processes
    from ilge_search.testing import refuse_model_loads

    url = _copy(matrix, tmp_path / "studies.db")
    result = stored_portfolio(url, "cayley", "small")
    cells = check_cells(result, fold_defaults(result), None)
    with refuse_model_loads():  # one cell trained, as an interrupted run leaves it
        train_in_processes(url, result.request, cells[:1], result.problems, _setup(synthetic), 1, CHECK)
    check = stored_shipping_check(url, result)
    assert check is not None and check.missing == len(cells) - 1 and not check.complete
    assert len(check.held_out.rows) < 8  # the folds with missing cells are left out
    evidence = shipping_evidence(url, result)
    assert evidence.held_out is result.held_out and "epochs capped at 2" in evidence.setting
    assert f"{CHECK} holds 1 of its {len(cells)} cells, so the matrix's own rows decide" in evidence.verdict()[1]


def test_bad_input_ends_with_one_line_before_anything_is_created(matrix, tmp_path):
    runner = CliRunner()
    empty = tmp_path / "empty.db"
    studies_only = _copy(matrix, tmp_path / "no-matrix.db")
    optuna.delete_study(study_name=MATRIX, storage=studies_only)
    for args, message in (
        (["--storage", f"sqlite:///{empty}"], "no study storage at"),
        (["--storage", studies_only], "holds no cayley (small) cross-task matrix chosen without exclusions"),
        (["--storage", studies_only, "--workers", "0"], "Invalid value for '--workers'"),
        (["--storage", studies_only, "--family", "fc", "--family", "cayley"], "--family was given 2 times"),
    ):
        out = runner.invoke(cli, ["shipping-check", *args])
        assert out.exit_code != 0 and message in out.output, out.output
        assert "Traceback" not in out.output
    assert not empty.exists() and CHECK not in _names(studies_only)
    with pytest.raises(ValueError, match="unknown size bucket"):
        shipping_check(studies_only, ShippingCheckRequest(bucket="huge"))
    with pytest.raises(ValueError, match="epochs"):
        shipping_check(studies_only, ShippingCheckRequest(epochs=0))
    with pytest.raises(ValueError, match="epochs 60 is above the configuration's own 50"):
        shipping_check(studies_only, ShippingCheckRequest(epochs=60))
    assert CHECK not in _names(studies_only)


def test_the_command_prints_the_plan_the_tables_and_the_decision(checked, synthetic):
    url = checked[0]
    folders = ["--data-dir", str(synthetic.data_dir), "--cache-dir", str(synthetic.cache_dir), "--device", "cpu"]
    runner = CliRunner()
    dry = runner.invoke(cli, ["shipping-check", "--storage", url, "--dry-run", *folders])
    assert dry.exit_code == 0, dry.output
    assert "4 folds (defaults chosen: task:" in dry.output and "0 of them missing" in dry.output
    shown = runner.invoke(cli, ["shipping-check", "--storage", url, "--quiet", *folders])
    assert shown.exit_code == 0, shown.output
    assert "| left out | model | task | unit | built-in | portfolio default | default diff | default chosen |" in (
        shown.output
    )
    assert "shipping rule: " in shown.output and "trained with 50 epochs and early stopping" in shown.output
    data = json.loads(runner.invoke(cli, ["shipping-check", "--storage", url, "--format", "json", *folders]).output)
    assert data["epochs"] == 50 and data["study"] == CHECK and data["missing_cells"] == 0
    assert len(data["held_out"]["rows"]) == 8
    table = runner.invoke(cli, ["shipping-check", "--storage", url, "--format", "csv", *folders]).output.splitlines()
    assert table[0].startswith("fold,held_out,model,task,unit,builtin,portfolio_default,") and len(table) == 9


def test_the_defaults_page_and_the_docs_table_show_the_check(checked, tmp_path, monkeypatch):
    from ilge_search import tuning
    from ilge_search.report.defaults_page import recommend_defaults
    from ilge_search.report.portfolio import shipping_table

    url = checked[0]
    monkeypatch.setattr(tuning, "RECOMMENDED_DEFAULTS_PATH", tmp_path / "shipped.json")
    page = tmp_path / "defaults.md"
    recommend_defaults(url, tmp_path / "defaults.json", page, families=["cayley"], method="portfolio")
    text = page.read_text()
    assert "#### In the setting that ships: 50 epochs" in text
    assert f"stored in `{CHECK}`" in text
    evidence = shipping_evidence(url, stored_portfolio(url, "cayley", "small"))
    table = shipping_table(evidence, "Cayley portfolio default")
    lines = table.splitlines()
    assert lines[0] == "| check | Cayley portfolio default against the built-in defaults | defaults chosen | verdict |"
    assert lines[2].startswith("| leave one task out | ") and lines[3].startswith("| leave one model out | ")
    assert lines[-1].startswith("By the rule: ") and "50 epochs and early stopping" in lines[-1]
