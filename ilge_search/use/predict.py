"""Labelling files with an exported model (``ilge-search predict``).

A study's model is exported with ``ILGEClassifier.from_study`` and ``ILGEClassifier.save`` (``ilge-search export``).
:func:`predict_file` reads JSONL, CSV/TSV, Parquet or plain text (one text per line) chunk by chunk, embeds each chunk
through the one embedding cache (:meth:`~ilge_search.embeddings.cache.EmbeddingCache.get_or_extract_texts`, the base
model loaded once), and writes one JSONL or CSV/TSV row per input row, in order. Memory stays flat in the number of
rows: only one chunk is held.

The input is read twice: a first pass checks the columns and every text (and counts the rows for the progress bar)
before any model loads, so a bad row 90,000 fails at once, not after an hour of inference. The output is written under a
temporary name and renamed when complete; an existing file is never replaced unless ``overwrite`` is given
(:func:`~ilge_search.files.check_output_path`).
"""

from __future__ import annotations

import csv
import json
import math
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO, TypeVar

import pandas as pd

from ..embeddings.cache import EmbeddingCache
from ..embeddings.extraction import ExtractionSettings
from ..embeddings.model_utils import hidden_size_for, num_layers_for
from ..files import iter_json_objects, iter_lines_utf8
from ..progress import BarSpec, new_bar
from ..record.fields import Attrs
from ..validation import check_int
from .classifier import ILGEClassifier
from .output import checked_input, checked_output, file_suffix, write_output

__all__ = [
    "batched",
    "predict_file",
    "PredictInput",
    "PredictOutput",
    "PredictOptions",
    "PredictSummary",
    "INPUT_SUFFIXES",
    "OUTPUT_SUFFIXES",
]

PathLike = str | os.PathLike
Row = TypeVar("Row")
INPUT_SUFFIXES = (".jsonl", ".csv", ".tsv", ".parquet", ".txt")
OUTPUT_SUFFIXES = (".jsonl", ".csv", ".tsv")
DEFAULT_TEXT_COL = "text"
DEFAULT_PAIR_COLS = ("sentence1", "sentence2")
PLAIN_TEXT_COL = "text"  # the one column of a plain-text input


# ----------------------------------------------------------------------------- reading inputs


def _text(value: object) -> str | None:
    """A cell as text; ``None`` when it is missing, blank or not a scalar (a JSON list or object)."""
    if value is None or isinstance(value, (dict, list)) or (isinstance(value, float) and math.isnan(value)):
        return None
    text = value if isinstance(value, str) else str(value)
    return text if text.strip() else None


def batched(rows: Iterable[Row], size: int) -> Iterator[list[Row]]:
    """``rows`` in lists of ``size`` (the last one shorter), read as they are needed."""
    chunk: list[Row] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _check_columns(path: Path, columns: Sequence[str], names: Sequence[str]) -> None:
    missing = [c for c in columns if c not in names]
    if missing:
        raise ValueError(
            f"{path} has no column {missing[0]!r} (columns: {', '.join(names) or 'none'}); "
            "pass --text-col/--text-cols with one of them"
        )


def _jsonl_rows(path: Path, columns: Sequence[str]) -> Iterator[list[object]]:
    for line_number, row in iter_json_objects(path):
        missing = [c for c in columns if c not in row]
        if missing:
            raise ValueError(
                f"{path}: line {line_number} has no column {missing[0]!r} (it has "
                f"{', '.join(map(str, row)) or 'none'}); pass --text-col/--text-cols"
            )
        yield [row[c] for c in columns]


def _csv_chunks(path: Path, columns: Sequence[str], size: int, sep: str) -> Iterator[list[list[object]]]:

    options = dict(
        sep=sep,
        dtype=str,
        keep_default_na=False,
        na_filter=False,
        quoting=csv.QUOTE_NONE if sep == "\t" else csv.QUOTE_MINIMAL,
    )
    try:
        header = list(pd.read_csv(path, nrows=0, **options).columns)
    except pd.errors.EmptyDataError:
        raise ValueError(f"{path} is empty; it needs a header row and at least one row") from None
    _check_columns(path, columns, header)
    try:
        for frame in pd.read_csv(path, usecols=list(columns), chunksize=size, **options):
            yield frame[list(columns)].values.tolist()
    except pd.errors.ParserError as exc:
        raise ValueError(f"could not read {path}: {exc}") from None


