"""Faulty task data is refused (or warned about) in one line, before any model loads; so is every bad input of
``ilge-search run`` (model, task, storage, options), with no side effects.

Each test builds a tiny task in tmp_path; ``no_model_loads`` fails a test the moment a model or
tokenizer would load, so "refused before the model" is checked, not assumed.
"""

from __future__ import annotations

import inspect
import json
import logging
from pathlib import Path
from typing import ClassVar

import optuna
import pytest
from click.testing import CliRunner
from reliability_helpers import MODEL, labelled, one_line_error, refused_run, sentences, sqlite_url, write_task

from ilge_search.cli import cli
from ilge_search.embeddings.cache import ExtractionSettings, load_task_embeddings
from ilge_search.study.grid import load_sweep
from ilge_search.tasks.columns import TaskColumns
from ilge_search.tasks.core import TaskError, few_shot, load_task, subsample

# ----------------------------------------------------------------------------- a single label


def test_single_label_task_is_refused_before_any_model_load(tmp_path, no_model_loads):
    task = write_task(tmp_path / "one-label", {"train": labelled(40, ["spam"]), "test": labelled(10, ["spam"], 100)})
    cache = tmp_path / "cache"
    with pytest.raises(TaskError, match="every row has the label 'spam'; a classifier needs at least two labels"):
        load_task_embeddings(
            "minilm-l6", task, cache_dir=cache, progress=False, settings=ExtractionSettings(device="cpu")
        )
    assert not (cache / "embeddings").exists()  # nothing extracted, nothing written

    result = refused_run(tmp_path, task)
    assert "at least two labels" in one_line_error(result)


# ----------------------------------------------------------------------------- lists and dicts


@pytest.mark.parametrize(
    "column, value, kind",
    [
        ("label", ["sports", "politics"], "list"),
        ("label", {"name": "sports"}, "dict"),
        ("text", ["two", "sentences"], "list"),
    ],
)
def test_list_or_dict_values_are_refused_naming_the_rows(tmp_path, no_model_loads, column, value, kind):
    rows = labelled(30, ["a", "b"])
    for row in (rows[3], rows[7]):
        row[column] = value
    task = write_task(tmp_path / "nested", {"train": rows, "test": labelled(10, ["a", "b"], 100)})
    with pytest.raises(TaskError) as caught:
        load_task_embeddings(
            "minilm-l6", task, cache_dir=tmp_path / "cache", progress=False, settings=ExtractionSettings(device="cpu")
        )
    message = str(caught.value)
    assert f"column {column!r} holds {kind} values at row(s) 4, 8" in message
    assert "one value per row" in message and "\n" not in message


# ----------------------------------------------------------------------------- --max-train and --shots


def _ten_labels(tmp_path: Path) -> Path:
    # 10 labels, 12..21 training rows each (the largest has 21)
    rows = [row for i in range(10) for row in labelled(12 + i, [f"l{i}"], 100 * i)]
    return write_task(
        tmp_path / "ten",
        {
            "train": rows,
            "validation": labelled(20, [f"l{i}" for i in range(10)], 5000),
            "test": labelled(20, [f"l{i}" for i in range(10)], 6000),
        },
    )


def test_max_train_below_the_number_of_labels_warns_in_one_line(tmp_path, caplog):
    task = load_task(_ten_labels(tmp_path))
    with caplog.at_level(logging.WARNING, logger="ilge_search.tasks.core"):
        kept = subsample(task, 6, seed=0, splits=["train"])
    assert len(kept["train"]) == 6 and len(set(kept["train"].labels.tolist())) == 6
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "warning: task 'ten': 4 of 10 labels have no example among the 6 training rows kept "
        "(--max-train 6), so they can never be predicted; use --max-train 10 or more, or --shots."
    ]

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ilge_search.tasks.core"):
        subsample(task, 10, seed=0, splits=["train"])  # one row per label: nothing to warn about
        subsample(task, 3, seed=0, splits=["validation", "test"])  # evaluation caps never warn
    assert not caplog.records


