"""Fixtures for fault tests: small tmpfs mounts (a full disk, a read-only disk) and tiny task folders."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from announced_skips import skip_because


def _mount(target: Path, options: str) -> bool:
    target.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)], capture_output=True)
    return done.returncode == 0


def _umount(target: Path) -> None:
    subprocess.run(["umount", "-l", str(target)], capture_output=True)


@pytest.fixture()
def small_disk(tmp_path) -> Iterator[Path]:
    """A 1 MiB tmpfs: a disk that is (almost) full for any real cache entry."""
    target = tmp_path / "small-disk"
    if not _mount(target, "size=1m"):
        skip_because("mounting a tmpfs needs root (mount -t tmpfs); run the suite as root for the full-disk checks")
    yield target
    _umount(target)


@pytest.fixture()
def read_only_dir(tmp_path) -> Iterator[Path]:
    """An empty folder no process can write to: a read-only tmpfs mount, or (not root) mode 0555."""
    target = tmp_path / "read-only"
    if _mount(target, "size=1m,ro"):
        yield target
        _umount(target)
        return
    if os.geteuid() == 0:
        skip_because("root ignores file modes and mounting a read-only tmpfs failed; allow mount -t tmpfs here")
    target.mkdir(exist_ok=True)
    target.chmod(0o555)
    yield target
    target.chmod(0o755)
