"""Browsing studies in optuna-dashboard: the server, with the artifact store the runner uploads to.

:func:`serve_dashboard` serves optuna-dashboard on a storage with the runner's artifact folders
(:func:`~ilge_search.storage.artifact_dir_for`, or those studies recorded), on loopback unless
``allow_remote=True``: the dashboard has no login and can edit and delete studies. Parameter importances
are answered here (:class:`ImportanceRoute`): optuna-dashboard's own route warns on every page of a study
with a conditional parameter and fails on a study without parameters.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import re
import signal
import socket
import socketserver
import threading
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

import optuna
from optuna.artifacts import FileSystemArtifactStore
from optuna.artifacts.exceptions import ArtifactNotFound
from optuna.importance import PedAnovaImportanceEvaluator, get_param_importances
from optuna.study import StudyDirection

from ..record import study_record
from ..storage import Storage, artifact_dir_for, open_storage

if TYPE_CHECKING:
    from types import FrameType
    from wsgiref.simple_server import WSGIServer

    import optuna
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

__all__ = [
    "dashboard_artifact_dirs",
    "DirectoriesArtifactStore",
    "ImportanceRoute",
    "param_importances",
    "make_dashboard_app",
    "serve_dashboard",
]

PathLike = str | os.PathLike


# ----------------------------------------------------------------------------- artifact store


class DirectoriesArtifactStore:
    """An Optuna artifact store over several folders: reads look in each, writes go to the first.

    Artifact ids are UUIDs, so a file found in any folder is the artifact. The dashboard needs this when studies of one
    storage recorded different ``artifact_dir`` s (e.g. runs started from different working directories).
    """

    def __init__(self, directories: Sequence[PathLike]) -> None:

        if not directories:
            raise ValueError("DirectoriesArtifactStore needs at least one folder")
        self.directories = [Path(d) for d in directories]
        self._stores = [FileSystemArtifactStore(d) for d in self.directories]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({[str(d) for d in self.directories]})"

    def open_reader(self, artifact_id: str) -> BinaryIO:

        for store in self._stores:
            try:
                return store.open_reader(artifact_id)
            except ArtifactNotFound:
                continue
        raise ArtifactNotFound(f"artifact {artifact_id} is in none of {[str(d) for d in self.directories]}")

    def write(self, artifact_id: str, content_body: BinaryIO) -> None:
        self.directories[0].mkdir(parents=True, exist_ok=True)
        self._stores[0].write(artifact_id, content_body)

    def remove(self, artifact_id: str) -> None:

        for store in self._stores:
            try:
                store.remove(artifact_id)
                return
            except ArtifactNotFound:
                continue
        raise ArtifactNotFound(f"artifact {artifact_id} is in none of {[str(d) for d in self.directories]}")


def dashboard_artifact_dirs(
    storage_url: str,
    storage: Storage | optuna.storages.BaseStorage | None = None,
    artifact_dir: PathLike | None = None,
) -> list[Path]:
    """The folders whose artifacts the dashboard serves, first one written to.

    ``artifact_dir`` if given (only it). Otherwise the runner's default for the URL
    (:func:`~ilge_search.storage.artifact_dir_for`: next to a SQLite file, else ``studies/artifacts``) followed by every
    existing ``artifact_dir`` that a study in ``storage`` (a :class:`~ilge_search.storage.Storage` or an Optuna storage)
    recorded (a PostgreSQL study run elsewhere points at its shared folder this way).
    """
    if artifact_dir is not None:
        return [artifact_dir_for(storage_url, artifact_dir)]
    dirs = [artifact_dir_for(storage_url)]
    if storage is not None:
        rdb = storage.rdb if isinstance(storage, Storage) else storage
        for summary in optuna.get_all_study_summaries(rdb, include_best_trial=False):
            data = study_record(summary).data
            recorded = None if data is None else data.artifact_dir
            if recorded and Path(recorded).is_dir() and Path(recorded).resolve() not in dirs:
                dirs.append(Path(recorded).resolve())
    return dirs


# ----------------------------------------------------------------------------- server


def make_dashboard_app(storage: str | Storage | None = None, artifact_dir: PathLike | None = None) -> ImportanceRoute:
    """The optuna-dashboard WSGI application for ``storage`` with the artifact store.

    ``storage`` is a URL (default ``sqlite:///studies/ilge.db``; a SQLite file that does not exist is refused, since the
    dashboard would otherwise create an empty one and show nothing) or an opened :class:`~ilge_search.storage.Storage`.
    Serve the app with any WSGI server (gunicorn, waitress ...); :func:`serve_dashboard` uses a threaded ``wsgiref``
    server.
    """
    from optuna_dashboard import wsgi  # heavy: the dashboard only when served

    opened = storage if isinstance(storage, Storage) else open_storage(storage, must_exist=True)
    store = DirectoriesArtifactStore(dashboard_artifact_dirs(opened.url, opened, artifact_dir))
    app = ImportanceRoute(wsgi(opened.rdb, artifact_store=store), opened.rdb)
    app.ilge_artifact_store = store  # what the caller may print
    return app


# ----------------------------------------------------------------------------- parameter importances

_IMPORTANCE_PATH = re.compile(r"/api/studies/(\d+)/param_importances")
_TARGET_QUANTILE = 0.1  # PED-ANOVA's default share of best trials, compared with all complete ones
_MIN_REGIME_TRIALS = 2  # PED-ANOVA's least count of trials in each regime of a parameter


class ImportanceRoute:
    """A WSGI app: optuna-dashboard's ``app``, with its parameter-importance route answered by
    :func:`param_importances` (same JSON), so computing them neither warns nor fails."""

    def __init__(self, app: WSGIApplication, storage: optuna.storages.BaseStorage) -> None:
        self.app, self.storage = app, storage
        self.ilge_artifact_store: DirectoriesArtifactStore | None = None

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        match = _IMPORTANCE_PATH.fullmatch(environ.get("PATH_INFO", ""))
        if match is None or environ.get("REQUEST_METHOD", "GET") != "GET":
            return self.app(environ, start_response)
        status, payload = param_importances(self.storage, int(match.group(1)))
        body = json.dumps(payload).encode()
        start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]


def param_importances(storage: optuna.storages.BaseStorage, study_id: int) -> tuple[str, dict[str, object]]:
    """The HTTP status and JSON of optuna-dashboard's ``param_importances`` answer for a study: per objective,
    the PED-ANOVA importance of each parameter it can judge. Left out: a parameter with a regime (its trials
    where it is active, or where it is not) of fewer than 2 complete trials, which PED-ANOVA cannot judge; with
    no such parameter or at most one complete trial, the objective's list is empty (the page says so)."""

    try:
        directions = storage.get_study_directions(study_id)
    except KeyError:
        return "404 Not Found", {"reason": f"study_id={study_id} is not found"}
    study = optuna.load_study(study_name=storage.get_study_name_from_id(study_id), storage=storage)
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    answer = [_objective_importances(study, complete, index, direction) for index, direction in enumerate(directions)]
    return "200 OK", {"param_importances": answer}


