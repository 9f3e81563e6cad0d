"""Shared fixtures: real task data from ../shared/datasets and one embedding cache per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def _data_dir() -> Path:
    env = os.environ.get("ILGE_SEARCH_DATA")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "datasets"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    path = _data_dir()
    if not (path / "banking77" / "train.jsonl").is_file():
        pytest.fail(f"task data not found at {path}; set ILGE_SEARCH_DATA to the shared datasets folder")
    return path


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """One embedding cache for the whole session, so real models are extracted once."""
    return tmp_path_factory.mktemp("ilge-cache")
