"""What a study is: its encoder, name and identity, and creating or resuming it safely.

A study's identity is its :class:`~ilge_search.record.Identity` (model, task, encoder, the options that decide
what it searches) and its data (label names and a content fingerprint of each split,
:class:`~ilge_search.record.DataRecord`). Resuming a study with another identity is refused with
:class:`StudyConflictError` (:class:`DataChangedError` when only the data changed) before any model loads.
Of several processes creating the same study, one sets it up and marks it ready
(:func:`~ilge_search.record.mark_ready`); the others wait for that mark.

A custom task is named by its file or folder name, and its default study name adds a short fingerprint of its
content (:func:`task_label`, e.g. ``minilm-l6:questions@3f9a1c2e07:cayley``). A study made before data
fingerprints existed is adopted on its first resume when its stored embedding-cache keys equal the data's now.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import TrialState

from .._version import __version__
from ..encoders import all_families, tagger_families
from ..record import (
    DATA_SPLITS,
    DataRecord,
    Identity,
    SourceRecord,
    StudyRecord,
    WarmStartRecord,
    enqueue_start_trial,
    enqueue_warm_trials,
    is_ilge_study,
    is_ready,
    mark_ready,
    save_data_fingerprints,
    save_identity,
    save_source,
    save_task_path,
    save_warm_start,
    source_record,
    study_record,
    trial_record,
    upgrade_attrs,
)
from ..storage import Storage, quiet_optuna_warnings, requeue_trial
from ..tasks.core import TASKS
from .auto import AUTO, auto_methods, is_auto
from .objectives import objective_directions, objective_metric_names, objective_suffix
from .options import StudyOptions
from .protocol import DEFAULT_PROTOCOL, paper_samples_per_label
from .trial import starting_params

if TYPE_CHECKING:  # pragma: no cover
    import optuna

    from ..tasks.core import TaskData
    from .data import StudyData

__all__ = [
    "encoder_choices",
    "StudyConflictError",
    "DataChangedError",
    "is_registered_task",
    "task_label",
    "adopt_renamed_task",
    "data_identity",
    "requeue_failed_recommended",
    "resolve_encoders",
    "default_study_name",
    "identity_name",
    "run_identity",
    "StudySetup",
    "check_identity",
    "precheck_existing",
    "create_or_load",
]


def encoder_choices() -> tuple[str, ...]:
    """What ``--encoder`` takes: every registered family, then the auto search over them."""
    return (*all_families(), AUTO)


READY_WAIT_SECONDS = 30.0
TASK_FINGERPRINT_DIGITS = 10

logger = logging.getLogger(__name__)


class StudyConflictError(ValueError):
    """A study name already used for a different model, task, encoder or data setting."""


class DataChangedError(StudyConflictError):
    """A study name already used for the same setting on other data (other texts, labels or label names)."""


def is_registered_task(task: str) -> bool:
    """Whether ``task`` names a registered task rather than a custom file or folder.

    The rule of :func:`ilge_search.tasks.core.load_task`: a registered name, unless it
    is also an existing path written with a folder separator.
    """

    key = task.strip().lower().replace("-", "_")
    return key in TASKS and not (Path(task).expanduser().exists() and os.sep in task)


def task_label(task: str, loaded: TaskData, *, fingerprint: bool = True) -> str:
    """What a study calls its task: a registered name as given; a custom file or folder by its name
    (``loaded``: the task as read, before any data option) and, with ``fingerprint``, a short
    fingerprint of its content (for study names; the ``task`` attr is the plain name)."""
    if is_registered_task(task):
        return task
    if not fingerprint:
        return loaded.name
    splits = {name: loaded.fingerprint(name) for name in loaded.splits}
    digest = hashlib.sha256(
        json.dumps({"kind": loaded.kind, "labels": list(loaded.label_names), "splits": splits}, sort_keys=True).encode()
    ).hexdigest()
    return f"{loaded.name}@{digest[:TASK_FINGERPRINT_DIGITS]}"


def adopt_renamed_task(storage: Storage, model: str, task: str, loaded: TaskData) -> TaskData:
    """``loaded`` (a custom task as read) under the name its studies know it by, when its folder was renamed.

    A custom task is identified by its content: the studies of ``model`` on the same content (the same
    fingerprint after ``@`` in their names) were made under the folder's old name, which their identity, name
    and embedding-cache keys carry. When exactly one such name exists and it is not the folder's name now, the
    task is renamed back to it (with one log line), so the run resumes those studies and reuses their cache
    entries instead of starting over.
    """

    digest = task_label(task, loaded).rsplit("@", 1)[1]
    prefix, marker = f"{model}:", f"@{digest}:"
    with quiet_optuna_warnings():
        names = optuna.get_all_study_names(storage=storage.rdb)
    known = {
        name[len(prefix) :].split(marker, 1)[0]
        for name in names
        if name.startswith(prefix) and marker in name[len(prefix) :]
    }
    known = {old for old in known if old and ":" not in old}
    if len(known) != 1 or loaded.name in known:
        return loaded
    (old,) = known
    logger.warning(
        "%s holds the data of custom task %r (same content; the folder was renamed): resuming its studies and "
        "cache entries under that name",
        task,
        old,
    )
    return dataclasses.replace(loaded, spec=dataclasses.replace(loaded.spec, name=old))


def data_identity(task_data: TaskData) -> dict[str, Any]:
    """The data a study on ``task_data`` (the task after its data options) must keep: its label names and
    each split's fingerprint, as the fields of :class:`~ilge_search.record.DataRecord` they are stored as."""
    return {
        "label_names": list(task_data.label_names),
        "data_fingerprints": {name: task_data.fingerprint(name) for name in DATA_SPLITS if name in task_data.splits},
    }


