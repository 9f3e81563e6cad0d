"""Optuna studies over cached layer embeddings: the platform's main job.

:func:`run_study` runs one study per encoder family for a (model, task) pair:

1. check the arguments, the storage and any existing study with the same name
   (a name already used for another model or task is an error) -- all before
   any model loads;
2. make sure every split's embeddings are in the cache (extracted once);
3. create the study, or load it to add trials. A new study gets its identity as
   user attrs and the family's ``recommended_config`` enqueued as trial 0;
4. optimise: every trial builds a config with ``suggest_config``, trains it with
   the one engine on train, reports the validation metric after each epoch for
   the pruner, and stores what it did as trial user attrs; ``workers > 1`` runs
   that many processes on the same storage, splitting ``n_trials`` exactly;
5. retrain the best configuration with ``final_seeds`` seeds, evaluate each on
   test once, store mean, std and per-seed scores as study user attrs, and
   upload the weights of the best seed (by validation) as an Optuna artifact.

Stored layout (what reports and the dashboard read):

- study user attrs: ``model``, ``task``, ``encoder``, ``task_kind``, ``metric``,
  ``direction``, ``num_layers``, ``hidden_size``, ``num_classes``,
  ``split_sizes``, ``cache_keys``, ``model_revision``, ``ilge_search_version``,
  ``shots``, ``max_train``, ``max_eval``, ``max_epochs``, ``data_seed``,
  ``artifact_dir`` and, after the final evaluation, ``final_test_mean``,
  ``final_test_std``, ``final_test_scores``, ``final_val_scores``, ``final_seeds``,
  ``final_trial``, ``final_config``, ``final_artifacts`` (and
  ``final_zero_shot`` for similarity studies evaluated on other STS tasks).
- trial user attrs: ``config`` (the full config dict), ``val_metric``,
  ``num_trainable_params``, ``epochs_run``, ``best_epoch``, ``seconds`` (and
  ``layer``/``layer_scores`` for the best-layer baseline); the validation metric
  of every epoch is an intermediate value.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import multiprocessing
import os
import signal
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from ._version import __version__
from .configs import BASELINE_FAMILIES, ENCODER_FAMILIES, config_from_dict
from .settings import default_storage_url

__all__ = [
    "ENCODER_CHOICES",
    "SAMPLERS",
    "PRUNERS",
    "StudyResult",
    "StudyConflictError",
    "StorageError",
    "run_study",
    "list_studies",
    "study_result",
    "resolve_encoders",
    "default_study_name",
    "make_storage",
    "make_sampler",
    "make_pruner",
    "artifact_store_for",
    "finished_trial_count",
    "format_results",
]

logger = logging.getLogger(__name__)

ENCODER_CHOICES: Tuple[str, ...] = ENCODER_FAMILIES + BASELINE_FAMILIES
SAMPLERS = ("tpe", "random", "gp")
PRUNERS = ("median", "hyperband", "none")

# study user attrs that must match when a study is resumed: they define what is being searched
IDENTITY_KEYS = ("model", "task", "encoder", "shots", "max_train", "max_eval", "max_epochs", "data_seed")
READY_ATTR = "ilge_search_ready"  # set last by the process that creates a study
READY_WAIT_SECONDS = 30.0


class StudyConflictError(ValueError):
    """A study name already used for a different model, task, encoder or data setting."""


class StorageError(ValueError):
    """The storage URL cannot be opened (bad URL, server down, no driver, no permission)."""


@dataclass
class StudyResult:
    """One study's outcome, read back from the storage.

    ``test_mean``/``test_std``/``test_scores`` are the final test scores over
    the final seeds (``None``/empty before a final evaluation ran).
    """

    study_name: str
    storage: str
    model: str
    task: str
    encoder: str
    metric: str
    n_complete: int
    n_pruned: int
    n_failed: int
    best_value: Optional[float] = None
    best_trial: Optional[int] = None
    best_config: Optional[Dict[str, Any]] = None
    test_mean: Optional[float] = None
    test_std: Optional[float] = None
    test_scores: List[float] = field(default_factory=list)
    artifacts: Dict[str, str] = field(default_factory=dict)

    @property
    def n_finished(self) -> int:
        """Complete plus pruned trials (what ``--n-trials`` counts)."""
        return self.n_complete + self.n_pruned


# ----------------------------------------------------------------------------- small helpers


def resolve_encoders(encoders: Union[str, Sequence[str]]) -> List[str]:
    """Expand ``"all"`` and check names; keeps order and drops duplicates."""
    if isinstance(encoders, str):
        encoders = [encoders]
    out: List[str] = []
    for name in encoders:
        names = list(ENCODER_CHOICES) if name == "all" else [name]
        for item in names:
            if item not in ENCODER_CHOICES:
                raise ValueError(f"unknown encoder {item!r}; expected one of {list(ENCODER_CHOICES)} or 'all'")
            if item not in out:
                out.append(item)
    if not out:
        raise ValueError("no encoder given; pass at least one of " f"{list(ENCODER_CHOICES)} or 'all'")
    return out


def default_study_name(model: str, task: str, encoder: str, *, shots: Optional[int] = None,
                       max_train: Optional[int] = None, max_eval: Optional[int] = None,
                       max_epochs: Optional[int] = None) -> str:
    """``model:task:encoder`` plus a suffix per non-default data or budget setting.

    >>> default_study_name("minilm-l6", "trec", "cayley", shots=8)
    'minilm-l6:trec:cayley:8shot'
    """
    parts = [str(model), str(task), encoder]
    if shots is not None:
        parts.append(f"{shots}shot")
    if max_train is not None:
        parts.append(f"train{max_train}")
    if max_eval is not None:
        parts.append(f"eval{max_eval}")
    if max_epochs is not None:
        parts.append(f"ep{max_epochs}")
    return ":".join(parts)


def _hide_password(url: str) -> str:
    try:
        import sqlalchemy

        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:  # an unparsable URL is reported by the caller
        return url


def make_storage(url: Optional[str] = None, *, heartbeat_interval: Optional[int] = 60,
                 grace_period: Optional[int] = None, max_retry: int = 3) -> "Any":
    """An ``optuna.storages.RDBStorage`` for ``url`` (default: ``sqlite:///studies/ilge.db``).

    SQLite gets a 60 s busy timeout (several workers on one file wait for the
    lock instead of failing) and its folder is created. Every RDB storage gets
    heartbeats: a trial whose worker died is marked FAIL once its heartbeat is
    older than ``grace_period`` (default ``2 * heartbeat_interval``) and
    re-queued up to ``max_retry`` times. PostgreSQL and MySQL URLs pass
    through unchanged. ``heartbeat_interval=None`` disables heartbeats.

    Raises:
        StorageError: the URL is malformed, its driver is missing, or the
            database cannot be reached or written.
    """
    import optuna
    import sqlalchemy

    url = url or default_storage_url()
    try:
        parsed = sqlalchemy.engine.make_url(url)
    except sqlalchemy.exc.ArgumentError as exc:
        raise StorageError(
            f"not a database URL: {url!r}; use e.g. sqlite:///studies/ilge.db or "
            "postgresql://user@host:5432/db"
        ) from exc
    if parsed.drivername == "postgresql":
        url = _postgres_with_installed_driver(parsed)
    engine_kwargs: Dict[str, Any] = {}
    is_sqlite = parsed.get_backend_name() == "sqlite"
    if is_sqlite:
        # isolation_level=None: pysqlite emits no BEGIN of its own; _begin_immediate does
        engine_kwargs["connect_args"] = {"timeout": 60, "isolation_level": None}
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    heartbeat: Dict[str, Any] = {}
    shown = _hide_password(url)
    try:
        with _quiet_optuna_warnings():
            if heartbeat_interval is not None:
                heartbeat = {
                    "heartbeat_interval": int(heartbeat_interval),
                    "grace_period": int(grace_period) if grace_period is not None else 2 * int(heartbeat_interval),
                    "heartbeat_stale_trial_callback":
                        optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=max_retry),
                }
            try:
                storage = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, **heartbeat)
            except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError) as exc:
                # workers starting together on an empty database race to create the schema;
                # the loser sees "already exists" and simply opens what the winner made
                if "already exists" not in str(exc) and "Duplicate" not in str(exc):
                    raise
                time.sleep(1.0)
                storage = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, **heartbeat)
        if is_sqlite:
            sqlalchemy.event.listen(storage.engine, "begin", _begin_immediate)
        return storage
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


def _begin_immediate(connection: Any) -> None:
    """Start every SQLite transaction holding the write lock.

    pysqlite's default deferred transactions let two processes both read a
    WAITING trial and both mark it RUNNING (SQLite ignores SELECT ... FOR
    UPDATE), so an enqueued trial would run once per worker; and two readers
    upgrading to writers at once fail with "database is locked" without waiting
    for the busy timeout. ``BEGIN IMMEDIATE`` makes each transaction wait its turn.
    """
    connection.exec_driver_sql("BEGIN IMMEDIATE")


def _postgres_with_installed_driver(parsed: Any) -> str:
    """``postgresql://`` means psycopg 3 to SQLAlchemy 2.1 but psycopg2 to older
    releases; use whichever of the two is installed so the URL works unchanged."""
    import importlib.util

    for module, driver in (("psycopg", "postgresql+psycopg"), ("psycopg2", "postgresql+psycopg2")):
        if importlib.util.find_spec(module) is not None:
            return parsed.set(drivername=driver).render_as_string(hide_password=False)
    return parsed.render_as_string(hide_password=False)


@contextlib.contextmanager
def _quiet_optuna_warnings():
    import warnings

    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.simplefilter("ignore", FutureWarning)
        yield


def artifact_dir_for(storage_url: str, artifact_dir: Optional[Union[str, os.PathLike]] = None) -> Path:
    """Where the artifact store lives: ``artifact_dir`` if given; for a SQLite file,
    an ``artifacts`` folder next to it; otherwise ``studies/artifacts`` (give
    ``artifact_dir`` on a shared filesystem for multi-node runs)."""
    if artifact_dir is not None:
        return Path(artifact_dir).expanduser().resolve()
    import sqlalchemy

    parsed = sqlalchemy.engine.make_url(storage_url)
    if parsed.get_backend_name() == "sqlite" and parsed.database and parsed.database != ":memory:":
        return Path(parsed.database).expanduser().resolve().parent / "artifacts"
    return Path("studies", "artifacts").resolve()


def artifact_store_for(storage_url: Optional[str] = None,
                       artifact_dir: Optional[Union[str, os.PathLike]] = None) -> "Any":
    """The ``optuna.artifacts.FileSystemArtifactStore`` used with ``storage_url``."""
    from optuna.artifacts import FileSystemArtifactStore

    path = artifact_dir_for(storage_url or default_storage_url(), artifact_dir)
    path.mkdir(parents=True, exist_ok=True)
    return FileSystemArtifactStore(path)


def make_sampler(name: str, seed: Optional[int] = None) -> "Any":
    """``tpe`` (TPESampler), ``random`` or ``gp`` (GPSampler, needs scipy), seeded."""
    import optuna

    with _quiet_optuna_warnings():
        if name == "tpe":
            return optuna.samplers.TPESampler(seed=seed)
        if name == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        if name == "gp":
            try:
                import scipy  # noqa: F401  GPSampler's acquisition optimiser
            except ImportError as exc:
                raise ValueError("the gp sampler needs scipy: pip install scipy") from exc
            return optuna.samplers.GPSampler(seed=seed)
    raise ValueError(f"unknown sampler {name!r}; expected one of {list(SAMPLERS)}")


def make_pruner(name: str, max_epochs: Optional[int] = None) -> "Any":
    """``median`` (the paper's MedianPruner: 5 startup trials, 10 warm-up epochs,
    fewer when ``max_epochs`` is small), ``hyperband`` (resource = epochs) or ``none``."""
    import optuna

    if name == "median":
        warmup = 10 if max_epochs is None else min(10, max(1, max_epochs // 2))
        return optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=warmup)
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=max_epochs or "auto",
                                              reduction_factor=3)
    if name == "none":
        return optuna.pruners.NopPruner()
    raise ValueError(f"unknown pruner {name!r}; expected one of {list(PRUNERS)}")


def _model_size_hint(hidden_size: int) -> str:
    # the seed's defaults switch at ~3B parameters; hidden width is a proxy known
    # without loading weights (Gemma2-2B: 2304, Pythia-2.8B: 2560, Llama3-8B: 4096)
    return "large" if hidden_size > 3000 else "small"


# ----------------------------------------------------------------------------- data


@dataclass(frozen=True)
class _DataSpec:
    """Everything that decides the arrays a study trains on (picklable, for workers)."""

    model: str
    task: str
    shots: Optional[int] = None
    max_train: Optional[int] = None
    max_eval: Optional[int] = None
    data_seed: int = 0
    data_dir: Optional[str] = None
    cache_dir: Optional[str] = None
    device: str = "auto"


@dataclass
class _StudyData:
    """The cached arrays of one (model, task) and what studies record about them."""

    task_kind: str
    metric: str
    train: Tuple[Any, Any]
    validation: Tuple[Any, Any]
    test: Optional[Tuple[Any, Any]]
    num_layers: int
    hidden_size: int
    num_classes: Optional[int]
    label_names: List[str]
    split_sizes: Dict[str, int]
    cache_keys: Dict[str, str]
    model_revision: str = ""


def _load_task_data(spec: _DataSpec) -> Any:
    """Load the task and apply the data options (few-shot, caps); no model loads."""
    from .tasks import few_shot, load_task, subsample

    task_data = load_task(spec.task, spec.data_dir)
    if spec.shots is not None:
        if task_data.kind != "classification":
            raise ValueError(f"--shots needs a classification task; {spec.task!r} is {task_data.kind}")
        task_data = few_shot(task_data, spec.shots, seed=spec.data_seed)
    if spec.max_train is not None:
        task_data = subsample(task_data, spec.max_train, seed=spec.data_seed, splits=["train"])
    if spec.max_eval is not None:
        eval_splits = [name for name in ("validation", "test") if name in task_data.splits]
        task_data = subsample(task_data, spec.max_eval, seed=spec.data_seed, splits=eval_splits)
    return task_data


def _load_study_data(spec: _DataSpec, *, with_test: bool, progress: bool = True,
                     task_data: Any = None) -> _StudyData:
    """Embeddings of every needed split, from the cache (extracting on a miss)."""
    from .cache import load_task_embeddings

    if task_data is None:
        task_data = _load_task_data(spec)
    splits = ["train", "validation"] + (["test"] if with_test else [])
    embeddings = load_task_embeddings(spec.model, task_data, data_dir=spec.data_dir, cache_dir=spec.cache_dir,
                                      splits=splits, device=spec.device, progress=progress)
    by_split = embeddings.splits
    kind = task_data.spec.kind
    return _StudyData(
        task_kind=kind,
        metric=task_data.spec.metric,
        train=(by_split["train"].features, by_split["train"].labels),
        validation=(by_split["validation"].features, by_split["validation"].labels),
        test=(by_split["test"].features, by_split["test"].labels) if with_test else None,
        num_layers=int(embeddings.num_layers),
        hidden_size=int(embeddings.hidden_size),
        num_classes=len(embeddings.label_names) if kind == "classification" else None,
        label_names=list(embeddings.label_names),
        split_sizes={name: int(split.labels.shape[0]) for name, split in by_split.items()},
        cache_keys=dict(embeddings.cache_keys),
    )


# ----------------------------------------------------------------------------- trials


def _suggest(trial: Any, encoder: str, max_epochs: Optional[int]) -> Any:
    from .tuning import suggest_config

    config = suggest_config(trial, encoder)
    if max_epochs is not None and config.epochs > max_epochs:
        config = config.replace(epochs=max_epochs)
    return config


def recommended_params(encoder: str, hidden_size: int) -> Dict[str, Any]:
    """The family's ``recommended_config`` as Optuna params of ``suggest_config``'s search space.

    The config's fields are offered to ``suggest_config`` through a
    ``FixedTrial``; what it asks for is what a study enqueues, so the first trial
    runs exactly the recommended configuration.
    """
    import optuna

    from .tuning import recommended_config, suggest_config

    config = recommended_config(encoder, model_size_hint=_model_size_hint(hidden_size))
    values = {k: v for k, v in config.to_dict().items() if k != "family"}
    fixed = optuna.trial.FixedTrial(values)
    with _quiet_optuna_warnings():
        suggest_config(fixed, encoder)
    return dict(fixed.params)


class _Objective:
    """One trial: suggest a config, train it on train, return the best validation metric."""

    def __init__(self, encoder: str, data: _StudyData, *, seed: int, device: str,
                 max_epochs: Optional[int]) -> None:
        self.encoder = encoder
        self.data = data
        self.seed = seed
        self.device = device
        self.max_epochs = max_epochs

    def __call__(self, trial: Any) -> float:
        import optuna

        from .engine import select_best_layer, train_encoder

        data = self.data
        config = _suggest(trial, self.encoder, self.max_epochs)
        trial.set_user_attr("config", config.to_dict())  # stored first, so failed trials show it too
        common = dict(task_kind=data.task_kind, num_classes=data.num_classes, seed=self.seed, device=self.device)
        if self.encoder == "best-layer":
            # the layer is chosen on validation inside the trial; the search covers the recipe
            layer, result, scores = select_best_layer(config, data.train, data.validation, **common)
            config = config.replace(layer=layer)
            trial.set_user_attr("config", config.to_dict())
            trial.set_user_attr("layer", int(layer))
            trial.set_user_attr("layer_scores", [float(s) for s in scores])
        else:
            def report(epoch: int, value: float) -> None:
                trial.report(float(value), epoch)
                if trial.should_prune():
                    trial.set_user_attr("epochs_run", int(epoch))
                    _write_live_note(trial, data.metric, state="pruned")
                    raise optuna.TrialPruned(f"pruned at epoch {epoch} ({data.metric} {value:.4f})")

            result = train_encoder(config, data.train, data.validation, epoch_callback=report, **common)
        trial.set_user_attr("val_metric", float(result.best_val_metric))
        trial.set_user_attr("num_trainable_params", int(result.num_trainable_params))
        trial.set_user_attr("epochs_run", int(result.epochs_run))
        trial.set_user_attr("best_epoch", int(result.best_epoch))
        trial.set_user_attr("seconds", round(float(result.seconds), 3))
        _write_live_note(trial, data.metric)
        return float(result.best_val_metric)


def _write_live_note(trial: Any, metric: str, state: str = "complete") -> None:
    """The trial's dashboard note, written as it finishes so it shows while the search runs
    (in every worker process); ``write_notes`` at the end of a run fills in any that are missing."""
    from .dashboard import write_trial_note

    try:
        write_trial_note(trial.study, trial, state=state, metric=metric)
    except Exception as exc:  # a note is for reading: it must never fail a trained trial
        logger.warning("trial %d: could not write its dashboard note: %s", trial.number, exc)


class _NoInterruptTraceback(logging.Filter):
    """Ctrl-C is not a crash: keep Optuna's "trial failed" line, drop its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], KeyboardInterrupt):
            record.exc_info = None
            record.exc_text = None
        return True


def _quiet_interrupt_tracebacks() -> None:
    for handler in logging.getLogger("optuna").handlers:
        if not any(isinstance(f, _NoInterruptTraceback) for f in handler.filters):
            handler.addFilter(_NoInterruptTraceback())


def _catchable() -> Tuple[type, ...]:
    # a configuration too large for the accelerator fails its trial, not the study
    import torch

    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom,) if oom is not None else ()


