"""Files written and read safely: temporary names that say who writes them, disk checks, UTF-8 text.

A temporary file is named ``<final name>.tmp-<pid>-<random>@<host>`` (:func:`temp_name`), so a later
process removes only those whose writer died on this host (:func:`remove_stale_temp_files`).
:func:`check_writable`, :func:`check_free_space` and :func:`disk_error` raise a
one-line :class:`DiskError` (a ``ValueError``). The output rule every ``--out``/``--plot``/``--report`` obeys
before any work is :func:`check_output_path` (a file) and :func:`check_output_folder` (a folder): nothing
``git`` tracks and no existing file is replaced without ``--force``, and nothing is created by the check.
"""

from __future__ import annotations

import codecs
import errno
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from filelock import FileLock, Timeout

__all__ = [
    "DiskError",
    "temp_name",
    "remove_stale_temp_files",
    "lock_is_held",
    "check_writable",
    "check_free_space",
    "disk_error",
    "preallocate",
    "format_bytes",
    "read_text_utf8",
    "iter_lines_utf8",
    "iter_json_objects",
    "git_tracked",
    "check_can_create",
    "check_output_path",
    "check_output_folder",
    "write_output_text",
]

PathLike = str | os.PathLike
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})
_TEMP = re.compile(r"\.tmp-(?P<pid>\d+)-[0-9a-f]{8}@(?P<host>[A-Za-z0-9._-]+)$")


class DiskError(ValueError):
    """A folder is not writable or its disk is full; the message names the folder and what to do."""


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "localhost"


def temp_name(final: PathLike) -> Path:
    """A temporary sibling of ``final`` that records this process (pid and host)."""
    final = Path(final)
    return final.with_name(f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}@{_host()}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_stale_temp_files(folder: PathLike, busy: Callable[[Path], bool] | None = None) -> list[Path]:
    """Remove temporary files and folders in ``folder`` whose writer was a process of this
    host that no longer runs (and, if given, for which ``busy(path)`` is false: a second
    check, e.g. a lock the writer would hold, for pids from another pid namespace); return
    what was removed. Never raises for I/O errors."""
    folder = Path(folder)
    if os.name != "posix" or not folder.is_dir():  # os.kill(pid, 0) only probes on POSIX
        return []
    removed = []
    host = _host()
    try:
        candidates = list(folder.glob(".*.tmp-*"))
    except OSError:
        return []
    for path in candidates:
        match = _TEMP.search(path.name)
        if match is None or match["host"] != host:
            continue
        pid = int(match["pid"])
        if pid == os.getpid() or _pid_alive(pid) or (busy is not None and busy(path)):
            continue
        try:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError:
            continue
        removed.append(path)
    return removed


def lock_is_held(lock_path: PathLike) -> bool:
    """Whether some process holds the file lock at ``lock_path`` (a lock that cannot be opened
    counts as held, so nothing is removed on doubt)."""

    try:
        with FileLock(str(lock_path), timeout=0):
            return False
    except (Timeout, OSError):
        return True


def format_bytes(count: float) -> str:
    """``1.5 MB`` style (powers of 1024)."""
    for unit in ("bytes", "KB", "MB", "GB"):
        if abs(count) < 1024 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "bytes" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def check_writable(folder: PathLike, what: str, fix: str) -> Path:
    """Create ``folder`` if needed and make sure a file can be created in it (a real write, so
    read-only mounts and root alike are caught); raise :class:`DiskError` otherwise."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise DiskError(f"{what} {folder} is not writable ({exc.strerror or exc}); {fix}") from None
    return folder


def check_free_space(folder: PathLike, needed: int, what: str, fix: str) -> None:
    """Raise :class:`DiskError` if the disk holding ``folder`` has less than ``needed`` bytes free."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return  # unknown: the write itself will tell
    if free < needed:
        raise DiskError(
            f"not enough free space for {what} in {folder}: it needs {format_bytes(needed)}, "
            f"{format_bytes(free)} is free; {fix}"
        )


def disk_error(exc: OSError, folder: PathLike, what: str, fix: str) -> DiskError | None:
    """A one-line :class:`DiskError` for a full or read-only disk, None for other errors."""
    if exc.errno not in DISK_ERRNOS:
        return None
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        problem = f"the disk holding {folder} is full ({exc.strerror})"
    else:
        problem = f"{folder} is not writable ({exc.strerror})"
    return DiskError(f"{problem} while writing {what}; nothing half-written was kept; {fix}")


def read_text_utf8(path: PathLike, error: type[ValueError] = ValueError) -> str:
    """The file's text (a leading byte-order mark dropped); bytes that are not UTF-8 raise
    ``error`` (a ``ValueError`` class) naming the file, the line and the column."""
    path = Path(path)
    data = path.read_bytes()
    bom = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[bom:].decode("utf-8")
    except UnicodeDecodeError as exc:
        start = bom + exc.start
        line = data.count(b"\n", 0, start) + 1
        column = start - (data.rfind(b"\n", 0, start) + 1) + 1
        raise _not_utf8(error, path, line, column, start, data[start], exc.reason) from None


