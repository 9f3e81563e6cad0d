"""Cross-validated trials: K seeded stratified folds of a study's training data, and one config scored on them.

With ``--cv K`` a trial's objective is the mean, over the K folds, of the best
validation score of the config trained on the other K - 1 folds
(:func:`cross_validate`); the per-fold scores are stored on the trial as
``fold_scores``. The folds depend only on the training labels, K and the
study's ``data_seed`` (:func:`stratified_folds`), so every trial of a study,
in any process, is scored on the same folds. Classification folds are
stratified on the label, similarity folds on the gold score cut into quantile
bins. The validation split is not used by the trials; the final evaluation
uses it for early stopping, as without ``--cv``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .. import engine  # its training functions looked up per call: tests count them
from ..encoders.configs import BestLayerConfig
from ..validation import check_int

if TYPE_CHECKING:
    from ..encoders.configs import EncoderConfig
    from ..engine import TrainResult
    from ..engine.core import Dataset
    from ..engine.metrics import ArrayLike

__all__ = ["MAX_SCORE_BINS", "check_cv", "stratified_folds", "CVResult", "cross_validate"]

MAX_SCORE_BINS = 10  # quantile bins of the gold score that stratify a similarity task's folds


def check_cv(cv: int | None, n_train: int | None = None) -> int | None:
    """``cv`` when it is ``None`` or a fold count from 2 up to ``n_train`` (when given)."""

    check_int("cv", cv, minimum=2, allow_none=True)
    if cv is not None and n_train is not None and cv > n_train:
        raise ValueError(f"--cv {cv} needs at least {cv} training examples; the training split has {n_train}")
    return cv


def stratified_folds(labels: ArrayLike, k: int, *, seed: int, task_kind: str = "classification") -> list[np.ndarray]:
    """The validation indices (sorted) of each of ``k`` folds of ``labels``.

    Each stratum (a class, or a quantile bin of similarity scores) is shuffled
    with ``seed`` and dealt round-robin onto the folds, continuing where the
    previous stratum stopped, so fold sizes differ by at most one and every
    fold holds each stratum in proportion.
    """
    check_cv(k)
    y = np.asarray(labels.cpu() if hasattr(labels, "cpu") else labels).reshape(-1)
    n = y.shape[0]
    check_cv(k, n)
    if task_kind == "similarity":
        bins = max(1, min(MAX_SCORE_BINS, n // k))
        ranks = np.argsort(np.argsort(y, kind="stable"), kind="stable")
        strata = ranks * bins // n
    else:
        strata = y
    rng = np.random.default_rng(seed)
    fold_of = np.empty(n, dtype=np.int64)
    offset = 0
    for stratum in np.unique(strata):
        members = rng.permutation(np.flatnonzero(strata == stratum))
        fold_of[members] = (offset + np.arange(members.shape[0])) % k
        offset += members.shape[0]
    return [np.flatnonzero(fold_of == fold) for fold in range(k)]


@dataclass
class CVResult:
    """One config scored on every fold.

    ``mean`` is the objective; ``fold_scores``, ``best_epochs`` and
    ``epochs_run`` have one entry per fold; ``seconds`` is their total.
    """

    fold_scores: list[float]
    best_epochs: list[int]
    epochs_run: list[int]
    num_trainable_params: int
    seconds: float
    layer: int | None = None
    layer_scores: list[float] = field(default_factory=list)

    @property
    def mean(self) -> float:
        return float(np.mean(self.fold_scores))


def _split(data: Dataset, rows: np.ndarray) -> Dataset:

    index = torch.from_numpy(rows)
    return data[0][index], data[1][index]


def cross_validate(
    config: EncoderConfig,
    train: Dataset,
    folds: list[np.ndarray],
    *,
    task_kind: str,
    num_classes: int | None,
    seed: int,
    device: str,
    report: Callable[[int, float], None] | None = None,
) -> CVResult:
    """Train ``config`` once per fold (on the other folds) and score it on the fold.

    ``report(step, value)`` receives the fold's validation score after each
    epoch at ``step = fold * config.epochs + epoch``. A step thus names the same
    fold and epoch in every trial of a study (``epochs`` is not searched, so it
    is one number per study), which is what the median pruner assumes when it
    compares a trial with the others' values at the same step; a running mean
    over folds would mix a fresh fold's first epochs with finished folds and
    drift with the step. A best-layer config picks the layer with the best mean
    over folds; its fold scores are that layer's.
    """
    labels = train[1]
    n = int(labels.shape[0])
    score_range = None
    if task_kind == "similarity":  # one scale for every fold: that of the whole training set
        score_range = (float(labels.min()), float(labels.max()))
    common: dict[str, Any] = dict(
        task_kind=task_kind, num_classes=num_classes, score_range=score_range, seed=seed, device=device
    )
    started = time.perf_counter()
    scores: list[float] = []
    best_epochs: list[int] = []
    epochs_run: list[int] = []
    per_layer: list[list[float]] = []
    params = 0
    for fold, rows in enumerate(folds):
        keep = np.ones(n, dtype=bool)
        keep[rows] = False
        fold_train, fold_val = _split(train, np.flatnonzero(keep)), _split(train, rows)
        result, layer_scores = _train_fold(config, (fold_train, fold_val), fold, common, report)
        if layer_scores is not None:
            per_layer.append(layer_scores)
        scores.append(float(result.best_val_metric))
        best_epochs.append(int(result.best_epoch))
        epochs_run.append(int(result.epochs_run))
        params = int(result.num_trainable_params)
    out = CVResult(scores, best_epochs, epochs_run, params, time.perf_counter() - started)
    if per_layer:
        _choose_layer(out, per_layer, maximise=result.selection_metric != "loss")
    return out


def _train_fold(
    config: EncoderConfig,
    data: tuple[Dataset, Dataset],
    fold: int,
    common: dict[str, Any],
    report: Callable[[int, float], None] | None,
) -> tuple[TrainResult, list[float] | None]:
    """Train on one fold's ``(train, validation)``: the result, and a best-layer config's score per layer."""

    fold_train, fold_val = data
    if config.family == "best-layer":
        assert isinstance(config, BestLayerConfig)
        _, result, layer_scores = engine.select_best_layer(config, fold_train, fold_val, **common)
        return result, [float(s) for s in layer_scores]
    callback = None
    if report is not None:

        def callback(epoch: int, value: float, offset: int = fold * config.epochs) -> None:
            report(offset + epoch, value)

    return engine.train_encoder(config, fold_train, fold_val, epoch_callback=callback, **common), None


def _choose_layer(out: CVResult, per_layer: list[list[float]], *, maximise: bool) -> None:
    """Set ``out``'s layer to the one with the best mean over folds, and its fold scores to that layer's."""
    table = np.asarray(per_layer)  # (folds, layers)
    means = table.mean(axis=0)
    layer = int(np.argmax(means) if maximise else np.argmin(means))
    out.layer, out.layer_scores = layer, [float(v) for v in means]
    out.fold_scores = [float(v) for v in table[:, layer]]
