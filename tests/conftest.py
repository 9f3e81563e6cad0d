"""Shared fixtures: the synthetic setup (a tiny model, made-up tasks and their cached synthetic embeddings: the
fast loop's studies load no language model), real task data from ../shared/datasets with one embedding cache per
session (the ``realmodel`` tests), and the check that only ``realmodel`` tests load a language model.

What the suite needs from outside the repository (the full task data, a PostgreSQL server, headless Chromium) is
probed once, when the session starts. A test that needs something missing is skipped with one line naming it,
so ``make test`` passes in a bare clone; ``ILGE_SEARCH_REQUIRE_ALL=1`` (set by ``.ci/run``) turns each such skip
into a failure, so CI runs everything."""

from __future__ import annotations

import ast
import importlib.abc
import importlib.util
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from ilge_search.embeddings.cache import ExtractionSettings

pytest_plugins = ["pytester"]  # tests/test_skips_announced.py runs the summary on a made-up suite

REPO_ROOT = Path(__file__).resolve().parents[1]

# One torch (OpenMP) thread per test process and for the CLI subprocesses it starts, unless the caller set
# another count: the tests' tensors are tiny, and a second thread mostly spins, which nearly doubled the quick
# tests' CPU time on 2 shared cores (docs/contributing.md: How long it takes). Set before torch is imported.
os.environ.setdefault("OMP_NUM_THREADS", "1")


REQUIRE_ALL_ENV = "ILGE_SEARCH_REQUIRE_ALL"
POSTGRES_ENV = "ILGE_TEST_POSTGRES"
POSTGRES_DEFAULT = "postgresql://postgres@127.0.0.1:5432/test"
# the tasks of the shared data the tests read; a data folder without any of them counts as missing
NEEDED_TASKS = ("banking77", "trec", "sst2", "stsb", "emotion", "ud_ewt_pos")


def _data_dir() -> Path:
    env = os.environ.get("ILGE_SEARCH_DATA")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "datasets"


def _require_all() -> bool:
    return os.environ.get(REQUIRE_ALL_ENV, "") not in ("", "0")


def _missing_data() -> str | None:
    path = _data_dir()
    absent = [task for task in NEEDED_TASKS if not (path / task / "train.jsonl").is_file()]
    if not absent:
        return None
    return (
        f"needs the full task data ({', '.join(absent)} not found in {path}): "
        "set ILGE_SEARCH_DATA to the shared datasets folder (docs/guide.md: Where task data comes from)"
    )


def _postgres_admin_url():
    from sqlalchemy.engine import make_url

    return make_url(os.environ.get(POSTGRES_ENV) or POSTGRES_DEFAULT)


def _missing_postgres() -> str | None:
    try:
        import psycopg2
    except ImportError:
        return "needs psycopg2 (pip install -e '.[dev]') for the PostgreSQL tests"
    url = _postgres_admin_url()
    try:
        psycopg2.connect(
            host=url.host or "127.0.0.1",
            port=url.port or 5432,
            dbname=url.database,
            user=url.username,
            password=url.password,
            connect_timeout=3,
        ).close()
    except psycopg2.OperationalError as exc:
        why = " ".join(str(exc).split())[:120]
        return (
            f"needs a PostgreSQL server at {url.render_as_string(hide_password=True)} ({why}): start one or set "
            f"{POSTGRES_ENV} (docs/contributing.md: What the tests need)"
        )
    return None


def _chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _missing_chromium() -> str | None:
    if _chromium_path():
        return None
    return "needs headless Chromium: apt-get install -y chromium (docs/contributing.md: What the tests need)"


# what each outside need is, how a test shows it has it, and how to probe for it (once per session)
_NEEDS = {
    "task data": _missing_data,
    "postgres": _missing_postgres,
    "chromium": _missing_chromium,
}
_PROBED: dict[str, str | None] = {}


def _uses(item, need: str) -> bool:
    names = getattr(item, "fixturenames", ())
    if need == "task data":
        return "data_dir" in names
    if need == "chromium":
        return "chromium" in names
    return item.get_closest_marker("postgres") is not None


def missing(need: str) -> str | None:
    """Why ``need`` (``task data``, ``postgres``, ``chromium``) is not available here, or None; probed once."""
    if need not in _PROBED:
        _PROBED[need] = _NEEDS[need]()
    return _PROBED[need]


def _refuse(need: str) -> None:
    """In a test that needs ``need``, when it is missing: fail under ``ILGE_SEARCH_REQUIRE_ALL``, else skip."""
    why = missing(need)
    if why is None:
        return
    if _require_all():
        pytest.fail(f"{why} ({REQUIRE_ALL_ENV} is set, so nothing may be skipped)")
    pytest.skip(why)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    _refuse("task data")
    return _data_dir()


