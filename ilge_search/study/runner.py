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

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

from ..record import study_record
from ..storage import (
    Storage,
    StorageError,
    count_trials,
    fail_own_running_trials,
    fail_stale_trials,
    finished_trial_count,
    storage_fault,
)
from .data import DataSpec, StudyData, load_study_data, load_zero_shot_data
from .final import final_evaluation, final_is_current
from .identity import (
    create_or_load,
    is_registered_task,
    requeue_failed_recommended,
)
from .notes import write_notes
from .options import StudyOptions
from .plan import check_run, estimate_run, may_be_long
from .results import StudyResult, study_result, summary_line
from .selection import DEFAULT_FINAL_FRONT, DEFAULT_SELECT
from .workers import optimize, total_reached

__all__ = ["run_study"]

logger = logging.getLogger(__name__)

PathLike = Union[str, os.PathLike]

_OPTION_DEFAULTS = {f.name: f.default for f in dataclasses.fields(StudyOptions)}


def run_study(
    model: str,
    task: str,
    encoders: Union[str, Sequence[str]] = "cayley",
    *,
    n_trials: Union[int, Mapping[str, int], None] = 20,
    timeout: Optional[float] = None,
    total_trials: Optional[int] = None,
    storage: Union[str, Storage, None] = None,
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
    cv: Optional[int] = None,
    select: str = DEFAULT_SELECT,
    objectives: Sequence[str] = ("score",),
    final_front: int = DEFAULT_FINAL_FRONT,
    data_seed: int = 0,
    protocol: str = "matched",
    samples_per_label: Optional[int] = None,
    zero_shot_tasks: Sequence[str] = (),
    data_dir: Optional[PathLike] = None,
    cache_dir: Optional[PathLike] = None,
    device: str = "auto",
    artifact_dir: Optional[PathLike] = None,
    threads: Optional[int] = None,
    heartbeat_interval: Optional[int] = 60,
    grace_period: Optional[int] = None,
    max_retry: int = 3,
    callbacks: Sequence[Callable[[Any, Any], None]] = (),
    show_progress: bool = True,
    options: Optional[StudyOptions] = None,
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
        storage: any Optuna RDB URL (default ``sqlite:///studies/ilge.db``), or a
            :class:`~ilge_search.storage.Storage` already opened with
            :func:`~ilge_search.storage.open_storage` (its heartbeat settings are used).
        study_name: only with one encoder (default :func:`default_study_name`).
        sampler, pruner, seed: ``tpe|random|gp``, ``median|hyperband|none``; the
            seed seeds the sampler (worker ``i`` uses ``seed + i``) and every trial's training.
        workers: processes optimising the same study in parallel.
        final_seeds: seeds the best config is retrained with for the test score (0: skip).
        shots: keep this many training examples per label (few-shot).
        max_train, max_eval: seeded stratified caps on train / on validation and
            test (to keep a study small); they are part of the study's identity.
        max_epochs: cap on every config's ``epochs``.
        cv: score every trial on this many stratified folds of the training data
            (mean over folds) instead of on the validation split; part of the
            study's identity and name (``:cv5``); see :mod:`.folds`.
        select: the trial the final evaluation retrains: ``"best"`` or ``"one-se"``
            (see :mod:`.selection`); it also retrains the starting configuration
            for the search gain.
        objectives: ``("score",)``, or the score and ``"params"`` and/or
            ``"latency"``: a multi-objective study (maximise the score, minimise
            the others; :mod:`ilge_search.objectives`), part of the identity and
            name (``:obj-params``). Optuna cannot prune it: the pruner is switched
            off with one log line. Its final evaluation retrains up to
            ``final_front`` trials of its Pareto front (``select`` does not apply).
        data_seed: seed of the few-shot and subsampling draws.
        protocol: how the final scores are measured: ``"matched"`` (each final
            model's own head on test) or ``"paper"`` (MTEB's logistic-regression
            readout of the vectors, or their cosine Spearman; parameter-free
            baselines untrained); part of the study's identity and name
            (``:paper``); trials are the same under both. See :mod:`ilge_search.protocol`.
        samples_per_label: the paper protocol's examples per label (default: the
            MTEB task's own value, else 8).
        zero_shot_tasks: similarity tasks whose test split every final seed's
            model is also evaluated on (the paper's zero-shot STS protocol).
        data_dir, cache_dir, device: task data, embedding cache, device.
        artifact_dir: artifact store folder (default: :func:`~ilge_search.storage.artifact_dir_for`).
        threads: torch CPU threads for this call and per worker (default: unchanged
            in-process, ``cpus // workers`` per worker). The encoders are small, so on
            a CPU one thread per worker and ``workers`` = cores is usually fastest;
            several threads per process on busy cores can be many times slower.
        heartbeat_interval, grace_period, max_retry: dead-worker detection and retry.
        callbacks: extra ``f(study, frozen_trial)`` run after each trial (in-process only).
        show_progress: tqdm bars for extraction, trials and final seeds.
        options: all of the above but ``storage`` and ``callbacks`` as one
            :class:`StudyOptions`; then leave those keywords at their defaults.

    Returns:
        One :class:`StudyResult` per encoder, read back from the storage.

    Raises:
        ValueError: bad arguments, unknown model or task, :class:`StorageError`,
            :class:`StudyConflictError` -- all before any model loads.
        KeyboardInterrupt: after the running trial was marked FAIL; every
            finished trial is stored and rerunning resumes.
    """
    given = dict(
        n_trials=n_trials,
        timeout=timeout,
        total_trials=total_trials,
        study_name=study_name,
        sampler=sampler,
        pruner=pruner,
        seed=seed,
        workers=workers,
        final_seeds=final_seeds,
        shots=shots,
        max_train=max_train,
        max_eval=max_eval,
        max_epochs=max_epochs,
        cv=cv,
        select=select,
        objectives=tuple(objectives),
        final_front=final_front,
        data_seed=data_seed,
        protocol=protocol,
        samples_per_label=samples_per_label,
        zero_shot_tasks=tuple(zero_shot_tasks),
        data_dir=data_dir,
        cache_dir=cache_dir,
        device=device,
        artifact_dir=artifact_dir,
        threads=threads,
        heartbeat_interval=heartbeat_interval,
        grace_period=grace_period,
        max_retry=max_retry,
        show_progress=show_progress,
    )
    if options is None:
        options = StudyOptions(**given)
    else:
        changed = sorted(name for name, value in given.items() if value != _OPTION_DEFAULTS[name])
        if changed:
            raise ValueError(f"give the study options either as options= or as keywords, not both: {changed}")

    # ---- 1. arguments, storage, data and existing studies, before anything expensive (plan.check_run)
    check = check_run(model, task, encoders, storage, options)
    opened, spec, task_data, names = check.storage, check.spec, check.task_data, check.names
    if options.multi_objective and options.pruner != "none":
        logger.warning(
            "pruning is off: Optuna cannot prune a multi-objective study (objectives %s), so --pruner %s is not used",
            "+".join(options.objectives),
            options.pruner,
        )
    if may_be_long(check):  # a few seconds of calibration, only for runs that could take long
        plan = estimate_run(check)
        if plan.is_long:
            logger.info("%s", plan.estimate_line())

    import torch

    previous_threads = torch.get_num_threads()
    if options.threads is not None:
        torch.set_num_threads(options.threads)
    try:
        data = load_study_data(
            spec, with_test=options.final_seeds > 0, progress=options.show_progress, task_data=task_data
        )  # ---- 2. extracted once, here, before any worker starts
        zero_shot = load_zero_shot_data(spec, list(options.zero_shot_tasks), progress=options.show_progress)
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


def _run_one(
    storage: Storage,
    encoder: str,
    name: str,
    identity: Dict[str, Any],
    count: Optional[int],
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
    study, created = create_or_load(
        storage,
        name,
        identity,
        data,
        storage.artifact_dir,
        sampler=make_sampler(options.sampler, options.seed),
        pruner=make_pruner(options.effective_pruner, options.max_epochs),
        new_study_hint=new_study_hint,
        task_path=None if is_registered_task(spec.task) else str(Path(spec.task).resolve()),
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


def _optimize_and_evaluate(
    study: Any,
    storage: Storage,
    encoder: str,
    name: str,
    count: Optional[int],
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
    logger.info(
        "%s study %s (%d finished trials); adding %s",
        "created" if created else "resuming",
        name,
        finished_trial_count(study),
        "trials until timeout" if count is None else f"{count} trials",
    )

    # ---- 4. optimise
    total = options.total_for(encoder)
    if total_reached(study, total):
        logger.info("%s: the study already holds total_trials=%d trials; adding none", name, total)
    elif count is None or count > 0:
        optimize(study, storage, encoder, data, spec, options, count, callbacks)

    # ---- 5. final evaluation on test, once per seed
    if options.final_seeds > 0 and count_trials(study, ("COMPLETE",)):
        seeds = options.final_seed_list()
        if final_is_current(study, seeds, options.max_epochs, options.select, options.final_front):
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
                    options.select,
                )
        else:
            final_evaluation(
                study,
                data,
                encoder=encoder,
                seeds=seeds,
                device=spec.device,
                max_epochs=options.max_epochs,
                select=options.select,
                artifact_store=storage.artifact_store(),
                final_front=options.final_front,
                zero_shot=zero_shot,
                show_progress=options.show_progress,
            )
    elif options.final_seeds > 0:
        logger.warning("%s: no complete trial yet, so no final evaluation", name)
