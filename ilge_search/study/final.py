"""The final evaluation: the selected trial's config retrained per seed and scored on test once.

The trial is the selection rule's (``--select``, :mod:`.selection`); what was measured is the study's
:class:`~ilge_search.record.FinalRecord`: each seed's test and validation scores (a tagging study's test
macro-F1 too), the best seed's weights by validation (``artifacts``), zero-shot scores on other STS tasks, the
selected trial's objective and its gap to test, and the starting configuration (trial 0) retrained with the
same seeds for the ``search_gain``. Each rule's evaluation is kept (``by_rule``), so switching back to a
current one trains nothing.

A multi-objective study retrains its final front instead: up to ``final_front`` trials of its Pareto front
(:func:`~.selection.front_trials`), one :class:`~ilge_search.record.FrontMember` each, the record's other
fields those of its best-score member. Under the paper protocol (:mod:`.protocol`, docs/protocols.md) each
model is read out as MTEB would, a parameter-free baseline untrained, and ``val_test_gap`` is ``None`` (the
trials' objective is a matched score).
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from optuna.artifacts import upload_artifact
from safetensors.torch import save_file

from .._version import __version__
from ..engine import evaluate
from ..progress import BarSpec, steps
from ..record import (
    DEFAULT_PROTOCOL,
    FinalRecord,
    FrontMember,
    Identity,
    StudyRecord,
    ZeroShotScores,
    save_final,
    study_record,
    trial_config,
    trial_record,
)
from ..storage import StorageError, count_trials
from .limits import PAIRED_KINDS
from .objectives import is_multi_objective, objective_values
from .predictions import model_predictions, read_test_predictions, upload_test_predictions
from .protocol import PaperProtocol, cosine_spearman, is_parameter_free, logistic_readout, paper_vectors
from .retraining import train_seeds
from .selection import (
    DEFAULT_FINAL_FRONT,
    DEFAULT_SELECT,
    FRONT_RULE,
    front_trials,
    select_trial,
    start_trial,
    study_front,
)

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import optuna
    from optuna.trial import FrozenTrial
    from torch import nn

    from ..encoders.configs import EncoderConfig
    from ..engine.core import Dataset
    from ..engine.metrics import ArrayLike
    from .data import StudyData
    from .shapes import Features, TrainedModel

__all__ = ["FinalModels", "FinalSettings", "final_is_current", "final_evaluation", "upload_weights"]

ZeroShotData = Mapping[str, "Dataset"]  # task name -> (features, gold scores)
# what a final evaluation trained, for the ensemble stage to reuse: trial -> seed -> (model, training seconds)
_Best = tuple["TrainedModel | None", "int | None", float]  # the best seed's model, the seed, its validation score
FinalModels = dict[int, dict[int, tuple["TrainedModel", float]]]


def final_is_current(
    study: optuna.Study,
    seeds: list[int],
    max_epochs: int | None,
    select: str = DEFAULT_SELECT,
    final_front: int = DEFAULT_FINAL_FRONT,
) -> bool:
    """Whether ``study``'s stored final scores are those a final evaluation would produce now.

    True when the study has a complete trial and its final evaluation exists
    under the rule ``select``, for the trial that rule selects now, with the
    same seed list and the same ``max_epochs``. For a multi-objective study:
    its final front holds the trials
    :func:`~ilge_search.study.selection.front_trials` picks now out of
    ``final_front``, with those seeds and that epoch cap (``select`` does not
    apply). A tagging study's final evaluation without test macro-F1 is not
    current. The runner and sweeps both ask this.
    """
    if not count_trials(study, ("COMPLETE",)):
        return False
    record = study_record(study)
    final = record.final
    if final is None:
        return False
    if _lacks_macro_f1(record, final):
        return False
    if is_multi_objective(study):
        wanted = [t.number for t in front_trials(study_front(study), final_front)]
        return (
            final.select == FRONT_RULE
            and [member.trial for member in final.front] == wanted
            and list(final.seeds) == list(seeds)
            and final.max_epochs == max_epochs
        )
    if final.select != select:
        return False
    return final.matches(select_trial(study, select).number, seeds, max_epochs)


@dataclass(frozen=True)
class _Retraining:
    """How a final evaluation retrains a configuration: on which data and seeds, where, and how it scores."""

    identity: Identity | None  # names the model and task in the uploaded config
    data: StudyData
    seeds: list[int]
    device: str
    max_epochs: int | None
    encoder: str
    progress: bool
    readout: PaperProtocol | None  # None: the matched protocol
    zero_shot: ZeroShotData
    artifact_store: Any

    def protocol_record(self) -> dict[str, object]:
        """How the test scores are measured, as the record's ``protocol``."""
        return {"protocol": DEFAULT_PROTOCOL} if self.readout is None else self.readout.record()


