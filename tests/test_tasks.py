"""Task registry and loading: real local data, custom files, and every error before any model loads."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from ilge_search.tasks.columns import TaskColumns
from ilge_search.tasks.core import TASKS, TaskError, few_shot, get_task_spec, list_tasks, load_task, subsample

PAPER_TASKS = {
    "banking77",
    "emotion",
    "mtop_domain",
    "mtop_intent",
    "poem_sentiment",
    "stsb",
    "sts12",
    "sts13",
    "sts14",
    "sts15",
    "sts16",
    "biosses",
    "sick_r",
}


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def banking(data_dir):
    return load_task("banking77", data_dir)


# ------------------------------------------------------------------ registry


def test_registry_has_the_paper_tasks_and_more():
    assert PAPER_TASKS | {"trec", "sst2", "tweeteval_emotion", "ud_ewt_pos"} == set(list_tasks())
    for name in ("banking77", "emotion", "mtop_domain", "mtop_intent", "poem_sentiment", "trec", "sst2"):
        assert (TASKS[name].kind, TASKS[name].metric) == ("classification", "accuracy")
    for name in ("stsb", "sts12", "sts13", "sts14", "sts15", "sts16", "biosses", "sick_r"):
        assert (TASKS[name].kind, TASKS[name].metric) == ("similarity", "spearman")
    assert TASKS["stsb"].zero_shot_of is None
    assert {n for n, s in TASKS.items() if s.zero_shot_of == "stsb"} == {
        "sts12",
        "sts13",
        "sts14",
        "sts15",
        "sts16",
        "biosses",
        "sick_r",
    }
    assert TASKS["sick_r"].local_name == "sick"
    assert all(spec.hf_dataset for spec in TASKS.values() if spec.kind != "tagging")
    assert (TASKS["ud_ewt_pos"].kind, TASKS["ud_ewt_pos"].metric, TASKS["ud_ewt_pos"].hf_dataset) == (
        "tagging",
        "accuracy",
        None,
    )
    assert get_task_spec("Sick-R") is TASKS["sick_r"]


def test_unknown_task_lists_the_known_ones():
    with pytest.raises(TaskError, match=r"unknown task 'bankin77'.*banking77.*tweeteval_emotion"):
        load_task("bankin77")


# ------------------------------------------------------------------ real local data


def test_banking77_carves_a_stratified_seeded_validation_split(banking, data_dir):
    train, val, test = banking["train"], banking["validation"], banking["test"]
    assert list(banking.splits) == ["train", "validation", "test"]
    assert len(train) + len(val) == 10003 and len(test) == 3080
    assert abs(len(val) / 10003 - 0.15) < 0.005
    assert banking.num_labels == 77 and banking.label_names == sorted(banking.label_names)
    # Stratified: every label has about 15% of its examples in validation, and all stay in train.
    train_counts = np.bincount(train.labels, minlength=77)
    val_counts = np.bincount(val.labels, minlength=77)
    assert train_counts.min() > 0
    share = val_counts / (train_counts + val_counts)
    assert np.all(np.abs(share - 0.15) < 0.02), share
    # Disjoint and complete, deterministic for the same seed, different for another.
    again = load_task("banking77", data_dir)
    assert again["validation"].texts == val.texts
    other = load_task("banking77", data_dir, seed=7)
    assert other["validation"].texts != val.texts
    assert sorted(other["validation"].texts + other["train"].texts) == sorted(val.texts + train.texts)


def test_label_ids_follow_sorted_names(banking, data_dir):
    rows = [json.loads(line) for line in (data_dir / "banking77" / "test.jsonl").read_text().splitlines()[:50]]
    for i, row in enumerate(rows):
        assert banking["test"].texts[i] == row["text"]
        assert banking.label_names[banking["test"].labels[i]] == row["label"]
    assert banking["test"].labels.dtype == np.int64


def test_tasks_with_their_own_validation_keep_it(data_dir):
    emotion = load_task("emotion", data_dir)
    assert {k: len(v) for k, v in emotion.splits.items()} == {"train": 16000, "validation": 2000, "test": 2000}
    assert emotion.label_names == ["anger", "fear", "joy", "love", "sadness", "surprise"]


def test_similarity_tasks_load_pairs_and_scores(data_dir):
    stsb = load_task("stsb", data_dir)
    assert stsb.kind == "similarity" and stsb.label_names == []
    first = json.loads((data_dir / "stsb" / "train.jsonl").read_text().splitlines()[0])
    assert stsb["train"].pairs[0] == (first["sentence1"], first["sentence2"])
    assert stsb["train"].labels.dtype == np.float32 and stsb["train"].labels[0] == pytest.approx(first["score"])
    assert stsb["test"].flat_texts()[:2] == list(stsb["test"].pairs[0])
    # Zero-shot tasks are evaluated on test only; sick_r reads the local "sick" folder.
    sick = load_task("sick_r", data_dir)
    assert list(sick.splits) == ["test"] and len(sick["test"]) == 4927


def test_column_override_on_a_registered_task(data_dir):
    fine = load_task("trec", data_dir, columns=TaskColumns(label_col="fine_label"))
    assert fine.num_labels > 40 and all(":" in name for name in fine.label_names)


def test_fingerprint_is_stable_and_content_sensitive(banking, data_dir):
    fp = banking.fingerprint("test")
    assert len(fp) == 64 and fp == load_task("banking77", data_dir).fingerprint("test")
    assert fp != banking.fingerprint("train")
    changed = subsample(banking, 100, seed=0)
    assert changed.fingerprint("test") != fp
    changed["test"].texts[0] += "!"
    assert changed.fingerprint("test") != subsample(banking, 100, seed=0).fingerprint("test")


# ------------------------------------------------------------------ errors before any model


def test_missing_column_names_the_present_ones(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [{"sentence": "a b", "intent": "x"}] * 10)
    with pytest.raises(TaskError, match=r"no column 'text' \(columns present: sentence, intent\).*--text-col"):
        load_task(path)
    with pytest.raises(TaskError, match=r"no column 'lbl'.*--label-col"):
        load_task(path, columns=TaskColumns(text_col="sentence", label_col="lbl"))


def test_empty_texts_are_reported_with_row_numbers(tmp_path):
    rows = [{"text": f"text {i}", "label": "a" if i % 2 else "b"} for i in range(20)]
    rows[3]["text"] = "   "
    rows[11]["text"] = None
    with pytest.raises(TaskError, match=r"2 empty text\(s\) at row\(s\) 4, 12"):
        load_task(write_jsonl(tmp_path / "t.jsonl", rows))


def test_labels_missing_from_train_are_an_error(tmp_path):
    rows = [{"text": f"t{i}", "label": "a" if i % 2 else "b"} for i in range(10)]
    write_jsonl(tmp_path / "task" / "train.jsonl", rows)
    write_jsonl(tmp_path / "task" / "test.jsonl", [{"text": "x", "label": "a"}, {"text": "y", "label": "zebra"}])
    with pytest.raises(TaskError, match=r"split 'test' have label\(s\) that the train split does not have: 'zebra'"):
        load_task(tmp_path / "task")


def test_missing_split_file_and_missing_task_folder(tmp_path):
    write_jsonl(tmp_path / "banking77" / "train.jsonl", [{"text": "x", "label": "a"}])
    with pytest.raises(TaskError, match=r"lacks the split file\(s\) test.jsonl"):
        load_task("banking77", tmp_path)
    with pytest.raises(TaskError, match=r"'emotion' is not in the data dir .*it has: banking77.*unset --data-dir"):
        load_task("emotion", tmp_path)


def test_online_without_datasets_says_to_pass_a_data_dir(monkeypatch):
    monkeypatch.delenv("ILGE_SEARCH_DATA", raising=False)
    monkeypatch.setitem(sys.modules, "datasets", None)  # import fails as if not installed
    with pytest.raises(TaskError, match=r"needs the `datasets` library.*--data-dir"):
        load_task("mtop_domain")


def test_bad_score_and_bad_json(tmp_path):
    rows = [{"sentence1": "a", "sentence2": "b", "score": 1.0}, {"sentence1": "a", "sentence2": "b", "score": "n/a"}]
    with pytest.raises(TaskError, match=r"non-numeric score\(s\) at row\(s\) 2"):
        load_task(write_jsonl(tmp_path / "p.jsonl", rows))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a", "label": "x"}\n{"text": \n')
    with pytest.raises(TaskError, match="line 2 is not valid JSON"):
        load_task(bad)


# ------------------------------------------------------------------ custom tasks


def test_custom_csv_tsv_and_folder(tmp_path):
    import pandas as pd

    frame = pd.DataFrame(
        {
            "utterance": [f"sentence number {i}" for i in range(40)],
            "intent": [["greet", "bye", "ask"][i % 3] for i in range(40)],
        }
    )
    frame.to_csv(tmp_path / "data.csv", index=False)
    frame.to_csv(tmp_path / "data.tsv", index=False, sep="\t")
    csv = load_task(tmp_path / "data.csv", columns=TaskColumns(text_col="utterance", label_col="intent"))
    tsv = load_task(tmp_path / "data.tsv", columns=TaskColumns(text_col="utterance", label_col="intent"))
    assert csv.name == "data" and csv.label_names == ["ask", "bye", "greet"]
    assert list(csv.splits) == ["train", "validation"]  # one file: validation carved from it
    assert len(csv["train"]) + len(csv["validation"]) == 40 and len(csv["validation"]) == 6
    assert csv.fingerprint("train") == tsv.fingerprint("train")
    folder = tmp_path / "folder"
    folder.mkdir()
    frame.iloc[:30].to_csv(folder / "train.csv", index=False)
    frame.iloc[30:].to_csv(folder / "dev.csv", index=False)
    frame.iloc[30:].to_csv(folder / "test.csv", index=False)
    task = load_task(folder, columns=TaskColumns(text_col="utterance", label_col="intent"))
    assert {k: len(v) for k, v in task.splits.items()} == {"train": 30, "validation": 10, "test": 10}
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("x")
    with pytest.raises(TaskError, match=r"has no train file.*it has: notes.txt"):
        load_task(tmp_path / "empty")


def test_custom_pairs_and_numeric_labels(tmp_path):
    pairs = write_jsonl(
        tmp_path / "pairs.jsonl", [{"a": f"first {i}", "b": f"second {i}", "sim": i / 10} for i in range(20)]
    )
    task = load_task(pairs, columns=TaskColumns(text_cols=["a", "b"], score_col="sim"))
    assert task.kind == "similarity" and task.spec.metric == "spearman"
    assert len(task["train"]) + len(task["validation"]) == 20 and len(task["validation"]) == 3
    numeric = write_jsonl(tmp_path / "num.jsonl", [{"text": f"t{i}", "label": [2, 10, 1][i % 3]} for i in range(30)])
    assert load_task(numeric).label_names == ["1", "2", "10"]


def test_parquet_reads_or_says_what_to_install(tmp_path):
    import pandas as pd

    frame = pd.DataFrame({"text": [f"t{i}" for i in range(20)], "label": ["a", "b"] * 10})
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        (tmp_path / "d.parquet").write_bytes(b"PAR1")
        with pytest.raises(TaskError, match="pip install pyarrow"):
            load_task(tmp_path / "d.parquet")
    else:
        frame.to_parquet(tmp_path / "d.parquet")
        assert load_task(tmp_path / "d.parquet").label_names == ["a", "b"]


# ------------------------------------------------------------------ subsets


def test_subsample_is_stratified_and_seeded(banking):
    small = subsample(banking, 770, seed=3)
    assert all(len(part) == 770 for part in small.splits.values())
    counts = np.bincount(small["test"].labels, minlength=77)
    full = np.bincount(banking["test"].labels, minlength=77) * 770 / len(banking["test"])
    assert np.all(np.abs(counts - full) <= 1)
    assert small.label_names == banking.label_names
    assert subsample(banking, 770, seed=3)["test"].texts == small["test"].texts
    assert subsample(banking, 770, seed=4)["test"].texts != small["test"].texts
    only_train = subsample(banking, fraction=0.1, splits=["train"])
    assert len(only_train["train"]) == round(0.1 * len(banking["train"]))
    assert len(only_train["test"]) == len(banking["test"])
    with pytest.raises(ValueError, match="exactly one of n"):
        subsample(banking, 10, fraction=0.5)


def test_few_shot_keeps_k_per_label(banking):
    shots = few_shot(banking, 8, seed=0)
    assert np.all(np.bincount(shots["train"].labels, minlength=77) == 8)
    assert shots["test"] is banking["test"] and len(shots["validation"]) == len(banking["validation"])
    assert few_shot(banking, 8, seed=1)["train"].texts != shots["train"].texts


def test_carving_keeps_rare_labels_in_train(tmp_path):
    rows = [{"text": f"t{i}", "label": "common"} for i in range(40)] + [{"text": "only one", "label": "rare"}]
    task = load_task(write_jsonl(tmp_path / "t.jsonl", rows))
    assert "rare" in {task.label_names[i] for i in task["train"].labels}
    assert len(task["validation"]) == 6
