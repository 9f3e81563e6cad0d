"""The ensemble evaluation's work (``run --ensemble K``, ``ilge-search ensemble``): greedy selection over a
study's complete trials on their validation predictions (backfilled by retraining once with the study's seed
where missing), the members retrained with the final seeds (reusing the final evaluation's models) and scored on
test beside the selected trial, the start and the best single layer; an :class:`~ilge_search.record.EnsembleRecord`
stored and the best seed's ensemble uploaded (``export --ensemble``). Matched protocol, one objective only.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from optuna.trial import TrialState

from ..._version import __version__
from ...embeddings.models import model_size_bucket
from ...encoders.configs import BestLayerConfig
from ...engine import select_best_layer
from ...engine.ensemble import MIX_RULE, EnsembleModel, greedy_selection, mixed, prediction_score, predictions_of
from ...progress import BarSpec, steps
from ...record import (
    EnsembleRecord,
    EnsembleSize,
    StudyRecord,
    ensemble_record,
    save_backfilled_predictions,
    save_ensemble,
    study_record,
    trial_config,
    trial_record,
)
from ...record.artifacts import upload_predictions, validation_predictions
from ...tuning import recommended_config
from ...validation import check_int
from ..final import upload_weights
from ..objectives import measure_latency
from ..options import DEFAULT_ENSEMBLE
from ..retraining import train_configs, train_seeds
from ..selection import DEFAULT_SELECT, select_trial, start_trial

if TYPE_CHECKING:  # pragma: no cover
    import optuna
    from optuna.trial import FrozenTrial

    from ..data import StudyData
    from ..shapes import TrainedModel

__all__ = [
    "SLOW_MEMBER_FACTOR",
    "complete_trials",
    "backfill_predictions",
    "EnsembleRun",
    "ensemble_evaluation",
    "check_ensemble_study",
    "ensemble_size",
    "ensemble_is_current",
    "slow_trials",
]

logger = logging.getLogger(__name__)

# a candidate whose search trial took over this many times the median, and over SLOW_MEMBER_SECONDS, is left out:
# retraining it per seed would cost more than the rest of the ensemble (docs/ensembles.md, "Measured")
SLOW_MEMBER_FACTOR = 3.0
SLOW_MEMBER_SECONDS = 10.0


def complete_trials(study: optuna.Study) -> list[FrozenTrial]:
    """The study's complete trials that recorded a config, by number: what an ensemble chooses from."""
    trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    return sorted((t for t in trials if t.values and trial_record(t).config), key=lambda t: t.number)


def backfill_predictions(
    study: optuna.Study, data: StudyData, artifact_store: Any, *, seed: int, device: str = "cpu", progress: bool = True
) -> int:
    """Give every complete trial without validation predictions some, by retraining its configuration once
    with ``seed`` on ``data``; how many were backfilled."""
    trials = complete_trials(study)
    have = validation_predictions(study, trials, artifact_store)
    missing = [t for t in trials if t.number not in have]
    if not missing:
        return 0
    logger.info(
        "%s: %d of %d complete trials have no readable validation predictions; retraining each one's configuration "
        "with seed %d on the study's data to make them",
        study.study_name,
        len(missing),
        len(trials),
        seed,
    )
    made: dict[int, str] = {}
    try:
        for trial in steps(missing, BarSpec("validation predictions", enabled=progress, transient=True)):
            [trained] = train_seeds(data, trial_config(trial), [seed], device=device)
            made[trial.number] = upload_predictions(
                study, predictions_of(trained.model, data.validation[0]), artifact_store
            )
    finally:  # what was made is kept, so an interrupted backfill resumes where it stopped
        if made:
            save_backfilled_predictions(study, made, seed)
    return len(made)


