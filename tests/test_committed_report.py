"""The committed report (``reports/``) and package defaults agree with the study storage they came from.

``reports/offline.db`` holds the studies of ``studies/offline.toml``; the report, ``reports/defaults.md``
and ``ilge_search/data/recommended_defaults.json`` were generated from it. These checks rebuild the
numbers from a copy of that storage, so a hand-edited table or a stale defaults file fails here.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest

from ilge_search.report import collect_results
from ilge_search.report import methods as report_methods
from ilge_search.report.defaults_page import recommend_defaults
from ilge_search.study import load_sweep
from ilge_search.tuning import RECOMMENDED_DEFAULTS_PATH, load_recommended_defaults

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports"
GRID = ROOT / "studies" / "offline.toml"


@pytest.fixture(scope="module")
def storage_copy(tmp_path_factory):
    """A copy of the committed storage: opening it must never touch the committed file."""
    copy = tmp_path_factory.mktemp("committed") / "offline.db"
    shutil.copyfile(REPORTS / "offline.db", copy)
    return f"sqlite:///{copy}"


def test_the_report_covers_every_model_task_and_method_with_three_seeds():
    grid = load_sweep(GRID)
    results = pd.read_csv(REPORTS / "results.csv")
    if "protocol" in results:  # the grid's studies are matched-protocol ones; paper rows come from protocol.toml
        results = results[results["protocol"] == "matched"]
    if "shots" in results:  # few-shot curves come from fewshot.toml, on a subset of the tasks
        results = results[results["shots"].isna()]
    tasks = {entry.task for entry in grid.entries} | {"sick_r (zero-shot, stsb encoder)"}
    for model in ("minilm-l6", "smollm2-135m"):
        rows = results[results["model"] == model]
        assert set(rows["task"]) == tasks, model
        for task in tasks:
            methods = rows[rows["task"] == task]
            assert sorted(methods["method"]) == sorted(report_methods()), (model, task)
            assert (methods["n_seeds"] >= 3).all() and methods["mean"].notna().all(), (model, task)
    # every study ran exactly the grid's trial budget (what the README states)
    by_study = results.drop_duplicates("study").set_index("study")
    for entry in grid.entries:
        row = by_study.loc[entry.study_name]
        assert row["n_complete"] + row["n_pruned"] + row["n_failed"] == entry.n_trials, entry.study_name


@pytest.mark.slow  # reads every trial of the committed storage: a check of committed files, run in CI
def test_the_committed_numbers_are_the_stored_ones(storage_copy):
    stored = collect_results(storage_copy).set_index(["model", "task", "method"]).sort_index()
    committed = pd.read_csv(REPORTS / "results.csv").set_index(["model", "task", "method"]).sort_index()
    assert list(stored.index) == list(committed.index)
    for column in ("mean", "std", "n_seeds", "best_val"):
        for key in stored.index:
            assert stored.loc[key, column] == pytest.approx(committed.loc[key, column], abs=1e-9, nan_ok=True), (
                key,
                column,
            )
    markdown = (REPORTS / "report.md").read_text()
    cayley = stored.loc[("smollm2-135m", "trec", "cayley")]
    assert f"{cayley['mean']:.2f} ± {cayley['std']:.2f}" in markdown


@pytest.mark.slow  # derives the defaults from the whole committed storage, run in CI
def test_the_package_defaults_are_what_recommend_derives_from_the_storage(storage_copy, tmp_path, monkeypatch):
    from ilge_search import tuning
    from ilge_search.defaults.loto import stored_loto

    shipped = json.loads(RECOMMENDED_DEFAULTS_PATH.read_text())
    loto = stored_loto(storage_copy)
    if loto.verdicts and not loto.missing:  # the shipping rule: what `recommend --update-shipped` writes
        monkeypatch.setattr(tuning, "RECOMMENDED_DEFAULTS_PATH", tmp_path / "shipped.json")
        method = shipped["metadata"].get("method", "marginal")  # portfolio: from the stored cross-task matrices
        derived = recommend_defaults(storage_copy, update_shipped=True, report_path=None, method=method)
        assert shipped["metadata"]["shipping"] == derived["metadata"]["shipping"]
    else:  # a storage from before the leave-one-task-out check: what was shipped then
        derived = recommend_defaults(storage_copy, tmp_path / "defaults.json", report_path=None)
    assert shipped["families"] == derived["families"]
    assert shipped["metadata"]["source"] == "sqlite:///reports/offline.db"
    loaded = load_recommended_defaults()
    for family, buckets in derived["families"].items():
        for field, value in buckets["small"].items():
            stored = loaded[family]["small"][field]
            assert stored == value or (isinstance(value, float) and math.isclose(stored, value)), (family, field)
    assert "| cayley |" in (REPORTS / "defaults.md").read_text()


@pytest.mark.slow  # reads the committed cross-task matrix and its shipping check, run in CI
def test_the_shipping_rules_table_and_the_defaults_page_show_what_the_storage_holds(storage_copy):
    from ilge_search.defaults.shipping_check import stored_shipping_check
    from ilge_search.defaults.transfer import stored_portfolio
    from ilge_search.report.portfolio import SHIPPING_TABLE_MARKERS, statistics_table

    page = (ROOT / "docs" / "statistics.md").read_text(encoding="utf-8")
    begin, end = SHIPPING_TABLE_MARKERS
    shown = page[page.index(begin) + len(begin) : page.index(end)].strip("\n")
    assert shown == statistics_table(storage_copy).strip("\n")  # what reports/shipped.sh writes there
    check = stored_shipping_check(storage_copy, stored_portfolio(storage_copy, "cayley", "small"))
    defaults = (REPORTS / "defaults.md").read_text(encoding="utf-8")
    if check is not None and check.complete:  # the check in the setting that ships decides, and the page shows it
        assert f"In the setting that ships: {check.epochs} epochs" in defaults
        assert "held-out problems trained with 50 epochs and early stopping" in shown
    else:
        assert "measured with epochs capped at 10, not in the setting that ships" in shown


def test_the_committed_ensemble_page_and_the_default_size_agree_with_their_storage(tmp_path):
    from ilge_search.report.ensembles import ensemble_frame, ensemble_rows, ensemble_sentences
    from ilge_search.storage import open_storage
    from ilge_search.study.options import DEFAULT_ENSEMBLE

    copy = tmp_path / "ensembles.db"
    shutil.copyfile(REPORTS / "ensembles.db", copy)
    frame = ensemble_frame(open_storage(f"sqlite:///{copy}", must_exist=True).study_summaries())
    page = (REPORTS / "ensembles.md").read_text(encoding="utf-8")
    _, rows = ensemble_rows(frame)
    assert len(rows) == 14 * 4 and all("| " + " | ".join(row) + " |" in page for row in rows)
    sentences = ensemble_sentences(frame)
    assert all(sentence in page for sentence in sentences)
    chosen = next(s for s in sentences if s.startswith(f"K = {DEFAULT_ENSEMBLE}:"))
    # what the README and the guide say about the default size
    assert "+1.74 points on average [+1.04, +2.53] over 14 of 14 studies (95% bootstrap over studies: a win" in chosen
    assert "per study over the seeds, 95% t interval: 5 win, 9 tie, 0 loss" in chosen
    assert "+1.74 points on average" in (ROOT / "README.md").read_text(encoding="utf-8")
    assert "**The default is K = 5**" in (ROOT / "docs" / "ensembles.md").read_text(encoding="utf-8")


def test_the_committed_auto_page_is_what_its_storages_give(tmp_path, monkeypatch):
    from ilge_search.report.auto import AutoPage, write_auto_page

    monkeypatch.chdir(ROOT)  # the page names its grid files as reports/auto.sh gives them, from the root

    copies = []
    for name in ("auto.db", "offline.db", "ensembles.db", "tokens2000.db", "auto-time.db"):
        if (REPORTS / name).exists():  # the runs under a time limit: only once reports/auto.sh has made them
            shutil.copyfile(REPORTS / name, tmp_path / name)
        copies.append(f"sqlite:///{tmp_path / name}")
    grids = [Path("studies") / name for name in ("auto.toml", "auto-2000.toml", "auto-tokens.toml")]
    page = AutoPage(copies[0], copies[1:4], grids, copies[4])
    written = write_auto_page(page, tmp_path / "auto").read_text(encoding="utf-8")
    committed = (REPORTS / "auto.md").read_text(encoding="utf-8")
    # the same table and sentences; only the storages' paths in the opening paragraph differ
    assert written.split("\n\n", 2)[2] == committed.split("\n\n", 2)[2]
