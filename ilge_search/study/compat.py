"""Public names that ``ilge_search.study`` defined before :mod:`ilge_search.storage` existed.

New code opens storages with :func:`ilge_search.storage.open_storage`; these
thin functions keep older callers working.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Union

from ..settings import default_storage_url
from ..storage import artifact_dir_for, open_storage

__all__ = ["make_storage", "artifact_store_for"]


def make_storage(
    url: Optional[str] = None,
    *,
    heartbeat_interval: Optional[int] = 60,
    grace_period: Optional[int] = None,
    max_retry: int = 3,
) -> Any:
    """The ``optuna.storages.RDBStorage`` of :func:`~ilge_search.storage.open_storage` (with heartbeats by default).

    Raises:
        StorageError: the URL is malformed, its driver is missing, or the
            database cannot be reached or written.
    """
    return open_storage(url, heartbeat_interval=heartbeat_interval, grace_period=grace_period, max_retry=max_retry).rdb


def artifact_store_for(
    storage_url: Optional[str] = None, artifact_dir: Optional[Union[str, os.PathLike]] = None
) -> Any:
    """The ``optuna.artifacts.FileSystemArtifactStore`` used with ``storage_url`` (the database is not opened)."""
    from optuna.artifacts import FileSystemArtifactStore

    path = artifact_dir_for(storage_url or default_storage_url(), artifact_dir)
    path.mkdir(parents=True, exist_ok=True)
    return FileSystemArtifactStore(path)
