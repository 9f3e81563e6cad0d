"""Running a grid (:mod:`.grid`): each study up to its trial budget, then its final evaluation; its plan and
its dry run's estimate."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd

from ..settings import default_storage_url
from ..storage import Storage, finished_trial_count, open_storage
from .check import open_for_writing
from .final import final_is_current
from .grid import Sweep, SweepEntry, SweepFilter, SweepOverrides, load_sweep, with_overrides
from .options import StudyOptions
from .plan import missing_sqlite_file, plan_run
from .results import StudyResult, study_result
from .runner import run_study

if TYPE_CHECKING:
    import optuna
    import pandas as pd

    from .plan import RunPlan

__all__ = ["plan_sweep", "estimate_sweep", "SweepRuntime", "run_sweep"]

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike


def _prepared(sweep: Sweep | PathLike, overrides: SweepOverrides | None) -> Sweep:
    return with_overrides(sweep if isinstance(sweep, Sweep) else load_sweep(sweep), overrides)


def _groups(entries: list[SweepEntry]) -> dict[tuple, list[SweepEntry]]:
    """The entries by their ``run_study`` call: one per (model, task, data, objective and protocol options)."""
    groups: dict[tuple, list[SweepEntry]] = {}
    for entry in entries:
        groups.setdefault(entry.group_key(), []).append(entry)
    return groups


def _status(storage: Storage, entry: SweepEntry, options: StudyOptions) -> tuple[optuna.Study | None, int, bool]:
    """One entry's study (``None`` before it exists), its finished trials and whether its final
    evaluation is current (always, when the sweep runs none)."""
    study = storage.load_study(entry.study_name)
    if study is None:
        return None, 0, False
    if options.final.seeds == 0:
        return study, finished_trial_count(study), True
    return (
        study,
        finished_trial_count(study),
        final_is_current(study, options.final_seed_list(), entry.max_epochs, options.final.select, options.final.front),
    )


def plan_sweep(
    sweep: Sweep | PathLike, storage: str | None = None, *, overrides: SweepOverrides | None = None
) -> pd.DataFrame:
    """One row per study: its name, protocol, budget, finished trials, trials still to run and
    whether its final evaluation (under the overrides' ``select``, else the grid's rule) is done (a
    ``pandas.DataFrame``)."""

    sweep = _prepared(sweep, overrides)
    options = sweep.study_options(**(overrides.run_options() if overrides else {}))
    url = storage if storage is not None else sweep.storage
    # only read: a SQLite file that does not exist yet holds no study, and is not created
    opened = None if missing_sqlite_file(url or default_storage_url()) else open_storage(url, must_exist=True)
    rows = []
    for entry in sweep.entries:
        _, finished, final = _status(opened, entry, options) if opened is not None else (None, 0, False)
        study = (entry.study_name, entry.model, entry.task, entry.encoder, entry.protocol)
        rows.append((*study, entry.n_trials, finished, max(0, entry.n_trials - finished), final))
    return pd.DataFrame(
        rows, columns=["study", "model", "task", "encoder", "protocol", "budget", "finished", "to_run", "final_done"]
    )


def estimate_sweep(
    sweep: Sweep | PathLike,
    *,
    storage: str | None = None,
    only: SweepFilter | None = None,
    overrides: SweepOverrides | None = None,
    data_dir: PathLike | None = None,
    cache_dir: PathLike | None = None,
    device: str = "auto",
    calibrate: bool = True,
) -> list[RunPlan]:
    """The :class:`~ilge_search.study.plan.RunPlan` of each ``run_study`` call the sweep would make (a dry
    run: nothing is created or written), with the trials each study still needs to reach its budget.
    Arguments as in :func:`run_sweep`."""

    sweep = _prepared(sweep, overrides)
    options = sweep.study_options(
        data_dir=data_dir,
        cache_dir=cache_dir,
        device=device,
        progress=False,
        **(overrides.run_options() if overrides else {}),
    )
    url = storage if storage is not None else sweep.storage
    plans = []
    for group in _groups((only or SweepFilter()).entries(sweep)).values():
        first = group[0]
        group_options = first.options(options, {e.encoder: e.n_trials for e in group})
        encoders = [e.encoder for e in group]
        now = plan_run(first.model, first.task, encoders, storage=url, options=group_options, calibrate=False)
        left = {s.encoder: max(0, e.n_trials - s.finished) for s, e in zip(now.studies, group, strict=True)}
        plans.append(
            plan_run(
                first.model,
                first.task,
                encoders,
                storage=url,
                calibrate=calibrate,
                options=group_options.replace(n_trials=left),
            )
        )
    return plans


@dataclass(frozen=True)
class SweepRuntime:
    """Where and how a sweep's studies run: ``data_dir``, ``cache_dir``, ``device``, ``artifact_dir`` and
    ``progress``, as in :class:`StudyOptions`; none of them changes which studies the grid holds."""

    data_dir: PathLike | None = None
    cache_dir: PathLike | None = None
    device: str = "auto"
    artifact_dir: PathLike | None = None
    progress: bool = True


def run_sweep(
    sweep: Sweep | PathLike,
    *,
    storage: str | None = None,
    only: SweepFilter | None = None,
    overrides: SweepOverrides | None = None,
    runtime: SweepRuntime = SweepRuntime(),
) -> list[StudyResult]:
    """Run every study of a grid up to its budget, then its final evaluation.

    Args:
        sweep: a :class:`Sweep` or the path of a grid file.
        storage: overrides the file's ``storage`` (default ``sqlite:///studies/ilge.db``).
        only: run only these models, tasks and encoders of the grid (:class:`SweepFilter`; default: all).
        overrides: the command line's changes to the grid (:class:`SweepOverrides`): ``cv``, ``protocol``
            and ``samples_per_label`` are other studies (other names); ``select``, ``workers``, ``threads``.
        runtime: data and cache folders, device, artifact folder and progress bars (:class:`SweepRuntime`).

    Returns:
        One :class:`StudyResult` per study run (skipped finished studies included).
    """
    sweep = _prepared(sweep, overrides)
    options = sweep.study_options(
        **{field.name: getattr(runtime, field.name) for field in dataclasses.fields(runtime)},
        **(overrides.run_options() if overrides else {}),
    )
    entries = (only or SweepFilter()).entries(sweep)
    if not entries:
        raise ValueError("no study of the sweep matches the given --model/--task/--encoder filters")
    url = (storage if storage is not None else sweep.storage) or default_storage_url()
    # a new SQLite file is left to the first run to create, after its checks: a refused sweep leaves nothing
    opened = None if missing_sqlite_file(url) else open_for_writing(url, options)
    groups = _groups(entries)
    results: list[StudyResult] = []
    for number, group in enumerate(groups.values(), 1):
        remaining, done = _remaining(opened, group, options)
        logger.info("[%d/%d] %s", number, len(groups), _group_label(group, remaining))
        results += _run_group(url if opened is None else opened, group, options, remaining, done)
        opened = open_for_writing(url, options) if opened is None else opened
    return results


def _remaining(
    opened: Storage | None, group: list[SweepEntry], options: StudyOptions
) -> tuple[dict[str, int], dict[str, optuna.Study]]:
    """The trials each encoder of a group still needs, and the studies already at their budget with
    current final scores (encoder -> its study)."""
    remaining: dict[str, int] = {}
    done: dict[str, optuna.Study] = {}
    for entry in group:
        study, finished, final = (None, 0, False) if opened is None else _status(opened, entry, options)
        if study is not None and finished >= entry.n_trials and final:
            done[entry.encoder] = study
        else:
            remaining[entry.encoder] = max(0, entry.n_trials - finished)
    return remaining, done


def _group_label(group: list[SweepEntry], remaining: Mapping[str, int]) -> str:
    first = group[0]
    left = ", ".join(f"{e}+{n}" for e, n in remaining.items()) or "done"
    return f"{first.model} / {first.task} ({first.protocol} protocol): {left}"


def _run_group(
    opened: Storage | str,
    group: list[SweepEntry],
    options: StudyOptions,
    remaining: dict[str, int],
    done: Mapping[str, optuna.Study],
) -> list[StudyResult]:
    """Run the studies of one group that need it, in one ``run_study`` call; the results in group order."""
    first = group[0]
    ran: dict[str, StudyResult] = {}
    if remaining:
        # the budget is also a cap shared with every other process on the storage (another sweep of the same
        # grid, extra workers): counted when each trial starts, so concurrent runs stop at the budget together
        group_options = first.options(options, remaining).replace(
            total_trials={e.encoder: e.n_trials for e in group if e.encoder in remaining}
        )
        ran_results = run_study(first.model, first.task, list(remaining), storage=opened, options=group_options)
        ran = dict(zip(remaining, ran_results, strict=True))
    return [
        ran[entry.encoder] if entry.encoder in ran else study_result(done[entry.encoder], opened) for entry in group
    ]
