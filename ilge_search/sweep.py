"""Declarative sweeps: a TOML grid of models x tasks x encoders with trial budgets.

A grid file looks like this (every key but ``models``, ``tasks`` and
``[trials]`` is optional)::

    storage = "sqlite:///studies/offline.db"
    models = ["minilm-l6", "smollm2-135m"]
    encoders = ["all"]                 # or a list of families and baselines
    sampler = "tpe"                    # tpe | random | gp
    pruner = "median"                  # median | hyperband | none
    seed = 0
    final_seeds = 3
    workers = 1
    threads = 1                        # torch CPU threads per process
    max_epochs = 30                    # cap on every config's epochs
    max_train = 2000                   # default cap on train examples per task

    [trials]                           # target number of finished trials per study
    default = 20
    best-layer = 5

    [tasks.banking77]                  # one table per task, may be empty
    max_train = 3000
    [tasks.stsb]
    zero_shot = ["sick_r"]             # evaluated with the STS-B encoder
    [tasks.trec]

Budgets are totals, not increments: a study that already holds its budget of
complete + pruned trials gets none more, so rerunning a sweep resumes it and
rerunning a finished sweep does nothing. Each (model, task) pair is one
:func:`~ilge_search.study.run_study` call, so its embeddings load once for all
encoders.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .study import PRUNERS, SAMPLERS, StudyResult, default_study_name, resolve_encoders

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["SweepEntry", "Sweep", "load_sweep", "plan_sweep", "run_sweep"]

PathLike = Union[str, os.PathLike]

_TOP_KEYS = {"name", "storage", "models", "encoders", "sampler", "pruner", "seed", "final_seeds", "workers", "threads",
             "max_epochs", "max_train", "max_eval", "shots", "timeout", "trials", "tasks"}
_TASK_KEYS = {"max_train", "max_eval", "shots", "max_epochs", "zero_shot", "encoders", "trials"}


@dataclass(frozen=True)
class SweepEntry:
    """One study of a sweep: what to search and its trial budget."""

    model: str
    task: str
    encoder: str
    n_trials: int
    max_train: Optional[int] = None
    max_eval: Optional[int] = None
    shots: Optional[int] = None
    max_epochs: Optional[int] = None
    zero_shot: Tuple[str, ...] = ()

    @property
    def study_name(self) -> str:
        return default_study_name(self.model, self.task, self.encoder, shots=self.shots, max_train=self.max_train,
                                  max_eval=self.max_eval, max_epochs=self.max_epochs)


@dataclass
class Sweep:
    """A parsed grid file: shared study options plus one entry per study."""

    name: str
    storage: Optional[str]
    entries: List[SweepEntry]
    sampler: str = "tpe"
    pruner: str = "median"
    seed: int = 0
    final_seeds: int = 3
    workers: int = 1
    threads: Optional[int] = None
    timeout: Optional[float] = None
    path: Optional[Path] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    def pairs(self) -> List[Tuple[str, str]]:
        """(model, task) pairs in file order; each is one ``run_study`` call."""
        seen: List[Tuple[str, str]] = []
        for entry in self.entries:
            if (entry.model, entry.task) not in seen:
                seen.append((entry.model, entry.task))
        return seen


def _fail(where: str, message: str) -> ValueError:
    return ValueError(f"{where}: {message}")


def _check_keys(where: str, table: Mapping[str, Any], allowed: set) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise _fail(where, f"unknown key(s) {unknown}; allowed: {sorted(allowed)}")


def _int_or_none(where: str, table: Mapping[str, Any], key: str, default: Optional[int] = None,
                 minimum: int = 1) -> Optional[int]:
    value = table.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _fail(where, f"{key} must be an integer >= {minimum}, got {value!r}")
    return value


def _str_list(where: str, value: Any, key: str) -> List[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise _fail(where, f"{key} must be a non-empty list of strings, got {value!r}")
    return list(value)


def _encoders(where: str, value: Any) -> List[str]:
    try:
        return resolve_encoders(_str_list(where, value, "encoders"))
    except ValueError as exc:
        if str(exc).startswith(where):
            raise
        raise _fail(where, str(exc)) from None


def _budgets(where: str, table: Any, encoders: Sequence[str]) -> Dict[str, int]:
    if not isinstance(table, Mapping):
        raise _fail(where, f"trials must be a table of encoder = count, got {table!r}")
    _check_keys(where + " [trials]", table, set(resolve_encoders("all")) | {"default"})
    out = {}
    for encoder in encoders:
        value = table.get(encoder, table.get("default"))
        if value is None:
            raise _fail(where, f"no trial budget for encoder {encoder!r}; add `{encoder} = N` or `default = N` "
                        "under [trials]")
        out[encoder] = _int_or_none(where + " [trials]", {encoder: value}, encoder, minimum=0)
    return out


def _check_task_name(where: str, task: str) -> None:
    from .tasks import TaskError, get_task_spec

    try:
        get_task_spec(task)
    except TaskError as exc:
        if not Path(task).exists():
            raise _fail(where, str(exc)) from None


def load_sweep(path: PathLike) -> Sweep:
    """Parse and check a grid file; every error names the file and the key."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"sweep file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path} is not valid TOML: {exc}") from exc
    where = str(path)
    _check_keys(where, raw, _TOP_KEYS)

    models = _str_list(where, raw.get("models"), "models")
    encoders = _encoders(where, raw.get("encoders", ["all"]))
    sampler = raw.get("sampler", "tpe")
    if sampler not in SAMPLERS:
        raise _fail(where, f"sampler must be one of {list(SAMPLERS)}, got {sampler!r}")
    pruner = raw.get("pruner", "median")
    if pruner not in PRUNERS:
        raise _fail(where, f"pruner must be one of {list(PRUNERS)}, got {pruner!r}")
    storage = raw.get("storage")
    if storage is not None and (not isinstance(storage, str) or "://" not in storage):
        raise _fail(where, f"storage must be a database URL such as sqlite:///studies/x.db, got {storage!r}")
    timeout = raw.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise _fail(where, f"timeout must be a positive number of seconds, got {timeout!r}")
    budgets = _budgets(where, raw.get("trials", {}), encoders)

    tasks = raw.get("tasks")
    if not isinstance(tasks, Mapping) or not tasks:
        raise _fail(where, "no tasks; add one [tasks.<name>] table per task")
    entries: List[SweepEntry] = []
    for task, options in tasks.items():
        task_where = f"{where} [tasks.{task}]"
        if not isinstance(options, Mapping):
            raise _fail(task_where, "must be a table")
        _check_keys(task_where, options, _TASK_KEYS)
        _check_task_name(task_where, task)
        task_encoders = _encoders(task_where, options["encoders"]) if "encoders" in options else encoders
        task_budgets = dict(budgets)
        if "trials" in options:
            task_budgets.update(_budgets(task_where, {**raw.get("trials", {}), **options["trials"]}, task_encoders))
        elif "encoders" in options:
            task_budgets = _budgets(task_where, raw.get("trials", {}), task_encoders)
        zero_shot = tuple(_str_list(task_where, options["zero_shot"], "zero_shot")) if "zero_shot" in options else ()
        for name in zero_shot:
            _check_task_name(task_where, name)
        common = dict(
            max_train=_int_or_none(task_where, options, "max_train", raw.get("max_train")),
            max_eval=_int_or_none(task_where, options, "max_eval", raw.get("max_eval")),
            shots=_int_or_none(task_where, options, "shots", raw.get("shots")),
            max_epochs=_int_or_none(task_where, options, "max_epochs", raw.get("max_epochs")),
            zero_shot=zero_shot,
        )
        for model in models:
            for encoder in task_encoders:
                entries.append(SweepEntry(model=model, task=task, encoder=encoder, n_trials=task_budgets[encoder],
                                          **common))
    return Sweep(
        name=str(raw.get("name", path.stem)),
        storage=storage,
        entries=entries,
        sampler=sampler,
        pruner=pruner,
        seed=_int_or_none(where, raw, "seed", 0, minimum=0),
        final_seeds=_int_or_none(where, raw, "final_seeds", 3, minimum=0),
        workers=_int_or_none(where, raw, "workers", 1),
        threads=_int_or_none(where, raw, "threads"),
        timeout=timeout,
        path=path,
        raw=raw,
    )


