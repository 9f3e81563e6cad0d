"""The rows of a token task (kind ``tagging``): sentences of words, one tag per word.

A row holds a list of words and a list of tags of the same length, in JSONL, JSON or Parquet
as lists (a string there is refused: it is a list that was flattened by mistake), in CSV/TSV,
whose cells are text, as one whitespace-separated string each. Rows, words and tags are
counted from 1 in messages. :func:`check_tagged_rows`
reads one split file's two columns and refuses, with one line naming the file and the row,
what a tagger cannot use: a missing or empty sentence, a word that is not a non-empty
string, a missing tag, or a number of tags that differs from the number of words.
:func:`check_tags_seen_in_train` refuses tags of validation or test that train lacks.
Both raise :class:`~ilge_search.tasks.files.TaskError`; the task loader
(:mod:`ilge_search.tasks.core`) builds its splits from what they return.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .files import Table, TaskError

__all__ = [
    "TaggedRows",
    "check_tagged_rows",
    "check_tags_seen_in_train",
    "sentence_offsets",
    "TOKEN_COLUMN_OPTIONS",
    "refuse_other_kind_columns",
]

# the column options of a token task, as load_task names them; the others (text_col ...) are a text task's
TOKEN_COLUMN_OPTIONS = ("tokens_col", "tags_col")
_FLAGS = {
    "text_col": "--text-col",
    "label_col": "--label-col",
    "text_cols": "--text-cols",
    "score_col": "--score-col",
    "tokens_col": "--tokens-col",
    "tags_col": "--tags-col",
}
_INSTEAD = {
    "tagging": "--tokens-col/--tags-col (default tokens/tags)",
    "similarity": "--text-cols/--score-col",
    "classification": "--text-col/--label-col",
}

_LIST_TYPES = (list, tuple, np.ndarray)
_SHOWN = 5  # bad values quoted in a message


@dataclass(frozen=True)
class TaggedRows:
    """One split's sentences and their tags (as strings), checked.

    Attributes:
        sentences: the words of each sentence.
        tags: the tag of each word, sentence by sentence.
        where: the file (or source) the rows came from, for messages.
        first_row: the number of the first row in that file.
    """

    sentences: list[list[str]]
    tags: list[list[str]]
    where: str
    first_row: int = 1

    @property
    def num_words(self) -> int:
        return sum(len(words) for words in self.sentences)


def sentence_offsets(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    """``(num_sentences + 1,)`` int64: where each sentence's words start in a flat word array, then the end."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(np.asarray(lengths, dtype=np.int64), out=offsets[1:])
    return offsets


def refuse_other_kind_columns(task: str, kind: str, columns: Mapping[str, object]) -> None:
    """Refuse, in one line, column options given for the other kind of task: ``--tokens-col``/``--tags-col``
    for a text task of ``kind`` ``classification`` or ``similarity``, or a text task's options for a token
    task (``tagging``). ``columns`` maps load_task's option names to what was given (``None``: not given)."""
    tokens = kind == "tagging"
    wrong = [
        _FLAGS[name]
        for name, value in columns.items()
        if value is not None and (name in TOKEN_COLUMN_OPTIONS) != tokens
    ]
    if not wrong:
        return
    what = "a token task (a list of words and a list of tags per row)" if tokens else f"a {kind} task"
    whose = "a text task's" if tokens else "a token task's"
    instead = _INSTEAD.get(kind, _INSTEAD["classification"])
    verb = "name" if len(wrong) > 1 else "names"
    raise TaskError(f"{task} is {what}: {', '.join(wrong)} {verb} {whose} columns; pass {instead} instead")


def _is_missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


@dataclass(frozen=True)
class _Cell:
    """Where a cell sits, for messages, and whether its file writes lists as text (CSV/TSV)."""

    where: str
    row: int
    column: str
    text_cells: bool


def _as_list(value: object, cell: _Cell, what: str) -> list | None:
    """A cell as a list of items: lists (and Parquet arrays) as they are; a string split on whitespace in a
    CSV/TSV file, refused elsewhere."""
    if isinstance(value, str):
        if cell.text_cells:
            return value.split()
        raise TaskError(
            f"{cell.where}: row {cell.row}: column {cell.column!r} holds the string {value[:40]!r}, not a list of "
            f"{what}; write a JSON list, one item per word (only CSV/TSV cells are split on spaces)"
        )
    if isinstance(value, _LIST_TYPES):
        return list(value)
    return None


