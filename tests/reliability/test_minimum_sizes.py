"""Minimum sizes for statistics: below ``MIN_TEST_ROWS`` test examples, or ``MIN_SEEDS`` seeds for a t interval, no
interval is shown as if it meant something; the tables say why, and `run` warns before any work."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import optuna
from reliability_helpers import sentences, write_task

from ilge_search.record import Identity, LeaderboardRecord, LeaderboardRow
from ilge_search.study import StudyOptions, list_studies
from ilge_search.study.check import check_run
from ilge_search.study.leaderboard import _with_interval, format_rows, format_table
from ilge_search.study.limits import MIN_SEEDS, MIN_TEST_ROWS
from ilge_search.study.predictions import StoredPredictions, paired_interval
from ilge_search.study.results import format_results, study_result
from ilge_search.testing import refuse_model_loads
from ilge_search.testing.store import add_study, classification_data, final_record, similarity_data


def _gain_final(scores, start, **fields):
    return final_record(scores, start_test_scores=start, search_gain=float(np.mean(scores) - np.mean(start)), **fields)


def test_the_minimums_are_twenty_test_examples_and_two_seeds():
    assert (MIN_TEST_ROWS, MIN_SEEDS) == (20, 2)  # docs/statistics.md states them


def test_a_two_pair_test_split_gets_no_interval_and_the_tables_say_why(tmp_path):
    # before: Spearman 1.0000 +- 0 and an interval of [+0, +0] over a 2-pair test split
    url = f"sqlite:///{tmp_path / 's.db'}"
    identity = Identity(model="minilm-l6", task="pairs", encoder="cayley")
    data = similarity_data(split_sizes={"train": 30, "validation": 10, "test": 2})
    add_study(url, identity, data=data, final=_gain_final([1.0, 1.0, 1.0], [1.0, 1.0, 1.0]))
    row = list_studies(url).iloc[0]
    assert row["search_gain_interval"] == "2 test pairs: too few for an interval"
    assert row["search_gain_verdict"] is None
    [study] = optuna.get_all_study_summaries(url)
    table = format_results([study_result(optuna.load_study(study_name=study.study_name, storage=url), url)])
    assert "+0.0000 (2 test pairs: too few for an interval)" in table and "[+0.0000, +0.0000]" not in table


def test_a_one_seed_study_says_why_it_has_no_interval(tmp_path):
    # before: `studies` showed an empty interval with no reason
    url = f"sqlite:///{tmp_path / 's.db'}"
    identity = Identity(model="minilm-l6", task="trec", encoder="cayley")
    data = classification_data(split_sizes={"train": 200, "validation": 100, "test": 100})
    add_study(url, identity, data=data, final=_gain_final([0.8], [0.7]))
    assert list_studies(url).iloc[0]["search_gain_interval"] == "1 seed: too few for an interval"
    [study] = optuna.get_all_study_summaries(url)
    table = format_results([study_result(optuna.load_study(study_name=study.study_name, storage=url), url)])
    assert "+0.1000 (1 seed: too few for an interval)" in table


def test_a_paired_bootstrap_needs_twenty_test_examples():
    def stored(size: int, right: float) -> StoredPredictions:
        truth = np.arange(size) % 3
        return StoredPredictions(truth, np.where(np.arange(size) < right * size, truth, (truth + 1) % 3)[None], (1,))

    assert paired_interval(stored(MIN_TEST_ROWS - 1, 1.0), stored(MIN_TEST_ROWS - 1, 0.5), "accuracy") is None
    assert paired_interval(stored(MIN_TEST_ROWS, 1.0), stored(MIN_TEST_ROWS, 0.5), "accuracy") is not None


def test_run_warns_before_any_work_about_a_test_split_too_small_for_an_interval(tmp_path, caplog):
    def rows(count: int, start: int) -> list:
        texts = sentences(2 * count, start)
        return [{"sentence1": texts[2 * i], "sentence2": texts[2 * i + 1], "score": float(i % 5)} for i in range(count)]

    task = write_task(tmp_path / "pairs", {"train": rows(30, 0), "validation": rows(10, 100), "test": rows(2, 200)})
    options = StudyOptions.from_flat(cache_dir=tmp_path / "cache", device="cpu", final_seeds=3, ensemble=0)
    url = f"sqlite:///{tmp_path / 's.db'}"
    with caplog.at_level(logging.WARNING), refuse_model_loads():
        check_run("minilm-l6", str(task), "cayley", url, options, dry_run=True)
    [warning] = [r.getMessage() for r in caplog.records if "too few for an interval" in r.getMessage()]
    assert warning.startswith("2 test pairs: too few for an interval: the tables will show the final differences")
    assert not (tmp_path / "s.db").exists()


def test_run_warns_about_one_final_seed_where_no_paired_bootstrap_is_stored(tmp_path, caplog):
    labels = ["a", "b"]
    rows = [{"text": text, "label": labels[i % 2]} for i, text in enumerate(sentences(120))]
    task = write_task(tmp_path / "two", {"train": rows[:60], "validation": rows[60:90], "test": rows[90:]})
    url = f"sqlite:///{tmp_path / 's.db'}"
    for protocol, warned in (("matched", False), ("paper", True)):  # the paper protocol stores no predictions
        caplog.clear()
        options = StudyOptions.from_flat(cache_dir=tmp_path / "cache", final_seeds=1, protocol=protocol, ensemble=0)
        with caplog.at_level(logging.WARNING), refuse_model_loads():
            check_run("minilm-l6", str(task), "cayley", url, options, dry_run=True)
        found = [r.getMessage() for r in caplog.records if "1 seed: too few for an interval" in r.getMessage()]
        assert bool(found) == warned, found
        assert not found or "pass --final-seeds 2 or more" in found[0]


def test_the_report_judges_no_task_on_too_few_test_examples():
    from ilge_search.report.comparisons import task_verdict

    truth = np.arange(2) % 2
    few = StoredPredictions(truth, np.tile(truth, (3, 1)), (1, 2, 3))
    scores = ([1.0, 1.0, 1.0], [0.5, 0.5, 0.5])  # before: a verdict from 2 test texts
    assert task_verdict(scores, (few, few), "accuracy") == (None, None)
    assert task_verdict(scores, (None, None), "accuracy") == ("win", "t interval")


def _board(test_rows, unit="texts"):
    nan = float("nan")
    rows = [
        LeaderboardRow("cayley", "method", val_scores=[0.8], test_scores=[0.812], difference=(0.012, nan, nan)),
        LeaderboardRow(name="best single layer", kind="reference", val_scores=[0.8], test_scores=[0.8]),
    ]
    return LeaderboardRecord(metric="accuracy", seeds=[1000], rows=rows, unit=unit, test_rows=test_rows)


def test_a_leaderboard_over_twelve_test_texts_shows_its_differences_without_an_interval():
    # before: "+1.20 [-6.67, +8.33] tie" and a footnote naming a bootstrap over 12 test texts
    record = LeaderboardRecord.from_value(_board(12).to_value())
    assert record is not None and record.test_rows == 12
    [row, reference] = format_rows(record)
    assert (row["vs_best_layer"], row["ci_low"], row["ci_high"], row["verdict"]) == (1.2, None, None, None)
    assert row["no_interval"] == "12 test texts: too few for an interval" and reference["no_interval"] is None
    table = format_table(record)
    assert "+1.20 (12 test texts: too few for an interval)" in table
    assert "tie" not in table and "bootstrap" not in table and "95% CI" not in table and "[" not in table.split("\n")[2]
    words = format_table(_board(MIN_TEST_ROWS - 1, unit="words"))
    assert f"+1.20 ({MIN_TEST_ROWS - 1} test words: too few for an interval)" in words


def test_a_leaderboard_of_twenty_test_texts_or_an_unknown_size_keeps_its_interval():
    shown = (0.012, -0.02, 0.04)
    for test_rows in (MIN_TEST_ROWS, None):  # None: a leaderboard stored before the size was recorded
        board = _board(test_rows)
        row = dataclasses.replace(board.rows[0], difference=shown, verdict="tie")
        record = dataclasses.replace(board, rows=[row, board.rows[1]])
        stored = record.to_value()
        if test_rows is None:
            del stored["test_rows"]
        table = format_table(LeaderboardRecord.from_value(stored))
        assert "+1.20 [-2.00, +4.00] tie" in table and "95% paired bootstrap" in table
        assert "too few" not in table


def test_the_leaderboard_evaluation_draws_no_interval_under_twenty_test_examples():
    row = LeaderboardRow(name="cayley", kind="method", test_scores=[0.75, 0.75])
    truth = np.arange(MIN_TEST_ROWS - 1) % 3
    labels = np.stack([truth, truth])
    how = dict(resamples=200, confidence=0.95, metric="accuracy", base=0.5)
    few = _with_interval(row, labels, labels, truth, **how)
    assert few.difference[0] == 0.25 and np.isnan(few.difference[1:]).all() and few.verdict is None
    enough = np.arange(MIN_TEST_ROWS) % 3
    drawn = _with_interval(row, np.stack([enough, enough]), np.stack([enough, enough]), enough, **how)
    assert drawn.verdict == "tie" and not np.isnan(drawn.difference).any()
