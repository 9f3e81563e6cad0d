"""The tagging task kind: the registered ``ud_ewt_pos``, custom files of words and tags, and the checks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ilge_search.report.catalog import task_catalog
from ilge_search.tasks.columns import TaskColumns
from ilge_search.tasks.core import TASKS, TaskError, few_shot, load_task, subsample

ROWS = [
    {"tokens": ["The", "cat", "sat", "."], "tags": ["DET", "NOUN", "VERB", "PUNCT"]},
    {"tokens": ["Dogs", "bark"], "tags": ["NOUN", "VERB"]},
    {"tokens": ["A", "dog", "ran", "home", "."], "tags": ["DET", "NOUN", "VERB", "ADV", "PUNCT"]},
    {"tokens": ["Run", "!"], "tags": ["VERB", "PUNCT"]},
]


def _write_jsonl(path: Path, rows) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def _folder(tmp_path: Path, train=ROWS, validation=ROWS[:2], test=ROWS[2:]) -> Path:
    for split, rows in (("train", train), ("validation", validation), ("test", test)):
        _write_jsonl(tmp_path / "task" / f"{split}.jsonl", rows)
    return tmp_path / "task"


# ----------------------------------------------------------------------------- the registered task


def test_ud_ewt_pos_loads_from_the_data_dir(data_dir):
    task = load_task("ud_ewt_pos", data_dir)
    spec = TASKS["ud_ewt_pos"]
    assert (spec.kind, spec.metric, spec.hf_dataset) == ("tagging", "accuracy", None)
    assert task.kind == "tagging" and task.num_labels == 17
    assert task.label_names == sorted(task.label_names) and {"NOUN", "VERB", "PUNCT", "X"} <= set(task.label_names)
    assert {name: len(part) for name, part in task.splits.items()} == {"train": 12544, "validation": 2001, "test": 2077}
    train = task["train"]
    assert len(train.labels) == train.word_offsets[-1] == 204577  # one tag per word
    first = train.sentences[0]
    assert first[:3] == ["Al", "-", "Zaman"]
    names = [task.label_names[i] for i in train.labels[: len(first)]]
    assert names[:3] == ["PROPN", "PUNCT", "PROPN"]
    assert train.flat_texts()[0].startswith("Al - Zaman : American forces")


def test_ud_ewt_pos_without_a_data_dir_says_where_to_put_it(monkeypatch, tmp_path):
    monkeypatch.delenv("ILGE_SEARCH_DATA", raising=False)
    with pytest.raises(TaskError, match=r"'ud_ewt_pos' has no download source and no data dir.*--data-dir"):
        load_task("ud_ewt_pos")
    with pytest.raises(TaskError, match=r"not in the data dir.*Put ud_ewt_pos/train.jsonl .*no download source"):
        load_task("ud_ewt_pos", tmp_path)


def test_the_catalog_shows_the_kind_and_the_tags(data_dir):
    rows = task_catalog(data_dir).set_index("task")
    row = rows.loc["ud_ewt_pos"]
    assert (row["kind"], row["metric"], row["classes_or_scores"], row["offline"]) == (
        "tagging",
        "accuracy",
        "17 tags",
        True,
    )
    assert row["splits"] == "train 12544 / validation 2001 / test 2077"
    offline = task_catalog(data_dir / "missing").set_index("task").loc["ud_ewt_pos"]
    assert (offline["source"], offline["offline"]) == ("data dir only", False)


# ----------------------------------------------------------------------------- custom files


def test_a_folder_with_tokens_and_tags_is_a_tagging_task(tmp_path):
    task = load_task(_folder(tmp_path))
    assert task.kind == "tagging" and task.spec.metric == "accuracy"
    assert task.label_names == ["ADV", "DET", "NOUN", "PUNCT", "VERB"]
    train = task["train"]
    assert len(train) == 4 and train.sentences[1] == ["Dogs", "bark"]
    np.testing.assert_array_equal(train.word_offsets, [0, 4, 6, 11, 13])
    assert [task.label_names[i] for i in train.labels[4:6]] == ["NOUN", "VERB"]


def test_other_column_names_and_csv_strings(tmp_path):
    rows = [{"words": r["tokens"], "pos": r["tags"]} for r in ROWS]
    path = _write_jsonl(tmp_path / "renamed.jsonl", rows * 5)
    with pytest.raises(TaskError, match=r"has no column 'tokens'.*Pass --tokens-col"):
        load_task(path, columns=TaskColumns(tags_col="pos"))
    task = load_task(path, columns=TaskColumns(tokens_col="words", tags_col="pos"))
    assert task.kind == "tagging" and len(task["train"]) + len(task["validation"]) == 20  # validation carved

    frame = pd.DataFrame({"tokens": [" ".join(r["tokens"]) for r in ROWS], "tags": [" ".join(r["tags"]) for r in ROWS]})
    frame.to_csv(tmp_path / "train.csv", index=False)
    from_csv = load_task(tmp_path / "train.csv", columns=TaskColumns(tokens_col="tokens", tags_col="tags"))
    assert (
        from_csv.kind == "tagging"
        and sum(map(len, from_csv["train"].sentences + from_csv["validation"].sentences)) == 13
    )

    with pytest.raises(TaskError, match=r"--tokens-col/--tags-col are for a token task.*drop one kind"):
        load_task(path, columns=TaskColumns(text_col="words", tokens_col="words"))


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"tokens": [], "tags": []}, r"train.jsonl: row 3: column 'tokens' is an empty sentence; remove the row"),
        ({"tokens": ["a", "b"], "tags": ["X"]}, r"train.jsonl: row 3: 2 word\(s\) but 1 tag\(s\).*exactly one tag"),
        (
            {"tokens": ["a", 7], "tags": ["X", "Y"]},
            r"row 3: word 2 of column 'tokens' is 7 \(int\); every word must be",
        ),
        ({"tokens": ["a", " "], "tags": ["X", "Y"]}, r"row 3: word 2 of column 'tokens' is ' '"),
        ({"tokens": "a b", "tags": ["X", "Y"]}, r"row 3: column 'tokens' holds the string 'a b', not a list of words"),
        ({"tokens": {"a": 1}, "tags": ["X"]}, r"row 3: column 'tokens' holds a dict, not a list of words"),
        ({"tags": ["X"]}, r"row 3: column 'tokens' holds nothing, not a list of words"),
        ({"tokens": ["a"], "tags": [None]}, r"row 3: tag 1 of column 'tags' is None"),
        ({"tokens": ["a"], "tags": None}, r"row 3: column 'tags' holds no list of tags"),
    ],
)
def test_bad_rows_are_refused_with_the_file_and_the_row(tmp_path, row, message):
    folder = _folder(tmp_path, train=[ROWS[0], ROWS[1], row, ROWS[2]])
    with pytest.raises(TaskError, match=message):
        load_task(folder)


def test_tags_of_validation_or_test_must_be_seen_in_train(tmp_path):
    unseen = {"tokens": ["Oh", "no"], "tags": ["INTJ", "ADV"]}
    folder = _folder(tmp_path, test=[ROWS[0], unseen])
    with pytest.raises(
        TaskError, match=r"test.jsonl: row 2 of split 'test' has tag\(s\) 'INTJ' that the train split does not"
    ):
        load_task(folder)
    single = [{"tokens": ["a", "b"], "tags": ["X", "X"]}] * 3
    with pytest.raises(TaskError, match="every word has the tag 'X'; a tagger needs at least two tags"):
        load_task(_folder(tmp_path / "single", train=single, validation=single, test=single))


@pytest.mark.parametrize(
    ("rows", "options", "message"),
    [
        # a text file given a token task's columns: pass the text options
        ([{"text": "a b", "label": "x"}], dict(tokens_col="words"), r"is a classification task: --tokens-col names"),
        ([{"text": "a b", "label": "x"}], dict(tags_col="pos"), r"a token task's columns; pass --text-col/--label-col"),
        (
            [{"sentence1": "a", "sentence2": "b", "score": 1.0}],
            dict(tokens_col="words", tags_col="pos"),
            r"is a similarity task: --tokens-col, --tags-col name a token task's columns; pass --text-cols/--score-col",
        ),
        # a token file given a text task's columns: pass the token options
        (
            ROWS,
            dict(text_col="sentence"),
            r"is a token task .*: --text-col names a text task's columns; pass --tokens-col",
        ),
        (ROWS, dict(label_col="tags"), r"--label-col names a text task's columns; pass --tokens-col/--tags-col"),
        (ROWS, dict(text_cols=["a", "b"], score_col="s"), r"--text-cols, --score-col name a text task's columns"),
    ],
)
def test_column_options_of_the_other_kind_of_task_say_what_to_pass(tmp_path, rows, options, message):
    path = _write_jsonl(tmp_path / "train.jsonl", rows * 6)
    with pytest.raises(TaskError, match=message):
        load_task(path, columns=TaskColumns(**options))


def test_a_registered_task_refuses_the_other_kinds_column_options(data_dir):
    with pytest.raises(
        TaskError, match=r"^ud_ewt_pos is a token task .*--text-col names .*pass --tokens-col/--tags-col"
    ):
        load_task("ud_ewt_pos", data_dir, columns=TaskColumns(text_col="text"))
    with pytest.raises(
        TaskError, match=r"^trec is a classification task: --tokens-col names .*pass --text-col/--label"
    ):
        load_task("trec", data_dir, columns=TaskColumns(tokens_col="tokens"))


def test_renamed_token_columns_beside_a_text_column_are_a_token_task(tmp_path):
    rows = [{"text": " ".join(r["tokens"]), "words": r["tokens"], "pos": r["tags"]} for r in ROWS]
    task = load_task(
        _write_jsonl(tmp_path / "train.jsonl", rows * 5), columns=TaskColumns(tokens_col="words", tags_col="pos")
    )
    assert task.kind == "tagging" and task.label_names == ["ADV", "DET", "NOUN", "PUNCT", "VERB"]


# ----------------------------------------------------------------------------- subsets and fingerprints


def test_subsampling_caps_sentences_with_a_seed_and_keeps_their_tags(data_dir):
    task = load_task("ud_ewt_pos", data_dir)
    small = subsample(task, 50, seed=3)
    again = subsample(task, 50, seed=3)
    other = subsample(task, 50, seed=4)
    assert {name: len(part) for name, part in small.splits.items()} == {"train": 50, "validation": 50, "test": 50}
    assert small["train"].sentences == again["train"].sentences != other["train"].sentences
    part = small["train"]
    assert len(part.labels) == part.word_offsets[-1] == sum(map(len, part.sentences))
    full = task["train"]
    index = full.sentences.index(part.sentences[7])
    np.testing.assert_array_equal(
        part.labels[part.word_offsets[7] : part.word_offsets[8]],
        full.labels[full.word_offsets[index] : full.word_offsets[index + 1]],
    )
    assert small.label_names == task.label_names  # ids keep their meaning


def test_few_shot_is_refused_for_tagging(tmp_path):
    with pytest.raises(TaskError, match="tags words \\(a tagging task\\); drop --shots"):
        few_shot(load_task(_folder(tmp_path)), 2)


def test_fingerprints_follow_words_tags_and_word_boundaries(tmp_path):
    base = load_task(_folder(tmp_path / "a")).fingerprint("train")
    assert load_task(_folder(tmp_path / "b")).fingerprint("train") == base
    retagged = [dict(ROWS[0], tags=["DET", "NOUN", "NOUN", "PUNCT"]), *ROWS[1:]]
    reworded = [dict(ROWS[0], tokens=["The", "cat", "sits", "."]), *ROWS[1:]]
    merged = [{"tokens": ["The cat", "sat", "."], "tags": ["DET", "VERB", "PUNCT"]}, *ROWS[1:]]
    split = [{"tokens": ["The", "cat", "sat", "."], "tags": ["DET", "VERB", "VERB", "PUNCT"]}, *ROWS[1:]]
    prints = {base}
    for name, rows in (("c", retagged), ("d", reworded), ("e", merged), ("f", split)):
        prints.add(load_task(_folder(tmp_path / name, train=rows)).fingerprint("train"))
    assert len(prints) == 5
