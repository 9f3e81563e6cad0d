"""Reading a task's tables into splits: which columns hold what (:class:`TaskColumns` as given,
:class:`Columns` as read), each column checked row by row, labels mapped to sorted ids."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .data import TaskData, TaskSplit
from .files import MAX_ROWS_LISTED, Table, TaskError
from .registry import TaskSpec
from .tagging import TaggedRows, check_tagged_rows, check_tags_seen_in_train, refuse_other_kind_columns

__all__ = ["Columns", "TaskColumns", "build_task", "custom_columns", "sorted_label_names"]

_NOT_SCALAR = (list, tuple, dict, set, np.ndarray)


@dataclass(frozen=True)
class TaskColumns:
    """Which columns of a task's files hold the texts, labels, scores or words and tags (``None``: the
    registered or usual names)."""

    text_col: str | None = None
    label_col: str | None = None
    text_cols: Sequence[str] | None = None
    score_col: str | None = None
    tokens_col: str | None = None
    tags_col: str | None = None


def _refuse_non_scalar(table: Table, name: str, values: list, what: str) -> None:
    bad = [i for i, value in enumerate(values) if isinstance(value, _NOT_SCALAR)]
    if bad:
        kinds = sorted({type(values[i]).__name__ for i in bad})
        raise TaskError(
            f"{table.where}: column {name!r} holds {'/'.join(kinds)} values at row(s) {table.rows(bad)}; "
            f"each row needs one {what} (multi-label data is not supported). Use one value per row."
        )


def _check_texts(table: Table, name: str, option: str) -> list[str]:
    values = table.column(name, option)
    _refuse_non_scalar(table, name, values, "text")
    bad = [
        i
        for i, value in enumerate(values)
        if value is None or (isinstance(value, float) and math.isnan(value)) or not str(value).strip()
    ]
    if bad:
        raise TaskError(
            f"{table.where}: column {name!r} has {len(bad)} empty text(s) at row(s) "
            f"{table.rows(bad)}. Remove or fill those rows."
        )
    if values and all(isinstance(v, (int, float, np.number)) and not isinstance(v, bool) for v in values):
        raise TaskError(
            f"{table.where}: column {name!r} holds numbers only (e.g. {values[0]!r}), not texts; name the "
            f"text column with {option}"
        )
    return [str(value) for value in values]


def _check_labels(table: Table, name: str) -> list[str]:
    values = table.column(name, "--label-col")
    _refuse_non_scalar(table, name, values, "label")
    bad = [
        i
        for i, value in enumerate(values)
        if value is None or (isinstance(value, float) and math.isnan(value)) or str(value).strip() == ""
    ]
    if bad:
        raise TaskError(f"{table.where}: column {name!r} has {len(bad)} missing label(s) at row(s) {table.rows(bad)}.")
    # 3 and 3.0 are the same label; keep names readable.
    return [str(int(v)) if isinstance(v, float) and float(v).is_integer() else str(v) for v in values]


def _check_scores(table: Table, name: str) -> np.ndarray:
    values = table.column(name, "--score-col")
    scores = np.empty(len(values), dtype=np.float32)
    bad = []
    for i, value in enumerate(values):
        try:
            scores[i] = float(value)
        except (TypeError, ValueError):
            bad.append(i)
            continue
        if not math.isfinite(scores[i]):
            bad.append(i)
    if bad:
        raise TaskError(
            f"{table.where}: column {name!r} has {len(bad)} missing or non-numeric score(s) at "
            f"row(s) {table.rows(bad)}."
        )
    return scores


@dataclass
class Columns:
    kind: str
    text_col: str = "text"
    label_col: str = "label"
    text_cols: tuple[str, str] = ("sentence1", "sentence2")
    score_col: str = "score"
    tokens_col: str = "tokens"
    tags_col: str = "tags"


def sorted_label_names(names: Sequence[str]) -> list[str]:
    unique = set(names)
    if all(re.fullmatch(r"-?\d+", name) for name in unique):
        return sorted(unique, key=int)
    return sorted(unique)


def build_task(spec: TaskSpec, tables: dict[str, Table], cols: Columns, source: str) -> TaskData:
    """Every split's columns checked, labels mapped to ids (tag names sorted as label names are)."""
    if cols.kind == "tagging":
        return _tagging_task(spec, tables, cols, source)
    if cols.kind == "similarity":
        splits = {}
        for name, table in tables.items():
            a = _check_texts(table, cols.text_cols[0], "--text-cols")
            b = _check_texts(table, cols.text_cols[1], "--text-cols")
            splits[name] = TaskSplit(
                name, labels=_check_scores(table, cols.score_col), pairs=list(zip(a, b, strict=True))
            )
        return TaskData(spec=spec, splits=splits, label_names=[], source=source)
    texts = {name: _check_texts(table, cols.text_col, "--text-col") for name, table in tables.items()}
    names = {name: _check_labels(table, cols.label_col) for name, table in tables.items()}
    reference = "train" if "train" in names else next(iter(names))
    label_names = sorted_label_names(names[reference])
    if len(label_names) < 2:
        raise TaskError(
            f"{tables[reference].where}: every row has the label {label_names[0]!r}; a "
            f"classifier needs at least two labels. Check --label-col or add rows of other labels."
        )
    ids = {label: i for i, label in enumerate(label_names)}
    for name, split_names in names.items():
        unseen = sorted(set(split_names) - ids.keys())
        if unseen:
            count = sum(1 for label in split_names if label not in ids)
            raise TaskError(
                f"{tables[name].where}: {count} row(s) of split {name!r} have label(s) that the {reference} "
                f"split does not have: {', '.join(map(repr, unseen[:MAX_ROWS_LISTED]))}"
                f"{' ...' if len(unseen) > MAX_ROWS_LISTED else ''}. A classifier cannot predict labels "
                f"it never saw; fix the files or drop those rows."
            )
    splits = {
        name: TaskSplit(name, labels=np.array([ids[label] for label in names[name]], dtype=np.int64), texts=texts[name])
        for name in tables
    }
    return TaskData(spec=spec, splits=splits, label_names=label_names, source=source)