# ----------------------------------------------------------------------------- study setup


def _identity(model: str, task: str, encoder: str, spec: _DataSpec, max_epochs: Optional[int]) -> Dict[str, Any]:
    return {"model": model, "task": task, "encoder": encoder, "shots": spec.shots, "max_train": spec.max_train,
            "max_eval": spec.max_eval, "max_epochs": max_epochs, "data_seed": spec.data_seed}


def _check_identity(study_name: str, stored: Mapping[str, Any], wanted: Mapping[str, Any]) -> None:
    if "model" not in stored:
        raise StudyConflictError(
            f"study {study_name!r} exists in the storage but was not created by ilge-search run; "
            "choose another --study-name"
        )
    different = {key: (stored.get(key), wanted[key]) for key in IDENTITY_KEYS if stored.get(key) != wanted[key]}
    if different:
        details = ", ".join(f"{key}: stored {old!r}, requested {new!r}" for key, (old, new) in different.items())
        raise StudyConflictError(
            f"study {study_name!r} already exists for a different setting ({details}). Pass another "
            "--study-name (or drop it to get the default name for this setting), or a different --storage"
        )


def _existing_study(storage: Any, study_name: str) -> Optional[Any]:
    import optuna

    try:
        return optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        return None


def _precheck_existing(storage: Any, study_name: str, identity: Mapping[str, Any]) -> None:
    """Refuse a study name already used for something else, before any extraction."""
    existing = _existing_study(storage, study_name)
    if existing is None:
        return
    attrs = existing.user_attrs
    if "model" in attrs or existing.get_trials(deepcopy=False):
        _check_identity(study_name, attrs, identity)
    # else: an empty study without attrs is being created right now (or its creator died);
    # _create_or_load waits for it or adopts it