def test_shots_above_every_label_count_is_refused_before_any_model_load(tmp_path, no_model_loads):
    folder = _ten_labels(tmp_path)
    task = load_task(folder)
    assert len(few_shot(task, 21, seed=0)["train"]) == sum(range(12, 22))  # = the largest label: allowed
    with pytest.raises(
        TaskError,
        match=r"shots_per_label=22 \(--shots\) is more than any label of 'ten' has in "
        r"train \(the largest has 21\).*Use --shots 21 or fewer",
    ):
        few_shot(task, 22, seed=0)

    result = refused_run(tmp_path, folder, "--shots", "500")
    assert "the largest has 21" in one_line_error(result)


# ----------------------------------------------------------------------------- test rows in train


def test_test_rows_duplicated_in_train_are_counted_in_a_one_line_warning(tmp_path, caplog):
    train = labelled(40, ["a", "b"])
    test = train[5:12] + labelled(13, ["a", "b"], 500)  # 7 of 20 test rows copied from train
    folder = write_task(tmp_path / "leaky", {"train": train, "validation": labelled(10, ["a", "b"], 900), "test": test})
    with caplog.at_level(logging.WARNING, logger="ilge_search.tasks.core"):
        load_task(folder)
        load_task(folder)  # the same data again: not repeated
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(messages) == 1 and "\n" not in messages[0]
    assert messages[0].startswith("warning: task 'leaky': 7 of 20 test rows also appear in train (same text)")

    caplog.clear()
    clean = write_task(tmp_path / "clean", {"train": train, "test": labelled(20, ["a", "b"], 500)})
    with caplog.at_level(logging.WARNING, logger="ilge_search.tasks.core"):
        load_task(clean)
    assert not caplog.records


def test_a_worker_process_does_not_repeat_the_data_warnings(tmp_path, monkeypatch, caplog):
    from ilge_search.study import workers
    from ilge_search.tasks import core as tasks

    train = labelled(40, ["a", "b"])
    folder = write_task(tmp_path / "leaky", {"train": train, "test": train[:5] + labelled(10, ["a", "b"], 500)})
    monkeypatch.setattr(tasks, "_QUIET", {"data warnings": False})
    with caplog.at_level(logging.WARNING, logger="ilge_search.tasks.core"):
        load_task(folder)  # the process that starts the workers: warns
        assert len(caplog.records) == 1
        tasks.quiet_data_warnings()  # what each worker process does first
        load_task(write_task(tmp_path / "leaky-2", {"train": train, "test": train[:6]}))
    assert len(caplog.records) == 1
    assert "quiet_data_warnings()" in inspect.getsource(workers.worker_main)


def test_duplicated_sentence_pairs_are_counted_too(tmp_path, caplog):
    pairs = [
        {"sentence1": a, "sentence2": b, "score": float(i % 5)}
        for i, (a, b) in enumerate(zip(sentences(30), sentences(30, 300), strict=True))
    ]
    folder = write_task(tmp_path / "pairs", {"train": pairs, "test": pairs[:4] + pairs[-1:]})
    with caplog.at_level(logging.WARNING, logger="ilge_search.tasks.core"):
        task = load_task(folder)
    train_pairs = set(task["train"].pairs)
    expected = sum(1 for pair in task["test"].pairs if pair in train_pairs)  # validation was carved from train
    assert expected >= 1
    assert [r.getMessage()[:60] for r in caplog.records] == [
        f"warning: task 'pairs': {expected} of 5 test rows also appear in train"[:60]
    ]


# ----------------------------------------------------------------------------- bytes that are not UTF-8


def test_non_utf8_jsonl_names_the_file_and_the_line(tmp_path, no_model_loads):
    folder = write_task(tmp_path / "latin1", {"train": labelled(20, ["a", "b"]), "test": labelled(6, ["a", "b"], 50)})
    path = folder / "train.jsonl"
    lines = path.read_bytes().split(b"\n")
    lines[11] = lines[11].replace(b"the ", b"the caf\xe9 ", 1)  # line 12, Latin-1
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(TaskError) as caught:
        load_task_embeddings(
            "minilm-l6", folder, cache_dir=tmp_path / "cache", progress=False, settings=ExtractionSettings(device="cpu")
        )
    offset = sum(len(line) + 1 for line in lines[:11]) + len('{"text": "the caf')
    assert str(caught.value).startswith(f"{path}: line 12, column 18 is not valid UTF-8 (byte 0xe9 at offset {offset}:")
    assert "save the file as UTF-8" in str(caught.value)


