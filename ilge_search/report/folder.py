"""The report's folder: where it goes by default, and what may be written there (``docs/reliability.md``).

Its manifest (:data:`MANIFEST_NAME`) lists the files a report wrote and the storage it read. A report writes only into a
new or empty folder or one whose manifest names the same storage (a rerun replaces its files and removes those it no
longer writes), never into one holding git-tracked files unless ``force``; with ``force`` nothing no manifest listed is
removed. The default folder sits beside a SQLite file, or is named from a server database's host and name.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy

from .._version import __version__
from ..files import check_output_folder, git_tracked, write_output_text
from ..storage import hide_password, sqlite_database

__all__ = ["MANIFEST_NAME", "Manifest", "default_report_dir", "check_out_dir", "finish_out_dir", "git_tracked"]

MANIFEST_NAME = ".ilge-report.json"  # the files a report wrote into its folder (relative paths) and its storage


@dataclass
class Manifest:
    """What an earlier report recorded in its folder: the files it wrote and the storage it read
    (``storage`` is ``None`` for reports written before storages were recorded)."""

    files: set[str] = field(default_factory=set)
    storage: str | None = None


def default_report_dir(storage_url: str) -> Path:
    """The report folder used when ``--out`` is not given: ``<folder>/<stem>-report`` beside a SQLite file,
    else ``<backend>-<host>-<database>-report`` in the current folder."""
    database = sqlite_database(storage_url)
    if database is not None:
        return database.parent / f"{database.stem}-report"

    try:
        parsed = sqlalchemy.engine.make_url(storage_url)
        parts = [parsed.get_backend_name(), parsed.host or "", parsed.database or ""]
    except Exception:  # an unparsable URL fails when the storage is opened; the name only has to be safe
        parts = [storage_url]
    name = re.sub(r"[^A-Za-z0-9._]+", "-", "-".join(part for part in parts if part)).strip("-.") or "ilge"
    return Path(f"{name}-report")


def recorded_storage(out: Path, storage_url: str) -> str:
    """How a manifest in ``out`` names the storage: a SQLite file by its path relative to ``out`` (so a
    clone or a moved pair of storage and report still match), any other storage by its URL without password."""
    database = sqlite_database(storage_url)
    if database is None:
        return hide_password(storage_url)
    return "sqlite:///" + Path(os.path.relpath(database, out.resolve())).as_posix()


def read_manifest(out: Path) -> Manifest | None:
    """The manifest of an earlier report in ``out`` (``None``: none, or unreadable)."""
    try:
        data = json.loads((out / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, list) or not all(isinstance(name, str) for name in files):
        return None
    storage = data.get("storage")
    return Manifest(set(files), storage if isinstance(storage, str) else None)


def _refusal(out: Path, storage_url: str, previous: Manifest | None) -> str | None:
    """Why a report of ``storage_url`` may not write into the existing folder ``out`` (``None``: it may)."""
    if previous is None:
        if not any(out.iterdir()):
            return None
        return (
            f"{out} is not empty and was not written by `ilge-search report` (it has no {MANIFEST_NAME}); pass "
            "a new or empty --out, or --force to write into it anyway (files of the same names are replaced, "
            "no other file is removed)"
        )
    if previous.storage != recorded_storage(out, storage_url):
        wrote = "a storage it did not record" if previous.storage is None else f"another storage ({previous.storage})"
        return (
            f"{out} holds the report of {wrote}, not of {hide_password(storage_url)}; pass another --out, "
            "or --force to replace that report"
        )
    return None


def check_out_dir(out: Path, storage_url: str, force: bool) -> Manifest:
    """Refuse a folder the report may not write into (unless ``force``); what a report wrote there before.

    Raises:
        ValueError: ``out`` is a file, or cannot be made or written; or, without ``force``, it holds
            git-tracked files (:func:`~ilge_search.files.check_output_folder`), files no report wrote, or
            another storage's report (one line, naming the fix).
    """
    check_output_folder(out, force=force)
    if not out.is_dir():
        return Manifest()
    previous = read_manifest(out)
    if not force:
        why = _refusal(out, storage_url, previous)
        if why is not None:
            raise ValueError(why)
    return previous or Manifest()


def _inside(out: Path, relative: str) -> Path | None:
    """``out / relative`` when it stays inside ``out`` (a manifest never names files elsewhere)."""
    path = (out / relative).resolve()
    root = out.resolve()
    return path if path != root and root in path.parents else None


def finish_out_dir(out: Path, storage_url: str, written: set[str], previous: Manifest) -> None:
    """Remove what an earlier report wrote and this one did not; record what this one wrote, and from where."""
    for relative in sorted(previous.files - written):
        path = _inside(out, relative)
        if path is not None and path.is_file():
            path.unlink()
    manifest = {
        "written_by": f"ilge-search report {__version__}",
        "storage": recorded_storage(out, storage_url),
        "files": sorted(written),
    }
    write_output_text(out / MANIFEST_NAME, json.dumps(manifest, indent=1) + "\n")