def _wait_until_ready(study: Any, timeout: float = READY_WAIT_SECONDS) -> bool:
    """Another process created the study; wait for it to finish setting it up."""
    deadline = time.monotonic() + timeout
    while True:
        if study._storage.get_study_user_attrs(study._study_id).get(READY_ATTR):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)


def _create_or_load(storage: Any, study_name: str, identity: Dict[str, Any], data: _StudyData,
                    artifact_dir: Path, sampler: Any = None, pruner: Any = None) -> Tuple[Any, bool]:
    """Create the study (identity attrs, recommended trial enqueued once) or load it.

    Several processes may race to create the same study: ``create_study``
    without ``load_if_exists`` lets exactly one win; the others load it and wait
    until the winner has marked it ready, so the recommended config is always
    enqueued once and before any sampled trial.
    """
    import optuna

    direction = "minimize" if data.metric == "loss" else "maximize"
    try:
        study = optuna.create_study(study_name=study_name, storage=storage, direction=direction, sampler=sampler,
                                    pruner=pruner)
        created = True
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=study_name, storage=storage, sampler=sampler, pruner=pruner)
        created = False

    attrs = study.user_attrs
    if not created:
        if not attrs.get(READY_ATTR) and not _wait_until_ready(study):
            if study.trials:
                _check_identity(study_name, study.user_attrs, identity)
            created = True  # its creator died before setting it up: finish the job
        else:
            _check_identity(study_name, study.user_attrs, identity)
            _check_shapes(study_name, study.user_attrs, data)

    if created:
        record = dict(identity)
        record.update({
            "task_kind": data.task_kind,
            "metric": data.metric,
            "direction": direction,
            "num_layers": data.num_layers,
            "hidden_size": data.hidden_size,
            "num_classes": data.num_classes,
            "label_names": data.label_names,
            "split_sizes": data.split_sizes,
            "cache_keys": data.cache_keys,
            "model_revision": data.model_revision,
            "ilge_search_version": __version__,
            "artifact_dir": str(artifact_dir),
        })
        for key, value in record.items():
            study.set_user_attr(key, value)
        if not any(t.user_attrs.get("recommended") for t in study.trials):
            params = recommended_params(identity["encoder"], data.hidden_size)
            study.enqueue_trial(params, user_attrs={"recommended": True})
        study.set_user_attr(READY_ATTR, True)
    return study, created


