"""Running studies: :func:`run_study`, one study per encoder for a (model, task) pair.

1. check everything before any model loads (:func:`.check.check_run`, shared with ``run --dry-run``); a run
   that may take long logs its estimated wall time (:func:`.plan.estimate_run`);
2. resolve the model once and make sure every split's embeddings are in the cache;
3. create each study (its record, the recommended configuration enqueued as trial 0) or load it (trials left
   RUNNING by dead processes failed and retried, a failed recommended trial queued again);
4. optimise (:mod:`.trial`), in ``workers`` processes on the same storage when asked;
5. run the study stages (:mod:`.stages`) in their order: each that applies and is not current.

What a study stores is its :class:`~ilge_search.record.StudyRecord` and each trial's
:class:`~ilge_search.record.TrialRecord`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..record import RunTimes, SourceRecord, WarmStartRecord, owner_stamping, save_run_times
from ..settings import registered_task_dir
from ..storage import (
    Storage,
    StorageError,
    fail_own_running_trials,
    fail_stale_trials,
    finished_trial_count,
    storage_fault,
)
from ..tasks.core import get_task_spec
from ..tuning import make_pruner, make_sampler, user_defaults_in_use
from .auto import announce_waiting_starts, is_auto
from .budget import TimeBudget, TimeSplit, study_deadline
from .data import DataSpec, StudyData, load_study_data, load_zero_shot_data
from .identity import (
    StudySetup,
    create_or_load,
    is_registered_task,
    requeue_failed_recommended,
)
from .notes import write_notes
from .options import StudyOptions
from .plan import RunCheck, check_run, estimate_run, may_be_long
from .planned import PlannedStudy
from .results import StudyResult, study_result, summary_line
from .stages import StageContext, StageCosting, StageTimes, StudyFacts, run_stages
from .trial import warm_start_params
from .workers import SearchLimit, TrialCallback, optimize, search_threads, total_reached

if TYPE_CHECKING:
    import optuna

    from ..engine.core import Dataset

__all__ = ["run_study"]

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike


def run_study(
    model: str,
    task: str,
    encoders: str | Sequence[str] = "cayley",
    *,
    storage: str | Storage | None = None,
    options: StudyOptions | None = None,
    callbacks: Sequence[TrialCallback] = (),
) -> list[StudyResult]:
    """Run (or resume) one Optuna study per encoder on a model's cached task embeddings.

    Args:
        model: an alias (``minilm-l6``), local folder or Hugging Face id.
        task: a registered task name or a custom task file/folder.
        encoders: families and baselines (see :func:`~ilge_search.study.identity.encoder_choices`), or ``"all"``.
        storage: any Optuna RDB URL (default ``sqlite:///studies/ilge.db``), or a
            :class:`~ilge_search.storage.Storage` already opened with
            :func:`~ilge_search.storage.open_storage` (its heartbeat settings are used).
        options: how to search, on which data, how to evaluate and where to run
            (:class:`StudyOptions`; default: ``StudyOptions()``, 20 trials). Each field is described once,
            in its group (:class:`~ilge_search.study.options.SearchOptions` ...).
        callbacks: extra ``f(study, frozen_trial)`` run after each trial (in-process only).

    Returns:
        One :class:`StudyResult` per encoder, read back from the storage.

    Raises:
        ValueError: bad arguments, unknown model or task, :class:`StorageError`,
            :class:`StudyConflictError` -- all before any model loads.
        KeyboardInterrupt: after the running trial was marked FAIL; every
            finished trial is stored and rerunning resumes.
    """
    started = time.time()  # a --time-limit counts from here: the checks and the data loading are part of the run
    if options is None:
        options = StudyOptions()
    elif not isinstance(options, StudyOptions):
        raise ValueError(f"options must be a StudyOptions, got {type(options).__name__}")

    # ---- 1. arguments, storage, data and existing studies, before anything expensive (plan.check_run)
    check = check_run(model, task, encoders, storage, options)
    _say_before_running(check)

    previous_threads = torch.get_num_threads()
    if options.runtime.threads is not None:
        torch.set_num_threads(options.runtime.threads)
    opened = check.opened_storage()
    try:
        run = _RunData.load(check, callbacks, started)  # ---- 2. extracted once, here, before any worker starts
        return _run_all(run, check.studies)
    except Exception as exc:
        fault = storage_fault(exc)
        if fault is None:
            raise
        raise StorageError(f"cannot write the study storage {opened.shown_url}: {fault}") from exc
    finally:
        torch.set_num_threads(previous_threads)


@dataclass(frozen=True)
class _RunData:
    """What every study of a run shares once step 1 passed: the storage, the data spec and the loaded data,
    the zero-shot tasks' test data, the options, the per-trial callbacks and when the run started (seconds since
    the epoch: a time limit counts from then)."""

    storage: Storage
    spec: DataSpec
    data: StudyData
    zero_shot: Mapping[str, Dataset]
    options: StudyOptions
    callbacks: Sequence[TrialCallback]
    started: float

    @classmethod
    def load(cls, check: RunCheck, callbacks: Sequence[TrialCallback], started: float) -> _RunData:
        """The run's data, read from the cache (extracted into it first where it is not there yet)."""
        options, spec = check.options, check.spec
        progress = options.runtime.progress
        data = load_study_data(spec, with_test=options.final.seeds > 0, progress=progress, task_data=check.task_data)
        zero_shot = load_zero_shot_data(spec, list(options.data.zero_shot_tasks), progress=progress)
        return cls(check.opened_storage(), spec, data, zero_shot, options, callbacks, started)


