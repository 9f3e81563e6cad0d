"""The one way a configuration is trained with several seeds on a stored study's data.

Every retraining of a configuration on a study's data after its search (the final evaluation, ensembles and
their backfilled validation predictions, the cross-task matrix, leave one task out, explain) goes through
:func:`train_seeds`, so that the same configuration, seed and data train the same model everywhere;
:class:`TrainingSetup` says where a stored study's data is read from and how the training runs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..progress import BarSpec, steps
from .data import StudyData

if TYPE_CHECKING:
    import optuna

if TYPE_CHECKING:  # pragma: no cover
    from ..encoders.configs import EncoderConfig

__all__ = ["TrainedSeed", "TrainingSetup", "train_seeds"]


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
) -> Iterator[TrainedSeed]:
    """``config`` trained by the one engine once per seed, in the order of ``seeds``, on ``data``'s train split
    and selected on its validation split; each is yielded before the next one trains, so a caller scores a
    model (and may drop it) before the next exists.

    ``bar`` counts the seeds; ``reuse`` (seed -> (model, seconds)) holds models already trained with this
    configuration, seed and data (they would train to the same weights), yielded instead of training again.
    """
    from ..engine import train_encoder

    reuse = reuse or {}
    for seed in seeds if bar is None else steps(seeds, bar):
        if seed in reuse:
            model, seconds = reuse[seed]
            yield TrainedSeed(seed=seed, model=model, best_val_metric=None, epochs_run=0, seconds=seconds)
            continue
        started = time.perf_counter()
        result = train_encoder(
            config,
            data.train,
            data.validation,
            task_kind=data.task_kind,
            num_classes=data.num_classes,
            seed=seed,
            device=device,
        )
        yield TrainedSeed(
            seed=seed,
            model=result.model,
            best_val_metric=float(result.best_val_metric),
            epochs_run=int(result.epochs_run),
            seconds=time.perf_counter() - started,
        )


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
        from .stored import load_training_data

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
        import torch

        previous = torch.get_num_threads()
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        try:
            yield
        finally:
            torch.set_num_threads(previous)
