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
from typing import Any

# module -> the public names it defines, each imported on first use: the CLI reads the options' help from
# .options without paying for the runner, the storage and numpy
_PUBLIC: dict[str, tuple[str, ...]] = {
    "..storage": ("StorageError", "artifact_dir_for", "finished_trial_count"),
    "..tuning": ("PRUNERS", "SAMPLERS", "make_pruner", "make_sampler"),
    ".grid": ("Sweep", "SweepEntry", "SweepFilter", "SweepOverrides", "load_sweep"),
    ".identity": ("StudyConflictError", "default_study_name", "encoder_choices", "resolve_encoders"),
    ".options": ("DataOptions", "FinalOptions", "RuntimeOptions", "SearchOptions", "StudyOptions"),
    ".plan": ("RunPlan", "StudyPlan", "plan_run"),
    ".results": ("StudyResult", "format_front", "format_results", "list_studies", "study_result"),
    ".runner": ("run_study",),
    ".selection": (
        "DEFAULT_FINAL_FRONT",
        "DEFAULT_SELECT",
        "SELECTION_RULES",
        "front_trials",
        "select_trial",
        "study_front",
    ),
    ".sweep": ("SweepRuntime", "estimate_sweep", "plan_sweep", "run_sweep"),
    ".trial": ("recommended_params",),
}
_HOME = {name: module for module, names in _PUBLIC.items() for name in names}
__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    module_name = _HOME.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
