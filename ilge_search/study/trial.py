"""One trial: suggest a config, train it with the one engine, report and record what it did.

Each trial records which process runs it before the objective starts
(:func:`~ilge_search.record.worker.owner_stamping`) and its :class:`~ilge_search.record.TrialRecord` (config,
validation score, parameters, epochs, seconds, forward latency, the best-layer baseline's layer), and reports
every epoch's validation score to the pruner. A multi-objective study gets one value per objective back (no
intermediate values: Optuna cannot prune it). With ``--cv K`` (:mod:`.folds`) the objective is the mean of the
per-fold scores (``fold_scores``), and the intermediate value at step ``fold * epochs + epoch`` is that fold's
score after that epoch.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
import torch
from optuna.artifacts import FileSystemArtifactStore

from .. import engine  # its training functions looked up per call: tests count them
from ..embeddings.models import model_size_bucket, resolve_device
from ..encoders import encoder_families
from ..encoders.configs import BestLayerConfig
from ..engine import build_model
from ..engine.ensemble import predictions_of
from ..record import save_trial, save_trial_predictions, study_record, trial_config, trial_record, warm_start_order
from ..record.artifacts import upload_predictions
from ..storage import quiet_optuna_warnings, storage_fault
from ..tuning import recommended_config, suggest_config
from .auto import is_auto, method_params, suggest_study_config
from .folds import cross_validate, stratified_folds
from .notes import write_live_note
from .objectives import measure_latency

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import optuna

    from ..encoders.configs import EncoderConfig
    from ..engine import TrainResult
    from ..record import DataRecord, Identity, WarmStartRecord
    from ..storage import Storage
    from .data import StudyData
    from .shapes import TrainedModel

__all__ = [
    "TrialObjective",
    "recommended_params",
    "config_params",
    "warm_start_params",
    "suggest_capped",
    "starting_params",
    "catchable_errors",
    "quiet_interrupt_tracebacks",
]


def suggest_capped(
    trial: optuna.Trial | optuna.trial.FixedTrial,
    encoder: str,
    max_epochs: int | None,
    methods: Sequence[str] | None = None,
) -> EncoderConfig:
    """``suggest_config(trial, encoder)`` (for an auto study, over ``methods``:
    :func:`~ilge_search.study.auto.suggest_study_config`) with ``epochs`` capped at ``max_epochs``."""

    config = suggest_study_config(trial, encoder, methods)
    if max_epochs is not None and config.epochs > max_epochs:
        config = config.replace(epochs=max_epochs)
    return config


def recommended_params(encoder: str, hidden_size: int | None = None, model: str | None = None) -> dict[str, object]:
    """The encoder's ``recommended_config`` as Optuna params of ``suggest_config``'s search space.

    The size bucket is :func:`ilge_search.embeddings.models.model_size_bucket` of ``model``
    (a model outside the table, or none, is bucketed by ``hidden_size``). The
    config's fields are offered to ``suggest_config`` through a ``FixedTrial``;
    what it asks for is what a study enqueues, so the first trial runs exactly
    the recommended configuration.
    """

    # no model name: "" is in no table row, so the hidden size decides
    bucket = model_size_bucket("" if model is None else model, hidden_size)
    return config_params(encoder, recommended_config(encoder, model_size_hint=bucket, source="regenerated").to_dict())


def starting_params(
    encoder: str, methods: Sequence[str] | None, hidden_size: int | None, model: str | None
) -> list[dict[str, Any]]:
    """What a new study enqueues before the sampler takes over: its encoder's starting configuration, or for
    an auto study each method's, in the order of ``methods`` (the first is the study's recommended start)."""

    if not is_auto(encoder):
        return [recommended_params(encoder, hidden_size, model)]
    return [method_params(method, recommended_params(method, hidden_size, model)) for method in methods or ()]


def config_params(encoder: str, config: Mapping[str, object]) -> dict[str, object]:
    """A config dict as the Optuna params ``suggest_config`` asks for (what a study enqueues to train it)."""

    fixed = optuna.trial.FixedTrial({k: v for k, v in config.items() if k != "family"})
    with quiet_optuna_warnings():
        suggest_config(fixed, encoder)
    return dict(fixed.params)


def warm_start_params(
    storage: Storage | None, encoder: str, count: int, *, hidden_size: int | None, model: str, task: str
) -> WarmStartRecord:
    """The first ``count`` members of the warm-start order (the portfolio, then the other candidates by mean
    normalised validation score) that differ from the starting configuration, with their Optuna params (``run
    --warm-start``): from the storage's portfolio, chosen again without ``task``'s problems when they were among
    its problems, else the shipped one without members that came only from ``task``
    (:func:`ilge_search.record.warm_start_order`).

    Raises:
        ValueError: a baseline encoder, no portfolio with that many members, or a stored order chosen on
            ``task``'s own problems.
    """

    if encoder not in encoder_families():
        raise ValueError(
            f"--warm-start enqueues portfolio members of an ILGE family ({', '.join(encoder_families())}); "
            f"{encoder} has none: run it without --warm-start"
        )
    bucket = model_size_bucket(model, hidden_size)
    order = warm_start_order(storage, encoder, bucket, task)
    start = recommended_params(encoder, hidden_size, model)
    members = [dataclasses.replace(m, params=config_params(encoder, m.config)) for m in order.members]
    members = [m for m in members if m.params != start]
    if len(members) < count:
        without = f" (without task {order.left_out_task}'s problems)" if order.left_out_task else ""
        skipped = f" (skipped, from task {task} only: {', '.join(order.skipped)})" if order.skipped else ""
        raise ValueError(
            f"--warm-start {count}: {order.origin}{without} has {len(members)} {encoder} ({bucket}) members besides "
            f"the starting configuration{skipped}; run `ilge-search portfolio --storage URL --family "
            f"{encoder}` first (a larger --top-k gives more candidates), or ask for fewer"
        )
    return order.with_members(members[:count])


class TrialObjective:
    """The Optuna objective of one encoder on one study's data: returns the best validation metric."""

    def __init__(self, encoder: str, data: StudyData, *, seed: int, device: str, max_epochs: int | None) -> None:
        self.encoder = encoder
        self.data = data
        self.seed = seed
        self.device = device
        self.max_epochs = max_epochs
        self._folds: tuple[tuple[int, int], list[np.ndarray]] | None = None

    def folds(self, identity: Identity | None) -> list[np.ndarray] | None:
        """The study's folds (``None`` without ``cv``), computed once per process from its identity."""

        if identity is None or not identity.cv:
            return None
        key = (int(identity.cv), int(identity.data_seed or 0))
        if self._folds is None or self._folds[0] != key:
            self._folds = (
                key,
                stratified_folds(self.data.train[1], key[0], seed=key[1], task_kind=self.data.task_kind),
            )
        return self._folds[1]

    def __call__(self, trial: optuna.Trial) -> float | tuple[float, ...]:

        data = self.data
        study = study_record(trial.study)
        methods = study.identity.methods if study.identity is not None else None
        config = suggest_capped(trial, self.encoder, self.max_epochs, methods)
        save_trial(trial, config=config.to_dict())  # recorded first, so failed trials show it too
        common: dict[str, Any] = dict(
            task_kind=data.task_kind, num_classes=data.num_classes, seed=self.seed, device=self.device
        )

        folds = self.folds(study.identity)
        objectives = study.objectives
        # an auto study's method starts run to the end: the pruner compares across methods, and a method that
        # learns slowly would lose its one trial to faster ones
        keep = is_auto(self.encoder) and trial_record(trial).recommended

        def report(step: int, value: float) -> None:
            if len(objectives) > 1:
                return  # Optuna cannot prune a multi-objective study, nor take its intermediate values
            trial.report(float(value), step)
            if not keep and trial.should_prune():
                fold, epoch = divmod(step - 1, config.epochs) if folds is not None else (None, step - 1)
                save_trial(trial, epochs_run=int(epoch + 1))
                where = f"epoch {epoch + 1}" + ("" if fold is None else f" of fold {fold + 1}")
                if fold is not None:
                    save_trial(trial, pruned_fold=int(fold + 1))
                write_live_note(trial, data.metric, state="pruned")
                raise optuna.TrialPruned(f"pruned at {where} ({data.metric} {value:.4f})")

        if folds is not None:
            score, params = self._cross_validated(trial, config, folds, report, common)
            return self._values(trial, objectives, score, params, None)
        if config.family == "best-layer":
            # the layer is chosen on validation inside the trial; the search covers the recipe
            assert isinstance(config, BestLayerConfig)
            started, cpu_started = time.perf_counter(), time.process_time()
            layer, result, scores = engine.select_best_layer(config, data.train, data.validation, **common)
            # its training is every layer's probe: what a retraining of it costs (the stages' time budget)
            result = dataclasses.replace(
                result, seconds=time.perf_counter() - started, cpu_seconds=time.process_time() - cpu_started
            )
            config = config.replace(layer=layer)
            save_trial(trial, config=config.to_dict(), layer=int(layer), layer_scores=[float(s) for s in scores])
        else:
            result = engine.train_encoder(config, data.train, data.validation, epoch_callback=report, **common)
        _save_result(trial, result, data.task_kind)
        self._keep_predictions(trial, study.data, result.model)
        return self._values(
            trial, objectives, float(result.best_val_metric), int(result.num_trainable_params), result.model
        )

    def _keep_predictions(self, trial: optuna.Trial, stored: DataRecord | None, model: TrainedModel) -> None:
        """Store the trained model's validation predictions (float16) for ensemble selection; a study
        without an artifact folder, or one that cannot be written, keeps none (they can be backfilled)."""

        folder = None if stored is None else stored.artifact_dir
        if not folder or model.task_kind not in ("classification", "similarity"):
            return
        try:
            Path(folder).mkdir(parents=True, exist_ok=True)
            store = FileSystemArtifactStore(folder)
            artifact = upload_predictions(trial, predictions_of(model, self.data.validation[0]), store)
        except OSError as exc:
            logging.getLogger(__name__).warning(
                "trial %d: validation predictions not stored (%s); `ilge-search ensemble` will backfill them",
                trial.number,
                exc.strerror or exc,
            )
            return
        save_trial_predictions(trial, artifact)

    def _values(
        self, trial: optuna.Trial, objectives: Sequence[str], score: float, params: int, model: TrainedModel | None
    ) -> float | tuple[float, ...]:
        """Record the latency, write the live note and return the trial's value(s), one per objective."""

        data = self.data
        if model is None:  # cross-validated: no single trained model; the forward time is the architecture's
            config = trial_config(trial)
            model = build_model(
                config, data.num_layers, data.hidden_size, data.task_kind, num_classes=data.num_classes
            ).to(resolve_device(self.device))
        latency = measure_latency(model, data.validation[0])
        save_trial(trial, latency_ms=round(latency, 4))
        write_live_note(trial, data.metric)
        by_name = {"score": float(score), "params": float(params), "latency": float(latency)}
        if len(objectives) == 1:
            return by_name["score"]
        return tuple(by_name[name] for name in objectives)

    def _cross_validated(
        self,
        trial: optuna.Trial,
        config: EncoderConfig,
        folds: list[np.ndarray],
        report: Callable[[int, float], None],
        common: dict[str, Any],
    ) -> tuple[float, int]:

        result = cross_validate(config, self.data.train, folds, report=report, **common)
        if result.layer is not None:
            config = config.replace(layer=result.layer)
            save_trial(trial, config=config.to_dict(), layer=int(result.layer), layer_scores=result.layer_scores)
        save_trial(
            trial,
            fold_scores=result.fold_scores,
            fold_best_epochs=result.best_epochs,
            val_metric=result.mean,
            params=result.num_trainable_params,
            epochs_run=result.epochs_run[-1],
            best_epoch=result.best_epochs[-1],
            seconds=round(result.seconds, 3),
        )
        return result.mean, int(result.num_trainable_params)