def _upload_artifacts(
    study: optuna.Study, run: _Retraining, config: EncoderConfig, best: _Best, trial: int
) -> dict[str, str]:
    """Upload the weights (safetensors) and a JSON of config, labels and provenance; their artifact ids."""

    model, seed, val_metric = best
    assert model is not None  # a final evaluation uploads only a trained model
    data = run.data
    meta = {
        "config": config.to_dict(),
        "model": None if run.identity is None else run.identity.model,
        "task": None if run.identity is None else run.identity.task,
        "task_kind": data.task_kind,
        "metric": data.metric,
        "num_layers": data.num_layers,
        "hidden_size": data.hidden_size,
        "num_classes": data.num_classes,
        "label_names": data.label_names,
        "score_range": getattr(model, "score_range", None),
        "seed": seed,
        "val_metric": val_metric,
        "trial": trial,
        "ilge_search_version": __version__,
        "torch_version": torch.__version__,
    }
    return upload_weights(study, model, meta, run.artifact_store, ("model.safetensors", "config.json"))


def upload_weights(
    study: optuna.Study, model: nn.Module, meta: Mapping[str, object], artifact_store: Any, files: tuple[str, str]
) -> dict[str, str]:
    """Upload ``model``'s weights (safetensors) and ``meta`` (JSON), named ``files``, as artifacts of ``study``;
    their ids."""

    with tempfile.TemporaryDirectory(prefix="ilge-artifacts-") as tmp:
        weights, config = Path(tmp, files[0]), Path(tmp, files[1])
        save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, str(weights))
        config.write_text(json.dumps(meta, indent=2), encoding="utf-8")
        return {
            "weights": upload_artifact(study_or_trial=study, file_path=str(weights), artifact_store=artifact_store),
            "config": upload_artifact(
                study_or_trial=study, file_path=str(config), artifact_store=artifact_store, mimetype="application/json"
            ),
        }


@dataclass
class _Scores:
    """What a final evaluation measured: per seed, and the best seed's model by validation."""

    test: list[float] = field(default_factory=list)
    validation: list[float] = field(default_factory=list)
    zero_shot: dict[str, list[float]] = field(default_factory=dict)
    experiments: list[list[float]] = field(default_factory=list)  # paper protocol: each seed's draws on test
    macro_f1: list[float] = field(default_factory=list)  # tagging: each seed's macro-F1 over the test words
    predictions: list[np.ndarray] = field(default_factory=list)  # each seed's test class ids or scores
    best: _Best = (None, None, -math.inf)  # (model, seed, validation score)
    models: dict[int, tuple[TrainedModel, float]] = field(default_factory=dict)  # seed -> (trained model, seconds)

    def add(self, test: float, validation: float, zero: Mapping[str, float], draws: Sequence[float]) -> None:
        """One seed's scores: on test, on validation, on each zero-shot task, and each draw's (paper protocol)."""
        self.test.append(float(test))
        self.validation.append(float(validation))
        self.experiments.append(list(draws))
        for name, value in zero.items():
            self.zero_shot[name].append(float(value))