def _check_shapes(study_name: str, stored: Mapping[str, Any], data: _StudyData) -> None:
    for key in ("num_layers", "hidden_size", "task_kind", "metric"):
        if key in stored and stored[key] != getattr(data, key):
            raise StudyConflictError(
                f"study {study_name!r} was run on embeddings with {key}={stored[key]!r}, the cache now gives "
                f"{getattr(data, key)!r}; use another --study-name"
            )


# ----------------------------------------------------------------------------- optimisation


def _split_trials(n_trials: Optional[int], workers: int) -> List[Optional[int]]:
    """Per-worker trial counts summing to ``n_trials`` exactly (``None``: until timeout)."""
    if n_trials is None:
        return [None] * workers
    base, extra = divmod(n_trials, workers)
    counts = [base + (1 if i < extra else 0) for i in range(workers)]
    return [c for c in counts if c > 0]


class _ProgressCallback:
    """tqdm bar over finished trials with the best value so far."""

    def __init__(self, bar: Any, metric: str) -> None:
        self.bar = bar
        self.metric = metric

    def __call__(self, study: Any, trial: Any) -> None:
        self.bar.update(1)
        with contextlib.suppress(ValueError):
            self.bar.set_postfix_str(f"best {self.metric} {study.best_value:.4f} (trial {study.best_trial.number})")


@dataclass(frozen=True)
class _WorkerJob:
    """What a spawned worker process needs to run its share of trials."""

    storage_url: str
    study_name: str
    encoder: str
    data: _DataSpec
    n_trials: Optional[int]
    timeout: Optional[float]
    sampler: str
    pruner: str
    seed: int
    sampler_seed: Optional[int]
    max_epochs: Optional[int]
    heartbeat_interval: Optional[int]
    grace_period: Optional[int]
    max_retry: int
    torch_threads: int
    total_trials: Optional[int] = None


def _total_reached(study: Any, total_trials: Optional[int]) -> bool:
    """Whether the study's finished trials plus those running now in any process reach ``total_trials``."""
    if total_trials is None:
        return False
    from optuna.trial import TrialState

    counted = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
    return len(study.get_trials(deepcopy=False, states=counted)) >= total_trials


