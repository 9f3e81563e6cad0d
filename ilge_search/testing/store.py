"""A fake study store: ilge-search studies written straight into an Optuna storage, with no training.

For tests of code that only reads studies (report, selection, recommended
defaults, dashboard notes, export provenance): each study gets its record
through :mod:`ilge_search.record`'s writers, so it has exactly the shape the
runner leaves, with trials and a final evaluation chosen by the test.

Usage::

    identity = Identity(model="minilm-l6", task="trec", encoder="cayley")
    add_study(url, identity, trials=[FakeTrial(0.80, recommended=True), FakeTrial(0.84)],
              final=final_record([0.70, 0.72], trial=1))
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.study import StudyDirection
from optuna.trial import TrialState, create_trial

from ..record import (
    DataRecord,
    FinalRecord,
    Identity,
    TrialRecord,
    mark_ready,
    save_final,
    save_identity,
    save_trial,
)
from ..storage import quiet_optuna_warnings
from ..study.identity import default_study_name
from ..study.objectives import objective_directions, objective_metric_names

__all__ = ["FakeTrial", "add_study", "final_record", "classification_data", "similarity_data"]


@dataclass(frozen=True)
class FakeTrial:
    """One stored trial.

    Attributes:
        value: its objective value, or one value per objective of a multi-objective study; ``None`` for a
            trial without one (pruned, failed, running).
        state: its Optuna state.
        params: the searched parameters Optuna shows (distributions are inferred over the study's trials).
        record: what the trial recorded (configuration, parameters, fold scores ...); ``val_metric``
            defaults to the score.
        recommended: marks the starting configuration.
        intermediate: validation value per step (epoch), as a pruner sees it.
    """

    value: float | Sequence[float] | None
    state: TrialState = TrialState.COMPLETE
    params: Mapping[str, Any] = field(default_factory=dict)
    record: TrialRecord = field(default_factory=TrialRecord)
    recommended: bool = False
    intermediate: Mapping[int, float] = field(default_factory=dict)

    @property
    def values(self) -> list[float] | None:
        if self.value is None:
            return None
        return [float(v) for v in self.value] if isinstance(self.value, Sequence) else [float(self.value)]


def classification_data(**fields: Any) -> DataRecord:
    """A classification study's data record (accuracy, maximised); ``fields`` override any field."""
    return DataRecord(task_kind="classification", metric="accuracy", direction="maximize", **fields)


def similarity_data(**fields: Any) -> DataRecord:
    """A similarity study's data record (Spearman, maximised); ``fields`` override any field."""
    return DataRecord(task_kind="similarity", metric="spearman", direction="maximize", **fields)


def final_record(test_scores: Sequence[float], *, trial: int = 0, select: str = "best", **fields: Any) -> FinalRecord:
    """A final evaluation with these test scores (their mean and sample std), one seed each from 1000, for
    ``trial`` under ``select``; ``fields`` set any other field of :class:`~ilge_search.record.FinalRecord`."""
    scores = [float(score) for score in test_scores]
    if not scores:
        raise ValueError("a final evaluation has at least one test score")
    values: dict[str, Any] = {
        "seeds": [1000 + index for index in range(len(scores))],
        "test_mean": statistics.fmean(scores),
        "test_std": statistics.stdev(scores) if len(scores) > 1 else 0.0,
        "config": {},
    }
    values.update(fields)
    return FinalRecord(select=select, trial=trial, test_scores=scores, **values)


def _distribution(values: list[Any]) -> BaseDistribution:
    """A distribution every stored value of one parameter fits; positive floats (learning rates, weight
    decays) on a log scale, as the search space draws them."""
    if all(isinstance(v, (bool, str)) for v in values):
        return CategoricalDistribution(sorted(set(values), key=str))
    if all(isinstance(v, int) for v in values):
        return IntDistribution(min(values), max(values))
    low, high = float(min(values)), float(max(values))
    if low > 0:
        return FloatDistribution(low, high if high > low else 10 * low, log=True)
    return FloatDistribution(low, high if high > low else low + 1.0)


def _distributions(trials: Sequence[FakeTrial]) -> dict[str, BaseDistribution]:
    seen: dict[str, list[Any]] = {}
    for trial in trials:
        for name, value in trial.params.items():
            seen.setdefault(name, []).append(value)
    return {name: _distribution(values) for name, values in seen.items()}


def _frozen_trial(trial: FakeTrial, distributions: Mapping[str, BaseDistribution]) -> optuna.trial.FrozenTrial:
    values = trial.values if trial.state == TrialState.COMPLETE else None
    frozen = create_trial(
        state=trial.state,
        values=values,
        params=dict(trial.params),
        distributions={name: distributions[name] for name in trial.params},
        intermediate_values=dict(trial.intermediate),
    )
    record = trial.record
    if record.val_metric is None and values:
        record = dataclasses.replace(record, val_metric=values[0])
    if trial.recommended:
        record = dataclasses.replace(record, recommended=True)
    defaults = TrialRecord()
    changed = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    save_trial(frozen, **{name: value for name, value in changed.items() if value != getattr(defaults, name)})
    return frozen


def add_study(
    storage: str | optuna.storages.BaseStorage,
    identity: Identity,
    *,
    data: DataRecord | None = None,
    trials: Sequence[FakeTrial] = (),
    final: FinalRecord | None = None,
    study_name: str | None = None,
) -> optuna.Study:
    """Store one ilge-search study as the runner leaves it: ``identity`` and ``data`` (default: a
    classification task) recorded, marked ready, ``trials`` added in order, and ``final`` stored as its
    final evaluation (also under its rule in ``final_by_rule``, unless it is a front). Its name defaults to
    the runner's (:func:`~ilge_search.study.identity.default_study_name`)."""
    data = data or classification_data()
    name = study_name or default_study_name(
        identity.model,
        identity.task,
        identity.encoder,
        shots=identity.shots,
        max_train=identity.max_train,
        max_eval=identity.max_eval,
        max_epochs=identity.max_epochs,
        cv=identity.cv,
        objectives=identity.objectives,
        protocol=identity.protocol,
        samples_per_label=identity.samples_per_label,
        data_seed=identity.data_seed,
        word_pooling=identity.word_pooling,
        warm_start=identity.warm_start,
    )
    metric = data.metric or "accuracy"
    directions = [StudyDirection[way.upper()] for way in objective_directions(identity.objectives, metric)]
    study = optuna.create_study(study_name=name, storage=storage, directions=directions)
    with quiet_optuna_warnings():
        study.set_metric_names(objective_metric_names(identity.objectives, metric))
    save_identity(study, identity, data)
    distributions = _distributions(trials)
    for trial in trials:
        study.add_trial(_frozen_trial(trial, distributions))
    if final is not None:
        save_final(study, final, keep_by_rule=not final.front)
    mark_ready(study)
    return study
