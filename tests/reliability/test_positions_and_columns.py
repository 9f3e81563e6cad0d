"""Positions in messages count from 1 (rows, sentences, words, tags alike), a JSONL/JSON/Parquet word or tag
column must hold lists (a space-separated string is only read from CSV/TSV), and the word path never triggers
transformers' "Token indices sequence length is longer than the specified maximum" warning, which ``-q`` cannot
hide: sentences longer than the model takes are cut into windows on purpose."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from click.testing import CliRunner
from reliability_helpers import one_line_error

from ilge_search import ILGETagger, LastLayerConfig
from ilge_search.cli import cli
from ilge_search.embeddings.words import WordTokenizer
from ilge_search.tasks.columns import TaskColumns
from ilge_search.tasks.core import TaskError, load_task
from ilge_search.testing.tiny_models import CORPUS, tiny_encoder

ROWS = [
    {"tokens": ["The", "cat", "sat"], "tags": ["DET", "NOUN", "VERB"]},
    {"tokens": ["A", "dog", "ran"], "tags": ["DET", "NOUN", "VERB"]},
    {"tokens": ["Birds", "fly"], "tags": ["NOUN", "VERB"]},
]


def _task(folder: Path, train: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split, rows in (("train", train), ("validation", ROWS[:2]), ("test", ROWS[1:])):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


def test_a_jsonl_tag_column_given_as_a_string_is_refused_naming_file_row_and_column(tmp_path):
    flattened = {"tokens": ["The", "cat", "sat"], "tags": "DET NOUN VERB"}  # before: split and accepted
    folder = _task(tmp_path / "task", [ROWS[0], ROWS[1], flattened])
    with pytest.raises(TaskError) as caught:
        load_task(folder)
    message = str(caught.value)
    assert message.startswith(f"{folder / 'train.jsonl'}: row 3: column 'tags' holds the string 'DET NOUN VERB'")
    assert "not a list of tags" in message and "\n" not in message


def test_the_same_string_in_a_csv_cell_is_read_as_words(tmp_path):
    folder = tmp_path / "csv"
    folder.mkdir()
    for split in ("train", "validation", "test"):
        lines = ["tokens,tags", "The cat sat,DET NOUN VERB", "A dog ran,DET NOUN VERB", "Birds fly,NOUN VERB"]
        (folder / f"{split}.csv").write_text("\n".join(lines) + "\n")
    task = load_task(folder, columns=TaskColumns(tokens_col="tokens", tags_col="tags"))
    assert task["train"].sentences[0] == ["The", "cat", "sat"] and len(task["train"].labels) == 8


def test_a_run_on_a_task_with_a_string_tag_column_is_one_error_line(tmp_path, no_model_loads):
    folder = _task(tmp_path / "task", [ROWS[0], {"tokens": ["Birds", "fly"], "tags": "NOUN VERB"}])
    db = tmp_path / "s.db"
    args = ["run", "--model", "minilm-l6", "--task", str(folder), "--storage", f"sqlite:///{db}", "--quiet"]
    message = one_line_error(CliRunner().invoke(cli, [*args, "--cache-dir", str(tmp_path / "c"), "--device", "cpu"]))
    assert "train.jsonl: row 2: column 'tags' holds the string 'NOUN VERB'" in message
    assert not db.exists()


@pytest.mark.parametrize(
    "row, expected",
    [
        ({"tokens": ["The", 7, "sat"], "tags": ["DET", "NUM", "VERB"]}, "row 3: word 2 of column 'tokens' is 7"),
        ({"tokens": ["The", "cat", "sat"], "tags": ["DET", "NOUN", None]}, "row 3: tag 3 of column 'tags' is None"),
    ],
)
def test_words_and_tags_are_counted_from_one_like_rows(tmp_path, row, expected):
    folder = _task(tmp_path / "task", [ROWS[0], ROWS[1], row])
    with pytest.raises(TaskError, match=expected):
        load_task(folder)


@pytest.fixture(scope="module")
def encoder(tmp_path_factory) -> Path:
    return tiny_encoder(tmp_path_factory.mktemp("tiny") / "encoder")


@pytest.fixture()
def short_tokenizer(encoder):
    """The tiny encoder's tokenizer, told that its model takes 12 pieces."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(encoder))
    tokenizer.model_max_length = 12
    return tokenizer


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.mark.parametrize("use_offsets", [True, False])
def test_windowing_a_long_sentence_logs_no_token_length_warning(short_tokenizer, use_offsets):
    words = " ".join(CORPUS[:4]).split()  # far more than 12 pieces
    records = _Records()
    logger = logging.getLogger("transformers")
    logger.addHandler(records)
    try:
        windows = WordTokenizer(short_tokenizer, use_offsets=use_offsets).windows(0, words, max_length=12)
    finally:
        logger.removeHandler(records)
    assert len(windows) > 1 and all(len(window.input_ids) <= 12 for window in windows)
    assert not [m for m in records.messages if "Token indices sequence length" in m], records.messages


def test_sentences_and_words_of_a_window_error_count_from_one(short_tokenizer):
    with pytest.raises(ValueError, match=r"^sentence 4, word 2 \('\\u200b'\) gives no token"):
        WordTokenizer(short_tokenizer).windows(3, ["fine", "\u200b"], max_length=12)


def test_predict_on_a_tagger_counts_words_from_one(tmp_path, encoder):
    sentences = [line.split() for line in CORPUS]
    tags = [["L" if len(word) > 3 else "S" for word in words] for words in sentences]
    options = dict(config=LastLayerConfig(epochs=1), cache_dir=tmp_path / "cache", device="cpu")
    folder = ILGETagger(base_model=str(encoder), **options).fit(sentences, tags).save(tmp_path / "tagger")
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"tokens": ["fine", "words"]}) + "\n" + json.dumps({"tokens": ["one", ""]}) + "\n")
    args = ["predict", str(folder), "--input", str(rows), "--cache-dir", str(tmp_path / "cache"), "--device", "cpu"]
    args += ["--base-model", str(encoder)]
    message = one_line_error(CliRunner().invoke(cli, args))
    assert f"{rows}: line 2, column 'tokens',: word 2 is ''" in message
