"""Running studies: :func:`run_study`, the platform's main job.

:func:`run_study` runs one study per encoder for a (model, task) pair:

1. check the arguments (one :class:`~ilge_search.study.StudyOptions`), open
   the storage once, load the task (texts and labels only) and check any
   existing study with the same name (a name already used for another model,
   task, setting or data is an error; see :mod:`.identity`) -- all before any
   model loads (:func:`.plan.check_run`, which ``run --dry-run`` shares); a run
   that may take long logs its estimated wall time (:func:`.plan.estimate_run`);
2. resolve the model once and make sure every split's embeddings are in the
   cache (extracted once);
3. create the study, or load it to add trials. A new study gets its identity as
   user attrs and the encoder's ``recommended_config`` enqueued as trial 0;
   trials left RUNNING by dead processes are failed and retried, and a failed
   recommended trial is queued again;
4. optimise: every trial builds a config with ``suggest_config``, trains it with
   the one engine on train, reports the validation metric after each epoch for
   the pruner, and stores what it did as trial user attrs; ``workers > 1`` runs
   that many processes on the same storage, splitting ``n_trials`` exactly;
5. retrain the selected configuration (``select``: the best trial, or the
   simplest within one standard error of it) with ``final_seeds`` seeds,
   evaluate each on test once, store mean, std and per-seed scores as study
   user attrs, and upload the weights of the best seed (by validation) as an
   Optuna artifact; the starting configuration is retrained with the same
   seeds for the search gain.

Stored layout (what reports and the dashboard read):

- the study's record (:class:`ilge_search.record.StudyRecord`): its
  :class:`~ilge_search.record.Identity` (model, task, encoder, the data and budget
  options, ``cv``, objectives, protocol), its :class:`~ilge_search.record.DataRecord`
  (task kind, metric, shapes, label names, split sizes, cache keys, data
  fingerprints, the model's revision, a custom task's path, the artifact folder)
  and, after the final evaluation, its :class:`~ilge_search.record.FinalRecord`
  (:mod:`ilge_search.study.final`);
- each trial's :class:`~ilge_search.record.TrialRecord`: see :mod:`ilge_search.study.trial`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..record import SourceRecord, study_record
from ..storage import (
    Storage,
    StorageError,
    count_trials,
    fail_own_running_trials,
    fail_stale_trials,
    finished_trial_count,
    owner_stamping,
    storage_fault,
)
from .data import DataSpec, StudyData, load_study_data, load_zero_shot_data
from .final import FinalModels, final_evaluation, final_is_current
from .identity import (
    create_or_load,
    is_registered_task,
    requeue_failed_recommended,
)
from .notes import write_notes
from .options import StudyOptions
from .plan import check_run, estimate_run, may_be_long
from .results import StudyResult, study_result, summary_line
from .trial import warm_start_params
from .workers import optimize, total_reached

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
    callbacks: Sequence[Callable[[Any, Any], None]] = (),
) -> list[StudyResult]:
    """Run (or resume) one Optuna study per encoder on a model's cached task embeddings.

    Args:
        model: an alias (``minilm-l6``), local folder or Hugging Face id.
        task: a registered task name or a custom task file/folder.
        encoders: families and baselines (see :data:`ENCODER_CHOICES`), or ``"all"``.
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
    if options is None:
        options = StudyOptions()
    elif not isinstance(options, StudyOptions):
        raise ValueError(f"options must be a StudyOptions, got {type(options).__name__}")

    # ---- 1. arguments, storage, data and existing studies, before anything expensive (plan.check_run)
    check = check_run(model, task, encoders, storage, options)
    opened, spec, task_data, names = check.opened_storage(), check.spec, check.task_data, check.names
    if options.search.multi_objective and options.search.pruner != "none":
        logger.warning(
            "pruning is off: Optuna cannot prune a multi-objective study (objectives %s), so --pruner %s is not used",
            "+".join(options.search.objectives),
            options.search.pruner,
        )
    _say_which_defaults()
    if may_be_long(check):  # a few seconds of calibration, only for runs that could take long
        plan = estimate_run(check)
        if plan.is_long:
            logger.info("%s", plan.estimate_line())

    import torch

    previous_threads = torch.get_num_threads()
    if options.runtime.threads is not None:
        torch.set_num_threads(options.runtime.threads)
    try:
        data = load_study_data(
            spec, with_test=options.final.seeds > 0, progress=options.runtime.progress, task_data=task_data
        )  # ---- 2. extracted once, here, before any worker starts
        zero_shot = load_zero_shot_data(spec, list(options.data.zero_shot_tasks), progress=options.runtime.progress)
        return [
            _run_one(
                opened,
                enc,
                names[enc],
                check.identities[enc],
                check.trial_counts[enc],
                data,
                spec,
                options,
                zero_shot=zero_shot,
                callbacks=callbacks,
                new_study_hint=check.hints[enc],
            )
            for enc in check.encoders
        ]
    except Exception as exc:
        fault = storage_fault(exc)
        if fault is None:
            raise
        raise StorageError(f"cannot write the study storage {opened.shown_url}: {fault}") from exc
    finally:
        torch.set_num_threads(previous_threads)


def study_source(spec: DataSpec) -> SourceRecord:
    """Where ``spec``'s data comes from (the data folder as given and as used, a custom task's path as given,
    its columns) and the extraction settings every study uses: what the study records for later commands."""
    from ..settings import registered_task_dir
    from ..tasks import get_task_spec

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
    from ..tuning import user_defaults_in_use

    user = user_defaults_in_use()
    if user is not None:
        logger.warning(
            "the starting configuration (trial 0 of a new study) is read from the user defaults file %s over the "
            "shipped defaults; move it away or point $ILGE_SEARCH_DEFAULTS elsewhere to start from the shipped ones",
            user,
        )


