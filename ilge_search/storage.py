"""The one entrance to study storage: a URL is opened once, here, and passed down as a :class:`Storage`.

:func:`open_storage` parses an Optuna RDB URL, opens the ``RDBStorage`` (SQLite
with a busy timeout and ``BEGIN IMMEDIATE`` transactions, PostgreSQL with
whichever psycopg is installed, heartbeats for dead-worker detection) and
knows the artifact folder that goes with it. Everything that reads or writes
studies -- the runner, its workers, sweeps, reports, ``recommend`` and the
dashboard -- takes the :class:`Storage` (or its ``rdb``) instead of a URL.

It also owns the vocabulary of stored trials: a *finished* trial is COMPLETE
or PRUNED (what trial budgets count); an *ended* trial is finished or FAIL
(what progress bars count); see ``ARCHITECTURE.md``.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.util
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Union

from .settings import default_storage_url

__all__ = [
    "Storage",
    "StorageError",
    "open_storage",
    "hide_password",
    "artifact_dir_for",
    "quiet_optuna_warnings",
    "FINISHED_STATES",
    "ENDED_STATES",
    "count_trials",
    "finished_trial_count",
    "fail_stale_trials",
]

logger = logging.getLogger(__name__)

PathLike = Union[str, os.PathLike]


class StorageError(ValueError):
    """The storage URL cannot be opened (bad URL, server down, no driver, no permission, no such file)."""


def _states(*names: str) -> tuple:
    from optuna.trial import TrialState

    return tuple(TrialState[name] for name in names)


FINISHED_STATES = ("COMPLETE", "PRUNED")
ENDED_STATES = ("COMPLETE", "PRUNED", "FAIL")


def count_trials(study: Any, states: tuple = FINISHED_STATES) -> int:
    """Trials of ``study`` in ``states`` (names of ``optuna.trial.TrialState``)."""
    return len(study.get_trials(deepcopy=False, states=_states(*states)))


def finished_trial_count(study: Any) -> int:
    """Complete plus pruned trials of ``study`` (what trial budgets count)."""
    return count_trials(study, FINISHED_STATES)


def hide_password(url: str) -> str:
    """``url`` with its password replaced by ``***`` (unparsable URLs are returned as they are)."""
    try:
        import sqlalchemy

        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:  # an unparsable URL is reported by whoever opens it
        return url


@contextlib.contextmanager
def quiet_optuna_warnings() -> Iterator[None]:
    """Silence Optuna's experimental-feature and future warnings inside the block."""
    import warnings

    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.simplefilter("ignore", FutureWarning)
        yield


def _parse(url: str) -> Any:
    import sqlalchemy

    try:
        return sqlalchemy.engine.make_url(url)
    except sqlalchemy.exc.ArgumentError as exc:
        raise StorageError(
            f"not a database URL: {url!r}; use e.g. sqlite:///studies/ilge.db or postgresql://user@host:5432/db"
        ) from exc


def _sqlite_file(parsed: Any) -> Optional[Path]:
    """The database file of a SQLite URL (``None`` for other backends and in-memory SQLite)."""
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    return Path(parsed.database).expanduser()


def artifact_dir_for(storage_url: str, artifact_dir: Optional[PathLike] = None) -> Path:
    """Where the artifact store lives: ``artifact_dir`` if given; for a SQLite file,
    an ``artifacts`` folder next to it; otherwise ``studies/artifacts`` (give
    ``artifact_dir`` on a shared filesystem for multi-node runs)."""
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
    rdb: Any
    artifact_dir: Path
    heartbeat_interval: Optional[int] = None
    grace_period: Optional[int] = None
    max_retry: int = 3

    @property
    def shown_url(self) -> str:
        """The URL with its password hidden: what messages and reports print."""
        return hide_password(self.url)

    @property
    def is_in_memory(self) -> bool:
        parsed = _parse(self.url)
        return parsed.get_backend_name() == "sqlite" and _sqlite_file(parsed) is None

    def artifact_store(self) -> Any:
        """The ``FileSystemArtifactStore`` of :attr:`artifact_dir` (created on first use)."""
        from optuna.artifacts import FileSystemArtifactStore

        self.artifact_dir.mkdir(parents=True, exist_ok=True)
        return FileSystemArtifactStore(self.artifact_dir)

    def load_study(self, study_name: str, *, sampler: Any = None, pruner: Any = None) -> Optional[Any]:
        """The stored study called ``study_name``, or ``None`` when there is none."""
        import optuna

        try:
            return optuna.load_study(study_name=study_name, storage=self.rdb, sampler=sampler, pruner=pruner)
        except KeyError:
            return None

    def study_summaries(self) -> list:
        """``optuna.get_all_study_summaries`` of this storage, best trials included."""
        import optuna

        return optuna.get_all_study_summaries(self.rdb, include_best_trial=True)

    def __reduce__(self) -> Any:
        return (_reopen, (self.url, str(self.artifact_dir), self.heartbeat_interval, self.grace_period,
                          self.max_retry))


