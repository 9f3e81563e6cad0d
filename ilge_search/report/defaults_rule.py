"""The rule that turns stored studies into ``recommended_config`` defaults.

:func:`read_problems` reads every study of the encoder families (``cayley``,
``fc``, ``deepset``) in a storage, grouped by family and model-size bucket;
:func:`derive_defaults` applies the rule below to each group, optionally
leaving out the studies of some tasks (``recommend --exclude-task``, and the
leave-one-task-out check of :mod:`~ilge_search.report.loto`). Writing the
result is :mod:`~ilge_search.report.recommend`'s job.

Size buckets
------------
``small`` holds models up to 3B parameters, ``large`` those above
(:func:`ilge_search.models.model_size_bucket`). The issue fixes the ends (up
to ~1B: small; above 3B: large); models between 1B and 3B
(Pythia-1b/1.4b/2.8b, Gemma2-2B, Qwen3-1.7B) go to ``small`` because that is
the bucket the study runner already uses for them (its proxy: hidden size above
3000 means large), so their studies started from the small defaults and the
regenerated small defaults are what their next studies start from. The
parameter count comes from the model table :data:`ilge_search.models.MODELS`
(the models of the paper and the two offline models); for other models the
runner's hidden-size proxy decides, read from the study's ``hidden_size`` user attr.

The rule
--------
Every study is one *problem* (a model, task and data setting). Within a
problem, every complete trial gets its normalised rank of validation score,
``q = (rank - 1) / (n - 1)`` with rank 1 the worst, ties sharing their average
rank, so ``q`` is 1 for the problem's best trial and 0 for its worst; pruned
trials count as tied below every complete trial (the pruner judged them worse),
failed ones are ignored. A problem needs two such trials, one of them complete.
Ranks make problems of different difficulty and metric comparable.

Values are compared per hyperparameter, on *levels*: categorical and integer
values as they are; log-scale floats (``lr``, ``weight_decay``) snapped to the
nearest of 1 and 3 x 10^k (in log space); other floats (``dropout``) to the
nearest of six evenly spaced levels of their range (0, 0.1, ..., 0.5). For each level its score is
the mean over problems of the mean ``q`` of that problem's trials at the level.
Among the levels seen in at least half the problems of the group (coverage),
the highest score wins; ties go to the larger coverage, then more trials, then
the built-in default's value, then the smallest level. Parameters that exist
only under a choice (``gin_mlp_layers`` for GIN, ``gat_heads`` for GAT) are
decided after it, from the trials that made the same choice, and only when it
is the chosen one. Training fields outside the search space (``epochs``,
``batch_size``) are not touched.

This ranks each hyperparameter by how the trials that used each value fared
across tasks. TPE trials almost never repeat an exact configuration across
studies, so a rule over whole configurations could only rank the one config
every study evaluates (the enqueued default); ``defaults.md`` still shows its
mean normalised rank per group for comparison. Validation scores only; test
scores are never read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..configs import config_class_for
from ..models import model_size_bucket
from ..objectives import study_objectives
from ..protocol import protocol_of
from ..study.identity import search_identity
from ..tuning import BUILTIN_RECOMMENDED
from .data import open_report_storage

__all__ = [
    "CONDITIONAL",
    "MIN_COVERAGE",
    "Problem",
    "ScoredTrial",
    "RecommendedValue",
    "normalised_ranks",
    "recommend_group",
    "read_problems",
    "derive_defaults",
    "problem_tasks",
]

# search-space parameters that exist only under one choice of another: name -> (parent, value)
CONDITIONAL = {"gin_mlp_layers": ("conv_type", "gin"), "gat_heads": ("conv_type", "gat")}
MIN_COVERAGE = 0.5

# ----------------------------------------------------------------------------- the rule


def normalised_ranks(values: Sequence[Optional[float]], maximize: bool = True) -> List[float]:
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


def _log_grid(low: float, high: float) -> List[float]:
    grid = {low, high}
    for exponent in range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1):
        for mantissa in (1, 3):
            value = float(f"{mantissa}e{exponent}")
            if low <= value <= high:
                grid.add(value)
    return sorted(grid)


def _level(value: Any, distribution: Any) -> Any:
    """The level a parameter value is compared at (see the module docstring)."""
    from optuna.distributions import FloatDistribution

    if isinstance(distribution, FloatDistribution):
        low, high = float(distribution.low), float(distribution.high)
        if distribution.log:
            return min(_log_grid(low, high), key=lambda g: abs(math.log10(g) - math.log10(float(value))))
        grid = [round(low + i * (high - low) / 5, 10) for i in range(6)]
        return min(grid, key=lambda g: abs(g - float(value)))
    return value


@dataclass
class ScoredTrial:
    """One complete or pruned trial: its parameters as levels and its normalised rank in its study."""

    params: Dict[str, Any]  # levels
    q: float


@dataclass
class Problem:
    """One study as the rule sees it (a model, task and data setting)."""

    study: str
    model: str
    task: str
    trials: List[ScoredTrial]
    default_q: Optional[float]  # the enqueued recommended config's normalised rank


@dataclass
class RecommendedValue:
    """One chosen value with its evidence (what ``defaults.md`` shows)."""

    param: str
    value: Any
    score: float  # mean over problems of the mean normalised rank at this level
    coverage: int  # problems with a trial at this level
    problems: int  # problems the level was eligible in
    trials: int
    runner_up: Optional[Tuple[Any, float, int]] = None  # (value, score, coverage)
    levels: Dict[Any, Tuple[float, int, int]] = field(default_factory=dict)  # level -> (score, coverage, trials)


def _choose(
    param: str, problems: Sequence[Problem], condition: Optional[Tuple[str, Any]], builtin: Any
) -> Optional[RecommendedValue]:
    per_level: Dict[Any, List[float]] = {}
    trial_counts: Dict[Any, int] = {}
    eligible = 0
    for problem in problems:
        trials = [
            t
            for t in problem.trials
            if param in t.params and (condition is None or t.params.get(condition[0]) == condition[1])
        ]
        if not trials:
            continue
        eligible += 1
        by_level: Dict[Any, List[float]] = {}
        for trial in trials:
            by_level.setdefault(trial.params[param], []).append(trial.q)
        for level, qs in by_level.items():
            per_level.setdefault(level, []).append(sum(qs) / len(qs))
            trial_counts[level] = trial_counts.get(level, 0) + len(qs)
    if not per_level:
        return None
    levels = {level: (sum(means) / len(means), len(means), trial_counts[level]) for level, means in per_level.items()}
    needed = max(1, math.ceil(MIN_COVERAGE * eligible))
    candidates = [level for level, (_, coverage, _) in levels.items() if coverage >= needed]

    def preference(level: Any) -> Tuple:
        score, coverage, count = levels[level]
        return (-score, -coverage, -count, level != builtin, _sort_key(level))

    ranked = sorted(candidates, key=preference)
    best = ranked[0]
    runner = ranked[1] if len(ranked) > 1 else None
    score, coverage, count = levels[best]
    return RecommendedValue(
        param=param,
        value=best,
        score=score,
        coverage=coverage,
        problems=eligible,
        trials=count,
        runner_up=None if runner is None else (runner, levels[runner][0], levels[runner][1]),
        levels=levels,
    )


def _sort_key(level: Any) -> Tuple:
    return (
        (0, float(level), "")
        if isinstance(level, (int, float)) and not isinstance(level, bool)
        else (1, 0.0, str(level))
    )


def recommend_group(
    family: str, bucket: str, problems: Sequence[Problem]
) -> Tuple[Dict[str, Any], List[RecommendedValue]]:
    """The rule on one (family, bucket) group: the chosen values and the evidence for each."""
    cls = config_class_for(family)
    builtin = {
        **{f: getattr(cls(), f) for f in cls.__dataclass_fields__},
        **BUILTIN_RECOMMENDED.get(family, {}).get(bucket, {}),
    }
    names: List[str] = []
    for problem in problems:
        for trial in problem.trials:
            names += [p for p in trial.params if p not in names]
    unconditional = [p for p in names if p not in CONDITIONAL]
    # parents first, so their children are decided under the chosen value
    order = sorted(unconditional, key=lambda p: (p not in {parent for parent, _ in CONDITIONAL.values()}, p))
    values: Dict[str, Any] = {}
    evidence: List[RecommendedValue] = []
    for param in order:
        chosen = _choose(param, problems, None, builtin.get(param))
        if chosen is not None:
            values[param] = chosen.value
            evidence.append(chosen)
    for param in [p for p in names if p in CONDITIONAL]:
        parent, active = CONDITIONAL[param]
        if values.get(parent) != active:
            continue
        chosen = _choose(param, problems, (parent, active), builtin.get(param))
        if chosen is not None:
            values[param] = chosen.value
            evidence.append(chosen)
    unknown = set(values) - set(cls.__dataclass_fields__)
    if unknown:
        raise ValueError(f"{family} studies have parameters that are not {cls.__name__} fields: {sorted(unknown)}")
    cls(**values)  # a combination the config rejects is a bug in the rule, not something to write
    return values, evidence


# ----------------------------------------------------------------------------- reading studies


def read_problems(storage_url: str, families: Sequence[str]) -> Tuple[Dict[Tuple[str, str], List[Problem]], List[str]]:
    """Every study of ``families`` in a storage as a :class:`Problem`, grouped by (family, size bucket);
    and why the others were skipped."""
    import optuna
    from optuna.trial import TrialState

    storage = open_report_storage(storage_url)
    groups: Dict[Tuple[str, str], List[Problem]] = {}
    skipped: List[str] = []
    summaries = optuna.get_all_study_summaries(storage.rdb, include_best_trial=False)
    # a paper-protocol study searches exactly what its matched sibling searches: one problem, counted once
    matched = {search_identity(s.user_attrs) for s in summaries if protocol_of(s.user_attrs) == "matched"}
    for summary in summaries:
        attrs = summary.user_attrs
        name = summary.study_name
        family = attrs.get("encoder")
        if family not in families or not attrs.get("model"):
            continue
        if attrs.get("shots"):  # a handful of trials on a few examples per label: a point of a curve
            skipped.append(
                f"{name}: a few-shot study ({attrs['shots']} per label); defaults come from searches on "
                "whole training subsets"
            )
            continue
        if protocol_of(attrs) != "matched" and search_identity(attrs) in matched:
            skipped.append(f"{name}: the same search as its matched-protocol study, counted once")
            continue
        try:
            bucket = model_size_bucket(attrs["model"], attrs.get("hidden_size"))
        except ValueError as exc:
            skipped.append(f"{name}: {exc}")
            continue
        if len(study_objectives(attrs)) > 1:  # its sampler traded score for size: not a score-only search
            skipped.append(
                f"{name}: a multi-objective study ({'+'.join(study_objectives(attrs))}); defaults come "
                "from studies of the score alone"
            )
            continue
        study = optuna.load_study(study_name=name, storage=storage.rdb)
        maximize = study.direction != optuna.study.StudyDirection.MINIMIZE
        trials = [
            t
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
            if t.params and (t.state == TrialState.PRUNED or (t.value is not None and math.isfinite(t.value)))
        ]
        if len(trials) < 2 or not any(t.state == TrialState.COMPLETE for t in trials):
            skipped.append(f"{name}: needs 2 complete or pruned trials, one of them complete; has {len(trials)}")
            continue
        qs = normalised_ranks([t.value if t.state == TrialState.COMPLETE else None for t in trials], maximize)
        scored = [
            ScoredTrial({p: _level(v, t.distributions[p]) for p, v in t.params.items()}, q)
            for t, q in zip(trials, qs, strict=True)
        ]
        default_q = next((q for t, q in zip(trials, qs, strict=True) if t.user_attrs.get("recommended")), None)
        groups.setdefault((family, bucket), []).append(
            Problem(
                study=name,
                model=str(attrs["model"]),
                task=str(attrs.get("task", "")),
                trials=scored,
                default_q=default_q,
            )
        )
    return groups, skipped


# ----------------------------------------------------------------------------- deriving


def problem_tasks(groups: Mapping[Tuple[str, str], Sequence[Problem]]) -> List[str]:
    """The tasks the problems of ``groups`` are on, sorted."""
    return sorted({problem.task for problems in groups.values() for problem in problems})


def derive_defaults(
    groups: Mapping[Tuple[str, str], Sequence[Problem]], exclude_tasks: Sequence[str] = ()
) -> Tuple[
    Dict[str, Dict[str, Dict[str, Any]]],
    Dict[Tuple[str, str], List[RecommendedValue]],
    Dict[Tuple[str, str], List[Problem]],
]:
    """The rule applied to every (family, bucket) group, without the problems of ``exclude_tasks``.

    Returns:
        ``{family: {bucket: values}}``, the evidence per group, and the problems each group used
        (a group left without problems is absent from all three).
    """
    excluded = set(exclude_tasks)
    used = {key: [p for p in problems if p.task not in excluded] for key, problems in sorted(groups.items())}
    used = {key: problems for key, problems in used.items() if problems}
    values: Dict[str, Dict[str, Dict[str, Any]]] = {}
    evidence: Dict[Tuple[str, str], List[RecommendedValue]] = {}
    for (family, bucket), problems in used.items():
        chosen_values, chosen = recommend_group(family, bucket, problems)
        values.setdefault(family, {})[bucket] = chosen_values
        evidence[(family, bucket)] = chosen
    return values, evidence, used