def resolve_encoders(encoders: str | Sequence[str], *, tagging: bool = False) -> list[str]:
    """Expand ``"all"`` and check names; keeps order and drops duplicates. ``"all"`` holds the tagging-only
    encoders (``cayley-word``) only for a ``tagging`` task."""
    if isinstance(encoders, str):
        encoders = [encoders]
    everything = [name for name in all_families() if tagging or name not in tagger_families()]
    out: list[str] = []
    for name in encoders:
        names = everything if name == "all" else [name]
        for item in names:
            if item not in encoder_choices():
                raise ValueError(f"unknown encoder {item!r}; expected one of {list(encoder_choices())} or 'all'")
            if item not in out:
                out.append(item)
    if not out:
        raise ValueError(f"no encoder given; pass at least one of {list(encoder_choices())} or 'all'")
    return out


def default_study_name(model: str, task: str, encoder: str, **settings: Any) -> str:
    """``model:task:encoder`` plus a suffix per non-default data, budget, objective or protocol setting.

    ``settings`` are :class:`~ilge_search.record.Identity` fields (``shots``, ``max_train``, ``cv``,
    ``objectives``, ``protocol`` ...): ``:cv5`` for trials scored on 5 folds, so such a study never merges
    with one scored on validation; ``:obj-params`` for a study that also minimises the parameters; ``:paper``
    for the paper protocol, ``:paper-16-per-label`` when its examples per label are not the task's default;
    ``:dataseed1`` for a study whose few-shot and subsampling draws (and folds) use data seed 1, not 0;
    ``:mean-words`` for a tagging study whose words are the mean of their pieces; ``:warm4`` for a study that
    enqueued 4 portfolio members after its starting configuration; ``:methods-cayley+last-layer`` for an auto
    study over other methods than every one that serves the task.

    >>> default_study_name("minilm-l6", "trec", "cayley", shots=8)
    'minilm-l6:trec:cayley:8shot'
    >>> default_study_name("minilm-l6", "trec", "cayley", protocol="paper")
    'minilm-l6:trec:cayley:paper'
    """
    return identity_name(Identity(model=str(model), task=str(task), encoder=encoder, **settings))


