"""The entries of an embedding cache folder, whatever they hold: keys, the get-or-build protocol under a
per-entry lock, allocation before extraction, the atomic commit, checksums, listing and removal.

An entry is keyed, Hugging Face datasets style, by a sha256 over the non-default fields plus
:data:`FORMAT_VERSION`. Its file is written under a temporary name and renamed into place, and its JSON
record (the commit marker) is written last, the same way. A second process waits on the entry's lock and
then reads the first one's result. An entry whose size, header or checksum is wrong is reported with a
warning and rebuilt. Temporary names carry their writer's pid and host; opening the cache removes those of
writers that died on this host.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np
from filelock import FileLock, Timeout

from ..files import (
    check_free_space,
    check_writable,
    disk_error,
    lock_is_held,
    preallocate,
    remove_stale_temp_files,
    temp_name,
)
from ..progress import note
from ..settings import resolve_cache_dir
from .entry_file import ARRAY_DTYPES, STORAGE_DTYPES, CacheCorruptError, EntryRecord, file_sha256, safetensors_header
from .models import cache_writes_allowed

if TYPE_CHECKING:
    from .extraction import LayerEmbedder

__all__ = ["FORMAT_VERSION", "CacheEntry", "EntryLayout", "EntryStore"]

FORMAT_VERSION = 1
PathLike = str | os.PathLike

# Key fields left out of the hash when they hold these values, so adding a field later
# does not change the keys of existing entries.
_KEY_DEFAULTS = {"pooling": "mean", "max_length": 512, "storage_dtype": "float16"}
_KEY_HEX_DIGITS = 24
# path -> (size, mtime_ns, sha256) of files whose checksum this process already verified
_VERIFIED: dict[str, tuple[int, int, str]] = {}
_META_RESERVE = 64 * 1024  # room kept free for an entry's JSON record
_FIX_SPACE = "free some space, or pass --cache-dir (or set $ILGE_SEARCH_CACHE) to a folder on a disk with room"
_FIX_WRITABLE = "pass --cache-dir (or set $ILGE_SEARCH_CACHE) to a writable folder"


class _Entry(Protocol):
    hit: bool
    seconds: float


EntryT = TypeVar("EntryT", bound=_Entry)


@dataclass
class CacheEntry:
    """One row of :meth:`EmbeddingCache.ls`."""

    key: str
    model: str
    task: str
    split: str
    shape: tuple
    size_bytes: int
    created: str
    path: Path
    meta: EntryRecord = field(default_factory=dict)
    damage: str | None = None  # why the entry cannot be read (missing or truncated data file), else None


@dataclass(frozen=True)
class EntryLayout:
    """What a new entry's file holds: features of ``shape`` in the storage dtype, then the ``after`` arrays
    (labels, offsets); ``header`` adds to the file's metadata, ``describe(seconds, size)`` to its record."""

    key: str
    shape: tuple[int, ...]
    storage_dtype: str
    after: tuple[tuple[str, np.ndarray], ...]
    describe: Callable[[float, int], Mapping[str, object]]
    header: Mapping[str, str] = field(default_factory=dict)


