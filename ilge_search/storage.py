"""The one entrance to study storage: a URL is opened once, here, and passed down as a :class:`Storage`.

:func:`open_storage` opens Optuna's ``RDBStorage`` (SQLite with a busy timeout and ``BEGIN IMMEDIATE``
transactions, PostgreSQL through whichever psycopg is installed, heartbeats) with its artifact folder.
A *finished* trial is COMPLETE or PRUNED (what budgets count), an *ended* one finished or FAIL (what
progress bars count). Faults become one :class:`StorageError` line: a bad URL, a folder a writer cannot
write, a full or read-only database (:func:`storage_fault`), the race of processes creating one schema.
A RUNNING trial whose process is gone is failed and retried (:func:`fail_stale_trials`).
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.util
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
import sqlalchemy
from filelock import FileLock, Timeout
from optuna.artifacts import FileSystemArtifactStore
from optuna.trial import TrialState

from .files import DiskError, check_can_create, check_writable
from .record.worker import is_own_stamp, process_gone, worker_stamp_of
from .settings import default_storage_url

if TYPE_CHECKING:
    import optuna
    import sqlalchemy
    from optuna.artifacts import FileSystemArtifactStore

__all__ = [
    "Storage",
    "StorageError",
    "open_storage",
    "check_storage_url",
    "check_storage_writable",
    "hide_password",
    "artifact_dir_for",
    "sqlite_database",
    "quiet_optuna_warnings",
    "FINISHED_STATES",
    "ENDED_STATES",
    "count_trials",
    "finished_trial_count",
    "fail_stale_trials",
    "fail_waiting_trials",
    "storage_fault",
    "fail_own_running_trials",
    "requeue_trial",
    "copy_study_once",
]

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike


class StorageError(ValueError):
    """The storage URL cannot be opened (bad URL, server down, no driver, no permission, no such file)."""


def _states(*names: str) -> tuple:

    return tuple(TrialState[name] for name in names)


FINISHED_STATES = ("COMPLETE", "PRUNED")
ENDED_STATES = ("COMPLETE", "PRUNED", "FAIL")


def count_trials(study: optuna.Study, states: tuple = FINISHED_STATES) -> int:
    """Trials of ``study`` in ``states`` (names of ``optuna.trial.TrialState``)."""
    return len(study.get_trials(deepcopy=False, states=_states(*states)))


def finished_trial_count(study: optuna.Study) -> int:
    """Complete plus pruned trials of ``study`` (what trial budgets count)."""
    return count_trials(study, FINISHED_STATES)


def hide_password(url: str) -> str:
    """``url`` with its password replaced by ``***`` (unparsable URLs are returned as they are)."""
    try:
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:  # an unparsable URL is reported by whoever opens it
        return url


@contextlib.contextmanager
def quiet_optuna_warnings() -> Iterator[None]:
    """Silence Optuna's experimental-feature and future warnings inside the block."""

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.simplefilter("ignore", FutureWarning)
        yield


def _parse(url: str) -> sqlalchemy.engine.URL:

    if not url.strip():
        raise StorageError(
            "the storage URL is empty; give one such as sqlite:///studies/ilge.db, or leave "
            "--storage out to use that default"
        )
    try:
        return sqlalchemy.engine.make_url(url)
    except sqlalchemy.exc.ArgumentError as exc:
        raise StorageError(
            f"not a database URL: {url!r}; use e.g. sqlite:///studies/ilge.db or postgresql://user@host:5432/db"
        ) from exc


def check_storage_url(url: str) -> None:
    """Refuse an empty or malformed storage URL in one line (:class:`StorageError`), before any other work;
    nothing is opened or created."""
    _parse(url)


def _sqlite_file(parsed: sqlalchemy.engine.URL) -> Path | None:
    """The database file of a SQLite URL (``None`` for other backends and in-memory SQLite)."""
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    return Path(parsed.database).expanduser()


def sqlite_database(storage_url: str) -> Path | None:
    """The database file of a SQLite URL, resolved (``None`` for other backends, in-memory SQLite or an
    unparsable URL)."""
    try:
        database = _sqlite_file(_parse(storage_url))
    except StorageError:
        return None
    return None if database is None else database.resolve()