@pytest.mark.parametrize("suffix, sep", [(".csv", b","), (".tsv", b"\t")])
def test_non_utf8_csv_and_tsv_name_the_file_and_the_line(tmp_path, suffix, sep):
    rows = [b"text" + sep + b"label"] + [
        text.encode() + sep + label for text, label in zip(sentences(8), [b"a", b"b"] * 4, strict=True)
    ]
    rows[6] = b"na\xefve caf\xe9" + sep + b"a"  # line 7
    path = tmp_path / f"task{suffix}"
    path.write_bytes(b"\n".join(rows) + b"\n")
    with pytest.raises(TaskError, match=rf"^{path}: line 7, column 3 is not valid UTF-8 \(byte 0xef"):
        load_task(path)


def test_a_utf8_byte_order_mark_is_accepted(tmp_path):
    path = tmp_path / "bom.csv"
    path.write_bytes(
        b"\xef\xbb\xbftext,label\n" + b"".join(f"{t},{'ab'[i % 2]}\n".encode() for i, t in enumerate(sentences(12)))
    )
    assert load_task(path, columns=TaskColumns(text_col="text", label_col="label")).label_names == ["a", "b"]


def test_non_utf8_sweep_toml_names_the_file_and_the_line(tmp_path):
    path = tmp_path / "grid.toml"
    path.write_bytes(b'models = ["minilm-l6"]\ntasks = ["trec"]\n# r\xe9sum\xe9 of the grid\nencoders = ["fc"]\n')
    with pytest.raises(ValueError, match=rf"^{path}: line 3, column 4 is not valid UTF-8 \(byte 0xe9 at offset 43"):
        load_sweep(path)
    result = CliRunner().invoke(cli, ["sweep", str(path), "--dry-run"])
    assert "line 3, column 4 is not valid UTF-8" in one_line_error(result)


def test_streamed_lines_name_the_right_line_of_a_bad_byte_far_into_the_file(tmp_path):
    from ilge_search.files import iter_lines_utf8, read_text_utf8

    path = tmp_path / "big.txt"
    lines = [f"text number {i}\n".encode() for i in range(3000)]  # ~50 KB: past any read buffer
    lines[2500] = b"caf\xe9 au lait\n"
    path.write_bytes(b"\xef\xbb\xbf" + b"".join(lines))
    with pytest.raises(ValueError) as streamed:
        list(iter_lines_utf8(path))
    with pytest.raises(ValueError) as whole:
        read_text_utf8(path)
    assert str(streamed.value) == str(whole.value)  # one message, whichever reader met the byte
    assert "line 2501, column 4" in str(streamed.value) and "0xe9" in str(streamed.value)
    path.write_bytes(b"\xef\xbb\xbfa\r\nb\n")
    assert list(iter_lines_utf8(path)) == [(1, "a\r\n"), (2, "b\n")]


# ----------------------------------------------------------------------------- bad input through `ilge-search run`


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


GOOD_ROWS = [{"text": f"question number {i}", "label": "ab"[i % 2]} for i in range(20)]


