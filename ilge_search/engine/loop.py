"""The training loop every model goes through, whatever its data: texts, sentence pairs or words.

:func:`run_epochs` owns what training means in this project: the seeded model initialisation
(the caller's global RNG state is left untouched), Adam or AdamW with the config's learning
rate and weight decay, ReduceLROnPlateau on the validation metric, one ``epoch_callback``
after every epoch (the study runner raises ``optuna.TrialPruned`` from it), early stopping,
and the best epoch's weights restored. What differs between kinds of data (how a model is
built, how an epoch walks the training set, how validation is scored) comes in as an
:class:`EpochTask`.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from ..embeddings.models import resolve_device
from ..encoders.configs import EncoderConfig
from ..progress import BarSpec, new_bar
from ..validation import check_int
from .standardizer import FeatureStandardizer

__all__ = [
    "TASK_KINDS",
    "TAGGING",
    "METRICS",
    "TrainingRecipe",
    "DEFAULT_RECIPE",
    "TrainResult",
    "RunSettings",
    "EpochTask",
    "run_epochs",
]

TASK_KINDS = ("classification", "similarity")  # the kinds whose examples are texts or text pairs
TAGGING = "tagging"  # examples are sentences of words, one label per word
# metrics per task kind; the first one is the default selection metric. "loss" is minimised, the rest maximised.
METRICS = {
    "classification": ("accuracy", "macro_f1", "loss"),
    "similarity": ("spearman", "pearson", "loss"),
    TAGGING: ("accuracy", "macro_f1", "loss"),  # over words
}


@dataclass(frozen=True)
class TrainingRecipe:
    """How the engine trains beyond what an encoder config says (its ``lr``, ``weight_decay``,
    ``batch_size`` and ``epochs``).

    Attributes:
        patience: stop after this many epochs without a better validation metric (``None``: never early).
        lr_patience, lr_factor: ReduceLROnPlateau on the validation metric.
        selection_metric: metric for early stopping, the LR schedule and the best epoch; default
            ``"accuracy"`` / ``"spearman"``; ``"loss"`` is minimised.
        optimizer: ``"adam"`` (L2 weight decay) or ``"adamw"`` (decoupled).
        standardize: z-score every (layer, dimension) with training-set statistics (stored in the model)
            before the aggregator.
        max_batch_nodes: tagging only: at most this many (word, layer) nodes in one batch of sentences
            (a batch holds ``config.batch_size`` sentences of one length, fewer where they would pass it).
    """

    patience: int | None = 10
    lr_patience: int = 3
    lr_factor: float = 0.5
    selection_metric: str | None = None
    optimizer: str = "adam"
    standardize: bool = True
    max_batch_nodes: int = 16384

    def resolved(self, task_kind: str) -> TrainingRecipe:
        """The recipe checked for ``task_kind``, with its selection metric filled in."""
        if task_kind not in METRICS:
            raise ValueError(f"task_kind must be one of {list(METRICS)}, got {task_kind!r}")
        metric = self.selection_metric or METRICS[task_kind][0]
        if metric not in METRICS[task_kind]:
            raise ValueError(
                f"selection_metric for {task_kind!r} must be one of {list(METRICS[task_kind])}, got {metric!r}"
            )
        if self.optimizer not in ("adam", "adamw"):
            raise ValueError(f"optimizer must be 'adam' or 'adamw', got {self.optimizer!r}")
        check_int("patience", self.patience, allow_none=True)
        check_int("max_batch_nodes", self.max_batch_nodes)
        return dataclasses.replace(self, selection_metric=metric)


DEFAULT_RECIPE = TrainingRecipe()


@dataclass
class TrainResult:
    """What one training run produced.

    Attributes:
        model: the trained model (an :class:`~ilge_search.engine.ILGEModel`, or a
            :class:`~ilge_search.engine.TaggerModel` for tagging) with the best epoch's weights, in eval mode.
        best_epoch: epoch (counted from 1) whose weights were kept.
        epochs_run: epochs actually run (early stopping may end before ``config.epochs``).
        best_val_metric: the selection metric at ``best_epoch``.
        selection_metric: its name (``"accuracy"``, ``"spearman"``, ``"loss"``...).
        history: one dict per epoch: ``epoch``, ``train_loss``, ``val_loss``,
            ``val_<metric>`` for each metric of the task, ``lr``.
        num_trainable_params: trainable parameters of aggregator plus head.
        seconds: wall time of the run.
        cpu_seconds: the process's CPU time during the run (what the run needs on a core of its own: a wall time
            longer than it was spent waiting, e.g. for other processes on a busy machine).
    """

    model: Any
    best_epoch: int
    epochs_run: int
    best_val_metric: float
    selection_metric: str
    history: list[dict[str, float]] = field(default_factory=list)
    num_trainable_params: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0


@dataclass(frozen=True)
class RunSettings:
    """One training run's settings besides the config and the data.

    ``fitted_standardizer``: statistics already computed on the training features, for callers
    that train many models on one set (one probe per layer) and fit them once."""

    seed: int
    device: str | torch.device
    recipe: TrainingRecipe  # resolved: its selection metric is set
    epoch_callback: Callable[[int, float], Any] | None = None
    progress: bool = False
    fitted_standardizer: FeatureStandardizer | None = None


class EpochTask(Protocol):
    """What :func:`run_epochs` needs of one kind of data."""

    def build(self) -> nn.Module:
        """The untrained model on its device, initialised from the (seeded) global RNG, its standardiser set."""
        ...

    def train_epoch(self, model: nn.Module, optimizer: torch.optim.Optimizer, generator: torch.Generator) -> float:
        """One pass over the training data in an order drawn from ``generator``; the mean training loss."""
        ...

    def validate(self, model: nn.Module) -> dict[str, float]:
        """The task's metrics on the validation data."""
        ...


