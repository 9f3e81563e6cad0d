"""Which trial a study's final evaluation retrains: the selection rules ``best`` and ``one-se``.

- ``best``: the trial with the best objective.
- ``one-se``: among complete trials within one standard error of the best objective (:func:`standard_error`),
  the one with the fewest trainable parameters; ties go to the starting configuration, then the better
  objective, then the earlier trial. It trades score for simplicity only inside the noise of the best score.

A multi-objective study's final evaluation retrains up to K trials of its Pareto front (:func:`front_trials`);
both rules still answer for it, on its score.
"""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING

from optuna.trial import TrialState

from ..record import TrialRecord, study_record, trial_record
from ..validation import check_choice
from .objectives import best_score_trial, objective_directions, pareto_front, score_of

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

__all__ = [
    "SELECTION_RULES",
    "DEFAULT_SELECT",
    "DEFAULT_FINAL_FRONT",
    "FRONT_RULE",
    "standard_error",
    "select_trial",
    "start_trial",
    "is_better",
    "study_front",
    "front_trials",
]

SELECTION_RULES = ("best", "one-se")
# one-se guards against the harmful search and prefers the smaller model, for a difference from best inside the
# spread over seeds (measured in docs/selection.md); best is one flag away
DEFAULT_SELECT = "one-se"
DEFAULT_FINAL_FRONT = 5  # Pareto-front trials a multi-objective study's final evaluation retrains (--final-front)
FRONT_RULE = "front"  # the final_select of a multi-objective study's final evaluation (its Pareto front)
SPEARMAN_VARIANCE_FACTOR = 1.06  # var(atanh(rho)) ~ 1.06 / (n - 3) for Spearman's rho (Fieller et al., 1957)


def _is_start(record: TrialRecord) -> bool:
    """Whether a trial ran the starting configuration (and recorded it)."""
    return record.recommended and bool(record.config)


def is_better(a: float, b: float, maximize: bool) -> bool:
    """Whether objective ``a`` beats ``b``."""
    return a > b if maximize else a < b


def standard_error(trial: FrozenTrial, metric: str, n_validation: int | None) -> float:
    """The standard error of a trial's objective.

    With ``--cv`` (the trial has ``fold_scores``): the standard deviation of
    the fold scores over the square root of their number, the usual one-SE
    rule. Without: the sampling error of the metric on ``n_validation``
    examples at the observed value -- binomial, ``sqrt(p (1 - p) / n)``, for
    accuracy (and as an approximation for macro-F1); for a correlation ``r``,
    the Fisher-z interval mapped back, ``(1 - r^2) sqrt(c / (n - 3))`` with
    ``c = 1.06`` for Spearman and 1 for Pearson. It measures how much the
    score would move on another validation sample of the same size, which is
    the noise that picking the maximum over trials exploits. ``0.0`` when
    it cannot be estimated (one fold, a loss objective, no split size).
    """
    folds = trial_record(trial).fold_scores
    if folds:
        return statistics.stdev(folds) / math.sqrt(len(folds)) if len(folds) > 1 else 0.0
    value = score_of(trial)
    if value is None or not n_validation:
        return 0.0
    if metric in ("spearman", "pearson"):
        if n_validation <= 3:
            return 0.0
        factor = SPEARMAN_VARIANCE_FACTOR if metric == "spearman" else 1.0
        return (1.0 - min(1.0, value * value)) * math.sqrt(factor / (n_validation - 3))
    if metric == "loss" or not 0.0 <= value <= 1.0:
        return 0.0
    return math.sqrt(value * (1.0 - value) / n_validation)


def _complete(study: optuna.Study) -> list[FrozenTrial]:

    return [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.values]


def start_trial(study: optuna.Study) -> FrozenTrial | None:
    """The recommended starting configuration: the first trial marked ``recommended`` that has a config
    (complete first, else any state: a pruned start is still the configuration a user would have used)."""
    marked = [t for t in study.get_trials(deepcopy=False) if _is_start(trial_record(t))]
    complete = [t for t in marked if t.values]
    pool = complete or marked
    return min(pool, key=lambda t: t.number) if pool else None


def select_trial(study: optuna.Study, rule: str) -> FrozenTrial:
    """The trial the final evaluation retrains under ``rule`` (one of :data:`SELECTION_RULES`).

    Raises:
        ValueError: an unknown rule, or no complete trial.
    """

    check_choice("select", rule, SELECTION_RULES)
    trials = _complete(study)
    if not trials:
        raise ValueError(f"study {study.study_name!r} has no complete trial to select")
    best = best_score_trial(study)
    if rule == "best":
        return best
    data = study_record(study).data
    n_validation = None if data is None else data.n_validation
    margin = standard_error(best, (data.metric if data is not None else None) or "", n_validation)
    sign = 1.0 if data is None or data.maximize else -1.0
    score = {t.number: float(t.values[0]) for t in trials}  # a complete trial's first value is its score
    # a tiny tolerance: the best trial is always inside its own band, whatever the rounding
    within = [t for t in trials if sign * (score[best.number] - score[t.number]) <= margin + 1e-12]

    def simplicity(trial: FrozenTrial) -> tuple:
        record = trial_record(trial)
        return (
            math.inf if record.params is None else int(record.params),
            not record.recommended,
            -sign * score[trial.number],
            trial.number,
        )

    return min(within, key=simplicity)


def study_front(study: optuna.Study) -> list[FrozenTrial]:
    """The Pareto front of ``study``'s complete trials on its objectives, best score first
    (:func:`~ilge_search.study.objectives.pareto_front`)."""
    record = study_record(study)
    metric = (record.data.metric if record.data is not None else None) or ""
    return pareto_front(_complete(study), objective_directions(record.objectives, metric), record.objectives)


def front_trials(front: list[FrozenTrial], k: int) -> list[FrozenTrial]:
    """Up to ``k`` trials of a Pareto ``front`` (best score first), spread evenly along it.

    The whole front when it has at most ``k`` trials; otherwise the trials at ``k`` evenly spaced
    ranks of the score order, ends included: the best score (with the most parameters it takes) and the
    smallest (cheapest) trial are always retrained, so the final front spans the whole trade-off rather
    than only its high-score corner. ``k = 1`` gives the best score alone.
    """
    if k < 1:
        raise ValueError(f"final_front must be >= 1, got {k!r}")
    if len(front) <= k:
        return list(front)
    if k == 1:
        return [front[0]]
    ranks = sorted({round(i * (len(front) - 1) / (k - 1)) for i in range(k)})
    return [front[rank] for rank in ranks]
