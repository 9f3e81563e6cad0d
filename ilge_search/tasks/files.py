"""Reading a task's split files: JSONL, JSON, CSV, TSV and Parquet into columns, with where they came from.

:func:`read_table` reads one file into a :class:`Table` (column name -> one value per row, the
file's name and the number of its first data row, for messages); :func:`find_split_files` finds
a folder's ``train``/``validation``/``test`` files. Bytes that are not UTF-8, a file without rows
and an unreadable file raise :class:`TaskError` naming the file (and the line, where there is one).
:func:`hub_unreachable` asks the Hugging Face hub once whether it answers, before a task is downloaded.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..files import iter_json_objects, read_text_utf8

__all__ = [
    "TaskError",
    "Table",
    "read_table",
    "find_split_files",
    "hub_unreachable",
    "SUFFIXES",
    "SPLIT_FILE_NAMES",
    "MAX_ROWS_LISTED",
]

SPLIT_FILE_NAMES = {"train": ("train",), "validation": ("validation", "val", "dev"), "test": ("test",)}
SUFFIXES = (".jsonl", ".csv", ".tsv", ".parquet", ".json")
MAX_ROWS_LISTED = 10  # row numbers quoted in a message
HUB_PROBE_SECONDS = 10.0  # how long the one reachability request may take


def hub_unreachable() -> str | None:
    """Why the Hugging Face hub cannot be reached now, or None when it answers.

    One request, no retry: ``datasets`` retries every file of a download 5 times with backoff (about 26 s
    on a machine without network) before its own error, so an unreachable hub is found here first."""
    from huggingface_hub import constants  # heavy: the hub client only when asked
    from huggingface_hub.utils import get_session  # heavy: the hub client only when asked

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    try:
        get_session().head(constants.ENDPOINT, timeout=HUB_PROBE_SECONDS)
    except Exception as exc:  # any transport failure (DNS, refused, timeout, proxy) means unreachable
        return f"{type(exc).__name__}: {exc}"
    return None


class TaskError(ValueError):
    """Bad task name, task files or columns; the message says what to do."""


@dataclass
class Table:
    """Columns of one split file, with where they came from (for error messages)."""

    columns: dict[str, list]
    where: str
    first_row: int = 1  # number of the first data row in the file (for messages)
    text_cells: bool = False  # CSV/TSV: every cell is text, so a list is written as words separated by spaces

    @property
    def num_rows(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0

    def column(self, name: str, option: str) -> list:
        if name not in self.columns:
            raise TaskError(
                f"{self.where} has no column {name!r} (columns present: "
                f"{', '.join(map(str, self.columns)) or 'none'}). Pass {option} with one of them."
            )
        return self.columns[name]

    def rows(self, positions: Sequence[int]) -> str:
        shown = ", ".join(str(p + self.first_row) for p in positions[:MAX_ROWS_LISTED])
        more = f" and {len(positions) - MAX_ROWS_LISTED} more" if len(positions) > MAX_ROWS_LISTED else ""
        return f"{shown}{more}"


def _read_jsonl(path: Path) -> Table:
    columns: dict[str, list] = {}
    n = 0
    for _, row in iter_json_objects(path, TaskError):
        for key in row:
            if key not in columns:  # keeps the file's column order
                columns[key] = [None] * n
        for key, values in columns.items():
            values.append(row.get(key))
        n += 1
    if n == 0:
        raise TaskError(f"{path} has no rows")
    return Table(columns, str(path), first_row=1)


def _read_with_pandas(path: Path) -> Table:

    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            frame = pd.read_parquet(path)
        elif suffix == ".json":
            frame = pd.read_json(io.StringIO(read_text_utf8(path, TaskError)))
        else:  # decoded here, so bytes that are not UTF-8 are reported with their line
            frame = pd.read_csv(
                io.StringIO(read_text_utf8(path, TaskError)),
                sep="\t" if suffix == ".tsv" else ",",
                keep_default_na=False,
                na_filter=False,
                quoting=3 if suffix == ".tsv" else 0,
            )
    except ImportError as exc:
        raise TaskError(
            f"reading {path} needs an optional package: {exc}. Install it (pip install pyarrow) "
            f"or convert the file to CSV/JSONL."
        ) from exc
    except TaskError:
        raise
    except Exception as exc:  # pandas parser errors
        raise TaskError(f"could not read {path}: {exc}") from exc
    if len(frame) == 0:
        raise TaskError(f"{path} has no rows")
    columns = {str(name): frame[name].tolist() for name in frame.columns}
    text_file = suffix in (".csv", ".tsv")
    return Table(columns, str(path), first_row=2 if text_file else 1, text_cells=text_file)


def read_table(path: Path) -> Table:
    if path.suffix.lower() == ".jsonl":
        return _read_jsonl(path)
    if path.suffix.lower() not in SUFFIXES:
        raise TaskError(f"{path}: unsupported file type {path.suffix!r}; use one of {', '.join(SUFFIXES)}")
    return _read_with_pandas(path)


def find_split_files(folder: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for split, stems in SPLIT_FILE_NAMES.items():
        for stem in stems:
            candidates = [folder / f"{stem}{suffix}" for suffix in SUFFIXES if (folder / f"{stem}{suffix}").is_file()]
            if candidates:
                found[split] = candidates[0]
                break
    return found