@pytest.fixture(scope="session")
def chromium() -> str:
    """The headless Chromium binary (the dashboard page test renders the page with it)."""
    _refuse("chromium")
    path = _chromium_path()
    assert path is not None
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
    from ilge_search.embeddings.cache import load_task_embeddings
    from ilge_search.study.data import DataSpec, load_task_data

    task = load_task_data(DataSpec(model=REAL_MODEL, task="trec", data_dir=str(data_dir), **TREC_SUBSET))
    load_task_embeddings(
        REAL_MODEL,
        task,
        cache_dir=cache_dir,
        splits=["train", "validation", "test"],
        progress=False,
        settings=ExtractionSettings(device="cpu"),
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


_SKIPPED: dict[str, int] = {}  # need -> how many collected tests skip for it


@pytest.hookimpl(trylast=True)  # after -m / -k deselected: only the tests that run are probed for
def pytest_collection_modifyitems(config, items):
    """A test that uses the PostgreSQL server is marked ``postgres``, so ``-m "not postgres"`` leaves it out:
    one that asks for ``postgres_url``, or a parametrised one whose parameter is ``"postgresql"`` (the
    storage fixtures that run a test once per storage kind). Then each outside need of the selected tests is
    probed once; without ``ILGE_SEARCH_REQUIRE_ALL`` the tests whose need is missing are marked skipped with
    one line saying what they need."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "postgres_url" in getattr(item, "fixturenames", ()) or any(
            isinstance(value, str) and value == "postgresql" for value in params.values()
        ):
            item.add_marker(pytest.mark.postgres)
    if _require_all():
        return  # every need is checked where it is used, and a missing one fails there
    for item in items:
        for need in _NEEDS:
            if _uses(item, need) and (why := missing(need)) is not None:
                item.add_marker(pytest.mark.skip(reason=why))
                _SKIPPED[need] = _SKIPPED.get(need, 0) + 1
                break


def pytest_collection_finish(session):
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    for need, count in _SKIPPED.items():
        reporter.write_line(f"skipping {count} test(s): {missing(need)}")


@pytest.fixture()
def postgres_url():
    """A fresh, empty PostgreSQL database, dropped afterwards.

    It is created from the database at ``$ILGE_TEST_POSTGRES`` (default: user ``postgres``, trust
    authentication, database ``test`` on 127.0.0.1:5432, the server ``.ci/run`` starts), whose user
    must be allowed to create databases.
    """
    import uuid

    from sqlalchemy.engine import make_url

    _refuse("postgres")
    import psycopg2

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


# ----------------------------------------------------------------------------- docs pages that name tests


def _function_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def check_page_names_tests(page: str, *, minimum: int, markers: tuple[str, ...] = ("::",)) -> None:
    """The check of a page that lists guarantees with the tests that check them (``docs/guarantees.md``,
    ``docs/reliability.md``): every ``tests/...py`` and ``tests/...py::name`` it names exists (a bare
    ``::name`` belongs to the file named last before it), every bullet holds one of ``markers``, and the page
    names at least ``minimum`` tests or files."""
    text = (REPO_ROOT / page).read_text(encoding="utf-8")
    references: list[tuple[str, str | None]] = []
    current = None
    for match in re.finditer(r"(tests/[\w/]+\.py)(?:::(\w+))?|(?<![\w/.])::(\w+)", text):
        if match.group(1):
            current = match.group(1)
            references.append((current, match.group(2)))
        else:
            assert current is not None, f"{page}: ::{match.group(3)} names no file before it"
            references.append((current, match.group(3)))
    missing = []
    for file, name in references:
        path = REPO_ROOT / file
        if not path.is_file():
            missing.append(file)
        elif name is not None and name not in _function_names(path):
            missing.append(f"{file}::{name}")
    assert not missing, f"{page} names tests that do not exist: {missing}"
    bullets = re.split(r"\n- ", text)[1:]
    assert bullets and all(any(marker in bullet for marker in markers) for bullet in bullets), (
        f"a guarantee on {page} names no test"
    )
    assert len(references) >= minimum, f"{page} names {len(references)} tests, fewer than {minimum}"


@pytest.fixture(scope="session")
def page_names_tests():
    """:func:`check_page_names_tests`, for the test modules (in ``tests/`` and ``tests/reliability/``) that
    check a guarantees page."""
    return check_page_names_tests


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


_SKIP_REASONS: dict[str, int] = {}  # why -> how many tests skipped for it (outside needs and announced_skips)


def pytest_runtest_logreport(report):
    """Count every skipped test by its reason, whatever skipped it, for the summary's lines."""
    if report.skipped and not hasattr(report, "wasxfail") and isinstance(report.longrepr, tuple):
        why = str(report.longrepr[2]).removeprefix("Skipped: ")
        _SKIP_REASONS[why] = _SKIP_REASONS.get(why, 0) + 1


def pytest_terminal_summary(terminalreporter):
    for why, count in _SKIP_REASONS.items():
        terminalreporter.write_line(f"skipped {count} test(s): {why}")
    if _LOADS:
        files = sorted({test.split("::")[0] for test in _LOADS})
        loads = sum(len(models) for models in _LOADS.values())
        terminalreporter.write_line(
            f"language-model loads: {loads} by {len(_LOADS)} test(s) in {len(files)} file(s): {', '.join(files)}"
        )


@pytest.fixture(scope="session")
def _ilge_loggers_at_start():
    """The package's loggers as the session found them (before any module-scoped fixture ran a command)."""
    import logging

    return {name: (log.level, list(log.handlers)) for name, log in _ilge_loggers(logging).items()}


def _ilge_loggers(logging) -> dict:
    names = [name for name in list(logging.root.manager.loggerDict) if name.startswith("ilge_search")]
    return {name: logging.getLogger(name) for name in names}


@pytest.fixture(autouse=True)
def _ilge_loggers_restored(_ilge_loggers_at_start):
    """A command run in-process (``--quiet`` sets the study loggers to WARNING, each gets a handler) changes
    process-wide loggers; after each test they are as the session found them, so a later ``caplog`` hears them."""
    import logging

    yield
    for name, log in _ilge_loggers(logging).items():
        level, handlers = _ilge_loggers_at_start.get(name, (logging.NOTSET, []))
        log.setLevel(level)
        log.handlers[:] = handlers
