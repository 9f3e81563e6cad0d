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
import os
import sys
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..encoders import encoder_families
from ..files import read_text_utf8
from ..record import WORD_POOLINGS, Identity
from ..tasks.core import TaskError, get_task_spec, load_task
from ..validation import check_int
from .auto import auto_methods, is_auto, parse_methods
from .folds import check_cv
from .identity import default_study_name, encoder_choices, is_registered_task, resolve_encoders, task_label
from .objectives import DEFAULT_OBJECTIVES, check_objectives
from .options import GRID_OPTIONS, IDENTITY_OPTIONS, StudyOptions, TrialCount, option_default, option_flag
from .protocol import DEFAULT_PROTOCOL, PROTOCOLS, check_protocol

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
]

PathLike = str | os.PathLike

# a grid's keys at its top level: what the sweep is, every identity option and the other shared study options;
# per task: the identity options and the task's own encoders, budgets and zero-shot tasks
GRID_KEYS = frozenset({"name", "storage", "models", "encoders", "trials", "tasks", *GRID_OPTIONS, *IDENTITY_OPTIONS})
TASK_KEYS = frozenset({"zero_shot", "encoders", "trials", *IDENTITY_OPTIONS})


@dataclass(frozen=True, kw_only=True)
class SweepEntry(Identity):
    """One study of a sweep: its identity (``task`` as the grid names it), trial budget and zero-shot tasks."""

    n_trials: int
    zero_shot: tuple[str, ...] = ()
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
            tagging = get_task_spec(task).kind == "tagging"
        else:
            loaded = load_task(task)
            task, tagging = task_label(task, loaded), loaded.kind == "tagging"
        identity = self.identity_options() | {"word_pooling": self.word_pooling if tagging else None}
        return default_study_name(self.model, task, self.encoder, **identity)

    def identity_options(self) -> dict[str, object]:
        """This entry's identity options (:data:`IDENTITY_OPTIONS`: data, budget, objectives, protocol, data
        seed, word pooling, warm start), by their flat names."""
        return {name: getattr(self, name) for name in IDENTITY_OPTIONS}

    def group_key(self) -> tuple:
        """Entries with the same key share one ``run_study`` call (the same data and study options)."""
        return (self.model, self.task, self.zero_shot, *self.identity_options().values())

    def options(self, base: StudyOptions, n_trials: TrialCount) -> StudyOptions:
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
    shared: dict[str, object] = dataclasses.field(default_factory=dict)
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

    def study_options(self, **changes: object) -> StudyOptions:
        """The grid's shared :class:`StudyOptions` (validated), with ``changes`` applied."""
        return StudyOptions.from_flat(**{**self.shared, **changes})


def _fail(where: str, message: str) -> ValueError:
    return ValueError(f"{where}: {message}")


def _check_keys(where: str, table: Mapping[str, object], allowed: AbstractSet[str]) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise _fail(where, f"unknown key(s) {unknown}; allowed: {sorted(allowed)}")


def _int_or_none(
    where: str, table: Mapping[str, object], key: str, default: object = None, minimum: int = 1
) -> int | None:
    value = table.get(key, default)
    if value is None:
        return None
    try:
        return check_int(key, value, minimum=minimum)
    except ValueError as exc:
        raise _fail(where, str(exc)) from None


def _task_count(where: str, options: Mapping[str, object], raw: Mapping[str, object], key: str) -> int | None:
    """The count option ``key`` of a task: its own, else the grid's, else the option's default; at least the
    minimum of the option's flag."""
    minimum = option_flag(key).minimum
    return _int_or_none(where, options, key, raw.get(key, option_default(key)), minimum=int(minimum or 0))


def _str_list(where: str, value: object, key: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise _fail(where, f"{key} must be a non-empty list of strings, got {value!r}")
    return list(value)


def _encoders(where: str, value: object) -> list[str]:
    try:
        return resolve_encoders(_str_list(where, value, "encoders"))
    except ValueError as exc:
        if str(exc).startswith(where):
            raise
        raise _fail(where, str(exc)) from None


def _budgets(where: str, table: object, encoders: Sequence[str]) -> dict[str, int]:
    if not isinstance(table, Mapping):
        raise _fail(where, f"trials must be a table of encoder = count, got {table!r}")
    _check_keys(where + " [trials]", table, set(encoder_choices()) | {"default"})
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
    where: str, value: object, encoders: Sequence[str], inherited: Mapping[str, tuple[str, ...]] | None = None
) -> dict[str, tuple[str, ...]]:
    """Objectives per encoder from ``objectives = [...]`` (every encoder) or a table of encoder = [...] with an
    optional ``default`` (encoders it does not name keep ``inherited``, else score alone)."""
    base = {encoder: (inherited or {}).get(encoder, DEFAULT_OBJECTIVES) for encoder in encoders}
    if value is None:
        return base
    try:
        if isinstance(value, Mapping):
            _check_keys(where + " objectives", value, set(encoder_choices()) | {"default"})
            default = check_objectives(value["default"]) if "default" in value else None
            # a checked list is never empty: it holds the score
            return {e: check_objectives(value[e]) if e in value else default or base[e] for e in encoders}
        shared = check_objectives(_str_list(where, value, "objectives"))
    except ValueError as exc:
        if str(exc).startswith(where):
            raise
        raise _fail(where, str(exc)) from None
    return {encoder: shared for encoder in encoders}


def _protocols(where: str, value: object) -> list[str]:
    """A grid's ``protocol``: one name or a list of them (each gets its own studies)."""
    names = _str_list(where, value, "protocol")
    unknown = [name for name in names if name not in PROTOCOLS]
    if unknown:
        raise _fail(where, f"unknown protocol {unknown[0]!r}; expected one of {list(PROTOCOLS)} or a list of them")
    return list(dict.fromkeys(names))