def _paper_readout(
    data: StudyData,
    zero_shot: ZeroShotData,
    readout: PaperProtocol,
    *,
    model: TrainedModel | None = None,
    config: EncoderConfig | None = None,
) -> tuple[float, float, dict[str, float], list[float]]:
    """(test score, validation score, zero-shot scores, test score of each draw) of one final model, or of
    a parameter-free baseline's ``config`` untrained, under the paper protocol."""

    def vectors(features: Features) -> np.ndarray:
        return paper_vectors(features, model=model, config=config)

    def pair_spearman(features: Features, gold: ArrayLike) -> float:
        pairs = vectors(features)  # (N, 2, E): the two sentences' vectors
        return cosine_spearman(pairs[:, 0], pairs[:, 1], gold)

    zero = {name: pair_spearman(features, labels) for name, (features, labels) in zero_shot.items()}
    test_split = data.test_split()
    if data.task_kind == "similarity":
        return pair_spearman(*test_split), pair_spearman(*data.validation), zero, []
    scores = logistic_readout(
        (vectors(data.train[0]), np.asarray(data.train[1])),
        {
            "test": (vectors(test_split[0]), np.asarray(test_split[1])),
            "validation": (vectors(data.validation[0]), np.asarray(data.validation[1])),
        },
        readout,
    )
    return statistics.fmean(scores["test"]), statistics.fmean(scores["validation"]), zero, scores["test"]


def _retrain(config: EncoderConfig, run: _Retraining, *, label: str, zero_shot: ZeroShotData) -> _Scores:
    """Train ``config`` once per seed and score it on test (its head, or the paper protocol's readout);
    ``label`` names the progress bar."""

    data, readout, seeds = run.data, run.readout, run.seeds
    out = _Scores(zero_shot={name: [] for name in zero_shot})
    bar = BarSpec(f"final {label} ({len(seeds)} seeds)", enabled=run.progress, transient=True)
    if readout is not None and is_parameter_free(config):  # the paper scores the raw readout: nothing to train
        untrained = _paper_readout(data, zero_shot, readout, config=config)
        for _ in steps(seeds, bar):
            out.add(*untrained)
        return out
    for trained in train_seeds(data, config, seeds, device=run.device, bar=bar):
        out.models[trained.seed] = (trained.model, trained.seconds)
        if trained.val_score > out.best[2]:  # the artifact is the best seed by validation, never by test
            out.best = (trained.model, trained.seed, trained.val_score)
        if readout is not None:
            out.add(*_paper_readout(data, zero_shot, readout, model=trained.model))
            continue
        metrics = data.test_metrics(trained.model)
        if data.task_kind == "tagging":
            out.macro_f1.append(float(metrics["macro_f1"]))
        if data.task_kind in PAIRED_KINDS:  # what a paired interval against another model needs
            out.predictions.append(model_predictions(trained.model, data.test_split()[0]))
        zero = {
            name: float(evaluate(trained.model, features, labels, "similarity")["spearman"])
            for name, (features, labels) in zero_shot.items()
        }
        out.add(float(metrics[data.metric]), trained.val_score, zero, [])
    return out


@dataclass(frozen=True)
class _Start:
    """The starting configuration's trial, its test scores per seed, the models trained for them here (seed ->
    (model, seconds)) and its per-seed test predictions where they are at hand."""

    trial: int | None = None
    scores: list[float] | None = None
    models: dict[int, tuple[TrainedModel, float]] = field(default_factory=dict)
    predictions: list[np.ndarray] | None = None