@dataclass(frozen=True)
class EnsembleRun:
    """How an ensemble evaluation runs: the size asked for (``size``, the study's ensemble) and every size
    to score (``sizes``, which include it), the final ``seeds``, the epoch cap, the selection rule it is
    compared with, the training seed of backfilled predictions, where it trains and stores weights."""

    size: int
    seeds: list[int]
    max_epochs: int | None
    select: str = DEFAULT_SELECT
    sizes: tuple[int, ...] = ()
    prediction_seed: int = 0
    device: str = "cpu"
    artifact_store: Any = None
    progress: bool = True
    # models the final evaluation trained with these seeds (trial -> seed -> (model, seconds)): not trained again
    reuse: Mapping[int, Mapping[int, tuple[TrainedModel, float]]] = field(default_factory=dict)
    slow_factor: float | None = SLOW_MEMBER_FACTOR  # None: every complete trial is a candidate

    @property
    def all_sizes(self) -> list[int]:
        return sorted({int(self.size), *map(int, self.sizes)})


def check_ensemble_study(record: StudyRecord, size: int) -> None:
    """Refuse, in one line, a study that cannot have an ensemble (before anything is trained)."""
    check_int("ensemble size", size, minimum=1)
    if record.identity is not None and record.identity.multi_objective:
        raise ValueError(
            f"study {record.name!r} is multi-objective: ensembles are off for such studies (their final "
            "evaluation retrains a Pareto front instead)"
        )
    if record.identity is not None and record.identity.protocol != "matched":
        raise ValueError(
            f"study {record.name!r} is scored under the {record.identity.protocol} protocol; ensembles are "
            "scored with each model's own head (matched protocol) only"
        )
    kind = None if record.data is None else record.data.task_kind
    if kind not in MIX_RULE:
        raise ValueError(f"study {record.name!r} is a {kind} study; ensembles cover classification and similarity")


def ensemble_size(study: optuna.Study, asked: int | None) -> tuple[int, str | None]:
    """The ensemble size a run makes for ``study`` (:func:`sized_ensemble`)."""
    return sized_ensemble(study_record(study), len(complete_trials(study)), asked)


def sized_ensemble(record: StudyRecord, complete: int, asked: int | None) -> tuple[int, str | None]:
    """The ensemble size a run makes for a study of ``complete`` trials (``asked``: ``FinalOptions.ensemble``;
    ``None``: the default, where it has two), and the warning where ``asked`` cannot be honoured as asked."""
    if asked == 0:
        return 0, None
    size = DEFAULT_ENSEMBLE if asked is None else asked
    try:
        check_ensemble_study(record, size)
    except ValueError as error:
        return 0, None if asked is None else f"no ensemble: {error}"
    if asked is None and complete < 2:
        return 0, None
    if complete == 0:
        return 0, "no ensemble: the study has no complete trial to choose from"
    if complete == 1:
        return size, (
            f"--ensemble {asked} chooses among the study's complete trials and it has {complete}: its ensemble "
            "is that trial alone; add trials (--n-trials) for an ensemble that differs from it"
        )
    return size, None


@dataclass
class _Trained:
    """One configuration retrained with the final seeds: per seed its validation and test predictions,
    its model and training seconds."""

    validation: dict[int, np.ndarray] = field(default_factory=dict)
    test: dict[int, np.ndarray] = field(default_factory=dict)
    models: dict[int, Any] = field(default_factory=dict)
    seconds: dict[int, float] = field(default_factory=dict)


def _retrain(trials: Sequence[Any], data: StudyData, run: EnsembleRun, label: str) -> dict[int, _Trained]:
    """Each trial's configuration trained with each final seed (those whose models share their shapes
    together): the final evaluation's model where it trained that one (the same configuration, seed and data
    train to the same weights), else trained here."""
    bar = BarSpec(f"ensemble {label}", enabled=run.progress, transient=True)
    reuse = [run.reuse.get(trial.number, {}) for trial in trials]
    configs = [trial_config(trial) for trial in trials]
    trained = train_configs(data, configs, run.seeds, device=run.device, bar=bar, reuse=reuse)
    return {trial.number: _scored(seeds, data) for trial, seeds in zip(trials, trained, strict=True)}