def _check_task_name(where: str, task: str) -> None:

    try:
        get_task_spec(task)
    except TaskError as exc:
        if not Path(task).exists():
            raise _fail(where, str(exc)) from None


FULL_SHOTS = "full"  # in a shots list: the study on the whole (capped) training split


def _shots(where: str, task: str, options: Mapping[str, object], raw: Mapping[str, object]) -> list[int | None]:
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
    needs_labels = any(s is not None for s in out) and is_registered_task(task)
    if needs_labels and get_task_spec(task).kind != "classification":
        raise _fail(where, f"shots needs a classification task; {task!r} is {get_task_spec(task).kind}")
    return out


def _methods(where: str, value: Any, task: str) -> tuple[str, ...] | None:
    """The grid's (or the task's) ``methods`` for its auto studies: a list of method names, or none; each name
    checked here, against a registered task's kind, so a bad one is refused before anything is created."""
    if value is None:
        return None
    if isinstance(value, str) and "," in value:
        raise _fail(
            where, f'methods must be a list of method names, e.g. methods = ["cayley", "last-layer"], got {value!r}'
        )
    names = _str_list(where, value, "methods")
    kind = None
    if is_registered_task(task):
        kind = get_task_spec(task).kind
    try:
        return auto_methods(parse_methods(names), tagging=None if kind is None else kind == "tagging", key="methods")
    except ValueError as exc:
        raise _fail(where, str(exc)) from None


def _word_pooling(where: str, task: str, options: Mapping[str, object], raw: Mapping[str, object]) -> str:
    """The task's ``word_pooling``: its own, else the grid's. A registered task that is not a tagging task pools
    no words: its own ``word_pooling`` other than ``first`` is refused, the grid's does not apply to it."""
    value = options.get("word_pooling", raw.get("word_pooling", option_default("word_pooling")))
    if value not in WORD_POOLINGS:
        raise _fail(where, f"word_pooling must be one of {list(WORD_POOLINGS)}, got {value!r}")
    if is_registered_task(task):
        kind = get_task_spec(task).kind
        if kind != "tagging":
            if options.get("word_pooling", "first") != "first":
                raise _fail(where, f"word_pooling applies to tagging tasks (sentences of words); {task!r} is {kind}")
            return "first"
    return str(value)


def _common_options(where: str, task: str, options: Mapping[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
    """The options a task's studies share whatever their protocol, shots and encoder: its own, else the grid's."""
    zero_shot = tuple(_str_list(where, options["zero_shot"], "zero_shot")) if "zero_shot" in options else ()
    for name in zero_shot:
        _check_task_name(where, name)
    return dict(
        max_train=_task_count(where, options, raw, "max_train"),
        max_eval=_task_count(where, options, raw, "max_eval"),
        max_epochs=_task_count(where, options, raw, "max_epochs"),
        cv=_task_count(where, options, raw, "cv"),
        zero_shot=zero_shot,
        data_seed=_int_or_none(where, options, "data_seed", raw.get("data_seed", 0), minimum=0),
        word_pooling=_word_pooling(where, task, options, raw),
    )


def _entries(where: str, raw: Mapping[str, object], models: list[str], encoders: list[str]) -> list[SweepEntry]:
    """One entry per model x task x encoder, with each task's options, budgets and objectives."""
    budgets = _budgets(where, raw.get("trials", {}), encoders)
    all_encoders = list(encoder_choices())
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
        objectives = _objectives(task_where, options.get("objectives"), all_encoders, grid_objectives)
        common = _common_options(task_where, task, options, raw)
        protocols = _protocols(task_where, options.get("protocol", raw.get("protocol", DEFAULT_PROTOCOL)))
        samples_per_label = _task_count(task_where, options, raw, "samples_per_label")
        if samples_per_label is not None and protocols == ["matched"]:
            raise _fail(
                task_where, 'samples_per_label sets the paper protocol\'s readout; add protocol = "paper" or drop it'
            )
        shot_values = _shots(task_where, task, options, raw)
        warm_start = _task_count(task_where, options, raw, "warm_start") or 0
        methods_where = task_where if "methods" in options else where
        methods = _methods(methods_where, options.get("methods", raw.get("methods")), task)
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
                warm_start=warm_start if encoder in encoder_families() else 0,
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


# the study options (flat names) `sweep` sets over a grid's: these rename every study, these change how it runs
RENAMING_OVERRIDES = ("cv", "protocol", "samples_per_label")
RUN_OVERRIDES = ("select", "workers", "threads")


@dataclass(frozen=True, init=False)
class SweepOverrides:
    """What the command line changes in a grid: the options of :data:`RENAMING_OVERRIDES` and
    :data:`RUN_OVERRIDES`, by flat name; ``None`` keeps the grid's value."""

    values: Mapping[str, Any]

    def __init__(self, **values: Any) -> None:
        unknown = sorted(set(values) - {*RENAMING_OVERRIDES, *RUN_OVERRIDES})
        if unknown:
            raise TypeError(f"SweepOverrides takes {RENAMING_OVERRIDES + RUN_OVERRIDES}, not {unknown}")
        object.__setattr__(self, "values", {name: value for name, value in values.items() if value is not None})

    def run_options(self) -> dict[str, object]:
        """The flat study options these overrides set (those that do not rename a study)."""
        return {name: self.values[name] for name in RUN_OVERRIDES if self.values.get(name)}


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
    cv = overrides.values.get("cv")
    if cv is not None:
        check_cv(cv)
        sweep = dataclasses.replace(sweep, entries=[dataclasses.replace(e, cv=cv) for e in sweep.entries])
    return with_protocol(sweep, overrides.values.get("protocol"), overrides.values.get("samples_per_label"))