def artifact_dir_for(storage_url: str, artifact_dir: PathLike | None = None) -> Path:
    """Where the artifact store lives: ``artifact_dir`` if given; for a SQLite file, an ``artifacts`` folder next to it;
    otherwise ``studies/artifacts`` (give ``artifact_dir`` on a shared filesystem for multi-node runs)."""
    if artifact_dir is not None:
        return Path(artifact_dir).expanduser().resolve()
    database = _sqlite_file(_parse(storage_url))
    if database is not None:
        return database.resolve().parent / "artifacts"
    return Path("studies", "artifacts").resolve()


@dataclass
class Storage:
    """An opened study storage: the URL as given, the Optuna ``RDBStorage`` and the artifact folder.

    Build it with :func:`open_storage`. It pickles as its arguments (worker
    processes reopen it from them), never as an open connection.
    """

    url: str
    rdb: optuna.storages.RDBStorage
    artifact_dir: Path
    heartbeat_interval: int | None = None
    grace_period: int | None = None
    max_retry: int = 3

    @property
    def shown_url(self) -> str:
        """The URL with its password hidden: what messages and reports print."""
        return hide_password(self.url)

    @property
    def is_in_memory(self) -> bool:
        parsed = _parse(self.url)
        return parsed.get_backend_name() == "sqlite" and _sqlite_file(parsed) is None

    def artifact_store(self) -> FileSystemArtifactStore:
        """The ``FileSystemArtifactStore`` of :attr:`artifact_dir` (created on first use)."""

        self.artifact_dir.mkdir(parents=True, exist_ok=True)
        return FileSystemArtifactStore(self.artifact_dir)

    def load_study(
        self,
        study_name: str,
        *,
        sampler: optuna.samplers.BaseSampler | None = None,
        pruner: optuna.pruners.BasePruner | None = None,
    ) -> optuna.Study | None:
        """The stored study called ``study_name``, or ``None`` when there is none."""

        try:
            return optuna.load_study(study_name=study_name, storage=self.rdb, sampler=sampler, pruner=pruner)
        except KeyError:
            return None

    def existing_study(self, study_name: str) -> optuna.Study:
        """The stored study called ``study_name``, which a listing of this storage just named."""
        study = self.load_study(study_name)
        if study is None:
            raise ValueError(f"study {study_name!r} left {self.shown_url} while it was read; run the command again")
        return study

    def study_summaries(self) -> list:
        """``optuna.get_all_study_summaries`` of this storage, best trials included."""

        return optuna.get_all_study_summaries(self.rdb, include_best_trial=True)

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return (_reopen, (self.url, str(self.artifact_dir), self.heartbeat_interval, self.grace_period, self.max_retry))


def _reopen(
    url: str, artifact_dir: str, heartbeat_interval: int | None, grace_period: int | None, max_retry: int
) -> Storage:
    return open_storage(
        url,
        artifact_dir=artifact_dir,
        heartbeat_interval=heartbeat_interval,
        grace_period=grace_period,
        max_retry=max_retry,
    )


def _checked_sqlite_file(parsed: sqlalchemy.engine.URL, must_exist: bool, shown: str) -> Path | None:
    """The SQLite file of ``parsed`` (``None``: a server database): a reader's must exist, a writer's must be
    writable."""
    database = _sqlite_file(parsed)
    if database is not None and must_exist and not database.is_file():
        raise StorageError(
            f"no study storage at {parsed.database}; run `ilge-search run` (or `sweep`) first, "
            "or pass the right --storage"
        )
    if database is not None and not must_exist:
        _check_sqlite_writable(database, shown)
    return database