def run_epochs(config: EncoderConfig, task: EpochTask, run: RunSettings) -> TrainResult:
    """Train the model ``task`` builds for at most ``config.epochs`` epochs; keep the best on validation."""
    recipe = run.recipe
    selection_metric = str(recipe.selection_metric)
    device = resolve_device(run.device)
    maximise = selection_metric != "loss"
    started, cpu_started = time.perf_counter(), time.process_time()
    rng_devices = [device.index or 0] if device.type == "cuda" else []
    epoch_bar = BarSpec(f"train {config.family}", config.epochs, "epoch", run.progress, transient=True)
    with torch.random.fork_rng(devices=rng_devices), new_bar(epoch_bar) as epochs:
        torch.manual_seed(run.seed)
        model = task.build()
        generator = torch.Generator().manual_seed(run.seed)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer_cls = torch.optim.AdamW if recipe.optimizer == "adamw" else torch.optim.Adam
        opt = optimizer_cls(params, lr=config.lr, weight_decay=config.weight_decay)
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
            opt, mode="max" if maximise else "min", factor=recipe.lr_factor, patience=recipe.lr_patience
        )
        history: list[dict[str, float]] = []
        best_metric, best_epoch, best_state = -math.inf if maximise else math.inf, 0, None
        for epoch in range(1, config.epochs + 1):
            train_loss = task.train_epoch(model, opt, generator)
            val_metrics = task.validate(model)
            metric = val_metrics[selection_metric]
            record = {"epoch": epoch, "train_loss": train_loss}
            record.update({f"val_{name}": value for name, value in val_metrics.items()})
            record["lr"] = opt.param_groups[0]["lr"]
            history.append(record)
            scheduler.step(metric)

            improved = metric > best_metric if maximise else metric < best_metric
            if improved or best_state is None:
                best_metric, best_epoch = metric, epoch
                best_state = copy.deepcopy(model.state_dict())
            epochs.update(1)
            epochs.set_postfix_str(f"train_loss={train_loss:.4f}, val_{selection_metric}={metric:.4f}")
            if run.epoch_callback is not None:
                run.epoch_callback(epoch, metric)
            if recipe.patience is not None and epoch - best_epoch >= recipe.patience:
                break

    assert best_state is not None  # the first epoch always sets it
    model.load_state_dict(best_state)
    model.eval()
    return TrainResult(
        model=model,
        best_epoch=best_epoch,
        epochs_run=len(history),
        best_val_metric=float(best_metric),
        selection_metric=selection_metric,
        history=history,
        num_trainable_params=sum(p.numel() for p in model.parameters() if p.requires_grad),
        seconds=time.perf_counter() - started,
        cpu_seconds=time.process_time() - cpu_started,
    )
