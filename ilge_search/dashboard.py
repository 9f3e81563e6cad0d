"""Browsing studies in optuna-dashboard: Markdown notes and a server with the artifact store.

Notes are what a reader sees first on a trial's or study's page:

- :func:`write_trial_note` gives every trial a note with its configuration
  (the tuned fields marked), validation score, trainable parameters, epochs
  and seconds, read from the trial user attrs the study runner records;
  :func:`write_live_note` is what the runner calls as each trial finishes
  (in every worker process), and never fails the trial;
- :func:`write_study_note` gives the study a note with its identity, the best
  trial and the final test scores (mean +- std and one row per seed), linking
  the uploaded weights; a multi-objective study's note also lists its final
  front (optuna-dashboard draws its Pareto front by itself, from the study's
  directions and metric names);
- :func:`write_notes` backfills both for studies run before notes existed.

:func:`serve_dashboard` starts optuna-dashboard on a storage together with the
artifact store the runner uploads to (:func:`~ilge_search.storage.artifact_dir_for`,
or the ``artifact_dir`` a study recorded), so weights and report figures can be
downloaded from the browser. It binds to loopback; any other interface needs
``allow_remote=True`` (``--allow-remote``): the dashboard has no login and can
edit and delete studies.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import os
import signal
import socket
import socketserver
import threading
import types
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, List, Mapping, Optional, Sequence, Union

from .objectives import best_score_trial, score_of
from .protocol import protocol_of
from .storage import ENDED_STATES, Storage, artifact_dir_for, open_storage

__all__ = [
    "trial_note_markdown",
    "study_note_markdown",
    "write_trial_note",
    "write_live_note",
    "write_study_note",
    "write_notes",
    "dashboard_artifact_dirs",
    "DirectoriesArtifactStore",
    "make_dashboard_app",
    "serve_dashboard",
]

logger = logging.getLogger(__name__)

PathLike = Union[str, os.PathLike]

# ----------------------------------------------------------------------------- Markdown


def _cell(value: Any) -> str:
    """One Markdown table cell: short numbers, code for lists and dicts, escaped pipes."""
    if value is None:
        text = "-"
    elif isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, float):
        text = "nan" if math.isnan(value) else f"{value:.4g}"
    elif isinstance(value, (list, tuple, dict)):
        import json

        text = f"`{json.dumps(value)}`"
    else:
        text = str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _score(value: Optional[float]) -> str:
    return "-" if value is None else f"{float(value):.4f}"


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> List[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * len(header)) + "|"]
    lines += ["| " + " | ".join(_cell(cell) for cell in row) + " |" for row in rows]
    return lines


def trial_note_markdown(
    number: int,
    config: Mapping[str, Any],
    *,
    metric: str = "value",
    state: str = "complete",
    val_metric: Optional[float] = None,
    num_trainable_params: Optional[int] = None,
    epochs_run: Optional[int] = None,
    best_epoch: Optional[int] = None,
    seconds: Optional[float] = None,
    tuned: Iterable[str] = (),
    recommended: bool = False,
    layer: Optional[int] = None,
) -> str:
    """The Markdown note of one trial.

    Args:
        number: the trial number.
        config: the full config dict (``EncoderConfig.to_dict()``).
        metric: the validation metric's name (``accuracy``, ``spearman`` ...).
        state: ``complete``, ``pruned``, ``fail`` ...
        val_metric: best validation value over the epochs run.
        num_trainable_params, epochs_run, best_epoch, seconds: what training did.
        tuned: config fields that the sampler chose (marked in the table).
        recommended: the trial runs the family's ``recommended_config``.
        layer: the layer the best-layer baseline picked.

    >>> print(trial_note_markdown(0, {"family": "fc", "lr": 0.001}, metric="accuracy", val_metric=0.5,
    ...                           num_trainable_params=1234, epochs_run=3, best_epoch=2, seconds=1.5,
    ...                           tuned=["lr"]).splitlines()[0])
    ## Trial 0 · fc · complete
    """
    family = config.get("family", "?")
    state = state.lower()
    lines = [f"## Trial {number} · {family} · {state}", ""]
    if recommended:
        lines += ["The family's recommended configuration, enqueued as the study's first trial.", ""]
    if state == "pruned" and epochs_run is not None:
        lines += [f"Pruned after epoch {epochs_run}: its validation {metric} fell behind the other trials.", ""]
    best = _score(val_metric)
    if val_metric is not None and best_epoch is not None:
        best += f" (epoch {best_epoch})"
    params = "-" if num_trainable_params is None else f"{int(num_trainable_params):,}"
    lines += _table(
        [f"validation {metric}", "trainable parameters", "epochs", "seconds"],
        [
            [
                best,
                params,
                "-" if epochs_run is None else str(int(epochs_run)),
                "-" if seconds is None else f"{float(seconds):.2f}",
            ]
        ],
    )
    if layer is not None:
        lines += ["", f"Layer picked on validation: **{int(layer)}**."]
    tuned = set(tuned)
    lines += ["", "### Configuration", ""]
    lines += _table(
        ["field", "value", "tuned"],
        [[key, value, "✓" if key in tuned else ""] for key, value in config.items() if key != "family"],
    )
    return "\n".join(lines) + "\n"


def _protocol_words(attrs: Mapping[str, Any]) -> str:
    """How the final scores were measured, as the end of a sentence."""
    if protocol_of(attrs) != "paper":
        return " by its own head (matched protocol)"
    return (
        " under the paper protocol: its vectors read out as MTEB does (logistic regression on "
        f"{attrs.get('samples_per_label')} examples per label, mean over 10 draws; cosine Spearman for "
        "similarity; last, best and mean layers untrained)"
    )


def study_note_markdown(
    study_name: str,
    attrs: Mapping[str, Any],
    *,
    study_id: Optional[int] = None,
    n_complete: int = 0,
    n_pruned: int = 0,
    n_failed: int = 0,
    best_trial: Optional[int] = None,
    best_value: Optional[float] = None,
) -> str:
    """The Markdown note of a study, from its user attrs (see :mod:`ilge_search.study.runner`).

    Shows the identity (model, task, encoder, data), the trial counts, the best
    trial, and -- once the final evaluation ran -- the test score as mean +- std
    with one row per seed, plus links to the uploaded artifacts (``study_id``
    is needed for the links; the dashboard serves ``/artifacts/<study_id>/<id>``).
    """
    metric = attrs.get("metric", "value")
    title = " · ".join(str(attrs[k]) for k in ("model", "task", "encoder") if attrs.get(k)) or study_name
    lines = [f"## {title}", "", f"Study `{study_name}`."]
    facts = []
    if attrs.get("model"):
        width = ""
        if attrs.get("num_layers") and attrs.get("hidden_size"):
            width = f" ({attrs['num_layers']} hidden states × {attrs['hidden_size']})"
        facts.append(f"- model `{attrs['model']}`{width}")
    if attrs.get("task"):
        kind = f"{attrs.get('task_kind', '?')}, metric {metric}"
        if attrs.get("num_classes"):
            kind += f", {attrs['num_classes']} classes"
        facts.append(f"- task `{attrs['task']}` ({kind})")
    sizes = attrs.get("split_sizes") or {}
    if sizes:
        facts.append("- examples: " + ", ".join(f"{name} {count}" for name, count in sizes.items()))
    limits = [
        f"{key.replace('_', ' ')} {attrs[key]}"
        for key in ("shots", "max_train", "max_eval", "max_epochs")
        if attrs.get(key) is not None
    ]
    if limits:
        facts.append("- settings: " + ", ".join(limits))
    if attrs.get("ilge_search_version"):
        facts.append(f"- ilge-search {attrs['ilge_search_version']}")
    if facts:
        lines += [""] + facts
    lines += ["", f"Trials: {n_complete} complete, {n_pruned} pruned, {n_failed} failed."]
    if best_trial is not None:
        lines.append(f"Best validation {metric}: **{_score(best_value)}** (trial {best_trial}).")

    lines += ["", f"### Final test {metric}", ""]
    scores = list(attrs.get("final_test_scores") or [])
    if not scores:
        lines.append("No final evaluation yet: it runs after the search when `--final-seeds` is above 0.")
        return "\n".join(lines) + "\n"
    mean, std = attrs.get("final_test_mean"), attrs.get("final_test_std")
    lines.append(
        f"**{_score(mean)} ± {_score(std)}** over {len(scores)} seed{'s' if len(scores) != 1 else ''}: "
        f"trial {attrs.get('final_trial', '?')}'s configuration retrained per seed on train, "
        "each model evaluated on test once" + _protocol_words(attrs) + "."
    )
    lines.append("")
    seeds = list(attrs.get("final_seeds") or [None] * len(scores))
    val_scores = list(attrs.get("final_val_scores") or [None] * len(scores))
    artifact_seed = attrs.get("final_artifact_seed")
    rows = [
        [
            str(seed) if seed is not None else str(i),
            _score(val),
            _score(test),
            "✓" if seed is not None and seed == artifact_seed else "",
        ]
        for i, (seed, val, test) in enumerate(zip(seeds, val_scores, scores, strict=False))
    ]
    lines += _table(["seed", f"validation {metric}", f"test {metric}", "weights"], rows)

    front = attrs.get("final_front") or []
    if front:
        lines += [
            "",
            f"### Final front ({len(front)} of {attrs.get('final_front_size', len(front))} Pareto-front "
            "trials retrained)",
            "",
        ]
        lines += _table(
            ["trial", "params", "latency ms/1k", f"validation {metric}", f"test {metric} (mean ± std)"],
            [
                [
                    str(r.get("trial")),
                    _cell(r.get("params")),
                    _score(r.get("latency_ms")),
                    _score(r.get("val_score")),
                    f"{_score(r.get('test_mean'))} ± {_score(r.get('test_std'))}",
                ]
                for r in front
            ],
        )

    zero_shot = attrs.get("final_zero_shot") or {}
    if zero_shot:
        lines += ["", "Zero-shot Spearman of the same models on other similarity tasks:", ""]
        lines += _table(
            ["task", "mean ± std", "per seed"],
            [
                [
                    name,
                    f"{_score(v.get('mean'))} ± {_score(v.get('std'))}",
                    ", ".join(_score(s) for s in v.get("scores", [])),
                ]
                for name, v in zero_shot.items()
            ],
        )

    artifacts = attrs.get("final_artifacts") or {}
    if artifacts:
        lines += ["", "### Artifacts", ""]
        described = {
            "weights": "weights of the best seed by validation (safetensors)",
            "config": "config, label names and provenance (JSON)",
        }
        for name, artifact_id in artifacts.items():
            label = described.get(name, name)
            if study_id is not None:
                lines.append(f"- [{name}](/artifacts/{study_id}/{artifact_id}): {label}")
            else:
                lines.append(f"- {name} (`{artifact_id}`): {label}")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- writing notes


def _note_target(study: Any, trial: Any) -> Any:
    """What ``optuna_dashboard.save_note`` accepts for ``trial``.

    A live ``optuna.Trial`` is passed through; a ``FrozenTrial`` (from
    ``study.trials`` or a callback) becomes a stand-in with the attributes
    ``save_note`` reads, because building a live ``Trial`` for a finished one
    would consult the sampler.
    """
    import optuna

    if isinstance(trial, optuna.Trial):
        return trial
    return types.SimpleNamespace(storage=study._storage, study=study, _trial_id=trial._trial_id)


def write_trial_note(study: Any, trial: Any, *, state: Optional[str] = None, metric: Optional[str] = None) -> str:
    """Save (and return) the Markdown note of ``trial`` in ``study``'s storage.

    ``trial`` is a live ``optuna.Trial`` (inside an objective, before it
    returns; give ``state="pruned"`` when it is about to be pruned) or a
    ``FrozenTrial``. Everything shown comes from the trial's user attrs
    (``config``, ``val_metric``, ``num_trainable_params``, ``epochs_run``,
    ``best_epoch``, ``seconds``, ``recommended``, ``layer``); ``metric``
    defaults to the study's ``metric`` user attr.
    """
    from optuna_dashboard import save_note

    attrs = trial.user_attrs
    if state is None:
        frozen_state = getattr(trial, "state", None)
        state = frozen_state.name.lower() if frozen_state is not None else "complete"
    if metric is None:
        metric = study.user_attrs.get("metric", "value")
    config = attrs.get("config") or dict(trial.params)
    body = trial_note_markdown(
        trial.number,
        config,
        metric=metric,
        state=state,
        val_metric=attrs.get("val_metric"),
        num_trainable_params=attrs.get("num_trainable_params"),
        epochs_run=attrs.get("epochs_run"),
        best_epoch=attrs.get("best_epoch"),
        seconds=attrs.get("seconds"),
        tuned=trial.params.keys(),
        recommended=bool(attrs.get("recommended")),
        layer=attrs.get("layer"),
    )
    save_note(_note_target(study, trial), body)
    return body


def write_live_note(trial: Any, metric: str, state: str = "complete") -> None:
    """Write a running trial's note as it finishes, so it shows while the search runs.

    The study runner calls this at the end of every trial (in every worker
    process); :func:`write_notes` at the end of a run fills in any that are
    missing. A note is for reading: a failure to write it is logged as a
    warning and never fails the trained trial.
    """
    try:
        write_trial_note(trial.study, trial, state=state, metric=metric)
    except Exception as exc:
        logger.warning("trial %d: could not write its dashboard note: %s", trial.number, exc)


def write_study_note(study: Any) -> str:
    """Save (and return) the study's Markdown note: identity, best trial, final test scores."""
    from optuna.trial import TrialState
    from optuna_dashboard import save_note

    trials = study.get_trials(deepcopy=False)
    counts = {state: sum(t.state == state for t in trials) for state in TrialState}
    best_trial = best_value = None
    if counts[TrialState.COMPLETE]:
        best = best_score_trial(study)
        best_trial, best_value = best.number, score_of(best)
    body = study_note_markdown(
        study.study_name,
        study.user_attrs,
        study_id=study._study_id,
        n_complete=counts[TrialState.COMPLETE],
        n_pruned=counts[TrialState.PRUNED],
        n_failed=counts[TrialState.FAIL],
        best_trial=best_trial,
        best_value=best_value,
    )
    save_note(study, body)
    return body


