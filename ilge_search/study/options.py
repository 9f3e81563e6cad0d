"""The options of a study run, declared and validated once.

:class:`StudyOptions` holds everything :func:`~ilge_search.study.run_study`
takes besides the model, the task, the encoders and the storage. The CLI
``run`` command builds one, ``run_study`` builds one from its keywords, each
worker process receives it, and a sweep derives one per (model, task) group
with :func:`dataclasses.replace` (which validates again).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from ..objectives import check_objectives
from ..protocol import DEFAULT_PROTOCOL, check_protocol
from ..tuning import PRUNERS, SAMPLERS
from ..validation import check_choice, check_int, check_positive_number
from .folds import check_cv
from .selection import DEFAULT_FINAL_FRONT, DEFAULT_SELECT, SELECTION_RULES

__all__ = ["StudyOptions", "MAX_STUDY_NAME_LENGTH", "DEFAULT_FINAL_FRONT", "check_study_name"]

PathLike = Union[str, os.PathLike]

MAX_STUDY_NAME_LENGTH = 512  # Optuna's studies.study_name column is VARCHAR(512)


def check_study_name(name: Any) -> str:
    """``name`` if a storage can keep it as a study name: a non-empty string of at most 512 characters."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"the study name must be a non-empty string, got {name!r}")
    if len(name) > MAX_STUDY_NAME_LENGTH:
        raise ValueError(
            f"the study name has {len(name)} characters; a study storage keeps at most "
            f"{MAX_STUDY_NAME_LENGTH}. Pass a shorter --study-name"
        )
    return name


def _path_or_none(value: Optional[PathLike]) -> Optional[str]:
    return None if value is None else os.fspath(value)