def _scored(trained_seeds: Iterable[Any], data: StudyData) -> _Trained:
    """Each seed's model, seconds and validation and test predictions."""
    out = _Trained()
    for trained in trained_seeds:
        seed = trained.seed
        out.models[seed], out.seconds[seed] = trained.model, trained.seconds
        out.validation[seed] = predictions_of(trained.model, data.validation[0])
        out.test[seed] = predictions_of(trained.model, data.test_split()[0])
    return out


def _best_layer_scores(data: StudyData, run: EnsembleRun, model_name: str) -> list[float]:
    """The best single layer (a linear probe per layer, chosen on validation) scored on test per seed."""
    bucket = model_size_bucket(model_name, data.hidden_size)
    recommended = recommended_config("best-layer", model_size_hint=bucket, source="regenerated")
    assert isinstance(recommended, BestLayerConfig)
    config: BestLayerConfig = recommended
    if run.max_epochs is not None and config.epochs > run.max_epochs:
        config = dataclasses.replace(config, epochs=run.max_epochs)
    scores = []
    test_x, _ = data.test_split()
    for seed in run.seeds:
        _, result, _ = select_best_layer(config, data.train, data.validation, **data.train_options(seed, run.device))
        scores.append(_test_score(predictions_of(result.model, test_x), data))
    return scores


def _single_scores(
    study: optuna.Study, record: StudyRecord, data: StudyData, run: EnsembleRun, trained: dict[int, _Trained]
) -> tuple[int, list[float], int | None, list[float] | None]:
    """(selected trial, its test scores, start trial, its test scores) with the run's seeds: the final
    evaluation's under the same rule, seeds and epoch cap, else retrained here."""
    final = record.by_rule.get(run.select)
    selected = select_trial(study, run.select).number
    if final is not None and final.matches(selected, run.seeds, run.max_epochs) and final.start_test_scores:
        return selected, list(final.test_scores), final.start_trial, list(final.start_test_scores)
    start = start_trial(study)
    numbers = [selected] + ([] if start is None else [start.number])
    for number in numbers:
        if number not in trained:
            trained.update(_retrain([_trial(study, number)], data, run, f"trial {number}"))

    def scores(number: int) -> list[float]:
        return [_test_score(trained[number].test[seed], data) for seed in run.seeds]

    if start is None:
        return selected, scores(selected), None, None
    return selected, scores(selected), start.number, scores(start.number)


def _test_score(predictions: np.ndarray, data: StudyData) -> float:
    return prediction_score(predictions, np.asarray(data.test_split()[1]), data.task_kind, data.metric)


def _size_scores(
    size: int, picks: list[int], val_score: float, trained: Mapping[int, _Trained], data: StudyData, run: EnsembleRun
) -> EnsembleSize:
    members = Counter(picks[:size])
    val_targets = np.asarray(data.validation[1])
    test, validation = [], []
    for seed in run.seeds:
        test.append(_test_score(mixed({n: trained[n].test[seed] for n in members}, members), data))
        predictions = mixed({n: trained[n].validation[seed] for n in members}, members)
        validation.append(prediction_score(predictions, val_targets, data.task_kind, data.metric))
    mean = statistics.fmean(test)
    return EnsembleSize(
        size=size,
        members={str(n): c for n, c in sorted(members.items())},
        val_score=val_score,
        test_scores=test,
        test_mean=mean,
        test_std=statistics.stdev(test) if len(test) > 1 else 0.0,
        val_scores=validation,
        val_test_gap=val_score - mean,
    )


def _trial_seconds(trials: Sequence[FrozenTrial]) -> dict[int, float]:
    """Trial number -> the seconds its search trial took, for the trials that recorded them."""
    return {t.number: float(s) for t in trials if (s := trial_record(t).seconds) is not None and s > 0}


