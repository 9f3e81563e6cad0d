"""Tagging files with an exported tagger (``ilge-search predict`` on an ``ILGETagger`` folder).

A tagging study is exported with ``ILGETagger.from_study`` and ``ILGETagger.save`` (``ilge-search export``).
:func:`predict_tags_file` reads sentences already split into words -- JSONL rows with a list of words (column ``tokens``
unless told), or plain text with one sentence per line, split on whitespace -- chunk by chunk, tags them through the one
embedding cache's word entries, and writes one tag per input word: JSONL rows ``{"row", "tokens", "tags"}``, or CSV/TSV
with one line per word (``row``, ``word``, ``token``, ``tag``). Memory stays flat in the number of sentences.

As for texts, a first pass checks every sentence before any model loads, and a file is written under a temporary name
and renamed when complete; an existing file is never replaced unless ``overwrite`` is given.
"""

from __future__ import annotations

import csv
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from ..files import iter_json_objects, iter_lines_utf8
from ..progress import BarSpec, new_bar
from .output import checked_input, checked_output, file_suffix, write_output
from .predict import OUTPUT_SUFFIXES, PredictInput, PredictOptions, PredictOutput, PredictSummary, batched
from .tagger import META_FILE, ILGETagger

__all__ = ["predict_tags_file", "is_tagger_folder", "TAG_INPUT_SUFFIXES", "DEFAULT_TOKENS_COL"]

TAG_INPUT_SUFFIXES = (".jsonl", ".txt")
DEFAULT_TOKENS_COL = "tokens"


def is_tagger_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` holds a saved :class:`~ilge_search.use.tagger.ILGETagger`."""
    return (Path(path) / META_FILE).is_file()


@dataclass(frozen=True)
class _TagJob:
    tagger: ILGETagger
    path: Path
    suffix: str
    column: str
    sentences: int
    out_path: Path | None
    out_kind: str


def _sentence(value: object, where: str) -> list[str]:
    """One row's words, checked: a non-empty list of non-empty strings."""
    if not isinstance(value, list) or not value:
        raise ValueError(f"{where} is {'an empty list' if value == [] else type(value).__name__}; give a list of words")
    for index, word in enumerate(value, start=1):
        if not isinstance(word, str) or not word.strip() or word != word.strip() or len(word.split()) != 1:
            raise ValueError(f"{where}: word {index} is {word!r}; every word must be one non-empty string, no spaces")
    return list(value)


def _sentences(path: Path, suffix: str, column: str) -> Iterator[list[str]]:
    """The file's sentences in order, each checked (errors name the file, the line and what to do)."""
    if suffix == ".txt":
        for line_number, line in iter_lines_utf8(path):
            words = line.split()
            if not words:
                raise ValueError(f"{path}: line {line_number} is blank; every line must hold one sentence (remove it)")
            yield words
        return
    for line_number, row in iter_json_objects(path):
        if column not in row:
            raise ValueError(
                f"{path}: line {line_number} has no column {column!r} (it has {', '.join(map(str, row)) or 'none'}); "
                "pass --tokens-col"
            )
        yield _sentence(row[column], f"{path}: line {line_number}, column {column!r},")


def _checked_job(
    model_dir: str | os.PathLike, source: PredictInput, out: PredictOutput, options: PredictOptions
) -> _TagJob:
    """Every check that needs no model: paths, file types, the saved tagger, every sentence."""
    path = checked_input(source.path)
    suffix = file_suffix(path, TAG_INPUT_SUFFIXES, "input", " for a tagger")
    if source.text_cols or source.text_col:
        raise ValueError("this model tags words: pass --tokens-col (JSONL) or plain text, not --text-col/--text-cols")
    if out.proba:
        raise ValueError("--proba is for classifiers; a tagger gives one tag per word")
    if suffix == ".txt" and source.tokens_col is not None:
        raise ValueError("a plain-text file holds one sentence per line and no columns; drop --tokens-col")
    out_path, out_kind = checked_output(out.path, out.overwrite, path, OUTPUT_SUFFIXES, "the tags", " for a tagger")
    tagger = ILGETagger.load(model_dir, **options.load_arguments())
    column = source.tokens_col or DEFAULT_TOKENS_COL
    count = sum(1 for _ in _sentences(path, suffix, column))  # every sentence checked, no model loaded
    if count == 0:
        raise ValueError(f"{path} has no sentences; nothing to tag")
    return _TagJob(tagger, path, suffix, column, count, out_path, out_kind)


def _write_tags(job: _TagJob, handle: TextIO, options: PredictOptions) -> int:
    """Tag the input chunk by chunk, writing as it goes; returns the sentences written."""
    table = None
    if job.out_kind in (".csv", ".tsv"):
        table = csv.writer(handle, delimiter="\t" if job.out_kind == ".tsv" else ",", lineterminator="\n")
        table.writerow(["row", "word", "token", "tag"])
    bar = new_bar(BarSpec(f"tag {job.path.name}", job.sentences, "sentence", enabled=options.progress))
    row = 0
    try:
        for chunk in batched(_sentences(job.path, job.suffix, job.column), options.chunk_rows):
            for words, tags in zip(chunk, job.tagger.predict(chunk), strict=True):
                row += 1
                tags = [tag.item() if hasattr(tag, "item") else tag for tag in tags]
                if table is None:
                    handle.write(json.dumps({"row": row, "tokens": words, "tags": tags}, ensure_ascii=False) + "\n")
                else:
                    pairs = enumerate(zip(words, tags, strict=True))
                    table.writerows([row, index + 1, word, tag] for index, (word, tag) in pairs)
            bar.update(len(chunk))
    finally:
        bar.close()
    return row


def predict_tags_file(
    model_dir: str | os.PathLike,
    source: PredictInput,
    out: PredictOutput | None = None,
    *,
    options: PredictOptions | None = None,
) -> PredictSummary:
    """Tag every word of ``source`` with the tagger saved in ``model_dir``: one tag per input word.

    Args:
        model_dir: a folder written by ``ILGETagger.save`` or ``ilge-search export`` of a tagging study.
        source: a ``.jsonl`` file (a list of words per row in ``source.tokens_col``, default ``tokens``)
            or ``.txt`` (one sentence per line, split on whitespace).
        out: ``.jsonl`` (``{"row", "tokens", "tags"}`` per sentence) or ``.csv``/``.tsv`` (one line per word:
            ``row``, ``word`` (its position from 1), ``token``, ``tag``); default JSONL on stdout.
        options: chunk size (sentences), LLM batch size, cache, device, base model, progress bar.

    Raises:
        ValueError: a bad folder, file type, column, empty sentence or existing ``out`` -- before the LLM loads.
    """
    started = time.perf_counter()
    out = PredictOutput() if out is None else out
    options = PredictOptions() if options is None else options
    job = _checked_job(model_dir, source, out, options)
    rows = write_output(job.out_path, out.stream, lambda handle: _write_tags(job, handle, options), "the tags")
    return PredictSummary(rows=rows, out=job.out_path, task_kind="tagging", seconds=time.perf_counter() - started)