@dataclass(frozen=True)
class StudyOptions:
    """How a study searches, on which data, and where it runs (picklable, for worker processes).

    Attributes:
        n_trials: trials to add in this call (complete, pruned or failed), split
            exactly across ``workers``; a mapping gives one count per encoder;
            ``0`` only (re)runs the final evaluation; ``None`` runs until
            ``timeout`` or ``total_trials``.
        timeout: seconds per study (per worker) before no new trial starts.
        total_trials: a cap on the study's complete, pruned and running trials,
            shared by every process on the storage; a mapping gives one cap per
            encoder (a sweep caps each study at its budget, so two sweeps on one
            storage never run a study past it).
        study_name: only with one encoder (default: ``default_study_name``).
        sampler, pruner: one of :data:`~ilge_search.tuning.SAMPLERS` / :data:`~ilge_search.tuning.PRUNERS`.
        seed: seeds the sampler (worker ``i`` uses ``seed + i``), every trial's
            training and, as ``seed + 1000 + i``, the final seeds.
        workers: processes optimising the same study in parallel.
        final_seeds: seeds the best config is retrained with for the test score (0: skip).
        shots, max_train, max_eval, data_seed: the data options (part of the study's identity).
        max_epochs: cap on every config's ``epochs`` (part of the study's identity).
        cv: score each trial on this many stratified folds of the training data
            instead of the validation split (``None``: no cross-validation; part
            of the study's identity, see :mod:`~ilge_search.study.folds`).
        select: which trial the final evaluation retrains, ``"best"`` or
            ``"one-se"`` (:mod:`~ilge_search.study.selection`); not part of the
            identity: it changes the final evaluation, not the trials. A
            multi-objective study retrains its Pareto front instead.
        objectives: what every trial returns (:mod:`~ilge_search.objectives`):
            ``("score",)``, or the score and ``params`` and/or ``latency`` for a
            multi-objective study (part of the identity and name, e.g. ``:obj-params``;
            Optuna cannot prune such a study, so its pruner is ``none``).
        final_front: at most this many Pareto-front trials a multi-objective
            study's final evaluation retrains (spread evenly along the front,
            :func:`~ilge_search.study.selection.front_trials`).
        protocol: how the final scores are measured: ``"matched"`` (every encoder
            trained with its head on the same data) or ``"paper"`` (MTEB's
            evaluators on the encoders' vectors, see :mod:`ilge_search.protocol`);
            part of the identity and name (``:paper``). Trials are the same under both.
        samples_per_label: the paper protocol's examples per label (default: the
            MTEB task's own, else 8); part of the identity.
        zero_shot_tasks: similarity tasks also scored with every final model.
        data_dir, cache_dir, device: task data, embedding cache, device.
        artifact_dir: artifact store folder (default: next to a SQLite file, else ``studies/artifacts``).
        threads: torch CPU threads in-process and per worker.
        heartbeat_interval, grace_period, max_retry: dead-worker detection and retry.
        show_progress: tqdm bars for extraction, trials and final seeds.

    Raises:
        ValueError: on construction, naming the first invalid option.
    """

    n_trials: Union[int, Mapping[str, Optional[int]], None] = 20
    timeout: Optional[float] = None
    total_trials: Union[int, Mapping[str, Optional[int]], None] = None
    study_name: Optional[str] = None
    sampler: str = "tpe"
    pruner: str = "median"
    seed: int = 0
    workers: int = 1
    final_seeds: int = 3
    shots: Optional[int] = None
    max_train: Optional[int] = None
    max_eval: Optional[int] = None
    max_epochs: Optional[int] = None
    cv: Optional[int] = None
    select: str = DEFAULT_SELECT
    objectives: Tuple[str, ...] = ("score",)
    final_front: int = DEFAULT_FINAL_FRONT
    data_seed: int = 0
    protocol: str = DEFAULT_PROTOCOL
    samples_per_label: Optional[int] = None
    zero_shot_tasks: Tuple[str, ...] = ()
    data_dir: Optional[PathLike] = None
    cache_dir: Optional[PathLike] = None
    device: str = "auto"
    artifact_dir: Optional[PathLike] = None
    threads: Optional[int] = None
    heartbeat_interval: Optional[int] = 60
    grace_period: Optional[int] = None
    max_retry: int = 3
    show_progress: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.n_trials, Mapping):
            counts = dict(self.n_trials)
            for name, count in counts.items():
                check_int(f"n_trials[{name}]", count, minimum=0, allow_none=True)
            object.__setattr__(self, "n_trials", counts)  # a plain dict: it pickles for workers
            unbounded = any(count is None for count in counts.values())
        else:
            check_int("n_trials", self.n_trials, minimum=0, allow_none=True)
            unbounded = self.n_trials is None
        if isinstance(self.total_trials, Mapping):
            caps = dict(self.total_trials)
            for name, cap in caps.items():
                check_int(f"total_trials[{name}]", cap, allow_none=True)
            object.__setattr__(self, "total_trials", caps)
        else:
            check_int("total_trials", self.total_trials, allow_none=True)
        check_positive_number("timeout", self.timeout, allow_none=True, unit="seconds")
        if unbounded and self.timeout is None and self.total_trials is None:
            raise ValueError("give n_trials, total_trials or a timeout, otherwise the study never stops")
        check_int("seed", self.seed, minimum=0, allow_none=True)
        check_int("data_seed", self.data_seed, minimum=0)
        check_int("workers", self.workers)
        check_int("threads", self.threads, allow_none=True)
        check_int("final_seeds", self.final_seeds, minimum=0)
        for name in ("shots", "max_train", "max_eval", "max_epochs"):
            check_int(name, getattr(self, name), allow_none=True)
        check_int("heartbeat_interval", self.heartbeat_interval, allow_none=True)
        check_int("grace_period", self.grace_period, allow_none=True)
        check_int("max_retry", self.max_retry, minimum=0, allow_none=True)
        if self.study_name is not None:
            check_study_name(self.study_name)
        check_choice("sampler", self.sampler, SAMPLERS)
        check_choice("pruner", self.pruner, PRUNERS)
        check_cv(self.cv)
        check_choice("select", self.select, SELECTION_RULES)
        object.__setattr__(self, "objectives", check_objectives(self.objectives))
        check_int("final_front", self.final_front)
        check_protocol(self.protocol)
        check_int("samples_per_label", self.samples_per_label, allow_none=True)
        if self.samples_per_label is not None and self.protocol != "paper":
            raise ValueError(
                "samples_per_label sets the paper protocol's readout; add protocol='paper' "
                "(--protocol paper) or drop it"
            )
        if isinstance(self.zero_shot_tasks, str):
            object.__setattr__(self, "zero_shot_tasks", (self.zero_shot_tasks,))
        object.__setattr__(self, "zero_shot_tasks", tuple(str(name) for name in self.zero_shot_tasks))
        for name in ("data_dir", "cache_dir", "artifact_dir"):
            object.__setattr__(self, name, _path_or_none(getattr(self, name)))

    def trial_counts(self, encoders: List[str]) -> Dict[str, Optional[int]]:
        """Trials to add per encoder (from ``n_trials``, one count or one per encoder).

        Raises:
            ValueError: ``n_trials`` has counts for encoders not in ``encoders``, or
                leaves an encoder without a count and nothing else stops its study.
        """
        if not isinstance(self.n_trials, Mapping):
            return {name: self.n_trials for name in encoders}
        unknown = set(self.n_trials) - set(encoders)
        if unknown:
            raise ValueError(f"n_trials has counts for encoders not run: {sorted(unknown)}")
        counts = {name: self.n_trials.get(name) for name in encoders}
        if None in counts.values() and self.timeout is None and self.total_trials is None:
            raise ValueError("give n_trials, total_trials or a timeout, otherwise the study never stops")
        return counts

    def total_for(self, encoder: str) -> Optional[int]:
        """The ``total_trials`` cap of ``encoder``'s study (``None``: no cap)."""
        if isinstance(self.total_trials, Mapping):
            return self.total_trials.get(encoder)
        return self.total_trials

    @property
    def multi_objective(self) -> bool:
        """Whether the studies have more than one objective."""
        return len(self.objectives) > 1

    @property
    def effective_pruner(self) -> str:
        """The pruner the studies use: ``pruner``, or ``none`` for a multi-objective study (Optuna cannot
        prune one)."""
        return "none" if self.multi_objective else self.pruner

    def final_seed_list(self) -> List[int]:
        """The seeds of the final evaluation: ``seed + 1000 + i`` for each of the ``final_seeds``."""
        return [self.seed + 1000 + i for i in range(self.final_seeds)]

    def replace(self, **changes: Any) -> "StudyOptions":
        """A validated copy with ``changes`` applied (:func:`dataclasses.replace`)."""
        import dataclasses

        return dataclasses.replace(self, **changes)
