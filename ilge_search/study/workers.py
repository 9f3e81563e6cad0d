"""Optimising a study: in this process or in spawned worker processes on the same storage.

``workers > 1`` spawns that many processes; each receives the
:class:`~ilge_search.storage.Storage` (it reopens itself from its URL), the
:class:`~ilge_search.study.StudyOptions` and the
:class:`~ilge_search.study.data.DataSpec`, loads the cached embeddings and
runs its exact share of the trials. This process shows progress by polling
the storage: the bar counts *ended* trials (complete, pruned or failed).
``total_trials`` is one cap for every process on the storage.

A worker dies with its parent: a watchdog thread interrupts it (its trial is
marked FAIL) as soon as the process that spawned it is gone, so killing the
parent (even with SIGKILL) leaves no orphan training on. A worker stopped by a
storage fault (a full disk) prints one line and exits with
:data:`STORAGE_FAULT_EXIT`, which the parent turns into a ``StorageError``.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import optuna
import torch

from ..progress import BarSpec, new_bar
from ..record import owner_stamping
from ..storage import (
    ENDED_STATES,
    FINISHED_STATES,
    Storage,
    StorageError,
    count_trials,
    fail_own_running_trials,
    storage_fault,
)
from ..tasks.core import quiet_data_warnings
from ..tuning import make_pruner, make_sampler
from .auto import is_auto
from .budget import TimeBudget
from .data import DataSpec, load_study_data
from .objectives import best_score_trial, score_of
from .options import StudyOptions
from .trial import TrialObjective, catchable_errors, quiet_interrupt_tracebacks

if TYPE_CHECKING:  # pragma: no cover
    import optuna
    from optuna.trial import FrozenTrial

    from .data import StudyData

TrialCallback = Callable[["optuna.Study", "FrozenTrial"], None]  # run after each trial, in this process

__all__ = ["TrialCallback", "split_trials", "WorkerJob", "worker_main", "total_reached", "optimize"]

# what the total_trials cap counts: finished trials plus those running now in any process
_CAPPED_STATES = (*FINISHED_STATES, "RUNNING")
STORAGE_FAULT_EXIT = 3  # a worker's exit status after a storage fault (its message is on stderr)
PARENT_POLL_SECONDS = 0.5


def split_trials(n_trials: int | None, workers: int) -> list[int | None]:
    """Per-worker trial counts summing to ``n_trials`` exactly (``None``: until timeout)."""
    if n_trials is None:
        return [None] * workers
    base, extra = divmod(n_trials, workers)
    counts = [base + (1 if i < extra else 0) for i in range(workers)]
    return [c for c in counts if c > 0]


def total_reached(study: optuna.Study, total_trials: int | None) -> bool:
    """Whether the study's finished trials plus those running now in any process reach ``total_trials``."""
    if total_trials is None:
        return False
    return count_trials(study, _CAPPED_STATES) >= total_trials


def _total_trials_callbacks(total_trials: int | None) -> list[TrialCallback]:
    """Stop this process's optimise loop once the study holds ``total_trials`` finished or running trials
    (two processes starting a trial at the same instant may overshoot by one each; failed ones are retried)."""
    if total_trials is None:
        return []

    def stop_at_total(study: optuna.Study, trial: FrozenTrial) -> None:
        if total_reached(study, total_trials):
            study.stop()

    return [stop_at_total]


class _ProgressCallback:
    """A progress bar over ended trials with the best value so far."""

    def __init__(self, bar: Any, metric: str) -> None:
        self.bar = bar
        self.metric = metric

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        with contextlib.suppress(ValueError):  # the best first: a line written for this trial shows it
            best = best_score_trial(study)
            self.bar.set_postfix_str(f"best {self.metric} {score_of(best):.4f} (trial {best.number})")
        self.bar.update(1)


@dataclass(frozen=True)
class WorkerJob:
    """What a spawned worker process needs to run its share of trials."""

    storage: Storage
    study_name: str
    encoder: str
    data: DataSpec
    options: StudyOptions
    n_trials: int | None
    sampler_seed: int | None
    torch_threads: int
    budget: TimeBudget | None = None  # --time-limit: stops starting trials in time for the stages


def _timeout(options: StudyOptions, budget: TimeBudget | None) -> float | None:
    """Optuna's ``timeout`` of one process's search: ``--timeout``, and never past a time budget's deadline."""
    limits = [t for t in (options.search.timeout, None if budget is None else budget.search_timeout()) if t]
    return min(limits) if limits else None


@dataclass(frozen=True)
class SearchLimit:
    """When a search stops adding trials: after ``count`` (``None``: at ``timeout``, ``total_trials`` or the
    time limit), and once the time ``budget`` (``--time-limit``) would leave less than the stages need."""

    count: int | None
    budget: TimeBudget | None = None


def _optimize_here(
    study: optuna.Study,
    encoder: str,
    data: StudyData,
    device: str,
    options: StudyOptions,
    limit: SearchLimit,
    callbacks: Sequence[TrialCallback] = (),
) -> None:
    """Run trials in this process until ``limit``, each followed by ``callbacks``, the ``total_trials`` cap and
    the time budget (which also bounds Optuna's ``timeout``)."""
    search, budget = options.search, limit.budget
    objective = TrialObjective(encoder, data, seed=search.seed, device=device, max_epochs=search.max_epochs)
    cap = _total_trials_callbacks(search.total_for(encoder))
    study.optimize(
        objective,
        n_trials=limit.count,
        timeout=_timeout(options, budget),
        catch=catchable_errors(),
        callbacks=[*callbacks, *cap, *([] if budget is None else [budget])],
    )