def slow_trials(study: optuna.Study, trials: Sequence[FrozenTrial], run: EnsembleRun) -> dict[int, float]:
    """The ``trials`` left out of the selection for their cost (trial -> its search seconds): those that took
    over ``run.slow_factor`` times the median trial and over :data:`SLOW_MEMBER_SECONDS`. The selected trial
    and the start are kept: the final evaluation trains them in any case."""
    timed = _trial_seconds(trials)
    if run.slow_factor is None or len(timed) < 3:
        return {}
    limit = max(run.slow_factor * statistics.median(timed.values()), SLOW_MEMBER_SECONDS)
    start = start_trial(study)
    kept = {select_trial(study, run.select).number, None if start is None else start.number}
    return {n: seconds for n, seconds in timed.items() if seconds > limit and n not in kept}


def _greedy(
    study: optuna.Study, data: StudyData, run: EnsembleRun
) -> tuple[list[int], dict[int, float], list[int], dict[int, float]]:
    """The picks of the largest size (trial numbers), the validation score of each prefix size, the
    complete trials chosen from and those of them left out for their cost (trial -> search seconds)."""
    trials = complete_trials(study)
    predictions = validation_predictions(study, trials, run.artifact_store)
    slow = slow_trials(study, trials, run)
    if slow:
        logger.warning(
            "%s: trial(s) %s left out of the ensemble: each took over %gx the median search trial (%s s), and "
            "retraining it with %d seeds would cost more than the rest of the ensemble",
            study.study_name,
            ", ".join(f"{n} ({s:.0f} s)" for n, s in sorted(slow.items())),
            run.slow_factor,
            f"{statistics.median(_trial_seconds(trials).values()):.1f}",
            len(run.seeds),
        )
    numbers = [t.number for t in trials if t.number in predictions and t.number not in slow]
    targets = np.asarray(data.validation[1])
    maximize = study_record(study).maximize

    def score(mean: np.ndarray) -> float:
        return prediction_score(mean, targets, data.task_kind, data.metric)

    indices = greedy_selection([predictions[n] for n in numbers], score, max(run.all_sizes), maximize=maximize)
    picks = [numbers[i] for i in indices]
    val_scores = {
        size: score(mixed({n: predictions[n] for n in set(picks[:size])}, Counter(picks[:size])))
        for size in run.all_sizes
    }
    return picks, val_scores, [t.number for t in trials], slow


def ensemble_evaluation(
    study: optuna.Study,
    data: StudyData,
    run: EnsembleRun,
    *,
    keep: MutableMapping[int, dict[int, tuple[TrainedModel, float]]] | None = None,
) -> EnsembleRecord:
    """Select ensembles greedily on the trials' validation predictions (backfilled where missing), retrain
    their members with the final seeds, score them on test beside the selected trial, the starting
    configuration and the best single layer; store and return the :class:`EnsembleRecord`.

    ``keep`` (trial -> seed -> (model, seconds)) receives every model of the final seeds used here, so that
    a later stage of the run (the leaderboard) trains none of them again."""
    record = study_record(study)
    check_ensemble_study(record, run.size)
    backfill_predictions(
        study, data, run.artifact_store, seed=run.prediction_seed, device=run.device, progress=run.progress
    )
    picks, val_scores, candidates, slow = _greedy(study, data, run)
    by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
    trained = _retrain([by_number[number] for number in dict.fromkeys(picks)], data, run, "members")
    selected, selected_scores, start, start_scores = _single_scores(study, record, data, run, trained)
    # decided before ``keep`` takes this stage's models (it may be ``run.reuse`` itself)
    reused = sorted(n for n in trained if set(run.seeds) <= set(run.reuse.get(n, {})))
    if keep is not None:
        keep.update({n: {s: (m.models[s], m.seconds[s]) for s in m.models} for n, m in trained.items()})
    sizes = {str(size): _size_scores(size, picks, val_scores[size], trained, data, run) for size in run.all_sizes}
    out = EnsembleRecord(
        size=run.size,
        picks=picks,
        sizes=sizes,
        seeds=list(run.seeds),
        max_epochs=run.max_epochs,
        select=run.select,
        selected_trial=selected,
        selected_test_scores=selected_scores,
        start_trial=start,
        start_test_scores=start_scores,
        best_layer_test_scores=_best_layer_scores(data, run, "" if record.identity is None else record.identity.model),
        prediction_seed=run.prediction_seed,
        mix=MIX_RULE[data.task_kind],
        candidates=candidates,
        reused=reused,
        left_out={str(n): round(seconds, 3) for n, seconds in sorted(slow.items())},
    )
    out = _with_model(study, record, out, trained, data, run)
    save_ensemble(study, out)
    return out