def open_storage(
    url: str | None = None,
    *,
    must_exist: bool = False,
    artifact_dir: PathLike | None = None,
    heartbeat_interval: int | None = None,
    grace_period: int | None = None,
    max_retry: int = 3,
) -> Storage:
    """Open the study storage at ``url`` (default: ``sqlite:///studies/ilge.db``).

    Args:
        url: any Optuna RDB URL. ``postgresql://`` uses whichever of psycopg 3 and psycopg2 is installed.
        must_exist: refuse a SQLite file that does not exist (readers: opening it would create an empty database and
            show nothing). Writers create the file and its folder, and are refused up front when the folder or the file
            cannot be written.
        artifact_dir: the artifact folder (default: :func:`artifact_dir_for`).
        heartbeat_interval: seconds between trial heartbeats (``None``: no heartbeats, for readers). A trial whose
            worker died is marked FAIL once its heartbeat is older than ``grace_period`` (default twice the interval)
            and re-queued up to ``max_retry`` times.

    Several processes may open one new database at once: a SQLite file's schema is created under ``<file>.lock``, and a
    process that loses the race on a server database opens what the winner made.

    Raises:
        StorageError: the URL is empty or malformed, its driver is missing, the SQLite file is missing (``must_exist``),
            or the database cannot be reached or written (read-only, full).
    """
    url = default_storage_url() if url is None else url
    parsed = _parse(url)
    shown = hide_password(url)
    database = _checked_sqlite_file(parsed, must_exist, shown)
    driver_url = _with_installed_driver(parsed) if parsed.drivername == "postgresql" else url
    heartbeat = _heartbeat_kwargs(heartbeat_interval, grace_period, max_retry)
    rdb = _open_rdb(
        _Connection(driver_url, shown, parsed.get_backend_name() == "sqlite"),
        lock_for=database if not must_exist else None,
        heartbeat=heartbeat,
    )
    return Storage(
        url=url,
        rdb=rdb,
        artifact_dir=artifact_dir_for(url, artifact_dir),
        heartbeat_interval=heartbeat_interval,
        grace_period=grace_period,
        max_retry=max_retry,
    )


@dataclass(frozen=True)
class _Connection:
    """Where :func:`_open_rdb` connects: the URL with its driver, the URL as errors show it, and its backend."""

    driver_url: str
    shown: str
    is_sqlite: bool


def _open_rdb(
    connection: _Connection, *, lock_for: Path | None, heartbeat: dict[str, Any]
) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage on ``connection``, its schema created under ``lock_for``'s lock; every failure becomes
    a :class:`StorageError` that says what to do."""

    engine_kwargs: dict[str, Any] = {}
    if connection.is_sqlite:
        # isolation_level=None: pysqlite emits no BEGIN of its own; _begin_immediate does
        engine_kwargs["connect_args"] = {"timeout": 60, "isolation_level": None}
    shown = connection.shown
    try:
        with _schema_lock(lock_for):
            rdb = _create_rdb(connection.driver_url, engine_kwargs, heartbeat)
        if connection.is_sqlite:
            sqlalchemy.event.listen(rdb.engine, "begin", _begin_immediate)
    except (ImportError, sqlalchemy.exc.NoSuchModuleError) as exc:
        raise StorageError(
            f"no database driver for {shown}: {exc}. Install it (PostgreSQL: pip install psycopg2-binary; "
            "MySQL: pip install pymysql)"
        ) from exc
    except sqlalchemy.exc.SQLAlchemyError as exc:
        fault = storage_fault(exc)
        if fault is not None:
            raise StorageError(f"cannot open the study storage {shown}: {fault}") from exc
        reason = getattr(exc, "orig", None) or exc
        raise StorageError(
            f"cannot open the study storage {shown}: {reason}. Check the URL, that the database server is "
            "running and reachable, and that you may write there"
        ) from exc
    return rdb


def _heartbeat_kwargs(heartbeat_interval: int | None, grace_period: int | None, max_retry: int) -> dict[str, Any]:

    if heartbeat_interval is None:
        return {}
    with quiet_optuna_warnings():
        return {
            "heartbeat_interval": int(heartbeat_interval),
            "grace_period": int(grace_period) if grace_period is not None else 2 * int(heartbeat_interval),
            "heartbeat_stale_trial_callback": optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=max_retry),
        }


# how many times a process that lost the schema-creation race reopens the database
SCHEMA_RETRIES = 8


def _is_schema_race(exc: BaseException) -> bool:
    """The loser's side of two processes creating the same tables (every backend words it differently)."""
    text = str(getattr(exc, "orig", None) or exc).lower()
    return any(part in text for part in ("already exists", "duplicate", "unique constraint", "unique violation"))


