"""A model's weights identity: ``sha256`` over its files, big ones memoised under the cache dir, and the
read-only mode checks and dry runs run in (:func:`weights_memo_read_only`)."""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock

from ..settings import resolve_cache_dir

__all__ = ["ModelLoadError", "ModelNotFoundError", "cache_writes_allowed", "weights_hash", "weights_memo_read_only"]

PathLike = str | os.PathLike
_SMALL_FILE_BYTES = 1 << 20  # files below this are hashed directly, larger ones memoised
_SKIPPED_FILES = re.compile(r"(^\.|^README|\.md$|\.lock$)", re.IGNORECASE)


class ModelNotFoundError(ValueError):
    """A model name that is neither an alias, a local folder nor a reachable hub id."""


class ModelLoadError(ValueError):
    """A model that was found but cannot be used (a bad config.json, no weights, a tokenizer that
    does not load); the message names the folder or id and the underlying reason in one line."""


def _sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _memo_path(cache_dir: PathLike | None) -> Path:
    return resolve_cache_dir(cache_dir) / "models" / "file-hashes.json"


_CACHE_WRITES: contextvars.ContextVar[bool] = contextvars.ContextVar("ilge_cache_writes", default=True)


@contextlib.contextmanager
def weights_memo_read_only() -> Iterator[None]:
    """Inside the block, weights hashes are read from the memo but never written to it, and a GGUF file not
    yet converted is never converted (:func:`materialize_model` refuses): a run's checks and a dry run create
    nothing in the cache folder."""
    token = _CACHE_WRITES.set(False)
    try:
        yield
    finally:
        _CACHE_WRITES.reset(token)


def cache_writes_allowed() -> bool:
    """``False`` inside :func:`weights_memo_read_only`: whatever runs there leaves the cache folder as it is."""
    return _CACHE_WRITES.get()


def _hash_large_file(path: Path, cache_dir: PathLike | None) -> str:
    """sha256 of a big weights file, computed once per (path, size, mtime) and kept in the cache dir."""

    stat = path.stat()
    memo_file = _memo_path(cache_dir)
    entry_key = str(path.resolve())
    stamp = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}

    def read_memo() -> dict:
        try:
            return json.loads(memo_file.read_text())
        except (OSError, ValueError):
            return {}

    known = read_memo().get(entry_key)
    if known and all(known.get(k) == v for k, v in stamp.items()):
        return known["sha256"]
    digest = _sha256_file(path)  # raises on I/O errors: never a made-up key
    if not _CACHE_WRITES.get():
        return digest
    try:
        memo_file.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(memo_file) + ".lock", timeout=60):
            memo = read_memo()
            memo[entry_key] = {**stamp, "sha256": digest}
            tmp = memo_file.with_name(f"{memo_file.name}.tmp-{os.getpid()}")
            tmp.write_text(json.dumps(memo, indent=1, sort_keys=True))
            os.replace(tmp, memo_file)
    except OSError as exc:  # a read-only or full cache only costs re-hashing next time
        logging.getLogger(__name__).debug("could not record the weights hash in %s: %s", memo_file, exc)
    return digest


def _hash_file(path: Path, cache_dir: PathLike | None) -> str:
    if path.stat().st_size < _SMALL_FILE_BYTES:
        return _sha256_file(path)
    return _hash_large_file(path, cache_dir)


def weights_hash(path: PathLike, cache_dir: PathLike | None = None) -> str:
    """``sha256:<hex>`` over every file of a model folder (or over one file).

    Big files are hashed once and memoised by (path, size, mtime) under the cache dir,
    so resolving a model again costs a few ``stat`` calls.
    """
    path = Path(path)
    if path.is_file():
        return "sha256:" + _hash_file(path, cache_dir)
    files = sorted(
        p
        for p in path.rglob("*")
        if p.is_file() and not any(_SKIPPED_FILES.search(part) for part in p.relative_to(path).parts)
    )
    if not files:
        raise ModelNotFoundError(f"model folder {path} contains no files")
    digest = hashlib.sha256()
    for file in files:
        digest.update(f"{file.relative_to(path).as_posix()}\t{_hash_file(file, cache_dir)}\n".encode())
    return "sha256:" + digest.hexdigest()
