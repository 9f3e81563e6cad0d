"""The options of a study run: four small groups, each field declared, checked and documented once.

:class:`StudyOptions` is what :func:`~ilge_search.study.run_study` takes besides
the model, the task, the encoders and the storage, as four objects:

- :class:`SearchOptions`: how trials are searched and for how long;
- :class:`DataOptions`: which data the trials train and are scored on;
- :class:`FinalOptions`: how the final evaluation retrains and scores the chosen trial;
- :class:`RuntimeOptions`: where and how the work runs.

Each field's ``help`` (its ``metadata``) is its only description: the class
docstrings list them and the CLI's option help reads them (:func:`option_help`).
Command lines and sweep grids name options flat (``--max-train``,
``final_seeds = 3``); :meth:`StudyOptions.from_flat` and
:meth:`StudyOptions.replace` route those names to their group
(:data:`FLAT_NAMES`). Every group is frozen and picklable (worker processes get it).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..record import DEFAULT_PROTOCOL, IDENTITY_KEYS, PROTOCOLS, WORD_POOLINGS
from ..tuning import PRUNERS, SAMPLERS
from ..validation import check_choice, check_int, check_positive_number, usable_cpus
from .auto import parse_methods
from .budget import parse_duration
from .folds import check_cv
from .objectives import check_objectives
from .protocol import check_protocol
from .selection import DEFAULT_FINAL_FRONT, DEFAULT_SELECT, SELECTION_RULES

DEFAULT_ENSEMBLE = 5  # why five: docs/ensembles.md, "Measured"

__all__ = [
    "StudyOptions",
    "SearchOptions",
    "DataOptions",
    "FinalOptions",
    "RuntimeOptions",
    "Flag",
    "FLAT_NAMES",
    "COMMAND_LINE_OPTIONS",
    "IDENTITY_OPTIONS",
    "GRID_OPTIONS",
    "option_help",
    "option_default",
    "option_flag",
    "from_command_line",
    "MAX_STUDY_NAME_LENGTH",
    "DEFAULT_FINAL_FRONT",
    "check_study_name",
]

PathLike = str | os.PathLike
TrialCount = int | Mapping[str, int | None] | None

MAX_STUDY_NAME_LENGTH = 512  # Optuna's studies.study_name column is VARCHAR(512)


_NEVER_STOPS = "give n_trials, total_trials or a timeout (or a time limit), otherwise the study never stops"


def check_study_name(name: object) -> str:
    """``name`` if a storage can keep it as a study name: a non-empty string of at most 512 printable
    characters (a newline or tab would split log lines and listings)."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"the study name must be a non-empty string, got {name!r}")
    if not name.isprintable():
        raise ValueError(
            f"the study name {name!r} holds a control character (newline, tab ...); pass a --study-name of "
            "printable characters only"
        )
    if len(name) > MAX_STUDY_NAME_LENGTH:
        raise ValueError(
            f"the study name has {len(name)} characters; a study storage keeps at most "
            f"{MAX_STUDY_NAME_LENGTH}. Pass a shorter --study-name"
        )
    return name


@dataclass(frozen=True)
class Flag:
    """How ``run`` and ``sweep`` spell a study option on the command line (``ilge_search.cli.group`` makes the
    click option; this module stays free of click).

    Attributes:
        name: the flag, e.g. ``--n-trials`` (the parsed value keeps the option's flat name).
        value: the Python type of one value (``int``, ``float`` or ``str``).
        minimum: the smallest value accepted (``None``: any); ``above_minimum``: the minimum itself is refused.
        choices: the only values accepted (empty: any).
        folder: the value is a folder's path.
        multiple: the flag may be repeated; the value is the tuple of them.
        unset: the flag's default is unset (``None``), so that a command can tell whether it was given; the
            field's default applies and the help shows it through ``more``.
        more: text appended to the field's help (``{default}`` in it: the field's default).
    """

    name: str
    value: type = str
    minimum: float | None = None
    above_minimum: bool = False
    choices: tuple[str, ...] = ()
    folder: bool = False
    multiple: bool = False
    unset: bool = False
    more: str = ""


