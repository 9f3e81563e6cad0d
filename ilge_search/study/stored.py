"""A study made by ``ilge-search run``, read back: the study itself, the data it ran on (where that data is now)
and the trial its model comes from; what exporting, ensembles, retraining and explain start from."""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from optuna.trial import TrialState

from ..record import DataRecord, Identity, SourceRecord, StudyRecord, source_record, study_record, trial_record
from ..storage import Storage
from ..tasks.core import load_task
from ..validation import check_int
from .data import DataSpec, StudyData, load_study_data, load_task_data
from .selection import DEFAULT_SELECT, FRONT_RULE, select_trial, study_front

if TYPE_CHECKING:
    import optuna

    from ..tasks.data import TaskData
    from .data import DataSpec

__all__ = ["load_run_study", "identity_of", "data_of", "load_training_data", "selected_trial", "chosen_trial"]

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike


def load_run_study(opened: Storage, study_name: str, *, purpose: str) -> optuna.Study:
    """The study ``study_name`` of ``opened``, made by ``ilge-search run``.

    Raises:
        ValueError: no such study (naming the ones there are), or one not made by
            ``ilge-search run``, which ``purpose`` (e.g. ``"exported"``) needs.
    """
    study = opened.load_study(study_name)
    if study is None:
        names = sorted(s.study_name for s in opened.study_summaries())
        shown = ", ".join(names[:10]) + (" ..." if len(names) > 10 else "")
        raise ValueError(
            f"no study {study_name!r} in {opened.shown_url}; it has: {shown or 'no studies'} "
            "(see `ilge-search studies`)"
        )
    record = study_record(study)
    if record.identity is None or not record.identity.model or not record.has_data:
        raise ValueError(
            f"study {study_name!r} was not created by `ilge-search run`; only its studies can be {purpose}"
        )
    return study


def identity_of(record: StudyRecord) -> Identity:
    """The identity of a study made by ``ilge-search run`` (:func:`load_run_study` checked it has one)."""
    if record.identity is None:
        raise ValueError(f"study {record.name!r} was not created by `ilge-search run`")
    return record.identity


def data_of(record: StudyRecord) -> DataRecord:
    return DataRecord() if record.data is None else record.data


def _data_location(
    study_name: str, stored: DataRecord, source: SourceRecord, data_dir: PathLike | None, task_path: PathLike | None
) -> tuple[str | None, str | None]:
    """Where a study's data is now: (custom task path or ``None``, data folder or ``None``).

    The study's record says where the data was; ``task_path`` / ``data_dir`` override it when the data moved
    (its content is still checked against the study's cache keys). A recorded place that is gone, with no
    override, is one line that says which option to pass.
    """
    if stored.task_path is None:  # a registered task: its data folder
        if task_path is not None:
            raise ValueError(f"study {study_name!r} ran on a registered task; --task-path is for custom tasks")
        if data_dir is not None:
            if source.data_dir_resolved and Path(data_dir).resolve() != Path(source.data_dir_resolved):
                logger.warning(
                    "reading study %r's data from %s (it recorded %s)", study_name, data_dir, source.data_dir_resolved
                )
            return None, str(data_dir)
        recorded = source.data_dir_resolved
        if recorded is not None and not Path(recorded).is_dir():
            raise ValueError(
                f"study {study_name!r} read its task data from {recorded}, which no longer exists; pass --data-dir "
                "with the folder where that data is now"
            )
        return None, recorded
    if task_path is not None:
        if Path(task_path).resolve() != Path(stored.task_path):
            logger.warning("reading study %r's task from %s (it recorded %s)", study_name, task_path, stored.task_path)
        return str(task_path), None
    if not Path(stored.task_path).exists():
        raise ValueError(
            f"the custom task of study {study_name!r} was at {stored.task_path}, which no longer exists; pass "
            "--task-path with where it is now (its content is checked against the study's)"
        )
    return stored.task_path, None


def _custom_task(spec: DataSpec, identity: Identity) -> TaskData:
    """A custom task read from ``spec.task`` under the name the study knows it by (its folder may have been
    renamed since: the name is part of the cache keys), after the study's data options."""

    loaded = load_task(spec.task, None, columns=spec.task_columns())
    if identity.task and loaded.name != identity.task:
        loaded = dataclasses.replace(loaded, spec=dataclasses.replace(loaded.spec, name=str(identity.task)))
    return load_task_data(spec, loaded)