def _total_trials_callbacks(total_trials: Optional[int]) -> List[Callable[[Any, Any], None]]:
    """Stop this process's optimise loop once the study holds ``total_trials`` trials.

    Counting running trials too means a process stops as soon as the trials in flight in
    every process will reach the cap; two processes starting a trial in the same instant
    can still overshoot it by one each. Failed trials do not count: they are retried.
    """
    if total_trials is None:
        return []

    def stop_at_total(study: Any, trial: Any) -> None:
        if _total_reached(study, total_trials):
            study.stop()

    return [stop_at_total]


def _worker_main(job: _WorkerJob) -> None:
    """Entry point of a spawned worker: load the cached embeddings, optimise, exit."""
    import optuna
    import torch

    torch.set_num_threads(job.torch_threads)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    _quiet_interrupt_tracebacks()
    try:
        storage = make_storage(job.storage_url, heartbeat_interval=job.heartbeat_interval,
                               grace_period=job.grace_period, max_retry=job.max_retry)
        study = optuna.load_study(study_name=job.study_name, storage=storage,
                                  sampler=make_sampler(job.sampler, job.sampler_seed),
                                  pruner=make_pruner(job.pruner, job.max_epochs))
        if _total_reached(study, job.total_trials):
            return  # other processes already filled the study: no need to load the embeddings
        data = _load_study_data(job.data, with_test=False, progress=False)
        objective = _Objective(job.encoder, data, seed=job.seed, device=job.data.device, max_epochs=job.max_epochs)
        study.optimize(objective, n_trials=job.n_trials, timeout=job.timeout, catch=_catchable(),
                       callbacks=_total_trials_callbacks(job.total_trials))
    except KeyboardInterrupt:
        raise SystemExit(130)


def _optimize_in_workers(study: Any, jobs: List[_WorkerJob], metric: str, show_progress: bool,
                         total: Optional[int]) -> None:
    """Run ``jobs`` in spawned processes; show progress by polling the storage."""
    from optuna.trial import TrialState
    from tqdm.auto import tqdm

    finished_states = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    baseline = len(study.get_trials(deepcopy=False, states=finished_states))
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=_worker_main, args=(job,), name=f"ilge-worker-{i}")
                 for i, job in enumerate(jobs)]
    for process in processes:
        process.start()
    bar = tqdm(total=total, desc=f"{study.study_name} ({len(jobs)} workers)", unit="trial", disable=not show_progress)
    try:
        while any(p.is_alive() for p in processes):
            done = len(study.get_trials(deepcopy=False, states=finished_states)) - baseline
            bar.update(done - bar.n)
            with contextlib.suppress(ValueError):
                bar.set_postfix_str(f"best {metric} {study.best_value:.4f}")
            time.sleep(1.0)
        done = len(study.get_trials(deepcopy=False, states=finished_states)) - baseline
        bar.update(done - bar.n)
    except KeyboardInterrupt:
        # the workers got the terminal's SIGINT too; make sure (a test harness may only signal us)
        for process in processes:
            if process.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGINT)
        for process in processes:
            process.join(timeout=60)
            if process.is_alive():
                process.terminate()  # its trial is failed later by the heartbeat
        raise
    finally:
        bar.close()
        for process in processes:
            process.join()
    failed = [(p.name, p.exitcode) for p in processes if p.exitcode != 0]
    if failed:
        raise RuntimeError(
            f"worker process(es) failed: {failed}; their error is printed above. Finished trials are stored; "
            "rerun the same command to resume"
        )


# ----------------------------------------------------------------------------- final evaluation


def _final_is_current(study: Any, best_number: int, seeds: List[int], max_epochs: Optional[int]) -> bool:
    attrs = study.user_attrs
    return (attrs.get("final_trial") == best_number and attrs.get("final_seeds") == seeds
            and attrs.get("final_max_epochs", None) == max_epochs and "final_test_mean" in attrs)


def _final_evaluation(study: Any, data: _StudyData, *, encoder: str, seeds: List[int], device: str,
                      artifact_store: Any, zero_shot: Mapping[str, Tuple[Any, Any]] = {},
                      show_progress: bool = True) -> None:
    """Retrain the best trial's config with each seed; evaluate on test once per seed."""
    import torch
    from optuna.artifacts import upload_artifact
    from safetensors.torch import save_file
    from tqdm.auto import tqdm

    from .engine import evaluate, train_encoder

    best = study.best_trial
    config = config_from_dict(best.user_attrs["config"])
    test_scores: List[float] = []
    val_scores: List[float] = []
    zero_shot_scores: Dict[str, List[float]] = {name: [] for name in zero_shot}
    best_model, best_seed, best_val = None, None, -math.inf
    for seed in tqdm(seeds, desc=f"final {encoder} ({len(seeds)} seeds)", disable=not show_progress, leave=False):
        result = train_encoder(config, data.train, data.validation, task_kind=data.task_kind,
                               num_classes=data.num_classes, seed=seed, device=device)
        test_scores.append(float(evaluate(result.model, *data.test, task_kind=data.task_kind)[data.metric]))
        val_scores.append(float(result.best_val_metric))
        for name, (features, labels) in zero_shot.items():
            zero_shot_scores[name].append(float(evaluate(result.model, features, labels, "similarity")["spearman"]))
        if result.best_val_metric > best_val:  # the artifact is the best seed by validation, never by test
            best_model, best_seed, best_val = result.model, seed, result.best_val_metric

    artifacts: Dict[str, str] = {}
    if artifact_store is not None:
        with tempfile.TemporaryDirectory(prefix="ilge-final-") as tmp:
            weights_path = Path(tmp, "model.safetensors")
            state = {k: v.detach().cpu().contiguous() for k, v in best_model.state_dict().items()}
            save_file(state, str(weights_path))
            meta_path = Path(tmp, "config.json")
            meta_path.write_text(json.dumps({
                "config": config.to_dict(),
                "model": study.user_attrs.get("model"),
                "task": study.user_attrs.get("task"),
                "task_kind": data.task_kind,
                "metric": data.metric,
                "num_layers": data.num_layers,
                "hidden_size": data.hidden_size,
                "num_classes": data.num_classes,
                "label_names": data.label_names,
                "score_range": getattr(best_model, "score_range", None),
                "seed": best_seed,
                "val_metric": best_val,
                "trial": best.number,
                "ilge_search_version": __version__,
                "torch_version": torch.__version__,
            }, indent=2))
            artifacts["weights"] = upload_artifact(study_or_trial=study, file_path=str(weights_path),
                                                   artifact_store=artifact_store)
            artifacts["config"] = upload_artifact(study_or_trial=study, file_path=str(meta_path),
                                                  artifact_store=artifact_store, mimetype="application/json")

    std = statistics.stdev(test_scores) if len(test_scores) > 1 else 0.0
    record = {
        "final_test_mean": statistics.fmean(test_scores),
        "final_test_std": std,
        "final_test_scores": test_scores,
        "final_val_scores": val_scores,
        "final_seeds": seeds,
        "final_trial": best.number,
        "final_config": config.to_dict(),
        "final_artifacts": artifacts,
        "final_artifact_seed": best_seed,
    }
    if zero_shot_scores:
        record["final_zero_shot"] = {
            name: {"mean": statistics.fmean(scores), "std": statistics.stdev(scores) if len(scores) > 1 else 0.0,
                   "scores": scores}
            for name, scores in zero_shot_scores.items()
        }
    for key, value in record.items():
        study.set_user_attr(key, value)


