"""Changed data never merges into an old study; a custom task's study follows its content, not its path.

A study records the label names and a sha256 of each split it trains, validates and tests on. Resuming it on
other data stops with one line that says what changed and how to start a new study -- before any model loads
(the fingerprints come from the texts and labels alone). Real minilm-l6 studies on real trec texts.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner

from ilge_search.cli import cli
from ilge_search.study import StudyOptions, SweepEntry, run_study
from ilge_search.study.identity import DataChangedError, check_identity

MODEL = "minilm-l6"
SUBSET = dict(max_train=240, max_eval=160, max_epochs=4)
pytestmark = [pytest.mark.slow, pytest.mark.realmodel]


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


def write_questions(folder: Path, data_dir: Path, *, edit=lambda text: text, relabel=lambda label: label) -> Path:
    """A custom task folder: 150 trec training and 60 test questions (validation is carved from train)."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", 150), ("test", 60)):
        rows = [json.loads(line) for line in (data_dir / "trec" / f"{split}.jsonl").read_text().splitlines()[:count]]
        (folder / f"{split}.jsonl").write_text(
            "".join(json.dumps({"text": edit(r["text"]), "label": relabel(r["label"])}) + "\n" for r in rows)
        )
    return folder


def study_trials(url: str) -> dict:
    return {s.study_name: s.n_trials for s in optuna.get_all_study_summaries(url)}


@pytest.fixture(scope="module")
def questions_study(tmp_path_factory, data_dir, cache_dir):
    """A 2-trial last-layer study on a custom task folder."""
    root = tmp_path_factory.mktemp("questions")
    folder = write_questions(root / "questions", data_dir)
    url = sqlite_url(root / "studies.db")
    result = run_study(
        MODEL,
        str(folder),
        "last-layer",
        storage=url,
        options=StudyOptions.from_flat(
            n_trials=2, final_seeds=0, max_epochs=3, cache_dir=cache_dir, device="cpu", progress=False
        ),
    )[0]
    return root, folder, url, result


def copied(questions_study, tmp_path: Path):
    """The module's storage, copied (each test changes its own)."""
    root, folder, _url, result = questions_study
    shutil.copyfile(root / "studies.db", tmp_path / "studies.db")
    return folder, sqlite_url(tmp_path / "studies.db"), result


def test_the_custom_task_study_is_named_by_content_not_path(questions_study):
    root, folder, url, result = questions_study
    assert result.study_name.startswith(f"{MODEL}:questions@") and str(root) not in result.study_name
    attrs = optuna.load_study(study_name=result.study_name, storage=url).user_attrs
    assert attrs["task"] == "questions" and attrs["task_path"] == str(folder.resolve())  # where the data is now
    assert sorted(attrs["data_fingerprints"]) == ["test", "train", "validation"]
    assert attrs["label_names"] == ["ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"]


def test_changed_texts_under_the_same_name_are_refused_before_any_model_loads(
    questions_study, tmp_path, cache_dir, no_model_loads
):
    folder, url, result = copied(questions_study, tmp_path)
    changed = tmp_path / "questions"
    shutil.copytree(folder, changed)
    train = changed / "train.jsonl"
    rows = [json.loads(line) for line in train.read_text().splitlines()]
    rows[7]["text"] += " (edited)"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    before = study_trials(url)

    out = CliRunner().invoke(
        cli,
        [
            "run",
            "--model",
            MODEL,
            "--task",
            str(changed),
            "--encoder",
            "last-layer",
            "--study-name",
            result.study_name,
            "--storage",
            url,
            "--final-seeds",
            "0",
            "--max-epochs",
            "3",
            "--n-trials",
            "1",
            "--cache-dir",
            str(cache_dir),
            "--device",
            "cpu",
            "--quiet",
        ],
    )

    assert out.exit_code == 1, out.output
    message = " ".join(out.output.split())
    # row 8 went to the training part (validation is carved from train.jsonl), and only train says so
    assert f"study '{result.study_name}' was run on other data: the content of the train split changed since" in message
    assert (
        "pass another --study-name, or drop --study-name to use this data's default name "
        f"'{MODEL}:questions@" in message
    )
    assert "Traceback" not in out.output and len(out.output.strip().splitlines()) == 1
    assert study_trials(url) == before  # nothing added, nothing changed