def _objective_importances(
    study: optuna.Study, complete: list[optuna.trial.FrozenTrial], index: int, direction: optuna.study.StudyDirection
) -> list[dict[str, object]]:

    sign = -1.0 if direction == StudyDirection.MAXIMIZE else 1.0  # PED-ANOVA ranks low targets first

    def target(trial: optuna.trial.FrozenTrial) -> float:
        return sign * trial.values[index]

    trials = [t for t in complete if t.values is not None and math.isfinite(target(t))]
    judged = _judged_params(trials)
    if len(trials) <= 1 or not judged:
        return []
    losses = sorted(target(t) for t in trials)
    if losses[-1] <= losses[math.ceil(_TARGET_QUANTILE * len(losses)) - 1]:  # the best tenth is every trial
        importance = {name: 1.0 / len(judged) for name in judged}  # nothing tells the parameters apart
    else:
        with warnings.catch_warnings():  # the sign above already makes low targets the good ones
            warnings.filterwarnings("ignore", message="PedAnovaImportanceEvaluator computes the importances")
            importance = get_param_importances(
                study, evaluator=PedAnovaImportanceEvaluator(), params=list(judged), target=target
            )
    return [{"name": name, "importance": value, "distribution": judged[name]} for name, value in importance.items()]


def _judged_params(trials: list[optuna.trial.FrozenTrial]) -> dict[str, str]:
    """The parameters PED-ANOVA can judge on ``trials`` (each regime has enough of them), with the class name of
    their distribution."""
    names = {name for trial in trials for name in trial.distributions}
    judged = {}
    for name in sorted(names):
        regimes = Counter(trial.distributions.get(name) for trial in trials)
        if min(regimes.values()) >= _MIN_REGIME_TRIALS:
            judged[name] = type(next(d for d in regimes if d is not None)).__name__
    return judged


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve_dashboard(
    storage: str | Storage | None = None,
    host: str = "127.0.0.1",
    port: int = 8080,
    artifact_dir: PathLike | None = None,
    *,
    allow_remote: bool = False,
    log_requests: bool = False,
    echo: Callable[[str], None] = print,
) -> None:
    """Run optuna-dashboard on ``storage`` with the artifact store until SIGINT or SIGTERM.

    Args:
        storage: an Optuna RDB URL (default ``sqlite:///studies/ilge.db``) or an opened
            :class:`~ilge_search.storage.Storage`.
        host: interface to bind: loopback by default. Anything else needs ``allow_remote`` (and still prints a warning),
            since the dashboard has no login and can delete studies.
        port: TCP port; ``0`` picks a free one (the printed URL shows it).
        artifact_dir: the artifact store folder (default: see :func:`dashboard_artifact_dirs`).
        allow_remote: permit a ``host`` other than loopback.
        log_requests: print one line per HTTP request.
        echo: where the URL and status lines go.

    Raises:
        ValueError: a non-loopback host without ``allow_remote``, a bad or unreachable storage (``StorageError``), a
            missing SQLite file, a host that cannot be resolved or a port in use.
    """
    _check_address(host, port, allow_remote)
    app = make_dashboard_app(storage, artifact_dir)
    server = _bind_server(host, int(port), log_requests)
    server.set_app(app)
    assert app.ilge_artifact_store is not None  # make_dashboard_app sets it
    _serve_until_stopped(server, host, app.ilge_artifact_store.directories, echo)