# ----------------------------------------------------------------------------- public entry points


def _fail_trials_that_never_beat(study: Any, storage: Any) -> None:
    """Fail (and retry, as Optuna's stale-trial check would) RUNNING trials without any heartbeat that
    started more than the grace period ago.

    Optuna only fails RUNNING trials whose heartbeat went stale; a worker killed between ``study.ask()``
    and its heartbeat thread's first beat (the sampler runs in between) leaves a trial with no heartbeat
    at all, RUNNING forever.
    """
    import datetime

    import optuna
    from optuna.storages._rdb import models

    if getattr(storage, "heartbeat_interval", None) is None:
        return
    running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    if not running:
        return
    grace = storage.grace_period if storage.grace_period is not None else 2 * storage.heartbeat_interval
    session = storage.scoped_session()
    try:
        beating = {row[0] for row in session.query(models.TrialHeartbeatModel.trial_id).filter(
            models.TrialHeartbeatModel.trial_id.in_([t._trial_id for t in running]))}
    finally:
        session.close()
    now = datetime.datetime.now()  # the clock Optuna stamps datetime_start with
    callback = storage.get_heartbeat_stale_trial_callback()
    for trial in running:
        if trial._trial_id in beating or trial.datetime_start is None:
            continue
        if (now - trial.datetime_start).total_seconds() <= grace:
            continue  # maybe a live worker still between ask() and its first heartbeat
        try:
            failed = storage.set_trial_state_values(trial._trial_id, state=optuna.trial.TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:  # another process got there first
            continue
        if failed:
            logger.warning("trial %d never sent a heartbeat (its worker died); marked FAIL", trial.number)
            if callback is not None:
                callback(study, storage.get_trial(trial._trial_id))


def _check_positive(name: str, value: Any, allow_none: bool = True, allow_zero: bool = False) -> None:
    if value is None and allow_none:
        return
    low = 0 if allow_zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def run_study(
    model: str,
    task: str,
    encoders: Union[str, Sequence[str]] = "cayley",
    *,
    n_trials: Union[int, Mapping[str, int], None] = 20,
    timeout: Optional[float] = None,
    total_trials: Optional[int] = None,
    storage: Optional[str] = None,
    study_name: Optional[str] = None,
    sampler: str = "tpe",
    pruner: str = "median",
    seed: int = 0,
    workers: int = 1,
    final_seeds: int = 3,
    shots: Optional[int] = None,
    max_train: Optional[int] = None,
    max_eval: Optional[int] = None,
    max_epochs: Optional[int] = None,
    data_seed: int = 0,
    zero_shot_tasks: Sequence[str] = (),
    data_dir: Optional[Union[str, os.PathLike]] = None,
    cache_dir: Optional[Union[str, os.PathLike]] = None,
    device: str = "auto",
    artifact_dir: Optional[Union[str, os.PathLike]] = None,
    threads: Optional[int] = None,
    heartbeat_interval: Optional[int] = 60,
    grace_period: Optional[int] = None,
    max_retry: int = 3,
    callbacks: Sequence[Callable[[Any, Any], None]] = (),
    show_progress: bool = True,
) -> List[StudyResult]:
    """Run (or resume) one Optuna study per encoder on a model's cached task embeddings.

    Args:
        model: an alias (``minilm-l6``), local folder or Hugging Face id.
        task: a registered task name or a custom task file/folder.
        encoders: families and baselines (see :data:`ENCODER_CHOICES`), or ``"all"``.
        n_trials: trials to add in this call (complete, pruned or failed), split
            exactly across ``workers``; a mapping gives one count per encoder;
            ``0`` only (re)runs the final evaluation; ``None`` runs until ``timeout``.
        timeout: seconds per study (per worker) before no new trial starts.
        total_trials: a cap on the study's trials shared by every process on the
            storage (independently started nodes included): no process starts a new
            trial once the complete, pruned and running trials reach it. With
            ``n_trials=None`` a worker runs until the cap (or ``timeout``).
        storage: any Optuna RDB URL (default ``sqlite:///studies/ilge.db``).
        study_name: only with one encoder (default :func:`default_study_name`).
        sampler, pruner, seed: ``tpe|random|gp``, ``median|hyperband|none``; the
            seed seeds the sampler (worker ``i`` uses ``seed + i``) and every trial's training.
        workers: processes optimising the same study in parallel.
        final_seeds: seeds the best config is retrained with for the test score (0: skip).
        shots: keep this many training examples per label (few-shot).
        max_train, max_eval: seeded stratified caps on train / on validation and
            test (to keep a study small); they are part of the study's identity.
        max_epochs: cap on every config's ``epochs``.
        data_seed: seed of the few-shot and subsampling draws.
        zero_shot_tasks: similarity tasks whose test split every final seed's
            model is also evaluated on (the paper's zero-shot STS protocol).
        data_dir, cache_dir, device: task data, embedding cache, device.
        artifact_dir: artifact store folder (default: :func:`artifact_dir_for`).
        threads: torch CPU threads for this call and per worker (default: unchanged
            in-process, ``cpus // workers`` per worker). The encoders are small, so on
            a CPU one thread per worker and ``workers`` = cores is usually fastest;
            several threads per process on busy cores can be many times slower.
        heartbeat_interval, grace_period, max_retry: dead-worker detection and retry.
        callbacks: extra ``f(study, frozen_trial)`` run after each trial (in-process only).
        show_progress: tqdm bars for extraction, trials and final seeds.

    Returns:
        One :class:`StudyResult` per encoder, read back from the storage.

    Raises:
        ValueError: bad arguments, unknown model or task, :class:`StorageError`,
            :class:`StudyConflictError` -- all before any model loads.
        KeyboardInterrupt: after the running trial was marked FAIL; every
            finished trial is stored and rerunning resumes.
    """
    from .models import resolve_model

    # ---- 1. arguments, storage and existing studies, before anything expensive
    encoder_list = resolve_encoders(encoders)
    if isinstance(n_trials, Mapping):
        unknown = set(n_trials) - set(encoder_list)
        if unknown:
            raise ValueError(f"n_trials has counts for encoders not run: {sorted(unknown)}")
        trial_counts = {name: n_trials.get(name) for name in encoder_list}
    else:
        trial_counts = {name: n_trials for name in encoder_list}
    for name, count in trial_counts.items():
        _check_positive(f"n_trials[{name}]", count, allow_zero=True)
        if count is None and timeout is None and total_trials is None:
            raise ValueError("give n_trials, total_trials or a timeout, otherwise the study never stops")
    _check_positive("total_trials", total_trials)
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
    _check_positive("workers", workers, allow_none=False)
    _check_positive("threads", threads)
    _check_positive("final_seeds", final_seeds, allow_none=False, allow_zero=True)
    for name, value in (("shots", shots), ("max_train", max_train), ("max_eval", max_eval),
                        ("max_epochs", max_epochs)):
        _check_positive(name, value)
    if study_name is not None and len(encoder_list) > 1:
        raise ValueError("study_name names one study; give exactly one encoder with it, or drop it")
    if sampler not in SAMPLERS:
        raise ValueError(f"unknown sampler {sampler!r}; expected one of {list(SAMPLERS)}")
    make_pruner(pruner, max_epochs)  # validates the name

    storage_url = storage or default_storage_url()
    rdb = make_storage(storage_url, heartbeat_interval=heartbeat_interval, grace_period=grace_period,
                       max_retry=max_retry)
    if workers > 1 and rdb.url.startswith("sqlite") and ":memory:" in rdb.url:
        raise ValueError("workers > 1 need a storage every process can open; an in-memory SQLite is not one")
    spec = _DataSpec(model=str(model), task=str(task), shots=shots, max_train=max_train, max_eval=max_eval,
                     data_seed=data_seed, data_dir=None if data_dir is None else str(data_dir),
                     cache_dir=None if cache_dir is None else str(cache_dir), device=device)
    names = {enc: study_name or default_study_name(spec.model, spec.task, enc, shots=shots, max_train=max_train,
                                                   max_eval=max_eval, max_epochs=max_epochs)
             for enc in encoder_list}
    identities = {enc: _identity(spec.model, spec.task, enc, spec, max_epochs) for enc in encoder_list}
    for enc in encoder_list:
        _precheck_existing(rdb, names[enc], identities[enc])

    source = resolve_model(spec.model, cache_dir, materialize=False)  # unknown model: clear error, nothing loaded
    task_data = _load_task_data(spec)
    zero_shot_names = list(zero_shot_tasks)
    if zero_shot_names and task_data.kind != "similarity":
        raise ValueError("zero_shot_tasks are evaluated with a similarity encoder; the study's task must be one")

    import torch

    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _run_studies(spec, source, task_data, encoder_list, names, identities, trial_counts, rdb,
                            storage_url=storage_url, timeout=timeout, total_trials=total_trials, sampler=sampler, pruner=pruner, seed=seed,
                            workers=workers, final_seeds=final_seeds, max_epochs=max_epochs,
                            zero_shot_names=zero_shot_names, artifact_dir=artifact_dir, threads=threads,
                            heartbeat_interval=heartbeat_interval, grace_period=grace_period,
                            max_retry=max_retry, callbacks=callbacks, show_progress=show_progress)
    finally:
        torch.set_num_threads(previous_threads)


def _run_studies(spec: _DataSpec, source: Any, task_data: Any, encoder_list: List[str], names: Dict[str, str],
                 identities: Dict[str, Dict[str, Any]], trial_counts: Dict[str, Optional[int]], rdb: Any, *,
                 storage_url: str, timeout: Optional[float], total_trials: Optional[int], sampler: str, pruner: str, seed: int, workers: int,
                 final_seeds: int, max_epochs: Optional[int], zero_shot_names: List[str],
                 artifact_dir: Optional[Union[str, os.PathLike]], threads: Optional[int],
                 heartbeat_interval: Optional[int], grace_period: Optional[int], max_retry: int,
                 callbacks: Sequence[Callable[[Any, Any], None]], show_progress: bool) -> List[StudyResult]:
    """Steps 2-5 of :func:`run_study` once the arguments are checked."""
    import optuna

    device = spec.device
    # ---- 2. embeddings: extracted once, here, before any worker starts
    data = _load_study_data(spec, with_test=final_seeds > 0, progress=show_progress, task_data=task_data)
    data.model_revision = source.revision
    zero_shot_data: Dict[str, Tuple[Any, Any]] = {}
    for name in zero_shot_names:
        zero_spec = dataclasses.replace(spec, task=name, shots=None, max_train=None)
        zero_task = _load_task_data(zero_spec)
        if zero_task.kind != "similarity":
            raise ValueError(f"zero-shot task {name!r} is {zero_task.kind}, not a similarity task")
        from .cache import load_task_embeddings

        emb = load_task_embeddings(spec.model, zero_task, data_dir=spec.data_dir, cache_dir=spec.cache_dir,
                                   splits=["test"], device=device, progress=show_progress)
        zero_shot_data[name] = (emb.splits["test"].features, emb.splits["test"].labels)

    artifact_path = artifact_dir_for(storage_url, artifact_dir)
    artifact_store = artifact_store_for(storage_url, artifact_dir) if final_seeds > 0 else None
    results: List[StudyResult] = []
    for enc in encoder_list:
        name = names[enc]
        count = trial_counts[enc]
        # ---- 3. create or load
        study, created = _create_or_load(rdb, name, identities[enc], data, artifact_path,
                                         sampler=make_sampler(sampler, seed), pruner=make_pruner(pruner, max_epochs))
        _fail_trials_that_never_beat(study, rdb)
        before = finished_trial_count(study)
        logger.info("%s study %s (%d finished trials); adding %s", "created" if created else "resuming", name,
                    before, "trials until timeout" if count is None else f"{count} trials")

        # ---- 4. optimise
        if _total_reached(study, total_trials):
            logger.info("%s: the study already holds total_trials=%d trials; adding none", name, total_trials)
        elif count is None or count > 0:
            _quiet_interrupt_tracebacks()
            if workers == 1:
                objective = _Objective(enc, data, seed=seed, device=device, max_epochs=max_epochs)
                from tqdm.auto import tqdm

                with tqdm(total=count, desc=name, unit="trial", disable=not show_progress) as bar:
                    study.optimize(objective, n_trials=count, timeout=timeout, catch=_catchable(),
                                   callbacks=[_ProgressCallback(bar, data.metric), *callbacks,
                                              *_total_trials_callbacks(total_trials)])
            else:
                per_worker = threads or max(1, (os.cpu_count() or 1) // workers)
                jobs = [_WorkerJob(storage_url=storage_url, study_name=name, encoder=enc, data=spec,
                                   n_trials=share, timeout=timeout, sampler=sampler, pruner=pruner, seed=seed,
                                   sampler_seed=None if seed is None else seed + i, max_epochs=max_epochs,
                                   heartbeat_interval=heartbeat_interval, grace_period=grace_period,
                                   max_retry=max_retry, torch_threads=per_worker, total_trials=total_trials)
                        for i, share in enumerate(_split_trials(count, workers))]
                _optimize_in_workers(study, jobs, data.metric, show_progress, count)

        # ---- 5. final evaluation on test, once per seed
        complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if final_seeds > 0 and complete:
            best_number = study.best_trial.number
            seeds = [seed + 1000 + i for i in range(final_seeds)]
            if _final_is_current(study, best_number, seeds, max_epochs):
                logger.info("%s: final scores of trial %d are up to date", name, best_number)
            else:
                _final_evaluation(study, data, encoder=enc, seeds=seeds, device=device,
                                  artifact_store=artifact_store, zero_shot=zero_shot_data,
                                  show_progress=show_progress)
                study.set_user_attr("final_max_epochs", max_epochs)
        elif final_seeds > 0:
            logger.warning("%s: no complete trial yet, so no final evaluation", name)

        from .dashboard import write_notes  # a Markdown note per trial and per study, for optuna-dashboard

        write_notes(study)
        result = study_result(study, storage_url)
        results.append(result)
        logger.info("%s", _summary_line(result))
    return results


def _summary_line(result: StudyResult) -> str:
    text = (f"{result.study_name}: {result.n_complete} complete, {result.n_pruned} pruned, "
            f"{result.n_failed} failed")
    if result.best_value is not None:
        text += f"; best validation {result.metric} {result.best_value:.4f} (trial {result.best_trial})"
    if result.test_mean is not None:
        text += (f"; test {result.metric} {result.test_mean:.4f} +- {result.test_std:.4f} "
                 f"over {len(result.test_scores)} seeds")
    return text


def finished_trial_count(study: Any) -> int:
    """Complete plus pruned trials of ``study``."""
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))


