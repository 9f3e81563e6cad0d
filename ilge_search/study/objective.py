"""One trial: suggest a config, train it with the one engine, report and record what it did.

Every trial stores as user attrs ``ilge_worker`` (host and pid of the process
running it, :data:`~ilge_search.storage.WORKER_ATTR`), ``config`` (the full config dict),
``val_metric``, ``num_trainable_params``, ``epochs_run``, ``best_epoch``,
``seconds`` (and ``layer``/``layer_scores`` for the best-layer baseline); the
validation metric of every epoch is an intermediate value, for the pruner.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple

from ..dashboard import write_live_note
from ..storage import WORKER_ATTR, quiet_optuna_warnings, storage_fault, worker_stamp

if TYPE_CHECKING:  # pragma: no cover
    from .data import StudyData

__all__ = ["TrialObjective", "recommended_params", "suggest_capped", "catchable_errors", "quiet_interrupt_tracebacks"]


def suggest_capped(trial: Any, encoder: str, max_epochs: Optional[int]) -> Any:
    """``suggest_config(trial, encoder)`` with ``epochs`` capped at ``max_epochs``."""
    from ..tuning import suggest_config

    config = suggest_config(trial, encoder)
    if max_epochs is not None and config.epochs > max_epochs:
        config = config.replace(epochs=max_epochs)
    return config


def recommended_params(encoder: str, hidden_size: Optional[int] = None, model: Optional[str] = None) -> Dict[str, Any]:
    """The encoder's ``recommended_config`` as Optuna params of ``suggest_config``'s search space.

    The size bucket is :func:`ilge_search.models.model_size_bucket` of ``model``
    (a model outside the table, or none, is bucketed by ``hidden_size``). The
    config's fields are offered to ``suggest_config`` through a ``FixedTrial``;
    what it asks for is what a study enqueues, so the first trial runs exactly
    the recommended configuration.
    """
    import optuna

    from ..models import model_size_bucket
    from ..tuning import recommended_config, suggest_config

    # no model name: "" is in no table row, so the hidden size decides
    bucket = model_size_bucket("" if model is None else model, hidden_size)
    config = recommended_config(encoder, model_size_hint=bucket)
    values = {k: v for k, v in config.to_dict().items() if k != "family"}
    fixed = optuna.trial.FixedTrial(values)
    with quiet_optuna_warnings():
        suggest_config(fixed, encoder)
    return dict(fixed.params)


class TrialObjective:
    """The Optuna objective of one encoder on one study's data: returns the best validation metric."""

    def __init__(self, encoder: str, data: "StudyData", *, seed: int, device: str,
                 max_epochs: Optional[int]) -> None:
        self.encoder = encoder
        self.data = data
        self.seed = seed
        self.device = device
        self.max_epochs = max_epochs

    def __call__(self, trial: Any) -> float:
        import optuna

        from ..engine import select_best_layer, train_encoder

        data = self.data
        # first: a trial whose process dies is then failed at once by the next run on this host
        trial.set_user_attr(WORKER_ATTR, worker_stamp(trial.number))
        config = suggest_capped(trial, self.encoder, self.max_epochs)
        trial.set_user_attr("config", config.to_dict())  # stored first, so failed trials show it too
        common = dict(task_kind=data.task_kind, num_classes=data.num_classes, seed=self.seed, device=self.device)
        if self.encoder == "best-layer":
            # the layer is chosen on validation inside the trial; the search covers the recipe
            layer, result, scores = select_best_layer(config, data.train, data.validation, **common)
            config = config.replace(layer=layer)
            trial.set_user_attr("config", config.to_dict())
            trial.set_user_attr("layer", int(layer))
            trial.set_user_attr("layer_scores", [float(s) for s in scores])
        else:
            def report(epoch: int, value: float) -> None:
                trial.report(float(value), epoch)
                if trial.should_prune():
                    trial.set_user_attr("epochs_run", int(epoch))
                    write_live_note(trial, data.metric, state="pruned")
                    raise optuna.TrialPruned(f"pruned at epoch {epoch} ({data.metric} {value:.4f})")

            result = train_encoder(config, data.train, data.validation, epoch_callback=report, **common)
        trial.set_user_attr("val_metric", float(result.best_val_metric))
        trial.set_user_attr("num_trainable_params", int(result.num_trainable_params))
        trial.set_user_attr("epochs_run", int(result.epochs_run))
        trial.set_user_attr("best_epoch", int(result.best_epoch))
        trial.set_user_attr("seconds", round(float(result.seconds), 3))
        write_live_note(trial, data.metric)
        return float(result.best_val_metric)


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


def catchable_errors() -> Tuple[type, ...]:
    """Errors that fail one trial, not the study: a configuration too large for the accelerator."""
    import torch

    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom,) if oom is not None else ()