def _option(
    default: Any = None, *, help: str, factory: Any = None, flag: Flag | None = None, grid: bool = False
) -> Any:
    """A dataclass field with its one description, its command-line flag, and whether a sweep grid sets it for
    every study at its top level (``grid``; the identity options always are, at the top and per task)."""
    metadata = {"help": help, "flag": flag, "grid": grid}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def _documented(cls: type) -> type:
    """Append an ``Attributes:`` section built from the fields' help to the class docstring."""
    lines = [f"    {f.name}: {f.metadata['help']}" for f in dataclasses.fields(cls)]
    cls.__doc__ = (cls.__doc__ or "").rstrip() + "\n\n    Attributes:\n" + "\n".join("    " + line for line in lines)
    return cls


def _path_or_none(value: PathLike | None) -> str | None:
    return None if value is None else os.fspath(value)


def _dict_of_counts(name: str, value: Any, minimum: int | None) -> Any:
    """``value`` checked as a count, or as a mapping of counts (made a plain dict, so it pickles)."""
    if isinstance(value, Mapping):
        counts = dict(value)
        for key, count in counts.items():
            check_int(f"{name}[{key}]", count, allow_none=True, **({} if minimum is None else {"minimum": minimum}))
        return counts
    check_int(name, value, allow_none=True, **({} if minimum is None else {"minimum": minimum}))
    return value


@_documented
@dataclass(frozen=True)
class SearchOptions:
    """How a study searches: the trial budget, the sampler and pruner, and what each trial returns."""

    n_trials: TrialCount = _option(
        20,
        help="trials to add to each study in this run (complete, pruned or failed), split exactly across the "
        "workers; 0 only (re)runs the final evaluation; with no count a study runs until the timeout or its "
        "total_trials cap (a mapping of encoder to count gives each study its own).",
        flag=Flag(
            "--n-trials",
            int,
            minimum=0,
            unset=True,
            more="[default: {default}; with --total-trials: until the cap; with --time-limit: until the time is spent]",
        ),
    )
    timeout: float | None = _option(
        help="seconds per study (per worker) after which no new trial starts.",
        flag=Flag("--timeout", float, minimum=0, above_minimum=True),
        grid=True,
    )
    time_limit: float | None = _option(
        help="a wall-clock budget for the whole run -- search, final evaluation and ensemble -- such as 10m, 90s, "
        "1.5h or seconds; the search stops starting trials when the time left is what the final stages need, "
        "estimated from the measured trials (several studies share it equally); trial counts still apply.",
        flag=Flag("--time-limit"),
        grid=True,
    )
    total_trials: TrialCount = _option(
        help="a cap on each study's complete, pruned and running trials, shared by every process and node on "
        "the storage (a mapping of encoder to cap gives each study its own, as a sweep does with its budgets).",
        flag=Flag("--total-trials", int, minimum=1),
    )
    study_name: str | None = _option(
        help="the study's name, with one encoder only (default: model:task:encoder).", flag=Flag("--study-name")
    )
    sampler: str = _option(
        "tpe",
        help=f"the Optuna sampler, one of {', '.join(SAMPLERS)}.",
        flag=Flag("--sampler", choices=SAMPLERS),
        grid=True,
    )
    pruner: str = _option(
        "median",
        help=f"the Optuna pruner, one of {', '.join(PRUNERS)} (a multi-objective study is never pruned).",
        flag=Flag("--pruner", choices=PRUNERS),
        grid=True,
    )
    seed: int = _option(
        0,
        help="seeds the sampler (worker i uses seed + i), every trial's training and, as seed + 1000 + i, the "
        "final seeds.",
        flag=Flag("--seed", int),
        grid=True,
    )
    max_epochs: int | None = _option(
        help="a cap on every config's epochs (part of the study's identity).", flag=Flag("--max-epochs", int, minimum=1)
    )
    cv: int | None = _option(
        help="score each trial on this many stratified folds of the training data (the mean over folds) instead "
        "of the validation split; part of the study's identity and name (:cvK).",
        flag=Flag("--cv", int, minimum=2),
    )
    objectives: tuple[str, ...] = _option(
        ("score",),
        help="what each trial optimises: 'score' (maximised), and 'params' (trainable parameters) and/or "
        "'latency' (forward ms per 1,000 samples on this device), minimised; several make a multi-objective "
        "study (part of the identity and name, e.g. :obj-params; never pruned; its Pareto front is retrained).",
        flag=Flag("--objective", multiple=True, unset=True, more="Repeat it. [default: {default}]"),
    )
    warm_start: int = _option(
        0,
        help="enqueue, after the starting configuration, the first K members of the encoder's portfolio "
        "(`ilge-search portfolio`: the storage's own, else the one shipped with the package; past the greedy "
        "portfolio, its other candidates by mean normalised validation score) before the sampler takes over; "
        "part of the study's identity and name (:warmK).",
        flag=Flag("--warm-start", int, minimum=0),
    )
    methods: tuple[str, ...] | None = _option(
        help="--encoder auto: the methods its one search chooses among, comma-separated (default: every "
        "encoder and baseline that serves the task's kind); part of an auto study's identity and name.",
        flag=Flag("--methods"),
    )

    def __post_init__(self) -> None:

        object.__setattr__(self, "n_trials", _dict_of_counts("n_trials", self.n_trials, 0))
        object.__setattr__(self, "total_trials", _dict_of_counts("total_trials", self.total_trials, None))
        check_positive_number("timeout", self.timeout, allow_none=True, unit="seconds")
        object.__setattr__(self, "time_limit", parse_duration(self.time_limit))
        self._check_stops(self.n_trials.values() if isinstance(self.n_trials, Mapping) else [self.n_trials])
        check_int("seed", self.seed, minimum=0, allow_none=True)
        check_int("max_epochs", self.max_epochs, allow_none=True)
        if self.study_name is not None:
            check_study_name(self.study_name)
        check_choice("sampler", self.sampler, SAMPLERS)
        check_choice("pruner", self.pruner, PRUNERS)
        check_cv(self.cv)
        object.__setattr__(self, "objectives", check_objectives(self.objectives))
        check_int("warm_start", self.warm_start, minimum=0)
        object.__setattr__(self, "methods", parse_methods(self.methods))

    @property
    def multi_objective(self) -> bool:
        """Whether the studies have more than one objective."""
        return len(self.objectives) > 1

    @property
    def effective_pruner(self) -> str:
        """The pruner the studies use: ``pruner``, or ``none`` for a multi-objective study."""
        return "none" if self.multi_objective else self.pruner

    def trial_counts(self, encoders: list[str]) -> dict[str, int | None]:
        """Trials to add per encoder (from ``n_trials``, one count or one per encoder).

        Raises:
            ValueError: ``n_trials`` has counts for encoders not in ``encoders``, or
                leaves an encoder without a count and nothing else stops its study.
        """
        if not isinstance(self.n_trials, Mapping):
            return {name: self.n_trials for name in encoders}
        unknown = set(self.n_trials) - set(encoders)
        if unknown:
            raise ValueError(f"n_trials has counts for encoders not run: {sorted(unknown)}")
        counts = {name: self.n_trials.get(name) for name in encoders}
        self._check_stops(counts.values())
        return counts

    def _check_stops(self, counts: Iterable[int | None]) -> None:
        if None in counts and self.timeout is None and self.total_trials is None and self.time_limit is None:
            raise ValueError(_NEVER_STOPS)

    def total_for(self, encoder: str) -> int | None:
        """The ``total_trials`` cap of ``encoder``'s study (``None``: no cap)."""
        if isinstance(self.total_trials, Mapping):
            return self.total_trials.get(encoder)
        return self.total_trials


