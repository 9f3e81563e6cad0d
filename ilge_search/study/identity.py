"""What a study is: its encoder, name and identity, and creating or resuming it safely.

A study's *identity* is the model, task, encoder and the data and budget
options that decide what it searches (:data:`IDENTITY_KEYS`, stored as study
user attrs). Resuming a study with another identity is refused with
:class:`StudyConflictError` before anything expensive runs. Several processes
may create the same study at once: exactly one wins and sets it up (identity
attrs, the recommended config enqueued as trial 0), then marks it ready with
:data:`READY_ATTR`; the others wait for that mark.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .._version import __version__
from ..configs import BASELINE_FAMILIES, ENCODER_FAMILIES
from ..storage import Storage
from .objective import recommended_params
from .options import StudyOptions

if TYPE_CHECKING:  # pragma: no cover
    from .data import StudyData

__all__ = [
    "ENCODER_CHOICES",
    "IDENTITY_KEYS",
    "READY_ATTR",
    "StudyConflictError",
    "resolve_encoders",
    "default_study_name",
    "study_identity",
    "check_identity",
    "precheck_existing",
    "create_or_load",
]

ENCODER_CHOICES: Tuple[str, ...] = ENCODER_FAMILIES + BASELINE_FAMILIES

# study user attrs that must match when a study is resumed: they define what is being searched
IDENTITY_KEYS = ("model", "task", "encoder", "shots", "max_train", "max_eval", "max_epochs", "data_seed")
READY_ATTR = "ilge_search_ready"  # set last by the process that creates a study
READY_WAIT_SECONDS = 30.0


class StudyConflictError(ValueError):
    """A study name already used for a different model, task, encoder or data setting."""


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
        raise ValueError(f"no encoder given; pass at least one of {list(ENCODER_CHOICES)} or 'all'")
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


def study_identity(model: str, task: str, encoder: str, options: StudyOptions) -> Dict[str, Any]:
    """The user attrs that say what a study searches (:data:`IDENTITY_KEYS`)."""
    return {"model": model, "task": task, "encoder": encoder, "shots": options.shots,
            "max_train": options.max_train, "max_eval": options.max_eval, "max_epochs": options.max_epochs,
            "data_seed": options.data_seed}


def check_identity(study_name: str, stored: Mapping[str, Any], wanted: Mapping[str, Any]) -> None:
    """Refuse a stored study that was not made by ilge-search or searches something else."""
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


def precheck_existing(storage: Storage, study_name: str, identity: Mapping[str, Any]) -> None:
    """Refuse a study name already used for something else, before any extraction."""
    existing = storage.load_study(study_name)
    if existing is None:
        return
    attrs = existing.user_attrs
    if "model" in attrs or existing.get_trials(deepcopy=False):
        check_identity(study_name, attrs, identity)
    # else: an empty study without attrs is being created right now (or its creator died);
    # create_or_load waits for it or adopts it


def _wait_until_ready(study: Any, timeout: float = READY_WAIT_SECONDS) -> bool:
    """Another process created the study; wait for it to finish setting it up."""
    deadline = time.monotonic() + timeout
    while True:
        if study._storage.get_study_user_attrs(study._study_id).get(READY_ATTR):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)


def _check_shapes(study_name: str, stored: Mapping[str, Any], data: "StudyData") -> None:
    for key in ("num_layers", "hidden_size", "task_kind", "metric"):
        if key in stored and stored[key] != getattr(data, key):
            raise StudyConflictError(
                f"study {study_name!r} was run on embeddings with {key}={stored[key]!r}, the cache now gives "
                f"{getattr(data, key)!r}; use another --study-name"
            )


def create_or_load(storage: Storage, study_name: str, identity: Dict[str, Any], data: "StudyData",
                   artifact_dir: Path, sampler: Any = None, pruner: Any = None) -> Tuple[Any, bool]:
    """Create the study (identity attrs, recommended trial enqueued once) or load it.

    Several processes may race to create the same study: ``create_study``
    without ``load_if_exists`` lets exactly one win; the others load it and wait
    until the winner has marked it ready, so the recommended config is always
    enqueued once and before any sampled trial.

    Returns:
        The study and whether this call set it up.
    """
    import optuna

    direction = "minimize" if data.metric == "loss" else "maximize"
    try:
        study = optuna.create_study(study_name=study_name, storage=storage.rdb, direction=direction,
                                    sampler=sampler, pruner=pruner)
        created = True
    except optuna.exceptions.DuplicatedStudyError:
        study = storage.load_study(study_name, sampler=sampler, pruner=pruner)
        created = False

    attrs = study.user_attrs
    if not created:
        if not attrs.get(READY_ATTR) and not _wait_until_ready(study):
            if study.trials:
                check_identity(study_name, study.user_attrs, identity)
            created = True  # its creator died before setting it up: finish the job
        else:
            check_identity(study_name, study.user_attrs, identity)
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
            params = recommended_params(identity["encoder"], data.hidden_size, model=identity["model"])
            study.enqueue_trial(params, user_attrs={"recommended": True})
        study.set_user_attr(READY_ATTR, True)
    return study, created