def _create_rdb(
    driver_url: str, engine_kwargs: dict[str, Any], heartbeat: dict[str, Any]
) -> optuna.storages.RDBStorage:
    """``RDBStorage``; a process that lost the race to create the schema waits and opens what the winner made."""

    for attempt in range(SCHEMA_RETRIES + 1):
        try:
            with quiet_optuna_warnings():
                return optuna.storages.RDBStorage(driver_url, engine_kwargs=engine_kwargs, **heartbeat)
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError, sqlalchemy.exc.OperationalError) as exc:
            if attempt == SCHEMA_RETRIES or not _is_schema_race(exc):
                raise
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


@contextlib.contextmanager
def _schema_lock(database: Path | None) -> Iterator[None]:
    """Hold ``<database>.lock`` while a SQLite file is opened (and its schema created, if new).

    Several processes opening one fresh file would otherwise race to create its tables ("table studies already exists",
    "UNIQUE constraint failed: alembic_version"). Without a writable folder there is no lock; the retries of
    :func:`_create_rdb` still apply.
    """
    if database is None:
        yield
        return

    lock = FileLock(str(database) + ".lock", timeout=300)
    try:
        lock.acquire()
    except (OSError, Timeout) as exc:  # read-only folder, or a lock held for minutes: go on without it
        logger.debug("no schema lock for %s: %s", database, exc)
        yield
        return
    try:
        yield
    finally:
        lock.release()


def check_storage_writable(url: str) -> None:
    """Refuse (:class:`StorageError`) a SQLite storage a writer could not create or write, creating nothing
    (no folder, no file, no lock): what a run checks before its other checks, so a refused run leaves the
    folder as it was. Other backends are checked when they are opened."""
    database = _sqlite_file(_parse(url))
    if database is not None:
        _check_sqlite_writable(database, hide_password(url), create=False)


def _check_sqlite_writable(database: Path, shown: str, *, create: bool = True) -> None:
    """A study writer needs the SQLite file and its folder (SQLite puts its journal next to the file); the
    folder is made when ``create``."""
    fix = "make it writable or pass another --storage, e.g. sqlite:///$HOME/studies/ilge.db"
    try:
        if create or database.parent.is_dir():  # an existing folder is only written to, never made
            check_writable(database.parent, "the study storage folder", fix)
        else:
            check_can_create(database.parent, "the study storage folder", fix)
        if database.exists():
            os.close(os.open(database, os.O_WRONLY))
    except DiskError as exc:
        raise StorageError(f"cannot write the study storage {shown}: {exc}") from None
    except OSError as exc:
        raise StorageError(f"cannot write the study storage {shown} ({exc.strerror or exc}); {fix}") from exc


# ----------------------------------------------------------------------------- faults while writing

_FULL = ("database or disk is full", "no space left on device", "disk full", "could not extend file")
_READ_ONLY = ("attempt to write a readonly database", "read-only file system", "readonly database")


def storage_fault(exc: BaseException) -> str | None:
    """What went wrong, as one sentence with the fix, when ``exc`` (or an exception it was raised
    from or while handling) is the database running out of space or refusing writes; else ``None``.

    Only database errors are recognised (a full embedding cache is the cache's business).
    """

    seen = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, sqlalchemy.exc.DBAPIError):
            text = str(current.orig if current.orig is not None else current).lower()
            if any(part in text for part in _FULL):
                return (
                    "the database or its disk is full. Free space on its filesystem (or move the storage, "
                    "--storage), then rerun the same command: finished trials are kept and an interrupted "
                    "trial is retried"
                )
            if any(part in text for part in _READ_ONLY):
                return (
                    "the database is read-only. Make the file and its folder writable or pass another "
                    "--storage, then rerun the same command"
                )
            if "disk i/o error" in text:
                return (
                    "the disk reported an I/O error. Check the filesystem (space, quota, health), then "
                    "rerun the same command"
                )
        current = current.__cause__ or current.__context__
    return None