def iter_lines_utf8(path: PathLike, error: type[ValueError] = ValueError) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of a UTF-8 file, read lazily (memory flat in the file's size), with the
    same error as :func:`read_text_utf8` for bytes that are not UTF-8."""
    path = Path(path)
    offset = 0
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            bom = len(codecs.BOM_UTF8) if number == 1 and raw.startswith(codecs.BOM_UTF8) else 0
            try:
                yield number, raw[bom:].decode("utf-8")
            except UnicodeDecodeError as exc:
                column = exc.start + 1
                raise _not_utf8(
                    error, path, number, column, offset + bom + exc.start, raw[bom + exc.start], exc.reason
                ) from None
            offset += len(raw)


def iter_json_objects(path: PathLike, error: type[ValueError] = ValueError) -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` of a JSONL file, read lazily; blank lines are skipped, and a line that is not
    UTF-8, not JSON or not a JSON object raises ``error`` naming the file and the line."""

    for number, line in iter_lines_utf8(path, error):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise error(f"{path}: line {number} is not valid JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise error(f"{path}: line {number} is not a JSON object")
        yield number, row


def _not_utf8(
    error: type[ValueError], path: Path, line: int, column: int, offset: int, byte: int, reason: str
) -> ValueError:
    return error(
        f"{path}: line {line}, column {column} is not valid UTF-8 (byte 0x{byte:02x} at offset {offset}: "
        f"{reason}); save the file as UTF-8"
    )


def preallocate(handle: BinaryIO, size: int) -> None:
    """Give the open file ``size`` bytes of real disk blocks now, so a full disk fails here with
    ENOSPC instead of later, inside a memory-mapped write, with a bus error."""
    handle.flush()
    try:
        os.posix_fallocate(handle.fileno(), 0, size)
        return
    except AttributeError:  # no posix_fallocate (macOS, Windows)
        pass
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
    handle.seek(0, os.SEEK_END)
    zeros = bytes(1 << 20)
    while handle.tell() < size:
        handle.write(zeros[: size - handle.tell()])
    handle.flush()


# ----------------------------------------------------------------------------- the output rule


def git_tracked(path: PathLike) -> list[str]:
    """What ``git`` tracks at ``path``: the files under a folder (relative to it), or ``[name]`` for a tracked
    file; empty outside a work tree, for a path that does not exist, or without git."""
    path = Path(path)
    if path.is_dir():
        folder, pattern = path, "."
    elif path.is_file():
        folder, pattern = path.parent, path.name
    else:
        return []
    try:
        done = subprocess.run(
            ["git", "-C", str(folder), "ls-files", "-z", "--", pattern],
            capture_output=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    if done.returncode != 0:
        return []
    return sorted(name for name in done.stdout.decode("utf-8", "replace").split("\0") if name)


def check_can_create(folder: PathLike, what: str, fix: str) -> Path:
    """Make sure ``folder`` exists or can be made, and that a file can be created in it, creating nothing (a
    real write of an unnamed file, so read-only mounts and root alike are caught); else a :class:`DiskError`
    ``"<what>: <why>; <fix>"``."""
    folder = Path(folder)
    existing = folder
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    made = "" if existing == folder else f"{folder} cannot be made, "
    if not existing.is_dir():
        raise DiskError(f"{what}: {made}{existing} is a file, not a folder; {fix}")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        raise DiskError(f"{what}: {made}{existing} is not writable ({exc.strerror or exc}); {fix}") from None
    return folder


def check_output_path(path: PathLike, *, force: bool, option: str = "--out") -> Path:
    """``path`` (``~`` expanded) if a command may write the file there; else a one-line ``ValueError``.

    Without ``force``, an existing file is refused, with a message that says so when ``git`` tracks it. Its
    folder must exist or be creatable, and be writable, with or without ``force``. Nothing is created.
    """
    path = Path(path).expanduser()
    if path.is_dir():
        raise ValueError(f"{option} {path} is a folder; pass a file name")
    if os.path.lexists(path) and not force:
        if git_tracked(path):
            raise ValueError(
                f"{option} {path} is a file git tracks; it is never replaced unless told: pass another "
                f"{option}, or --force to replace the committed file on purpose"
            )
        raise ValueError(
            f"{option} {path} exists and no existing file is replaced unless told: pass another {option}, or "
            "--force to replace it"
        )
    check_can_create(path.parent, f"cannot write {option} {path}", f"pass an {option} in a folder you can write")
    return path


def check_output_folder(path: PathLike, *, force: bool, option: str = "--out") -> Path:
    """``path`` (``~`` expanded) if a command may write into that folder, as far as the shared rule goes (what
    else may be in it is the command's own rule); else a one-line ``ValueError``.

    A file is refused; without ``force``, so is a folder holding files ``git`` tracks. The folder must exist or
    be creatable, and be writable. Nothing is created.
    """
    path = Path(path).expanduser()
    if os.path.lexists(path) and not path.is_dir():
        raise ValueError(f"{option} {path} is a file, not a folder; pass a folder")
    tracked = git_tracked(path)
    if tracked and not force:
        raise ValueError(
            f"{option} {path} holds {len(tracked)} file(s) git tracks (e.g. {tracked[0]}); they are never "
            f"replaced unless told: pass another {option}, or --force to rebuild committed files on purpose"
        )
    check_can_create(path, f"cannot write {option} {path}", f"pass an {option} in a folder you can write")
    return path


def write_output_text(path: PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` checked by :func:`check_output_path`: its folders made, under a
    temporary name renamed when complete, so a reader never sees half a file."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(path)
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
