"""Step 1 of a run: :func:`check_run`, everything that can be wrong checked before any model loads.

The options, the storage, the task (texts and labels only), the planned studies (:class:`PlannedStudy`:
name, identity, data, budget) and any existing study with the same name. ``run_study`` and
``run --dry-run`` (:func:`~.plan.plan_run`) both go through it, so a dry run fails on the same bad input
with the same message.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy

from ..embeddings.models import known_model, resolve_model
from ..embeddings.weights import weights_memo_read_only
from ..encoders import encoder_families
from ..files import check_can_create
from ..record import study_record
from ..settings import default_storage_url
from ..storage import (
    Storage,
    artifact_dir_for,
    check_storage_url,
    check_storage_writable,
    hide_password,
    open_storage,
    sqlite_database,
)
from ..tasks.core import load_task
from ..tuning import effective_recommended_defaults
from .auto import is_auto
from .data import DataSpec, expected_cache_keys, load_task_data
from .folds import check_cv
from .identity import (
    adopt_renamed_task,
    data_identity,
    identity_name,
    is_registered_task,
    precheck_existing,
    resolve_encoders,
    run_identity,
    task_label,
)
from .limits import check_data_limits, warn_too_few_for_intervals
from .options import StudyOptions, check_study_name
from .planned import PlannedStudy
from .tokens import check_tagging_options
from .trial import warm_start_params

if TYPE_CHECKING:  # pragma: no cover
    from ..embeddings.models import ModelSource
    from ..tasks.core import TaskData

__all__ = ["PlannedStudy", "RunCheck", "check_run", "missing_sqlite_file", "open_for_writing"]

logger = logging.getLogger(__name__)


@dataclass
class RunCheck:
    """Step 1 of a run: its validated inputs, before anything expensive.

    ``storage`` is ``None`` in a dry run on a SQLite file that does not exist yet
    (the run would create it; nothing in it can conflict).
    """

    model: str
    task: str
    options: StudyOptions
    studies: list[PlannedStudy]
    storage: Storage | None
    shown_url: str
    spec: DataSpec
    task_data: TaskData
    cache_keys: dict[str, str]

    @property
    def names(self) -> dict[str, str]:
        """Encoder -> its study's name."""
        return {planned.encoder: planned.name for planned in self.studies}

    def opened_storage(self) -> Storage:
        """The storage a real run writes to (only a dry run may leave it unopened)."""
        if self.storage is None:
            raise RuntimeError(f"the storage {self.shown_url} was not opened: this check was made for a dry run")
        return self.storage


def missing_sqlite_file(url: str) -> bool:
    """Whether ``url`` is a SQLite file that does not exist (a dry run must not create it)."""

    try:
        parsed = sqlalchemy.engine.make_url(url)
    except sqlalchemy.exc.ArgumentError:
        return False  # open_storage says what is wrong with it
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return False
    return not Path(parsed.database).expanduser().exists()


def _open_for_checks(storage: str | Storage | None, options: StudyOptions, dry_run: bool) -> Storage | None:
    """The storage as the run's checks read it, creating nothing: ``None`` for a SQLite file that does not exist
    yet (nothing in it can conflict), else opened for reading. A writer's SQLite folder and file are checked
    first, so an unwritable storage is refused before the rest. An in-memory SQLite is opened once, for
    writing: a second opening would be another database, and it leaves nothing on disk."""

    if isinstance(storage, Storage):
        if options.runtime.artifact_dir is not None:
            return dataclasses.replace(
                storage, artifact_dir=artifact_dir_for(storage.url, options.runtime.artifact_dir)
            )
        return storage
    url = default_storage_url() if storage is None else storage
    if not dry_run:
        check_storage_writable(url)
        if sqlite_database(url) is None and _is_sqlite(url):
            return open_for_writing(url, options)
    if missing_sqlite_file(url):
        return None
    return open_storage(url, must_exist=True, artifact_dir=options.runtime.artifact_dir)


def _is_sqlite(url: str) -> bool:

    return bool(sqlalchemy.engine.make_url(url).get_backend_name() == "sqlite")


def open_for_writing(url: str | None, options: StudyOptions) -> Storage:
    """The storage a run writes to (a SQLite file and its folder created if new): opened only once every check
    passed."""
    return open_storage(
        url,
        artifact_dir=options.runtime.artifact_dir,
        heartbeat_interval=options.runtime.heartbeat_interval,
        grace_period=options.runtime.grace_period,
        max_retry=options.runtime.max_retry,
    )