def _start_scores(
    study: optuna.Study, record: StudyRecord, run: _Retraining, selected: FrozenTrial, top: _Scores
) -> _Start:
    """The starting configuration's test scores with the run's seeds: the selected trial's own when it is the
    start, else those stored by an earlier evaluation with the same seeds and epoch cap, else retrained."""
    start = start_trial(study)
    if start is None:
        return _Start()
    if start.number == selected.number:
        return _Start(start.number, list(top.test), predictions=top.predictions or None)
    for earlier in [record.final, *record.by_rule.values()]:
        if (
            earlier is not None
            and earlier.start_trial == start.number
            and list(earlier.seeds) == list(run.seeds)
            and earlier.max_epochs == run.max_epochs
            and earlier.start_test_scores
        ):
            stored = read_test_predictions(run.artifact_store, earlier.predictions) or {}
            kept = stored.get("start")
            return _Start(
                start.number, list(earlier.start_test_scores), predictions=None if kept is None else list(kept)
            )
    scores = _retrain(trial_config(start), run, label=f"{run.encoder} start", zero_shot={})
    return _Start(start.number, scores.test, scores.models, scores.predictions or None)


def _upload_predictions(study: optuna.Study, run: _Retraining, top: _Scores, start: _Start) -> str | None:
    """Store the selected trial's (and the start's, where known) per-seed test predictions; the artifact id
    (``None``: nothing to store, or no artifact store)."""
    if not top.predictions or run.artifact_store is None:
        return None

    arrays = {"truth": np.asarray(run.data.test_split()[1]), "selected": np.stack(top.predictions)}
    if start.predictions is not None and len(start.predictions) == len(top.predictions):
        arrays["start"] = np.stack(start.predictions)
    try:
        return upload_test_predictions(study, arrays, run.artifact_store, "final_test_predictions.npz")
    except OSError as exc:
        raise StorageError(
            f"cannot store the test predictions in the artifact store ({exc.strerror or exc}); "
            "free space there or pass another --artifact-dir"
        ) from exc


def _upload_best(
    study: optuna.Study, run: _Retraining, config: EncoderConfig, best: _Best, trial: int
) -> dict[str, str]:
    """Upload the best seed's weights; a full or read-only artifact folder is one clear error."""
    if run.artifact_store is None or best[0] is None:  # nothing to upload: no store, or nothing trained
        return {}
    try:
        return _upload_artifacts(study, run, config, best, trial)
    except OSError as exc:  # a full or read-only artifact folder: nothing of the final evaluation is stored
        raise StorageError(
            f"cannot store the best weights in the artifact store ({exc.strerror or exc}); "
            "free space there or pass another --artifact-dir, then rerun with --n-trials 0 "
            "to redo the final evaluation"
        ) from exc


def _std(scores: Sequence[float]) -> float:
    return statistics.stdev(scores) if len(scores) > 1 else 0.0


def _zero_shot_record(zero_shot_scores: Mapping[str, list[float]]) -> dict[str, ZeroShotScores]:
    return {
        name: ZeroShotScores(mean=statistics.fmean(scores), std=_std(scores), scores=scores)
        for name, scores in zero_shot_scores.items()
    }


def _with_start(
    study: optuna.Study,
    record: StudyRecord,
    run: _Retraining,
    top: FinalRecord,
    selected: FrozenTrial,
    measured: tuple[_Scores, FinalModels],
) -> FinalRecord:
    """``top`` with the starting configuration's scores, the search gain, the validation-to-test gap and the
    stored test predictions; ``measured``: the selected trial's scores (with their predictions) and the models
    trained, where the start's models go when it was retrained here."""
    scores, trained = measured
    start = _start_scores(study, record, run, selected, scores)
    if start.trial is not None and start.models:
        trained[start.trial] = start.models
    sign = 1.0 if record.maximize else -1.0
    start_mean = None if start.scores is None else statistics.fmean(start.scores)
    gap = None  # a matched objective against a paper-protocol test score would measure the protocol: no gap there
    if run.readout is None and top.selected_value is not None:
        gap = sign * (top.selected_value - top.test_mean)
    return dataclasses.replace(
        top,
        val_test_gap=gap,
        start_trial=start.trial,
        start_test_mean=start_mean,
        start_test_scores=start.scores,
        search_gain=None if start_mean is None else sign * (top.test_mean - start_mean),
        predictions=_upload_predictions(study, run, scores, start),
    )