def _begin_immediate(connection: sqlalchemy.engine.Connection) -> None:
    """Start every SQLite transaction holding the write lock.

    pysqlite's default deferred transactions let two processes both read a WAITING trial and both mark it RUNNING
    (SQLite ignores SELECT ... FOR UPDATE), so an enqueued trial would run once per worker; and two readers upgrading to
    writers at once fail with "database is locked" without waiting for the busy timeout. ``BEGIN IMMEDIATE`` makes each
    transaction wait its turn.
    """
    connection.exec_driver_sql("BEGIN IMMEDIATE")


def _with_installed_driver(parsed: sqlalchemy.engine.URL) -> str:
    """``postgresql://`` means psycopg 3 to SQLAlchemy 2.1 but psycopg2 to older
    releases; use whichever of the two is installed so the URL works unchanged."""
    for module, driver in (("psycopg", "postgresql+psycopg"), ("psycopg2", "postgresql+psycopg2")):
        if importlib.util.find_spec(module) is not None:
            return parsed.set(drivername=driver).render_as_string(hide_password=False)
    return parsed.render_as_string(hide_password=False)


# ----------------------------------------------------------------------------- failing trials whose worker died


def _retry_callback(storage: Storage) -> Callable[[optuna.Study, optuna.trial.FrozenTrial], None]:

    callback = storage.rdb.get_heartbeat_stale_trial_callback()
    if callback is None:
        with quiet_optuna_warnings():
            callback = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=storage.max_retry)
    return callback


def _fail_and_retry(
    study: optuna.Study, storage: Storage, trial: optuna.trial.FrozenTrial, why: str, *, retry: bool = True
) -> bool:

    try:
        failed = storage.rdb.set_trial_state_values(trial._trial_id, state=optuna.trial.TrialState.FAIL)
    except optuna.exceptions.UpdateFinishedTrialError:  # another process got there first
        return False
    if failed:
        logger.warning("trial %d: %s; marked FAIL%s", trial.number, why, " and re-queued" if retry else "")
        if retry:
            _retry_callback(storage)(study, storage.rdb.get_trial(trial._trial_id))
    return bool(failed)


def fail_waiting_trials(study: optuna.Study, storage: Storage) -> list[int]:
    """Mark FAIL every WAITING trial of ``study``, for studies no sampler ever asks for a trial (the portfolio's
    cells are claimed RUNNING, never queued): a queued copy there waits forever. Returns their numbers."""

    numbers = []
    for trial in study.get_trials(deepcopy=False, states=_states("WAITING")):
        with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
            if storage.rdb.set_trial_state_values(trial._trial_id, state=optuna.trial.TrialState.FAIL):
                numbers.append(trial.number)
    return numbers


def fail_own_running_trials(
    study: optuna.Study, storage: Storage, reason: str = "stopped by a storage fault"
) -> list[int]:
    """Fail (and re-queue) the RUNNING trials of this process, as far as the storage still takes writes.

    Called when a storage fault or an interrupt stopped a trial half-way (an interrupt between the trial's
    creation and its objective leaves it RUNNING: Optuna fails only a trial whose objective ran); what cannot
    be written now is repaired by the next run (:func:`fail_stale_trials`). Returns their numbers.
    """
    numbers: list[int] = []
    try:
        running = study.get_trials(deepcopy=False, states=_states("RUNNING"))
    except Exception:  # the storage may be unreadable too; the next run repairs it
        return numbers
    for trial in running:
        if is_own_stamp(worker_stamp_of(trial), trial.number):
            numbers.append(trial.number)
            with contextlib.suppress(Exception):
                _fail_and_retry(study, storage, trial, reason)
    return numbers