def _parquet_chunks(path: Path, columns: Sequence[str], size: int) -> Iterator[list[list[object]]]:
    try:
        import pyarrow.parquet as pq  # heavy: an optional dependency
    except ImportError:
        raise ValueError(
            "reading Parquet needs pyarrow: pip install pyarrow (or convert the file to JSONL/CSV)"
        ) from None
    try:
        parquet = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow's errors for a file that is not Parquet
        raise ValueError(f"could not read {path} as Parquet: {exc}") from None
    _check_columns(path, columns, parquet.schema_arrow.names)
    for batch in parquet.iter_batches(batch_size=size, columns=list(columns)):
        values = [batch.column(c).to_pylist() for c in columns]
        yield [list(row) for row in zip(*values, strict=True)]


def _chunks(path: Path, suffix: str, columns: Sequence[str], size: int) -> Iterator[list[list[object]]]:
    """Rows of ``columns`` (raw cell values), ``size`` at a time, in file order."""
    if suffix == ".jsonl":
        return batched(_jsonl_rows(path, columns), size)
    if suffix in (".csv", ".tsv"):
        return _csv_chunks(path, columns, size, "\t" if suffix == ".tsv" else ",")
    if suffix == ".parquet":
        return _parquet_chunks(path, columns, size)
    return batched(([line.rstrip("\r\n")] for _, line in iter_lines_utf8(path)), size)


def _checked_texts(
    chunk: list[list[object]], columns: Sequence[str], first_row: int, path: Path, row_word: str
) -> list[list[str]]:
    rows = []
    for offset, cells in enumerate(chunk):
        texts = []
        for column, value in zip(columns, cells, strict=True):
            text = _text(value)
            if text is None:
                where = f"{row_word} {first_row + offset}" + ("" if row_word == "line" else f", column {column!r},")
                raise ValueError(f"{path}: {where} is empty or not a text; every row needs one (fill or remove it)")
            texts.append(text)
        rows.append(texts)
    return rows


# ----------------------------------------------------------------------------- writing outputs


class _Writer:
    """JSONL (one object per row) or CSV/TSV (a header, then one line per row)."""

    def __init__(self, handle: TextIO, kind: str, columns: Sequence[str], value_columns: Sequence[str]) -> None:
        self.handle, self.kind = handle, kind
        self.header = ["row", *columns, *value_columns]
        if kind in (".csv", ".tsv"):
            self.csv = csv.writer(handle, delimiter="\t" if kind == ".tsv" else ",", lineterminator="\n")
            self.csv.writerow(self.header)

    def write(self, record: Attrs) -> None:
        if self.kind == ".jsonl":
            self.handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        else:
            flat = dict(record)
            flat.update({f"proba_{name}": p for name, p in flat.pop("proba", {}).items()})
            self.csv.writerow([flat[name] for name in self.header])


def _json_value(value: object) -> object:
    return value.item() if hasattr(value, "item") else value


# ----------------------------------------------------------------------------- predict


@dataclass(frozen=True)
class PredictInput:
    """What to label: a ``.jsonl``, ``.csv``, ``.tsv``, ``.parquet`` or ``.txt`` file (one text per line).

    Attributes:
        path: the input file.
        text_col: the text column (default ``text``); a plain-text file has none.
        text_cols: the two columns of a similarity model's pairs (default ``sentence1``, ``sentence2``).
        tokens_col: a tagger's column of words in a JSONL file (default ``tokens``;
            :func:`~ilge_search.use.predict_tags.predict_tags_file`).
    """

    path: PathLike
    text_col: str | None = None
    text_cols: Sequence[str] | None = None
    tokens_col: str | None = None


@dataclass(frozen=True)
class PredictOutput:
    """Where the predictions go and what they hold.

    Attributes:
        path: a ``.jsonl``, ``.csv`` or ``.tsv`` file; ``None`` writes JSONL to ``stream`` (default stdout).
        proba: add the class probabilities (classifiers only).
        overwrite: replace ``path`` if it exists.
        stream: where JSONL goes without a ``path``.
    """

    path: PathLike | None = None
    proba: bool = False
    overwrite: bool = False
    stream: TextIO | None = None


@dataclass(frozen=True)
class PredictOptions:
    """How to embed and run.

    Attributes:
        chunk_rows: rows read, embedded and written at a time (the memory bound).
        batch_size: texts per LLM forward pass.
        cache_dir: the embedding cache (default: the usual one).
        device: ``"auto"``, ``"cpu"``, ``"cuda"`` ...
        base_model: the frozen model to embed with instead of the recorded one (needed when that is a local
            folder outside the model folder, which ``ILGEClassifier.load`` does not follow).
        progress: a progress bar over rows on stderr.
        force: use a model folder whose files disagree with the digest its save recorded.
    """

    chunk_rows: int = 512
    batch_size: int = 32
    cache_dir: PathLike | None = None
    device: str = "auto"
    base_model: PathLike | None = None
    progress: bool = True
    force: bool = False

    def __post_init__(self) -> None:
        check_int("chunk_rows", self.chunk_rows)

    def load_arguments(self) -> Attrs:
        """The keyword arguments of ``ILGEClassifier.load`` and ``ILGETagger.load`` these options give."""
        return {
            "device": self.device,
            "cache_dir": self.cache_dir,
            "batch_size": self.batch_size,
            "base_model": self.base_model,
            "force": self.force,
        }