def _row_words(value: object, cell: _Cell) -> list[str]:
    where, row, column = cell.where, cell.row, cell.column
    words = None if _is_missing(value) else _as_list(value, cell, "words")
    if words is None:
        got = "nothing" if _is_missing(value) else f"a {type(value).__name__}"
        raise TaskError(
            f"{where}: row {row}: column {column!r} holds {got}, not a list of words; give every row "
            f'a list such as ["The", "cat", "sat"] (or, in CSV/TSV, the words separated by spaces)'
        )
    if not words:
        raise TaskError(f"{where}: row {row}: column {column!r} is an empty sentence; remove the row")
    for position, word in enumerate(words, start=1):
        if not isinstance(word, str) or not word.strip():
            shown = repr(word) if isinstance(word, str) else f"{word!r} ({type(word).__name__})"
            raise TaskError(
                f"{where}: row {row}: word {position} of column {column!r} is {shown}; every word must be "
                f"a non-empty string (quote numbers, drop empty words)"
            )
    return words


def _tag_name(value: object) -> str | None:
    if _is_missing(value) or isinstance(value, (bool, *_LIST_TYPES, dict)):
        return None
    if isinstance(value, float) and value.is_integer():
        return str(int(value))  # 3 and 3.0 are the same tag
    name = str(value)
    return name if name.strip() else None


def _row_tags(value: object, num_words: int, cell: _Cell) -> list[str]:
    where, row, column = cell.where, cell.row, cell.column
    items = None if _is_missing(value) else _as_list(value, cell, "tags")
    if items is None:
        raise TaskError(f"{where}: row {row}: column {column!r} holds no list of tags; give one tag per word")
    if len(items) != num_words:
        raise TaskError(
            f"{where}: row {row}: {num_words} word(s) but {len(items)} tag(s) in column {column!r}; "
            f"every word needs exactly one tag"
        )
    names = [_tag_name(item) for item in items]
    if None in names:
        position = names.index(None)
        raise TaskError(
            f"{where}: row {row}: tag {position + 1} of column {column!r} is {items[position]!r}; every tag must be "
            f"a non-empty string or an integer"
        )
    return [name for name in names if name is not None]


def check_tagged_rows(table: Table, tokens_col: str, tags_col: str) -> TaggedRows:
    """One split file's words and tags (columns ``tokens_col`` and ``tags_col``), checked row by row;
    the first bad row raises :class:`TaskError`."""
    words_column, tags_column = table.column(tokens_col, "--tokens-col"), table.column(tags_col, "--tags-col")
    sentences, tags = [], []
    for position, (words_value, tags_value) in enumerate(zip(words_column, tags_column, strict=True)):
        row = position + table.first_row
        words = _row_words(words_value, _Cell(table.where, row, tokens_col, table.text_cells))
        sentences.append(words)
        tags.append(_row_tags(tags_value, len(words), _Cell(table.where, row, tags_col, table.text_cells)))
    if not sentences:
        raise TaskError(f"{table.where} has no rows")
    return TaggedRows(sentences, tags, table.where, table.first_row)


def check_tags_seen_in_train(splits: Mapping[str, TaggedRows], tag_names: Sequence[str]) -> None:
    """Refuse a split whose words carry a tag that the train split never has: a tagger cannot predict it."""
    known = set(tag_names)
    for split, rows in splits.items():
        for position, row_tags in enumerate(rows.tags):
            unseen = sorted(set(row_tags) - known)
            if unseen:
                count = sum(1 for tags in rows.tags for tag in tags if tag not in known)
                shown = ", ".join(map(repr, unseen[:_SHOWN])) + (" ..." if len(unseen) > _SHOWN else "")
                raise TaskError(
                    f"{rows.where}: row {position + rows.first_row} of split {split!r} has tag(s) {shown} that the "
                    f"train split does not have ({count} word(s) of {split} in all); a tagger cannot predict "
                    f"tags it never saw: fix the files or drop those rows"
                )