def identity_name(identity: Identity) -> str:
    """The default name of a study with ``identity`` (:func:`default_study_name`)."""
    parts = [identity.model, identity.task, identity.encoder]
    tagging = identity.word_pooling is not None
    for value, template in (
        (identity.shots, "{}shot"),
        (identity.max_train, "train{}"),
        (identity.max_eval, "eval{}"),
        (identity.max_epochs, "ep{}"),
        (identity.cv, "cv{}"),
        (identity.data_seed or None, "dataseed{}"),  # another draw of the same caps: another study
    ):
        if value is not None:
            parts.append(template.format(value))
    suffix = objective_suffix(identity.objectives)
    if suffix is not None:
        parts.append(suffix)
    if identity.protocol != DEFAULT_PROTOCOL:
        default = paper_samples_per_label(identity.task)
        per_label = identity.samples_per_label
        parts.append(
            identity.protocol if per_label in (None, default) else f"{identity.protocol}-{per_label}-per-label"
        )
    if identity.word_pooling not in (None, "first"):
        parts.append(f"{identity.word_pooling}-words")
    if identity.warm_start:
        parts.append(f"warm{identity.warm_start}")
    if identity.methods is not None and identity.methods != auto_methods(None, tagging=tagging):
        parts.append("methods-" + "+".join(identity.methods))
    return ":".join(parts)


def run_identity(
    model: str,
    task: str,
    encoder: str,
    options: StudyOptions,
    *,
    registered: bool | None = None,
    tagging: bool = False,
) -> Identity:
    """What a study searches and how it is scored, under ``options``.

    Under the paper protocol ``samples_per_label`` is resolved here (the option,
    else the MTEB task's own value for a ``registered`` task, else 8); it is
    ``None`` under the matched protocol. ``registered`` defaults to :func:`is_registered_task`. A ``tagging``
    study also records its ``word_pooling``.
    """
    samples_per_label = None
    if options.final.protocol == "paper":
        registered = is_registered_task(task) if registered is None else registered
        samples_per_label = paper_samples_per_label(task if registered else None, options.final.samples_per_label)
    return Identity(
        model=model,
        task=task,
        encoder=encoder,
        shots=options.data.shots,
        max_train=options.data.max_train,
        max_eval=options.data.max_eval,
        max_epochs=options.search.max_epochs,
        data_seed=options.data.data_seed,
        cv=options.search.cv,
        objectives=tuple(options.search.objectives),
        protocol=options.final.protocol,
        samples_per_label=samples_per_label,
        word_pooling=options.data.word_pooling if tagging else None,
        warm_start=options.search.warm_start or None,
        methods=auto_methods(options.search.methods, tagging=tagging) if is_auto(encoder) else None,
    )


def _wanted_identity(wanted: Mapping[str, Any]) -> Identity:
    """The identity in a mapping of identity keys (a run's, or a study's user attrs), absent keys read as the
    study record reads them."""
    return Identity.from_attrs(upgrade_attrs(wanted))


def _cache_keys_match(stored: Mapping[str, str], expected: Mapping[str, str] | None) -> bool:
    if not expected:
        return False
    common = set(stored) & set(expected)
    return bool(common) and all(stored[name] == expected[name] for name in common)


def _short(labels: Sequence[str] | None) -> str:
    labels = list(labels or [])
    shown = ", ".join(map(str, labels[:6])) + (f" ... ({len(labels)} labels)" if len(labels) > 6 else "")
    return f"[{shown}]"


