"""Stored studies as the problems the defaults rule learns from.

Every study of an ILGE family in a storage is one *problem*: a model, task and data setting.
:func:`read_problems` reads them, grouped by family and model-size bucket, and says why the others were
left out: few-shot and multi-objective studies, a paper-protocol study whose matched-protocol sibling
searched the same thing, and studies with fewer than two scored trials.

Within a problem each trial gets its normalised rank of validation score, ``q = (rank - 1) / (n - 1)``
(1: the best trial, 0: the worst, ties share their average rank; pruned trials tie below every complete
one, failed ones are ignored), which makes problems of different difficulty and metric comparable.
Parameter values are compared as *levels*: categorical and integer values as they are, log-scale floats
snapped to the nearest of 1 and 3 x 10^k, other floats to six evenly spaced levels of their range.

Size buckets: ``small`` holds models up to 3B parameters, ``large`` those above
(:func:`ilge_search.embeddings.models.model_size_bucket`), the split the study runner starts from; a
model missing from :data:`ilge_search.embeddings.models.MODELS` is placed by its recorded hidden size.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import optuna
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

from ..embeddings.models import model_size_bucket
from ..encoders import config_class_for
from ..record import Identity, study_record, trial_record
from ..storage import Storage, open_storage
from ..tuning import suggest_config

if TYPE_CHECKING:
    import optuna
    from optuna.distributions import CategoricalChoiceType

__all__ = [
    "Problem",
    "ProblemGroups",
    "ScoredTrial",
    "normalised_ranks",
    "parameter_level",
    "open_existing_storage",
    "read_problems",
    "problem_tasks",
]


@dataclass
class ScoredTrial:
    """One complete or pruned trial: its parameters as levels and its normalised rank in its study."""

    params: dict[str, CategoricalChoiceType]  # levels
    q: float


@dataclass
class Problem:
    """One study as the rule sees it (a model, task and data setting)."""

    study: str
    model: str
    task: str
    trials: list[ScoredTrial]
    default_q: float | None  # the enqueued recommended config's normalised rank


ConfigValues = dict[str, Any]  # a configuration's fields by name, as JSON stores them
ProblemGroups = dict[tuple[str, str], list[Problem]]  # (family, size bucket) -> problems


def normalised_ranks(values: Sequence[float | None], maximize: bool = True) -> list[float]:
    """``q`` in [0, 1] per trial (1 = best); ``None`` marks a pruned trial, tied below
    every complete one. Ties share their average rank."""
    n = len(values)
    if n < 2:
        raise ValueError("normalised ranks need at least two trials")
    sign = 1.0 if maximize else -1.0
    keys = [-math.inf if v is None else sign * float(v) for v in values]
    order = sorted(range(n), key=lambda i: keys[i])
    ranks = [0.0] * n
    start = 0
    while start < n:
        end = start
        while end + 1 < n and keys[order[end + 1]] == keys[order[start]]:
            end += 1
        average = (start + end) / 2 + 1  # 1-based rank, 1 = worst
        for position in range(start, end + 1):
            ranks[order[position]] = average
        start = end + 1
    return [(r - 1) / (n - 1) for r in ranks]


def _log_grid(low: float, high: float) -> list[float]:
    grid = {low, high}
    for exponent in range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1):
        for mantissa in (1, 3):
            value = float(f"{mantissa}e{exponent}")
            if low <= value <= high:
                grid.add(value)
    return sorted(grid)


def parameter_level(value: Any, distribution: Any) -> Any:
    """The level a parameter value is compared at (see the module docstring)."""

    if isinstance(distribution, FloatDistribution):
        low, high = float(distribution.low), float(distribution.high)
        if distribution.log:
            return min(_log_grid(low, high), key=lambda g: abs(math.log10(g) - math.log10(float(value))))
        grid = [round(low + i * (high - low) / 5, 10) for i in range(6)]
        return min(grid, key=lambda g: abs(g - float(value)))
    return value


def open_existing_storage(storage_url: str) -> Storage:
    """The storage to read stored studies from; an empty URL or a SQLite file that does not exist is an
    error (opening it would silently create an empty database)."""
    if not storage_url:
        raise ValueError("give a storage URL, e.g. sqlite:///studies/offline.db")
    return open_storage(storage_url, must_exist=True)


def _why_not_a_problem(name: str, identity: Identity, matched: set[tuple[str, ...]]) -> str | None:
    """Why a study of a wanted family is not a problem of the rule (``None``: it is one, if it has trials)."""
    if identity.shots:  # a handful of trials on a few examples per label: a point of a curve
        return (
            f"{name}: a few-shot study ({identity.shots} per label); defaults come from searches on "
            "whole training subsets"
        )
    if identity.protocol != "matched" and identity.search_key() in matched:
        return f"{name}: the same search as its matched-protocol study, counted once"
    return None


class _SpaceCheck:
    """A stand-in trial for :func:`~ilge_search.tuning.suggest_config` that answers with a stored trial's
    parameters, refusing values the search space cannot suggest (absent parameters take the space's first)."""

    def __init__(self, params: Mapping[str, Any]) -> None:
        self.params = params

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        value = self.params.get(name, choices[0])
        if value not in choices:
            raise ValueError(f"{name}={value!r} is not one of {list(choices)}")
        return value

    def suggest_int(self, name: str, low: int, high: int, **_: object) -> Any:
        return self._within(name, low, high)

    def suggest_float(self, name: str, low: float, high: float, **_: object) -> Any:
        return self._within(name, low, high)

    def _within(self, name: str, low: float, high: float) -> Any:
        value = self.params.get(name, low)
        if not low <= value <= high:
            raise ValueError(f"{name}={value!r} is outside [{low}, {high}]")
        return value


def _outside_the_space(family: str, trials: Sequence[optuna.trial.FrozenTrial]) -> str | None:
    """What in ``trials`` the family's search space cannot have suggested: unknown parameter names, or a
    value outside a parameter's choices or range (``None``: every trial fits)."""

    known = {f.name for f in dataclasses.fields(config_class_for(family))}
    unknown = sorted({p for t in trials for p in t.params} - known)
    if unknown:
        return f"parameters {unknown}"
    for trial in trials:
        try:
            suggest_config(_SpaceCheck(trial.params), family)
        except (TypeError, ValueError) as exc:
            return f"a value outside it (trial {trial.number}: {exc})"
    return None


def _scored_problem(storage: Storage, name: str, identity: Identity) -> Problem | str:
    """The study's complete and pruned trials ranked, or why it has too few of them."""

    study = optuna.load_study(study_name=name, storage=storage.rdb)
    maximize = study.direction != optuna.study.StudyDirection.MINIMIZE
    trials = [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
        if t.params and (t.state == TrialState.PRUNED or (t.value is not None and math.isfinite(t.value)))
    ]
    if len(trials) < 2 or not any(t.state == TrialState.COMPLETE for t in trials):
        return f"{name}: needs 2 complete or pruned trials, one of them complete; has {len(trials)}"
    foreign = _outside_the_space(identity.encoder, trials)
    if foreign:
        return (
            f"{name}: left out, its trials have {foreign} that the {identity.encoder} search space does not have "
            "(made or edited outside ilge-search); move it to another storage or delete it to silence this"
        )
    qs = normalised_ranks([t.value if t.state == TrialState.COMPLETE else None for t in trials], maximize)
    scored = [
        ScoredTrial({p: parameter_level(v, t.distributions[p]) for p, v in t.params.items()}, q)
        for t, q in zip(trials, qs, strict=True)
    ]
    default_q = next((q for t, q in zip(trials, qs, strict=True) if trial_record(t).recommended), None)
    return Problem(study=name, model=str(identity.model), task=str(identity.task), trials=scored, default_q=default_q)


def read_problems(storage_url: str, families: Sequence[str]) -> tuple[ProblemGroups, list[str]]:
    """Every study of ``families`` in a storage as a :class:`Problem`, grouped by (family, size bucket);
    and why the others were skipped."""

    storage = open_existing_storage(storage_url)
    groups: ProblemGroups = {}
    skipped: list[str] = []
    # the studies without their trials: a summary would read every trial of every study first
    records = [study_record(s) for s in storage.rdb.get_all_studies()]
    # a paper-protocol study searches exactly what its matched sibling searches: one problem, counted once
    matched = {r.identity.search_key() for r in records if r.identity is not None and r.identity.protocol == "matched"}
    for record in records:
        identity = record.identity
        if identity is None or identity.encoder not in families:
            continue
        reason = _why_not_a_problem(record.name, identity, matched)
        if reason is not None:
            skipped.append(reason)
            continue
        try:
            bucket = model_size_bucket(identity.model, record.data.hidden_size if record.data else None)
        except ValueError as exc:
            skipped.append(f"{record.name}: {exc}")
            continue
        if record.data is not None and record.data.task_kind == "tagging":  # token accuracy: another scale
            skipped.append(f"{record.name}: a tagging study; defaults come from studies of texts and pairs")
            continue
        if identity.multi_objective:  # its sampler traded score for size: not a score-only search
            skipped.append(
                f"{record.name}: a multi-objective study ({'+'.join(identity.objectives)}); defaults come "
                "from studies of the score alone"
            )
            continue
        problem = _scored_problem(storage, record.name, identity)
        if isinstance(problem, str):
            skipped.append(problem)
        else:
            groups.setdefault((identity.encoder, bucket), []).append(problem)
    return groups, skipped


def problem_tasks(groups: Mapping[tuple[str, str], Sequence[Problem]]) -> list[str]:
    """The tasks the problems of ``groups`` are on, sorted."""
    return sorted({problem.task for problems in groups.values() for problem in problems})