@dataclass
class PredictSummary:
    """What :func:`predict_file` did."""

    rows: int
    out: Path | None
    task_kind: str
    seconds: float
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Job:
    """A checked prediction: the loaded model, the input's type and columns, its row count and the output."""

    clf: ILGEClassifier
    base_model: PathLike  # the frozen model the texts are embedded with
    input_path: Path
    suffix: str
    columns: tuple[str, ...]
    rows: int
    out_path: Path | None
    out_kind: str
    proba: bool

    @property
    def similarity(self) -> bool:
        return self.clf.task_kind_ == "similarity"

    @property
    def row_word(self) -> str:
        """How error messages count rows: lines of a plain-text file, rows of any other."""
        return "line" if self.suffix == ".txt" else "row"

    def value_columns(self) -> list[str]:
        """The output columns after the text(s): the score, or the label (and in CSV each class's probability)."""
        if self.similarity:
            return ["score"]
        names = [f"proba_{c}" for c in self.clf.classes_.tolist()]
        return ["label"] + (names if self.proba and self.out_kind != ".jsonl" else [])


def _resolve_columns(
    clf: ILGEClassifier, suffix: str, text_col: str | None, text_cols: Sequence[str] | None
) -> tuple[str, ...]:
    similarity = clf.task_kind_ == "similarity"
    if similarity:
        if text_col is not None:
            raise ValueError("this similarity model scores sentence pairs: pass --text-cols a,b, not --text-col")
        if suffix == ".txt":
            raise ValueError(
                "a plain-text file holds one text per line, but this similarity model scores pairs: "
                "use JSONL, CSV/TSV or Parquet with two text columns (--text-cols a,b)"
            )
        columns = tuple(text_cols) if text_cols else DEFAULT_PAIR_COLS
        if len(columns) != 2 or not all(c.strip() for c in columns):
            raise ValueError(f"--text-cols needs exactly two column names, got {','.join(columns)!r}")
        return columns
    if text_cols:
        raise ValueError(
            "this model classifies single texts: pass --text-col, not --text-cols (that is for similarity models)"
        )
    if suffix == ".txt":
        if text_col is not None:
            raise ValueError("a plain-text file has one text per line and no columns; drop --text-col")
        return (PLAIN_TEXT_COL,)
    return (text_col or DEFAULT_TEXT_COL,)


def _scan(path: Path, suffix: str, columns: Sequence[str], chunk_rows: int) -> int:
    """Check every row's texts (no model loads); return the number of rows."""
    rows = 0
    for chunk in _chunks(path, suffix, columns, chunk_rows):
        _checked_texts(chunk, columns, 1 + rows, path, "line" if suffix == ".txt" else "row")
        rows += len(chunk)
    if rows == 0:
        raise ValueError(f"{path} has no rows; nothing to predict")
    return rows


def _checked_job(model_dir: PathLike, source: PredictInput, out: PredictOutput, options: PredictOptions) -> _Job:
    """Every check that needs no model: paths, file types, the saved model, the columns, every row's texts."""
    input_path = checked_input(source.path)
    suffix = file_suffix(input_path, INPUT_SUFFIXES, "input")
    out_path, out_kind = checked_output(out.path, out.overwrite, input_path, OUTPUT_SUFFIXES, "the predictions")
    if (Path(model_dir) / "ilge_tagger.json").is_file():
        raise ValueError(
            f"{model_dir} holds an ILGETagger; tag files with ilge_search.use.predict_tags.predict_tags_file "
            "(`ilge-search predict` does this by itself)"
        )
    if source.tokens_col is not None:
        raise ValueError("--tokens-col is for taggers; this model reads texts: pass --text-col")
    clf = ILGEClassifier.load(model_dir, **options.load_arguments())
    if out.proba and clf.task_kind_ == "similarity":
        raise ValueError("--proba is for classifiers; this similarity model gives one score per pair")
    base_model = clf.base_model
    if base_model is None:
        raise ValueError(f"{model_dir} was saved without a base model, so it cannot embed texts")
    _check_base_model_shape(clf, base_model, model_dir)
    columns = _resolve_columns(clf, suffix, source.text_col, source.text_cols)
    rows = _scan(input_path, suffix, columns, options.chunk_rows)  # every text checked, no model loaded
    return _Job(clf, base_model, input_path, suffix, columns, rows, out_path, out_kind, out.proba)