def _run_one(
    storage: Storage,
    encoder: str,
    name: str,
    identity: dict[str, Any],
    count: int | None,
    data: StudyData,
    spec: DataSpec,
    options: StudyOptions,
    *,
    zero_shot: Mapping[str, Any],
    callbacks: Sequence[Callable[[Any, Any], None]],
    new_study_hint: str,
) -> StudyResult:
    """Steps 3-5 of :func:`run_study` for one encoder."""
    from ..tuning import make_pruner, make_sampler

    # ---- 3. create or load
    warm = (
        warm_start_params(
            storage,
            encoder,
            options.search.warm_start,
            hidden_size=data.hidden_size,
            model=spec.model,
            task=str(identity["task"]),
        )
        if options.search.warm_start
        else None
    )
    if warm is not None and storage.load_study(name) is None:  # only a new study enqueues its warm start
        warm = _warm_start_within_budget(warm, name, count if count is not None else options.search.total_for(encoder))
    study, created = create_or_load(
        storage,
        name,
        identity,
        data,
        storage.artifact_dir,
        sampler=owner_stamping(make_sampler(options.search.sampler, options.search.seed)),
        pruner=make_pruner(options.search.effective_pruner, options.search.max_epochs),
        new_study_hint=new_study_hint,
        task_path=None if is_registered_task(spec.task) else str(Path(spec.task).resolve()),
        warm_start=warm,
        source=study_source(spec),
    )
    try:
        _optimize_and_evaluate(
            study,
            storage,
            encoder,
            name,
            count,
            data,
            spec,
            options,
            zero_shot=zero_shot,
            callbacks=callbacks,
            created=created,
        )
    except Exception as exc:
        if storage_fault(exc) is not None:  # fail this process's half-done trial, if the storage still lets us
            fail_own_running_trials(study, storage)
        raise
    write_notes(study)  # a Markdown note per trial and per study, for optuna-dashboard
    result = study_result(study, storage)
    logger.info("%s", summary_line(result))
    return result


def _warm_start_within_budget(warm: Any, name: str, budget: int | None) -> Any:
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


def _optimize_and_evaluate(
    study: Any,
    storage: Storage,
    encoder: str,
    name: str,
    count: int | None,
    data: StudyData,
    spec: DataSpec,
    options: StudyOptions,
    *,
    zero_shot: Mapping[str, Any],
    callbacks: Sequence[Callable[[Any, Any], None]],
    created: bool,
) -> None:
    """Steps 4 and 5 of :func:`run_study` on a created or loaded study."""
    fail_stale_trials(study, storage)
    requeue_failed_recommended(study, storage)
    total = options.search.total_for(encoder)
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

    # ---- 4. optimise
    if total_reached(study, total):
        logger.info("%s: the study already holds total_trials=%d trials; adding none", name, total)
    elif count is None or count > 0:
        optimize(study, storage, encoder, data, spec, options, count, callbacks)

    # ---- 5. final evaluation on test, once per seed
    if options.final.seeds > 0 and count_trials(study, ("COMPLETE",)):
        seeds = options.final_seed_list()
        trained: FinalModels = {}
        if final_is_current(study, seeds, options.search.max_epochs, options.final.select, options.final.front):
            final = study_record(study).final
            front = [] if final is None else final.front
            if front:
                logger.info(
                    "%s: final scores of the %d front trials (%s) are up to date",
                    name,
                    len(front),
                    ", ".join(str(member.trial) for member in front),
                )
            else:
                logger.info(
                    "%s: final scores of trial %d (%s) are up to date",
                    name,
                    -1 if final is None else final.trial,
                    options.final.select,
                )
        else:
            trained = final_evaluation(
                study,
                data,
                encoder=encoder,
                seeds=seeds,
                device=spec.device,
                max_epochs=options.search.max_epochs,
                select=options.final.select,
                artifact_store=storage.artifact_store(),
                final_front=options.final.front,
                zero_shot=zero_shot,
                progress=options.runtime.progress,
            )
        _ensemble_stage(study, storage, name, data, spec, options, trained)
    elif options.final.seeds > 0:
        logger.warning("%s: no complete trial yet, so no final evaluation", name)


def _ensemble_stage(
    study: Any,
    storage: Storage,
    name: str,
    data: StudyData,
    spec: DataSpec,
    options: StudyOptions,
    trained: FinalModels,
) -> None:
    """Step 6 of :func:`run_study`: the ensemble evaluation (``--ensemble K``, by default 5 where the study can
    have one), unless it is current; members the final evaluation just ``trained`` are not trained again."""
    from .ensemble import EnsembleRun, ensemble_evaluation, ensemble_is_current, ensemble_size

    size, note = ensemble_size(study, options.final.ensemble)
    if note:
        logger.warning("%s: %s", name, note)
    if not size:
        return
    run = EnsembleRun(
        size=size,
        seeds=options.final_seed_list(),
        max_epochs=options.search.max_epochs,
        select=options.final.select,
        prediction_seed=options.search.seed or 0,
        device=spec.device,
        artifact_store=storage.artifact_store(),
        progress=options.runtime.progress,
        reuse=trained,
    )
    if ensemble_is_current(study, run):
        logger.info("%s: the ensemble of %d is up to date", name, size)
        return
    ensemble_evaluation(study, data, run)
