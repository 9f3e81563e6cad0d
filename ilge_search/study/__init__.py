"""Optuna studies over cached layer embeddings: the platform's main job.

- :func:`run_study` (:mod:`.runner`) runs or resumes one study per encoder for
  a (model, task) pair, with one validated :class:`StudyOptions` (:mod:`.options`);
- :mod:`.data` loads the task and its cached embeddings, :mod:`.trial` is
  the trial, :mod:`.identity` names, checks and creates studies, :mod:`.workers`
  runs trials in several processes, :mod:`.folds` gives cross-validated objectives,
  :mod:`.selection` picks the trial to retrain (``best`` or ``one-se``; a multi-objective
  study: up to K trials of its Pareto front), :mod:`.final` scores it on test next to the
  starting configuration (the search gain);
- :mod:`.plan` checks a run before anything expensive and estimates its wall time (``--dry-run``);
- :mod:`.results` reads studies back (:func:`study_result`, :func:`list_studies`), :mod:`.notes`
  writes their optuna-dashboard notes, :mod:`.export` turns a finished study into a trained model;
- :mod:`.grid` reads TOML grids, :mod:`.sweep` runs them: grids of models x tasks x encoders up to their budgets.

The storage itself is opened by :func:`ilge_search.storage.open_storage`; what a study stores is its
record (:mod:`ilge_search.record`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..storage import StorageError, artifact_dir_for, finished_trial_count
    from ..tuning import PRUNERS, SAMPLERS, make_pruner, make_sampler
    from .grid import Sweep, SweepEntry, SweepFilter, SweepOverrides, load_sweep
    from .identity import StudyConflictError, default_study_name, encoder_choices, resolve_encoders
    from .options import DataOptions, FinalOptions, RuntimeOptions, SearchOptions, StudyOptions
    from .plan import RunPlan, StudyPlan, plan_run
    from .results import StudyResult, format_front, format_results, list_studies, study_result
    from .runner import run_study
    from .selection import (
        DEFAULT_FINAL_FRONT,
        DEFAULT_SELECT,
        SELECTION_RULES,
        front_trials,
        select_trial,
        study_front,
    )
    from .sweep import SweepRuntime, estimate_sweep, plan_sweep, run_sweep
    from .trial import recommended_params

# public name -> the module that defines it, imported on first use: the CLI reads the options' help from
# .options without paying for the runner, the storage and numpy
_LAZY = {
    "StorageError": "..storage",
    "artifact_dir_for": "..storage",
    "finished_trial_count": "..storage",
    "PRUNERS": "..tuning",
    "SAMPLERS": "..tuning",
    "make_pruner": "..tuning",
    "make_sampler": "..tuning",
    "encoder_choices": ".identity",
    "StudyConflictError": ".identity",
    "default_study_name": ".identity",
    "resolve_encoders": ".identity",
    "DataOptions": ".options",
    "FinalOptions": ".options",
    "RuntimeOptions": ".options",
    "SearchOptions": ".options",
    "StudyOptions": ".options",
    "RunPlan": ".plan",
    "StudyPlan": ".plan",
    "plan_run": ".plan",
    "StudyResult": ".results",
    "format_front": ".results",
    "format_results": ".results",
    "list_studies": ".results",
    "study_result": ".results",
    "run_study": ".runner",
    "DEFAULT_FINAL_FRONT": ".selection",
    "DEFAULT_SELECT": ".selection",
    "SELECTION_RULES": ".selection",
    "front_trials": ".selection",
    "select_trial": ".selection",
    "study_front": ".selection",
    "Sweep": ".grid",
    "SweepEntry": ".grid",
    "SweepFilter": ".grid",
    "SweepOverrides": ".grid",
    "SweepRuntime": ".sweep",
    "estimate_sweep": ".sweep",
    "load_sweep": ".grid",
    "plan_sweep": ".sweep",
    "run_sweep": ".sweep",
    "recommended_params": ".trial",
}


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "encoder_choices",
    "SAMPLERS",
    "PRUNERS",
    "StudyOptions",
    "SearchOptions",
    "DataOptions",
    "FinalOptions",
    "RuntimeOptions",
    "StudyResult",
    "StudyConflictError",
    "StorageError",
    "run_study",
    "select_trial",
    "SELECTION_RULES",
    "DEFAULT_SELECT",
    "DEFAULT_FINAL_FRONT",
    "study_front",
    "front_trials",
    "plan_run",
    "RunPlan",
    "StudyPlan",
    "list_studies",
    "study_result",
    "resolve_encoders",
    "default_study_name",
    "recommended_params",
    "make_sampler",
    "make_pruner",
    "artifact_dir_for",
    "finished_trial_count",
    "format_results",
    "format_front",
    "SweepEntry",
    "Sweep",
    "SweepFilter",
    "SweepOverrides",
    "SweepRuntime",
    "load_sweep",
    "plan_sweep",
    "estimate_sweep",
    "run_sweep",
]