def _status(storage: Any, entry: SweepEntry, final_seeds: int) -> Dict[str, Any]:
    """How far one entry's study is: finished trials and whether its final scores exist."""
    import optuna

    from .study import finished_trial_count

    try:
        study = optuna.load_study(study_name=entry.study_name, storage=storage)
    except KeyError:
        return {"finished": 0, "final": False}
    finished = finished_trial_count(study)
    if final_seeds == 0:
        return {"finished": finished, "final": True}
    if not _has_complete(study):
        return {"finished": finished, "final": False}
    attrs = study.user_attrs
    final = ("final_test_mean" in attrs and attrs.get("final_trial") == study.best_trial.number
             and len(attrs.get("final_seeds", [])) == final_seeds)
    return {"finished": finished, "final": final}


def _has_complete(study: Any) -> bool:
    from optuna.trial import TrialState

    return bool(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))


def plan_sweep(sweep: Union[Sweep, PathLike], storage: Optional[str] = None) -> "Any":
    """One row per study: its name, budget, finished trials, trials still to run and
    whether its final evaluation is done (a ``pandas.DataFrame``)."""
    import pandas as pd

    from .settings import default_storage_url
    from .study import make_storage

    if not isinstance(sweep, Sweep):
        sweep = load_sweep(sweep)
    rdb = make_storage(storage or sweep.storage or default_storage_url(), heartbeat_interval=None)
    rows = []
    for entry in sweep.entries:
        status = _status(rdb, entry, sweep.final_seeds)
        rows.append({"study": entry.study_name, "model": entry.model, "task": entry.task, "encoder": entry.encoder,
                     "budget": entry.n_trials, "finished": status["finished"],
                     "to_run": max(0, entry.n_trials - status["finished"]), "final_done": status["final"]})
    return pd.DataFrame(rows, columns=["study", "model", "task", "encoder", "budget", "finished", "to_run",
                                       "final_done"])