def _front_member(
    trial: FrozenTrial, objectives: Sequence[str], scores: _Scores, artifacts: dict[str, str]
) -> FrontMember:
    record = trial_record(trial)
    values = objective_values(trial, objectives) or ()
    return FrontMember(
        trial=trial.number,
        config=dict(record.config or {}),
        values=dict(zip(objectives, values, strict=False)),
        params=record.params,
        latency_ms=record.latency_ms,
        val_score=float(trial.values[0]),  # a front trial is complete: its first value is its score
        test_mean=statistics.fmean(scores.test),
        test_std=_std(scores.test),
        test_scores=scores.test,
        val_scores=scores.validation,
        artifacts=artifacts,
        artifact_seed=scores.best[1],
    )


def _final_record(select: str, member: FrontMember, run: _Retraining, **more: Any) -> FinalRecord:
    """The final record of ``member``'s scores under the rule ``select``, with the record's ``more`` fields."""
    return FinalRecord(
        select=select,
        trial=member.trial,
        config=member.config,
        seeds=list(run.seeds),
        test_scores=member.test_scores,
        test_mean=member.test_mean,
        test_std=member.test_std,
        val_scores=member.val_scores,
        max_epochs=run.max_epochs,
        artifacts=member.artifacts,
        artifact_seed=member.artifact_seed,
        selected_value=member.val_score,
        **more,
    )


def _front_evaluation(study: optuna.Study, record: StudyRecord, run: _Retraining, final_front: int) -> None:
    """A multi-objective study's final evaluation: each trial of its final front retrained per seed."""
    front = study_front(study)
    chosen = front_trials(front, final_front)
    kept = {}  # members of an earlier evaluation with the same seeds and epoch cap: the same scores again
    earlier = record.final
    if earlier is not None and list(earlier.seeds) == list(run.seeds) and earlier.max_epochs == run.max_epochs:
        kept = {m.trial: m for m in earlier.front if m.artifacts or run.artifact_store is None}
    members: list[FrontMember] = []
    top_zero_shot: dict[str, list[float]] = {}
    # tagging: the top member's test macro-F1, kept with it when it is kept (members do not store it)
    top_macro_f1 = earlier.test_macro_f1 if kept and earlier is not None and earlier.trial == chosen[0].number else None
    for index, trial in enumerate(chosen):
        zero_shot = run.zero_shot if index == 0 else {}
        if trial.number in kept and not zero_shot:
            members.append(kept[trial.number])
            continue
        config = trial_config(trial)
        scores = _retrain(config, run, label=f"{run.encoder} front trial {trial.number}", zero_shot=zero_shot)
        if index == 0:
            top_zero_shot, top_macro_f1 = scores.zero_shot, scores.macro_f1 or None
        artifacts = _upload_best(study, run, config, scores.best, trial.number)
        members.append(_front_member(trial, record.objectives, scores, artifacts))
    final = _final_record(
        FRONT_RULE,
        members[0],
        run,
        protocol=run.protocol_record(),
        zero_shot=_zero_shot_record(top_zero_shot),
        front=members,
        front_k=final_front,
        front_size=len(front),
        test_macro_f1=top_macro_f1,
        test_macro_f1_mean=statistics.fmean(top_macro_f1) if top_macro_f1 else None,
    )
    top = _Scores(test=list(members[0].test_scores))  # no predictions: a front's are not stored
    save_final(study, _with_start(study, record, run, final, chosen[0], (top, {})), keep_by_rule=False)


def _lacks_macro_f1(record: StudyRecord, final: FinalRecord) -> bool:
    """A tagging study's evaluation stored before test macro-F1 was recorded: redone rather than kept."""
    return record.data is not None and record.data.task_kind == "tagging" and final.test_macro_f1 is None