def _say_before_running(check: RunCheck) -> None:
    """The lines a run logs before it loads anything: pruning that cannot apply, a user defaults file in
    use, and for a run that may take long its estimated wall time (:func:`.plan.estimate_run`)."""
    search = check.options.search
    if search.multi_objective and search.pruner != "none":
        logger.warning(
            "pruning is off: Optuna cannot prune a multi-objective study (objectives %s), so --pruner %s is not used",
            "+".join(search.objectives),
            search.pruner,
        )
    _say_which_defaults()
    if may_be_long(check):  # a few seconds of calibration, only for runs that could take long
        plan = estimate_run(check)
        if plan.is_long:
            logger.info("%s", plan.estimate_line())


def study_source(spec: DataSpec) -> SourceRecord:
    """Where ``spec``'s data comes from (the data folder as given and as used, a custom task's path as given,
    its columns) and the extraction settings every study uses: what the study records for later commands."""

    registered = is_registered_task(spec.task)
    used = registered_task_dir(get_task_spec(spec.task).local_name, spec.data_dir) if registered else None
    return SourceRecord(
        data_dir=spec.data_dir if registered else None,
        data_dir_resolved=None if used is None else str(used.resolve()),
        task_path_given=None if registered else spec.task,
        task_columns=spec.column_options(),
    )


def _say_which_defaults() -> None:
    """One line when the starting configuration comes from a user defaults file, not the shipped one: two
    users running the same command would otherwise start different studies without knowing why."""

    user = user_defaults_in_use()
    if user is not None:
        logger.warning(
            "the starting configuration (trial 0 of a new study) is read from the user defaults file %s over the "
            "shipped defaults; move it away or point $ILGE_SEARCH_DEFAULTS elsewhere to start from the shipped ones",
            user,
        )


def _run_all(run: _RunData, studies: Sequence[PlannedStudy]) -> list[StudyResult]:
    """Steps 3-5 for each planned study in turn; under a time limit (counted from the run's start) each gets an
    equal share of the time left when it starts."""
    limit = run.options.search.time_limit
    deadline = None if limit is None else run.started + limit
    return [_run_one(run, planned, _deadline(deadline, len(studies) - i)) for i, planned in enumerate(studies)]


def _deadline(run_deadline: float | None, studies_left: int) -> float | None:
    """The next study's deadline under a time limit: its share of the time left (:func:`.budget.study_deadline`)."""
    return None if run_deadline is None else study_deadline(run_deadline, time.time(), studies_left)


def _time_budget(context: StageContext, deadline: float) -> TimeBudget:
    """The :class:`~.budget.TimeBudget` of the context's study: what the registered stages will need after its
    search, costed on the study as it is when the search starts."""
    costing = StageCosting(StudyFacts(context.name, context.record, context.options, context.task_kind))
    return TimeBudget(deadline, costing, context.options.runtime.workers, search_threads(context.options))


def _run_one(run: _RunData, planned: PlannedStudy, deadline: float | None = None) -> StudyResult:
    """Steps 3-5 of :func:`run_study` for one planned study (its search stopped in time for ``deadline``); where
    the time went is stored on the study (:class:`~ilge_search.record.RunTimes`)."""
    study, created = _create_or_load(run, planned)
    context = StageContext(
        study=study,
        storage=run.storage,
        planned=planned,
        data=run.data,
        spec=run.spec,
        options=run.options,
        zero_shot=run.zero_shot,
    )
    try:
        search = _SearchTimes.start(study)
        _optimize(run, context, created, deadline)
        search = search.end(study)
        stages = run_stages(context)  # ---- 5. the study stages, in order
    except Exception as exc:
        if storage_fault(exc) is not None:  # fail this process's half-done trial, if the storage still lets us
            fail_own_running_trials(study, run.storage)
        raise
    write_notes(study)  # a Markdown note per trial and per study, for optuna-dashboard
    save_run_times(study, search.record(run, planned, stages, deadline))
    result = study_result(study, run.storage)
    logger.info("%s", summary_line(result))
    return result