def _check_address(host: str, port: int, allow_remote: bool) -> None:
    """Refuse a port out of range, and a non-loopback host unless the user allowed it (the dashboard has no login)."""
    if not 0 <= int(port) <= 65535:
        raise ValueError(f"port must be in 0..65535, got {port!r}")
    if not _is_loopback(host) and not allow_remote:
        raise ValueError(
            f"--host {host} would let anyone who can reach this machine read, edit and delete studies "
            "(the dashboard has no login); keep the default 127.0.0.1 (use an SSH tunnel from "
            "elsewhere), or pass --allow-remote on a trusted network"
        )


def _bind_server(host: str, port: int, log_requests: bool) -> WSGIServer:
    """A threading WSGI server listening on ``host:port``; resolution and bind errors become ``ValueError``."""

    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as exc:
        raise ValueError(f"cannot resolve host {host!r}: {exc}; pass an address such as 127.0.0.1") from exc

    class Handler(WSGIRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            if log_requests:
                super().log_message(format, *args)

    class Server(socketserver.ThreadingMixIn, WSGIServer):
        daemon_threads = True  # a browser's open connection does not hold up shutdown
        allow_reuse_address = True
        address_family = family

    try:
        return Server((host, port), Handler)
    except OSError as exc:
        raise ValueError(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}); pass another --port (0 picks a free one)"
        ) from exc


def _serve_until_stopped(
    server: WSGIServer, host: str, artifact_dirs: Iterable[Path], echo: Callable[[str], None]
) -> None:
    """Print where the dashboard is and serve until Ctrl-C or SIGTERM, restoring the previous SIGTERM handler."""
    bound_port = server.server_address[1]
    shown_host = f"[{host}]" if ":" in host else host
    url = f"http://{shown_host}:{bound_port}/dashboard"

    def stop(signum: int, frame: FrameType | None) -> None:
        # shutdown() waits for serve_forever() to return, so it must not run on its thread
        threading.Thread(target=server.shutdown, daemon=True).start()

    previous = None
    if threading.current_thread() is threading.main_thread():  # before the URL is shown: a SIGTERM right after it
        previous = signal.signal(signal.SIGTERM, stop)  # stops the server cleanly too
    try:
        if not _is_loopback(host):
            echo(
                f"warning: the dashboard listens on {host}, not loopback; it has no login, so anyone who can "
                f"reach port {bound_port} can read, edit and delete studies"
            )
        echo(f"artifacts: {', '.join(str(d) for d in artifact_dirs)}")
        echo(f"optuna-dashboard on {url} (Ctrl-C to stop)")
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    echo("dashboard stopped")
