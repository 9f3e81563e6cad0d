"""The marginal rule: how the problems of a family and model-size bucket become one set of defaults.

:func:`derive_defaults` applies the rule below to each (family, bucket) group of
:func:`~ilge_search.defaults.problems.read_problems`, optionally leaving out the problems of some tasks (``recommend
--exclude-task``, and the leave-one-task-out check of :mod:`~ilge_search.defaults.loto`). Writing the result is
:mod:`~ilge_search.defaults.recommend`'s job.

The rule
--------
Every study is one problem; its trials carry their normalised rank ``q`` and their parameters as levels
(:mod:`~ilge_search.defaults.problems` says how). Values are compared per hyperparameter, on those levels. For each
level its score is the mean over problems of the mean ``q`` of that problem's trials at the level. Among the levels seen
in at least half the problems of the group (coverage), the highest score wins; ties go to the larger coverage, then more
trials, then the built-in default's value, then the smallest level. Parameters that exist only under a choice
(``gin_mlp_layers`` for GIN, ``gat_heads`` for GAT) are decided after it, from the trials that made the same choice, and
only when it is the chosen one. Training fields outside the search space (``epochs``, ``batch_size``) are not touched.

This ranks each hyperparameter by how the trials that used each value fared across tasks. TPE trials almost never repeat
an exact configuration across studies, so a rule over whole configurations could only rank the one config every study
evaluates (the enqueued default); ``defaults.md`` still shows its mean normalised rank per group for comparison.
Validation scores only; test scores are never read.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..encoders import builtin_start, config_class_for
from .problems import ConfigValues, Problem

if TYPE_CHECKING:
    from optuna.distributions import CategoricalChoiceType

__all__ = ["CONDITIONAL", "MIN_COVERAGE", "RULE", "RecommendedValue", "recommend_group", "derive_defaults"]

# search-space parameters that exist only under one choice of another: name -> (parent, value)
CONDITIONAL = {"gin_mlp_layers": ("conv_type", "gin"), "gat_heads": ("conv_type", "gat")}
MIN_COVERAGE = 0.5

# ----------------------------------------------------------------------------- the rule


@dataclass
class RecommendedValue:
    """One chosen value with its evidence (what ``defaults.md`` shows)."""

    param: str
    value: CategoricalChoiceType
    score: float  # mean over problems of the mean normalised rank at this level
    coverage: int  # problems with a trial at this level
    problems: int  # problems the level was eligible in
    trials: int
    runner_up: tuple[CategoricalChoiceType, float, int] | None = None  # (value, score, coverage)
    # level -> (score, coverage, trials)
    levels: dict[CategoricalChoiceType, tuple[float, int, int]] = field(default_factory=dict)


def _choose(
    param: str, problems: Sequence[Problem], condition: tuple[str, str] | None, builtin: object
) -> RecommendedValue | None:
    per_level: dict[CategoricalChoiceType, list[float]] = {}
    trial_counts: dict[CategoricalChoiceType, int] = {}
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
        by_level: dict[CategoricalChoiceType, list[float]] = {}
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

    def preference(level: CategoricalChoiceType) -> tuple:
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


def _sort_key(level: CategoricalChoiceType) -> tuple:
    return (
        (0, float(level), "")
        if isinstance(level, (int, float)) and not isinstance(level, bool)
        else (1, 0.0, str(level))
    )


def recommend_group(
    family: str, bucket: str, problems: Sequence[Problem]
) -> tuple[ConfigValues, list[RecommendedValue]]:
    """The rule on one (family, bucket) group: the chosen values and the evidence for each."""
    cls = config_class_for(family)
    builtin = {
        **{f: getattr(cls(), f) for f in cls.__dataclass_fields__},
        **builtin_start(family, bucket),
    }
    names: list[str] = []
    for problem in problems:
        for trial in problem.trials:
            names += [p for p in trial.params if p not in names]
    unconditional = [p for p in names if p not in CONDITIONAL]
    # parents first, so their children are decided under the chosen value
    order = sorted(unconditional, key=lambda p: (p not in {parent for parent, _ in CONDITIONAL.values()}, p))
    values: ConfigValues = {}
    evidence: list[RecommendedValue] = []
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


# ----------------------------------------------------------------------------- deriving


def derive_defaults(
    groups: Mapping[tuple[str, str], Sequence[Problem]], exclude_tasks: Sequence[str] = ()
) -> tuple[
    dict[str, dict[str, ConfigValues]],
    dict[tuple[str, str], list[RecommendedValue]],
    dict[tuple[str, str], list[Problem]],
]:
    """The rule applied to every (family, bucket) group, without the problems of ``exclude_tasks``.

    Returns:
        ``{family: {bucket: values}}``, the evidence per group, and the problems each group used
        (a group left without problems is absent from all three).
    """
    excluded = set(exclude_tasks)
    used = {key: [p for p in problems if p.task not in excluded] for key, problems in sorted(groups.items())}
    used = {key: problems for key, problems in used.items() if problems}
    values: dict[str, dict[str, ConfigValues]] = {}
    evidence: dict[tuple[str, str], list[RecommendedValue]] = {}
    for (family, bucket), problems in used.items():
        chosen_values, chosen = recommend_group(family, bucket, problems)
        values.setdefault(family, {})[bucket] = chosen_values
        evidence[(family, bucket)] = chosen
    return values, evidence, used


RULE = (
    "Per study, each complete trial's validation score becomes a normalised rank q in [0, 1] (1 = the study's "
    "best trial; pruned trials tie below every complete one). Per hyperparameter, values are compared on "
    "levels (categorical and integer values as they are; lr and weight_decay snapped to 1 or 3 x 10^k; "
    "dropout to steps of 0.1); a level's score is the mean over studies of the mean q of that study's trials "
    "at the level. Among levels tried in at least half the studies of the family and size bucket, the highest "
    "score wins (ties: more studies, more trials, the built-in value, the smaller level). gin_mlp_layers and "
    "gat_heads are chosen among trials with the chosen conv_type. Validation scores only."
)  # the rule in one paragraph: the defaults file's metadata and defaults.md quote it
