"""Absurd numeric settings and names are refused in one line before anything is created or loaded.

Each case is one the hostile-user pass found accepted: ``--threads 100000`` (OpenBLAS then failed to start
its threads and the process hung), ``--shots 1000 --max-train 200`` (a study named ``1000shot`` on 200 rows),
``--samples-per-label`` above the data or on a similarity task, ``--cv 50`` on 68 rows, a study name with a
newline. ``no_model_loads`` fails a test the moment a model or tokenizer would load; the storage file must not
exist afterwards.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from reliability_helpers import labelled, one_line_error, refused_run, sentences, sqlite_url, write_task

from ilge_search.study import StudyOptions
from ilge_search.validation import usable_cpus


@pytest.fixture()
def six_labels(tmp_path) -> Path:
    """68 training rows over 6 labels (the largest 12), 24 validation and 24 test rows."""
    labels = [f"l{i}" for i in range(6)]
    train = labelled(60, labels) + labelled(8, labels[:4], 500)
    return write_task(
        tmp_path / "six", {"train": train, "validation": labelled(24, labels, 200), "test": labelled(24, labels, 300)}
    )


@pytest.fixture()
def pairs(tmp_path) -> Path:
    def rows(count: int, start: int) -> list:
        texts = sentences(2 * count, start)
        return [{"sentence1": texts[2 * i], "sentence2": texts[2 * i + 1], "score": float(i % 5)} for i in range(count)]

    return write_task(tmp_path / "pairs", {"train": rows(30, 0), "validation": rows(10, 100), "test": rows(10, 200)})


def test_threads_above_the_cpu_count_are_refused_before_the_study_is_created(tmp_path, six_labels, no_model_loads):
    message = one_line_error(refused_run(tmp_path, six_labels, "--threads", "100000", "--n-trials", "0"))
    assert f"--threads 100000 is more than the {usable_cpus()} CPUs this process may use" in message
    with pytest.raises(ValueError, match="more than the"):
        StudyOptions.from_flat(threads=usable_cpus() + 1)
    assert StudyOptions.from_flat(threads=usable_cpus()).runtime.threads == usable_cpus()


def test_shots_that_max_train_would_cut_again_are_refused(tmp_path, six_labels, no_model_loads):
    message = one_line_error(refused_run(tmp_path, six_labels, "--shots", "10", "--max-train", "20"))
    assert "--shots 10 keeps 60 training examples" in message and "not be 10-shot" in message
    assert "--max-train 60 or more" in message


def test_samples_per_label_above_every_label_is_refused(tmp_path, six_labels, no_model_loads):
    message = one_line_error(refused_run(tmp_path, six_labels, "--protocol", "paper", "--samples-per-label", "5000"))
    assert "--samples-per-label 5000 is more than any label has" in message and "the largest has 12" in message


def test_samples_per_label_on_a_similarity_task_is_refused(tmp_path, pairs, no_model_loads):
    message = one_line_error(refused_run(tmp_path, pairs, "--protocol", "paper", "--samples-per-label", "3"))
    assert "'pairs' is a similarity task, whose readout trains nothing: drop --samples-per-label" in message


def test_more_folds_than_the_largest_label_are_refused(tmp_path, six_labels, no_model_loads):
    message = one_line_error(refused_run(tmp_path, six_labels, "--cv", "50"))
    assert "--cv 50 makes more folds than any label has training examples" in message
    assert "pass --cv 12 or fewer" in message


def test_similarity_folds_of_fewer_than_three_pairs_are_refused(tmp_path, pairs, no_model_loads):
    message = one_line_error(refused_run(tmp_path, pairs, "--cv", "11"))
    assert "--cv 11 leaves fewer than 3 of the 30 training pairs in a fold" in message


@pytest.mark.parametrize("name", ["two\nlines", "tab\there", "bell\x07"])
def test_a_study_name_with_a_control_character_is_refused(tmp_path, six_labels, no_model_loads, name):
    message = one_line_error(refused_run(tmp_path, six_labels, "--study-name", name))
    assert "holds a control character (newline, tab ...)" in message


def test_cv_against_a_capped_split_names_the_cap_not_advice_already_followed(tmp_path, six_labels, no_model_loads):
    """Before: `--cv 5 --max-train 12` advised "use --max-train 6 or more", which was already the case."""
    message = one_line_error(refused_run(tmp_path, six_labels, "--cv", "5", "--max-train", "12"))
    assert "the largest of the 6 labels has 2 of 12 rows" in message
    assert "pass --cv 2 or fewer, or a larger --max-train (about 30)" in message


def test_a_dry_run_writes_no_weights_hash_memo(tmp_path, data_dir, no_model_loads):
    """Before: `run --dry-run` wrote <cache>/models/file-hashes.json although its help says nothing is written."""
    from ilge_search.study import plan_run

    cache = tmp_path / "cache"
    plan = plan_run(
        "minilm-l6",
        "trec",
        "cayley",
        storage=sqlite_url(tmp_path / "s.db"),
        options=StudyOptions.from_flat(n_trials=1, max_train=60, data_dir=data_dir, cache_dir=cache, device="cpu"),
        calibrate=False,
    )
    assert plan.describe()
    assert not cache.exists() and not (tmp_path / "s.db").exists()