def test_changed_labels_are_named_in_the_refusal(questions_study, tmp_path, cache_dir, no_model_loads):
    folder, url, result = copied(questions_study, tmp_path)
    relabelled = tmp_path / "questions"
    shutil.copytree(folder, relabelled)
    for split in ("train.jsonl", "test.jsonl"):
        path = relabelled / split
        path.write_text(path.read_text().replace('"label": "HUM"', '"label": "PERSON"'))
    with pytest.raises(
        DataChangedError,
        match=r"the labels \(stored \[ABBR, DESC, ENTY, HUM, LOC, NUM\], now "
        r"\[ABBR, DESC, ENTY, LOC, NUM, PERSON\]\)",
    ):
        run_study(
            MODEL,
            str(relabelled),
            "last-layer",
            storage=url,
            options=StudyOptions.from_flat(
                n_trials=1,
                study_name=result.study_name,
                final_seeds=0,
                max_epochs=3,
                cache_dir=cache_dir,
                device="cpu",
                progress=False,
            ),
        )


def test_rerunning_the_same_command_on_changed_data_starts_a_new_study(questions_study, tmp_path, cache_dir, data_dir):
    """The issue's case: same folder path, new contents, same command. The old study is left as it was."""
    _folder, url, result = copied(questions_study, tmp_path)
    changed = write_questions(tmp_path / "questions", data_dir, edit=lambda text: text.replace("?", "? !"))
    new = run_study(
        MODEL,
        str(changed),
        "last-layer",
        storage=url,
        options=StudyOptions.from_flat(
            n_trials=1, final_seeds=0, max_epochs=3, cache_dir=cache_dir, device="cpu", progress=False
        ),
    )[0]
    assert new.study_name != result.study_name and new.study_name.startswith(f"{MODEL}:questions@")
    assert study_trials(url) == {result.study_name: 2, new.study_name: 1}
    old_attrs = optuna.load_study(study_name=result.study_name, storage=url).user_attrs
    new_attrs = optuna.load_study(study_name=new.study_name, storage=url).user_attrs
    assert old_attrs["data_fingerprints"]["train"] != new_attrs["data_fingerprints"]["train"]


def test_a_moved_task_folder_resumes_its_study_without_extracting_again(
    questions_study, tmp_path, cache_dir, no_model_loads
):
    folder, url, result = copied(questions_study, tmp_path)
    moved = tmp_path / "elsewhere" / "deeper" / "questions"
    shutil.copytree(folder, moved)
    again = run_study(
        MODEL,
        str(moved),
        "last-layer",
        storage=url,
        options=StudyOptions.from_flat(
            n_trials=1, final_seeds=0, max_epochs=3, cache_dir=cache_dir, device="cpu", progress=False
        ),
    )[0]
    assert again.study_name == result.study_name and again.n_complete == 3
    assert optuna.load_study(study_name=again.study_name, storage=url).user_attrs["task_path"] == str(moved.resolve())


def test_two_folders_with_one_name_and_other_contents_get_two_studies(tmp_path, data_dir):
    first = write_questions(tmp_path / "a" / "questions", data_dir)
    second = write_questions(tmp_path / "b" / "questions", data_dir, edit=lambda text: text.lower())
    same = write_questions(tmp_path / "c" / "questions", data_dir)
    names = [
        SweepEntry(model=MODEL, task=str(folder), encoder="cayley", n_trials=1).study_name
        for folder in (first, second, same)
    ]
    assert names[0] != names[1] and names[0] == names[2]
    assert all(name.startswith(f"{MODEL}:questions@") and str(tmp_path) not in name for name in names)


# ----------------------------------------------------------------------------- registered tasks, older studies


def edited_trec(tmp_path: Path, data_dir: Path) -> Path:
    """A data dir whose trec train split has every text changed (same labels, same size)."""
    root = tmp_path / "data"
    (root / "trec").mkdir(parents=True)
    shutil.copyfile(data_dir / "trec" / "test.jsonl", root / "trec" / "test.jsonl")
    rows = [json.loads(line) for line in (data_dir / "trec" / "train.jsonl").read_text().splitlines()]
    (root / "trec" / "train.jsonl").write_text("".join(json.dumps(dict(r, text=r["text"] + " ?")) + "\n" for r in rows))
    return root