class EntryStore:
    """The entries under ``cache_dir`` (default ``$ILGE_SEARCH_CACHE`` or ``~/.cache/ilge-search``).

    Args:
        cache_dir: the cache root.
        verify: check each entry's sha256 on its first load in this process (size and
            header are always checked).
    """

    def __init__(self, cache_dir: PathLike | None = None, *, verify: bool = True) -> None:
        self.cache_dir = resolve_cache_dir(cache_dir)
        self.verify = verify
        if cache_writes_allowed():  # checks and dry runs leave even dead writers' leftovers to the next run
            self._remove_stale_temp_files()

    @property
    def embeddings_dir(self) -> Path:
        return self.cache_dir / "embeddings"

    def entry_paths(self, key: str) -> tuple[Path, Path, Path]:
        """The entry's data file, its JSON record (written last: the commit marker) and its lock file."""
        return (
            self.embeddings_dir / f"{key}.safetensors",
            self.embeddings_dir / f"{key}.json",
            self.cache_dir / "locks" / f"{key}.lock",
        )

    def key(
        self,
        *,
        model_identity: str,
        task: str,
        split: str,
        fingerprint: str,
        pooling: str = "mean",
        max_length: int = 512,
        storage_dtype: str = "float16",
        extra: Mapping[str, Any] | None = None,
    ) -> str:
        """sha256 (first 24 hex digits) over FORMAT_VERSION and the non-default fields; ``extra`` adds
        fields of other kinds of entry (word entries: their layout and word pooling)."""
        fields: dict[str, Any] = {
            "format_version": FORMAT_VERSION,
            "model": model_identity,
            "task": task,
            "split": split,
            "fingerprint": fingerprint,
        }
        for name, value in (("pooling", pooling), ("max_length", max_length), ("storage_dtype", storage_dtype)):
            if value != _KEY_DEFAULTS[name]:
                fields[name] = value
        clash = set(extra or {}) & (set(fields) | set(_KEY_DEFAULTS))
        if clash:
            raise ValueError(f"extra key fields {sorted(clash)} would replace the standard ones")
        fields.update(extra or {})
        # json.dumps raises on anything it cannot encode: a failed hash never becomes a random key.
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:_KEY_HEX_DIGITS]

    def committed_record(self, key: str) -> tuple[EntryRecord, os.stat_result] | None:
        """The entry's JSON record and its data file's stat, None if the entry is not committed;
        raises CacheCorruptError if the record is unreadable or the file is missing or of the wrong size."""
        data_path, meta_path, _ = self.entry_paths(key)
        if not meta_path.is_file():
            return None
        try:
            meta = json.loads(meta_path.read_text())
            expected_size = int(meta["file_size"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CacheCorruptError(f"unreadable metadata {meta_path.name} ({exc})") from exc
        try:
            stat = data_path.stat()
        except FileNotFoundError as exc:
            raise CacheCorruptError(f"{data_path.name} is missing") from exc
        if stat.st_size != expected_size:
            raise CacheCorruptError(
                f"{data_path.name} has {stat.st_size} bytes, expected {expected_size} (truncated or overwritten)"
            )
        return meta, stat

    def verify_file(
        self, path: Path, meta: EntryRecord, stat: os.stat_result, data: bytes | bytearray | None = None
    ) -> None:
        """With ``verify``, check the file's sha256 against its record once per process (until the file
        changes); ``data``: its bytes, if already in memory, else it is read in blocks."""
        stamp = (stat.st_size, stat.st_mtime_ns, str(meta.get("file_sha256")))
        if not self.verify or _VERIFIED.get(str(path)) == stamp:
            return
        actual = hashlib.sha256(data).hexdigest() if data is not None else file_sha256(path)
        if actual != meta.get("file_sha256"):
            raise CacheCorruptError(
                f"{path.name} fails its checksum (sha256 {actual[:12]}..., "
                f"expected {str(meta.get('file_sha256'))[:12]}...)"
            )
        _VERIFIED[str(path)] = stamp

    @staticmethod
    def _read_or_discard(key: str, read: Callable[[str], EntryT | None], announce: bool) -> EntryT | None:
        """``read``, but a damaged entry gives None (with a warning if ``announce``)."""
        try:
            return read(key)
        except CacheCorruptError as exc:
            if announce:
                warnings.warn(f"embedding cache entry {key} is corrupt: {exc}; rebuilding it", stacklevel=4)
            return None

    def _remove_files(self, key: str) -> None:
        data_path, meta_path, _ = self.entry_paths(key)
        for path in (meta_path, data_path):  # metadata first: the entry stops being committed
            path.unlink(missing_ok=True)
        _VERIFIED.pop(str(data_path), None)

    def _check_writable(self) -> None:
        """Before a miss is extracted: the cache folders take files, and temporary files of
        writers that died on this host are removed (they may hold the space this entry needs)."""
        for folder in (self.embeddings_dir, self.cache_dir / "locks"):
            check_writable(folder, "the embedding cache folder", _FIX_WRITABLE)
        self._remove_stale_temp_files()

    def _remove_stale_temp_files(self) -> None:
        """Temporary files of extractions killed on this host: their pid is gone and nobody
        holds their entry's lock (the writer holds it while writing)."""
        remove_stale_temp_files(
            self.embeddings_dir, lambda path: lock_is_held(self.entry_paths(path.name[1:].split(".", 1)[0])[2])
        )

    @contextmanager
    def disk_errors(self, key: str, size: int) -> Iterator[None]:
        """A full or read-only disk met while writing becomes one line (a DiskError)."""
        try:
            yield
        except OSError as exc:
            error = disk_error(exc, self.embeddings_dir, f"embedding cache entry {key} ({size:,} bytes)", _FIX_SPACE)
            if error is None:
                raise
            raise error from exc

    @contextmanager
    def new_entry_file(self, key: str, header: bytes, size: int) -> Iterator[Path]:
        """A temporary file of ``size`` bytes that starts with ``header``, allocated in full before
        anything is extracted (a full disk fails here, as one line, never later inside a memmap write);
        removed on the way out unless :meth:`commit_entry` moved it into place."""
        check_free_space(self.embeddings_dir, size + _META_RESERVE, f"embedding cache entry {key}", _FIX_SPACE)
        tmp = temp_name(self.entry_paths(key)[0])
        try:
            with self.disk_errors(key, size), open(tmp, "wb") as handle:
                handle.write(header)
                preallocate(handle, size)
            yield tmp
        finally:
            tmp.unlink(missing_ok=True)

    def commit_entry(self, key: str, tmp: Path, meta: EntryRecord) -> None:
        """Record the written file's size, checksum and time in ``meta``, then rename file and record into
        place, the record (the commit marker) last."""
        data_path, meta_path, _ = self.entry_paths(key)
        meta_tmp = temp_name(meta_path)
        meta.update(
            file_size=tmp.stat().st_size,
            file_sha256=file_sha256(tmp),
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        )
        try:
            meta_tmp.write_text(json.dumps(meta, indent=1))  # written before anything is renamed into place
            meta_path.unlink(missing_ok=True)
            os.replace(tmp, data_path)
            os.replace(meta_tmp, meta_path)
        finally:
            meta_tmp.unlink(missing_ok=True)

    def write_entry(
        self,
        layout: EntryLayout,
        embedder: LayerEmbedder,
        fill: Callable[[np.memmap], None],
        meta: EntryRecord,
    ) -> None:
        """Stream ``fill``'s rows into a memmapped safetensors file, write ``layout.after`` behind them, then
        commit it atomically. The file's size is known from the model's config, so free space is checked and
        the whole file allocated before the model loads; ``layout.describe`` adds its counts to ``meta``."""
        st_dtype, np_dtype, _ = STORAGE_DTYPES[layout.storage_dtype]
        feature_bytes = int(np.prod(layout.shape)) * np.dtype(np_dtype).itemsize
        tensors = [("features", st_dtype, layout.shape, feature_bytes)]
        tensors += [(name, ARRAY_DTYPES[array.dtype], array.shape, array.nbytes) for name, array in layout.after]
        header = safetensors_header(tensors, {"format": "pt", "key": layout.key, **layout.header})
        size = len(header) + sum(tensor[3] for tensor in tensors)
        with self.new_entry_file(layout.key, header, size) as tmp:
            embedder.load()
            started = time.perf_counter()
            with self.disk_errors(layout.key, size):
                features = np.memmap(tmp, dtype=np_dtype, mode="r+", offset=len(header), shape=layout.shape)
                fill(features)
                features.flush()
                del features
                with open(tmp, "r+b") as handle:
                    handle.seek(len(header) + feature_bytes)
                    for _, array in layout.after:
                        handle.write(np.ascontiguousarray(array).tobytes())
                    handle.flush()
                    os.fsync(handle.fileno())
                seconds = time.perf_counter() - started
                meta.update(
                    shape=list(layout.shape),
                    num_layers=embedder.num_layers,
                    hidden_size=embedder.hidden_size,
                    effective_max_length=embedder.effective_max_length,
                    extract_seconds=round(seconds, 3),
                    **layout.describe(seconds, size),
                )
                self.commit_entry(layout.key, tmp, meta)

    def get_or_build(
        self, key: str, read: Callable[[str], EntryT | None], build: Callable[[], None], progress: bool = True
    ) -> EntryT:
        """Entry ``key`` as ``read`` gives it, or, when it is missing or damaged, built once by ``build``
        under the entry's file lock; a second process waits on the lock, then reads what the first wrote.

        ``read`` returns None for a missing entry and raises CacheCorruptError for a damaged one (which
        is rebuilt, with a warning). The result's ``hit`` says whether it was read, ``seconds`` how long
        this call took.
        """

        started = time.perf_counter()
        damaged = False
        try:
            found = read(key)
        except CacheCorruptError as exc:
            warnings.warn(f"embedding cache entry {key} is corrupt: {exc}; rebuilding it", stacklevel=3)
            found, damaged = None, True
        if found is not None:
            found.seconds = time.perf_counter() - started
            return found
        self._check_writable()
        lock = FileLock(str(self.entry_paths(key)[2]))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            if progress:
                note(f"ilge-search: waiting for another process that is extracting cache entry {key} ...")
            lock.acquire()
        try:
            # Another process may have written (or repaired) the entry while we waited.
            found = self._read_or_discard(key, read, announce=not damaged)
            if found is None:
                self._remove_files(key)
                build()
                found = read(key)
                if found is None:
                    raise CacheCorruptError(f"cache entry {key} vanished right after it was written; extract again")
                found.hit = False
        finally:
            lock.release()
        found.seconds = time.perf_counter() - started
        return found

    def ls(self) -> list[CacheEntry]:
        """Committed entries, newest first."""
        entries = []
        for meta_path in self.embeddings_dir.glob("*.json") if self.embeddings_dir.is_dir() else []:
            try:
                meta = json.loads(meta_path.read_text())
            except (OSError, ValueError):
                continue
            data_path = meta_path.with_suffix(".safetensors")
            size = data_path.stat().st_size if data_path.is_file() else 0
            try:  # the size check only: cheap enough for a listing; a run also verifies the checksum
                self.committed_record(meta_path.stem)
                damage = None
            except CacheCorruptError as exc:
                damage = str(exc)
            entries.append(
                CacheEntry(
                    key=meta_path.stem,
                    model=str(meta.get("model", "?")),
                    task=str(meta.get("task", "?")),
                    split=str(meta.get("split", "?")),
                    shape=tuple(meta.get("shape", ())),
                    size_bytes=size,
                    created=str(meta.get("created", "")),
                    path=data_path,
                    meta=meta,
                    damage=damage,
                )
            )
        return sorted(entries, key=lambda entry: entry.created, reverse=True)

    def rm(self, key_or_prefix: str | None = None, *, all: bool = False) -> list[str]:
        """Remove one entry (full key or unique prefix) or, with ``all=True``, every entry and
        leftover temporary file. Returns the removed keys. Converted models are kept."""
        if all == (key_or_prefix is not None):
            raise ValueError("pass a key (or a unique key prefix) or all=True, not both")
        keys = (
            sorted(
                {p.name.split(".", 1)[0] for p in self.embeddings_dir.glob("*.safetensors")}
                | {p.stem for p in self.embeddings_dir.glob("*.json")}
            )
            if self.embeddings_dir.is_dir()
            else []
        )
        if all:
            for key in keys:
                self._remove_files(key)
            for leftover in self.embeddings_dir.glob(".*.tmp-*") if self.embeddings_dir.is_dir() else []:
                leftover.unlink(missing_ok=True)
            return keys
        matches = [key for key in keys if key.startswith(key_or_prefix or "")]
        if not matches:
            raise ValueError(
                f"no cache entry matches {key_or_prefix!r} in {self.embeddings_dir}; see `ilge-search cache ls`"
            )
        if len(matches) > 1:
            raise ValueError(
                f"{key_or_prefix!r} matches {len(matches)} entries ({', '.join(matches[:5])}"
                f"{' ...' if len(matches) > 5 else ''}); give more of the key"
            )
        self._remove_files(matches[0])
        return matches
