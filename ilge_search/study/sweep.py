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
    cv = 5                             # score trials on 5 folds of train (per task too); names get :cv5
    shots = [8, 16, 32, 64, "full"]    # one study per value (per task too); "full": no few-shot draw
    select = "one-se"                  # best | one-se: the trial the final evaluation retrains
    objectives = ["score", "params"]   # a multi-objective study per entry (names get :obj-params); or a
                                       # table per encoder: {default = ["score", "params"], last-layer = ["score"]}
    final_front = 5                    # front trials a multi-objective study's final evaluation retrains
    ensemble = 3                       # after the final evaluation, an ensemble of up to 3 trials (0: off)
    protocol = ["matched", "paper"]    # how final scores are measured (per task too); a list runs each;
                                       # paper studies are named :paper (see ilge_search.study.protocol)
    samples_per_label = 8              # the paper protocol's examples per label (per task too)
    warm_start = 4                     # ILGE families' studies enqueue 4 portfolio members after their start
                                       # (per task too; names get :warm4; baselines have no portfolio)
    data_seed = 0                      # seed of the few-shot and subsampling draws (per task too; not 0:
                                       # names get :dataseed1)
    word_pooling = "mean"              # tagging tasks: first | mean piece per word (per task too; names get
                                       # :mean-words; other tasks pool no words)

    [trials]                           # target number of finished trials per study
    default = 20
    best-layer = 5

    [tasks.banking77]                  # one table per task, may be empty
    max_train = 3000
    [tasks.stsb]
    zero_shot = ["sick_r"]             # evaluated with the STS-B encoder
    [tasks.trec]
    objectives = ["score", "latency"]  # per task too (a list, or a table per encoder)

Every study option that is part of a study's identity (:data:`~ilge_search.study.options.IDENTITY_OPTIONS`) can
be set at the top of a grid and per task; the others a grid sets (``sampler``, ``select``, ``workers`` ...:
:data:`~ilge_search.study.options.GRID_OPTIONS`, the fields marked ``grid``) only at the top.

``shots`` is one count of training examples per label, or a list of them
(``"full"`` in a list: the study without a few-shot draw, on the task's
``max_train`` cap): each value is a study of its own, named with its shots
(``minilm-l6:trec:cayley:8shot:train500``), so a list draws a few-shot curve.

Budgets are totals, not increments: a study that already holds its budget of
complete + pruned trials gets none more, so rerunning a sweep resumes it and
rerunning a finished sweep does nothing. Each (model, task) pair is one
:func:`~ilge_search.study.run_study` call, so its embeddings load once for all
encoders; its :class:`~ilge_search.study.StudyOptions` are the grid's, with the
pair's data options and budgets replaced.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..encoders.configs import ENCODER_FAMILIES
from ..files import read_text_utf8
from ..record import WORD_POOLINGS
from ..settings import default_storage_url
from ..storage import Storage, finished_trial_count, open_storage
from ..validation import check_int
from .auto import is_auto, parse_methods
from .final import final_is_current
from .folds import check_cv
from .identity import ENCODER_CHOICES, default_study_name, is_registered_task, resolve_encoders, task_label
from .objectives import DEFAULT_OBJECTIVES, check_objectives
from .options import GRID_OPTIONS, IDENTITY_OPTIONS, StudyOptions, option_default, option_flag
from .plan import missing_sqlite_file
from .protocol import DEFAULT_PROTOCOL, PROTOCOLS
from .results import StudyResult, study_result
from .runner import run_study

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = [
    "GRID_KEYS",
    "TASK_KEYS",
    "SweepOverrides",
    "SweepFilter",
    "SweepEntry",
    "Sweep",
    "load_sweep",
    "with_overrides",
    "with_protocol",
    "plan_sweep",
    "estimate_sweep",
    "SweepRuntime",
    "run_sweep",
]

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike

# a grid's keys at its top level: what the sweep is, every identity option and the other shared study options;
# per task: the identity options and the task's own encoders, budgets and zero-shot tasks
GRID_KEYS = frozenset({"name", "storage", "models", "encoders", "trials", "tasks", *GRID_OPTIONS, *IDENTITY_OPTIONS})
TASK_KEYS = frozenset({"zero_shot", "encoders", "trials", *IDENTITY_OPTIONS})


