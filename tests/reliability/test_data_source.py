"""A study knows where its data lives and how it was embedded (its ``SourceRecord``), so `export`, `explain`
and `loto` find the data without ``--data-dir`` and say which option to pass when it moved; `run` reads
custom columns like `embed` (on the synthetic setup: the tiny model, no language model).

Before: `export`/`explain` on a study run with ``--data-dir`` needed it again and, without it, retried the hub
for about 25 s; after a custom task folder moved they said "unknown task '<old path>'"; `run` had no
``--text-col`` although its error messages told users to pass it; an integer text column was embedded as text.
"""

from __future__ import annotations

import json
import logging
import shutil

import optuna
import pytest
from click.testing import CliRunner
from reliability_helpers import sqlite_url

from ilge_search.cli import cli
from ilge_search.record import SourceRecord, source_record
from ilge_search.study import StudyOptions, run_study
from ilge_search.study.export import StudyExport, load_study_model
from ilge_search.study.stored import load_training_data
from ilge_search.testing import refuse_model_loads

DATA = dict(max_train=120, max_eval=60)


def options(data_dir, cache_dir, **flat) -> StudyOptions:
    return StudyOptions.from_flat(
        data_dir=data_dir,
        cache_dir=cache_dir,
        device="cpu",
        progress=False,
        threads=1,
        n_trials=1,
        final_seeds=0,
        max_epochs=2,
        **DATA,
        **flat,
    )


@pytest.fixture()
def moved_data(synthetic, tmp_path, monkeypatch):
    """A trec study run on a copy of the synthetic data folder, which then moves: (study, old, new folder)."""
    monkeypatch.delenv("ILGE_SEARCH_DATA", raising=False)
    old = tmp_path / "data"
    shutil.copytree(synthetic.data_dir, old)
    synthetic.cache("trec", **DATA)
    url = sqlite_url(tmp_path / "s.db")
    with refuse_model_loads():
        (result,) = run_study(
            synthetic.model, "trec", "deepset", storage=url, options=options(old, synthetic.cache_dir)
        )
    study = optuna.load_study(study_name=result.study_name, storage=url)
    study.url = url  # for the tests that open it again
    return study, old, tmp_path / "moved"


def test_a_study_records_its_data_folder_and_extraction_settings(moved_data, synthetic):
    study, old, _ = moved_data
    source = source_record(study)
    assert source == SourceRecord(data_dir=str(old), data_dir_resolved=str(old.resolve()))
    assert (source.token_pooling, source.max_length) == ("mean", 512)
    with refuse_model_loads():  # found where the study recorded it: no --data-dir, no hub
        data = load_training_data(study, cache_dir=synthetic.cache_dir, device="cpu")
        assert data.split_sizes == {"train": 120, "validation": 60}
        exported = load_study_model(
            study.url, study.study_name, StudyExport(cache_dir=synthetic.cache_dir, device="cpu")
        )
    assert (exported.token_pooling, exported.max_length) == ("mean", 512)


def test_a_moved_data_folder_is_one_line_naming_data_dir_and_the_override_says_so(moved_data, synthetic, caplog):
    study, old, new = moved_data
    shutil.move(old, new)
    with pytest.raises(ValueError, match=rf"read its task data from {old.resolve()}, which no longer exists; pass "):
        load_training_data(study, cache_dir=synthetic.cache_dir, device="cpu")
    with caplog.at_level(logging.WARNING), refuse_model_loads():
        data = load_training_data(study, data_dir=new, cache_dir=synthetic.cache_dir, device="cpu")
    assert data.split_sizes["train"] == 120
    assert f"reading study {study.study_name!r}'s data from {new} (it recorded {old.resolve()})" in caplog.text