@_documented
@dataclass(frozen=True)
class DataOptions:
    """Which data a study's trials train and are scored on (the caps are part of its identity), and where the
    task data and the embedding cache are."""

    shots: int | None = _option(help="training examples per label (few-shot).", flag=Flag("--shots", int, minimum=1))
    max_train: int | None = _option(
        help="a seeded, stratified cap on the training examples.", flag=Flag("--max-train", int, minimum=1)
    )
    max_eval: int | None = _option(
        help="a seeded, stratified cap on the validation and test examples each (for quick runs).",
        flag=Flag("--max-eval", int, minimum=1),
    )
    data_seed: int = _option(0, help="seed of the few-shot and subsampling draws.")
    zero_shot_tasks: tuple[str, ...] = _option(
        (),
        help="similarity tasks whose test split every final model is also scored on (zero-shot STS; similarity "
        "studies only).",
        flag=Flag("--zero-shot", multiple=True, more="Repeat it."),
    )
    word_pooling: str = _option(
        "first",
        help="tagging tasks: how a word's sub-word pieces become its vector in every layer, 'first' (its first "
        "piece) or 'mean' (their mean); part of a tagging study's identity (and name, :mean-words).",
        flag=Flag("--word-pooling", choices=WORD_POOLINGS),
    )
    data_dir: str | None = _option(help="folder of the task data (the shared JSONL layout).")
    cache_dir: str | None = _option(help="the embedding cache folder.")
    text_col: str | None = _option(help="a custom task file's text column (default: text).", flag=Flag("--text-col"))
    label_col: str | None = _option(
        help="a custom task file's label column (default: label).", flag=Flag("--label-col")
    )
    text_cols: tuple[str, ...] | None = _option(
        help="a custom pair task's two text columns, comma-separated (default: sentence1,sentence2).",
        flag=Flag("--text-cols"),
    )
    score_col: str | None = _option(
        help="a custom pair task's score column (default: score).", flag=Flag("--score-col")
    )
    tokens_col: str | None = _option(
        help="a custom token task's column of words, a list per row (default: tokens).", flag=Flag("--tokens-col")
    )
    tags_col: str | None = _option(
        help="a custom token task's column of tags, one per word (default: tags).", flag=Flag("--tags-col")
    )

    def column_options(self) -> dict[str, Any]:
        """The column options given, as :func:`~ilge_search.tasks.core.load_task` takes them."""
        names = ("text_col", "label_col", "text_cols", "score_col", "tokens_col", "tags_col")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}

    def __post_init__(self) -> None:
        if isinstance(self.text_cols, str):
            object.__setattr__(self, "text_cols", tuple(part.strip() for part in self.text_cols.split(",")))
        if self.text_cols is not None:
            object.__setattr__(self, "text_cols", tuple(str(part) for part in self.text_cols))
            if len(self.text_cols) != 2 or not all(self.text_cols):
                raise ValueError(f"text_cols needs two column names, e.g. sentence1,sentence2; got {self.text_cols}")
        for name in ("shots", "max_train", "max_eval"):
            check_int(name, getattr(self, name), allow_none=True)
        check_int("data_seed", self.data_seed, minimum=0)
        check_choice("word_pooling", self.word_pooling, WORD_POOLINGS)
        tasks = (self.zero_shot_tasks,) if isinstance(self.zero_shot_tasks, str) else self.zero_shot_tasks
        object.__setattr__(self, "zero_shot_tasks", tuple(str(name) for name in tasks))
        for name in ("data_dir", "cache_dir"):
            object.__setattr__(self, name, _path_or_none(getattr(self, name)))


