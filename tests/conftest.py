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


POSTGRES_ENV = "ILGE_TEST_POSTGRES"
POSTGRES_DEFAULT = "postgresql://postgres@127.0.0.1:5432/test"


def pytest_collection_modifyitems(items):
    """A test that uses the PostgreSQL server is marked ``postgres``, so ``-m "not postgres"`` leaves it out:
    one that asks for ``postgres_url``, or a parametrised one whose parameter is ``"postgresql"`` (the
    storage fixtures that run a test once per storage kind)."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "postgres_url" in getattr(item, "fixturenames", ()) or any(
            isinstance(value, str) and value == "postgresql" for value in params.values()
        ):
            item.add_marker(pytest.mark.postgres)


@pytest.fixture()
def postgres_url():
    """A fresh, empty PostgreSQL database, dropped afterwards.

    It is created from the database at ``$ILGE_TEST_POSTGRES`` (default: user ``postgres``, trust
    authentication, database ``test`` on 127.0.0.1:5432, the server ``.ci/run`` starts), whose user
    must be allowed to create databases.
    """
    import uuid

    from sqlalchemy.engine import make_url

    psycopg2 = pytest.importorskip("psycopg2")
    admin_url = make_url(os.environ.get(POSTGRES_ENV) or POSTGRES_DEFAULT)
    name = f"ilge_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg2.connect(
            host=admin_url.host or "127.0.0.1",
            port=admin_url.port or 5432,
            dbname=admin_url.database,
            user=admin_url.username,
            password=admin_url.password,
        )
    except psycopg2.OperationalError as exc:  # fail loudly: a skipped storage test hides a broken storage
        shown, why = admin_url.render_as_string(hide_password=True), " ".join(str(exc).split())
        pytest.fail(
            f"PostgreSQL at {shown} is not reachable ({why}); start it, set {POSTGRES_ENV} to another "
            f"server, or leave these tests out with -m 'not postgres' (README: What you need)"
        )
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    try:
        yield admin_url.set(drivername="postgresql+psycopg2", database=name).render_as_string(hide_password=False)
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