def _reopen(url: str, artifact_dir: str, heartbeat_interval: Optional[int], grace_period: Optional[int],
            max_retry: int) -> Storage:
    return open_storage(url, artifact_dir=artifact_dir, heartbeat_interval=heartbeat_interval,
                        grace_period=grace_period, max_retry=max_retry)


def open_storage(url: Optional[str] = None, *, must_exist: bool = False, artifact_dir: Optional[PathLike] = None,
                 heartbeat_interval: Optional[int] = None, grace_period: Optional[int] = None,
                 max_retry: int = 3) -> Storage:
    """Open the study storage at ``url`` (default: ``sqlite:///studies/ilge.db``).

    Args:
        url: any Optuna RDB URL. ``postgresql://`` uses whichever of psycopg 3
            and psycopg2 is installed.
        must_exist: refuse a SQLite file that does not exist (readers: opening
            it would create an empty database and show nothing). Writers create
            the file and its folder.
        artifact_dir: the artifact folder (default: :func:`artifact_dir_for`).
        heartbeat_interval: seconds between trial heartbeats (``None``: no
            heartbeats, for readers). A trial whose worker died is marked FAIL
            once its heartbeat is older than ``grace_period`` (default twice the
            interval) and re-queued up to ``max_retry`` times.

    Raises:
        StorageError: the URL is malformed, its driver is missing, the SQLite
            file is missing (``must_exist``), or the database cannot be reached
            or written.
    """
    import optuna
    import sqlalchemy

    url = url or default_storage_url()
    parsed = _parse(url)
    database = _sqlite_file(parsed)
    if must_exist and database is not None and not database.is_file():
        raise StorageError(f"no study storage at {parsed.database}; run `ilge-search run` (or `sweep`) first, "
                           "or pass the right --storage")
    driver_url = _with_installed_driver(parsed) if parsed.drivername == "postgresql" else url
    engine_kwargs: Dict[str, Any] = {}
    is_sqlite = parsed.get_backend_name() == "sqlite"
    if is_sqlite:
        # isolation_level=None: pysqlite emits no BEGIN of its own; _begin_immediate does
        engine_kwargs["connect_args"] = {"timeout": 60, "isolation_level": None}
        if database is not None:
            database.parent.mkdir(parents=True, exist_ok=True)
    heartbeat: Dict[str, Any] = {}
    shown = hide_password(url)
    try:
        with quiet_optuna_warnings():
            if heartbeat_interval is not None:
                heartbeat = {
                    "heartbeat_interval": int(heartbeat_interval),
                    "grace_period": int(grace_period) if grace_period is not None else 2 * int(heartbeat_interval),
                    "heartbeat_stale_trial_callback":
                        optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=max_retry),
                }
            try:
                rdb = optuna.storages.RDBStorage(driver_url, engine_kwargs=engine_kwargs, **heartbeat)
            except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError) as exc:
                # workers starting together on an empty database race to create the schema;
                # the loser sees "already exists" and simply opens what the winner made
                if "already exists" not in str(exc) and "Duplicate" not in str(exc):
                    raise
                time.sleep(1.0)
                rdb = optuna.storages.RDBStorage(driver_url, engine_kwargs=engine_kwargs, **heartbeat)
        if is_sqlite:
            sqlalchemy.event.listen(rdb.engine, "begin", _begin_immediate)
    except (ImportError, sqlalchemy.exc.NoSuchModuleError) as exc:
        raise StorageError(
            f"no database driver for {shown}: {exc}. Install it (PostgreSQL: pip install psycopg2-binary; "
            "MySQL: pip install pymysql)"
        ) from exc
    except sqlalchemy.exc.SQLAlchemyError as exc:
        reason = getattr(exc, "orig", None) or exc
        raise StorageError(
            f"cannot open the study storage {shown}: {reason}. Check the URL, that the database server is "
            "running and reachable, and that you may write there"
        ) from exc
    return Storage(url=url, rdb=rdb, artifact_dir=artifact_dir_for(url, artifact_dir),
                   heartbeat_interval=heartbeat_interval, grace_period=grace_period, max_retry=max_retry)


