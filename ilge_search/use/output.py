"""What ``predict_file`` (texts) and ``predict_tags_file`` (words) do alike: the input and output paths
checked before any model loads, and the output written to a stream, or to a temporary sibling renamed
once complete, a full disk reported in one line."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

from ..files import check_output_path, disk_error, temp_name

__all__ = ["checked_input", "checked_output", "file_suffix", "write_output"]

PathLike = str | os.PathLike


def file_suffix(path: Path, allowed: Sequence[str], what: str, reader: str = "") -> str:
    """``path``'s type among ``allowed`` (``.ndjson`` read as ``.jsonl``); ``reader`` (" for a tagger")
    says in the refusal who cannot read it."""
    suffix = ".jsonl" if path.suffix.lower() == ".ndjson" else path.suffix.lower()
    if suffix not in allowed:
        raise ValueError(
            f"{path}: unsupported {what} file type {path.suffix or '(none)'!r}{reader}; use one of {', '.join(allowed)}"
        )
    return suffix


def checked_input(source: PathLike) -> Path:
    """The input file, which must exist."""
    path = Path(source).expanduser()
    if not path.is_file():
        raise ValueError(f"input file {path} does not exist")
    return path


def checked_output(
    out: PathLike | None, overwrite: bool, input_path: Path, allowed: Sequence[str], what: str, reader: str = ""
) -> tuple[Path | None, str]:
    """The output file (``None``: JSONL on a stream) and its type; refused when it is the input, or exists without
    ``overwrite``. ``what``: what is written ("the predictions", "the tags"); ``reader`` as for :func:`file_suffix`."""
    out_path = None if out is None else Path(out).expanduser()
    out_kind = ".jsonl" if out_path is None else file_suffix(out_path, allowed, "output", reader)
    if out_path is not None:
        if out_path.resolve() == input_path.resolve():
            raise ValueError(f"--out is the input file; write {what} somewhere else")
        check_output_path(out_path, force=overwrite)
    return out_path, out_kind


def write_output(out_path: Path | None, stream: TextIO | None, write: Callable[[TextIO], int], what: str) -> int:
    """``write`` into ``stream`` (default stdout) or, with ``out_path``, into a temporary sibling of it
    renamed once complete; returns what ``write`` returns (the rows written)."""
    try:
        if out_path is None:
            handle = stream or sys.stdout
            rows = write(handle)
            handle.flush()
            return rows
        out_path.parent.mkdir(parents=True, exist_ok=True)  # checked up front (check_output_path), made only now
        tmp = temp_name(out_path)
        try:
            with open(tmp, "w", encoding="utf-8", newline="") as file:
                rows = write(file)
            os.replace(tmp, out_path)
        finally:
            tmp.unlink(missing_ok=True)  # gone after the rename; left by an error otherwise
        return rows
    except OSError as exc:
        folder = out_path.parent if out_path is not None else Path.cwd()
        problem = disk_error(exc, folder, what, "free some space or pass another --out")
        if problem is None:
            raise
        raise problem from None