def _check_storage_use(opened: Storage | None, url: str, options: StudyOptions, dry_run: bool) -> None:
    """Worker processes need a storage each can open; a run with final seeds needs an artifact folder it can
    make (made only when the first weights are stored)."""

    if options.runtime.workers > 1 and opened is not None and opened.is_in_memory:
        raise ValueError("workers > 1 need a storage every process can open; an in-memory SQLite is not one")
    if options.final.seeds > 0 and not dry_run:
        artifacts = opened.artifact_dir if opened is not None else artifact_dir_for(url, options.runtime.artifact_dir)
        check_can_create(artifacts, "the artifact store", "pass a writable --artifact-dir")


def _writer(storage: str | Storage | None, checked: Storage | None, options: StudyOptions) -> Storage | None:
    """After the checks: the storage they read, if a run may write through it, else the one opened for
    writing now."""
    if isinstance(storage, Storage) or (checked is not None and checked.is_in_memory):
        return checked
    return open_for_writing(default_storage_url() if storage is None else storage, options)


def _checked_task(task: str, spec: DataSpec, options: StudyOptions) -> tuple[TaskData, TaskData]:
    """The task as read and as the study uses it (after ``--shots`` and the caps), with every setting checked
    against it (:func:`~.limits.check_data_limits`)."""

    loaded = load_task(spec.task, spec.data_dir, columns=spec.task_columns())
    task_data = load_task_data(spec, loaded)
    if options.data.zero_shot_tasks and task_data.kind != "similarity":
        raise ValueError("zero_shot_tasks are evaluated with a similarity encoder; the study's task must be one")
    check_cv(options.search.cv, len(task_data.split("train")) if options.search.cv else None)
    check_data_limits(options, task, loaded, task_data)
    return loaded, task_data


@dataclass(frozen=True)
class _CheckedInputs:
    """What :func:`check_run` read before the storage: the model's source, the data spec, the task as read
    and as the study uses it, and the encoders with their trial budgets."""

    model: str
    task: str
    source: ModelSource
    spec: DataSpec
    loaded: TaskData
    task_data: TaskData
    encoders: list[str]
    counts: dict[str, int | None]


def check_run(
    model: str,
    task: str,
    encoders: str | Sequence[str],
    storage: str | Storage | None,
    options: StudyOptions,
    *,
    dry_run: bool = False,
) -> RunCheck:
    """Check everything a run needs before any model loads (step 1 of ``run_study``).

    Every check reads the storage, if it exists, without writing to it; a real
    run opens it for writing (a new SQLite file, its folder and lock created)
    only after the last check passed, so a refused run leaves the folder as it
    was. The artifact folder is checked, never made; a dry run opens nothing
    for writing.

    Raises:
        ValueError: bad arguments, unknown model or task,
            :class:`~ilge_search.storage.StorageError`,
            :class:`~ilge_search.study.StudyConflictError`.
    """

    model, task = str(model), str(task)
    inputs = _checked_inputs(model, task, encoders, storage, options)
    # the checks read the storage; it is opened for writing (a SQLite file created) only once they all passed
    opened = _open_for_checks(storage, options, dry_run)
    url = opened.url if opened is not None else (default_storage_url() if storage is None else str(storage))
    _check_storage_use(opened, url, options, dry_run)
    if opened is not None and not is_registered_task(task):
        inputs = _with_renamed_task(opened, model, task, inputs)
    data_id = data_identity(inputs.task_data)
    cache_keys = expected_cache_keys(inputs.spec, inputs.task_data, data_id["data_fingerprints"])
    studies = [_planned_study(enc, inputs.counts[enc], inputs, data_id, options) for enc in inputs.encoders]
    for planned in studies:
        _check_planned(opened, planned, inputs, cache_keys, options)
    if not dry_run:
        opened = _writer(storage, opened, options)
    warn_too_few_for_intervals(options, inputs.task_data)  # after the last refusal: a refused run says one line
    return RunCheck(
        model=model,
        task=task,
        options=options,
        studies=studies,
        storage=opened,
        shown_url=hide_password(url),
        spec=inputs.spec,
        task_data=inputs.task_data,
        cache_keys=cache_keys,
    )


def _with_renamed_task(opened: Storage, model: str, task: str, inputs: _CheckedInputs) -> _CheckedInputs:
    """``inputs`` with the custom task under the name its studies know it by, so that a renamed folder resumes them."""
    adopted = adopt_renamed_task(opened, model, task, inputs.loaded)
    if adopted is inputs.loaded:
        return inputs
    return dataclasses.replace(inputs, loaded=adopted, task_data=load_task_data(inputs.spec, adopted))