def _data_changes(stored: DataRecord, wanted: DataRecord) -> list[str]:
    changes = []
    # the features are the model's: new weights under the same name or folder are other data
    old_revision, new_revision = stored.model_revision, wanted.model_revision
    if old_revision and new_revision and old_revision != new_revision:
        changes.append(f"the model's weights (stored revision {str(old_revision)[:19]}, now {str(new_revision)[:19]})")
    if list(stored.label_names) != list(wanted.label_names):
        changes.append(f"the labels (stored {_short(stored.label_names)}, now {_short(wanted.label_names)})")
    old, new = stored.data_fingerprints or {}, wanted.data_fingerprints or {}
    splits = [name for name in DATA_SPLITS if name in old or name in new]
    changed = [name for name in splits if old.get(name) != new.get(name)]
    if changed:
        names = changed[0] if len(changed) == 1 else f"{', '.join(changed[:-1])} and {changed[-1]}"
        changes.append(f"the content of the {names} split{'s' if len(changed) > 1 else ''}")
    return changes


def _check_same_setting(study_name: str, stored: Identity, wanted: Mapping[str, Any], ignore: tuple[str, ...]) -> None:
    different = stored.differences(_wanted_identity(wanted), ignore=ignore)
    if different:
        details = ", ".join(f"{key}: stored {old!r}, requested {new!r}" for key, (old, new) in different.items())
        raise StudyConflictError(
            f"study {study_name!r} already exists for a different setting ({details}). Pass another "
            "--study-name (or drop it to get the default name for this setting), or a different --storage"
        )


def check_identity(
    study_name: str,
    stored: StudyRecord | Mapping[str, Any],
    wanted: Mapping[str, Any],
    *,
    cache_keys: Mapping[str, str] | None = None,
    new_study_hint: str = "pass another --study-name or another --storage",
) -> bool:
    """Refuse a stored study that was not made by ilge-search, searches something else, or ran on other data.

    Args:
        stored: the study's record (or the user attrs it is read from).
        wanted: this run's identity (:func:`run_identity`'s ``to_attrs``) with its data (:func:`data_identity`, and the
            model's ``model_revision``).
        cache_keys: the embedding-cache keys of this run's splits; a study without
            data fingerprints (made by an earlier version) is accepted only when
            its stored keys match them.
        new_study_hint: how to start a new study instead (ends the error message).

    Returns:
        Whether the study predates the data fingerprints and should be given them (adopted).
    """
    record = stored if isinstance(stored, StudyRecord) else StudyRecord.from_attrs(study_name, stored)
    if record.identity is None or not record.is_ours:
        raise StudyConflictError(
            f"study {study_name!r} exists in the storage but was not created by ilge-search run; "
            "choose another --study-name"
        )
    data = record.data or DataRecord()
    legacy = data.data_fingerprints is None
    adopt = legacy and _cache_keys_match(data.cache_keys, cache_keys)
    # an adopted study of a custom task was named after its path: the cache keys already vouch for the task
    _check_same_setting(study_name, record.identity, wanted, ignore=("task",) if adopt else ())
    if legacy:
        if not adopt:
            raise DataChangedError(
                f"study {study_name!r} was made by an earlier ilge-search that did not record data fingerprints, "
                "and the cached-embedding keys it stored differ from this data's: the texts, labels or model "
                f"changed since. Its trials cannot be mixed with trials on this data; {new_study_hint}"
            )
        return True
    changes = _data_changes(data, DataRecord.from_attrs(wanted))
    if changes:
        raise DataChangedError(
            f"study {study_name!r} was run on other data: {' and '.join(changes)} changed since. Its trials "
            f"cannot be mixed with trials on this data; to start a new study, {new_study_hint}"
        )
    return False


def precheck_existing(
    storage: Storage,
    study_name: str,
    identity: Mapping[str, Any],
    *,
    cache_keys: Mapping[str, str] | None = None,
    new_study_hint: str = "pass another --study-name or another --storage",
) -> None:
    """Refuse a study name already used for something else or on other data, before any extraction."""
    existing = storage.load_study(study_name)
    if existing is None:
        return
    if is_ilge_study(existing) and not is_ready(existing):
        _wait_until_ready(existing)  # another process is writing its record: read it once it is whole
    if is_ilge_study(existing) or existing.get_trials(deepcopy=False):
        check_identity(
            study_name, study_record(existing), identity, cache_keys=cache_keys, new_study_hint=new_study_hint
        )
    # else: an empty study without attrs is being created right now (or its creator died);
    # create_or_load waits for it or adopts it