@_documented
@dataclass(frozen=True)
class FinalOptions:
    """How the final evaluation retrains the selected trial (or a multi-objective study's Pareto front) and
    scores it on test, next to the starting configuration."""

    seeds: int = _option(
        3,
        help="retrain the selected configuration with this many seeds and score each on test once (0: skip).",
        flag=Flag("--final-seeds", int, minimum=0),
        grid=True,
    )
    select: str = _option(
        DEFAULT_SELECT,
        help=f"which trial the final evaluation retrains, one of {', '.join(SELECTION_RULES)}: the best "
        "objective, or the fewest trainable parameters within one standard error of the best (the starting "
        "configuration winning ties); not part of the identity: it changes the final evaluation, not the trials.",
        flag=Flag("--select", choices=SELECTION_RULES, unset=True, more="[default: {default}]"),
        grid=True,
    )
    front: int = _option(
        DEFAULT_FINAL_FRONT,
        help="multi-objective studies: retrain at most this many Pareto-front trials with the final seeds, "
        "spread along the front from the best score to the smallest.",
        flag=Flag("--final-front", int, minimum=1, unset=True, more="[default: {default}]"),
        grid=True,
    )
    protocol: str = _option(
        DEFAULT_PROTOCOL,
        help=f"how the final scores are measured, one of {', '.join(PROTOCOLS)}: each method trained with its "
        "head on the same data, or MTEB's logistic-regression readout of the vectors on a few examples per "
        "label (cosine Spearman for similarity; parameter-free baselines untrained); part of the identity "
        "and name (:paper).",
        flag=Flag("--protocol", choices=PROTOCOLS),
    )
    ensemble: int | None = _option(
        help="after the final evaluation, select an ensemble of up to this many trials greedily (with "
        "replacement) on their validation predictions, retrain its members with the final seeds and score it "
        f"on test beside the selected trial (default: {DEFAULT_ENSEMBLE} wherever a study can have one: "
        "single-objective, matched protocol, classification or similarity, two or more complete trials; "
        "0: off; asked for where a study cannot have one, a warning says why).",
        flag=Flag("--ensemble", int, minimum=0),
        grid=True,
    )
    samples_per_label: int | None = _option(
        help="the paper protocol's training examples per label (default: the MTEB task's own, Emotion 16, else "
        "8); part of the identity.",
        flag=Flag("--samples-per-label", int, minimum=1),
    )

    def __post_init__(self) -> None:

        check_int("final_seeds", self.seeds, minimum=0)
        check_choice("select", self.select, SELECTION_RULES)
        check_int("final_front", self.front)
        check_int("ensemble", self.ensemble, minimum=0, allow_none=True)
        check_protocol(self.protocol)
        check_int("samples_per_label", self.samples_per_label, allow_none=True)
        if self.samples_per_label is not None and self.protocol != "paper":
            raise ValueError(
                "samples_per_label sets the paper protocol's readout; add protocol='paper' "
                "(--protocol paper) or drop it"
            )

    def seed_list(self, seed: int | None) -> list[int]:
        """The seeds of the final evaluation: ``seed + 1000 + i`` for each of the ``seeds``."""
        return [(seed or 0) + 1000 + i for i in range(self.seeds)]