def _checked_inputs(
    model: str, task: str, encoders: str | Sequence[str], storage: str | Storage | None, options: StudyOptions
) -> _CheckedInputs:
    """The encoders, the defaults files, the storage URL, the model and the task, each checked, before the
    storage is read."""
    named = resolve_encoders(encoders, tagging=True)  # checked before the storage or the task is read
    if options.search.study_name is not None and len(named) > 1:
        raise ValueError("study_name names one study; give exactly one encoder with it, or drop it")

    effective_recommended_defaults()  # the shipped and the user's defaults files, each value checked
    if isinstance(storage, str):  # a bad URL is told before the data is read
        check_storage_url(storage)
    with weights_memo_read_only():  # unknown model: clear error, nothing loaded, nothing written
        source = resolve_model(model, options.data.cache_dir, materialize=False)
    spec = DataSpec.from_options(model, task, options, source=source)
    loaded, task_data = _checked_task(task, spec, options)
    encoder_list = resolve_encoders(encoders, tagging=task_data.kind == "tagging")
    counts = options.search.trial_counts(encoder_list)
    if options.search.methods is not None and not any(is_auto(name) for name in encoder_list):
        raise ValueError("--methods lists the methods of --encoder auto; add --encoder auto or drop --methods")
    check_tagging_options(task_data, encoder_list, options)
    return _CheckedInputs(model, task, source, spec, loaded, task_data, encoder_list, counts)


def _planned_study(
    encoder: str, count: int | None, inputs: _CheckedInputs, data_id: Mapping[str, Any], options: StudyOptions
) -> PlannedStudy:
    """The study of ``encoder`` the run makes or resumes: its name, identity and budget."""
    model, task = inputs.model, inputs.task
    tagging = inputs.task_data.kind == "tagging"
    label = task_label(task, inputs.loaded, fingerprint=False)
    identity = run_identity(model, label, encoder, options, registered=is_registered_task(task), tagging=tagging)
    default = identity_name(dataclasses.replace(identity, task=task_label(task, inputs.loaded)))
    name = check_study_name(options.search.study_name or default)
    hint = (
        f"pass another --study-name, or drop --study-name to use this data's default name {default!r}"
        if name != default
        else "pass another --study-name or another --storage"
    )
    return PlannedStudy(
        encoder=encoder,
        name=name,
        identity=identity,
        data_id=data_id,
        model_revision=inputs.source.revision,
        count=count,
        hint=hint,
    )


def _check_planned(
    opened: Storage | None,
    planned: PlannedStudy,
    inputs: _CheckedInputs,
    cache_keys: dict[str, str],
    options: StudyOptions,
) -> None:
    """A planned study against a stored one of its name, and its warm start against the portfolio."""
    if opened is not None:
        precheck_existing(opened, planned.name, planned.attrs, cache_keys=cache_keys, new_study_hint=planned.hint)
        _warn_methods_in_another_order(opened, planned)
    if options.search.warm_start:
        hidden = _config_hidden_size(inputs.source.path)
        task = planned.identity.task
        _check_warm_start(opened, planned.encoder, inputs.model, task, options.search.warm_start, hidden)


def _warn_methods_in_another_order(opened: Storage, planned: PlannedStudy) -> None:
    """One warning when a new auto study's methods are those of a stored one in another order: the order picks
    trial 0 and so names another study, which starts from zero unless the stored one's order is passed."""
    wanted = planned.identity
    if not is_auto(wanted.encoder) or wanted.methods is None or opened.load_study(planned.name) is not None:
        return
    for stored in opened.rdb.get_all_studies():
        identity = study_record(stored).identity
        if identity is None or identity.methods is None or identity.methods == wanted.methods:
            continue
        if set(identity.methods) == set(wanted.methods) and dataclasses.replace(identity, methods=None) == (
            dataclasses.replace(wanted, methods=None)
        ):
            logger.warning(
                "study %r searches the same methods in another order; this run starts %r from zero, since the "
                "order picks trial 0: pass --methods %s to resume %r instead",
                stored.study_name,
                planned.name,
                ",".join(identity.methods),
                stored.study_name,
            )
            return


def _config_hidden_size(model_path: str | Path) -> int | None:
    """A local model folder's hidden size, read from its ``config.json`` as plain JSON (nothing loaded or
    written); ``None`` for a hub id or a config that does not say."""

    try:
        value = json.loads((Path(str(model_path)).expanduser() / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    hidden = value.get("hidden_size") if isinstance(value, dict) else None
    return hidden if isinstance(hidden, int) and hidden > 0 else None


def _check_warm_start(
    opened: Storage | None, encoder: str, model: str, task: str, count: int, config_hidden: int | None
) -> None:
    """``--warm-start`` needs an ILGE family and a portfolio with ``count`` members. A model outside the table
    is bucketed by its config's hidden size; without one (a hub id), once its data is loaded, before its study
    is created."""

    known = known_model(model)
    hidden = known.hidden_size if known else config_hidden
    if encoder in encoder_families() and hidden is None:
        return
    warm_start_params(opened, encoder, count, hidden_size=hidden, model=model, task=task)