@dataclass(frozen=True)
class SweepEntry:
    """One study of a sweep: what to search and its trial budget."""

    model: str
    task: str
    encoder: str
    n_trials: int
    max_train: int | None = None
    max_eval: int | None = None
    shots: int | None = None
    max_epochs: int | None = None
    zero_shot: tuple[str, ...] = ()
    cv: int | None = None
    objectives: tuple[str, ...] = DEFAULT_OBJECTIVES
    protocol: str = DEFAULT_PROTOCOL
    samples_per_label: int | None = None
    data_seed: int = 0
    word_pooling: str = "first"  # tagging tasks only; what other tasks' studies record is no word pooling
    warm_start: int = 0  # ILGE families only: baselines have no portfolio
    methods: tuple[str, ...] | None = None  # the auto encoder's methods (None: every method serving the task)

    @property
    def study_name(self) -> str:
        """The name :func:`~ilge_search.study.run_study` gives this study (a custom task file or folder is
        read to name it by its content, as the runner does)."""
        task = self.task
        if is_registered_task(task):
            from ..tasks.core import get_task_spec

            tagging = get_task_spec(task).kind == "tagging"
        else:
            from ..tasks.core import load_task

            loaded = load_task(task)
            task, tagging = task_label(task, loaded), loaded.kind == "tagging"
        identity = self.identity_options() | {"word_pooling": self.word_pooling if tagging else None}
        return default_study_name(self.model, task, self.encoder, **identity)

    def identity_options(self) -> dict[str, Any]:
        """This entry's identity options (:data:`IDENTITY_OPTIONS`: data, budget, objectives, protocol, data
        seed, word pooling, warm start), by their flat names."""
        return {name: getattr(self, name) for name in IDENTITY_OPTIONS}

    def group_key(self) -> tuple:
        """Entries with the same key share one ``run_study`` call (the same data and study options)."""
        return (self.model, self.task, self.zero_shot, *self.identity_options().values())

    def options(self, base: StudyOptions, n_trials: Any) -> StudyOptions:
        """``base`` with this entry's identity options, zero-shot tasks and ``n_trials``."""
        return base.replace(n_trials=n_trials, zero_shot_tasks=self.zero_shot, **self.identity_options())


@dataclass
class Sweep:
    """A parsed grid file: shared study options plus one entry per study.

    Attributes:
        shared: the study options the grid sets for every study (:data:`GRID_OPTIONS`, flat names), as given;
            ``sweep.<name>`` reads one, else its default.
    """

    name: str
    storage: str | None
    entries: list[SweepEntry]
    shared: dict[str, Any] = dataclasses.field(default_factory=dict)
    path: Path | None = None

    def __getattr__(self, name: str) -> Any:
        if name in GRID_OPTIONS:
            return self.shared.get(name, option_default(name))
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def pairs(self) -> list[tuple[str, str]]:
        """(model, task) pairs in file order; each is one ``run_study`` call."""
        seen: list[tuple[str, str]] = []
        for entry in self.entries:
            if (entry.model, entry.task) not in seen:
                seen.append((entry.model, entry.task))
        return seen

    def study_options(self, **changes: Any) -> StudyOptions:
        """The grid's shared :class:`StudyOptions` (validated), with ``changes`` applied."""
        return StudyOptions.from_flat(**{**self.shared, **changes})


def _fail(where: str, message: str) -> ValueError:
    return ValueError(f"{where}: {message}")


def _check_keys(where: str, table: Mapping[str, Any], allowed: AbstractSet[str]) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise _fail(where, f"unknown key(s) {unknown}; allowed: {sorted(allowed)}")


def _int_or_none(
    where: str, table: Mapping[str, Any], key: str, default: int | None = None, minimum: int = 1
) -> int | None:
    value = table.get(key, default)
    if value is None:
        return None
    try:
        return check_int(key, value, minimum=minimum)
    except ValueError as exc:
        raise _fail(where, str(exc)) from None


def _task_count(where: str, options: Mapping[str, Any], raw: Mapping[str, Any], key: str) -> int | None:
    """The count option ``key`` of a task: its own, else the grid's, else the option's default; at least the
    minimum of the option's flag."""
    minimum = option_flag(key).minimum
    return _int_or_none(where, options, key, raw.get(key, option_default(key)), minimum=int(minimum or 0))