def _wait_until_ready(study: optuna.Study, timeout: float = READY_WAIT_SECONDS) -> bool:
    """Another process created the study; wait for it to finish setting it up."""
    deadline = time.monotonic() + timeout
    while True:
        if is_ready(study):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)


def _check_shapes(study_name: str, stored: DataRecord | None, data: StudyData) -> None:
    for key in ("num_layers", "hidden_size", "task_kind", "metric"):
        recorded = None if stored is None else getattr(stored, key)
        if recorded is not None and recorded != getattr(data, key):
            raise StudyConflictError(
                f"study {study_name!r} was run on embeddings with {key}={recorded!r}, the cache now gives "
                f"{getattr(data, key)!r}; use another --study-name"
            )


def _data_record(wanted: Mapping[str, Any], data: StudyData, artifact_dir: Path, task_path: str | None) -> DataRecord:
    """What a new study records about the embeddings it runs on."""
    return DataRecord(
        task_kind=data.task_kind,
        metric=data.metric,
        direction="minimize" if data.metric == "loss" else "maximize",
        num_layers=data.num_layers,
        hidden_size=data.hidden_size,
        num_classes=data.num_classes,
        label_names=list(data.label_names),
        split_sizes=dict(data.split_sizes),
        cache_keys=dict(data.cache_keys),
        data_fingerprints=wanted.get("data_fingerprints"),
        model_revision=data.model_revision,
        task_path=task_path,
        artifact_dir=str(artifact_dir),
        ilge_search_version=__version__,
    )


def _resume(study: optuna.Study, study_name: str, wanted: Mapping[str, Any], data: StudyData, **check: Any) -> None:
    """Check a study another process set up against this run; adopt one made before data fingerprints."""
    record = study_record(study)
    if check_identity(study_name, record, wanted, **check):
        logger.info(
            "%s: made by an earlier ilge-search on the same data (its cache keys match); "
            "recording its data fingerprints",
            study_name,
        )
        save_data_fingerprints(study, wanted["task"], wanted["label_names"], wanted["data_fingerprints"])
    _check_shapes(study_name, record.data, data)


@dataclasses.dataclass(frozen=True)
class StudySetup:
    """How :func:`create_or_load` opens a study and what a new one records beyond its identity and data.

    ``sampler`` and ``pruner`` are the Optuna objects the study runs with; ``new_study_hint`` ends a conflict's
    message; ``task_path`` (a custom task's file or folder, absolute) and ``source`` (:class:`SourceRecord`)
    say where the data is found again; ``warm_start`` holds the portfolio members a new study enqueues.
    """

    sampler: optuna.samplers.BaseSampler | None = None
    pruner: optuna.pruners.BasePruner | None = None
    new_study_hint: str = "pass another --study-name or another --storage"
    task_path: str | None = None
    warm_start: WarmStartRecord | None = None
    source: SourceRecord | None = None