def _note_version_key(trial_id: int) -> str:
    """The study system attr in which optuna-dashboard counts a trial's note versions.

    optuna-dashboard 0.21 stores a trial's note as the study system attrs
    ``dashboard:<trial_id>:note_ver`` and ``dashboard:<trial_id>:note_str:<i>``
    (``note_ver_key`` in its ``_note.py``, which is private); it offers no
    public "has a note" call, and ``get_note`` per trial would read every
    system attr once per trial.
    """
    return f"dashboard:{trial_id}:note_ver"


def _has_note(system_attrs: Mapping[str, Any], trial_id: int) -> bool:
    return _note_version_key(trial_id) in system_attrs


def write_notes(study: Any, *, overwrite: bool = False) -> int:
    """Give every ended trial (complete, pruned or failed) without a note its note, then (re)write the
    study note.

    ``overwrite=True`` rewrites every ended trial's note. Returns the number
    of trial notes written. Safe to run while workers add trials.
    """
    from optuna.trial import TrialState

    ended = tuple(TrialState[name] for name in ENDED_STATES)
    system_attrs = study._storage.get_study_system_attrs(study._study_id)
    metric = study.user_attrs.get("metric", "value")
    written = 0
    for trial in study.get_trials(deepcopy=False, states=ended):
        if overwrite or not _has_note(system_attrs, trial._trial_id):
            write_trial_note(study, trial, metric=metric)
            written += 1
    write_study_note(study)
    return written