@dataclass(frozen=True)
class _SearchTimes:
    """When a study's search began and ended (seconds since the epoch) and its finished trials then."""

    began: float
    before: int
    ended: float | None = None
    after: int | None = None

    @classmethod
    def start(cls, study: optuna.Study) -> _SearchTimes:
        return cls(time.time(), finished_trial_count(study))

    def end(self, study: optuna.Study) -> _SearchTimes:
        return _SearchTimes(self.began, self.before, time.time(), finished_trial_count(study))

    def record(self, run: _RunData, planned: PlannedStudy, stages: StageTimes, deadline: float | None) -> RunTimes:
        """The study's :class:`~ilge_search.record.RunTimes` of this run, ending now."""
        ended = self.began if self.ended is None else self.ended
        search = run.options.search
        caps = [search.total_for(planned.encoder)]
        if planned.count is not None:
            caps.append(self.before + planned.count)
        known = [cap for cap in caps if cap is not None]
        return RunTimes(
            started=run.started,
            before_search=self.began - run.started,
            search=ended - self.began,
            elapsed=time.time() - run.started,
            stages=dict(stages.ran),
            current=list(stages.current),
            time_limit=search.time_limit,
            limit=None if deadline is None else deadline - run.started,
            trials_before=self.before,
            trials_after=self.before if self.after is None else self.after,
            trial_cap=min(known) if known else None,
            workers=run.options.runtime.workers,
            threads=run.options.runtime.threads,
        )


def _create_or_load(run: _RunData, planned: PlannedStudy) -> tuple[optuna.Study, bool]:
    """Step 3 of :func:`run_study`: the planned study created (its warm start enqueued) or loaded."""

    storage, search, spec = run.storage, run.options.search, run.spec
    encoder, hidden, task = planned.encoder, run.data.hidden_size, planned.identity.task
    warm = None
    if search.warm_start:
        warm = warm_start_params(storage, encoder, search.warm_start, hidden_size=hidden, model=spec.model, task=task)
    if warm is not None and storage.load_study(planned.name) is None:  # only a new study enqueues its warm start
        budget = planned.count if planned.count is not None else search.total_for(planned.encoder)
        warm = _warm_start_within_budget(warm, planned.name, budget)
    setup = StudySetup(
        sampler=owner_stamping(make_sampler(search.sampler, search.seed, conditional=is_auto(planned.encoder))),
        pruner=make_pruner(search.effective_pruner, search.max_epochs),
        new_study_hint=planned.hint,
        task_path=None if is_registered_task(spec.task) else str(Path(spec.task).resolve()),
        warm_start=warm,
        source=study_source(spec),
    )
    return create_or_load(storage, planned.name, planned.attrs, run.data, storage.artifact_dir, setup)


def _warm_start_within_budget(warm: WarmStartRecord, name: str, budget: int | None) -> WarmStartRecord:
    """The warm-start members a new study's trial budget can run (the starting configuration is its first
    trial); one warning line when members are dropped, since queued trials beyond the budget would wait
    unseen until a later run picked them up."""
    if budget is None or len(warm.members) < budget:
        return warm
    room = max(budget - 1, 0)
    logger.warning(
        "%s: --warm-start %d but the run adds %d trial(s), the starting configuration first: %d member(s) beyond "
        "that budget are not enqueued; pass --n-trials %d (or --total-trials) to try them all",
        name,
        len(warm.members),
        budget,
        len(warm.members) - room,
        len(warm.members) + 1,
    )
    return warm.with_members(warm.members[:room])


def _optimize(run: _RunData, context: StageContext, created: bool, deadline: float | None) -> None:
    """Step 4 of :func:`run_study` on a created or loaded study: its dead trials failed, a failed start
    queued again, then the planned trials added (until ``deadline`` leaves just the stages' time, which is
    logged as the search ends)."""
    study, planned = context.study, context.planned
    fail_stale_trials(study, run.storage)
    requeue_failed_recommended(study, run.storage)
    name, count = planned.name, planned.count
    total = run.options.search.total_for(planned.encoder)
    if count is not None:
        adding = f"{count} trials"
    else:
        adding = "trials until timeout" if total is None else f"trials until it holds {total}"
    logger.info(
        "%s study %s (%d finished trials); adding %s",
        "created" if created else "resuming",
        name,
        finished_trial_count(study),
        adding,
    )
    if is_auto(planned.encoder):
        room = total - finished_trial_count(study) if count is None and total is not None else count
        announce_waiting_starts(study, room)
    if total_reached(study, total):
        logger.info("%s: the study already holds total_trials=%d trials; adding none", name, total)
    elif count is None or count > 0:
        budget = None if deadline is None else _time_budget(context, deadline)
        limit = SearchLimit(count, budget)
        optimize(study, run.storage, planned.encoder, run.data, run.spec, run.options, limit, run.callbacks)
        if budget is not None and deadline is not None:  # the limit as the study's RunTimes records it
            split = TimeSplit.of(deadline - run.started, budget.costs(study.get_trials(deepcopy=False)))
            logger.info("%s: %s", name, split.line())