def _begin_immediate(connection: Any) -> None:
    """Start every SQLite transaction holding the write lock.

    pysqlite's default deferred transactions let two processes both read a
    WAITING trial and both mark it RUNNING (SQLite ignores SELECT ... FOR
    UPDATE), so an enqueued trial would run once per worker; and two readers
    upgrading to writers at once fail with "database is locked" without waiting
    for the busy timeout. ``BEGIN IMMEDIATE`` makes each transaction wait its turn.
    """
    connection.exec_driver_sql("BEGIN IMMEDIATE")


def _with_installed_driver(parsed: Any) -> str:
    """``postgresql://`` means psycopg 3 to SQLAlchemy 2.1 but psycopg2 to older
    releases; use whichever of the two is installed so the URL works unchanged."""
    for module, driver in (("psycopg", "postgresql+psycopg"), ("psycopg2", "postgresql+psycopg2")):
        if importlib.util.find_spec(module) is not None:
            return parsed.set(drivername=driver).render_as_string(hide_password=False)
    return parsed.render_as_string(hide_password=False)


def fail_stale_trials(study: Any, storage: Storage) -> None:
    """Fail (and retry, through the storage's stale-trial callback) RUNNING trials whose worker died.

    Optuna's public :func:`optuna.storages.fail_stale_trials` handles trials
    whose heartbeat went stale. A worker killed between ``study.ask()`` and its
    heartbeat thread's first beat (the sampler runs in between) leaves a trial
    with no heartbeat at all, RUNNING forever; those are failed here once they
    started more than the grace period ago. The heartbeat table is read with
    plain SQL on the storage's public engine. ``storage`` is the opened storage
    ``study`` lives in (Optuna wraps it in a cache that hides the heartbeat settings).
    """
    import optuna
    import sqlalchemy

    rdb = storage.rdb
    if getattr(rdb, "heartbeat_interval", None) is None:
        return
    with quiet_optuna_warnings():
        optuna.storages.fail_stale_trials(study)
    running = study.get_trials(deepcopy=False, states=_states("RUNNING"))
    if not running:
        return
    grace = rdb.grace_period if rdb.grace_period is not None else 2 * rdb.heartbeat_interval
    ids = [t._trial_id for t in running]
    query = sqlalchemy.text("SELECT trial_id FROM trial_heartbeats WHERE trial_id IN :ids").bindparams(
        sqlalchemy.bindparam("ids", expanding=True))
    with rdb.engine.connect() as connection:
        beating = {row[0] for row in connection.execute(query, {"ids": ids})}
    now = datetime.datetime.now()  # the clock Optuna stamps datetime_start with
    callback = rdb.get_heartbeat_stale_trial_callback()
    for trial in running:
        if trial._trial_id in beating or trial.datetime_start is None:
            continue
        if (now - trial.datetime_start).total_seconds() <= grace:
            continue  # maybe a live worker still between ask() and its first heartbeat
        try:
            failed = rdb.set_trial_state_values(trial._trial_id, state=optuna.trial.TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:  # another process got there first
            continue
        if failed:
            logger.warning("trial %d never sent a heartbeat (its worker died); marked FAIL", trial.number)
            if callback is not None:
                callback(study, rdb.get_trial(trial._trial_id))