# ----------------------------------------------------------------------------- artifact store


class DirectoriesArtifactStore:
    """An Optuna artifact store over several folders: reads look in each, writes go to the first.

    Artifact ids are UUIDs, so a file found in any folder is the artifact. The
    dashboard needs this when studies of one storage recorded different
    ``artifact_dir`` s (e.g. runs started from different working directories).
    """

    def __init__(self, directories: Sequence[PathLike]) -> None:
        from optuna.artifacts import FileSystemArtifactStore

        if not directories:
            raise ValueError("DirectoriesArtifactStore needs at least one folder")
        self.directories = [Path(d) for d in directories]
        self._stores = [FileSystemArtifactStore(d) for d in self.directories]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({[str(d) for d in self.directories]})"

    def open_reader(self, artifact_id: str) -> BinaryIO:
        from optuna.artifacts.exceptions import ArtifactNotFound

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
        from optuna.artifacts.exceptions import ArtifactNotFound

        for store in self._stores:
            try:
                store.remove(artifact_id)
                return
            except ArtifactNotFound:
                continue
        raise ArtifactNotFound(f"artifact {artifact_id} is in none of {[str(d) for d in self.directories]}")


def dashboard_artifact_dirs(
    storage_url: str, storage: Any = None, artifact_dir: Optional[PathLike] = None
) -> List[Path]:
    """The folders whose artifacts the dashboard serves, first one written to.

    ``artifact_dir`` if given (only it). Otherwise the runner's default for the
    URL (:func:`~ilge_search.storage.artifact_dir_for`: next to a SQLite file,
    else ``studies/artifacts``) followed by every existing ``artifact_dir``
    that a study in ``storage`` (a :class:`~ilge_search.storage.Storage` or an
    Optuna storage) recorded (a PostgreSQL study run elsewhere points at its
    shared folder this way).
    """
    if artifact_dir is not None:
        return [artifact_dir_for(storage_url, artifact_dir)]
    dirs = [artifact_dir_for(storage_url)]
    if storage is not None:
        import optuna

        rdb = storage.rdb if isinstance(storage, Storage) else storage
        for summary in optuna.get_all_study_summaries(rdb, include_best_trial=False):
            recorded = summary.user_attrs.get("artifact_dir")
            if recorded and Path(recorded).is_dir() and Path(recorded).resolve() not in dirs:
                dirs.append(Path(recorded).resolve())
    return dirs