class TestBadInputHasClearMessageAndNoSideEffects:
    """``ilge-search run`` with one bad input: exit 1, a message naming the problem, no model loaded, no cache
    entry written, no study created or changed."""

    @pytest.fixture(autouse=True)
    def _no_model_loads(self, no_model_loads):
        """Every case must fail before any model or tokenizer loads."""

    @pytest.fixture()
    def paths(self, tmp_path, data_dir):
        """A storage that already holds one trec study, an empty cache and a few broken task files."""
        db = tmp_path / "s.db"
        study = optuna.create_study(study_name="mine", storage=sqlite_url(db), direction="maximize")
        for key, value in {
            "model": MODEL,
            "task": "trec",
            "encoder": "cayley",
            "shots": None,
            "max_train": None,
            "max_eval": None,
            "max_epochs": None,
            "data_seed": 0,
            "ilge_search_ready": True,
        }.items():
            study.set_user_attr(key, value)
        study.add_trial(optuna.trial.create_trial(value=0.5, params={}, distributions={}))
        _write_jsonl(tmp_path / "columns.jsonl", [{"sentence": r["text"], "label": r["label"]} for r in GOOD_ROWS])
        _write_jsonl(
            tmp_path / "empty.jsonl", [dict(r, text="" if i == 3 else r["text"]) for i, r in enumerate(GOOD_ROWS)]
        )
        _write_jsonl(tmp_path / "unseen" / "train.jsonl", GOOD_ROWS)
        _write_jsonl(tmp_path / "unseen" / "test.jsonl", [{"text": "a new one", "label": "c"}])
        _write_jsonl(
            tmp_path / "nolabel.jsonl", [dict(r, label=None) if i == 5 else r for i, r in enumerate(GOOD_ROWS)]
        )
        return {"db": db, "cache": tmp_path / "cache", "dir": tmp_path, "data": data_dir}

    CASES: ClassVar[dict] = {
        "unknown model": (["--model", "no-such-model"], "is not a local folder, not an alias"),
        "unknown task": (["--task", "no_such_task"], "unknown task 'no_such_task'"),
        "missing column": (["--task", "{dir}/columns.jsonl"], "no column 'text' (columns present: sentence, label)"),
        "empty text": (["--task", "{dir}/empty.jsonl"], "empty text(s) at row(s) 4"),
        "label not in train": (["--task", "{dir}/unseen"], "label(s) that the train split does not have: 'c'"),
        "missing label": (["--task", "{dir}/nolabel.jsonl"], "column 'label' has 1 missing label(s) at row(s) 6"),
        "unreachable storage": (
            ["--storage", "postgresql://postgres@127.0.0.1:1/none"],
            # the storage is named as the user wrote it (storage.open_storage)
            (
                "cannot open the study storage postgresql://postgres@127.0.0.1:1/none: connection to server",
                "Check the URL, that the database server is running",
            ),
        ),
        "name reused for another task": (
            ["--task", "sst2", "--study-name", "mine"],
            "task: stored 'trec', requested 'sst2'",
        ),
        "name reused for another model": (
            ["--model", "smollm2-135m", "--study-name", "mine"],
            "model: stored 'minilm-l6', requested 'smollm2-135m'",
        ),
        "negative trials": (["--n-trials", "-1"], "Invalid value for '--n-trials'"),
        "zero workers": (["--workers", "0"], "Invalid value for '--workers'"),
        "unknown encoder": (["--encoder", "transformer"], "unknown encoder 'transformer'"),
        "shots on a similarity task": (["--task", "stsb", "--shots", "4"], "needs a classification task"),
    }

    @pytest.mark.parametrize("case", list(CASES))
    def test_run(self, case, paths):
        overrides, message = self.CASES[case]
        overrides = [item.format(dir=paths["dir"]) for item in overrides]
        base = {
            "--model": MODEL,
            "--task": "trec",
            "--storage": sqlite_url(paths["db"]),
            "--data-dir": str(paths["data"]),
            "--cache-dir": str(paths["cache"]),
            "--device": "cpu",
            "--n-trials": "1",
            "--final-seeds": "0",
        }
        flags = [item for item in overrides[::2]]
        args = ["run", "--quiet"]
        for key, value in base.items():
            if key not in flags:
                args += [key, value]
        args += overrides
        studies_before = self._studies(paths["db"])

        result = CliRunner().invoke(cli, args)

        messages = (message,) if isinstance(message, str) else message
        assert result.exit_code == (2 if messages[0].startswith("Invalid value") else 1), (
            result.output,
            result.exception,
        )
        assert all(part in " ".join(result.output.split()) for part in messages), result.output
        assert "Traceback" not in result.output
        assert not paths["cache"].exists() or not list(paths["cache"].rglob("*.safetensors"))
        assert self._studies(paths["db"]) == studies_before  # no study created, none changed

    @staticmethod
    def _studies(db: Path):
        storage = optuna.storages.RDBStorage(sqlite_url(db))
        return sorted(
            (s.study_name, s.n_trials, json.dumps(s.user_attrs, sort_keys=True))
            for s in optuna.get_all_study_summaries(storage)
        )
