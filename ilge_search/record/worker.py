"""Which process runs a trial: the stamp every trial records as it is created, and whether that process is gone.

:func:`owner_stamping` wraps a study's sampler so that Optuna's ``before_trial`` stamps each new trial
(:data:`WORKER_ATTR`) before the objective starts; :func:`process_gone` tells a later run on the same host that
the stamped process died, so :func:`ilge_search.storage.fail_stale_trials` can fail and retry the trial at once.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
from typing import TYPE_CHECKING, Any

import optuna

from .fields import Attrs

if TYPE_CHECKING:
    import optuna

__all__ = [
    "WORKER_ATTR",
    "worker_stamp",
    "stamp_worker",
    "owner_stamping",
    "worker_stamp_of",
    "process_gone",
    "is_own_stamp",
]

WORKER_ATTR = "ilge_worker"  # trial user attr: host, pid (and its start time) of the process running it


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (Linux); ``None`` elsewhere or if gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as handle:
            return handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _pid_namespace() -> int | None:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def worker_stamp(trial_number: int) -> Attrs:
    """What a trial records about the process that runs it (:data:`WORKER_ATTR`).

    ``trial`` is the trial's own number: a retried copy of a trial inherits its
    user attrs, and a stamp of another trial number is ignored.
    """
    pid = os.getpid()
    stat = _proc_stat(pid)
    return {
        "host": socket.gethostname(),
        "pid": pid,
        "trial": int(trial_number),
        "started": stat[19] if stat else None,
        "pidns": _pid_namespace(),
    }


def stamp_worker(study: optuna.Study, trial: optuna.Trial | optuna.trial.FrozenTrial) -> None:
    """Record on ``trial`` (a ``Trial`` or ``FrozenTrial`` of ``study``) which process runs it
    (:func:`worker_stamp`), so that a run on this host fails it at once when that process dies.

    The one writer of the stamp: :func:`owner_stamping`'s sampler calls it as Optuna creates each trial,
    before the objective starts. A handle made for a finished trial (the dashboard notes make such handles)
    runs nobody's work and is left as it is.
    """

    with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
        study._storage.set_trial_user_attr(trial._trial_id, WORKER_ATTR, worker_stamp(trial.number))


@functools.cache
def _owner_stamping_class() -> type:

    class OwnerStampingSampler(optuna.samplers.BaseSampler):
        """``inner``, which also stamps each trial with its process as the trial is created (Optuna calls
        ``before_trial`` right after it made the trial RUNNING, before the heartbeat thread or the objective
        starts), so a worker that dies at any point leaves a trial the next run can fail."""

        def __init__(self, inner: optuna.samplers.BaseSampler) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            if name == "inner":  # not set yet (unpickling): no recursion
                raise AttributeError(name)
            return getattr(self.inner, name)

        def __repr__(self) -> str:
            return f"{type(self).__name__}({self.inner!r})"

        def infer_relative_search_space(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> Any:
            return self.inner.infer_relative_search_space(study, trial)

        def sample_relative(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, search_space: Any) -> Any:
            return self.inner.sample_relative(study, trial, search_space)

        def sample_independent(
            self, study: optuna.Study, trial: optuna.trial.FrozenTrial, param_name: str, param_distribution: Any
        ) -> Any:
            return self.inner.sample_independent(study, trial, param_name, param_distribution)

        def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
            stamp_worker(study, trial)
            self.inner.before_trial(study, trial)

        def after_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, state: Any, values: Any) -> None:
            self.inner.after_trial(study, trial, state, values)

        def reseed_rng(self) -> None:
            self.inner.reseed_rng()

    return OwnerStampingSampler


def owner_stamping(sampler: optuna.samplers.BaseSampler | None) -> optuna.samplers.BaseSampler:
    """``sampler`` (``None``: Optuna's default TPE) wrapped so that every trial records its process
    (:data:`WORKER_ATTR`) the moment it is created, before it can run.

    A worker that dies before its objective starts (its heartbeat thread could not start, say) then leaves
    a stamped trial: the next run on this host fails and retries it at once, and a run on another host by
    its missing heartbeat (:func:`fail_stale_trials`).
    """
    if sampler is None:
        sampler = optuna.samplers.TPESampler()
    return _owner_stamping_class()(sampler)


def process_gone(stamp: object, trial_number: int) -> bool:
    """Whether the process that stamped the trial certainly no longer runs.

    Only decidable for a process of this host (same hostname and pid namespace);
    a pid that was recycled (another start time) or is a zombie counts as gone.
    """
    if not isinstance(stamp, dict) or stamp.get("trial") != trial_number:
        return False
    if stamp.get("host") != socket.gethostname() or stamp.get("pidns") != _pid_namespace():
        return False
    pid = stamp.get("pid")
    if not isinstance(pid, int) or pid <= 0 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    stat = _proc_stat(pid)
    if stat is None:
        return False
    return stat[0] in ("Z", "X") or (stamp.get("started") is not None and stat[19] != stamp["started"])


def worker_stamp_of(trial: optuna.trial.FrozenTrial) -> object:
    """The stamp ``trial`` recorded (:func:`worker_stamp`), ``None`` when it has none."""
    return trial.user_attrs.get(WORKER_ATTR)


def is_own_stamp(stamp: object, trial_number: int) -> bool:
    """Whether ``stamp`` says this very process runs trial ``trial_number``."""
    return (
        isinstance(stamp, dict)
        and stamp.get("pid") == os.getpid()
        and stamp.get("trial") == trial_number
        and stamp.get("host") == socket.gethostname()
    )