# ----------------------------------------------------------------------------- server


def make_dashboard_app(storage: Union[str, Storage, None] = None, artifact_dir: Optional[PathLike] = None) -> Any:
    """The optuna-dashboard WSGI application for ``storage`` with the artifact store.

    ``storage`` is a URL (default ``sqlite:///studies/ilge.db``; a SQLite file
    that does not exist is refused, since the dashboard would otherwise create an
    empty one and show nothing) or an opened :class:`~ilge_search.storage.Storage`.
    Serve the app with any WSGI server (gunicorn, waitress ...);
    :func:`serve_dashboard` uses a threaded ``wsgiref`` server.
    """
    from optuna_dashboard import wsgi

    opened = storage if isinstance(storage, Storage) else open_storage(storage, must_exist=True)
    store = DirectoriesArtifactStore(dashboard_artifact_dirs(opened.url, opened, artifact_dir))
    app = wsgi(opened.rdb, artifact_store=store)
    app.ilge_artifact_store = store  # what the caller may print
    return app


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve_dashboard(
    storage: Union[str, Storage, None] = None,
    host: str = "127.0.0.1",
    port: int = 8080,
    artifact_dir: Optional[PathLike] = None,
    *,
    allow_remote: bool = False,
    log_requests: bool = False,
    echo: Callable[[str], None] = print,
) -> None:
    """Run optuna-dashboard on ``storage`` with the artifact store until SIGINT or SIGTERM.

    Args:
        storage: an Optuna RDB URL (default ``sqlite:///studies/ilge.db``) or an opened
            :class:`~ilge_search.storage.Storage`.
        host: interface to bind: loopback by default. Anything else needs
            ``allow_remote`` (and still prints a warning), since the dashboard has
            no login and can delete studies.
        port: TCP port; ``0`` picks a free one (the printed URL shows it).
        artifact_dir: the artifact store folder (default: see :func:`dashboard_artifact_dirs`).
        allow_remote: permit a ``host`` other than loopback.
        log_requests: print one line per HTTP request.
        echo: where the URL and status lines go.

    Raises:
        ValueError: a non-loopback host without ``allow_remote``, a bad or
            unreachable storage (``StorageError``), a missing SQLite file, a host
            that cannot be resolved or a port in use.
    """
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

    if not 0 <= int(port) <= 65535:
        raise ValueError(f"port must be in 0..65535, got {port!r}")
    if not _is_loopback(host) and not allow_remote:
        raise ValueError(
            f"--host {host} would let anyone who can reach this machine read, edit and delete studies "
            "(the dashboard has no login); keep the default 127.0.0.1 (use an SSH tunnel from "
            "elsewhere), or pass --allow-remote on a trusted network"
        )
    app = make_dashboard_app(storage, artifact_dir)
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as exc:
        raise ValueError(f"cannot resolve host {host!r}: {exc}; pass an address such as 127.0.0.1") from exc

    class Handler(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the stdlib's name)
            if log_requests:
                super().log_message(format, *args)

    class Server(socketserver.ThreadingMixIn, WSGIServer):
        daemon_threads = True  # a browser's open connection does not hold up shutdown
        allow_reuse_address = True
        address_family = family

    try:
        server = Server((host, int(port)), Handler)
    except OSError as exc:
        raise ValueError(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}); pass another --port (0 picks a free one)"
        ) from exc
    server.set_app(app)
    bound_port = server.server_address[1]
    shown_host = f"[{host}]" if ":" in host else host
    url = f"http://{shown_host}:{bound_port}/dashboard"

    def stop(signum: int, frame: Any) -> None:
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
        echo(f"artifacts: {', '.join(str(d) for d in app.ilge_artifact_store.directories)}")
        echo(f"optuna-dashboard on {url} (Ctrl-C to stop)")
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    echo("dashboard stopped")