def _str_list(where: str, value: Any, key: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise _fail(where, f"{key} must be a non-empty list of strings, got {value!r}")
    return list(value)


def _encoders(where: str, value: Any) -> list[str]:
    try:
        return resolve_encoders(_str_list(where, value, "encoders"))
    except ValueError as exc:
        if str(exc).startswith(where):
            raise
        raise _fail(where, str(exc)) from None


def _budgets(where: str, table: Any, encoders: Sequence[str]) -> dict[str, int]:
    if not isinstance(table, Mapping):
        raise _fail(where, f"trials must be a table of encoder = count, got {table!r}")
    _check_keys(where + " [trials]", table, set(ENCODER_CHOICES) | {"default"})
    out = {}
    for encoder in encoders:
        value = table.get(encoder, table.get("default"))
        if value is None:
            raise _fail(
                where, f"no trial budget for encoder {encoder!r}; add `{encoder} = N` or `default = N` under [trials]"
            )
        try:
            out[encoder] = check_int(encoder, value, minimum=0)
        except ValueError as exc:
            raise _fail(where + " [trials]", str(exc)) from None
    return out


def _objectives(
    where: str, value: Any, encoders: Sequence[str], inherited: Mapping[str, tuple[str, ...]] | None = None
) -> dict[str, tuple[str, ...]]:
    """Objectives per encoder from ``objectives = [...]`` (every encoder) or a table of encoder = [...] with an
    optional ``default`` (encoders it does not name keep ``inherited``, else score alone)."""
    base = {encoder: (inherited or {}).get(encoder, DEFAULT_OBJECTIVES) for encoder in encoders}
    if value is None:
        return base
    try:
        if isinstance(value, Mapping):
            _check_keys(where + " objectives", value, set(ENCODER_CHOICES) | {"default"})
            default = check_objectives(value["default"]) if "default" in value else None
            return {
                encoder: check_objectives(value[encoder])
                if encoder in value
                else default
                if default is not None
                else base[encoder]
                for encoder in encoders
            }
        shared = check_objectives(_str_list(where, value, "objectives"))
    except ValueError as exc:
        if str(exc).startswith(where):
            raise
        raise _fail(where, str(exc)) from None
    return {encoder: shared for encoder in encoders}


def _protocols(where: str, value: Any) -> list[str]:
    """A grid's ``protocol``: one name or a list of them (each gets its own studies)."""
    names = _str_list(where, value, "protocol")
    unknown = [name for name in names if name not in PROTOCOLS]
    if unknown:
        raise _fail(where, f"unknown protocol {unknown[0]!r}; expected one of {list(PROTOCOLS)} or a list of them")
    return list(dict.fromkeys(names))


def _check_task_name(where: str, task: str) -> None:
    from ..tasks.core import TaskError, get_task_spec

    try:
        get_task_spec(task)
    except TaskError as exc:
        if not Path(task).exists():
            raise _fail(where, str(exc)) from None


FULL_SHOTS = "full"  # in a shots list: the study on the whole (capped) training split


def _shots(where: str, task: str, options: Mapping[str, Any], raw: Mapping[str, Any]) -> list[int | None]:
    """The task's shots per label as a list, one study each (``None``: no few-shot draw)."""
    value = options.get("shots", raw.get("shots"))
    if value is None:
        return [None]
    values = value if isinstance(value, list) else [value]
    if not values:
        raise _fail(where, 'shots must be a count, or a non-empty list of counts and "full"')
    out: list[int | None] = []
    for item in values:
        if item == FULL_SHOTS and isinstance(value, list):
            shots = None
        elif isinstance(item, bool) or not isinstance(item, int):
            raise _fail(where, f'shots must be a count >= 1, or a list of counts and "full", got {value!r}')
        else:
            shots = _int_or_none(where, {"shots": item}, "shots")
        if shots in out:
            raise _fail(where, f"shots lists {item!r} twice")
        out.append(shots)
    if any(s is not None for s in out) and is_registered_task(task):
        from ..tasks.core import get_task_spec

        if get_task_spec(task).kind != "classification":
            raise _fail(where, f"shots needs a classification task; {task!r} is {get_task_spec(task).kind}")
    return out


def _methods(where: str, value: Any) -> tuple[str, ...] | None:
    """The grid's (or the task's) ``methods`` for its auto studies: a list of method names, or none."""
    if value is None:
        return None
    try:
        return parse_methods(_str_list(where, value, "methods"))
    except ValueError as exc:
        raise _fail(where, str(exc)) from None


def _word_pooling(where: str, task: str, options: Mapping[str, Any], raw: Mapping[str, Any]) -> str:
    """The task's ``word_pooling``: its own, else the grid's. A registered task that is not a tagging task pools
    no words: its own ``word_pooling`` other than ``first`` is refused, the grid's does not apply to it."""
    value = options.get("word_pooling", raw.get("word_pooling", option_default("word_pooling")))
    if value not in WORD_POOLINGS:
        raise _fail(where, f"word_pooling must be one of {list(WORD_POOLINGS)}, got {value!r}")
    if is_registered_task(task):
        from ..tasks.core import get_task_spec

        kind = get_task_spec(task).kind
        if kind != "tagging":
            if options.get("word_pooling", "first") != "first":
                raise _fail(where, f"word_pooling applies to tagging tasks (sentences of words); {task!r} is {kind}")
            return "first"
    return str(value)


def _entries(where: str, raw: Mapping[str, Any], models: list[str], encoders: list[str]) -> list[SweepEntry]:
    """One entry per model x task x encoder, with each task's options, budgets and objectives."""
    budgets = _budgets(where, raw.get("trials", {}), encoders)
    all_encoders = list(ENCODER_CHOICES)
    grid_objectives = _objectives(where, raw.get("objectives"), all_encoders)
    tasks = raw.get("tasks")
    if not isinstance(tasks, Mapping) or not tasks:
        raise _fail(where, "no tasks; add one [tasks.<name>] table per task")
    entries: list[SweepEntry] = []
    for task, options in tasks.items():
        task_where = f"{where} [tasks.{task}]"
        if not isinstance(options, Mapping):
            raise _fail(task_where, "must be a table")
        _check_keys(task_where, options, TASK_KEYS)
        _check_task_name(task_where, task)
        task_encoders, task_budgets = _task_budgets(task_where, raw, options, encoders, budgets)
        zero_shot = tuple(_str_list(task_where, options["zero_shot"], "zero_shot")) if "zero_shot" in options else ()
        for name in zero_shot:
            _check_task_name(task_where, name)
        objectives = _objectives(task_where, options.get("objectives"), all_encoders, grid_objectives)
        common: dict[str, Any] = dict(
            max_train=_task_count(task_where, options, raw, "max_train"),
            max_eval=_task_count(task_where, options, raw, "max_eval"),
            max_epochs=_task_count(task_where, options, raw, "max_epochs"),
            cv=_task_count(task_where, options, raw, "cv"),
            zero_shot=zero_shot,
        )
        protocols = _protocols(task_where, options.get("protocol", raw.get("protocol", DEFAULT_PROTOCOL)))
        samples_per_label = _task_count(task_where, options, raw, "samples_per_label")
        if samples_per_label is not None and protocols == ["matched"]:
            raise _fail(
                task_where, 'samples_per_label sets the paper protocol\'s readout; add protocol = "paper" or drop it'
            )
        shot_values = _shots(task_where, task, options, raw)
        common["data_seed"] = _int_or_none(task_where, options, "data_seed", raw.get("data_seed", 0), minimum=0)
        common["word_pooling"] = _word_pooling(task_where, task, options, raw)
        warm_start = _task_count(task_where, options, raw, "warm_start") or 0
        methods = _methods(task_where, options.get("methods", raw.get("methods")))
        # nested in this order (protocol, model, shots, encoder): the order of the grid's studies
        entries += [
            SweepEntry(
                model=model,
                task=task,
                encoder=encoder,
                n_trials=task_budgets[encoder],
                shots=shots,
                objectives=objectives[encoder],
                protocol=protocol,
                samples_per_label=samples_per_label if protocol == "paper" else None,
                warm_start=warm_start if encoder in ENCODER_FAMILIES else 0,
                methods=methods if is_auto(encoder) else None,
                **common,
            )
            for protocol, model, shots, encoder in itertools.product(protocols, models, shot_values, task_encoders)
        ]
    return entries


def _task_budgets(
    where: str, raw: Mapping[str, Any], options: Mapping[str, Any], encoders: list[str], budgets: dict[str, int]
) -> tuple[list[str], dict[str, int]]:
    """A task's encoders and their budgets: its own ``encoders`` and ``trials`` over the grid's."""
    task_encoders = _encoders(where, options["encoders"]) if "encoders" in options else encoders
    task_budgets = dict(budgets)
    if "trials" in options:
        task_budgets.update(_budgets(where, {**raw.get("trials", {}), **options["trials"]}, task_encoders))
    elif "encoders" in options:
        task_budgets = _budgets(where, raw.get("trials", {}), task_encoders)
    return task_encoders, task_budgets


def load_sweep(path: PathLike) -> Sweep:
    """Parse and check a grid file; every error names the file and the key."""
    path = Path(path)
    try:
        raw = tomllib.loads(read_text_utf8(path))  # bytes that are not UTF-8: the error names the line
    except FileNotFoundError:
        raise ValueError(f"sweep file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path} is not valid TOML: {exc}") from exc
    where = str(path)
    _check_keys(where, raw, GRID_KEYS)

    models = _str_list(where, raw.get("models"), "models")
    encoders = _encoders(where, raw.get("encoders", ["all"]))
    sweep = Sweep(
        name=str(raw.get("name", path.stem)),
        storage=raw.get("storage"),
        entries=[],
        shared={key: raw[key] for key in GRID_OPTIONS if key in raw},
        path=path,
    )
    try:
        sweep.study_options()  # the shared options are checked once, by StudyOptions
    except ValueError as exc:
        raise _fail(where, str(exc)) from None
    if sweep.storage is not None and (not isinstance(sweep.storage, str) or "://" not in sweep.storage):
        raise _fail(where, f"storage must be a database URL such as sqlite:///studies/x.db, got {sweep.storage!r}")
    sweep.entries = _entries(where, raw, models, encoders)
    return sweep


def with_protocol(sweep: Sweep, protocol: str | None = None, samples_per_label: int | None = None) -> Sweep:
    """``sweep`` with every study under ``protocol`` (overriding the grid's; studies the grid lists under
    several protocols become one each) and the paper studies' ``samples_per_label``; unchanged when both are None.

    Raises:
        ValueError: an unknown protocol, or ``samples_per_label`` without a paper study to apply to.
    """
    from .protocol import check_protocol

    entries = list(sweep.entries)
    if protocol is not None:
        check_protocol(protocol)
        entries = list(
            dict.fromkeys(dataclasses.replace(e, protocol=protocol, samples_per_label=None) for e in entries)
        )
    if samples_per_label is not None:
        check_int("samples_per_label", samples_per_label)
        if not any(e.protocol == "paper" for e in entries):
            raise ValueError(
                "samples_per_label sets the paper protocol's readout and this sweep has no paper "
                "study; add --protocol paper"
            )
        entries = [
            dataclasses.replace(e, samples_per_label=samples_per_label) if e.protocol == "paper" else e for e in entries
        ]
    return dataclasses.replace(sweep, entries=entries)


@dataclass(frozen=True)
class SweepOverrides:
    """What the command line changes in a grid: ``cv``, ``protocol`` and ``samples_per_label`` change every
    study's identity (and name); ``select``, ``workers`` and ``threads`` only how it runs and is evaluated.
    ``None`` keeps the grid's value."""

    cv: int | None = None
    protocol: str | None = None
    samples_per_label: int | None = None
    select: str | None = None
    workers: int | None = None
    threads: int | None = None

    def run_options(self) -> dict[str, Any]:
        """The flat study options these overrides set (those that do not rename a study)."""
        pairs = (("workers", self.workers), ("threads", self.threads), ("select", self.select))
        return {key: value for key, value in pairs if value}


@dataclass(frozen=True)
class SweepFilter:
    """Which part of a grid to run: only these models, tasks and encoders (empty: all)."""

    models: Sequence[str] = ()
    tasks: Sequence[str] = ()
    encoders: Sequence[str] = ()

    def entries(self, sweep: Sweep) -> list[SweepEntry]:
        """The grid's entries this filter keeps, in file order."""
        wanted = set(resolve_encoders(list(self.encoders))) if self.encoders else None
        return [
            e
            for e in sweep.entries
            if (not self.models or e.model in self.models)
            and (not self.tasks or e.task in self.tasks)
            and (wanted is None or e.encoder in wanted)
        ]


def with_overrides(sweep: Sweep, overrides: SweepOverrides | None) -> Sweep:
    """``sweep`` with the command line's overrides of what names its studies: every study's ``cv``, then
    :func:`with_protocol`. ``run``, ``plan`` and ``estimate`` all go through it, so a dry run names the studies
    the run would."""
    if overrides is None:
        return sweep
    if overrides.cv is not None:
        check_cv(overrides.cv)
        sweep = dataclasses.replace(sweep, entries=[dataclasses.replace(e, cv=overrides.cv) for e in sweep.entries])
    return with_protocol(sweep, overrides.protocol, overrides.samples_per_label)


def _prepared(sweep: Sweep | PathLike, overrides: SweepOverrides | None) -> Sweep:
    return with_overrides(sweep if isinstance(sweep, Sweep) else load_sweep(sweep), overrides)


def _status(storage: Storage, entry: SweepEntry, options: StudyOptions) -> tuple[Any | None, int, bool]:
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


def plan_sweep(sweep: Sweep | PathLike, storage: str | None = None, *, overrides: SweepOverrides | None = None) -> Any:
    """One row per study: its name, protocol, budget, finished trials, trials still to run and
    whether its final evaluation (under the overrides' ``select``, else the grid's rule) is done (a
    ``pandas.DataFrame``)."""
    import pandas as pd

    sweep = _prepared(sweep, overrides)
    options = sweep.study_options(**(overrides.run_options() if overrides else {}))
    url = storage if storage is not None else sweep.storage
    # only read: a SQLite file that does not exist yet holds no study, and is not created
    opened = None if missing_sqlite_file(url or default_storage_url()) else open_storage(url, must_exist=True)
    rows = []
    for entry in sweep.entries:
        _, finished, final = _status(opened, entry, options) if opened is not None else (None, 0, False)
        rows.append(
            {
                "study": entry.study_name,
                "model": entry.model,
                "task": entry.task,
                "encoder": entry.encoder,
                "protocol": entry.protocol,
                "budget": entry.n_trials,
                "finished": finished,
                "to_run": max(0, entry.n_trials - finished),
                "final_done": final,
            }
        )
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
) -> list[Any]:
    """The :class:`~ilge_search.study.plan.RunPlan` of each ``run_study`` call the sweep would make (a dry
    run: nothing is created or written), with the trials each study still needs to reach its budget.
    Arguments as in :func:`run_sweep`."""
    from .plan import plan_run

    sweep = _prepared(sweep, overrides)
    options = sweep.study_options(
        data_dir=data_dir,
        cache_dir=cache_dir,
        device=device,
        progress=False,
        **(overrides.run_options() if overrides else {}),
    )
    url = storage if storage is not None else sweep.storage
    groups: dict[tuple, list[SweepEntry]] = {}
    for entry in (only or SweepFilter()).entries(sweep):
        groups.setdefault(entry.group_key(), []).append(entry)
    plans = []
    for group in groups.values():
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
    opened = open_storage(
        storage if storage is not None else sweep.storage,
        artifact_dir=options.runtime.artifact_dir,
        heartbeat_interval=options.runtime.heartbeat_interval,
        grace_period=options.runtime.grace_period,
        max_retry=options.runtime.max_retry,
    )
    groups: dict[tuple, list[SweepEntry]] = {}
    for entry in entries:  # one run_study call per (model, task, data, objective and protocol options)
        groups.setdefault(entry.group_key(), []).append(entry)
    results: list[StudyResult] = []
    for number, group in enumerate(groups.values(), 1):
        remaining, done = _remaining(opened, group, options)
        logger.info("[%d/%d] %s", number, len(groups), _group_label(group, remaining))
        results += _run_group(opened, group, options, remaining, done)
    return results


def _remaining(
    opened: Storage, group: list[SweepEntry], options: StudyOptions
) -> tuple[dict[str, int], dict[str, Any]]:
    """The trials each encoder of a group still needs, and the studies already at their budget with
    current final scores (encoder -> its study)."""
    remaining: dict[str, int] = {}
    done: dict[str, Any] = {}
    for entry in group:
        study, finished, final = _status(opened, entry, options)
        if finished >= entry.n_trials and final:
            done[entry.encoder] = study
        else:
            remaining[entry.encoder] = max(0, entry.n_trials - finished)
    return remaining, done


def _group_label(group: list[SweepEntry], remaining: Mapping[str, int]) -> str:
    first = group[0]
    left = ", ".join(f"{e}+{n}" for e, n in remaining.items()) or "done"
    return f"{first.model} / {first.task} ({first.protocol} protocol): {left}"


def _run_group(
    opened: Storage,
    group: list[SweepEntry],
    options: StudyOptions,
    remaining: dict[str, int],
    done: Mapping[str, Any],
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