class _NoInterruptTraceback(logging.Filter):
    """Ctrl-C and a full or read-only storage are not crashes: keep Optuna's "trial failed" line, drop its
    traceback (the run ends with one line that says what to do)."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if error is not None and (isinstance(error, KeyboardInterrupt) or storage_fault(error) is not None):
            record.exc_info = None
            record.exc_text = None
        return True


def quiet_interrupt_tracebacks() -> None:
    """Drop the traceback of a Ctrl-C from Optuna's log lines (in this process)."""
    for handler in logging.getLogger("optuna").handlers:
        if not any(isinstance(f, _NoInterruptTraceback) for f in handler.filters):
            handler.addFilter(_NoInterruptTraceback())


def catchable_errors() -> tuple[type, ...]:
    """Errors that fail one trial, not the study: a configuration too large for the accelerator."""

    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom,) if oom is not None else ()


def _save_result(trial: optuna.Trial, result: TrainResult, task_kind: str) -> None:
    """What a trial's training gave: its score, size, epochs and times (a tagger's macro-F1 too)."""
    save_trial(
        trial,
        val_metric=float(result.best_val_metric),
        params=int(result.num_trainable_params),
        epochs_run=int(result.epochs_run),
        best_epoch=int(result.best_epoch),
        seconds=round(float(result.seconds), 3),
        cpu_seconds=round(float(result.cpu_seconds), 3),
    )
    best = result.history[result.best_epoch - 1] if 0 < result.best_epoch <= len(result.history) else {}
    if task_kind == "tagging" and "val_macro_f1" in best:
        save_trial(trial, val_macro_f1=float(best["val_macro_f1"]))