def _check_base_model_shape(clf: Any, base_model: Any, model_dir: Any) -> None:
    """Refuse a base model whose hidden states (count and width, from the model table or its config) are not
    those the classifier was trained on, before any text is embedded."""

    try:
        shape = (num_layers_for(base_model), hidden_size_for(base_model))
    except Exception:  # a model whose config cannot be read fails, with its own message, when it is loaded
        return
    trained = (int(clf.num_layers_), int(clf.hidden_size_))
    if shape != trained:
        raise ValueError(
            f"the base model {base_model} gives {shape[0]} hidden states of {shape[1]} features, but the model in "
            f"{model_dir} was trained on {trained[0]} x {trained[1]}; pass the --base-model it was trained with"
        )


def _chunk_values(job: _Job, features: Any, rows: int) -> list[Attrs]:
    """Each row's prediction: ``score``, or ``label`` (and ``proba`` per class name)."""
    clf = job.clf
    if job.similarity:
        pairs = features.view(rows, 2, *features.shape[1:])
        return [{"score": float(s)} for s in clf.predict_embeddings(pairs)]
    probabilities = clf.predict_proba_embeddings(features)
    labels = clf.classes_[probabilities.argmax(axis=1)]
    values: list[Attrs] = [{"label": _json_value(label)} for label in labels]
    if job.proba:
        names = [str(_json_value(c)) for c in clf.classes_]
        for value, p in zip(values, probabilities, strict=True):
            value["proba"] = {name: float(x) for name, x in zip(names, p, strict=True)}
    return values


def _write_predictions(job: _Job, handle: TextIO, options: PredictOptions, notes: list[str]) -> int:
    """Embed and label the input chunk by chunk, writing each row to ``handle``; returns the rows written."""

    clf = job.clf
    settings = ExtractionSettings(clf.token_pooling, clf.max_length, clf.batch_size, options.device)
    bar = new_bar(BarSpec(f"predict {job.input_path.name}", job.rows, "row", enabled=options.progress))
    row = 0  # rows written so far; the output's "row" counts from 1, as error messages do
    try:
        with EmbeddingCache(options.cache_dir) as cache:
            source = cache.resolve(job.base_model)
            recorded = (getattr(clf, "provenance_", None) or {}).get("model_revision")
            if recorded and recorded != source.revision:
                notes.append(
                    f"the weights of {clf.base_model!r} differ from those the model was trained on "
                    f"({source.revision[:19]} vs {recorded[:19]}); predictions may be off"
                )
            writer = _Writer(handle, job.out_kind, job.columns, job.value_columns())
            for chunk in _chunks(job.input_path, job.suffix, job.columns, options.chunk_rows):
                texts = _checked_texts(chunk, job.columns, row + 1, job.input_path, job.row_word)
                flat = [text for cells in texts for text in cells]
                features = cache.get_or_extract_texts(source, flat, settings=settings, progress=False)
                for cells, value in zip(texts, _chunk_values(job, features, len(texts)), strict=True):
                    row += 1
                    writer.write({"row": row, **dict(zip(job.columns, cells, strict=True)), **value})
                bar.update(len(texts))
    finally:
        bar.close()
    return row


def predict_file(
    model_dir: PathLike,
    source: PredictInput,
    out: PredictOutput | None = None,
    *,
    options: PredictOptions | None = None,
) -> PredictSummary:
    """Label every row of ``source`` with the model saved in ``model_dir``.

    Args:
        model_dir: a folder written by ``ILGEClassifier.save`` or ``ilge-search export``.
        source: the input file and its text column(s) (:class:`PredictInput`).
        out: where the predictions go (:class:`PredictOutput`; default: JSONL on stdout).
        options: chunk size, LLM batch size, embedding cache, device, base model, progress bar
            (:class:`PredictOptions`).

    Each output row holds ``row`` (the input row's number, from 1; a CSV header and blank JSONL lines are not counted),
    the input text(s), and ``label`` (plus ``proba`` per class) or, for a similarity model, ``score``. A file is written
    under a temporary name and renamed when complete.

    Raises:
        ValueError: a bad model folder, file type, column or empty text, an empty
            input, or an existing ``out`` -- all before the model loads.
    """
    started = time.perf_counter()
    out = PredictOutput() if out is None else out
    options = PredictOptions() if options is None else options
    job = _checked_job(model_dir, source, out, options)
    notes: list[str] = []
    rows = write_output(
        job.out_path, out.stream, lambda handle: _write_predictions(job, handle, options, notes), "the predictions"
    )
    return PredictSummary(
        rows=rows, out=job.out_path, task_kind=job.clf.task_kind_, seconds=time.perf_counter() - started, notes=notes
    )