def _die_with_parent(parent: int) -> None:
    """Interrupt this process once ``parent`` is gone (its children are re-parented), then end it.

    SIGINT lets Optuna mark the running trial FAIL; if the process is stuck
    somewhere that ignores it, it is ended a minute later.
    """
    # a process started in the background by a shell inherits SIGINT ignored; this one must hear its watchdog
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_SECONDS)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(60)
        os._exit(1)

    threading.Thread(target=watch, name="ilge-parent-watchdog", daemon=True).start()


def worker_main(job: WorkerJob, parent: int | None = None) -> None:
    """Entry point of a spawned worker: load the cached embeddings, optimise, exit.

    ``parent``: the pid of the spawning process; the worker ends when it is gone.
    """

    if parent is not None:
        _die_with_parent(parent)
    quiet_data_warnings()  # the spawning process showed them when it loaded the same data
    options = job.options
    torch.set_num_threads(job.torch_threads)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    quiet_interrupt_tracebacks()
    study = None
    try:
        study = job.storage.load_study(
            job.study_name,
            sampler=owner_stamping(
                make_sampler(options.search.sampler, job.sampler_seed, conditional=is_auto(job.encoder))
            ),
            pruner=make_pruner(options.search.effective_pruner, options.search.max_epochs),
        )
        if study is None:
            raise RuntimeError(f"study {job.study_name!r} is not in {job.storage.shown_url}")
        if total_reached(study, options.search.total_for(job.encoder)):
            return  # other processes already filled the study: no need to load the embeddings
        data = load_study_data(job.data, with_test=False, progress=False)
        _optimize_here(study, job.encoder, data, job.data.device, options, SearchLimit(job.n_trials, job.budget))
    except KeyboardInterrupt:
        if study is not None:
            fail_own_running_trials(study, job.storage, "interrupted")
        raise SystemExit(130) from None
    except Exception as exc:
        fault = storage_fault(exc)
        if fault is None:
            raise
        if study is not None:
            fail_own_running_trials(study, job.storage)
        print(
            f"{multiprocessing.current_process().name}: cannot write the study storage {job.storage.shown_url}: "
            f"{fault}",
            file=sys.stderr,
        )
        raise SystemExit(STORAGE_FAULT_EXIT) from None


def _optimize_in_workers(
    study: optuna.Study, jobs: list[WorkerJob], metric: str, progress: bool, total: int | None
) -> None:
    """Run ``jobs`` in spawned processes; show progress by polling the storage."""

    baseline = count_trials(study, ENDED_STATES)
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(target=worker_main, args=(job, os.getpid()), name=f"ilge-worker-{i}")
        for i, job in enumerate(jobs)
    ]
    for process in processes:
        process.start()
    bar = new_bar(BarSpec(f"{study.study_name} ({len(jobs)} workers)", total, "trial", enabled=progress))
    try:
        while any(p.is_alive() for p in processes):
            with contextlib.suppress(ValueError):
                bar.set_postfix_str(f"best {metric} {score_of(best_score_trial(study)):.4f}")
            bar.update(count_trials(study, ENDED_STATES) - baseline - bar.n)
            time.sleep(1.0)
        bar.update(count_trials(study, ENDED_STATES) - baseline - bar.n)
    except KeyboardInterrupt:
        # the workers got the terminal's SIGINT too; make sure (a test harness may only signal us)
        for process in processes:
            if process.is_alive() and process.pid is not None:
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
    if any(code == STORAGE_FAULT_EXIT for _, code in failed):
        raise StorageError(
            f"worker process(es) could not write the study storage (their message is above): "
            f"{failed}. Fix the storage, then rerun the same command: finished trials are kept and "
            "interrupted ones are retried"
        )
    if failed:
        raise RuntimeError(
            f"worker process(es) failed: {failed}; their error is printed above. Finished trials are stored; "
            "rerun the same command to resume"
        )


def search_threads(options: StudyOptions) -> int:
    """The torch threads of each process the search runs in: ``--threads``, else the cores shared out among the
    workers, or in-process the threads torch uses now."""
    if options.runtime.threads or options.runtime.workers > 1:
        return options.runtime.worker_threads()

    return torch.get_num_threads()


def optimize(
    study: optuna.Study,
    storage: Storage,
    encoder: str,
    data: StudyData,
    spec: DataSpec,
    options: StudyOptions,
    limit: SearchLimit,
    callbacks: Sequence[TrialCallback] = (),
) -> None:
    """Add trials to ``study`` until ``limit``.

    With ``options.runtime.workers == 1`` the trials run here on ``data`` (and
    ``callbacks`` run after each); otherwise the count is split exactly across
    that many spawned processes (worker ``i`` seeds its sampler with ``seed + i``). The time budget goes to
    every process: each stops starting trials when the time left is what the stages after the search need.
    """
    count, budget = limit.count, limit.budget
    quiet_interrupt_tracebacks()
    if options.runtime.workers == 1:
        with new_bar(BarSpec(study.study_name, count, "trial", enabled=options.runtime.progress)) as bar:
            progress: list[TrialCallback] = [_ProgressCallback(bar, data.metric), *callbacks]
            _optimize_here(study, encoder, data, spec.device, options, limit, progress)
        return
    per_worker = search_threads(options)
    jobs = [
        WorkerJob(
            storage=storage,
            study_name=study.study_name,
            encoder=encoder,
            data=spec,
            options=options,
            n_trials=share,
            sampler_seed=None if options.search.seed is None else options.search.seed + i,
            torch_threads=per_worker,
            budget=budget,
        )
        for i, share in enumerate(split_trials(count, options.runtime.workers))
    ]
    _optimize_in_workers(study, jobs, data.metric, options.runtime.progress, count)