def run_sweep(sweep: Union[Sweep, PathLike], *, storage: Optional[str] = None, workers: Optional[int] = None,
              threads: Optional[int] = None, models: Sequence[str] = (), tasks: Sequence[str] = (), encoders: Sequence[str] = (),
              data_dir: Optional[PathLike] = None, cache_dir: Optional[PathLike] = None, device: str = "auto",
              artifact_dir: Optional[PathLike] = None, show_progress: bool = True) -> List[StudyResult]:
    """Run every study of a grid up to its budget, then its final evaluation.

    Args:
        sweep: a :class:`Sweep` or the path of a grid file.
        storage: overrides the file's ``storage`` (default ``sqlite:///studies/ilge.db``).
        workers, threads: override the file's ``workers`` and ``threads``.
        models, tasks, encoders: run only these parts of the grid (empty: all).
        data_dir, cache_dir, device, artifact_dir, show_progress: as in :func:`run_study`.

    Returns:
        One :class:`StudyResult` per study run (skipped finished studies included).
    """
    import logging

    from .settings import default_storage_url
    from .study import make_storage, run_study, study_result

    if not isinstance(sweep, Sweep):
        sweep = load_sweep(sweep)
    storage_url = storage or sweep.storage or default_storage_url()
    wanted_encoders = set(resolve_encoders(list(encoders))) if encoders else None
    entries = [e for e in sweep.entries
               if (not models or e.model in models) and (not tasks or e.task in tasks)
               and (wanted_encoders is None or e.encoder in wanted_encoders)]
    if not entries:
        raise ValueError("no study of the sweep matches the given --model/--task/--encoder filters")
    rdb = make_storage(storage_url, heartbeat_interval=None)
    log = logging.getLogger(__name__)
    results: List[StudyResult] = []
    groups: Dict[Tuple, List[SweepEntry]] = {}
    for entry in entries:  # one run_study call per (model, task, data options)
        key = (entry.model, entry.task, entry.max_train, entry.max_eval, entry.shots, entry.max_epochs,
               entry.zero_shot)
        groups.setdefault(key, []).append(entry)
    for number, (key, group) in enumerate(groups.items(), 1):
        first = group[0]
        remaining: Dict[str, int] = {}
        for entry in group:
            status = _status(rdb, entry, sweep.final_seeds)
            if status["finished"] >= entry.n_trials and status["final"]:
                continue
            remaining[entry.encoder] = max(0, entry.n_trials - status["finished"])
        log.info("[%d/%d] %s / %s: %s", number, len(groups), first.model, first.task,
                 ", ".join(f"{e}+{n}" for e, n in remaining.items()) or "done")
        if remaining:
            run_study(first.model, first.task, list(remaining), n_trials=remaining, storage=storage_url,
                      sampler=sweep.sampler, pruner=sweep.pruner, seed=sweep.seed,
                      workers=workers or sweep.workers, final_seeds=sweep.final_seeds, shots=first.shots,
                      max_train=first.max_train, max_eval=first.max_eval, max_epochs=first.max_epochs,
                      zero_shot_tasks=first.zero_shot, timeout=sweep.timeout, threads=threads or sweep.threads,
                      data_dir=data_dir, cache_dir=cache_dir, device=device, artifact_dir=artifact_dir,
                      show_progress=show_progress)
        import optuna

        for entry in group:
            results.append(study_result(optuna.load_study(study_name=entry.study_name, storage=rdb), storage_url))
    return results