def study_result(study: Any, storage_url: str = "") -> StudyResult:
    """A :class:`StudyResult` from a loaded ``optuna.Study``."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    count = {state: sum(t.state == state for t in trials) for state in TrialState}
    attrs = study.user_attrs
    best = None
    if count[TrialState.COMPLETE]:
        best = study.best_trial
    return StudyResult(
        study_name=study.study_name,
        storage=_hide_password(storage_url) if storage_url else "",
        model=attrs.get("model", ""),
        task=attrs.get("task", ""),
        encoder=attrs.get("encoder", ""),
        metric=attrs.get("metric", ""),
        n_complete=count[TrialState.COMPLETE],
        n_pruned=count[TrialState.PRUNED],
        n_failed=count[TrialState.FAIL],
        best_value=None if best is None else float(best.value),
        best_trial=None if best is None else best.number,
        best_config=None if best is None else best.user_attrs.get("config"),
        test_mean=attrs.get("final_test_mean"),
        test_std=attrs.get("final_test_std"),
        test_scores=list(attrs.get("final_test_scores", [])),
        artifacts=dict(attrs.get("final_artifacts", {})),
    )


def list_studies(storage: Optional[str] = None) -> "Any":
    """One row per study in ``storage``: identity, trial counts, best validation
    value and final test mean/std (a ``pandas.DataFrame``, sorted by model, task, encoder)."""
    import optuna
    import pandas as pd

    import sqlalchemy

    url = storage or default_storage_url()
    with contextlib.suppress(sqlalchemy.exc.ArgumentError):
        parsed = sqlalchemy.engine.make_url(url)
        if (parsed.get_backend_name() == "sqlite" and parsed.database and parsed.database != ":memory:"
                and not Path(parsed.database).expanduser().exists()):
            raise StorageError(f"no study storage at {parsed.database}; run `ilge-search run` first or pass "
                               "--storage")
    rdb = make_storage(url, heartbeat_interval=None)
    rows = []
    for summary in optuna.get_all_study_summaries(rdb, include_best_trial=True):
        attrs = summary.user_attrs
        best = summary.best_trial
        rows.append({
            "study": summary.study_name,
            "model": attrs.get("model"),
            "task": attrs.get("task"),
            "encoder": attrs.get("encoder"),
            "metric": attrs.get("metric"),
            "trials": summary.n_trials,
            "best_val": None if best is None else best.value,
            "best_trial": None if best is None else best.number,
            "test_mean": attrs.get("final_test_mean"),
            "test_std": attrs.get("final_test_std"),
            "seeds": len(attrs.get("final_test_scores", [])),
        })
    columns = ["study", "model", "task", "encoder", "metric", "trials", "best_val", "best_trial", "test_mean",
               "test_std", "seeds"]
    frame = pd.DataFrame(rows, columns=columns)
    if not frame.empty:
        frame = frame.sort_values(["model", "task", "encoder", "study"], na_position="last").reset_index(drop=True)
    return frame


def format_results(results: Iterable[StudyResult]) -> str:
    """A plain-text table of :class:`StudyResult` rows (what ``run`` and ``sweep`` print)."""
    header = ("study", "trials", "pruned", "failed", "best val", "test mean +- std")
    rows = [header]
    for r in results:
        test = "-" if r.test_mean is None else f"{r.test_mean:.4f} +- {r.test_std:.4f} ({len(r.test_scores)} seeds)"
        best = "-" if r.best_value is None else f"{r.best_value:.4f} ({r.metric})"
        rows.append((r.study_name, str(r.n_complete + r.n_pruned + r.n_failed), str(r.n_pruned), str(r.n_failed),
                     best, test))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows)