def _restore_kept(study: optuna.Study, record: StudyRecord, run: _Retraining, selected: int, select: str) -> bool:
    """Store again an earlier evaluation of the ``selected`` trial with the run's seeds and epoch cap, as
    ``select``'s (the same trial, seeds and epoch cap retrain to the same scores); whether there was one."""
    # the rule's own evaluation first, then one another rule made of the same trial
    for rule in sorted(record.by_rule, key=lambda name: name != select):
        kept = record.by_rule[rule]
        if _lacks_macro_f1(record, kept):
            continue
        if kept.matches(selected, run.seeds, run.max_epochs) and (kept.artifacts or run.artifact_store is None):
            save_final(study, dataclasses.replace(kept, select=select))
            return True
    return False


def _selected_evaluation(study: optuna.Study, record: StudyRecord, run: _Retraining, select: str) -> FinalModels:
    """A single-objective study's final evaluation: the trial ``select`` picks retrained per seed; the models
    it trained (none when an earlier evaluation was restored)."""
    selected = select_trial(study, select)
    if _restore_kept(study, record, run, selected.number, select):
        return {}
    config = trial_config(selected)
    scores = _retrain(config, run, label=run.encoder, zero_shot=run.zero_shot)
    trained: FinalModels = {selected.number: scores.models} if scores.models else {}
    artifacts = _upload_best(study, run, config, scores.best, selected.number)
    protocol = run.protocol_record()
    if run.readout is not None and run.data.task_kind == "classification":  # each seed's draws (similarity: none)
        protocol["test_experiment_scores"] = scores.experiments
    member = dataclasses.replace(_front_member(selected, (), scores, artifacts), config=config.to_dict())
    final = _final_record(
        select,
        member,
        run,
        protocol=protocol,
        zero_shot=_zero_shot_record(scores.zero_shot),
        test_macro_f1=scores.macro_f1 or None,
        test_macro_f1_mean=statistics.fmean(scores.macro_f1) if scores.macro_f1 else None,
    )
    save_final(study, _with_start(study, record, run, final, selected, (scores, trained)))
    return trained


@dataclass(frozen=True)
class FinalSettings:
    """What a final evaluation retrains with: the encoder, the seeds, where, the epoch cap, the selection rule
    (``select``; ``front``: how many Pareto-front trials a multi-objective study retrains) and whether to show
    progress."""

    encoder: str
    seeds: Sequence[int]
    device: str
    max_epochs: int | None
    select: str = DEFAULT_SELECT
    front: int = DEFAULT_FINAL_FRONT
    progress: bool = True


def final_evaluation(
    study: optuna.Study,
    data: StudyData,
    settings: FinalSettings,
    *,
    artifact_store: Any = None,
    zero_shot: ZeroShotData | None = None,
) -> FinalModels:
    """Retrain the trial ``settings.select`` picks with each seed; evaluate on test once per seed; store the scores.

    The starting configuration is retrained with the same seeds for the search
    gain (unless its scores are at hand). A rule whose earlier evaluation is
    still current is restored without training. ``artifact_store`` (e.g.
    ``Storage.artifact_store()``) receives the best seed's weights; ``None``
    uploads nothing. ``zero_shot`` maps other similarity tasks to their
    ``(features, scores)``. ``settings.max_epochs`` is recorded (what
    :func:`final_is_current` compares). A multi-objective study retrains up to
    ``settings.front`` trials of its Pareto front instead (``select`` does not apply).

    Returns the models trained here (trial -> seed -> (model, seconds)) of the selected trial and the start,
    which the ensemble stage reuses instead of training them again (a front evaluation returns none: such
    studies have no ensemble).
    """
    record = study_record(study)
    run = _Retraining(
        identity=record.identity,
        data=data,
        seeds=list(settings.seeds),
        device=settings.device,
        max_epochs=settings.max_epochs,
        encoder=settings.encoder,
        progress=settings.progress,
        readout=None if record.identity is None else PaperProtocol.for_identity(record.identity),
        zero_shot=zero_shot or {},
        artifact_store=artifact_store,
    )
    if is_multi_objective(study):
        _front_evaluation(study, record, run, settings.front)
        return {}
    return _selected_evaluation(study, record, run, settings.select)