def test_a_moved_custom_task_names_task_path_and_is_read_from_the_new_place(synthetic, tmp_path, monkeypatch, caplog):
    task = tmp_path / "first" / "questions"
    shutil.copytree(synthetic.data_dir / "trec", task)
    synthetic.cache(str(task), **DATA)
    url = sqlite_url(tmp_path / "s.db")
    with refuse_model_loads():
        (result,) = run_study(
            synthetic.model, str(task), "deepset", storage=url, options=options(None, synthetic.cache_dir)
        )
    study = optuna.load_study(study_name=result.study_name, storage=url)
    assert source_record(study).task_path_given == str(task)
    moved = tmp_path / "second" / "renamed-too"  # moved and renamed: the study still knows it as "questions"
    moved.parent.mkdir()
    shutil.move(task, moved)
    with pytest.raises(ValueError, match=r"which no longer exists; pass --task-path with where it is now"):
        load_training_data(study, cache_dir=synthetic.cache_dir, device="cpu")
    result = CliRunner().invoke(
        cli,
        [
            "export",
            "--storage",
            url,
            "--study",
            study.study_name,
            "--out",
            str(tmp_path / "clf"),
            "--cache-dir",
            str(synthetic.cache_dir),
            "--device",
            "cpu",
        ],
    )
    assert result.exit_code == 1 and "pass --task-path with where it is now" in result.output
    assert "Traceback" not in result.output
    with refuse_model_loads(), caplog.at_level(logging.WARNING):
        data = load_training_data(study, task_path=moved, cache_dir=synthetic.cache_dir, device="cpu")
    assert data.split_sizes["train"] == 120 and "reading study" in caplog.text


def test_run_takes_the_column_options_of_embed_and_records_them(synthetic, tmp_path):
    rows = [json.loads(line) for line in (synthetic.data_dir / "trec" / "train.jsonl").read_text().splitlines()]
    folder = tmp_path / "renamed-columns"
    folder.mkdir()
    for split in ("train", "validation", "test"):
        lines = (synthetic.data_dir / "trec" / f"{split}.jsonl").read_text().splitlines()
        renamed = [{"sentence": r["text"], "category": r["label"]} for r in map(json.loads, lines)]
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in renamed))
    assert rows
    url = sqlite_url(tmp_path / "s.db")
    common = ["run", "--model", synthetic.model, "--task", str(folder), "--storage", url, "--device", "cpu"]
    common += ["--cache-dir", str(tmp_path / "cache"), "--n-trials", "1", "--final-seeds", "0", "--quiet"]
    common += ["--max-train", "60", "--max-eval", "30", "--max-epochs", "2", "--threads", "1"]
    missing = CliRunner().invoke(cli, common)
    assert missing.exit_code == 1 and "has no column 'text'" in missing.output and "Pass --text-col" in missing.output
    done = CliRunner().invoke(cli, [*common, "--text-col", "sentence", "--label-col", "category"])
    assert done.exit_code == 0, done.output
    (name,) = optuna.get_all_study_names(url)
    study = optuna.load_study(study_name=name, storage=url)
    assert source_record(study).task_columns == {"text_col": "sentence", "label_col": "category"}
    data = load_training_data(study, cache_dir=tmp_path / "cache", device="cpu")  # the columns come back too
    assert data.split_sizes["train"] == 60


def test_a_text_column_of_numbers_is_refused(tmp_path, no_model_loads):
    folder = tmp_path / "numbers"
    folder.mkdir()
    rows = [{"text": i, "label": "ab"[i % 2]} for i in range(40)]
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = CliRunner().invoke(
        cli, ["embed", "--model", "minilm-l6", "--task", str(folder), "--cache-dir", str(tmp_path / "c"), "--quiet"]
    )
    assert result.exit_code == 1 and "column 'text' holds numbers only (e.g. 0), not texts" in result.output


def test_a_renamed_custom_task_folder_resumes_its_study_and_reuses_its_cache(synthetic, tmp_path, caplog):
    """Before: renaming the folder (same content) started a new study and extracted every split again."""
    task = tmp_path / "questions"
    shutil.copytree(synthetic.data_dir / "trec", task)
    synthetic.cache(str(task), **DATA)
    url = sqlite_url(tmp_path / "s.db")
    with refuse_model_loads():
        (first,) = run_study(
            synthetic.model, str(task), "deepset", storage=url, options=options(None, synthetic.cache_dir)
        )
    renamed = tmp_path / "questions-v2"
    task.rename(renamed)
    with refuse_model_loads(), caplog.at_level(logging.WARNING):  # cache hits only: nothing extracted again
        (again,) = run_study(
            synthetic.model, str(renamed), "deepset", storage=url, options=options(None, synthetic.cache_dir)
        )
    assert again.study_name == first.study_name and optuna.get_all_study_names(url) == [first.study_name]
    assert again.n_complete == 2
    assert f"{renamed} holds the data of custom task 'questions' (same content; the folder was renamed)" in caplog.text
    study = optuna.load_study(study_name=first.study_name, storage=url)
    assert study.user_attrs["task_path"] == str(renamed.resolve())
