"""The one way a configuration is trained with several seeds on a stored study's data.

Every retraining of a configuration on a study's data after its search (the final evaluation, ensembles and
their backfilled validation predictions, the cross-task matrix, leave one task out, explain) goes through
:func:`train_seeds` (or :func:`train_configs`, several configurations at once), so that the same
configuration, seed and data train the same model everywhere; the seeds the engine can train together go
in one pass (:func:`~ilge_search.engine.train_many`);
:class:`TrainingSetup` says where a stored study's data is read from and how the training runs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from .. import engine  # its training functions looked up per call: tests count them
from ..engine import ModelJob, can_batch
from ..progress import BarSpec, steps
from .data import StudyData
from .stored import load_training_data

if TYPE_CHECKING:
    import optuna

if TYPE_CHECKING:  # pragma: no cover
    from ..encoders.configs import EncoderConfig

__all__ = ["TrainedSeed", "TrainingSetup", "train_seeds", "train_configs"]


@dataclass(frozen=True)
class TrainedSeed:
    """One seed's training of a configuration on a study's data: the model (best epoch restored, eval mode),
    its best validation score (``None`` for a model reused rather than trained), the epochs run (0 when
    reused) and the seconds its training took."""

    seed: int
    model: Any
    best_val_metric: float | None
    epochs_run: int
    seconds: float

    @property
    def val_score(self) -> float:
        """The best validation score of a model trained here."""
        if self.best_val_metric is None:
            raise ValueError(f"the model of seed {self.seed} was reused, not trained: its validation score is unknown")
        return self.best_val_metric


def train_seeds(
    data: StudyData,
    config: EncoderConfig,
    seeds: Iterable[int],
    *,
    device: str,
    bar: BarSpec | None = None,
    reuse: Mapping[int, tuple[Any, float]] | None = None,
    batched: bool = True,
) -> Iterator[TrainedSeed]:
    """``config`` trained by the one engine once per seed, yielded in the order of ``seeds``, on ``data``'s
    train split and selected on its validation split.

    Where the engine can train the seeds together (:func:`~ilge_search.engine.can_batch`: the built-in
    families on texts and sentence pairs), the seeds left to train go in one pass
    (:func:`~ilge_search.engine.train_many`), each model the one its own run trains (on a CPU to 1e-5, dropout
    included, so passes change no number; ``batched=False`` asks for one at a time).
    Otherwise they train one at a time, each yielded before the next one trains, so a caller scores a model
    (and may drop it) before the next exists.

    ``bar`` counts the seeds; ``reuse`` (seed -> (model, seconds)) holds models already trained with this
    configuration, seed and data (they would train to the same weights), yielded instead of training again.
    """

    seeds = list(seeds)
    reuse = reuse or {}
    if batched and can_batch(config, data.task_kind) and len(set(seeds) - set(reuse)) > 1:
        [trained] = train_configs(data, [config], seeds, device=device, bar=bar, reuse=[reuse], batched=True)
        yield from trained
        return
    for seed in seeds if bar is None else steps(seeds, bar):
        if seed in reuse:
            yield _reused(seed, reuse[seed])
            continue
        yield _train_alone(data, config, seed, device)


def train_configs(
    data: StudyData,
    configs: Sequence[EncoderConfig],
    seeds: Sequence[int],
    *,
    device: str,
    bar: BarSpec | None = None,
    reuse: Sequence[Mapping[int, tuple[Any, float]]] | None = None,
    batched: bool = True,
) -> list[list[TrainedSeed]]:
    """Every config trained once per seed (per config, in the order of ``seeds``); with ``batched`` (see
    :func:`train_seeds`) those whose models share their shapes (seeds of one config, ensemble members that
    differ only in learning rate, weight decay, dropout or epochs) in one pass; ``reuse[i]`` holds config
    ``i``'s models already trained (see :func:`train_seeds`), ``bar`` counts the models."""

    reuse = reuse or [{} for _ in configs]
    wanted = [(index, seed) for index, config in enumerate(configs) for seed in seeds if seed not in reuse[index]]
    batchable = [job for job in wanted if can_batch(configs[job[0]], data.task_kind)] if batched else []
    trained: dict[tuple[int, int], TrainedSeed] = {}
    if len(batchable) > 1:
        jobs = [ModelJob(configs[index], seed) for index, seed in batchable]
        results = engine.train_many(
            jobs, data.train, data.validation, task_kind=data.task_kind, num_classes=data.num_classes, device=device
        )
        for job, result in zip(batchable, results, strict=True):
            trained[job] = _trained(job[1], result)
    out: list[list[TrainedSeed]] = [[] for _ in configs]
    for index, seed in steps(
        [(i, s) for i in range(len(configs)) for s in seeds], bar or BarSpec("retraining", enabled=False)
    ):
        if seed in reuse[index]:
            out[index].append(_reused(seed, reuse[index][seed]))
        else:
            done = trained.get((index, seed))
            out[index].append(done or _train_alone(data, configs[index], seed, device))
    return out


def _train_alone(data: StudyData, config: EncoderConfig, seed: int, device: str) -> TrainedSeed:

    started = time.perf_counter()
    result = engine.train_encoder(config, data.train, data.validation, **data.train_options(seed, device))
    return _trained(seed, result, time.perf_counter() - started)


def _trained(seed: int, result: Any, seconds: float | None = None) -> TrainedSeed:
    """A seed's :class:`~ilge_search.engine.TrainResult` as a :class:`TrainedSeed` (``seconds``: default the
    result's own, a model's share of its pass)."""
    return TrainedSeed(
        seed=seed,
        model=result.model,
        best_val_metric=float(result.best_val_metric),
        epochs_run=int(result.epochs_run),
        seconds=float(result.seconds if seconds is None else seconds),
    )


def _reused(seed: int, reused: tuple[Any, float]) -> TrainedSeed:
    model, seconds = reused
    return TrainedSeed(seed=seed, model=model, best_val_metric=None, epochs_run=0, seconds=seconds)


@dataclass(frozen=True)
class TrainingSetup:
    """Where a stored study's task data and embedding cache are, the training device, torch's CPU threads while
    training (``None``: unchanged), whether progress bars show, and where a custom task's data is now when it
    moved since the study ran (``task_path``)."""

    data_dir: str | os.PathLike | None = None
    cache_dir: str | os.PathLike | None = None
    device: str = "auto"
    threads: int | None = None
    progress: bool = True
    task_path: str | os.PathLike | None = None

    def load_data(self, study: optuna.Study, *, with_test: bool, progress: bool = False) -> StudyData:
        """The arrays ``study`` was run on, rebuilt from its record (:func:`~.stored.load_training_data`)."""

        return load_training_data(
            study,
            data_dir=self.data_dir,
            task_path=self.task_path,
            cache_dir=self.cache_dir,
            device=self.device,
            progress=progress,
            with_test=with_test,
        )

    @contextmanager
    def torch_threads(self) -> Iterator[None]:
        """torch's CPU threads set to ``threads`` inside the block, restored afterwards."""

        previous = torch.get_num_threads()
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        try:
            yield
        finally:
            torch.set_num_threads(previous)