def fail_stale_trials(study: optuna.Study, storage: Storage, *, retry: bool = True) -> None:
    """Fail and retry (up to ``max_retry`` times; with ``retry=False`` never) RUNNING trials whose worker died.

    - A trial whose process (:data:`~ilge_search.record.worker.WORKER_ATTR`) is gone on this host is failed at once.
    - With heartbeats, Optuna's :func:`optuna.storages.fail_stale_trials` fails trials whose heartbeat is older than the
      grace period (other hosts).
    - A worker killed between ``study.ask()`` and its heartbeat thread's first beat (the sampler runs in between) leaves
      a trial with no heartbeat at all; it is failed once it started more than the grace period ago. The heartbeat table
      is read with plain SQL on the storage's public engine.

    ``storage`` is the opened storage ``study`` lives in (Optuna wraps it in a cache that hides the heartbeat settings).
    """

    for trial in study.get_trials(deepcopy=False, states=_states("RUNNING")):
        stamp = worker_stamp_of(trial)
        if process_gone(stamp, trial.number) and isinstance(stamp, dict):
            _fail_and_retry(study, storage, trial, f"its process {stamp['pid']} on this host is gone", retry=retry)
    rdb = storage.rdb
    interval = getattr(rdb, "heartbeat_interval", None)
    if interval is None:
        return
    with quiet_optuna_warnings():
        optuna.storages.fail_stale_trials(study)
    running = study.get_trials(deepcopy=False, states=_states("RUNNING"))
    if not running:
        return
    grace = rdb.grace_period if rdb.grace_period is not None else 2 * interval
    ids = [t._trial_id for t in running]
    query = sqlalchemy.text("SELECT trial_id FROM trial_heartbeats WHERE trial_id IN :ids").bindparams(
        sqlalchemy.bindparam("ids", expanding=True)
    )
    with rdb.engine.connect() as connection:
        beating = {row[0] for row in connection.execute(query, {"ids": ids})}
    now = datetime.datetime.now()  # the clock Optuna stamps datetime_start with
    for trial in running:
        if trial._trial_id in beating or trial.datetime_start is None:
            continue
        if (now - trial.datetime_start).total_seconds() <= grace:
            continue  # maybe a live worker still between ask() and its first heartbeat
        _fail_and_retry(study, storage, trial, "it never sent a heartbeat (its worker died)", retry=retry)


def requeue_trial(study: optuna.Study, storage: Storage, trial: optuna.trial.FrozenTrial) -> bool:
    """Queue a copy of the failed ``trial`` (same parameters and user attrs), as a heartbeat retry
    would; ``False`` once it was retried ``max_retry`` times."""
    waiting = count_trials(study, ("WAITING",))
    _retry_callback(storage)(study, trial)
    return count_trials(study, ("WAITING",)) > waiting


_COPIED_ATTR = "ilge_copied_from"  # study system attr: the source's URL once a copy is whole
_PARTIAL = "partial copy of "


def copy_study_once(source: Storage, target: Storage, study_name: str) -> bool:
    """Copy ``study_name`` (its attrs and every trial) from ``source`` into ``target`` unless ``target`` holds a
    whole copy already; whether it copied. A copy cut short is deleted and made again, so a driver that copies
    a study and then resumes it in another storage can be rerun (as ``optuna.copy_study``, with a mark saying
    whether the copy is whole).

    Raises:
        StorageError: ``source`` has no such study, or ``target`` holds one of that name that is no copy of it.
    """

    original = source.load_study(study_name)
    if original is None:
        raise StorageError(f"{source.shown_url} has no study {study_name!r} to copy")
    existing = target.load_study(study_name)
    if existing is not None:
        mark = target.rdb.get_study_system_attrs(existing._study_id).get(_COPIED_ATTR)
        if mark == source.shown_url:
            return False
        if mark != _PARTIAL + source.shown_url:
            raise StorageError(
                f"{target.shown_url} already holds a study {study_name!r} that is no copy of {source.shown_url}; "
                "copy into a fresh storage"
            )
        optuna.delete_study(study_name=study_name, storage=target.rdb)
    copy = optuna.create_study(study_name=study_name, storage=target.rdb, directions=original.directions)
    target.rdb.set_study_system_attr(copy._study_id, _COPIED_ATTR, _PARTIAL + source.shown_url)
    for key, value in source.rdb.get_study_system_attrs(original._study_id).items():
        if key != _COPIED_ATTR:
            target.rdb.set_study_system_attr(copy._study_id, key, value)
    for key, value in original.user_attrs.items():
        target.rdb.set_study_user_attr(copy._study_id, key, value)
    for trial in original.get_trials(deepcopy=False):
        target.rdb.create_new_trial(copy._study_id, template_trial=trial)
    target.rdb.set_study_system_attr(copy._study_id, _COPIED_ATTR, source.shown_url)
    return True