@_documented
@dataclass(frozen=True)
class RuntimeOptions:
    """Where and how a study's work runs; none of it changes the numbers."""

    workers: int = _option(
        1,
        help="worker processes optimising the same study in parallel, on one storage.",
        flag=Flag("--workers", int, minimum=1),
        grid=True,
    )
    threads: int | None = _option(
        help="torch CPU threads in this process and per worker (default: unchanged in-process, cpus // workers "
        "per worker); the encoders are small: on a CPU, 1 thread per worker and as many workers as cores is "
        "usually fastest.",
        flag=Flag("--threads", int, minimum=1),
        grid=True,
    )
    device: str = _option("auto", help="device for extraction and training (auto, cpu, cuda, mps).")
    artifact_dir: str | None = _option(
        help="artifact store folder for the final weights (default: next to a SQLite file, else studies/artifacts).",
        flag=Flag("--artifact-dir", folder=True),
    )
    heartbeat_interval: int | None = _option(
        60,
        help="seconds between a running trial's heartbeats; a trial silent for twice as long is failed and retried.",
        flag=Flag("--heartbeat-interval", int, minimum=1),
    )
    grace_period: int | None = _option(help="seconds without a heartbeat before a trial counts as dead.")
    max_retry: int = _option(3, help="times a trial of a dead worker is retried.")
    progress: bool = _option(True, help="progress bars for extraction, trials and final seeds.")

    def __post_init__(self) -> None:
        check_int("workers", self.workers)
        check_int("threads", self.threads, allow_none=True)
        if self.threads is not None and self.threads > usable_cpus():
            # thread pools far above the cores fail to start (OpenBLAS) or thrash; refused before anything is made
            raise ValueError(
                f"--threads {self.threads} is more than the {usable_cpus()} CPUs this process may use; pass "
                f"--threads {usable_cpus()} or fewer, or leave it out"
            )
        check_int("heartbeat_interval", self.heartbeat_interval, allow_none=True)
        check_int("grace_period", self.grace_period, allow_none=True)
        check_int("max_retry", self.max_retry, minimum=0, allow_none=True)
        object.__setattr__(self, "artifact_dir", _path_or_none(self.artifact_dir))

    def worker_threads(self) -> int:
        """Torch threads of each worker process: ``threads``, else the usable CPUs shared out among the workers."""
        return self.threads or max(1, usable_cpus() // self.workers)


_GROUPS: dict[str, type] = {
    "search": SearchOptions,
    "data": DataOptions,
    "final": FinalOptions,
    "runtime": RuntimeOptions,
}
# flat names whose field in the group is named differently
_RENAMED = {"final_seeds": ("final", "seeds"), "final_front": ("final", "front")}
# flat option name (command line, sweep grids) -> (group, field)
FLAT_NAMES: dict[str, tuple[str, str]] = {
    **{
        f.name: (group, f.name)
        for group, cls in _GROUPS.items()
        for f in dataclasses.fields(cls)
        if (group, f.name) not in _RENAMED.values()
    },
    **_RENAMED,
}


def _flat_field(name: str) -> dataclasses.Field:
    group, attr = FLAT_NAMES[name]
    return next(f for f in dataclasses.fields(_GROUPS[group]) if f.name == attr)


def option_help(name: str) -> str:
    """The one description of the flat option ``name`` (what the CLI's help shows)."""
    return _flat_field(name).metadata["help"]


def option_default(name: str) -> Any:
    """The default of the flat option ``name`` (what the CLI's help shows where its own default is unset)."""
    found = _flat_field(name)
    if found.default_factory is not dataclasses.MISSING:
        return found.default_factory()
    return found.default


def option_flag(name: str) -> Flag:
    """How the command line spells the flat option ``name``.

    Raises:
        KeyError: ``name`` has no flag (``data_dir``, ``device`` ... come from every command's location options).
    """
    flag = _flat_field(name).metadata["flag"]
    if flag is None:
        raise KeyError(f"the study option {name!r} has no command-line flag")
    return flag


# the flat options the command line spells (their field's ``flag``), group by group in field order: ``run`` has
# each of them
COMMAND_LINE_OPTIONS: tuple[str, ...] = tuple(
    flat
    for group, cls in _GROUPS.items()
    for f in dataclasses.fields(cls)
    if f.metadata["flag"] is not None
    for flat, place in FLAT_NAMES.items()
    if place == (group, f.name)
)
# the identity keys (:data:`~ilge_search.record.IDENTITY_KEYS`) that are study options: what a sweep grid sets
# at its top level and per task
IDENTITY_OPTIONS: tuple[str, ...] = tuple(name for name in IDENTITY_KEYS if name in FLAT_NAMES)
# the other options a sweep grid sets, for every study, at its top level only
GRID_OPTIONS: tuple[str, ...] = tuple(name for name in FLAT_NAMES if _flat_field(name).metadata["grid"])


def _grouped(flat: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    unknown = sorted(set(flat) - set(FLAT_NAMES))
    if unknown:
        raise ValueError(f"unknown study option(s) {unknown}; expected some of {sorted(FLAT_NAMES)}")
    groups: dict[str, dict[str, Any]] = {name: {} for name in _GROUPS}
    for name, value in flat.items():
        group, attr = FLAT_NAMES[name]
        groups[group][attr] = value
    return groups


@dataclass(frozen=True)
class StudyOptions:
    """Everything a study run takes besides the model, the task, the encoders and the storage.

    Attributes:
        search: :class:`SearchOptions`; data: :class:`DataOptions`; final: :class:`FinalOptions`;
        runtime: :class:`RuntimeOptions` (each checked when built).

    Raises:
        ValueError: on construction, naming the first invalid option.
    """

    search: SearchOptions = field(default_factory=SearchOptions)
    data: DataOptions = field(default_factory=DataOptions)
    final: FinalOptions = field(default_factory=FinalOptions)
    runtime: RuntimeOptions = field(default_factory=RuntimeOptions)

    def __post_init__(self) -> None:
        for name, cls in _GROUPS.items():
            if not isinstance(getattr(self, name), cls):
                raise ValueError(f"StudyOptions({name}=...) takes a {cls.__name__}, got {type(getattr(self, name))}")

    @classmethod
    def from_flat(cls, **flat: Any) -> StudyOptions:
        """Options from flat names (:data:`FLAT_NAMES`: ``n_trials``, ``max_train``, ``final_seeds`` ...),
        as the command line and sweep grids give them; the others keep their defaults."""
        return cls(**{group: _GROUPS[group](**values) for group, values in _grouped(flat).items()})

    def replace(self, **flat: Any) -> StudyOptions:
        """A checked copy with the flat-named ``flat`` options changed."""
        groups = _grouped(flat)
        return StudyOptions(
            **{
                name: dataclasses.replace(getattr(self, name), **groups[name]) if groups[name] else getattr(self, name)
                for name in _GROUPS
            }
        )

    def final_seed_list(self) -> list[int]:
        """The seeds of the final evaluation: ``seed + 1000 + i`` for each of the final seeds."""
        return self.final.seed_list(self.search.seed)


def from_command_line(values: Mapping[str, Any]) -> StudyOptions:
    """The :class:`StudyOptions` of a command's parsed study options (flat names): an option whose flag is
    ``unset`` and was not given keeps its field's default, except ``n_trials`` beside a ``total_trials`` cap or a
    ``time_limit`` (the studies then run up to the cap, or until the time is spent)."""
    flat = {
        name: value
        for name, value in values.items()
        if value is not None or _flat_field(name).metadata["flag"] is None or not option_flag(name).unset
    }
    if flat.get("total_trials") is not None or flat.get("time_limit") is not None:
        flat.setdefault("n_trials", None)  # trials until the cap or the time limit
    return StudyOptions.from_flat(**flat)