def load_training_data(
    study: optuna.Study,
    *,
    data_dir: PathLike | None = None,
    task_path: PathLike | None = None,
    cache_dir: PathLike | None = None,
    device: str = "auto",
    progress: bool = False,
    with_test: bool = False,
) -> StudyData:
    """The train and validation arrays ``study`` was run on (a :class:`~.data.StudyData`; with ``with_test``
    its test split too), rebuilt from its record through the embedding cache (extracting on a miss).

    The data is read where the study recorded it (its data folder, or a custom task's path, and its
    columns); ``data_dir`` or ``task_path`` say where it is now when it moved.

    Raises:
        ValueError: the recorded data is gone and no override says where it is, or the data (or the model's
            weights) differ from those the study stored cache keys for.
    """

    record = study_record(study)
    identity, stored = identity_of(record), data_of(record)
    source = source_record(study)
    custom, folder = _data_location(study.study_name, stored, source, data_dir, task_path)
    spec = DataSpec(
        model=identity.model,
        task=custom or identity.task,
        shots=identity.shots,
        max_train=identity.max_train,
        max_eval=identity.max_eval,
        data_seed=int(identity.data_seed or 0),
        data_dir=folder,
        cache_dir=None if cache_dir is None else str(cache_dir),
        device=device,
        word_pooling=identity.word_pooling or "first",
        columns=tuple(sorted(source.task_columns.items())),
    )
    data = load_study_data(
        spec, with_test=with_test, progress=progress, task_data=None if custom is None else _custom_task(spec, identity)
    )
    _check_same_data(study.study_name, identity, stored, data, with_test)
    return data


def _check_same_data(name: str, identity: Identity, stored: DataRecord, data: StudyData, with_test: bool) -> None:
    """Refuse rebuilt data whose cache keys are not those the study stored (other texts, or other weights)."""
    changed = [
        split
        for split in ("train", "validation") + (("test",) if with_test else ())
        if split in stored.cache_keys and stored.cache_keys[split] != data.cache_keys.get(split)
    ]
    if changed:
        raise ValueError(
            f"the {'/'.join(changed)} data of task {identity.task!r} (or the model's weights) differ "
            f"from those study {name!r} was run on; pass the --data-dir or --task-path of that data "
            "and the same model"
        )


def selected_trial(study: optuna.Study, rule: str | None = None) -> optuna.trial.FrozenTrial:
    """The trial a study's model comes from: the one its final evaluation retrained, else the one ``rule``
    (default: the rule of the study's final evaluation, else the default rule) selects now; a
    multi-objective study's final front (rule ``front``) gives its best-score trial."""
    if rule is None:
        final = study_record(study).final
        if final is not None:
            for trial in study.get_trials(deepcopy=False):
                if trial.number == final.trial and trial_record(trial).config:
                    return trial
        rule = None if final is None else final.select
    if rule == FRONT_RULE:
        return study_front(study)[0]
    return select_trial(study, rule or DEFAULT_SELECT)


def chosen_trial(study: optuna.Study, number: int) -> optuna.trial.FrozenTrial:
    """Trial ``number`` of ``study`` when it is complete.

    Raises:
        ValueError: no such trial, or one that is not complete (naming its state and the complete ones).
    """

    check_int("trial", number, minimum=0)
    trials = study.get_trials(deepcopy=False)
    complete = [t.number for t in trials if t.state == TrialState.COMPLETE and trial_record(t).config]
    shown = ", ".join(map(str, complete[:20])) + (" ..." if len(complete) > 20 else "")
    found = next((t for t in trials if t.number == number), None)
    if found is None:
        raise ValueError(
            f"study {study.study_name!r} has no trial {number} (its trials are 0-{len(trials) - 1}); "
            f"pass --trial with a complete one: {shown}"
        )
    if number not in complete:
        raise ValueError(
            f"trial {number} of study {study.study_name!r} is {found.state.name.lower()}, not complete; "
            f"pass --trial with a complete one: {shown}"
        )
    return found