def test_a_registered_task_whose_files_changed_is_refused_before_any_model_loads(
    tmp_path, data_dir, trec_cached, no_model_loads
):
    url = sqlite_url(tmp_path / "s.db")
    options_storage = url
    options = dict(final_seeds=0, cache_dir=trec_cached, device="cpu", progress=False, **SUBSET)
    first = run_study(
        MODEL,
        "trec",
        "last-layer",
        storage=options_storage,
        options=StudyOptions.from_flat(n_trials=1, data_dir=data_dir, **options),
    )[0]
    with pytest.raises(DataChangedError) as info:
        run_study(
            MODEL,
            "trec",
            "last-layer",
            storage=options_storage,
            options=StudyOptions.from_flat(n_trials=1, data_dir=edited_trec(tmp_path, data_dir), **options),
        )
    message = str(info.value)
    assert (
        f"study '{first.study_name}' was run on other data: the content of the train and validation splits "
        "changed since" in message
    )
    assert message.endswith("pass another --study-name or another --storage")
    assert study_trials(url) == {first.study_name: 1}


def _forget_fingerprints(db: Path) -> None:
    """Make the study look like one made before data fingerprints were recorded."""
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM study_user_attributes WHERE key = 'data_fingerprints'")


def test_a_study_from_before_fingerprints_is_adopted_on_the_same_data_and_refused_on_other(
    tmp_path, data_dir, trec_cached
):
    db = tmp_path / "old.db"
    options_storage = sqlite_url(db)
    options = dict(final_seeds=0, cache_dir=trec_cached, device="cpu", progress=False, **SUBSET)
    name = run_study(
        MODEL,
        "trec",
        "mean-layers",
        storage=options_storage,
        options=StudyOptions.from_flat(n_trials=1, data_dir=data_dir, **options),
    )[0].study_name
    fingerprints = optuna.load_study(study_name=name, storage=sqlite_url(db)).user_attrs["data_fingerprints"]
    _forget_fingerprints(db)

    adopted = run_study(
        MODEL,
        "trec",
        "mean-layers",
        storage=options_storage,
        options=StudyOptions.from_flat(n_trials=1, data_dir=data_dir, **options),
    )[0]
    assert adopted.n_complete == 2
    assert optuna.load_study(study_name=name, storage=sqlite_url(db)).user_attrs["data_fingerprints"] == fingerprints

    _forget_fingerprints(db)
    with pytest.raises(
        DataChangedError,
        match=r"made by an earlier ilge-search .* cached-embedding keys it stored differ from this data's",
    ):
        run_study(
            MODEL,
            "trec",
            "mean-layers",
            storage=options_storage,
            options=StudyOptions.from_flat(n_trials=1, data_dir=edited_trec(tmp_path, data_dir), **options),
        )
    assert study_trials(sqlite_url(db)) == {name: 2}


def test_new_weights_under_the_same_model_name_are_refused_like_changed_data():
    """A local model folder whose weights were replaced keeps its path, so only the revision tells."""
    stored = {
        "model": "/models/mine",
        "task": "trec",
        "encoder": "cayley",
        "shots": None,
        "max_train": 500,
        "max_eval": 400,
        "max_epochs": 10,
        "data_seed": 0,
        "cv": None,
        "label_names": ["a", "b"],
        "data_fingerprints": {"train": "f1", "validation": "f2", "test": "f3"},
        "model_revision": "sha256:1111111111111111",
    }
    assert check_identity("s", stored, dict(stored)) is False  # same weights: resumes
    wanted = {**stored, "model_revision": "sha256:2222222222222222"}
    with pytest.raises(
        DataChangedError,
        match=r"the model's weights \(stored revision sha256:111111111111, "
        r"now sha256:222222222222\) changed since",
    ):
        check_identity("s", stored, wanted)
    assert check_identity("s", {**stored, "model_revision": ""}, wanted) is False  # an older study without one