def _with_model(
    study: optuna.Study,
    record: StudyRecord,
    out: EnsembleRecord,
    trained: Mapping[int, _Trained],
    data: StudyData,
    run: EnsembleRun,
) -> EnsembleRecord:
    """``out`` with the asked size's ensemble of its best seed by validation: its cost, speed and upload."""
    asked = out.sizes[str(run.size)]
    members = {int(n): c for n, c in asked.members.items()}
    best_seed = max(run.seeds, key=lambda s: (asked.val_scores[run.seeds.index(s)], -s))
    model = EnsembleModel([trained[n].models[best_seed] for n in members], list(members.values()))
    artifacts = _upload_ensemble(study, record, model, members, best_seed, run)
    single = trained[next(iter(members))].models[best_seed]
    return dataclasses.replace(
        out,
        member_seconds=statistics.fmean(sum(trained[n].seconds[s] for n in members) for s in run.seeds),
        latency_ms=round(measure_latency(model, data.validation[0]), 4),
        single_latency_ms=round(measure_latency(single, data.validation[0]), 4),
        artifacts=artifacts,
        artifact_seed=best_seed if artifacts else None,
    )


def ensemble_is_current(study: optuna.Study, run: EnsembleRun) -> bool:
    """Whether the stored ensemble evaluation already holds every size of ``run`` with its seeds and epoch cap,
    chosen from the study's complete trials as they are now (a resumed study's new trials make it stale)."""
    stored = ensemble_record(study)
    return (
        stored is not None
        and stored.size == run.size
        and all(stored.matches(size, run.seeds, run.max_epochs, run.select) for size in run.all_sizes)
        and (stored.candidates is None or stored.candidates == [t.number for t in complete_trials(study)])
    )


def _upload_ensemble(
    study: optuna.Study, record: StudyRecord, model: Any, members: Mapping[int, int], seed: int, run: EnsembleRun
) -> dict[str, str]:
    """Upload the ensemble's weights (safetensors) and a JSON of its members, mix and provenance."""
    if run.artifact_store is None:
        return {}
    data, identity = record.data, record.identity
    first = model.members[0]
    meta = {
        "ensemble": [
            {"trial": number, "count": count, "config": trial_config(_trial(study, number)).to_dict()}
            for number, count in members.items()
        ],
        "mix": MIX_RULE[first.task_kind],
        "model": None if identity is None else identity.model,
        "task": None if identity is None else identity.task,
        "task_kind": first.task_kind,
        "metric": None if data is None else data.metric,
        "num_layers": int(first.aggregator.num_layers),
        "hidden_size": int(first.aggregator.hidden_in),
        "num_classes": int(first.head.out_features) if first.task_kind == "classification" else None,
        "score_range": first.score_range,
        "seed": seed,
        "ilge_search_version": __version__,
        "torch_version": torch.__version__,
    }
    return upload_weights(study, model, meta, run.artifact_store, ("ensemble.safetensors", "ensemble.json"))


def _trial(study: optuna.Study, number: int) -> FrozenTrial:
    return next(t for t in study.get_trials(deepcopy=False) if t.number == number)