def create_or_load(
    storage: Storage,
    study_name: str,
    identity: Mapping[str, Any],
    data: StudyData,
    artifact_dir: Path,
    setup: StudySetup | None = None,
) -> tuple[optuna.Study, bool]:
    """Create the study (its record, the recommended trial enqueued once) or load it.

    Several processes may race to create the same study: ``create_study``
    without ``load_if_exists`` lets exactly one win; the others load it and wait
    until the winner has marked it ready, so the recommended config is always
    enqueued once and before any sampled trial. A loaded study is checked again
    (:func:`check_identity`, with the cache keys of ``data``); one made before
    data fingerprints existed is adopted here when its cache keys match.
    ``identity`` is this run's, as :func:`check_identity` takes it. The setup's ``task_path``
    is recorded, and updated when the folder moved: where to find the data again; so is its ``source`` (the
    data folder as given and resolved, the columns, the extraction settings). Its ``warm_start`` is enqueued
    right after the recommended trial, once, when the study is set up, and stored as its
    :class:`~ilge_search.record.WarmStartRecord`.

    Returns:
        The study and whether this call set it up.
    """
    setup = StudySetup() if setup is None else setup
    wanted = _wanted_identity(identity)
    study, created = _open_study(storage, study_name, wanted, data, setup)
    if not created:
        created = _check_loaded(study, study_name, identity, data, setup)
    if study.metric_names is None:  # unnamed, optuna-dashboard calls the objective "Objective 0"
        with quiet_optuna_warnings():
            study.set_metric_names(objective_metric_names(wanted.objectives, data.metric))
    if created:
        save_identity(study, wanted, _data_record(identity, data, artifact_dir, setup.task_path))
        if setup.source is not None:
            save_source(study, setup.source)
        if not any(trial_record(t).recommended for t in study.trials):
            for params in starting_params(wanted.encoder, wanted.methods, data.hidden_size, wanted.model):
                enqueue_start_trial(study, params)  # an auto study: every method's start, each a trial
            if setup.warm_start is not None:
                enqueue_warm_trials(study, [m.params for m in setup.warm_start.members])
                save_warm_start(study, setup.warm_start)
        mark_ready(study)
    return study, created


def _open_study(
    storage: Storage, study_name: str, wanted: Identity, data: StudyData, setup: StudySetup
) -> tuple[optuna.Study, bool]:
    """The study created by this call (``True``), or the one another run made (``False``)."""

    try:
        study = optuna.create_study(
            study_name=study_name,
            storage=storage.rdb,
            directions=objective_directions(wanted.objectives, data.metric),
            sampler=setup.sampler,
            pruner=setup.pruner,
        )
        return study, True
    except optuna.exceptions.DuplicatedStudyError:
        loaded = storage.load_study(study_name, sampler=setup.sampler, pruner=setup.pruner)
        if loaded is None:  # another process deleted it between the two calls
            raise ValueError(f"study {study_name!r} was deleted while this run opened it; run again") from None
        return loaded, False


def _check_loaded(
    study: optuna.Study, study_name: str, identity: Mapping[str, Any], data: StudyData, setup: StudySetup
) -> bool:
    """Check a study another run made against this one; whether this call must still set it up (its creator
    died before doing so)."""
    check: dict[str, Any] = dict(cache_keys=data.cache_keys, new_study_hint=setup.new_study_hint)
    if not is_ready(study) and not _wait_until_ready(study):
        if study.trials:
            check_identity(study_name, study_record(study), identity, **check)
        return True
    _resume(study, study_name, identity, data, **check)
    stored = study_record(study).data
    if setup.task_path is not None and (stored is None or stored.task_path != setup.task_path):
        save_task_path(study, setup.task_path)
    if setup.source is not None and source_record(study) != setup.source:  # the data is found elsewhere now
        save_source(study, setup.source)
    return False


def requeue_failed_recommended(study: optuna.Study, storage: Storage) -> int | None:
    """Retry the recommended trial (trial 0) when every try of it failed, like a trial killed by a fault.

    Ctrl-C, a crash or a fault during the recommended trial leaves it FAIL,
    and Optuna retries only trials whose heartbeat stopped. When no
    recommended trial is complete, pruned, waiting or running, the last failed
    one is re-queued with its parameters (up to the storage's ``max_retry``
    tries, as heartbeat retries). Returns the number of the re-queued trial's
    original, or ``None``.
    """

    recommended = [t for t in study.get_trials(deepcopy=False) if trial_record(t).recommended]
    if not recommended or any(t.state != TrialState.FAIL for t in recommended):
        return None
    last = max(recommended, key=lambda t: t.number)
    if requeue_trial(study, storage, last):
        logger.info(
            "%s: the recommended configuration (trial %d) failed; it is queued again", study.study_name, last.number
        )
        return last.number
    return None
