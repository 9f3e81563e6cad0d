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


@pytest.fixture()
def postgres_url():
    """A fresh, empty PostgreSQL database on the local server, dropped afterwards.

    The server (127.0.0.1:5432, trust auth, database ``test``) is started by ``.ci/run``.
    """
    import uuid

    psycopg2 = pytest.importorskip("psycopg2")
    name = f"ilge_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg2.connect(host="127.0.0.1", port=5432, dbname="test", user="postgres")
    except psycopg2.OperationalError as exc:  # the CI script starts the server; fail loudly if it is not up
        pytest.fail(f"PostgreSQL on 127.0.0.1:5432 is not reachable ({exc}); start it (see .ci/run)")
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg2://postgres@127.0.0.1:5432/{name}"
    finally:
        with admin.cursor() as cur:
            cur.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
            cur.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.close()


@pytest.fixture()
def no_model_loads(monkeypatch):
    """Any attempt to load a model or tokenizer fails the test."""
    import transformers

    from ilge_search import extraction
    from ilge_search.extraction import LayerEmbedder

    def refuse(*args, **kwargs):
        raise AssertionError("a model or tokenizer was loaded")

    monkeypatch.setattr(extraction, "load_model_and_tokenizer", refuse)
    monkeypatch.setattr(LayerEmbedder, "load", refuse)
    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", refuse)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)
