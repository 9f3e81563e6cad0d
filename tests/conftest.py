"""Shared fixtures: the synthetic setup (a tiny model, made-up tasks and their cached synthetic embeddings: the
fast loop's studies load no language model), real task data from ../shared/datasets with one embedding cache per
session (the ``realmodel`` tests), and the check that only ``realmodel`` tests load a language model."""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

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


REAL_MODEL = "minilm-l6"
TREC_SUBSET = dict(max_train=240, max_eval=160)  # the real-model runner tests' subset


@pytest.fixture(scope="session")
def trec_cached(data_dir, cache_dir) -> Path:
    """The session cache holding minilm-l6's train, validation and test embeddings of the trec subset
    ``TREC_SUBSET`` (extracted once per session: a real model loads)."""
    from ilge_search.cache import load_task_embeddings
    from ilge_search.study.data import DataSpec, load_task_data

    task = load_task_data(DataSpec(model=REAL_MODEL, task="trec", data_dir=str(data_dir), **TREC_SUBSET))
    load_task_embeddings(
        REAL_MODEL, task, cache_dir=cache_dir, splits=["train", "validation", "test"], device="cpu", progress=False
    )
    return cache_dir


# ----------------------------------------------------------------------------- the synthetic setup

# the made-up tasks of the synthetic data dir, under registered names so they keep their kind and metric
SYNTHETIC_TASKS = {
    "trec": dict(num_labels=6, sizes=(300, 120, 120)),
    "sst2": dict(num_labels=2, sizes=(160, 80, 80)),
    "stsb": dict(kind="similarity", sizes=(200, 80, 80)),
    "sick": dict(kind="similarity", sizes=(0, 0, 80)),  # sick_r, scored zero-shot on its test split
}


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    """A random tiny BERT folder (``ilge_search.testing.write_tiny_model``): 5 hidden states of 64 features."""
    from ilge_search.testing import write_tiny_model

    return str(write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-bert"))


@pytest.fixture(scope="session")
def synthetic_data_dir(tmp_path_factory) -> Path:
    """A data dir in the shared layout whose tasks (``SYNTHETIC_TASKS``) are made up."""
    from ilge_search.testing import SyntheticTask, write_task

    root = tmp_path_factory.mktemp("synthetic-data")
    for folder, fields in SYNTHETIC_TASKS.items():
        write_task(root / folder, SyntheticTask(**fields))
    return root


@pytest.fixture(scope="session")
def synthetic(tiny_model, synthetic_data_dir, tmp_path_factory):
    """The tiny model, the synthetic data dir and a session cache for their synthetic embeddings (the label
    in the last layer, ``LayerSignal()``): call ``synthetic.cache(task, **data options)`` before a study with
    those options, then no model loads."""
    from ilge_search.testing import SyntheticSetup

    return SyntheticSetup(tiny_model, synthetic_data_dir, tmp_path_factory.mktemp("synthetic-cache"))


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
def no_model_loads():
    """Any attempt to load a model or tokenizer fails the test (``ilge_search.testing.refuse_model_loads``;
    a module-scoped fixture that must load nothing uses that block itself)."""
    from ilge_search.testing import refuse_model_loads

    with refuse_model_loads():
        yield


# ----------------------------------------------------------------------------- language-model loads

# Above this many parameters a loaded model counts as a language model (MiniLM-L6 has 22.7M, the tiny BERT
# of the synthetic setup 0.1M).
LANGUAGE_MODEL_PARAMETERS = 5_000_000
_LOADS: dict[str, list[str]] = {}  # test id -> the language models it (or a fixture it set up) loaded
_RUNNING: dict[str, str | None] = {"test": None}


def _count_language_model_loads(modeling_utils: Any) -> None:
    """Wrap ``PreTrainedModel.from_pretrained`` (every transformers model load goes through it) so that each
    language-model load in this process is recorded under the running test."""
    base = modeling_utils.PreTrainedModel
    original = base.from_pretrained.__func__

    def from_pretrained(cls, *args, **kwargs):
        model = original(cls, *args, **kwargs)
        if _RUNNING["test"] is not None and model.num_parameters() > LANGUAGE_MODEL_PARAMETERS:
            name = args[0] if args else kwargs.get("pretrained_model_name_or_path")
            _LOADS.setdefault(_RUNNING["test"], []).append(str(name))
        return model

    base.from_pretrained = classmethod(from_pretrained)


class _WrapOnImport(importlib.abc.MetaPathFinder):
    """Wraps the loader once ``transformers.modeling_utils`` is imported, so sessions that never load a model
    never import transformers for this."""

    def find_spec(self, name, path, target=None):
        if name != "transformers.modeling_utils":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            _count_language_model_loads(module)

        spec.loader.exec_module = exec_module
        return spec


if "transformers.modeling_utils" in sys.modules:
    _count_language_model_loads(sys.modules["transformers.modeling_utils"])
else:
    sys.meta_path.insert(0, _WrapOnImport())


def pytest_runtest_logstart(nodeid, location):
    _RUNNING["test"] = nodeid  # before setup: a load in a fixture counts for the first test that needs it


@pytest.fixture(autouse=True)
def _only_realmodel_tests_load_language_models(request):
    """A test that loads a language model in this process must be marked ``realmodel`` (then ``-m "not
    realmodel"`` really leaves every load out); the fast loop's study tests use the synthetic setup instead.
    Loads in subprocesses (CLI tests) are not seen here."""
    yield
    loaded = _LOADS.get(request.node.nodeid)
    if loaded and request.node.get_closest_marker("realmodel") is None:
        pytest.fail(
            f"this test loads the language model(s) {sorted(set(loaded))} but is not marked realmodel: "
            "mark it (and slow when over ~10 s), or use the synthetic setup (the `synthetic` fixture)"
        )


def pytest_terminal_summary(terminalreporter):
    if _LOADS:
        files = sorted({test.split("::")[0] for test in _LOADS})
        loads = sum(len(models) for models in _LOADS.values())
        terminalreporter.write_line(
            f"language-model loads: {loads} by {len(_LOADS)} test(s) in {len(files)} file(s): {', '.join(files)}"
        )