def _tagging_task(spec: TaskSpec, tables: dict[str, Table], cols: Columns, source: str) -> TaskData:
    """Sentences of words with one tag id per word; tag names sorted as label names are."""
    rows: dict[str, TaggedRows] = {
        name: check_tagged_rows(table, cols.tokens_col, cols.tags_col) for name, table in tables.items()
    }
    reference = "train" if "train" in rows else next(iter(rows))
    tag_names = sorted_label_names([tag for tags in rows[reference].tags for tag in tags])
    if len(tag_names) < 2:
        raise TaskError(
            f"{rows[reference].where}: every word has the tag {tag_names[0]!r}; a tagger needs at least two "
            f"tags. Check --tags-col or add sentences with other tags."
        )
    check_tags_seen_in_train({name: part for name, part in rows.items() if name != reference}, tag_names)
    ids = {tag: i for i, tag in enumerate(tag_names)}
    splits = {
        name: TaskSplit(
            name,
            labels=np.array([ids[tag] for tags in part.tags for tag in tags], dtype=np.int64),
            sentences=part.sentences,
        )
        for name, part in rows.items()
    }
    return TaskData(spec=spec, splits=splits, label_names=tag_names, source=source)


def custom_columns(sample: Table, given: TaskColumns) -> Columns:
    text_col, label_col, text_cols, score_col = given.text_col, given.label_col, given.text_cols, given.score_col
    tokens_col, tags_col = given.tokens_col, given.tags_col
    sequence = dict(text_col=text_col, label_col=label_col, text_cols=text_cols, score_col=score_col)
    present = sample.columns.keys()
    if tokens_col is not None or tags_col is not None:
        if any(option is not None for option in sequence.values()):
            raise TaskError(
                f"{sample.where}: --tokens-col/--tags-col are for a token task (a list of words and a list of tags "
                "per row), --text-col/--label-col/--text-cols/--score-col for a text task; drop one kind"
            )
        cols = Columns("tagging", tokens_col=tokens_col or "tokens", tags_col=tags_col or "tags")
        text_layout = "text" in present or {"sentence1", "sentence2"} <= present
        if text_layout and not {cols.tokens_col, cols.tags_col} <= present:  # a text file given token options
            kind = "classification" if "text" in present else "similarity"
            refuse_other_kind_columns(sample.where, kind, dict(tokens_col=tokens_col, tags_col=tags_col))
        return cols
    if all(option is None for option in sequence.values()):
        if {"tokens", "tags"} <= present:
            return Columns("tagging")
        lists = [name for name, values in sample.columns.items() if isinstance(values[0], (list, tuple))]
        if lists and "text" not in present and not {"sentence1", "sentence2"} <= present:
            raise TaskError(
                f"{sample.where} has neither the columns tokens/tags nor text (columns present: "
                f"{', '.join(map(str, present))}); its columns {', '.join(lists)} hold lists: for a token task "
                "pass --tokens-col and --tags-col, for a text task --text-col and --label-col"
            )
    # a token file given a text task's options: the tokens/tags columns beside no such text column, or the
    # text column and the label column (absent: no text task either) holding lists
    named = list(text_cols) if text_cols is not None else [text_col or "text"]
    target = (label_col or "label") if text_cols is None else (score_col or "score")
    listed = {name for name in present if isinstance(sample.columns[name][0], (list, tuple))}
    words_as_text = bool(listed & set(named)) and (target in listed or target not in present)
    if words_as_text or ({"tokens", "tags"} <= present and not set(named) <= present):
        refuse_other_kind_columns(sample.where, "tagging", sequence)
    if text_cols is not None:
        if len(text_cols) != 2:
            raise TaskError(f"text_cols needs exactly two column names, got {list(text_cols)}")
        return Columns("similarity", text_cols=(text_cols[0], text_cols[1]), score_col=score_col or "score")
    if text_col is None and label_col is None and {"sentence1", "sentence2"} <= sample.columns.keys():
        return Columns("similarity", score_col=score_col or "score")
    if score_col is not None:
        raise TaskError(
            "score_col is for sentence pairs; also pass text_cols (two columns), e.g. --text-cols sentence1,sentence2"
        )
    return Columns("classification", text_col=text_col or "text", label_col=label_col or "label")
